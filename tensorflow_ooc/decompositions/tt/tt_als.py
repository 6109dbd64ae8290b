"""Tensor-train ALS on a BLCO store, as iterated Dask passes over the nonzeros (seed 000, chapter 5).

The loop below is the sweep of section 5.2.2: cores updated left to right, then right to left,
each by the exact least-squares solution of Proposition 5.2.2 (the contraction ``Y_j`` of the
nonzeros with the orthonormal left and right core chains, :mod:`~tensorflow_ooc.kernels.tt.cpu`),
then a QR that hands the orthogonality to the next core. Its steps are small functions in
:mod:`~tensorflow_ooc.decompositions.tt.tt_steps`, its passes partition tasks in
:mod:`~tensorflow_ooc.execution.tt_tasks` on the MTTKRP graph's partitions and reductions.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import ExitStack
from typing import Any, Sequence

import numpy as np

from ...errors import DecompositionError
from ...execution import MTTKRPGraph
from ...execution.graph import EXECUTION_MODES
from ...execution.inline import is_inline
from ...execution.tt_tasks import add_residuals, contraction_partition, residual_partition
from ...store import Store, open_store, paths
from ..common.checkpoint_files import disk_full_returned, raise_returned
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_count, check_seed, check_tensor_norm, check_tolerance
from ..common.options import declared
from ..common.run_control import FIT_EVERY_ITERATION_NNZ, run_entropy
from ..common.run_loop import ends_or_checkpoints, inline_when_small, run_iterations
from . import tt_steps as S
from .options import TT_ALS
from .tt_checkpoint import read_tt_checkpoint, write_tt_checkpoint
from .tt_randomized import draw_core, sketch_threads
from .tt_result import TTResult

__all__ = ["tt_als", "METHODS"]

log = logging.getLogger(__name__)

METHODS = ("exact", "randomized")
TINY = float(np.finfo(np.float64).tiny)  # a fit of exactly 0 before: any change is relatively large


@declared(TT_ALS)
def tt_als(store: Store | str | os.PathLike, ranks: int | Sequence[int], **options: Any) -> TTResult:
    """Tensor-train decomposition of a sparse store by alternating least squares (TT-ALS).

    The model is ``T[i_0, ..., i_{N-1}] = core_0[:, i_0, :] @ ... @ core_{N-1}[:, i_{N-1}, :]``,
    core ``k`` of shape ``(R_{k-1}, I_k, R_k)`` with ``R_0 = R_N = 1`` (TensorLy's convention).
    A sweep updates cores ``0 .. N-2`` left to right, then ``N-1 .. 1`` right to left. When core
    ``j`` is updated the cores left of it are left-orthonormal and those right of it
    right-orthonormal, so its least-squares problem (seed 000, Proposition 5.2.2) has an
    orthonormal design matrix and its solution is

        Y_j[a, i, b] = sum over nonzeros x with i_j = i of  x * L(i_<j)[a] * Rt(i_>j)[b],

    ``L`` the product of the slices ``core_k[:, i_k, :]`` of the cores before ``j`` and ``Rt``
    that of the cores after it, evaluated at the nonzeros only (partition tasks on the cluster,
    tree-reduced). A QR of the new core then moves the orthogonality on (the neighbour in the
    sweep's direction absorbs the triangular factor). With orthonormal chains
    ``||X - T||^2 = ||X||^2 - ||Y_j||^2``, so the fit ``1 - ||X - T|| / ||X||`` of each sweep (that of
    its last update) costs nothing extra. Its rounding (the difference of two near-equal sums) leaves
    ``1 - fit`` at about 1e-8 at best; where the store holds every cell, the fit is instead the
    squared error summed at the nonzeros (one pass more per sweep), exact to rounding.

    Parameters
    ----------
    store : Store or path
        A BLCO store (see :func:`tensorflow_ooc.convert`) of order >= 2.
    {options}

    Returns
    -------
    TTResult
        ``cores`` (cores 1 .. N-1 right-orthonormal), ``fit``, ``sweeps`` and ``history`` (per
        sweep: fit, fit change, seconds, and per core update its contraction and update seconds).

    Examples
    --------
    >>> import tensorflow_ooc as tfo
    >>> from tensorflow_ooc import synthetic
    >>> c, v = synthetic.heavy_tailed((30, 40, 50), 5000, seed=0)
    >>> s = tfo.convert((c, v), "memory://doc-tt")
    >>> r = tfo.tt_als(s, 4, seed=1, max_sweeps=5)          # doctest: +SKIP
    >>> r.ranks, [c.shape for c in r.cores]                 # doctest: +SKIP
    ((1, 4, 4, 1), [(1, 30, 4), (4, 40, 4), (4, 50, 1)])
    >>> tt = r.to_tensorly()                                # doctest: +SKIP
    """
    run, o = TT_ALS.settings(options)
    store = store if isinstance(store, Store) else open_store(paths.resolve_version(store))
    return run_iterations(TTSweeps(store, ranks, run, o), store, run)


class TTSweeps:
    """TT-ALS's steps for the run loop: a sweep per iteration (seed 000, section 5.2.2)."""

    name, title, device, claim_error = "tt_als", "TT-ALS", "cpu", DecompositionError

    def __init__(self, store: Store, ranks: int | Sequence[int], run: Any, o: Any) -> None:
        self.store, self.run, self.o = store, run, o
        shape = self.shape = tuple(int(s) for s in store.shape)
        self.full_ranks = full_ranks = S.check_ranks(ranks, shape)
        o.init = S.check_init(o.init, shape, full_ranks)
        if o.method not in METHODS:
            raise DecompositionError(f"method must be one of {METHODS}, got {o.method!r}")
        check_count("samples", o.samples)
        check_count("max_sweeps", o.max_sweeps)
        check_count("checkpoint_every", run.checkpoint_every)
        check_count("warmup", o.warmup, low=0)
        if o.fit_every is None:  # randomized CP-ALS's default: the fit's pass costs an exact update
            o.fit_every = 1 if store.nnz <= FIT_EVERY_ITERATION_NNZ else 5
        check_count("fit_every", o.fit_every)
        o.tol = check_tolerance(o.tol)
        if run.execution not in EXECUTION_MODES:
            raise DecompositionError(f"execution must be one of {EXECUTION_MODES}, got {run.execution!r}")
        if o.seed is not None and (isinstance(o.seed, bool) or not isinstance(o.seed, (int, np.integer))):
            raise DecompositionError(f"seed must be an integer or None, got {o.seed!r}")
        self.normX2 = store.norm_sq
        check_tensor_norm(store.path, self.normX2)
        run.checkpoint = None if run.checkpoint is None else str(run.checkpoint)
        self.input_fp = fingerprint(store)
        self.max_iters = o.max_sweeps
        self.base_params = {
            "ranks": list(full_ranks[1:-1]),
            "method": o.method,
            "max_sweeps": int(o.max_sweeps),
            "tol": o.tol,
            "seed": None if o.seed is None else int(o.seed),
            "init": o.init if isinstance(o.init, str) else "given",
            # every cell stored: the squared error summed at the nonzeros, exact to rounding (one pass
            # more per sweep); else ||X||^2 - ||Y_j||^2, free, whose cancellation leaves 1 - fit >~ 1e-8
            # (randomized: from the exact update that ends each evaluated sweep)
            "fit_from": "residual" if store.nnz == math.prod(shape) else "identity",
        }
        if o.method == "randomized":
            self.base_params.update(samples=int(o.samples), warmup=int(o.warmup), fit_every=int(o.fit_every))
        self.resumed = _resumed(run.checkpoint if run.resume else None, self.input_fp, self.base_params)
        inline_when_small(run, store.nnz, "cpu")

    def start(self, c: Any, cleanup: ExitStack, resume: bool) -> int:
        run, o = self.run, self.o
        self.c = c
        self.graph = graph = MTTKRPGraph(
            c, self.store, execution=run.execution, partitions=run.partitions, device="cpu"
        )
        cleanup.callback(graph.release)
        params = self.params = dict(self.base_params)
        params.update(execution=graph.execution, partitions=len(graph.parts))
        params["scheduler"] = "inline" if is_inline(c) else "dask"
        # --- initial cores: right-orthonormal from a fresh start, or the checkpoint's as they were ---
        if resume and not self.run.resume:  # a restart after a lost worker, from the checkpoint
            self.resumed = _resumed(run.checkpoint, self.input_fp, self.base_params)
        resumed = self.resumed if resume else None
        if resumed is not None:
            state0, start, self.fit, self.history = resumed.state, resumed.sweep + 1, resumed.fit, list(resumed.history)
            params["sample_entropy"] = resumed.params.get("sample_entropy")
            log.info("resuming from %s after sweep %d (fit %.6f)", run.checkpoint, start, self.fit)
        else:
            cores = S.initial_cores(o.init, self.shape, self.full_ranks, o.seed)
            state0, start, self.fit, self.history = S.start_state(self.shape, self.full_ranks, cores), 0, 0.0, []
        params["resumed_after"] = self.start_at = start
        if o.method == "randomized":
            params["sample_entropy"] = run_entropy(params.get("sample_entropy"), o.seed)
            # every partition beside the state: a sketched update is one task (draws, gathers, solve)
            params["sketched_update"] = "one task" if graph.local_partitions() is not None else "partition tasks"
        self.F = c.scatter(state0, hash=False)  # scattered: a long mode's cores would bloat the graph
        self.ahead: tuple[int, Any] | None = None  # (sweep, its state's future) submitted ahead
        self.ended: float | None = None  # the worker's clock at the end of the last sweep read
        self.stored = self.store.stored_bytes()
        return start

    def iterate(self, sweep: int) -> dict:
        """One sweep: each core update a pass over the partitions, then one update task (one task in
        all with one partition); the whole sweep is submitted before the driver reads its summary,
        and where this sweep cannot end the run the next one too (:meth:`_submit_ahead`)."""
        c, graph, store = self.c, self.graph, self.store
        threads, batch_nnz = graph.numba_threads, graph.batch_nnz
        t_sweep = time.time()
        # None: no fit evaluated before this sweep (a fresh run's first, or randomized ones before it)
        fit_old = self.fit_old = self.fit if any(h.get("fit_evaluated", True) for h in self.history) else None
        evaluate = self._evaluated(sweep)
        ran_ahead = self.ahead is not None and self.ahead[0] == sweep
        F = self.ahead[1] if ran_ahead else self._submit_sweep(self.F, sweep)
        self.F, self.ahead = F, None
        # before the sweep submitted ahead, which becomes ready at the same moment
        summary = c.submit(S.summary, F, pure=False, priority=1)
        self.ahead = self._submit_ahead(F, sweep, evaluate)
        sm = summary.result()
        # a sweep run ahead starts when the one before ends, maybe before the driver has read that
        # one's summary: it is timed on the worker's clock, from that end to its own
        ended = sm.steps[-1][3] if sm.steps else None
        span = (self.ended, ended) if ran_ahead and self.ended is not None and ended is not None else None
        self.ended = ended
        t_fit = time.time()
        fit = self.fit  # randomized, not evaluated: the fit needs an exact update; kept
        if evaluate and self.params["fit_from"] == "residual":
            parts = graph.partition_pass(residual_partition, F, threads, batch_nnz, reduce=add_residuals)
            res = add_residuals(*[p.result() for p in parts])[0]
            fit = S.residual_fit(self.normX2, res)  # every cell stored: no error off the nonzeros
        elif evaluate:
            fit = S.sweep_fit(self.normX2, sm.norm_sq)
        t_fit = time.time() - t_fit
        if not math.isfinite(fit):
            raise DecompositionError(
                f"sweep {sweep + 1}: the fit is {fit!r}: the values are too large or too small for float64 "
                "products of the cores, or the initial cores hold NaN/Inf; rescale the data or use another init"
            )
        self.fit = fit
        streamed = graph.execution == "streaming"
        args = (sweep, t_sweep, sm, fit if evaluate else None, fit_old, t_fit, store.nnz, self.stored, streamed)
        record = _sweep_record(*args, self.start_at, span)
        if self._warmup(sweep):
            record["warmup"] = True
        self.history.append(record)
        if evaluate:
            relative = record["fit_change_relative"]
            log.info(
                "sweep %d: fit %.6g (change %.2e, relative %s), %.3f s",
                sweep + 1,
                fit,
                record["fit_change"],
                "-" if relative is None else f"{relative:.2e}",
                record["seconds"],
                extra={"iteration": sweep + 1},
            )  # a field of its own in JSON logs
        else:
            log.info(
                "sweep %d: fit not evaluated, %.3f s", sweep + 1, record["seconds"], extra={"iteration": sweep + 1}
            )
        self.evaluate = evaluate
        return record

    def _warmup(self, sweep: int) -> bool:
        """Whether ``sweep`` is one of a randomized run's exact warm-up sweeps."""
        return self.o.method == "randomized" and sweep < self.o.warmup

    def _evaluated(self, sweep: int) -> bool:
        """Whether ``sweep``'s fit is evaluated (every exact or warm-up sweep; randomized:
        ``fit_every``, the last)."""
        o = self.o
        return o.method == "exact" or self._warmup(sweep) or (sweep + 1) % o.fit_every == 0 or sweep + 1 == o.max_sweeps

    def _submit_sweep(self, F: Any, sweep: int) -> Any:
        """Submit ``sweep``'s core updates on the state ``F``; the future of the state after them."""
        c, graph, o, store = self.c, self.graph, self.o, self.store
        threads, batch_nnz = graph.numba_threads, graph.batch_nnz
        evaluate = self._evaluated(sweep)
        order = S.sweep_order(store.nmodes)
        local = graph.local_partitions() if self.params.get("sketched_update") == "one task" else None
        exact = o.method == "exact" or self._warmup(sweep)
        exact_at = [exact or (evaluate and step == len(order) - 1) for step in range(len(order))]
        begun = False
        if local is None or exact_at[0]:
            F, begun = c.submit(S.begin_sweep, F, pure=False, **graph.placement), True
        fused: list[tuple[int, str, tuple]] = []  # sketched updates of one task (every partition local)
        gather = sketch_threads(o.samples, store.nmodes, threads)
        for step, (mode, direction) in enumerate(order):
            if exact_at[step]:
                # randomized: an evaluated sweep ends with an exact update, so its ||Y_j||^2 gives the
                # fit (the identity needs the last core to be the projection; a sketched one is not)
                F, begun = self._fused(F, local, fused, gather, begun), True
                F = graph.pass_update(
                    contraction_partition, (mode, threads, batch_nnz), S.update_core, F, mode, direction
                )
                continue
            # draw beside the state, gather the sampled fibers, solve the sketched problem
            seed_k = (self.params["sample_entropy"], sweep, step)
            if local is not None:  # every partition beside the state: the sweep's updates in one task
                fused.append((mode, direction, seed_k))
                continue
            D = c.submit(draw_core, F, mode, o.samples, seed_k, pure=False, **graph.placement)
            parts = graph.sampled_partials(D, mode, gather)
            F = c.submit(S.update_core, F, parts, mode, direction, D, pure=False, **graph.placement)
        return self._fused(F, local, fused, gather, begun)

    def _submit_ahead(self, F: Any, sweep: int, evaluate: bool) -> tuple[int, Any] | None:
        """The next sweep, submitted before this one's summary is read, so the worker goes on
        without waiting for the driver (a randomized sweep a few hops of 2-5 ms long on the
        embedded cluster). Only where this sweep cannot end the run: a randomized one whose fit is
        not evaluated (the run stops on evaluated fits only), not the last, writing no checkpoint
        (whose cores must be this sweep's), not inline (where a submitted task runs at once). The
        sweep's updates work on a copy of the state, so ``F`` stays this sweep's."""
        if (
            self.o.method != "randomized"
            or evaluate
            or is_inline(self.c)
            or ends_or_checkpoints(self.run, sweep, self.max_iters)
        ):
            return None
        return sweep + 1, self._submit_sweep(F, sweep + 1)

    def _fused(self, F: Any, local: Any, steps: list, gather: int | None, begun: bool) -> Any:
        """Submit the sketched updates ``steps`` (emptied) as one task on the state ``F`` (starting
        the sweep unless ``begun``); ``F`` itself where there are none."""
        if not steps:
            return F
        args = (F, local, list(steps), self.o.samples, self.graph.numba_threads, gather, not begun)
        steps.clear()
        return self.c.submit(S.sketched_updates, *args, pure=False, **self.graph.placement)

    def converged(self, sweep: int, record: dict) -> bool:
        if self.o.method == "exact":
            return self.fit_old is not None and record["fit_change_relative"] < self.o.tol
        # sketched updates make the fit noisy: the randomized CP-ALS rule on evaluated fits, relative
        evaluated = [h["fit"] for h in self.history if h.get("fit_evaluated", True)]
        return self.evaluate and stalled(evaluated, self.o.tol)

    def save_checkpoint(self, path: str, sweep: int) -> float:
        t_ck = time.time()
        args = (path, self.F, sweep, self.fit, self.history, self.params, self.input_fp)
        raise_returned(self.c.submit(disk_full_returned, write_tt_checkpoint, *args, pure=False).result())
        return time.time() - t_ck

    def finish(self) -> TTResult:
        cores = self.c.submit(S.cores_of, self.F, pure=False).result()
        del self.F
        return TTResult(
            [np.array(k) for k in cores], self.fit, len(self.history), self.history, self.params, self.input_fp
        )


def _resumed(checkpoint: str | None, input_fp: dict, params: dict):
    """The checkpoint to resume from (None: start afresh); one of another store, other ranks or
    another method is refused; so is a negative seed (before any cluster starts)."""
    check_seed(params["seed"])
    ck = read_tt_checkpoint(checkpoint) if checkpoint else None
    if ck is None:
        return None
    for key, want in (("ranks", params["ranks"]), ("method", params["method"])):
        if ck.params.get(key) != want:
            raise DecompositionError(
                f"{checkpoint}: checkpoint is of a run with {key}={ck.params.get(key)!r}, not {want!r}; "
                "remove it or drop resume"
            )
    if ck.input["store_id"] != input_fp["store_id"]:
        raise DecompositionError(f"{checkpoint}: checkpoint is for another store; remove it or drop resume")
    return ck


def relative_change(new: float, old: float | None) -> float | None:
    """``|new - old| / |old|``: the change of a fit relative to its size (a train of a sparse tensor
    can explain 1e-6 of it and still be improving by half its fit per sweep); None without a fit
    before (``old`` None), huge from a fit of exactly 0."""
    if old is None:
        return None
    return abs(new - old) / max(abs(old), TINY)


def stalled(evaluated: Sequence[float], tol: float) -> bool:
    """Randomized sweeps' stopping test on the evaluated fits (this run's and a resumed one's): the
    best of the last 3 beats the best before them by less than ``tol`` relative to that best."""
    if not (tol > 0 and len(evaluated) > 3):
        return False
    before = max(evaluated[:-3])
    return (max(evaluated[-3:]) - before) / max(abs(before), TINY) < tol


def _sweep_record(
    sweep: int,
    t_sweep: float,
    sm: S.SweepSummary,
    fit: float | None,
    fit_old: float | None,
    fit_seconds: float,
    nnz: int,
    stored: int,
    streamed: bool,
    start: int,
    span: tuple[float, float] | None = None,
) -> dict:
    """The history record of ``sweep`` (0-based), timed from ``t_sweep`` (or, for a sweep run ahead,
    over ``span`` on the worker's clock, plus the fit's seconds); ``fit`` None: a sweep whose fit
    was not evaluated (randomized, ``fit_every``), recorded without fit or change."""
    seconds = time.time() - t_sweep if span is None else span[1] - span[0] + fit_seconds
    contraction = [st[1] for st in sm.steps]
    update = [st[2] for st in sm.steps]
    draws = [st[4] if len(st) > 4 else 0.0 for st in sm.steps]  # a state checkpointed before draws were kept
    figures = {"fit_evaluated": False}
    if fit is not None:
        figures = {
            "fit": fit,
            "fit_change": abs(fit - (fit_old or 0.0)),
            "fit_change_relative": relative_change(fit, fit_old),
            "fit_evaluated": True,
        }
    return {
        "sweep": sweep + 1,
        **figures,
        "seconds": seconds,
        "modes": [st[0] for st in sm.steps],
        "contraction_seconds": contraction,
        "update_seconds": update,
        "draw_seconds": draws,
        "fit_seconds": fit_seconds,
        "other_seconds": max(0.0, seconds - sum(contraction) - sum(update) - sum(draws) - fit_seconds),
        "nnz_per_s": nnz * len(sm.steps) / seconds if seconds > 0 else 0.0,
        # a streaming pass reads every compressed chunk; in memory they were read before the first sweep
        "bytes_read": stored * len(sm.steps) if streamed else (stored if sweep == start else 0),
    }
