"""CP-ALS across several workers, owner-computes (seed 000 chapter 4; SPLATT's MPI CP-ALS).

One iteration runs on every worker at once (:func:`owner_iteration`); for each mode ``n``:

1. ``P = X_w,(n) (odot_{m != n} A_m)``: the MTTKRP of the worker's own nonzeros;
2. ``M = sum_w P_w`` on the rows the worker owns (sparse reduce-scatter);
3. ``A = M V^+`` with ``V = *_{m != n} A_m^T A_m``, the same on every worker;
4. the column statistics, ``A^T A`` and (last mode) ``<A, M>`` all-reduced, with the updated rows
   each other worker touches (sparse all-gather);
5. columns normalized by the global 2-norm (first iteration) or max-norm (at least 1), as
   :func:`~tensorflow_ooc.decompositions.cp.updates.update_mode` does on one worker.

Where no row of a mode has more than two workers (always on two), steps 2-4 are one message
round instead (:mod:`.cp_owner_one_round`): every worker that touches a row gets the others'
partials of it and solves it itself, and the terms of step 4 travel with the next mode's partials,
so step 5 comes one mode late (an iteration of N modes: N + 1 rounds instead of 2N, fewer where
every worker touches a mode whole and takes its terms itself). A row solved
on two workers is the same sum (two partials add alike in either order) times the same ``V^+``,
equal to the owner's up to the rounding of the GEMM it falls in.

STS-CP's sketched updates that hit few rows skip the owners: every worker sums every worker's
rows and solves them all (:meth:`~tensorflow_ooc.execution.owner_computes.WorkerState.sum_everywhere`),
steps 2-4 in one message round, and keeps them for its draws (docs/EXECUTION.md, "Owner-computes").

Every worker gets the same all-reduced terms (summed in rank order), so the normalized rows a
worker receives equal its owner's to the bit. The Gram of the normalized factor is the all-reduced
unnormalized Gram scaled by the weights: equal to one worker's ``A^T A`` up to rounding (1e-16
relative), which keeps results equal to one worker's to 1e-10.
"""

from __future__ import annotations

import time

import numpy as np

from ...blas_threads import one_blas_thread
from ...execution.inline import is_inline
from ...execution.owner_computes import OwnerComputes, SparseRows, WorkerState, exchange_record
from ...execution.partials import merged_reads
from ...kernels import StackedFactors
from ...kernels.update.column_scale import column_max_abs, column_sum_squares
from ...kernels.update.normal_equations import normal_inverse_of
from ...kernels.update.row_split import matmul_rows
from ..common.checkpoint_files import disk_full_returned, raise_returned
from . import updates as U
from .checkpoint import write_checkpoint
from .cp_owner_one_round import SOLVE_BLOCK_ROWS, Deferred, column_weights, one_round_mode, rounds_carry
from .cp_owner_sampling import owner_sts_sample, spread_of, spread_rows, start_sampler
from .cp_steps import model_fit, model_norm_sq


def owner_iteration(
    ws: WorkerState,
    previous: dict | None,
    iteration: int,
    first_iteration: bool,
    normX2: float,
    tol: float,
    sketch: tuple | None = None,
) -> dict:
    """Algorithm 1's iteration on one worker of an owner-computes run; returns its summary: the
    weights, Grams and fit terms (the same on every worker), its own timings and bytes sent, and
    whether the run stops after it (the fit changed by less than ``tol``, or is not finite).

    The driver submits the next iteration before it reads this one's summary (one round trip
    less per iteration); ``previous``, the summary of the iteration before on this worker, says
    whether to run at all: the worker decides as the driver will, from the same numbers.

    Randomized CP-ALS passes ``sketch = (samples, entropy, evaluate)``: each mode solves the
    sketched problem of ``samples`` STS-CP draws made across the workers
    (:func:`~tensorflow_ooc.decompositions.cp.cp_owner_sampling.owner_sts_sample`), from the sampled
    MTTKRP of the drawn fibers' nonzeros; with ``evaluate`` the last mode also runs the exact
    MTTKRP, whose inner products give the fit (else the fit is NaN and not tested here)."""
    if previous is not None and previous["stop"]:
        return {"skipped": True, "stop": True}
    started = time.time()
    N, R = ws.nmodes, ws.factors.rank
    timings, finished, sent, waits, sampling, reads = {}, {}, {}, {}, {}, {}
    fit_seconds = 0.0
    inner = np.zeros(R)
    if sketch is not None and ws.sampler is None:
        ws.sampler = start_sampler(ws, (iteration, "sampler"))
    carry = rounds_carry(ws)
    pending: Deferred | None = None  # a mode solved, its terms to travel with the next partials
    for n in range(N):
        t0 = time.perf_counter()
        sent0, wait0 = ws.team.bytes_sent, ws.team.wait_seconds + ws.team.send_seconds
        last = n == N - 1
        if sketch is None:
            # this worker's nonzeros' rows of X_(n) (odot A_m); the modes run in turn, so a
            # memoized pair's second mode reads the memo its first mode filled
            P = ws.local_mttkrp(n, in_turn=True, memo_scale=carry.memo_scale)
        if sketch is None and ws.plans[n].one_round:
            t_mttkrp = time.perf_counter() - t0
            following = not last and ws.plans[n + 1].one_round
            pending, carry.memo_scale, t_update, mode_inner = one_round_mode(
                ws, n, P, pending, (iteration, n), first_iteration, last, following
            )
            if last:
                inner = mode_inner
            timings[n] = (t_mttkrp, t_update)
            finished[n] = time.time()
            sent[n] = ws.team.bytes_sent - sent0
            waits[n] = ws.team.wait_seconds + ws.team.send_seconds - wait0
            continue
        carry.memo_scale = None  # no mode left unscaled: the memo this mode fills lacks nothing
        if sketch is None:
            V = normal_inverse_of(ws.grams, n)
        else:
            samples, entropy, evaluate = sketch
            S = owner_sts_sample(ws, n, samples, (entropy, iteration, n), (iteration, n, "draw"))
            sampling[n] = S.seconds
            t0 = time.perf_counter()
            V = normal_inverse_of(None, n, S.gram())
            # through the store's fiber index, each worker reads the fibers of its share of the draws
            P = ws.index_sampled_mttkrp(n, S) if n in ws.index_modes else ws.local_sampled_mttkrp(n, S)
            if P.reads:
                reads[n] = P.reads
        t_mttkrp = time.perf_counter() - t0
        # a sketched update hitting few rows: every worker sums every worker's rows and solves
        # them all, the same everywhere (one message round instead of two, and every worker then
        # holds the mode's rows that are not zero for its draws)
        whole = None
        if sketch is not None and ws.sampler.spread_limit > 0:
            whole = ws.sum_everywhere(n, P, (iteration, n, "W"), ws.sampler.spread_limit)
        # else the owned rows, summed over workers (a sampled MTTKRP's rows travel sparse)
        if whole is not None:
            M = whole
        elif sketch is not None and n in ws.index_modes:
            M = ws.scatter_to_owners(n, P, (iteration, n, "M"))
        else:
            M = ws.reduce_scatter(n, P, (iteration, n, "M"), sparse=sketch is not None)
        Mx = M  # the exact MTTKRP's owned rows, for the fit's inner products
        if sketch is not None:
            Mx = None
            if last and evaluate:
                t_fit = time.perf_counter()
                Mx = ws.reduce_scatter(n, ws.local_mttkrp(n), (iteration, n, "X"))
                fit_seconds = time.perf_counter() - t_fit
        t1 = time.perf_counter()
        with one_blas_thread():
            if sketch is None:
                A, inner_M = _solve(ws, n, M, V.astype(M.dtype, copy=False), last)  # A = M V^+
                rows = A
            else:
                # a sampled MTTKRP is zero but in the rows its sampled fibers' nonzeros hit: only
                # those are solved and travel (on 2.4 M owned rows, a dense A cost most of the
                # update of an 86 M STS-CP iteration's longest mode)
                if isinstance(M, SparseRows):  # index reads: the owners' hit rows, summed
                    hit, Mh, nrows = M.hit, M.rows, M.n
                else:
                    hit = np.flatnonzero(M.any(axis=1))
                    Mh, nrows = M[hit], M.shape[0]
                A = Mh @ V.astype(Mh.dtype, copy=False)
                rows = SparseRows(hit, A, nrows)
            if A.shape[0]:
                stat = column_sum_squares(A) if first_iteration else column_max_abs(A)
            else:
                stat = np.zeros(R)
            terms = [stat, (A.T @ A).ravel()]
            if sketch is None:
                terms.append(inner_M if last else 0 * stat)
            else:
                if last and Mx is not None:  # the new factor's terms, and a kept one's
                    terms += _fit_terms(ws, n, hit, A, Mx, whole is not None, (iteration, n, "I"))
                terms.append(np.array([float(hit.shape[0] > 0)]))  # some sampled fiber held a nonzero
            small = np.concatenate(terms)
        t_update = time.perf_counter() - t1
        # a sketched update's rows go to every worker (few: the rows its sampled fibers hit), so
        # the next draws of this mode need no owner (docs/EXECUTION.md, "Owner-computes")
        if whole is not None:  # every worker has every term already
            smalls, received, others = small[None], {}, {}
        else:
            smalls, received, others = ws.all_gather(
                n, rows, small, (iteration, n, "A"), spread=ws.sampler.spread_limit if sketch is not None else 0
            )
        t2 = time.perf_counter()
        total = smalls.sum(axis=0)
        if sketch is not None and not total[-1] > 0:
            # no sampled fiber held a nonzero on any worker: the sketched right-hand side is zero
            # and would zero the factor, so it is kept (as one worker's update_mode does)
            ws.sampler.empty_sketches[n] = ws.sampler.empty_sketches.get(n, 0) + 1
            if last:
                inner = total[R + R * R + R : R + R * R + 2 * R] if Mx is not None else np.full(R, np.nan)
        else:
            weights, scale = column_weights(smalls[:, :R], first_iteration)
            # the owned rows a sketched update changes: those it hits and those the one before hit
            before = ws.live.get((n, -1)) if isinstance(rows, SparseRows) else None
            changed = None if before is None else np.union1d(before, rows.hit)
            spread = None
            if whole is not None:
                ws.set_rows_everywhere(n, rows.hit, rows.rows, scale.astype(A.dtype))
                spread = spread_of(rows.hit, rows.rows * scale.astype(A.dtype))
            else:
                ws.set_rows(n, rows, received, scale.astype(A.dtype))
                if sketch is not None:
                    spread = spread_rows(ws, n, rows, received, others, scale.astype(A.dtype))
            outer = np.outer(scale, scale)
            ws.grams[n] = (total[R : R + R * R].reshape(R, R) * outer).astype(A.dtype)
            ws.weights = weights
            if last:
                inner = total[R + R * R : R + R * R + R] * scale if Mx is not None else np.full(R, np.nan)
            if sketch is not None:
                ws.sampler.refresh(ws, n, smalls[:, R : R + R * R].reshape(-1, R, R) * outer, changed, spread)
        t_update += time.perf_counter() - t2
        timings[n] = (t_mttkrp, t_update)
        finished[n] = time.time()
        sent[n] = ws.team.bytes_sent - sent0
        waits[n] = ws.team.wait_seconds + ws.team.send_seconds - wait0
    grams = [np.asarray(g, dtype=np.float64) for g in ws.grams]
    empty = dict(ws.sampler.empty_sketches) if ws.sampler is not None else {}
    sm = U.Summary(ws.weights, grams, inner, {}, {}, sampling, fit_seconds, empty)
    fit = model_fit(sm, normX2, model_norm_sq(sm))
    fit_old = previous["fit"] if previous is not None else None
    stop = not np.isfinite(fit) or (fit_old is not None and iteration > 0 and abs(fit - fit_old) < tol)
    return {
        "fit": fit,
        "stop": bool(stop) and sketch is None,  # randomized runs stop by the driver's test
        "started": started,
        "weights": ws.weights,
        "grams": grams,
        "inner": inner,
        "finished": finished,
        "timings": timings,
        "bytes_sent": sent,
        "exchange_seconds": waits,
        "sampling": sampling,
        "fit_seconds": fit_seconds,
        "empty_sketches": empty,
        "reads": reads,
        "rounds": ws.team.rounds,
    }


def _fit_terms(
    ws: WorkerState, mode: int, hit: np.ndarray, A: np.ndarray, Mx: np.ndarray, whole: bool, tag
) -> list[np.ndarray]:
    """The last mode's inner products with the exact MTTKRP's owned rows ``Mx``: of the new rows
    ``A`` (at ``hit``: positions among the owned rows, or with ``whole`` row numbers, every
    worker's rows) and of the rows kept, which count only where no sampled fiber held a nonzero
    (with ``whole`` every worker knows that already, and reads them only then: a copy of 2.4 M
    owned rows and its products took 0.1-0.3 s of an evaluated 86 M round). With ``whole`` the
    owned rows' shares are all-reduced here, summed in rank order (every worker holds the other
    terms already)."""
    plan = ws.plans[mode]
    owned, R = plan.owned, A.shape[1]
    kept = np.zeros(R)
    if not whole or A.shape[0] == 0:
        span = plan.span  # the rows before this update, read in place where they are one range
        old = ws.factors.views[mode][span[0] : span[1]] if span is not None else ws.owned_rows(mode)[1]
        kept = np.einsum("ir,ir->r", old, Mx)
    if whole:
        at = np.minimum(np.searchsorted(owned, hit), max(owned.shape[0] - 1, 0))
        mine = np.flatnonzero(owned[at] == hit) if owned.shape[0] else at[:0]
        A, hit = A[mine], at[mine]
    terms = np.concatenate([np.einsum("ir,ir->r", A, Mx[hit]), kept])
    if whole:
        terms = ws.all_reduce(terms, tag).sum(axis=0)
    return np.split(terms, 2)


def _solve(
    ws: WorkerState, mode: int, M: np.ndarray, Vinv: np.ndarray, last: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """``A = M V^+`` for the owned rows ``M``, and for the last mode ``<A, M>`` per column. Owned
    rows in one range are solved straight into the worker's factor rows, which the MTTKRP just
    run did not read and :meth:`~WorkerState.set_rows` scales in place next (one GEMM, no
    temporary and no copy back: 1.5 ms against 2.5-5.9 for 83,507 x 16 vast-shaped rows);
    others over ``M`` a block at a time (:func:`_solve_over`)."""
    span = ws.plans[mode].span
    if span is None:
        return _solve_over(M, Vinv, last)
    A = ws.factors.views[mode][span[0] : span[1]]
    matmul_rows(M, Vinv, A)
    return A, np.einsum("ir,ir->r", A, M) if last else None


def _solve_over(M: np.ndarray, Vinv: np.ndarray, last: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``A = M V^+`` written over ``M`` a block of rows at a time (no second array of the owned
    rows: 2.4 M rows are 300 MB on an Amazon-shaped worker), and for the last mode ``<A, M>``
    per column, taken before each block is overwritten."""
    inner = np.zeros(M.shape[1]) if last else None
    for lo in range(0, M.shape[0], SOLVE_BLOCK_ROWS):
        block = M[lo : lo + SOLVE_BLOCK_ROWS]
        A = block @ Vinv
        if last:
            inner += np.einsum("ir,ir->r", A, block)
        block[...] = A
    return M, inner


# ---------------------------------------------------------------- driver side ---------------------

DISTRIBUTIONS = ("auto", "owner", "graph")
OWNER_METHODS = ("exact", "sts")  # CP-ARLS-LEV keeps the task graphs


def use_owner_computes(client, graph, dense: bool, method: str, distribution: str) -> bool:
    """Whether this run goes owner-computes: ``distribution="owner"``, or "auto" on a Dask cluster
    of several workers (CPU, or GPU: one worker per GPU) for exact CP-ALS or STS-CP of a sparse
    store. ``"graph"`` keeps the per-mode task graphs (one worker, the inline scheduler, dense
    arrays and CP-ARLS-LEV always do)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    able = not is_inline(client) and not dense and method in OWNER_METHODS
    if distribution == "owner" and not able:
        raise ValueError(
            f"distribution='owner' runs CP-ALS (method {' or '.join(map(repr, OWNER_METHODS))}) of a sparse "
            "store on Dask workers (not the inline scheduler, a dense array or CP-ARLS-LEV)"
        )
    if distribution == "graph" or not able:
        return False
    return distribution == "owner" or len(graph.resources) > 1


def start_owner_computes(client, graph, init: tuple, nmodes: int, sampled: bool = False) -> OwnerComputes:
    """The owner-computes run of ``graph``'s store and partitions (its memory plan's execution);
    ``sampled`` (randomized CP-ALS): modes the store's fiber index holds read their fibers through it."""
    fn, args = init
    plan = graph.memory_plan
    return OwnerComputes(
        client,
        graph.path,
        graph.parts,
        in_memory=graph.execution == "in-memory",
        init=fn,
        init_args=args,
        nmodes=nmodes,
        # the one task per worker and iteration takes all the worker's cores
        threads={a: r["numba_threads"] * r["dask_threads"] for a, r in graph.resources.items()},
        batch_nnz=graph.batch_nnz,
        max_private_bytes=graph.max_private_bytes,
        mode_copies=bool(plan and plan.mode_copies),
        mode_pairs=bool(plan and plan.mode_pairs),
        workers=sorted(graph.resources),  # on GPU devices, the GPU workers
        device=graph.device,
        device_options=graph.device_options,
        index_modes=[m for m in range(nmodes) if graph.reads_fiber_index(m)] if sampled else [],
    )


def owner_summary(summaries: list[dict], lower: list[int]) -> tuple[U.Summary, dict]:
    """The iteration's summary from every worker's (model terms are the same on each; timings the
    slowest worker's), and the exchange's record: bytes sent per mode against ``lower``, the
    distribution's lower bound per mode (:meth:`OwnerPlan.mode_lower_bound_bytes`)."""
    first = summaries[0]
    if first.get("skipped"):  # the workers stopped where the driver goes on: never expected
        raise RuntimeError("owner-computes workers stopped the run where the driver did not")
    N = len(first["grams"])
    timings = {n: tuple(max(s["timings"][n][i] for s in summaries) for i in range(2)) for n in range(N)}
    finished = {n: max(s["finished"][n] for s in summaries) for n in range(N)}
    sampling = {n: max(s["sampling"].get(n, 0.0) for s in summaries) for n in first.get("sampling", {})}
    sm = U.Summary(
        first["weights"],
        first["grams"],
        first["inner"],
        finished,
        timings,
        sampling,
        max(s.get("fit_seconds", 0.0) for s in summaries),
        dict(first.get("empty_sketches", {})),
        # what the sampled MTTKRPs read, summed over the workers
        {n: merged_reads(*(s.get("reads", {}).get(n) for s in summaries)) or {} for n in range(N)},
    )
    return sm, exchange_record(summaries, lower)


def owner_factors(engine: OwnerComputes, shape, rank: int, dtype: str, unwritten=frozenset()) -> list[np.ndarray]:
    """The factor matrices, gathered from their owners to the driver; the modes ``unwritten`` (no
    update has written them in this run) with the initial rows no worker holds."""
    return [engine.factor(n, shape, rank, dtype, initial=n in unwritten) for n in range(len(shape))]


def owner_checkpoint(
    engine: OwnerComputes,
    path: str,
    shape,
    rank: int,
    dtype: str,
    weights,
    iteration,
    fit,
    history,
    params,
    input_fp,
    unwritten=frozenset(),
) -> float:
    """Write the state after ``iteration`` to ``path`` from the driver (the rows gathered from
    their owners; see :func:`owner_factors` for ``unwritten``). Returns the seconds it took."""
    t0 = time.time()
    stacked = StackedFactors.from_list(owner_factors(engine, shape, rank, dtype, unwritten), dtype)
    raise_returned(
        disk_full_returned(write_checkpoint, path, stacked, weights, iteration, fit, history, params, input_fp)
    )
    return time.time() - t0
