"""Reused MTTKRP output buffers of a worker process.

A fresh (I_n x R) output is page-faulted in by the kernel's first writes: on this 2-core VM an
Amazon-shaped mode of 4.8 M rows (617 MB at rank 16) spent 0.85 s in page faults, a quarter of
its streamed MTTKRP. Every pass of CP-ALS needs an output of the same size again, so the largest
one is kept and handed out again, zeroed, once nothing refers to it any more (the update that
consumed the previous pass's partial has finished with it). A buffer something still refers to
(a partial waiting in a reduction) is never handed out: the caller then gets a fresh array.
"""

from __future__ import annotations

import math
import sys
import threading

import numba as nb
import numpy as np

from ..kernels.factors import aligned_zeros

# smaller outputs are cheap to fault in and are not kept
KEEP_MIN_BYTES = 32 << 20

_LOCK = threading.Lock()
_KEPT: list[np.ndarray] = []  # at most one flat byte buffer


@nb.njit(parallel=True, nogil=True, cache=True)
def _zero(flat: np.ndarray) -> None:
    """flat[:] = 0 on numba's threads (617 MB: 0.030 s on 2 threads against 0.076 s for NumPy's
    one-thread fill)."""
    n = flat.shape[0]
    step = 1 << 20
    for b in nb.prange((n + step - 1) // step):
        flat[b * step : min(n, (b + 1) * step)] = 0


def zeroed_output(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """A zeroed C-ordered array of ``shape`` and ``dtype``: a view of this process's kept buffer
    when it is free and large enough, else a new array (kept for later when it is large)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < KEEP_MIN_BYTES:
        return aligned_zeros(shape, dtype)
    with _LOCK:
        buf = _KEPT[0] if _KEPT else None
        if buf is not None and buf.nbytes >= nbytes:
            # every view of the kept buffer refers to the memory's owner: besides the kept view,
            # ``owner`` and getrefcount's argument, nothing may refer to it
            owner = buf.base
            if sys.getrefcount(owner) == 3:
                flat = buf[:nbytes].view(dtype)
                _zero(flat)
                return flat.reshape(shape)
            return aligned_zeros(shape, dtype)  # the kept one is in use: do not keep a second
        fresh = aligned_zeros(nbytes, np.uint8)
        _KEPT[:] = [fresh]
        return fresh.view(dtype).reshape(shape)


def release_outputs() -> None:
    """Drop this process's kept output buffer (memory in use by a result stays valid)."""
    with _LOCK:
        _KEPT.clear()
