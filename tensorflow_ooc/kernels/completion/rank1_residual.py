"""Rank-1 least-squares fits to residuals on observed entries, by alternating row solves.

Used to restart a component that SGD lost (:mod:`tensorflow_ooc.execution.component_revival`):
with ``e`` the residuals of the observed entries and ``u^(n)`` one column per mode, the best
``u^(n)`` for the others fixed solves, row by row,

    u^(n)[i] = sum_{entries with i_n = i} e q / sum q^2,   q = prod_{m != n} u^(m)[i_m]

(the rank-1 case of CP-ALS restricted to the observed entries). On sparse samples this problem
has spurious local minima, so the kernels carry ``S`` independent fits (columns of ``cols``)
through one pass over the entries. Inputs are trusted: coordinates inside the shape, ``cols``
stacked like the factors (mode ``m``'s rows at ``offsets[m]``).
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True)
def rank1_row_sums(coords, resid, cols, offsets, mode, num, den):
    """Add, for every entry and fit ``s``, ``e q`` to ``num[i_mode, s]`` and ``q^2`` to ``den[i_mode, s]``.

    coords : int64 (n, N)       entry coordinates
    resid : float64 (n,)        residuals of the entries
    cols : float64 (sum I, S)   the current column of every mode, stacked, one per fit
    offsets : int64 (N,)        first row of each mode's column in ``cols``
    mode : int                  the mode being solved for
    num, den : float64 (I_mode, S)   accumulated (not zeroed here)
    """
    N = coords.shape[1]
    S = cols.shape[1]
    q = np.empty(S)
    for t in range(coords.shape[0]):
        for s in range(S):
            q[s] = 1.0
        for m in range(N):
            if m != mode:
                row = offsets[m] + coords[t, m]
                for s in range(S):
                    q[s] *= cols[row, s]
        i = coords[t, mode]
        e = resid[t]
        for s in range(S):
            num[i, s] += e * q[s]
            den[i, s] += q[s] * q[s]


@nb.njit(cache=True)
def rank1_sse(coords, resid, cols, offsets):
    """``(sum e^2, [sum (e - prod_m u_s^(m)[i_m])^2 for each fit s])``: the residual's squared
    sum before and after each fit's rank-1 term is taken out."""
    N = coords.shape[1]
    S = cols.shape[1]
    before = 0.0
    after = np.zeros(S)
    for t in range(coords.shape[0]):
        e = resid[t]
        before += e * e
        for s in range(S):
            q = 1.0
            for m in range(N):
                q *= cols[offsets[m] + coords[t, m], s]
            after[s] += (e - q) * (e - q)
    return before, after
