"""CP-APR's multiplicative updates of one mode, all its inner iterations in two kernel calls, on
nonzeros held in memory as coordinates sorted by the mode's index.

While mode ``n`` is updated the other factors are fixed, and each row of ``B = A_n diag(lambda)``
is its own problem: ``Phi[i] = sum_k x_k / max(b_i . pi_k, eps) pi_k`` over the row's nonzeros,
``pi_k`` their Khatri-Rao rows. Only the stopping test couples the rows (inner iteration ``t``
stops the mode when ``max |min(B, 1 - Phi)| < tol`` over all rows). So the rows are taken one at a
time, a block of rows' ``pi`` formed once into a buffer that stays in the cache, and each row runs
its inner iterations back to back, recording per iteration its row of ``B`` before the update, where
its ``Phi`` is positive, and its KKT violation (:func:`row_iterations_kernel`). The first inner iteration
runs alone (a converged mode stops there, as it does in the general path); the others follow in one
call, and the mode's rows are then set to those of the first iteration whose violation over all rows
is below ``tol``. The result is the per-iteration passes' (pyttb's order of operations), with the
Khatri-Rao rows formed twice per mode instead of once per inner iteration and read from the cache.

Threads take contiguous shares of whole rows (equal in nonzeros as far as rows allow).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from ..mttkrp.cpu import SLPKernel, _tree_sum
from ..subnormals import subnormals_flushed
from .cpu import FIXED_RANKS

__all__ = ["BLOCK_NNZ", "ModeRuns", "mode_runs", "row_iterations_kernel", "mu_mode", "model_sums"]

# nonzeros per block of rows whose Khatri-Rao rows are formed together (R16: 256 KiB, within L2)
BLOCK_NNZ = 2048


@dataclass
class ModeRuns:
    """The nonzeros of one mode sorted by its index, in blocks of whole rows and thread shares.

    coords : int64 (nnz, N): the coordinates in sorted order (each mode's nonzeros are read in
        order, their factor rows gathered without an indirection)
    values : float (nnz,): the values in sorted order
    ptr : int64 (runs + 1,): nonzeros ``ptr[q] .. ptr[q + 1]`` have row ``rows[q]``
    rows : int64 (runs,): the row of each run (increasing)
    empty : int64 (E,): rows without nonzeros (their Phi is 0)
    block : int64 (blocks + 1,): block ``b`` holds runs ``block[b] .. block[b + 1]``
    share : int64 (S + 1,): thread share ``g`` holds blocks ``share[g] .. share[g + 1]``
    """

    coords: np.ndarray
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


def mode_runs(
    coords: np.ndarray, mode: int, values: np.ndarray, rows: int, shares: int, block_nnz: int = BLOCK_NNZ
) -> ModeRuns:
    """The nonzeros (``coords`` int (nnz, N)) sorted by mode ``mode``'s index (stable), in blocks of
    whole rows of about ``block_nnz`` nonzeros (a longer row is a block of its own) and ``shares``
    contiguous shares of blocks of about equal nonzeros."""
    index = coords[:, mode]
    nnz = int(index.shape[0])
    perm = np.argsort(index, kind="stable")
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
        np.ascontiguousarray(coords[perm], dtype=np.int64),
        np.ascontiguousarray(values[perm], dtype=np.float64),
        ptr,
        run_rows,
        np.flatnonzero(~seen).astype(np.int64),
        block,
        share,
    )


FLAGS = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract"}}


def _rows_source(name: str, rank_const: int) -> str:
    """Python source of a row-iterations kernel over shares ``g_lo .. g_hi - 1`` in turn.
    With ``rank_const``, a row's ``b``, its Phi sum and each nonzero's ``pi`` are that many scalars
    (SLP packs them into vector registers; arrays of run-time length kept the sums in memory, a
    store and a load per term), the model value a balanced sum."""
    RC = rank_const
    L = []
    add = L.append
    add(
        f"def {name}(coords, x, ptr, rows, block, share, F, offs, mode, eps, tol, t_last, t0, t1, pi_buf, before, "
        "positive, worst, g_lo, g_hi):"
    )
    add("    N = coords.shape[1]")
    add("    R = F.shape[1]")
    add("    base = offs[mode]")
    add("    T = before.shape[1]")
    if RC:
        add("    Ff = F.reshape(F.size)")
        add("    pf = pi_buf.reshape(pi_buf.size)")
        add("    bf = before.reshape(before.size)")
        add("    sf = positive.reshape(positive.size)")
    add("    for g in range(g_lo, g_hi):")
    add("        pi = pi_buf[g]")
    if RC:
        add(f"        pb = np.uint64(g) * np.uint64(pi_buf.shape[1] * {RC})")
    add("        acc = np.empty(R)")
    add("        for t in range(t0, t1):")
    add("            worst[g, t] = 0.0")
    add("        for b in range(share[g], share[g + 1]):")
    add("            q0, q1 = block[b], block[b + 1]")
    add("            k0 = ptr[q0]")
    # the block's Khatri-Rao rows (the other modes in order)
    add("            for k in range(k0, ptr[q1]):")
    if RC:
        # the product in RC scalars, stored once; unsigned flat offsets (as below)
        U = "np.uint64"
        for r in range(RC):
            add(f"                p{r} = 1.0")
        add("                for j in range(N):")
        add("                    if j != mode:")
        add(f"                        fr = {U}(offs[j] + coords[k, j]) * {U}({RC})")
        for r in range(RC):
            add(f"                        p{r} *= Ff[fr + {U}({r})]")
        add(f"                kq = pb + {U}(k - k0) * {U}({RC})")
        for r in range(RC):
            add(f"                pf[kq + {U}({r})] = p{r}")
    else:
        add("                first = True")
        add("                for j in range(N):")
        add("                    if j == mode:")
        add("                        continue")
        add("                    row = offs[j] + coords[k, j]")
        add("                    if first:")
        add("                        for r in range(R):")
        add("                            pi[k - k0, r] = F[row, r]")
        add("                        first = False")
        add("                    else:")
        add("                        for r in range(R):")
        add("                            pi[k - k0, r] *= F[row, r]")
        add("                if first:")
        add("                    for r in range(R):")
        add("                        pi[k - k0, r] = 1.0")
    # iterations outside, the block's rows inside: the rows are independent, so the processor
    # overlaps one row's divisions and sums with the next's (a row's iterations form one chain)
    add("            for t in range(t0, t1):")
    add("                w = worst[g, t]")
    add("                for q in range(q0, q1):")
    add("                    i = rows[q]")
    add("                    fi = base + i")
    if RC:
        # 1-D views and unsigned offsets: row i of a 2-D array at i * RC (a constant multiply),
        # no negative-index fix-up (as the MTTKRP kernels)
        rr = range(RC)
        U = "np.uint64"
        add(f"                    fq = {U}(fi) * {U}({RC})")
        add(f"                    hq = ({U}(i) * {U}(T) + {U}(t)) * {U}({RC})")
        for r in rr:
            add(f"                    b{r} = Ff[fq + {U}({r})]")
            add(f"                    a{r} = 0.0")
        add(f"                    for k in range({U}(ptr[q] - k0), {U}(ptr[q + 1] - k0)):")
        add(f"                        kq = pb + k * {U}({RC})")
        for r in rr:
            add(f"                        p{r} = pf[kq + {U}({r})]")
        add("                        m = " + _tree_sum([f"b{r} * p{r}" for r in rr]))
        add(f"                        v = x[{U}(k0) + k] / max(m, eps)")
        for r in rr:
            add(f"                        a{r} += v * p{r}")
        # the row's violation as a balanced tree of maxima (a chain of R maxima per row was the
        # longest dependency between rows)
        add("                    wr = " + _tree_max([f"abs(min(b{r}, 1.0 - a{r}))" for r in rr]))
        # the mode can stop at t only where every row's violation is below tol: only there (and
        # at the last iteration, whose Phi's sign the mode keeps) are the row and the sign kept
        add("                    if wr < tol or t == t_last:")
        for r in rr:
            add(f"                        bf[hq + {U}({r})] = b{r}")
            add(f"                        sf[hq + {U}({r})] = a{r} > 0")
        add("                    w = max(w, wr)")
        for r in rr:
            add(f"                    Ff[fq + {U}({r})] = b{r} * a{r}")
    else:
        add("                    for r in range(R):")
        add("                        acc[r] = 0.0")
        add("                    for k in range(ptr[q] - k0, ptr[q + 1] - k0):")
        add("                        m = 0.0")
        add("                        for r in range(R):")
        add("                            m += F[fi, r] * pi[k, r]")
        add("                        v = x[k + k0] / max(m, eps)")
        add("                        for r in range(R):")
        add("                            acc[r] += v * pi[k, r]")
        add("                    wr = 0.0")
        add("                    for r in range(R):")
        add("                        wr = max(wr, abs(min(F[fi, r], 1.0 - acc[r])))")
        add("                    if wr < tol or t == t_last:")
        add("                        for r in range(R):")
        add("                            before[i, t, r] = F[fi, r]")
        add("                            positive[i, t, r] = acc[r] > 0")
        add("                    w = max(w, wr)")
        add("                    for r in range(R):")
        add("                        F[fi, r] = F[fi, r] * acc[r]")
    add("                worst[g, t] = w")
    return "\n".join(L) + "\n"


def _tree_max(terms: list[str]) -> str:
    """The largest of ``terms`` as a balanced tree of ``max`` (as ``_tree_sum``)."""
    while len(terms) > 1:
        h = len(terms) // 2
        terms = [f"max({terms[r]}, {terms[r + h]})" for r in range(h)] + terms[2 * h :]
    return terms[0]


_ROW_KERNELS: dict[tuple, object] = {}


def row_iterations_kernel(rank: int):
    """The row-iterations kernel for ``rank`` (a fixed rank of :data:`FIXED_RANKS` unrolled, others
    at run time), over shares ``g_lo .. g_hi - 1`` in turn on the calling thread (it releases the
    GIL: threads run a share each, see :func:`mu_mode`; numba's parallel loop compiled the same
    body 1.5-2x slower).

    The kernel runs inner iterations ``t0 .. t1 - 1`` of every row with nonzeros, row after row:
    ``Phi`` of the row, then ``b <- b * Phi``. Per iteration ``t`` it records the row before the
    update into ``before[t]``, where Phi is positive into ``positive[t]`` and the largest KKT
    violation ``|min(b, 1 - Phi)|`` of share ``g``'s rows into ``worst[g, t]``. Arguments:
    ``coords, x, ptr, rows, block, share``, a
    :class:`ModeRuns`'; ``F`` float (sum I, R), the stacked factors, mode ``mode``'s rows being
    ``B`` (written); ``offs`` int64 (N,); ``eps``; ``tol``, ``t_last``: a row's ``before[t]`` and
    ``positive[t]`` are written only where its violation is below ``tol`` or ``t == t_last`` (the
    only iterations the mode can end at); ``t0, t1``; ``pi_buf`` float (S, block_nnz, R),
    scratch; ``before`` float (I, T, R); ``positive`` bool (I, T, R); ``worst`` float (S, T);
    ``g_lo, g_hi``."""
    fixed = rank if rank in FIXED_RANKS else 0
    if fixed not in _ROW_KERNELS:
        name = f"row_iterations_r{fixed}"
        scope = globals()
        exec(compile(_rows_source(name, fixed), __file__, "exec"), scope)
        _ROW_KERNELS[fixed] = SLPKernel(nb.njit(**FLAGS)(scope[name]))
    return _ROW_KERNELS[fixed]


def _flushed(kernel, *args) -> None:
    with subnormals_flushed():
        kernel(*args)


def _run_shares(kernel, args: tuple, shares: int, pool, tail: tuple = (), flush: bool = False) -> None:
    # share 0 on this thread, the others on the pool's threads (the kernel releases the GIL);
    # a kernel's arguments are ``args``, its share range, then ``tail``; ``flush``: subnormals
    # flushed to zero on each thread while it runs its share
    if flush:
        kernel = functools.partial(_flushed, kernel)
    if pool is None or shares <= 1:
        kernel(*args, 0, shares, *tail)
        return
    futures = [pool.submit(kernel, *args, g, g + 1, *tail) for g in range(1, shares)]
    kernel(*args, 0, 1, *tail)
    for f in futures:
        f.result()


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
                B[i, r] = before[i, updates, r]
    for i in rows:
        for r in range(R):
            out_positive[i, r] = positive[i, t_stop, r]
    for i in empty:
        for r in range(R):
            out_positive[i, r] = False
            if updates > 0:
                B[i, r] = B[i, r] * 0.0


def mu_mode(
    runs: ModeRuns,
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
    pool: Any = None,
) -> tuple[float, int, int]:
    """Up to ``max_inner`` inner iterations of the multiplicative update on mode ``mode``'s rows of
    ``F`` (the factor times the weights), as pyttb's: Phi, then stop when ``max |min(B, 1 - Phi)| <
    tol``, else ``B <- B * Phi``. Returns ``(kkt, inner iterations, updates taken)``; ``out_positive``
    (bool (I, R)) holds where the last Phi is positive.

    Scratch: ``pi_buf`` float (S, runs.block_nnz, R); ``before`` float (I', T, R) and ``positive``
    bool (I', T, R) with ``T >= max_inner`` and ``I' >= I``; ``worst`` float (S', T), S' >= S.
    ``pool``: a thread pool (``concurrent.futures``) whose threads run the shares beyond the first,
    else all run in turn on this thread."""
    B = F[offs[mode] : offs[mode] + out_positive.shape[0]]
    worst = worst[: runs.share.shape[0] - 1]
    args = (runs.coords, runs.values, runs.ptr, runs.rows, runs.block, runs.share, F, offs, mode, float(eps))
    args += (float(tol), int(max_inner) - 1)
    scratch = (pi_buf, before, positive, worst)
    kernel = row_iterations_kernel(F.shape[1])
    S = runs.share.shape[0] - 1
    # the first inner iteration alone: a converged mode stops there
    _run_shares(kernel, args + (0, 1) + scratch, S, pool, flush=True)
    kkt = max(float(worst[:, 0].max(initial=0.0)), _empty_kkt(runs.empty, B))
    t_stop, updates = 0, 0 if kkt < tol else 1
    if updates and max_inner > 1:
        _run_shares(kernel, args + (1, int(max_inner)) + scratch, S, pool, flush=True)
        # rows without nonzeros are 0 after the first update: no violation
        for t_stop in range(1, int(max_inner)):
            kkt = float(worst[:, t_stop].max(initial=0.0))
            if kkt < tol:
                break
        updates = t_stop if kkt < tol else t_stop + 1
    _settle(runs.rows, runs.empty, B, before, positive, t_stop, updates, out_positive)
    return kkt, t_stop + 1, updates


@nb.njit(inline="always", fastmath={"reassoc", "contract"})
def _share_sums(g, shares, coords, x, F, offs, lam, ll, xm):
    nnz, N = coords.shape
    R = F.shape[1]
    s1 = 0.0
    s2 = 0.0
    for k in range(nnz * g // shares, nnz * (g + 1) // shares):
        m = 0.0
        for r in range(R):
            v = lam[r]
            for j in range(N):
                v *= F[offs[j] + coords[k, j], r]
            m += v
        s1 += x[k] * np.log(m)
        s2 += x[k] * m
    ll[g] = s1
    xm[g] = s2


@nb.njit(**FLAGS)
def _model_sums_shares(coords, x, F, offs, lam, shares, g_lo, g_hi, ll, xm):
    for g in range(g_lo, g_hi):
        _share_sums(g, shares, coords, x, F, offs, lam, ll, xm)


def model_sums(
    coords: np.ndarray,
    x: np.ndarray,
    F: np.ndarray,
    offs: np.ndarray,
    lam: np.ndarray,
    shares: int,
    pool: Any = None,
) -> tuple[float, float]:
    """``(sum x log m, sum x m)`` over the nonzeros (``coords`` int (nnz, N), ``x`` their values),
    ``m = sum_r lam_r prod_j F[offs[j] + coords[k, j], r]``: the log-likelihood's data term and
    <X, M>, summed per share then over shares in order (the shares beyond the first on ``pool``'s
    threads, as :func:`mu_mode`)."""
    shares = max(1, int(shares))
    ll, xm = np.zeros(shares), np.zeros(shares)
    args = (coords, x, F, offs, np.ascontiguousarray(lam, dtype=np.float64), shares)
    _run_shares(_model_sums_shares, args, shares, pool, (ll, xm))
    return float(ll.sum()), float(xm.sum())
