"""Factor matrices of all modes stacked in one array, as the kernels read them."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

# NumPy's allocations start 16 bytes past a cache line, so a 128-byte row (rank 16 in float64)
# spans three lines instead of two: factor matrices and MTTKRP outputs start on a page
# (docs/KERNELS.md, "Measurements").
ALIGN_BYTES = 4096


def _aligned(shape: Sequence[int] | int, dtype: Any, alloc) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:  # nothing to place (NumPy gives empty views a pointer of its own)
        return alloc(shape, dtype=dtype)
    raw = alloc(nbytes + ALIGN_BYTES, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN_BYTES
    return raw[off : off + nbytes].view(dtype).reshape(shape)


def aligned_empty(shape: Sequence[int] | int, dtype: Any = np.float64) -> np.ndarray:
    """An uninitialized C-ordered array whose first element starts on a page (so the rows of a
    rank-8, 16, 32 ... float64 matrix each start on a cache line)."""
    return _aligned(shape, dtype, np.empty)


def aligned_zeros(shape: Sequence[int] | int, dtype: Any = np.float64) -> np.ndarray:
    """:func:`aligned_empty`, zeroed (pages the OS zeroes lazily, as ``np.zeros``)."""
    return _aligned(shape, dtype, np.zeros)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-ordered copy of ``a`` in an :func:`aligned_empty` array."""
    out = aligned_empty(np.shape(a), np.asarray(a).dtype)
    out[...] = a
    return out


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
            data = aligned_zeros((total, self.rank), dtype)
        if data.shape != (total, self.rank) or not data.flags.c_contiguous:
            raise ValueError(f"stacked factor data must be C-contiguous with shape {(total, self.rank)}")
        self.data = data
        self.views = [data[o : o + s] for o, s in zip(self.offsets.tolist(), self.shape)]

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def __getstate__(self) -> dict:
        # pickled without the views: pickle copies each view as an array of its own, and the
        # unpickled object's views would then no longer be rows of its ``data`` (a worker that
        # received a CP-APR state updated its views while the kernels read ``data``)
        state = self.__dict__.copy()
        del state["views"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.views = [self.data[o : o + s] for o, s in zip(self.offsets.tolist(), self.shape)]

    @classmethod
    def from_list(cls, factors: Sequence[np.ndarray], dtype: Any = None) -> "StackedFactors":
        dtype = np.dtype(dtype) if dtype is not None else np.result_type(*[np.asarray(f).dtype for f in factors])
        out = cls([np.shape(f)[0] for f in factors], np.shape(factors[0])[1], dtype)
        for v, f in zip(out.views, factors):
            v[...] = f
        return out
