"""CP-APR across several workers, owner-computes (as CP-ALS in :mod:`.cp_owner`).

Each worker keeps its partitions and the factor rows its nonzeros touch; every touched row is
owned by one worker (:mod:`~tensorflow_ooc.execution.owner_computes`), and the rows no nonzero
touches by rank 0 (they still count in the columns' 1-norms). One task per worker and outer
iteration (:func:`apr_owner_iteration`) runs every mode, exchanging rows worker to worker. Mode
``n``, as pyttb's ``cp_apr`` and one process's :mod:`.apr_steps`:

- **MU.** Owners move the entries that violate complementary slackness off zero by ``kappa`` and
  send the rows that changed to the workers touching them; every worker scales its rows by the
  weights (``B = A_n diag(lambda)``). Per inner iteration each worker computes Phi's rows over its
  own nonzeros (the MTTKRP kernels' Poisson form, :meth:`WorkerState.local_mttkrp`), which are
  reduce-scattered to their owners; owners take the KKT violation of their rows (its maximum and
  the column sums all-reduced) and, unless it is below ``tol``, update ``B <- B * Phi`` and
  all-gather the rows to the workers that touch them (the next Phi's model values need them).
- **PDN-R.** The rows of a block advance together (as :mod:`.apr_steps`), each owner solving its
  own rows: the Newton row terms are reduce-scattered, the owners' line-search candidates of their
  active rows all-gathered (with which rows are still active), the candidates' log-likelihood
  terms reduce-scattered, and the rows that moved all-gathered. The same functions
  (:func:`~.apr_steps.pdnr_direction`, :func:`~.apr_steps.pdnr_step`) solve the owner's rows.

The columns are normalized by their all-reduced 1-norms at the end of each mode; the log-likelihood
adds each worker's ``sum x log m`` and the model's sum over all cells from the owners' column
sums, all-reduced. Every worker sums the all-reduced terms in rank order, so the rows a worker
holds equal their owner's to the bit, and the run equals one process's up to the order of sums
(1e-16 relative per step).

Bytes: each exchange of rows sends only the rows shared with the receiver (PDN-R: only active
ones); the history reports the bytes sent beside this lower bound (the shared rows' payload,
without the all-reduced terms and positions).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ...execution.apr_tasks import candidate_rows, loglik_partition, newton_rows
from ...execution.inline import is_inline
from ...execution.owner_computes import OwnerComputes, WorkerState, exchange_record
from ...execution.partials import Partial
from ...kernels import StackedFactors
from ...kernels.apr.cpu import hessian_width, mu_kkt
from . import apr_steps as S

DISTRIBUTIONS = ("auto", "owner", "graph")


@dataclass
class AprConfig:
    """The iteration's settings (the same on every worker)."""

    algorithm: str
    max_inner_iters: int
    tol: float
    kappa: float
    kappa_tol: float
    eps: float
    eps_active: float
    mu0: float
    inexact: bool
    blocks: list  # PDN-R: per mode, the row blocks (lo, hi) that advance together


@dataclass
class AprRows:
    """A worker's CP-APR state beside its factor rows (``WorkerState.model``)."""

    weights: np.ndarray
    mine: list  # per mode: the rows owned (sorted), then (rank 0) the rows no nonzero touches
    orphans: list  # per mode: rank 0's rows no nonzero touches (sorted; empty elsewhere)
    held: list  # per mode: every row held (a slice when contiguous, else sorted ids)
    phi_positive: list  # per mode: where the last Phi was positive, over ``mine`` (or None)
    row_tol: float  # PDN-R: the rows' KKT tolerance of the next outer iteration
    zero_floor: float = 0.0  # PDN-R: the current mode's :func:`~.apr_steps.zero_row_floor`


def _as_slice(rows: np.ndarray):
    if rows.shape[0] and int(rows[-1]) - int(rows[0]) + 1 == rows.shape[0]:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def apr_setup(ws: WorkerState, state: S.APRState, orphans: list, row_tol: float) -> None:
    """Run on each worker once (``OwnerComputes.each``): the weights, Phi masks and (rank 0) the
    rows no nonzero touches, from the initial (or resumed) model ``state``."""
    rank0 = ws.team.rank == 0
    mine, orph, held, phi = [], [], [], []
    for n, plan in enumerate(ws.plans):
        o = np.asarray(orphans[n], dtype=np.int64) if rank0 else np.zeros(0, dtype=np.int64)
        if o.shape[0]:
            ws.factors.views[n][o] = state.views[n][o]
        m = np.concatenate([plan.owned, o]).astype(np.int64)
        held.append(_as_slice(np.unique(np.concatenate([m] + [np.asarray(v) for v in plan.send.values()]))))
        mine.append(m)
        orph.append(o)
        p = state.phi_positive[n]
        phi.append(None if p is None else np.asarray(p)[m])
    ws.model = AprRows(np.array(state.weights, dtype=np.float64), mine, orph, held, phi, float(row_tol))


def apr_rows(ws: WorkerState) -> tuple:
    """Run on each worker: its rows per mode (ids, values, Phi mask) and the weights."""
    md: AprRows = ws.model
    return [(m, ws.factors.views[n][m], md.phi_positive[n]) for n, m in enumerate(md.mine)], md.weights


@dataclass
class _Tally:
    """One outer iteration's counters on a worker."""

    nmodes: int

    def __post_init__(self) -> None:
        self.kkt_mode = np.zeros(self.nmodes)
        self.inner_iters = 0
        self.violations = 0
        self.converged = True
        self.seconds: dict[str, float] = {}
        self.lower = [0] * self.nmodes  # the shared rows' payload bytes this worker sent
        self.safeguards = np.zeros((len(S.SAFEGUARDS), self.nmodes))  # PDN-R beyond pyttb, its owned rows

    def add_seconds(self, key: str, t0: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0


def apr_owner_iteration(ws: WorkerState, previous: dict | None, iteration: int, cfg: AprConfig) -> dict:
    """One outer iteration of CP-APR on one worker of an owner-computes run (see the module
    docstring); returns its summary: the model's figures (the same on every worker), its bytes
    sent per mode against their lower bound, and whether the run stops after it (the driver
    submits the next iteration before reading this one: ``previous`` says whether to run)."""
    if previous is not None and previous.get("stop"):
        return {"skipped": True, "stop": True}
    md: AprRows = ws.model
    started = time.time()
    N, R = ws.nmodes, ws.factors.rank
    tally = _Tally(N)
    sent, waits, finished = [], [], []
    pdnr_inner = pdnr_moved = 0
    for n in range(N):
        sent0, wait0 = ws.team.bytes_sent, ws.team.wait_seconds + ws.team.send_seconds
        if cfg.algorithm == "mu":
            norms = _mu_mode(ws, md, n, iteration, cfg, tally)
        else:
            inner, moved = _pdnr_mode(ws, md, n, iteration, cfg, tally)
            pdnr_inner += inner
            pdnr_moved += moved
            mine = ws.factors.views[n][md.mine[n]]
            norms = ws.all_reduce(np.abs(mine).sum(axis=0), (iteration, n, "norms")).sum(axis=0)
        _normalize(ws, md, n, norms)
        sent.append(ws.team.bytes_sent - sent0)
        waits.append(ws.team.wait_seconds + ws.team.send_seconds - wait0)
        finished.append(time.time())
    # the log-likelihood: sum x log m over this worker's nonzeros; the model's sum over all cells
    # and ||M||^2 from the owners' column sums and Grams (all-reduced)
    t0 = time.perf_counter()
    sums = np.zeros(2)
    for src in ws.sources:
        sums += loglik_partition(src, ws.factors, ws.threads, ws.batch_nnz, weights=md.weights)[:2]
    tally.add_seconds("loglik", t0)
    mine = [ws.factors.views[n][md.mine[n]] for n in range(N)]
    small = np.concatenate(
        [
            sums,
            [sum(int(np.count_nonzero(a == 0)) for a in mine), pdnr_inner, pdnr_moved],
            tally.kkt_mode,
            tally.safeguards.ravel(),
            np.concatenate([a.sum(axis=0) for a in mine]),
            np.concatenate([(a.T @ a).ravel() for a in mine]),
        ]
    )
    sent0 = ws.team.bytes_sent
    smalls = ws.all_reduce(small, (iteration, "loglik"))
    sent[-1] += ws.team.bytes_sent - sent0
    total = smalls.sum(axis=0)
    kkt_mode = smalls[:, 5 : 5 + N].max(axis=0)
    G0 = 5 + N + len(S.SAFEGUARDS) * N
    safeguards = total[5 + N : G0].reshape(len(S.SAFEGUARDS), N).astype(np.int64)
    col = total[G0 : G0 + N * R].reshape(N, R)
    grams = total[G0 + N * R :].reshape(N, R, R)
    w = md.weights
    model_sum = float(np.sum(w * np.prod(col, axis=0)))
    G = np.prod(grams, axis=0)
    loglik = float(total[0]) - model_sum
    if cfg.algorithm == "mu":
        inner_iters, converged = tally.inner_iters, tally.converged
    else:
        inner_iters, converged = int(total[3]), not total[4] > 0
    kkt = float(np.max(kkt_mode))
    if cfg.algorithm == "pdnr" and cfg.inexact:
        md.row_tol = max(cfg.tol, kkt / 100.0)
    done = converged and (cfg.algorithm == "mu" or not cfg.inexact or md.row_tol <= cfg.tol)
    return {
        "stop": bool(done or not math.isfinite(loglik)),
        "started": started,
        "weights": w.copy(),
        "loglik": loglik,
        "inner_product": float(total[1]),
        "norm_model_sq": float(w @ G @ w),
        "kkt": kkt,
        "inner_iters": int(inner_iters),
        "violations": int(tally.violations),
        "converged": bool(converged),
        "zeros": int(total[2]),
        "seconds": tally.seconds,
        "finished": finished,
        "bytes_sent": sent,
        "bytes_lower_bound": tally.lower,
        "exchange_seconds": waits,
        "safeguards": safeguards,
    }


def _redistribute(ws: WorkerState, md: AprRows, n: int) -> None:
    """The weights into mode ``n``'s rows this worker holds (:func:`~.apr_steps.redistribute`)."""
    view, h = ws.factors.views[n], md.held[n]
    view[h] = view[h] * md.weights.astype(ws.factors.dtype)
    md.weights = np.ones(ws.factors.rank)


def _normalize(ws: WorkerState, md: AprRows, n: int, norms: np.ndarray) -> None:
    """Mode ``n``'s columns to unit 1-norm by the all-reduced ``norms``
    (:func:`~.apr_steps.normalize_mode`)."""
    view, h = ws.factors.views[n], md.held[n]
    A = view[h]
    A *= S.inverse_norms(norms)
    if not isinstance(h, slice):
        view[h] = A
    md.weights = md.weights * norms


def _row_bytes(count: int, width: int, itemsize: int = 8) -> int:
    return int(count) * int(width) * itemsize


# --- multiplicative updates -----------------------------------------------------------------------


def _mu_mode(ws: WorkerState, md: AprRows, n: int, iteration: int, cfg: AprConfig, tally: _Tally) -> np.ndarray:
    """Mode ``n``'s inner iterations of MU (:func:`~.apr_steps.mu_begin_mode`,
    :func:`~.apr_steps.mu_inner`); returns the all-reduced column 1-norms of the mode's ``B``."""
    plan, view, mine = ws.plans[n], ws.factors.views[n], md.mine[n]
    R = ws.factors.rank
    if iteration > 0 and md.phi_positive[n] is not None:
        tally.violations += _kappa_fix(ws, md, n, cfg, (iteration, n, "kappa"), tally)
    _redistribute(ws, md, n)
    shared_out = sum(ids.shape[0] for ids in plan.send.values())
    shared_in = sum(pos.shape[0] for pos in plan.recv_pos.values())
    norms = None
    for i in range(cfg.max_inner_iters):
        t0 = time.perf_counter()
        P = ws.local_mttkrp(n, poisson_eps=cfg.eps)
        tally.add_seconds("phi", t0)
        phi = ws.reduce_scatter(n, P, (iteration, n, i, "phi"))  # the owned rows, summed
        tally.lower[n] += _row_bytes(shared_out, R)
        if mine.shape[0] > phi.shape[0]:  # rank 0's rows no nonzero touches: Phi is zero there
            phi = np.concatenate([phi, np.zeros((mine.shape[0] - phi.shape[0], R), dtype=phi.dtype)])
        B = view[mine]
        positive = np.empty(B.shape, dtype=bool)
        kkt = mu_kkt(B, phi, positive) if B.shape[0] else 0.0
        md.phi_positive[n] = positive
        tally.inner_iters += 1
        smalls = ws.all_reduce(np.concatenate([[kkt], np.abs(B).sum(axis=0)]), (iteration, n, i, "kkt"))
        kkt = float(smalls[:, 0].max())
        tally.kkt_mode[n] = kkt
        if kkt < cfg.tol:
            norms = smalls[:, 1:].sum(axis=0)
            break
        tally.converged = False
        B *= phi
        view[mine] = B
        smalls, received, _ = ws.all_gather(n, B, np.abs(B).sum(axis=0), (iteration, n, i, "B"))
        tally.lower[n] += _row_bytes(shared_in, R)
        for k, rows in received.items():
            view[plan.send[k]] = rows
        norms = smalls.sum(axis=0)
    return norms


def _kappa_fix(ws: WorkerState, md: AprRows, n: int, cfg: AprConfig, tag, tally: _Tally) -> int:
    """Owners move the entries of their rows with Phi > 0 and below ``kappa_tol`` off zero by
    ``kappa``, and send each worker the changed rows it touches; 1 where some worker moved one."""
    plan, view, mine = ws.plans[n], ws.factors.views[n], md.mine[n]
    A = view[mine]
    V = md.phi_positive[n] & (A < cfg.kappa_tol)
    hit = V.any(axis=1)
    if hit.any():
        A[V] += cfg.kappa
        view[mine[hit]] = A[hit]
    flag = np.array([float(hit.any())])
    payloads = {}
    for k in range(ws.team.size):
        if k != ws.team.rank:
            pos = plan.recv_pos.get(k, np.zeros(0, dtype=np.int64))
            nz = np.flatnonzero(hit[pos])
            payloads[k] = [flag, nz, A[pos[nz]]]
            tally.lower[n] += _row_bytes(nz.shape[0], A.shape[1])
    ws.team.send_many(tag, payloads)
    moved = bool(flag[0])
    for k in range(ws.team.size):
        if k != ws.team.rank:
            f, nz, rows = ws.team.receive(tag, k)
            moved |= bool(np.asarray(f)[0])
            nz = np.asarray(nz)
            if k in plan.send and nz.shape[0]:
                view[plan.send[k][nz]] = np.asarray(rows)
    return int(moved)


# --- PDN-R ---------------------------------------------------------------------------------------------


def _pdnr_mode(ws: WorkerState, md: AprRows, n: int, iteration: int, cfg: AprConfig, tally: _Tally):
    """Mode ``n`` of PDN-R, its row blocks in turn; returns this worker's owned rows' inner
    iterations and whether one of them moved."""
    md.zero_floor = S.zero_row_floor(md.weights, ws.factors.views[n].shape[0])
    _redistribute(ws, md, n)
    inner_max = 2 if (cfg.inexact and iteration == 0) else cfg.max_inner_iters
    inner = moved = 0
    for b, (lo, hi) in enumerate(cfg.blocks[n]):
        i, m = _pdnr_block(ws, md, n, int(lo), int(hi), inner_max, (iteration, n, b), cfg, tally)
        inner += i
        moved |= m
    return inner, moved


def _pdnr_block(ws, md: AprRows, n: int, lo: int, hi: int, inner_max: int, tag, cfg: AprConfig, tally: _Tally):
    """Rows ``lo .. hi - 1`` of mode ``n``: this worker's owned ones solved here (in a compact
    model state of just those rows, by :func:`~.apr_steps.pdnr_direction` and
    :func:`~.apr_steps.pdnr_step`), the terms of the rows it touches computed over its nonzeros."""
    plan, view, team = ws.plans[n], ws.factors.views[n], ws.team
    R, W = ws.factors.rank, team.size
    owned = plan.owned
    a0, a1 = (int(x) for x in np.searchsorted(owned, [lo, hi]))
    orph = md.orphans[n]
    o0, o1 = (int(x) for x in np.searchsorted(orph, [lo, hi]))
    own_b = owned[a0:a1]
    rows_b = np.concatenate([own_b, orph[o0:o1]])
    # per other rank: the rows of the block this worker touches that it owns (global ids), and
    # the positions in ``rows_b`` of the rows it owns that the other touches
    send_b = {}
    for k, ids in plan.send.items():
        s0, s1 = np.searchsorted(ids, [lo, hi])
        send_b[k] = ids[s0:s1]
    recv_b = {}
    for k, pos in plan.recv_pos.items():
        r = owned[pos]
        s0, s1 = np.searchsorted(r, [lo, hi])
        recv_b[k] = pos[s0:s1] - a0
    s = S.APRState([rows_b.shape[0]], R, np.float64)
    s.views[0][...] = view[rows_b]
    s.zero_floor = md.zero_floor
    nb = rows_b.shape[0]
    s.block = S.RowBlock(0, np.ones(nb, dtype=bool), np.full(nb, float(cfg.mu0)), np.zeros(nb, dtype=np.int64))
    s.kkt_mode = np.zeros(1)
    act_send = {k: np.ones(ids.shape[0], dtype=bool) for k, ids in send_b.items()}
    width, K = hessian_width(R), len(S.LINE_STEPS)
    b = s.block

    def local_active(active_b: np.ndarray) -> np.ndarray:
        act = np.zeros(hi - lo, dtype=bool)
        act[own_b - lo] = active_b[: own_b.shape[0]]
        for k, ids in send_b.items():
            act[ids[act_send[k]] - lo] = True
        return act

    def reduce_rows(local: np.ndarray, active_b: np.ndarray, key: str) -> np.ndarray:
        """The active rows' terms summed on their owner (in rank order); compact rows."""
        payloads = {k: local[ids[act_send[k]] - lo] for k, ids in send_b.items()}
        tally.lower[n] += sum(int(p.nbytes) for p in payloads.values())
        team.send_many(tag + (i, key), payloads)
        out = np.zeros((nb,) + local.shape[1:])
        for k in range(W):
            if k == team.rank:
                out[: own_b.shape[0]] += local[own_b - lo]
            elif k in recv_b:
                got = np.asarray(team.receive(tag + (i, key), k))
                at = recv_b[k][active_b[recv_b[k]]]
                out[at] += got
        return out

    for i in range(inner_max):
        # the Newton row terms of the active rows, summed on their owners
        t0 = time.perf_counter()
        act = local_active(b.active)
        terms = np.zeros((hi - lo, width))
        if act.any():
            for src in ws.sources:
                terms += newton_rows(src, ws.factors, n, lo, act, ws.threads, ws.batch_nnz, cfg.eps)
        tally.add_seconds("newton", t0)
        summed = reduce_rows(terms, b.active, "terms")
        del terms
        S.pdnr_direction(s, [Partial(0, summed)], 0, i, inner_max, md.row_tol, cfg.eps_active)
        tally.kkt_mode[n] = max(tally.kkt_mode[n], float(s.kkt_mode[0]))
        view[rows_b] = s.views[0]  # rows without nonzeros were zeroed
        # the owners' candidates of their active rows go to the workers touching them
        stepping = b.active.copy()
        count = np.array([float(stepping.sum())])
        payloads = {}
        for k in range(W):
            if k != team.rank:
                pos = recv_b.get(k, np.zeros(0, dtype=np.int64))
                nz = np.flatnonzero(stepping[pos])
                # with the first candidates, the rows lifted without a step (every nonzero unreachable)
                fz = np.flatnonzero(b.frozen[pos]) if i == 0 else nz[:0]
                payloads[k] = [count, nz, b.candidates[pos[nz]], fz, s.views[0][pos[fz]]]
                tally.lower[n] += _row_bytes(nz.shape[0], K * R) + _row_bytes(fz.shape[0], R)
        team.send_many(tag + (i, "cand"), payloads)
        cand = np.zeros((hi - lo, K, R))
        cand[own_b - lo] = b.candidates[: own_b.shape[0]]
        active_anywhere = count[0]
        for k in range(W):
            if k != team.rank:
                c, nz, got, fz, lifted = team.receive(tag + (i, "cand"), k)
                active_anywhere += float(np.asarray(c)[0])
                if k in send_b:
                    view[send_b[k][np.asarray(fz)]] = np.asarray(lifted)
                    nz = np.asarray(nz)
                    act_send[k] = np.zeros(send_b[k].shape[0], dtype=bool)
                    act_send[k][nz] = True
                    cand[send_b[k][nz] - lo] = np.asarray(got)
        if not active_anywhere:  # every row of the block is done, on every worker
            break
        t0 = time.perf_counter()
        act = local_active(stepping)
        ll = np.zeros((hi - lo, K))
        if act.any():
            for src in ws.sources:
                ll += candidate_rows(src, ws.factors, n, lo, act, cand, ws.threads, ws.batch_nnz)
        del cand
        tally.add_seconds("line_search", t0)
        summed = reduce_rows(ll, stepping, "ll")
        S.pdnr_step(s, [Partial(0, summed)], 0, i, inner_max)
        view[rows_b] = s.views[0]
        # the rows that took a step go to the workers touching them
        payloads = {}
        for k, pos in recv_b.items():
            payloads[k] = s.views[0][pos[stepping[pos]]]
            tally.lower[n] += _row_bytes(payloads[k].shape[0], R)
        team.send_many(tag + (i, "rows"), payloads)
        for k, ids in send_b.items():
            got = np.asarray(team.receive(tag + (i, "rows"), k))
            view[ids[act_send[k]]] = got
    tally.safeguards[:, n] += s.safeguards[:, 0]
    return int(b.inner.sum()), bool(b.notconverged)


# ---------------------------------------------------------------- driver side ---------------------


def use_apr_owner(client, graph, distribution: str, device: str) -> bool:
    """Whether this CP-APR run goes owner-computes: ``distribution="owner"``, or "auto" on a Dask
    cluster of several CPU workers; "graph" keeps the per-mode task graphs (as one worker, the
    inline scheduler and GPU devices always do)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    able = not is_inline(client) and device == "cpu"
    if distribution == "owner" and not able:
        raise ValueError("distribution='owner' runs CP-APR on Dask CPU workers (not the inline scheduler or a GPU)")
    if distribution == "graph" or not able:
        return False
    return distribution == "owner" or len(graph.resources) > 1


def _stacked(state: S.APRState) -> StackedFactors:
    return StackedFactors(state.shape, state.rank, state.dtype, state.data.copy())


def start_apr_owner(client, graph, state, shape, row_tol: float) -> OwnerComputes:
    """The owner-computes run of ``graph``'s store and partitions from the model ``state`` (a
    future of an :class:`~.apr_steps.APRState`)."""
    plan = graph.memory_plan
    engine = OwnerComputes(
        client,
        graph.path,
        graph.parts,
        in_memory=graph.execution == "in-memory",
        init=_stacked,
        init_args=(state,),
        nmodes=len(shape),
        threads={a: r["numba_threads"] * r["dask_threads"] for a, r in graph.resources.items()},
        batch_nnz=graph.batch_nnz,
        max_private_bytes=graph.max_private_bytes,
        mode_copies=bool(plan and plan.mode_copies),
        workers=sorted(graph.resources),
    )
    try:
        orphans = []
        for n, size in enumerate(shape):
            touched = np.zeros(size, dtype=bool)
            for t in engine.plan.touched:
                touched[t[n]] = True
            orphans.append(np.flatnonzero(~touched))
        engine.each(apr_setup, state, orphans, float(row_tol))
    except BaseException:
        engine.release()
        raise
    return engine


def owner_outer(engine: OwnerComputes, iteration: int, cfg: AprConfig, ahead: bool) -> tuple[S.APRSummary, dict]:
    """One outer iteration on the workers (the next submitted ahead with ``ahead``): its summary
    and the exchange's record (bytes sent per mode against their lower bound)."""
    summaries = engine.iterate(apr_owner_iteration, (iteration, cfg), (iteration + 1, cfg) if ahead else None)
    first = summaries[0]
    if first.get("skipped"):  # the workers stopped where the driver goes on: never expected
        raise RuntimeError("owner-computes workers stopped the run where the driver did not")
    seconds = {k: max(s["seconds"].get(k, 0.0) for s in summaries) for k in first["seconds"]}
    sm = S.APRSummary(
        first["weights"],
        first["loglik"],
        first["inner_product"],
        first["norm_model_sq"],
        first["kkt"],
        first["inner_iters"],
        first["violations"],
        first["converged"],
        first["zeros"],
        seconds,
        max(max(s["finished"]) for s in summaries),
        first.get("safeguards"),
    )
    N = len(first["bytes_sent"])
    lower = [int(sum(s["bytes_lower_bound"][n] for s in summaries)) for n in range(N)]
    return sm, exchange_record(summaries, lower)


def owner_state(engine: OwnerComputes, shape, rank: int) -> S.APRState:
    """The model (factors, weights, Phi masks) gathered from the rows' owners."""
    out = S.APRState(shape, rank, np.float64)
    masks: list = [None] * len(shape)
    weights = None
    for rows, w in engine.each(apr_rows):
        weights = w
        for n, (ids, values, mask) in enumerate(rows):
            out.views[n][ids] = values
            if mask is not None:
                if masks[n] is None:
                    masks[n] = np.zeros((shape[n], rank), dtype=bool)
                masks[n][ids] = mask
    out.weights = np.array(weights, dtype=np.float64)
    out.phi_positive = masks
    return out
