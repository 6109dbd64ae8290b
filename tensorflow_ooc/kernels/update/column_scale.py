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


@nb.njit(parallel=True, nogil=True, cache=True)
def _column_stats(A: np.ndarray, stat: int) -> np.ndarray:
    """Per column of ``A`` (I, R): the largest |A[i, r]| (``stat`` MAX_ABS), the sum of A[i, r]**2
    (SUM_SQUARES) or of |A[i, r]| (SUM_ABS), in float64. Blocks of ``STAT_BLOCK_ROWS`` rows run on
    numba's threads and are combined in a fixed order, so the result does not depend on the
    thread count."""
    n, R = A.shape
    nblocks = (n + STAT_BLOCK_ROWS - 1) // STAT_BLOCK_ROWS
    part = np.zeros((nblocks, R))
    for b in nb.prange(nblocks):
        for i in range(b * STAT_BLOCK_ROWS, min(n, (b + 1) * STAT_BLOCK_ROWS)):
            for r in range(R):
                x = np.float64(A[i, r])
                if stat == 1:
                    part[b, r] += x * x
                elif stat == 2:
                    part[b, r] += abs(x)
                elif abs(x) > part[b, r]:
                    part[b, r] = abs(x)
    out = np.zeros(R)
    for b in range(nblocks):
        for r in range(R):
            out[r] = max(out[r], part[b, r]) if stat == 0 else out[r] + part[b, r]
    return out


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


@nb.njit(parallel=True, nogil=True, cache=True)
def scale_columns(A: np.ndarray, scale: np.ndarray) -> None:
    """``A[:, r] *= scale[r]`` in place, rows on numba's threads (one pass over A).

    A : float (I, R), C-contiguous, written; scale : float64 (R,)."""
    n, R = A.shape
    for b in nb.prange((n + STAT_BLOCK_ROWS - 1) // STAT_BLOCK_ROWS):
        for i in range(b * STAT_BLOCK_ROWS, min(n, (b + 1) * STAT_BLOCK_ROWS)):
            for r in range(R):
                A[i, r] = A[i, r] * scale[r]
