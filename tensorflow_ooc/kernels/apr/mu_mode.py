"""CP-APR's multiplicative updates of one mode, all its inner iterations in two kernel calls, on
nonzeros held in memory as coordinates sorted by the mode's index.

While mode ``n`` is updated the other factors are fixed, and each row of ``B = A_n diag(lambda)``
is its own problem: ``Phi[i] = sum_k x_k / max(b_i . pi_k, eps) pi_k`` over the row's nonzeros,
``pi_k`` their Khatri-Rao rows. Only the stopping test couples the rows (inner iteration ``t``
stops the mode when ``max |min(B, 1 - Phi)| < tol`` over all rows). So the rows are taken one at a
time, a block of rows' ``pi`` formed once into a buffer that stays in the cache, and each row runs
its inner iterations back to back, recording per iteration its row of ``B`` before the update, where
its ``Phi`` is positive, and its KKT violation (:func:`row_iterations`). The first inner iteration
runs alone (a converged mode stops there, as it does in the general path); the others follow in one
call, and the mode's rows are then set to those of the first iteration whose violation over all rows
is below ``tol``. The result is the per-iteration passes' (pyttb's order of operations), with the
Khatri-Rao rows formed twice per mode instead of once per inner iteration and read from the cache.

Threads take contiguous shares of whole rows (equal in nonzeros as far as rows allow).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

__all__ = ["BLOCK_NNZ", "ModeRuns", "mode_runs", "row_iterations", "mu_mode", "model_sums"]

# nonzeros per block of rows whose Khatri-Rao rows are formed together (R16: 256 KiB, within L2)
BLOCK_NNZ = 2048


@dataclass
class ModeRuns:
    """The nonzeros of one mode sorted by its index, in blocks of whole rows and thread shares.

    perm : int64 (nnz,): position of the ``k``-th sorted nonzero among the input nonzeros
    values : float (nnz,): the values in sorted order
    ptr : int64 (runs + 1,): nonzeros ``ptr[q] .. ptr[q + 1]`` have row ``rows[q]``
    rows : int64 (runs,): the row of each run (increasing)
    empty : int64 (E,): rows without nonzeros (their Phi is 0)
    block : int64 (blocks + 1,): block ``b`` holds runs ``block[b] .. block[b + 1]``
    share : int64 (S + 1,): thread share ``g`` holds blocks ``share[g] .. share[g + 1]``
    """

    perm: np.ndarray
    values: np.ndarray
    ptr: np.ndarray
    rows: np.ndarray
    empty: np.ndarray
    block: np.ndarray
    share: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in vars(self).values()))

    @property
    def block_nnz(self) -> int:
        """The most nonzeros of a block (the Khatri-Rao buffer's rows)."""
        return int(np.max(np.diff(self.ptr[self.block]), initial=0))


def mode_runs(index: np.ndarray, values: np.ndarray, rows: int, shares: int, block_nnz: int = BLOCK_NNZ) -> ModeRuns:
    """The nonzeros with mode index ``index`` (int, (nnz,)) sorted by it (stable), in blocks of
    whole rows of about ``block_nnz`` nonzeros (a longer row is a block of its own) and ``shares``
    contiguous shares of blocks of about equal nonzeros."""
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
    # blocks: cut before the first run that would take a block past block_nnz
    cuts = [0]
    for q in range(len(run_rows)):
        if ptr[q + 1] - ptr[cuts[-1]] > block_nnz and q > cuts[-1]:
            cuts.append(q)
    cuts.append(len(run_rows))
    block = np.array(cuts if len(run_rows) else [0], dtype=np.int64)
    # shares: the block boundary nearest to each equal split of the nonzeros
    shares = max(1, min(int(shares), len(block) - 1)) if len(block) > 1 else 1
    at = ptr[block]
    share = np.searchsorted(at, np.linspace(0, nnz, shares + 1)[1:-1])
    share = np.unique(np.concatenate([[0], share, [len(block) - 1]])).astype(np.int64)
    return ModeRuns(
        perm,
        np.ascontiguousarray(values[perm], dtype=np.float64),
        ptr,
        run_rows,
        np.flatnonzero(~seen).astype(np.int64),
        block,
        share,
    )


FLAGS = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract"}}


@nb.njit(inline="always", fastmath={"reassoc", "contract"})
def _share_rows(
    g, coords, perm, x, ptr, rows, block, share, F, offs, mode, eps, t0, t1, pi_buf, before, positive, worst
):
    # share g's rows: their blocks' Khatri-Rao rows, then each row's inner iterations t0 .. t1 - 1
    N = coords.shape[1]
    R = F.shape[1]
    base = offs[mode]
    pi = pi_buf[g]
    acc = np.empty(R)
    for t in range(t0, t1):
        worst[g, t] = 0.0
    for b in range(share[g], share[g + 1]):
        q0, q1 = block[b], block[b + 1]
        k0 = ptr[q0]
        # the block's Khatri-Rao rows (the other modes in order)
        for k in range(k0, ptr[q1]):
            p = perm[k]
            first = True
            for j in range(N):
                if j == mode:
                    continue
                row = offs[j] + coords[p, j]
                if first:
                    for r in range(R):
                        pi[k - k0, r] = F[row, r]
                    first = False
                else:
                    for r in range(R):
                        pi[k - k0, r] *= F[row, r]
            if first:  # a one-mode tensor: the empty product
                for r in range(R):
                    pi[k - k0, r] = 1.0
        for q in range(q0, q1):
            i = rows[q]
            fi = base + i
            for t in range(t0, t1):
                for r in range(R):
                    acc[r] = 0.0
                for k in range(ptr[q] - k0, ptr[q + 1] - k0):
                    m = 0.0
                    for r in range(R):
                        m += F[fi, r] * pi[k, r]
                    v = x[k + k0] / max(m, eps)
                    for r in range(R):
                        acc[r] += v * pi[k, r]
                w = worst[g, t]
                for r in range(R):
                    bv = F[fi, r]
                    p = acc[r]
                    before[t, i, r] = bv
                    positive[t, i, r] = p > 0
                    v = abs(min(bv, 1.0 - p))
                    if v > w:
                        w = v
                    F[fi, r] = bv * p
                worst[g, t] = w


@nb.njit(parallel=True, **FLAGS)
def row_iterations(
    coords: np.ndarray,
    perm: np.ndarray,
    x: np.ndarray,
    ptr: np.ndarray,
    rows: np.ndarray,
    block: np.ndarray,
    share: np.ndarray,
    F: np.ndarray,
    offs: np.ndarray,
    mode: int,
    eps: float,
    t0: int,
    t1: int,
    pi_buf: np.ndarray,
    before: np.ndarray,
    positive: np.ndarray,
    worst: np.ndarray,
) -> None:
    """Inner iterations ``t0 .. t1 - 1`` of every row with nonzeros, row after row: ``Phi`` of the
    row, then ``b <- b * Phi``. Per iteration ``t`` it records the row before the update into
    ``before[t]``, where Phi is positive into ``positive[t]`` and the largest KKT violation
    ``|min(b, 1 - Phi)|`` of share ``g``'s rows into ``worst[g, t]``.

    coords : int (nnz, N), the input order; perm, x, ptr, rows, block, share : a :class:`ModeRuns`';
    F : float (sum I, R), the stacked factors, mode ``mode``'s rows being ``B`` (written);
    offs : int64 (N,); pi_buf : float (S, block_nnz, R), scratch; before : float (T, I, R);
    positive : bool (T, I, R); worst : float (S, T)."""
    for g in nb.prange(share.shape[0] - 1):
        _share_rows(
            g, coords, perm, x, ptr, rows, block, share, F, offs, mode, eps, t0, t1, pi_buf, before, positive, worst
        )


@nb.njit(**FLAGS)
def row_iterations_one_thread(
    coords, perm, x, ptr, rows, block, share, F, offs, mode, eps, t0, t1, pi_buf, before, positive, worst
):
    """:func:`row_iterations` on this thread, the shares in turn (no parallel region to start)."""
    for g in range(share.shape[0] - 1):
        _share_rows(
            g, coords, perm, x, ptr, rows, block, share, F, offs, mode, eps, t0, t1, pi_buf, before, positive, worst
        )


@nb.njit(nogil=True, cache=True)
def _empty_kkt(empty, B):
    # rows without nonzeros have Phi = 0: their violation is |min(b, 1)|
    w = 0.0
    for i in empty:
        for r in range(B.shape[1]):
            v = abs(min(B[i, r], 1.0))
            if v > w:
                w = v
    return w


@nb.njit(nogil=True, cache=True)
def _settle(rows, empty, B, before, positive, t_stop, updates, out_positive):
    # the rows after ``updates`` updates (the stopping iteration's undone), Phi's sign at ``t_stop``
    R = B.shape[1]
    if updates <= t_stop:
        for i in rows:
            for r in range(R):
                B[i, r] = before[updates, i, r]
    for i in rows:
        for r in range(R):
            out_positive[i, r] = positive[t_stop, i, r]
    for i in empty:
        for r in range(R):
            out_positive[i, r] = False
            if updates > 0:
                B[i, r] = B[i, r] * 0.0


def mu_mode(
    runs: ModeRuns,
    coords: np.ndarray,
    F: np.ndarray,
    offs: np.ndarray,
    mode: int,
    eps: float,
    tol: float,
    max_inner: int,
    pi_buf: np.ndarray,
    before: np.ndarray,
    positive: np.ndarray,
    worst: np.ndarray,
    out_positive: np.ndarray,
    threads: bool = True,
) -> tuple[float, int, int]:
    """Up to ``max_inner`` inner iterations of the multiplicative update on mode ``mode``'s rows of
    ``F`` (the factor times the weights), as pyttb's: Phi, then stop when ``max |min(B, 1 - Phi)| <
    tol``, else ``B <- B * Phi``. Returns ``(kkt, inner iterations, updates taken)``; ``out_positive``
    (bool (I, R)) holds where the last Phi is positive.

    Scratch: ``pi_buf`` float (S, runs.block_nnz, R); ``before`` float (T, I', R) and ``positive``
    bool (T, I', R) with ``T >= max_inner`` and ``I' >= I``; ``worst`` float (S', T), S' >= S.
    ``threads``: the shares on numba's threads, else in turn on this one."""
    B = F[offs[mode] : offs[mode] + out_positive.shape[0]]
    worst = worst[: runs.share.shape[0] - 1]
    args = (coords, runs.perm, runs.values, runs.ptr, runs.rows, runs.block, runs.share, F, offs, mode, float(eps))
    scratch = (pi_buf, before, positive, worst)
    kernel = row_iterations if threads else row_iterations_one_thread
    # the first inner iteration alone: a converged mode stops there
    kernel(*args, 0, 1, *scratch)
    kkt = max(float(worst[:, 0].max(initial=0.0)), _empty_kkt(runs.empty, B))
    t_stop, updates = 0, 0 if kkt < tol else 1
    if updates and max_inner > 1:
        kernel(*args, 1, int(max_inner), *scratch)
        # rows without nonzeros are 0 after the first update: no violation
        for t_stop in range(1, int(max_inner)):
            kkt = float(worst[:, t_stop].max(initial=0.0))
            if kkt < tol:
                break
        updates = t_stop if kkt < tol else t_stop + 1
    _settle(runs.rows, runs.empty, B, before, positive, t_stop, updates, out_positive)
    return kkt, t_stop + 1, updates


@nb.njit(inline="always", fastmath={"reassoc", "contract"})
def _share_sums(g, shares, coords, perm, x, F, offs, lam, ll, xm):
    nnz, N = coords.shape
    R = F.shape[1]
    s1 = 0.0
    s2 = 0.0
    for k in range(nnz * g // shares, nnz * (g + 1) // shares):
        p = perm[k]
        m = 0.0
        for r in range(R):
            v = lam[r]
            for j in range(N):
                v *= F[offs[j] + coords[p, j], r]
            m += v
        s1 += x[k] * np.log(m)
        s2 += x[k] * m
    ll[g] = s1
    xm[g] = s2


@nb.njit(parallel=True, **FLAGS)
def _model_sums_threads(coords, perm, x, F, offs, lam, shares):
    ll = np.zeros(shares)
    xm = np.zeros(shares)
    for g in nb.prange(shares):
        _share_sums(g, shares, coords, perm, x, F, offs, lam, ll, xm)
    return ll.sum(), xm.sum()


@nb.njit(**FLAGS)
def _model_sums_one(coords, perm, x, F, offs, lam, shares):
    ll = np.zeros(shares)
    xm = np.zeros(shares)
    for g in range(shares):
        _share_sums(g, shares, coords, perm, x, F, offs, lam, ll, xm)
    return ll.sum(), xm.sum()


def model_sums(
    coords: np.ndarray,
    perm: np.ndarray,
    x: np.ndarray,
    F: np.ndarray,
    offs: np.ndarray,
    lam: np.ndarray,
    shares: int,
    threads: bool = True,
) -> tuple[float, float]:
    """``(sum x log m, sum x m)`` over the nonzeros (``perm`` their order, ``x`` their values in it),
    ``m = sum_r lam_r prod_j F[offs[j] + coords[p, j], r]``: the log-likelihood's data term and
    <X, M>, summed per share then over shares in order (on numba's threads with ``threads``)."""
    kernel = _model_sums_threads if threads else _model_sums_one
    return kernel(coords, perm, x, F, offs, np.ascontiguousarray(lam, dtype=np.float64), max(1, int(shares)))
