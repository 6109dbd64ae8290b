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


# an owner-computes batch runs about this long (the first iteration alone times it): progress and
# callbacks come once a batch, the driver's and scheduler's per-task costs once a batch too
BATCH_SECONDS = 1.0
MAX_BATCH = 32


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
        self.batch: dict[int, tuple] = {}  # the iterations of the batch read last, not yet recorded
        self.ahead: list[int] | None = None  # the iterations of the batch submitted ahead
        self.size = 1  # iterations a batch: the first alone, then as many as take BATCH_SECONDS
        # where the iteration recorded last ended (the slowest worker's clock); the next starts there
        self.last_end: float | None = None
        self.worker_span: tuple[float, float] | None = None

    def iterate(self, iteration: int, evaluate: bool) -> tuple[U.Summary, dict]:
        if iteration not in self.batch:
            self.batch = self._run_batch(iteration, evaluate)
        sm, record, self.worker_span = self.batch.pop(iteration)
        kept = {n for n, c in sm.empty_sketches.items() if c > self.kept_counts.get(n, 0)}
        self.kept_counts = dict(sm.empty_sketches)
        self.unwritten &= kept
        return sm, record

    def _run_batch(self, iteration: int, evaluate: bool) -> dict[int, tuple]:
        """The iterations from ``iteration`` on that the workers run as one task each: their
        summaries, exchange records and spans (worker clocks). Exact runs batch as many as take
        about ``BATCH_SECONDS``, up to the run's end or its next checkpoint (whose rows must be
        that iteration's), and submit the next batch ahead unless this one ends there; randomized
        runs stop by the driver's test on the evaluated fits: one at a time, never ahead."""
        m, o, run = self.method, self.method.o, self.method.run
        if m.randomized:
            sampled = iteration >= int(o.warmup)  # randomized runs' exact warm-up first
            sketch = (int(o.samples), m.params["sample_entropy"], evaluate) if sampled else None
            its, args, ahead_its = [iteration], [(iteration, iteration == 0, m.normX2, o.tol, sketch)], None
        else:
            its = self.ahead if self.ahead and self.ahead[0] == iteration else self._span(iteration)
            args = [(k, k == 0, m.normX2, o.tol, None) for k in its]
            ahead_its = None if ends_or_checkpoints(run, its[-1], o.max_iters) else self._span(its[-1] + 1)
        ahead = [(k, k == 0, m.normX2, o.tol, None) for k in ahead_its] if ahead_its else None
        per_worker = self.engine.iterate_many(owner_iteration, args, ahead)
        self.ahead = ahead_its
        out, N = {}, m.store.nmodes
        for pos, k in enumerate(its):
            summaries = [s[pos] for s in per_worker]
            if summaries[0].get("skipped"):  # the run stopped at an iteration before
                break
            end = max(s["finished"][N - 1] for s in summaries)
            start = self.last_end if self.last_end is not None else min(s["started"] for s in summaries)
            out[k] = (*owner_summary(summaries, self.lower), (start, end))
            self.last_end = end
        seconds = [span[1] - span[0] for *_, span in out.values()]
        if seconds and not m.randomized:
            self.size = max(1, min(MAX_BATCH, int(BATCH_SECONDS / max(np.median(seconds), 1e-3))))
        return out

    def _span(self, first: int) -> list[int]:
        """The iterations of a batch from ``first``: ``size`` of them, fewer where the run ends or
        checkpoints before."""
        m = self.method
        its = [first]
        while len(its) < self.size and not ends_or_checkpoints(m.run, its[-1], m.o.max_iters):
            its.append(its[-1] + 1)
        return its

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
