"""HALS sweeps of a nonnegative CP-ALS mode update (hierarchical ALS, Gillis & Glineur 2012), as
TensorLy's ``non_negative_parafac_hals`` runs them (``tensorly.solvers.nnls.hals_nnls``).

For the normal equations ``A V = M`` of one mode (M the MTTKRP, V the Hadamard product of the
other modes' Grams), one sweep updates the columns in turn, each as the exact minimizer over that
column with the others fixed:

    a_r <- max(0, (M[:, r] - A V[:, r] + V[r, r] a_r) / (V[r, r] + reg))

which is ``a_r + (M[:, r] - A V[:, r]) / V[r, r]`` projected on a_r >= 0 when ``reg`` = 0; ``reg``
adds ``reg / 2 ||A||_F^2`` to the subproblem's ``1/2 ||X_(n) - A KR^T||_F^2`` (TensorLy's
``ridge_coefficient`` is ``reg / 2``: its denominator is ``V[r, r] + 2 ridge``). A column whose
denominator is 0 is left as it is (TensorLy skips it too).

The update of row i reads row i of A and M only, so rows are independent: a fixed number of
sweeps runs row by row (all sweeps of a row in registers, one pass over A and M), on numba's
threads, in any row blocks (spans of a reduce-scatter, the in-place update's blocks, a worker's
rows) with the same result. The dot products accumulate in float64 whatever the factors' dtype.
"""

from __future__ import annotations

import numba as nb
import numpy as np

HALS_BLOCK_ROWS = 1 << 10


def _hals_py(A: np.ndarray, M: np.ndarray, V: np.ndarray, reg: float, sweeps: int) -> None:
    n, R = A.shape
    nblocks = (n + HALS_BLOCK_ROWS - 1) // HALS_BLOCK_ROWS
    for b in nb.prange(nblocks):
        a = np.empty(R)
        for i in range(b * HALS_BLOCK_ROWS, min(n, (b + 1) * HALS_BLOCK_ROWS)):
            for r in range(R):
                a[r] = A[i, r]
            for _ in range(sweeps):
                for r in range(R):
                    d = V[r, r]
                    den = d + reg
                    if not den > 0.0:
                        continue
                    t = np.float64(M[i, r])
                    for k in range(R):
                        t -= V[r, k] * a[k]
                    x = (t + d * a[r]) / den
                    # NaN stays NaN (the driver's fit check names it), negatives become 0
                    a[r] = 0.0 if x < 0.0 else x
            for r in range(R):
                A[i, r] = a[r]


# one block of rows runs on one thread: no parallel launch (which costs more than the sweeps
# of a short mode, and far more when the cores are busy)
_hals_parallel = nb.njit(parallel=True, nogil=True, cache=True)(_hals_py)
_hals_serial = nb.njit(nogil=True, cache=True)(_hals_py)


def hals_rows(A: np.ndarray, M: np.ndarray, V: np.ndarray, reg: float = 0.0, sweeps: int = 1) -> np.ndarray:
    """``sweeps`` HALS sweeps over the columns of ``A`` (I, R) in place, for the normal equations
    ``A V = M``; returns ``A``.

    Parameters
    ----------
    A : float32 or float64 (I, R), C-contiguous
        The warm start (the current factor rows, nonnegative), overwritten by the update.
    M : (I, R)
        The MTTKRP rows of the same rows.
    V : (R, R)
        The Hadamard product of the other modes' Grams (symmetric, nonnegative).
    reg : float
        L2 regularization added to V's diagonal (>= 0).
    sweeps : int
        Sweeps over the R columns (>= 1).
    """
    if A.shape[0]:
        kernel = _hals_parallel if A.shape[0] > HALS_BLOCK_ROWS else _hals_serial
        kernel(A, np.ascontiguousarray(M), np.ascontiguousarray(V, dtype=np.float64), float(reg), int(sweeps))
    return A
