"""One CP-ALS iteration, two ways: per-mode task graphs with a reduce-scatter of the partials
(:class:`GraphModes`), or owner-computes, each worker updating the factor rows it owns
(:class:`OwnerModes`). The run loop's method (:class:`~.cp_als.CPIterations`) calls either the same way."""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial
from typing import Any

import numpy as np

from ...execution.inline import is_inline
from ..common.run_loop import ends_or_checkpoints
from . import updates as U
from .cp_owner import owner_checkpoint, owner_factors, owner_iteration, owner_summary, start_owner_computes
from .cp_steps import exact_step, exact_sweep, final_factors, randomized_step, save_checkpoint
from .randomized import with_trees


class GraphModes:
    """Each mode its MTTKRP graph and one update task beside the model state ``F`` (a future): a
    whole iteration is submitted at once, so the modes follow each other on the cluster with no
    round trip to the driver, which reads the small summary once per iteration."""

    def __init__(self, c: Any, graph: Any, F: Any, method: Any) -> None:
        o, on_cluster = method.o, graph.placement  # update tasks run where the MTTKRP partials are made
        if graph.device == "gpu":
            F = c.submit(U.on_device, F, pure=False, **on_cluster)
        N = method.store.nmodes
        nonneg = U.NonNegative(o.reg) if o.nonnegative else None
        self.exact = partial(exact_step, graph, N, nonneg=nonneg)
        self.step, self.warmup = self.exact, 0
        if method.randomized:
            if o.method == "sts":
                F = c.submit(with_trees, F, pure=False, **on_cluster)
            self.step = partial(randomized_step, c, graph, N, o.method, o.samples, method.params["sample_entropy"])
            self.warmup = int(o.warmup)
        # exact sweeps of a one-partition graph run as one task (one scheduling hop, not one a mode)
        self.sweep = partial(exact_sweep, graph, N, nonneg=nonneg) if graph.fuses_modes() else None
        self.ahead: tuple[int, Any] | None = None  # (iteration, its sweep's future) submitted ahead
        self.finished: dict | None = None  # the last summary's update finish times
        # (start, end) on the worker's clock of an iteration whose sweep was submitted ahead
        self.worker_span: tuple[float, float] | None = None
        self.c, self.F, self.N, self.method = c, F, N, method

    def iterate(self, iteration: int, evaluate: bool) -> tuple[U.Summary, None]:
        F = self.F
        step = self.exact if iteration < self.warmup else self.step  # randomized runs' exact warm-up
        ran_ahead = self.ahead is not None and self.ahead[0] == iteration
        if ran_ahead:
            F = self.ahead[1]
        elif step is self.exact and self.sweep is not None:
            F = self.sweep(F, iteration)
        else:
            for n in range(self.N):
                F = step(F, n, iteration, evaluate)
        self.F, self.ahead = F, None
        # before the sweep submitted ahead, which becomes ready at the same moment
        summary = self.c.submit(U.summary, F, pure=False, priority=1)
        self.ahead = self._submit_ahead(F, iteration)
        sm = summary.result()
        if sm.finished == self.finished:  # the sweep was skipped where the driver goes on: never expected
            raise RuntimeError(f"iteration {iteration + 1}: the sweep submitted ahead stopped where the driver goes on")
        # a sweep run ahead starts when the one before ends, maybe before the driver has read that
        # one's summary: its iteration is from that end to its own (the worker's clock)
        last = self.N - 1
        self.worker_span = (self.finished[last], sm.finished[last]) if ran_ahead and self.finished else None
        self.finished = sm.finished
        return sm, None

    def _submit_ahead(self, F: Any, iteration: int) -> tuple[int, Any] | None:
        """The next exact sweep, submitted before this one's summary is read, so the worker goes on
        without waiting for the driver; it leaves the state untouched where the driver's test stops
        the run here. Not where this iteration is the last, writes a checkpoint (whose rows must be
        this iteration's), the run is randomized (stopped by the driver's test on its fits), or
        runs inline (where a submitted sweep runs at once: nothing to overlap)."""
        m = self.method
        if (
            self.sweep is None
            or is_inline(self.c)
            or m.randomized
            or ends_or_checkpoints(m.run, iteration, m.o.max_iters)
        ):
            return None
        return iteration + 1, self.sweep(F, iteration + 1, unless_stopped=(m.normX2, m.o.tol, m.fit))

    def checkpoint(self, path: str, weights: np.ndarray, *record: Any) -> float:
        return save_checkpoint(self.c, path, self.F, weights, *record)

    def final(self) -> list[np.ndarray]:
        if self.ahead is not None:  # a sweep after the run converged: it leaves the state as it is
            self.ahead[1].result()
            self.ahead = None
        out = final_factors(self.c, self.F, self.N)
        del self.F
        return out


class OwnerModes:
    """Owner-computes (:mod:`.cp_owner`): each worker keeps its partitions and the factor rows it
    owns, one task per worker and iteration, rows sent worker to worker only where shared."""

    def __init__(self, c: Any, graph: Any, F: Any, method: Any, cleanup: ExitStack) -> None:
        self.engine = start_owner_computes(c, graph, F, method.store.nmodes, sampled=method.randomized)
        cleanup.callback(self.engine.release)  # a run stopped by its callback leaves nothing on the workers
        self.method = method
        self.lower = self.engine.plan.mode_lower_bound_bytes(method.rank, np.dtype(method.o.dtype).itemsize)
        # modes no update has written yet (a sampled mode whose fibers held no nonzero is kept):
        # their rows no nonzero touches are still the initial ones, which no worker holds
        self.unwritten = set(range(method.store.nmodes))
        self.kept_counts: dict[int, int] = {}

    def iterate(self, iteration: int, evaluate: bool) -> tuple[U.Summary, dict]:
        m, o, run = self.method, self.method.o, self.method.run
        # the next iteration goes ahead unless this one ends the run or writes a checkpoint (whose
        # rows must be this iteration's); randomized runs stop by the driver's test on the
        # evaluated fits: never ahead
        last = ends_or_checkpoints(run, iteration, o.max_iters) or m.randomized
        ahead = None if last else (iteration + 1, False, m.normX2, o.tol)
        sampled = m.randomized and iteration >= int(o.warmup)  # randomized runs' exact warm-up first
        sketch = (int(o.samples), m.params["sample_entropy"], evaluate) if sampled else None
        this = (iteration, iteration == 0, m.normX2, o.tol, sketch)
        sm, record = owner_summary(self.engine.iterate(owner_iteration, this, ahead), self.lower)
        kept = {n for n, c in sm.empty_sketches.items() if c > self.kept_counts.get(n, 0)}
        self.kept_counts = dict(sm.empty_sketches)
        self.unwritten &= kept
        return sm, record

    def checkpoint(self, path: str, weights: np.ndarray, *record: Any) -> float:
        m = self.method
        return owner_checkpoint(
            self.engine, path, m.store.shape, m.rank, m.o.dtype, weights, *record, unwritten=frozenset(self.unwritten)
        )

    def final(self) -> list[np.ndarray]:
        m = self.method
        out = owner_factors(self.engine, m.store.shape, m.rank, m.o.dtype, frozenset(self.unwritten))
        self.engine.release()
        return out
