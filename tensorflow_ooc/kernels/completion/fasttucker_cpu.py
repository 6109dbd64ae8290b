"""CPU kernels of FastTuckerPlus tensor completion (seed 003, Algorithm 3 and section 3.2).

The model: factors ``A^(n)`` (I_n x J) and core factors ``B^(n)`` (J x R), the core tensor being
the Kruskal tensor of the ``B^(n)``; with ``C^(n) = A^(n) B^(n)`` an entry is predicted by
``xhat = sum_r prod_n C^(n)[i_n, r]``. Every mode's factor is one block of rows of one stacked
array ``A`` (mode ``n`` starts at row ``offsets[n]``); modes of smaller rank ``J_n`` keep zero
columns up to ``J = max J_n`` (with the matching rows of ``B^(n)`` zero, they stay zero).

Kernels take trusted inputs (coordinates inside the shape, ``order`` a permutation of the
entries): :func:`tensorflow_ooc.decompositions.completion.tucker_sgd.tucker_sgd` validates them first.

Loss (the seed's objectives 10 and 11, halved so the updates are its rules 12-15 exactly)::

    f = 1/2 sum_Omega (x - xhat)^2 + lam_A/2 sum_samples sum_n |a_{i_n}|^2 + lam_B/2 sum_n |B^(n)|^2
"""

from __future__ import annotations

import numba as nb
import numpy as np

# added to |g|^2 in the normalized step: with the values scaled to unit mean square, it only
# matters for samples whose prediction hardly depends on their rows (a nearly dead model)
NORMALIZED_DELTA = 1e-3


@nb.njit(cache=True, inline="always")
def _batch_products(coords, order, lo, hi, offsets, A, B, rows, C):
    """Rows of the batch ``order[lo:hi]`` into ``rows`` (m, N) and ``C[s, n] = A[rows[s, n]] @ B[n]``."""
    N = coords.shape[1]
    J = A.shape[1]
    R = B.shape[2]
    for s in range(hi - lo):
        e = order[lo + s]
        for n in range(N):
            row = offsets[n] + coords[e, n]
            rows[s, n] = row
            for r in range(R):
                C[s, n, r] = 0.0
            for j in range(J):  # rows of B contiguous in the inner loop
                a = A[row, j]
                for r in range(R):
                    C[s, n, r] += a * B[n, j, r]


@nb.njit(cache=True, inline="always")
def _others(C, s, n, d):
    """``d[r] = prod_{k != n} C[s, k, r]``: the seed's ``d^(n)`` row of sample ``s``."""
    N = C.shape[1]
    for r in range(C.shape[2]):
        p = 1.0
        for k in range(N):
            if k != n:
                p *= C[s, k, r]
        d[r] = p


@nb.njit(cache=True, parallel=True)
def factor_pass(coords, values, order, offsets, A, B, batch, lr, reg, groups, normalized=False):
    """One factor pass of FastTuckerPlus over the batches ``order[b*batch:(b+1)*batch]``.

    Per batch Psi (the seed's matrixized rule 14): ``C_Psi^(n) = A_Psi^(n) B^(n)`` for all modes
    from the rows as they are when the batch starts, ``e = x_Psi - xhat_Psi``, then every row of the
    batch moves by ``lr * (e * (D_Psi^(n) B^(n)T) - reg * A_Psi^(n))``. A row that occurs twice in
    one batch gets both moves (added), as the per-sample rule 12 applied to the batch's loss would.

    ``normalized``: sample ``s``'s moves are divided by ``|g_s|^2 + NORMALIZED_DELTA``, with
    ``g_s = (d^(n) B^(n)T)_n`` the gradient of its prediction with respect to all its rows (the
    normalized LMS step). To first order the step then removes the fraction ``lr`` of the
    sample's error whatever the scale of the other modes' rows, where the plain step's reach
    grows with ``|g_s|^2`` and overshoots on samples of large curvature (0 < lr < 2 is stable).

    Batches are split into ``groups`` contiguous runs processed in parallel, and rows are written
    without synchronization between groups (Hogwild, as the seed's warps do): a group may read a
    row while another writes it. With ``groups=1`` (or one numba thread) the pass is sequential
    and reproducible bit for bit.

    Parameters
    ----------
    coords : (n, N) int64          0-based coordinates of the observed entries
    values : (n,) float64
    order : (n,) int64             the epoch's permutation of the entries
    offsets : (N,) int64           first row of each mode in ``A``
    A : (sum I_n, J) float64       stacked factors, updated in place
    B : (N, J, R) float64          core factors (read only)
    batch : int                    M, entries per batch
    lr, reg : float                gamma_A and lambda_A (the step fraction with ``normalized``)
    groups : int                   parallel runs of batches
    normalized : bool              normalized (NLMS) steps instead of the seed's plain ones

    Returns
    -------
    float : sum of squared errors of the batches' predictions (before their updates)
    """
    n_entries = order.shape[0]
    N = coords.shape[1]
    J = A.shape[1]
    R = B.shape[2]
    nb_batches = (n_entries + batch - 1) // batch
    groups = max(1, min(groups, nb_batches))
    sse = np.zeros(groups)
    for g in nb.prange(groups):
        b_lo = g * nb_batches // groups
        b_hi = (g + 1) * nb_batches // groups
        rows = np.empty((batch, N), np.int64)
        C = np.empty((batch, N, R))
        err = np.empty(batch)
        delta = np.empty((batch, N, J))
        d = np.empty(R)
        local = 0.0
        for b in range(b_lo, b_hi):
            lo = b * batch
            hi = min(lo + batch, n_entries)
            m = hi - lo
            _batch_products(coords, order, lo, hi, offsets, A, B, rows, C)
            for s in range(m):
                xhat = 0.0
                for r in range(R):
                    p = 1.0
                    for n in range(N):
                        p *= C[s, n, r]
                    xhat += p
                err[s] = values[order[lo + s]] - xhat
                local += err[s] * err[s]
            # all moves from the batch-start rows first, then the writes (matrixized form)
            for s in range(m):
                g2 = 0.0
                for n in range(N):
                    _others(C, s, n, d)
                    row = rows[s, n]
                    for j in range(J):
                        acc = 0.0
                        for r in range(R):
                            acc += d[r] * B[n, j, r]
                        g2 += acc * acc
                        delta[s, n, j] = err[s] * acc - reg * A[row, j]
                step = lr / (g2 + NORMALIZED_DELTA) if normalized else lr
                for n in range(N):
                    for j in range(J):
                        delta[s, n, j] *= step
            for s in range(m):
                for n in range(N):
                    row = rows[s, n]
                    for j in range(J):
                        A[row, j] += delta[s, n, j]
        sse[g] = local
    return sse.sum()


@nb.njit(cache=True, parallel=True)
def core_gradient(coords, values, offsets, A, B, groups):
    """Accumulated core gradient of the seed's Algorithm 5 over all given entries.

    ``G^(n) = -sum_entries e * a_{i_n}^T d^(n)`` (J x R per mode), the gradient of
    ``1/2 sum (x - xhat)^2`` with respect to ``B^(n)``. Entries are split into ``groups``
    contiguous runs, each with a private gradient, summed in group order (deterministic for a
    fixed ``groups``).

    Parameters
    ----------
    coords : (n, N) int64; values : (n,) float64; offsets : (N,) int64
    A : (sum I_n, J) float64; B : (N, J, R) float64
    groups : int

    Returns
    -------
    (N, J, R) float64 gradient, and the sum of squared errors
    """
    n_entries = coords.shape[0]
    N = coords.shape[1]
    J = A.shape[1]
    R = B.shape[2]
    groups = max(1, min(groups, n_entries))
    grads = np.zeros((groups, N, J, R))
    sse = np.zeros(groups)
    for g in nb.prange(groups):
        lo = g * n_entries // groups
        hi = (g + 1) * n_entries // groups
        C = np.empty((1, N, R))
        d = np.empty(R)
        rows = np.empty(N, np.int64)
        local = 0.0
        for e in range(lo, hi):
            for n in range(N):
                row = offsets[n] + coords[e, n]
                rows[n] = row
                for r in range(R):
                    C[0, n, r] = 0.0
                for j in range(J):
                    a = A[row, j]
                    for r in range(R):
                        C[0, n, r] += a * B[n, j, r]
            xhat = 0.0
            for r in range(R):
                p = 1.0
                for n in range(N):
                    p *= C[0, n, r]
                xhat += p
            err = values[e] - xhat
            local += err * err
            for n in range(N):
                _others(C, 0, n, d)
                row = rows[n]
                for j in range(J):
                    a = err * A[row, j]
                    if a != 0.0:
                        for r in range(R):
                            grads[g, n, j, r] -= a * d[r]
        sse[g] = local
    out = np.zeros((N, J, R))
    for g in range(groups):
        out += grads[g]
    return out, sse.sum()


@nb.njit(cache=True, parallel=True)
def predict_entries(coords, offsets, A, B):
    """``xhat`` at each coordinate (n, N) int64 of the stacked model ``A``, ``B``."""
    n_entries = coords.shape[0]
    N = coords.shape[1]
    J = A.shape[1]
    R = B.shape[2]
    out = np.empty(n_entries)
    for e in nb.prange(n_entries):
        total = 0.0
        for r in range(R):
            p = 1.0
            for n in range(N):
                row = offsets[n] + coords[e, n]
                acc = 0.0
                for j in range(J):
                    acc += A[row, j] * B[n, j, r]
                p *= acc
            total += p
        out[e] = total
    return out


@nb.njit(cache=True)
def _splitmix(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(cache=True, parallel=True)
def held_out_mask(coords, seed, fraction):
    """True for the entries a seeded hash of their coordinates puts in the test set.

    The decision depends only on the coordinates and ``seed`` (not on the partitioning or the
    order), so every partition splits alike and no entry can fall in both sets.
    """
    n_entries = coords.shape[0]
    N = coords.shape[1]
    out = np.empty(n_entries, np.bool_)
    threshold = np.uint64(min(fraction, 1.0) * 18446744073709549568.0)  # fraction * 2^64 (float-safe)
    for e in nb.prange(n_entries):
        h = _splitmix(np.uint64(seed))
        for n in range(N):
            h = _splitmix(h ^ np.uint64(coords[e, n]))
        out[e] = h < threshold
    return out


@nb.njit(cache=True, parallel=True)
def coordinate_hashes(coords):
    """A 64-bit hash of each coordinate (as int64), for set tests on shapes too large to linearize."""
    n_entries = coords.shape[0]
    out = np.empty(n_entries, np.int64)
    for e in nb.prange(n_entries):
        h = np.uint64(0x243F6A8885A308D3)
        for n in range(coords.shape[1]):
            h = _splitmix(h ^ np.uint64(coords[e, n]))
        out[e] = np.int64(h)
    return out
