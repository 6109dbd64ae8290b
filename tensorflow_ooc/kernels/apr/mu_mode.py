"""CP-APR's multiplicative updates of one mode, all its inner iterations in one call, on nonzeros
held in memory as coordinates (tensors small enough that a pass over them costs less than the
Python, task and thread-start work around it: 10 k-100 k nonzeros take tens of microseconds).

The other factors stay fixed while a mode is updated, so each nonzero's Khatri-Rao row ``pi`` is
formed once per mode (:func:`khatri_rao_rows`, pyttb's ``calc_partials``) and every inner iteration
reads it: ``m = b . pi`` (``b`` the nonzero's row of ``B = A_n diag(lambda)``), ``Phi[i] += x /
max(m, eps) pi``. The nonzeros are sorted by the mode's index (:class:`ModeRuns`); each thread takes
an equal contiguous share of them, so a row is summed in registers and only a row cut by a share's
edge is added up after the pass (a knowledge graph's relation mode has a few rows holding most
nonzeros). ``B <- B * Phi`` of a row is taken at the start of the next pass over it, so an inner
iteration is one parallel loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

__all__ = ["ModeRuns", "mode_runs", "khatri_rao_rows", "mu_mode_iterations", "model_sums"]


@dataclass
class ModeRuns:
    """The nonzeros of one mode sorted by its index and cut into equal thread shares.

    perm : int64 (nnz,): position of the ``k``-th sorted nonzero among the input nonzeros
    values : float (nnz,): the values in sorted order
    ptr : int64 (runs + 1,): nonzeros ``ptr[q] .. ptr[q + 1]`` have row ``rows[q]``
    rows : int64 (runs,): the row of each run (increasing)
    empty : int64 (E,): rows without nonzeros (their Phi is 0)
    share : int64 (S + 1,): share ``g`` holds nonzeros ``share[g] .. share[g + 1]``
    first_run, last_run : int64 (S,): the runs a share touches
    cut_rows : int64 (C,): rows whose run more than one share holds a part of
    cut_ptr : int64 (C + 1,), cut_parts : int64 (P,): row ``c``'s parts are ``cut_parts[cut_ptr[c]
        .. cut_ptr[c + 1]]`` in order, each ``2 g`` (share ``g``'s first run) or ``2 g + 1`` (its last)
    """

    perm: np.ndarray
    values: np.ndarray
    ptr: np.ndarray
    rows: np.ndarray
    empty: np.ndarray
    share: np.ndarray
    first_run: np.ndarray
    last_run: np.ndarray
    cut_rows: np.ndarray
    cut_ptr: np.ndarray
    cut_parts: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in vars(self).values()))


def mode_runs(index: np.ndarray, values: np.ndarray, rows: int, shares: int) -> ModeRuns:
    """The nonzeros with mode index ``index`` (int, (nnz,)) sorted by it (stable), in ``shares``
    equal contiguous shares."""
    nnz = int(index.shape[0])
    perm = np.argsort(index, kind="stable").astype(np.int64)
    ordered = index[perm]
    if nnz:
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    else:
        starts = np.zeros(0, dtype=np.int64)
    ptr = np.concatenate([starts, [nnz]]).astype(np.int64)
    run_rows = ordered[starts].astype(np.int64)
    seen = np.zeros(rows, dtype=bool)
    seen[run_rows] = True
    shares = max(1, min(int(shares), max(nnz, 1)))
    share = np.linspace(0, nnz, shares + 1).round().astype(np.int64)
    # the run holding a share's first and last nonzero (a share never ends before it starts)
    first_run = np.searchsorted(ptr, share[:-1], side="right") - 1
    last_run = np.searchsorted(ptr, np.maximum(share[1:] - 1, share[:-1]), side="right") - 1
    parts: dict[int, list[int]] = {}
    for g in range(shares):
        if share[g + 1] == share[g]:
            continue
        for slot, q in ((0, first_run[g]), (1, last_run[g])):
            if (slot == 1 and q == first_run[g]) or (ptr[q] >= share[g] and ptr[q + 1] <= share[g + 1]):
                continue
            parts.setdefault(int(q), []).append(2 * g + slot)
    cut = sorted(parts)
    return ModeRuns(
        perm,
        np.ascontiguousarray(values[perm], dtype=np.float64),
        ptr,
        run_rows,
        np.flatnonzero(~seen).astype(np.int64),
        share,
        first_run.astype(np.int64),
        last_run.astype(np.int64),
        run_rows[cut] if cut else np.zeros(0, dtype=np.int64),
        np.concatenate([[0], np.cumsum([len(parts[q]) for q in cut], dtype=np.int64)]).astype(np.int64),
        np.array([p for q in cut for p in parts[q]], dtype=np.int64),
    )


@nb.njit(parallel=True, nogil=True, cache=True)
def khatri_rao_rows(coords: np.ndarray, perm: np.ndarray, F: np.ndarray, offs: np.ndarray, mode: int, pi: np.ndarray):
    """``pi[k] = prod_{j != mode} A_j[coords[perm[k], j]]`` (the modes in order), the factors
    ``A_j`` the row blocks ``offs[j] ..`` of ``F``.

    coords : int (nnz, N); perm : int64 (nnz,); F : float (sum I, R); offs : int64 (N,);
    pi : float (nnz, R), written."""
    nnz, N = coords.shape
    R = F.shape[1]
    for k in nb.prange(nnz):
        p = perm[k]
        first = True
        for j in range(N):
            if j == mode:
                continue
            row = offs[j] + coords[p, j]
            if first:
                for r in range(R):
                    pi[k, r] = F[row, r]
                first = False
            else:
                for r in range(R):
                    pi[k, r] *= F[row, r]
        if first:  # a one-mode tensor: the empty product
            for r in range(R):
                pi[k, r] = 1.0


@nb.njit(inline="always")
def _row_terms(B, i, pi, x, lo, hi, eps, acc):
    # acc = sum_{k in lo..hi} x_k / max(b_i . pi_k, eps) pi_k
    R = B.shape[1]
    for r in range(R):
        acc[r] = 0.0
    for k in range(lo, hi):
        m = 0.0
        for r in range(R):
            m += B[i, r] * pi[k, r]
        v = x[k] / max(m, eps)
        for r in range(R):
            acc[r] += v * pi[k, r]


@nb.njit(inline="always")
def _finish_row(B, phi, positive, i, acc):
    # Phi's row, where it is positive, and the row's KKT violation max |min(b, 1 - Phi)|
    worst = 0.0
    for r in range(B.shape[1]):
        p = acc[r]
        phi[i, r] = p
        positive[i, r] = p > 0
        v = abs(min(B[i, r], 1.0 - p))
        if v > worst:
            worst = v
    return worst


@nb.njit(parallel=True, nogil=True, cache=True, fastmath={"reassoc", "contract"})
def mu_mode_iterations(
    ptr: np.ndarray,
    rows: np.ndarray,
    empty: np.ndarray,
    share: np.ndarray,
    first_run: np.ndarray,
    last_run: np.ndarray,
    cut_rows: np.ndarray,
    cut_ptr: np.ndarray,
    cut_parts: np.ndarray,
    x: np.ndarray,
    pi: np.ndarray,
    B: np.ndarray,
    phi: np.ndarray,
    positive: np.ndarray,
    eps: float,
    tol: float,
    max_inner: int,
):
    """Up to ``max_inner`` inner iterations of the multiplicative update on ``B`` (the mode's
    factor times the weights), as pyttb's: Phi, then stop when ``max |min(B, 1 - Phi)| < tol``,
    else ``B <- B * Phi``. Returns ``(kkt, inner iterations, updates taken)``; ``phi`` and
    ``positive`` (bool, Phi > 0) hold the last Phi.

    The run table (``ptr`` .. ``cut_parts``) and ``x`` are a :class:`ModeRuns`'; ``pi`` its
    Khatri-Rao rows (:func:`khatri_rao_rows`)."""
    S = share.shape[0] - 1
    R = B.shape[1]
    worst = np.zeros(S)
    parts = np.zeros((2 * S, R))  # a share's sums over its cut first and last runs
    for i in empty:
        for r in range(R):
            phi[i, r] = 0.0
            positive[i, r] = False
    acc = np.zeros(R)
    kkt = 0.0
    for it in range(max_inner):
        for g in nb.prange(S):
            row = np.empty(R)
            w = 0.0
            lo, hi = share[g], share[g + 1]
            if hi > lo:
                for q in range(first_run[g], last_run[g] + 1):
                    i = rows[q]
                    a, b = max(ptr[q], lo), min(ptr[q + 1], hi)
                    whole = a == ptr[q] and b == ptr[q + 1]
                    if whole and it > 0:  # the previous iteration's update of this row
                        for r in range(R):
                            B[i, r] = B[i, r] * phi[i, r]
                    _row_terms(B, i, pi, x, a, b, eps, row)
                    if whole:
                        v = _finish_row(B, phi, positive, i, row)
                        if v > w:
                            w = v
                    else:
                        slot = 2 * g + (0 if q == first_run[g] else 1)
                        for r in range(R):
                            parts[slot, r] = row[r]
            worst[g] = w
        w = worst.max() if S else 0.0
        for c in range(cut_rows.shape[0]):
            for r in range(R):
                acc[r] = 0.0
            for p in range(cut_ptr[c], cut_ptr[c + 1]):
                for r in range(R):
                    acc[r] += parts[cut_parts[p], r]
            v = _finish_row(B, phi, positive, cut_rows[c], acc)
            if v > w:
                w = v
        for i in empty:
            for r in range(R):
                v = abs(min(B[i, r], 1.0))
                if v > w:
                    w = v
        kkt = w
        if kkt < tol:
            return kkt, it + 1, it
        # cut and empty rows update now, whole rows at the start of the next pass
        for i in cut_rows:
            for r in range(R):
                B[i, r] = B[i, r] * phi[i, r]
        for i in empty:
            for r in range(R):
                B[i, r] = B[i, r] * 0.0
    # the last iteration's update of the whole rows
    for g in nb.prange(S):
        lo, hi = share[g], share[g + 1]
        if hi > lo:
            for q in range(first_run[g], last_run[g] + 1):
                if ptr[q] >= lo and ptr[q + 1] <= hi:
                    i = rows[q]
                    for r in range(R):
                        B[i, r] = B[i, r] * phi[i, r]
    return kkt, max_inner, max_inner


@nb.njit(parallel=True, nogil=True, cache=True, fastmath={"reassoc", "contract"})
def model_sums(ptr: np.ndarray, rows: np.ndarray, x: np.ndarray, pi: np.ndarray, A: np.ndarray, lam: np.ndarray):
    """``(sum x log m, sum x m)`` over the nonzeros, ``m = sum_r lam_r A[i, r] pi[k, r]`` (``A``
    the sorted mode's factor, ``pi`` its Khatri-Rao rows): the log-likelihood's data term and
    <X, M>, summed per run then over runs in order."""
    nr = rows.shape[0]
    R = A.shape[1]
    ll = np.zeros(nr)
    xm = np.zeros(nr)
    for q in nb.prange(nr):
        i = rows[q]
        s1 = 0.0
        s2 = 0.0
        for k in range(ptr[q], ptr[q + 1]):
            m = 0.0
            for r in range(R):
                m += lam[r] * A[i, r] * pi[k, r]
            s1 += x[k] * np.log(m)
            s2 += x[k] * m
        ll[q] = s1
        xm[q] = s2
    return ll.sum(), xm.sum()
