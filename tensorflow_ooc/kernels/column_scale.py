"""Column statistics of a factor matrix for the CP-ALS update's normalization.

NumPy reduces a C-ordered (I, R) array along axis 0 with a strided pass per column and a temporary
for ``abs``: 0.4 ms for 14,036 x 16, a tenth of a nips-shaped mode update. One row-major pass with
R accumulators takes a fraction of that.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def column_max_abs(A: np.ndarray) -> np.ndarray:
    """Largest |A[i, r]| of each column r of the C-ordered float array ``A`` (I, R); 0 where I = 0.

    Parameters
    ----------
    A : float32 or float64 (I, R), C-contiguous

    Returns
    -------
    float64 (R,)
    """
    n, R = A.shape
    out = np.zeros(R)
    for i in range(n):
        for r in range(R):
            x = abs(A[i, r])
            if x > out[r]:
                out[r] = x
    return out
