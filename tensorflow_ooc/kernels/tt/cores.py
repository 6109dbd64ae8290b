"""Tensor-train cores stored in one array, slice by slice, as the contraction kernels read them.

Core ``k`` of a TT is a ``(R_{k-1}, I_k, R_k)`` tensor (TensorLy's convention, ``R_0 = R_N = 1``).
A nonzero at ``(i_0, ..., i_{N-1})`` reads one slice ``core_k[:, i_k, :]`` of every core, so the
cores are kept slice-major: core ``k`` is an ``(I_k, R_{k-1}, R_k)`` block of one flat float64
array, and a nonzero's slice of it is ``R_{k-1} R_k`` consecutive values (one or two cache lines
at small ranks instead of ``R_{k-1}`` lines ``I_k R_k`` apart).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class TTCores:
    """The cores of an order-N tensor train in one flat array.

    ``ranks`` holds ``R_0 .. R_N`` (``R_0 = R_N = 1``); ``offsets[k]`` is where core ``k``'s block
    starts in ``data``; ``slices[k]`` is that block as an ``(I_k, R_{k-1}, R_k)`` view and
    :meth:`core` the ``(R_{k-1}, I_k, R_k)`` view of it (writing either writes ``data``).

    Examples
    --------
    >>> c = TTCores((3, 4, 5), (1, 2, 2, 1))
    >>> c.core(1).shape, c.slices[1].shape, c.data.shape
    ((2, 4, 2), (4, 2, 2), (34,))
    """

    def __init__(self, shape: Sequence[int], ranks: Sequence[int], data: np.ndarray | None = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.ranks = np.asarray([int(r) for r in ranks], dtype=np.int64)
        if self.ranks.shape[0] != len(self.shape) + 1:
            raise ValueError(f"{len(self.shape)} cores need {len(self.shape) + 1} ranks R_0..R_N, got {len(ranks)}")
        sizes = [self.shape[k] * int(self.ranks[k]) * int(self.ranks[k + 1]) for k in range(len(self.shape))]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(self.offsets[-1])
        if data is None:
            data = np.zeros(total)
        elif data.shape != (total,) or data.dtype != np.float64:
            raise ValueError(f"core data must be float64 of shape ({total},), got {data.dtype} {data.shape}")
        self.data = data
        self.slices = [
            data[self.offsets[k] : self.offsets[k + 1]].reshape(
                self.shape[k], int(self.ranks[k]), int(self.ranks[k + 1])
            )
            for k in range(len(self.shape))
        ]

    @property
    def nmodes(self) -> int:
        return len(self.shape)

    def core(self, k: int) -> np.ndarray:
        """Core ``k`` as an ``(R_{k-1}, I_k, R_k)`` view (not contiguous)."""
        return self.slices[k].transpose(1, 0, 2)

    def set_core(self, k: int, core: np.ndarray) -> None:
        """Write core ``k`` from an ``(R_{k-1}, I_k, R_k)`` array."""
        self.set_slices(k, np.asarray(core).transpose(1, 0, 2))

    def set_slices(self, k: int, slices: np.ndarray) -> None:
        """Write core ``k`` from its slices, an ``(I_k, R_{k-1}, R_k)`` array."""
        self.slices[k][...] = slices

    def cores(self) -> list[np.ndarray]:
        """Every core, as ``(R_{k-1}, I_k, R_k)`` C arrays (copies)."""
        return [np.ascontiguousarray(self.core(k)) for k in range(self.nmodes)]

    def copy(self) -> "TTCores":
        return TTCores(self.shape, self.ranks, self.data.copy())

    @classmethod
    def of(cls, cores: Sequence[np.ndarray]) -> "TTCores":
        """The cores ``(R_{k-1}, I_k, R_k)`` of a list (ranks and shape read from them), copied in."""
        shape = [int(np.shape(c)[1]) for c in cores]
        ranks = [int(np.shape(cores[0])[0])] + [int(np.shape(c)[2]) for c in cores]
        out = cls(shape, ranks)
        for k, c in enumerate(cores):
            out.set_core(k, c)
        return out
