"""CP-APR's multiplicative updates of one mode, all its inner iterations in one or two kernel calls,
on nonzeros held in memory as coordinates sorted by the mode's index.

While mode ``n`` is updated the other factors are fixed, and each row of ``B = A_n diag(lambda)``
is its own problem: ``Phi[i] = sum_k x_k / max(b_i . pi_k, eps) pi_k`` over the row's nonzeros,
``pi_k`` their Khatri-Rao rows. Only the stopping test couples the rows (inner iteration ``t``
stops the mode when ``max |min(B, 1 - Phi)| < tol`` over all rows). So the rows are taken one at a
time, a block of rows' ``pi`` formed once into a buffer that stays in the cache, and each row runs
its inner iterations back to back, recording per iteration its row of ``B`` before the update, where
its ``Phi`` is positive, and its KKT violation (:func:`row_iterations_kernel`). A first call runs
as many inner iterations as the mode took last time (a converged mode stops at the first); the rest
follow in a second call where the mode has not stopped by then, and the mode's rows are then set to
those of the first iteration whose violation over all rows is below ``tol``. The result is the
per-iteration passes' (pyttb's order of operations), with the Khatri-Rao rows formed once or twice
per mode instead of once per inner iteration and read from the cache.

Threads take contiguous shares of whole rows (equal in nonzeros as far as rows allow).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from ..mttkrp.cpu import SLPKernel, _tree_sum, run_sum
from ..subnormals import subnormals_flushed
from .cpu import FIXED_RANKS

__all__ = ["BLOCK_NNZ", "ModeRuns", "mode_runs", "row_iterations_kernel", "mu_mode", "model_sums"]

# nonzeros per block of rows whose Khatri-Rao rows are formed together (R16: 256 KiB, within L2)
BLOCK_NNZ = 2048


@dataclass
class ModeRuns:
    """The nonzeros of one mode sorted by its index, in blocks of whole rows and thread shares.

    coords : int32 or int64 (nnz, N): the coordinates in sorted order (each mode's nonzeros are
        read in order, their factor rows gathered without an indirection), 32-bit where they fit
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


@nb.njit(cache=True)
def _block_cuts(ptr, block_nnz):
    # cut before the first run that would take a block past block_nnz (a longer run is a block
    # of its own)
    runs = ptr.shape[0] - 1
    cuts = np.empty(runs + 2, dtype=np.int64)
    cuts[0] = 0
    c = 1
    for q in range(runs):
        if ptr[q + 1] - ptr[cuts[c - 1]] > block_nnz and q > cuts[c - 1]:
            cuts[c] = q
            c += 1
    if runs:
        cuts[c] = runs
        c += 1
    return cuts[:c].copy()


def narrow_coords(coords: np.ndarray) -> np.ndarray:
    """``coords`` as int32 where every index fits (the Khatri-Rao pass then reads half the bytes),
    else int64."""
    if coords.size == 0 or int(coords.max()) <= np.iinfo(np.int32).max:
        return np.ascontiguousarray(coords, dtype=np.int32)
    return np.ascontiguousarray(coords, dtype=np.int64)


def mode_runs(
    coords: np.ndarray, mode: int, values: np.ndarray, rows: int, shares: int, block_nnz: int = BLOCK_NNZ
) -> ModeRuns:
    """The nonzeros (``coords`` int (nnz, N)) sorted by mode ``mode``'s index (stable), in blocks of
    whole rows of about ``block_nnz`` nonzeros (a longer row is a block of its own) and ``shares``
    contiguous shares of blocks of about equal nonzeros."""
    index = coords[:, mode]
    nnz = int(index.shape[0])
    # a stable radix sort where the rows fit 8 or 16 bits (numpy's stable integer sort)
    key = index
    for small in (np.uint8, np.uint16):
        if rows <= np.iinfo(small).max + 1:
            key = index.astype(small)
            break
    perm = np.argsort(key, kind="stable")
    ordered = index[perm]
    if nnz:
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    else:
        starts = np.zeros(0, dtype=np.int64)
    ptr = np.concatenate([starts, [nnz]]).astype(np.int64)
    run_rows = ordered[starts].astype(np.int64)
    seen = np.zeros(rows, dtype=bool)
    seen[run_rows] = True
    block = _block_cuts(ptr, int(block_nnz))
    # shares: the block boundary nearest to each equal split of the nonzeros
    shares = max(1, min(int(shares), len(block) - 1)) if len(block) > 1 else 1
    at = ptr[block]
    share = np.searchsorted(at, np.linspace(0, nnz, shares + 1)[1:-1])
    share = np.unique(np.concatenate([[0], share, [len(block) - 1]])).astype(np.int64)
    return ModeRuns(
        np.take(coords, perm, axis=0),
        np.ascontiguousarray(values[perm], dtype=np.float64),
        ptr,
        run_rows,
        np.flatnonzero(~seen).astype(np.int64),
        block,
        share,
    )


FLAGS = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract"}}


def _rows_source(name: str, rank_const: int, nmodes: int) -> str:
    """Python source of a row-iterations kernel over shares ``g_lo .. g_hi - 1`` in turn.
    With ``rank_const``, a row's ``b``, its Phi sum and each nonzero's ``pi`` are that many scalars
    (SLP packs them into vector registers; arrays of run-time length kept the sums in memory, a
    store and a load per term), the model value a balanced sum, and the Khatri-Rao rows' pass is
    written out for order ``nmodes``: each other mode's factor offset and column stay in registers
    (``others`` lists the other modes)."""
    RC = rank_const
    L = []
    add = L.append
    add(
        f"def {name}(coords, x, ptr, rows, block, share, F, offs, others, mode, eps, tol, t_last, t0, t1, pi_buf, "
        "before, positive, worst, g_lo, g_hi):"
    )
    if RC:
        for j in range(nmodes - 1):
            add(f"    c{j} = others[{j}]")
            add(f"    o{j} = offs[c{j}]")
    add("    N = coords.shape[1]")
    add("    R = F.shape[1]")
    add("    base = offs[mode]")
    add("    T = before.shape[1]")
    if RC:
        add("    zero = 0.0")
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
        # the product in RC scalars (1 with no other mode), stored once; unsigned flat offsets (as below)
        U = "np.uint64"
        for j in range(nmodes - 1):
            add(f"                f{j} = {U}(o{j} + coords[k, c{j}]) * {U}({RC})")
        for r in range(RC):
            add(f"                p{r} = " + (" * ".join(f"Ff[f{j} + {U}({r})]" for j in range(nmodes - 1)) or "1.0"))
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

        def body(pad: str, k: str, acc: str) -> None:
            add(f"{pad}kq = pb + ({k}) * {U}({RC})")
            for r in rr:
                add(f"{pad}p{r} = pf[kq + {U}({r})]")
            add(f"{pad}m = " + _tree_sum([f"b{r} * p{r}" for r in rr]))
            add(f"{pad}v = x[{U}(k0) + {k}] / max(m, eps)")
            for r in rr:
                add(f"{pad}{acc}{r} += v * p{r}")

        # the row's sum: two chains at ranks up to RUN_SPLIT_RANK (see run_sum)
        run_sum(add, "                    ", RC, "ptr[q] - k0", "ptr[q + 1] - k0", body)
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


def row_iterations_kernel(rank: int, nmodes: int):
    """The row-iterations kernel for ``rank`` (a fixed rank of :data:`FIXED_RANKS` unrolled, its
    Khatri-Rao pass written out for order ``nmodes``; other ranks at run time, any order), over
    shares ``g_lo .. g_hi - 1`` in turn on the calling thread (it releases the GIL: threads run a
    share each, see :func:`mu_mode`; numba's parallel loop compiled the same body 1.5-2x slower).
    At ranks up to :data:`~tensorflow_ooc.kernels.mttkrp.cpu.RUN_SPLIT_RANK` a row's Phi sums even
    and odd nonzeros apart (two add chains, as the MTTKRP's runs).

    The kernel runs inner iterations ``t0 .. t1 - 1`` of every row with nonzeros, row after row:
    ``Phi`` of the row, then ``b <- b * Phi``. Per iteration ``t`` it records the row before the
    update into ``before[t]``, where Phi is positive into ``positive[t]`` and the largest KKT
    violation ``|min(b, 1 - Phi)|`` of share ``g``'s rows into ``worst[g, t]``. Arguments:
    ``coords, x, ptr, rows, block, share``, a
    :class:`ModeRuns`'; ``F`` float (sum I, R), the stacked factors, mode ``mode``'s rows being
    ``B`` (written); ``offs`` int64 (N,); ``others`` int64 (N - 1,): the modes but ``mode``, in
    order; ``eps``; ``tol``, ``t_last``: a row's ``before[t]`` and
    ``positive[t]`` are written only where its violation is below ``tol`` or ``t == t_last`` (the
    only iterations the mode can end at); ``t0, t1``; ``pi_buf`` float (S, block_nnz, R),
    scratch; ``before`` float (I, T, R); ``positive`` bool (I, T, R); ``worst`` float (S, T);
    ``g_lo, g_hi``."""
    fixed = rank if rank in FIXED_RANKS else 0
    order = int(nmodes) if fixed else 0
    key = (fixed, order)
    if key not in _ROW_KERNELS:
        name = f"row_iterations_r{fixed}" + (f"_n{order}" if order else "")
        scope = globals()
        exec(compile(_rows_source(name, fixed, order), __file__, "exec"), scope)
        _ROW_KERNELS[key] = SLPKernel(nb.njit(**FLAGS)(scope[name]))
    return _ROW_KERNELS[key]


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
    first: int = 1,
) -> tuple[float, int, int]:
    """Up to ``max_inner`` inner iterations of the multiplicative update on mode ``mode``'s rows of
    ``F`` (the factor times the weights), as pyttb's: Phi, then stop when ``max |min(B, 1 - Phi)| <
    tol``, else ``B <- B * Phi``. Returns ``(kkt, inner iterations, updates taken)``; ``out_positive``
    (bool (I, R)) holds where the last Phi is positive.

    ``first``: inner iterations of the first kernel call (the rest follow in a second where the
    mode has not stopped by then). One forms the Khatri-Rao rows once; more than the mode takes are
    undone from ``before`` (every row's values are kept at an iteration where the mode stops), so
    the result is the same for any ``first`` and the caller passes what the mode took last time.

    Scratch: ``pi_buf`` float (S, runs.block_nnz, R); ``before`` float (I', T, R) and ``positive``
    bool (I', T, R) with ``T >= max_inner`` and ``I' >= I``; ``worst`` float (S', T), S' >= S.
    ``pool``: a thread pool (``concurrent.futures``) whose threads run the shares beyond the first,
    else all run in turn on this thread."""
    B = F[offs[mode] : offs[mode] + out_positive.shape[0]]
    worst = worst[: runs.share.shape[0] - 1]
    N = runs.coords.shape[1]
    others = np.array([j for j in range(N) if j != mode], dtype=np.int64)
    args = (runs.coords, runs.values, runs.ptr, runs.rows, runs.block, runs.share, F, offs, others, mode)
    args += (float(eps), float(tol), int(max_inner) - 1)
    scratch = (pi_buf, before, positive, worst)
    kernel = row_iterations_kernel(F.shape[1], N)
    S = runs.share.shape[0] - 1
    T = int(max_inner)
    first = min(T, max(1, int(first)))
    _run_shares(kernel, args + (0, first) + scratch, S, pool, flush=True)
    # rows without nonzeros count at the first iteration only (the first update sets them to 0)
    kkt = max(float(worst[:, 0].max(initial=0.0)), _empty_kkt(runs.empty, B))
    t_stop, updates = 0, 0 if kkt < tol else 1
    if updates and T > 1:
        for t_stop in range(1, T):
            if t_stop == first:
                # the mode goes on past the first call: the rest in a second
                _run_shares(kernel, args + (first, T) + scratch, S, pool, flush=True)
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


_SUMS_KERNELS: dict[tuple, object] = {}


def _sums_source(name: str, nmodes: int, RC: int) -> str:
    """Python source of :func:`_model_sums_shares` written out for an order and a fixed rank: each
    mode's factor offset and the weights in registers, a nonzero's factor rows multiplied as
    vectors and the model value a balanced sum."""
    U = "np.uint64"
    L = [f"def {name}(coords, x, F, offs, lam, shares, g_lo, g_hi, ll, xm):"]
    add = L.append
    add("    nnz = coords.shape[0]")
    add("    Ff = F.reshape(F.size)")
    for j in range(nmodes):
        add(f"    o{j} = offs[{j}]")
    for r in range(RC):
        add(f"    l{r} = lam[{r}]")
    add("    for g in range(g_lo, g_hi):")
    add("        s1 = 0.0")
    add("        s2 = 0.0")
    add("        for k in range(nnz * g // shares, nnz * (g + 1) // shares):")
    for j in range(nmodes):
        add(f"            f{j} = {U}(o{j} + coords[k, {j}]) * {U}({RC})")
    for r in range(RC):
        add(f"            v{r} = l{r} * " + " * ".join(f"Ff[f{j} + {U}({r})]" for j in range(nmodes)))
    add("            m = " + _tree_sum([f"v{r}" for r in range(RC)]))
    add("            s1 += x[k] * np.log(m)")
    add("            s2 += x[k] * m")
    add("        ll[g] = s1")
    add("        xm[g] = s2")
    return "\n".join(L) + "\n"


def _sums_kernel(nmodes: int, rank: int):
    # fixed ranks written out (SLP), others the generic loop
    if rank not in FIXED_RANKS:
        return _model_sums_shares
    key = (nmodes, rank)
    if key not in _SUMS_KERNELS:
        name = f"model_sums_n{nmodes}_r{rank}"
        scope = globals()
        exec(compile(_sums_source(name, nmodes, rank), __file__, "exec"), scope)
        _SUMS_KERNELS[key] = SLPKernel(nb.njit(**FLAGS)(scope[name]))
    return _SUMS_KERNELS[key]


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
    _run_shares(_sums_kernel(coords.shape[1], F.shape[1]), args, shares, pool, (ll, xm))
    return float(ll.sum()), float(xm.sum())
