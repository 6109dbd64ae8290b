"""Column statistics of a factor matrix for the CP-ALS update's normalization.

NumPy reduces a C-ordered (I, R) array along axis 0 with a strided pass per column and a temporary
for ``abs``: 0.4 ms for 14,036 x 16, a tenth of a nips-shaped mode update. One row-major pass with
R accumulators takes a fraction of that.
"""

from __future__ import annotations

import numba as nb
import numpy as np

STAT_BLOCK_ROWS = 1 << 14


MAX_ABS, SUM_SQUARES, SUM_ABS = 0, 1, 2


@nb.njit(inline="always")
def _block_stats(A, stat, lo, hi, part):
    """The statistic of rows ``lo .. hi - 1`` of ``A`` into ``part`` (R,), zeroed."""
    R = A.shape[1]
    for i in range(lo, hi):
        for r in range(R):
            x = np.float64(A[i, r])
            if stat == 1:
                part[r] += x * x
            elif stat == 2:
                part[r] += abs(x)
            elif abs(x) > part[r]:
                part[r] = abs(x)


@nb.njit(inline="always")
def _combined(part, stat):
    out = np.zeros(part.shape[1])
    for b in range(part.shape[0]):
        for r in range(part.shape[1]):
            out[r] = max(out[r], part[b, r]) if stat == 0 else out[r] + part[b, r]
    return out


@nb.njit(parallel=True, nogil=True, cache=True)
def _column_stats_parallel(A: np.ndarray, stat: int) -> np.ndarray:
    n, R = A.shape
    nblocks = (n + STAT_BLOCK_ROWS - 1) // STAT_BLOCK_ROWS
    part = np.zeros((nblocks, R))
    for b in nb.prange(nblocks):
        _block_stats(A, stat, b * STAT_BLOCK_ROWS, min(n, (b + 1) * STAT_BLOCK_ROWS), part[b])
    return _combined(part, stat)


@nb.njit(nogil=True, cache=True)
def _column_stats_one_block(A: np.ndarray, stat: int) -> np.ndarray:
    part = np.zeros((1, A.shape[1]))
    _block_stats(A, stat, 0, A.shape[0], part[0])
    return _combined(part, stat)


def _column_stats(A: np.ndarray, stat: int) -> np.ndarray:
    """Per column of ``A`` (I, R): the largest |A[i, r]| (``stat`` MAX_ABS), the sum of A[i, r]**2
    (SUM_SQUARES) or of |A[i, r]| (SUM_ABS), in float64. Blocks of ``STAT_BLOCK_ROWS`` rows run on
    numba's threads and are combined in a fixed order, so the result does not depend on the
    thread count. A matrix of one block runs on this thread: starting numba's threads for it cost
    more than the pass (uber-shaped R 8 CP-ALS, 4 calls an iteration: 56 us each, 0.45 ms each
    with the other core busy)."""
    if A.shape[0] <= STAT_BLOCK_ROWS:
        return _column_stats_one_block(A, stat)
    return _column_stats_parallel(A, stat)


def column_max_abs(A: np.ndarray) -> np.ndarray:
    """Largest |A[i, r]| of each column r of the C-ordered float array ``A`` (I, R); 0 where I = 0.

    Parameters
    ----------
    A : float32 or float64 (I, R), C-contiguous

    Returns
    -------
    float64 (R,)
    """
    return _column_stats(A, MAX_ABS)


def column_sum_squares(A: np.ndarray) -> np.ndarray:
    """Sum of A[i, r]**2 over i for each column r of the C-ordered float array ``A`` (I, R),
    accumulated in float64 in a fixed order of blocks (the same result for any thread count).

    Parameters
    ----------
    A : float32 or float64 (I, R), C-contiguous

    Returns
    -------
    float64 (R,)
    """
    return _column_stats(A, SUM_SQUARES)


def column_abs_sums(A: np.ndarray) -> np.ndarray:
    """Sum of |A[i, r]| over i for each column r (the 1-norms CP-APR normalizes by), in float64,
    in a fixed order of blocks. NumPy's ``np.abs(A).sum(axis=0)`` makes a temporary of A's size
    and reduces it column by column: 4.8 M x 16 took about 2 s with the masked division after
    it (CP-APR's normalization, Amazon-shaped mode, loaded machine).

    Parameters
    ----------
    A : float32 or float64 (I, R), C-contiguous

    Returns
    -------
    float64 (R,)
    """
    return _column_stats(A, SUM_ABS)


def scale_columns(A: np.ndarray, scale: np.ndarray) -> None:
    """``A[:, r] *= scale[r]`` in place, in one pass over A: blocks of rows on numba's threads, a
    matrix of one block on this thread (as :func:`_column_stats`).

    A : float (I, R), C-contiguous, written; scale : float64 (R,)."""
    (_scale_one_block if A.shape[0] <= STAT_BLOCK_ROWS else _scale_blocks)(A, scale)


@nb.njit(nogil=True, cache=True)
def _scale_one_block(A, scale):
    n, R = A.shape
    for i in range(n):
        for r in range(R):
            A[i, r] = A[i, r] * scale[r]


@nb.njit(parallel=True, nogil=True, cache=True)
def _scale_blocks(A, scale):
    n, R = A.shape
    for b in nb.prange((n + STAT_BLOCK_ROWS - 1) // STAT_BLOCK_ROWS):
        for i in range(b * STAT_BLOCK_ROWS, min(n, (b + 1) * STAT_BLOCK_ROWS)):
            for r in range(R):
                A[i, r] = A[i, r] * scale[r]


@nb.njit(nogil=True, cache=True)
def nonzero_rows(A: np.ndarray) -> np.ndarray:
    """The rows of ``A`` (n, R) holding a nonzero, in order (int64): one row-major pass."""
    keep = np.zeros(A.shape[0], dtype=np.bool_)
    n = 0
    for i in range(A.shape[0]):
        for r in range(A.shape[1]):
            if A[i, r] != 0:
                keep[i] = True
                n += 1
                break
    out = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(A.shape[0]):
        if keep[i]:
            out[k] = i
            k += 1
    return out
