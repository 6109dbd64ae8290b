"""Factor matrices of all modes stacked in one array, as the kernels read them."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class StackedFactors:
    """Factor matrices ``A_0 .. A_{N-1}`` stored as row blocks of one C array (sum I_m, R).

    ``views[m]`` is ``A_m`` (a view: writing it updates the stack). Keeping factors in a stack
    lets MTTKRP run without copying them; a plain list of matrices is stacked on every call.

    Examples
    --------
    >>> f = StackedFactors((3, 4), 2)
    >>> f.views[1][:] = 1.0
    >>> f.data.shape, float(f.data[3:].sum())
    ((7, 2), 8.0)
    """

    def __init__(self, shape: Sequence[int], rank: int, dtype: Any = np.float64, data: np.ndarray | None = None):
        self.shape = tuple(int(s) for s in shape)
        self.rank = int(rank)
        self.offsets = np.concatenate([[0], np.cumsum(self.shape)[:-1]]).astype(np.int64)
        total = int(sum(self.shape))
        if data is None:
            data = np.zeros((total, self.rank), dtype=dtype)
        if data.shape != (total, self.rank) or not data.flags.c_contiguous:
            raise ValueError(f"stacked factor data must be C-contiguous with shape {(total, self.rank)}")
        self.data = data
        self.views = [data[o:o + s] for o, s in zip(self.offsets.tolist(), self.shape)]

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @classmethod
    def from_list(cls, factors: Sequence[np.ndarray], dtype: Any = None) -> "StackedFactors":
        dtype = np.dtype(dtype) if dtype is not None else np.result_type(*[np.asarray(f).dtype for f in factors])
        out = cls([np.shape(f)[0] for f in factors], np.shape(factors[0])[1], dtype)
        for v, f in zip(out.views, factors):
            v[...] = f
        return out
