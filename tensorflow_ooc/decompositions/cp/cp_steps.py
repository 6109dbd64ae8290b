"""The pieces of the CP-ALS loop (seed 001 chapter 2, Algorithm 1; seed 000 chapter 3), each a small
function that :func:`~tensorflow_ooc.decompositions.cp.cp_als.cp_als` calls in order: argument checks,
the MTTKRP graph, the initial state (fresh or resumed), the per-mode steps (exact and randomized),
the fit, the history record, the convergence test, the checkpoint write and the final factors.

The per-mode steps submit tasks and return the future of the next model state at once: a whole
iteration is submitted before the driver reads anything (see ``cp_als``).
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import Any, NamedTuple, Sequence

import numpy as np
from distributed import Client, Future

from ...errors import DecompositionError, DenseArrayError
from ...execution import MTTKRPGraph
from ...execution.exchange import task_released
from ...store import Store
from ...store.dense import DenseArray
from ..common.checkpoint_files import disk_full_returned, raise_returned
from ..common.model_checks import check_count, check_seed, check_tolerance
from ..common.run_control import FIT_EVERY_ITERATION_NNZ, converged
from . import updates as U
from .checkpoint import read_checkpoint, write_checkpoint
from .randomized import check_method, draw_samples

log = logging.getLogger(__package__ + ".cp_als")


def check_arguments(store: Store | DenseArray, rank: int, run: Any, o: Any) -> int:
    """Refuse bad arguments (``run`` the run control, ``o`` CP-ALS's knobs) before anything is
    allocated; returns the ``fit_every`` to use."""
    dense = store.dense
    max_iters, tol, dtype, method, samples, fit_every = o.max_iters, o.tol, o.dtype, o.method, o.samples, o.fit_every
    nonnegative, reg, device, distribution = o.nonnegative, o.reg, run.device, run.distribution
    check_count("rank", rank)
    check_count("max_iters", max_iters)
    check_tolerance(tol)
    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    check_method(method, samples)
    randomized = method != "exact"
    if dense and randomized:
        raise DenseArrayError(
            f"{store.path}: method={method!r} samples fibers of a sparse store; a dense array takes method='exact'"
        )
    if randomized and device == "gpu":
        raise ValueError(f"method={method!r} runs on CPU workers; use device='cpu' or 'auto'")
    if fit_every is not None and int(fit_every) < 1:
        raise ValueError(f"fit_every must be >= 1, got {fit_every}")
    check_nonnegative(nonnegative, reg, method, distribution)
    return int(fit_every) if fit_every is not None else (1 if store.nnz <= FIT_EVERY_ITERATION_NNZ else 5)


def check_nonnegative(nonnegative: object, reg: object, method: str, distribution: str) -> float:
    """Refuse a bad ``nonnegative`` / ``reg`` pair; returns ``reg`` as a float."""
    if not isinstance(nonnegative, (bool, np.bool_)):
        raise ValueError(f"nonnegative must be True or False, got {nonnegative!r}")
    reg = check_tolerance(reg, "reg")  # a finite number >= 0 (a DecompositionError, a ValueError)
    if reg > 0 and not nonnegative:
        raise ValueError(
            f"reg={reg!r} regularizes the HALS updates of nonnegative CP-ALS: pass nonnegative=True, or reg=0"
        )
    if nonnegative and method != "exact":
        raise ValueError(
            f"nonnegative=True solves each mode by HALS on the exact normal equations: it takes "
            f"method='exact', not {method!r}"
        )
    if nonnegative and distribution == "owner":
        raise ValueError(
            "nonnegative=True runs the per-mode task graphs (distribution='graph' or 'auto'), not owner-computes"
        )
    return reg


def check_nonnegative_init(init: Sequence[np.ndarray]) -> None:
    """Nonnegative CP-ALS starts from nonnegative factors: refuse a given ``init`` with a negative entry."""
    for n, a in enumerate(init):
        a = np.asarray(a)
        if a.size and float(a.min()) < 0:
            raise ValueError(
                f"init: factor matrix {n} holds negative entries (min {float(a.min()):.3g}); "
                "nonnegative=True starts from nonnegative factors (take np.abs or clip them at 0)"
            )


class InitialState(NamedTuple):
    F: Future  # the model state (factors, Grams, weights) on the cluster
    start: int  # first iteration to run (0-based)
    fit: float
    history: list[dict]
    weights: np.ndarray
    sample_entropy: int | None  # a resumed randomized run's entropy, else None


def initial_state(
    c: Client,
    checkpoint: str | None,
    input_fp: dict,
    init: str | Sequence[np.ndarray],
    shape: Sequence[int],
    rank: int,
    seed: int | None,
    dtype: str,
    on_workers: bool = False,
    same: dict | None = None,
) -> InitialState:
    """Algorithm 1, line 1: the factors to start from. From ``checkpoint`` when it is given and
    exists (it must be for the same store and rank, and hold ``same``'s params, absent ones
    counted as their value in the default run: ``False`` / ``0.0``), else fresh: random from
    ``seed``, or ``init``'s matrices (their shapes checked, NaN and Inf refused).

    ``on_workers`` (owner-computes): ``F`` is instead ``(function, args)`` that makes the initial
    factors on each worker (args may hold futures)."""
    seed = check_seed(seed)
    state = read_checkpoint(checkpoint) if checkpoint else None
    if state is not None:
        if state.input["store_id"] != input_fp["store_id"] or state.params.get("rank") != rank:
            raise ValueError(f"{checkpoint}: checkpoint is for another store or rank; remove it or drop resume")
        for key, value in (same or {}).items():
            was = state.params.get(key, type(value)())
            if was != value:
                raise ValueError(
                    f"{checkpoint}: checkpoint is of a run with {key}={was!r}, not {value!r}; remove it or drop resume"
                )
        # scattered, not embedded in the graph: Dask warns about (and copies) graphs of
        # tens of MB, which a long factor's rows make
        if on_workers:
            F = (U.stacked_copy, (c.scatter(state.factors, hash=False), dtype))
        else:
            F = c.submit(U.stack, c.scatter(state.factors, hash=False), dtype, state.weights, pure=False)
        log.info("resuming from %s after iteration %d (fit %.6f)", checkpoint, state.iteration + 1, state.fit)
        return InitialState(
            F, state.iteration + 1, state.fit, list(state.history), state.weights, state.params.get("sample_entropy")
        )
    N = len(shape)
    if isinstance(init, str):
        if init != "random":
            raise ValueError(f"init must be 'random' or a list of factor matrices, got {init!r}")
        F = (
            (U.random_factors, (tuple(shape), rank, seed, dtype))
            if on_workers
            else c.submit(U.random_factors, shape, rank, seed, dtype, pure=False)
        )
    else:
        if len(init) != N or any(np.shape(a) != (shape[n], rank) for n, a in enumerate(init)):
            raise ValueError(f"init must hold {N} matrices of shapes {[(s, rank) for s in shape]}")
        bad = [n for n, a in enumerate(init) if not np.isfinite(np.asarray(a, dtype=np.float64)).all()]
        if bad:
            raise DecompositionError(f"init: factor matrix {bad[0]} holds NaN or infinite entries")
        given = c.scatter([np.asarray(a) for a in init], hash=False)
        F = (U.stacked_copy, (given, dtype)) if on_workers else c.submit(U.stack, given, dtype, pure=False)
    return InitialState(F, 0, 0.0, [], np.ones(rank), None)


def exact_step(
    graph: MTTKRPGraph,
    nmodes: int,
    F: Future,
    n: int,
    iteration: int,
    evaluate: bool,
    nonneg: U.NonNegative | None = None,
) -> Future:
    """Algorithm 1, lines 3-6, for mode ``n``: the MTTKRP graph M = X_(n) (odot_{m != n} A_m), then
    one update task (V = Hadamard product of the other modes' Grams, A_n = M V^+ by Cholesky, or
    with ``nonneg`` HALS sweeps on the same M and V; columns normalized; after the last mode, the
    inner-product terms of the fit, from the final factor), fused into one task when there is one
    partition. Its fit is exact every iteration, so ``evaluate`` is not read."""
    update = U.update_mode if nonneg is None else partial(U.update_mode, nonneg=nonneg)
    return graph.mode_update(F, n, update, iteration == 0, n == nmodes - 1, graph.in_place)


def exact_sweeps(
    graph: MTTKRPGraph,
    nmodes: int,
    F: Future,
    iterations: Sequence[int],
    stop: tuple[float, float, int, float | None],
    ahead: bool,
    nonneg: U.NonNegative | None = None,
) -> Future:
    """Algorithm 1, lines 2-7, for each of ``iterations`` in turn: :func:`exact_step` for every mode,
    all as one task (a graph of one partition,
    :meth:`~tensorflow_ooc.execution.MTTKRPGraph.fuses_modes`). With copying updates each sweep's
    first mode copies the state: the states between modes live inside the task, where nothing
    else can refer to them, so the later modes update the copy in place (the update's result is
    the same either way). The state after the sweeps keeps each one's summary
    (:func:`~.updates.sweep_summaries`).

    ``stop``: ``(||X||^2, tol, k, fit after iteration k)``, the latest fit the driver knows. Before
    each sweep but the first (and before the first too with ``ahead``: a batch submitted before
    the driver read the one before), the task tests the iteration before by the driver's test
    (:func:`_goes_on`) and ends where it stops the run, leaving the state as it stands."""
    update = U.update_mode if nonneg is None else partial(U.update_mode, nonneg=nonneg)
    return graph.sweeps_update(F, update, partial(_sweep_batch, nmodes, tuple(iterations), graph.in_place, stop, ahead))


def _sweep_batch(
    nmodes: int,
    iterations: tuple[int, ...],
    in_place: bool,
    stop: tuple[float, float, int, float | None],
    ahead: bool,
    state: U.CPState,
    sweep: Any,
) -> U.CPState:
    """Run on the worker: the sweeps of :func:`exact_sweeps`; ``sweep(state, steps)`` one sweep."""
    normX2, tol, known, known_fit = stop
    fits = {known: known_fit}  # the fits of the iterations before, by the driver's numbers
    for k, sm in getattr(state, "sweeps", {}).items():  # a batch after one the driver has not read
        fits[k] = model_fit(sm, normX2, model_norm_sq(sm))
    at = max(fits)  # the iteration the state is after
    done: dict[int, U.Summary] = {}
    for pos, iteration in enumerate(iterations):
        if at != iteration - 1:  # the batch before stopped early: so did the run
            break
        if pos > 0 and task_released():  # the driver is gone (a run that failed): nobody reads on
            break
        tested = (ahead or pos > 0) and iteration > 0  # the driver asked for the first of a batch it read
        if tested and not _goes_on(iteration - 1, tol, fits):
            break
        steps = tuple((n, (iteration == 0, n == nmodes - 1, in_place or n > 0)) for n in range(nmodes))
        state = sweep(state, steps)
        done[iteration] = U.summary(state, copy=True)
        fits[iteration] = model_fit(done[iteration], normX2, model_norm_sq(done[iteration]))
        at = iteration
    if done:
        state.sweeps = done
    return state


def _goes_on(iteration: int, tol: float, fits: dict[int, float | None]) -> bool:
    """Run on the worker before a sweep the driver has not asked for yet: whether the run goes on
    after ``iteration`` (0-based) by the test the driver applies to its fit (``fits``, by
    iteration, from :func:`model_fit` as the driver computes them;
    :func:`~..common.run_control.converged`); a fit that is not finite stops the driver too."""
    fit = fits[iteration]
    return math.isfinite(fit) and not converged(False, tol, iteration, fit, fits.get(iteration - 1), True, [])


def randomized_step(
    c: Client,
    graph: MTTKRPGraph,
    nmodes: int,
    method: str,
    samples: int,
    entropy: int,
    F: Future,
    n: int,
    iteration: int,
    evaluate: bool,
) -> Future:
    """Algorithm 1, lines 3-6, sketched (seed 000, chapter 3), for mode ``n``: draw ``samples`` rows
    of the Khatri-Rao product beside the state (STS-CP or CP-ARLS-LEV, seeded by the run's entropy,
    the iteration and the mode), the sampled MTTKRP over the nonzeros of the sampled fibers, and the
    update from the sketch's normal equations. With ``evaluate``, the last mode also runs the exact
    MTTKRP, whose inner products give the fit."""
    # draw beside the state, gather the sampled fibers, solve the sketched problem; the
    # last mode of an evaluated iteration also runs the exact MTTKRP for the fit
    S = c.submit(draw_samples, F, n, method, samples, (entropy, iteration, n), pure=False, **graph.placement)
    return graph.sampled_mode_update(
        F, S, n, U.update_mode, evaluate and n == nmodes - 1, iteration == 0, n == nmodes - 1, graph.in_place
    )


def sampled_reads_plan(graph: MTTKRPGraph, store: Any) -> dict[str, str]:
    """Per mode, how the sampled rounds find their fibers (logged; the run's params keep it):
    through the store's fiber index, each in-memory partition's index, or a scan of every nonzero."""
    plan = graph.sampled_reads()
    scans = [m for m, how in plan.items() if how == "scan"]
    log.info(
        "sampled rounds: %s",
        ", ".join(f"mode {m} {how}" for m, how in plan.items()),
        extra={"sampled_reads": plan},
    )
    if scans:
        log.info(
            "modes %s scan every nonzero of the store each round; a fiber index makes them read only the "
            "sampled fibers: tfooc fiber-index %s",
            ",".join(scans),
            getattr(store, "path", "STORE"),
        )
    return plan


def model_norm_sq(sm: U.Summary) -> float:
    """||M||^2 = w^T (*_n A_n^T A_n) w, from the weights and the Grams alone."""
    rank = len(sm.weights)
    H = np.ones((rank, rank))
    for g in sm.grams:
        H *= g
    return float(sm.weights @ H @ sm.weights)


def model_fit(sm: U.Summary, normX2: float, norm_model2: float) -> float:
    """fit = 1 - ||X - M|| / ||X||, without forming the model: ||X - M||^2 = ||X||^2 + ||M||^2 - 2 <X, M>,
    where <X, M> = sum_r w_r (A_N^T M_N)_rr comes from the last mode's MTTKRP (``sm.inner``)."""
    normX = math.sqrt(normX2)
    iprod = float((sm.inner * sm.weights).sum())
    return 1 - math.sqrt(abs(normX2 + norm_model2 - 2 * iprod)) / normX if normX > 0 else 0.0


def iteration_record(
    iteration: int,
    t_iter: float,
    sm: U.Summary,
    fit: float,
    fit_old: float,
    evaluate: bool,
    nnz: int,
    bytes_read: int,
    randomized: bool,
    samples: int,
    empty_seen: dict[int, int],
    ended: float | None = None,
) -> dict:
    """The history record of ``iteration`` (0-based), timed from ``t_iter`` to ``ended`` (default
    now). Randomized runs add their sampling times and the modes whose factor was kept (no sampled
    fiber held a nonzero; ``empty_seen``, the counts already reported, is updated)."""
    N = len(sm.grams)
    seconds = (time.time() if ended is None else ended) - t_iter
    # per-mode seconds from the update tasks' finish times (worker clocks)
    ends = [t_iter] + [sm.finished[n] for n in range(N)]
    mode_seconds = [max(0.0, ends[k + 1] - ends[k]) for k in range(N)]
    mttkrp_s = [sm.timings[n][0] for n in range(N)]
    update_s = [sm.timings[n][1] for n in range(N)]
    sampling_s = [sm.sampling.get(n, 0.0) for n in range(N)]  # all 0 for exact CP-ALS
    record = {
        "iteration": iteration + 1,
        "fit": fit,
        "fit_change": abs(fit - fit_old) if evaluate else 0.0,
        "fit_evaluated": evaluate,
        "seconds": seconds,
        "mode_seconds": mode_seconds,
        "mttkrp_seconds": mttkrp_s,
        "update_seconds": update_s,
        "other_seconds": max(0.0, seconds - sum(mttkrp_s) - sum(update_s) - sum(sampling_s) - sm.fit_seconds),
        "nnz_per_s": nnz * N / seconds,
        "bytes_read": bytes_read,
    }
    if randomized:
        # mttkrp_seconds are the sampled MTTKRPs; fit_seconds the exact one of the fit
        record["sampling_seconds"] = sampling_s
        record["fit_seconds"] = sm.fit_seconds  # 0 unless this iteration evaluated the fit
        record["round_seconds"] = max(0.0, seconds - sm.fit_seconds)  # the round without the fit's pass
        # per mode what the sampled MTTKRP read, beside the store's totals
        record["reads"] = {str(n): dict(sm.reads.get(n) or {}) for n in range(N)}
        record["store_nnz"] = nnz
        kept = [n for n in range(N) if sm.empty_sketches.get(n, 0) > empty_seen.get(n, 0)]
        empty_seen.clear()
        empty_seen.update(sm.empty_sketches)
        if kept:
            record["kept_modes"] = kept
            log.warning(
                "iteration %d: no sampled fiber of mode(s) %s held a nonzero, so those factors "
                "were kept; the tensor is too sparse for %d samples (raise samples)",
                iteration + 1,
                kept,
                samples,
            )
    return record


def save_checkpoint(
    c: Client,
    path: str,
    F: Future,
    weights: np.ndarray,
    iteration: int,
    fit: float,
    history: list[dict],
    params: dict,
    input_fp: dict,
) -> float:
    """Write the state after ``iteration`` to ``path`` (atomically, by a worker: the factors live
    there; a full disk raised here as :class:`~tensorflow_ooc.errors.DiskFullError`). Returns the
    seconds it took."""
    t_ck = time.time()
    raise_returned(
        c.submit(
            disk_full_returned,
            write_checkpoint,
            path,
            c.submit(U.on_host, F, pure=False),
            weights,
            iteration,
            fit,
            history,
            params,
            input_fp,
            pure=False,
        ).result()
    )
    return time.time() - t_ck


def final_factors(c: Client, F: Future, nmodes: int) -> list[np.ndarray]:
    """The factor matrices, fetched to the driver."""
    # mode by mode: sending the whole state at once would need a second copy of it on the worker
    host = c.submit(U.on_host, F, pure=False)
    return [c.submit(U.factor_rows, host, n, pure=False).result() for n in range(nmodes)]
