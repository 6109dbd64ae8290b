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
from .cp_steps import exact_step, exact_sweeps, final_factors, randomized_step, save_checkpoint
from .randomized import with_trees

# a batch of iterations runs about this long as one task a worker (the first iteration alone
# times one): progress and callbacks come once a batch, Dask's per-task costs once a batch too
BATCH_SECONDS = 1.0
MAX_BATCH = 32


class Batches:
    """How many iterations a task runs: the first alone, then as many as take about
    ``BATCH_SECONDS``, never past the run's end or a checkpoint (whose rows must be that
    iteration's)."""

    def __init__(self, run: Any, max_iters: int) -> None:
        self.run, self.max_iters, self.size = run, max_iters, 1

    def span(self, first: int) -> list[int]:
        """The iterations of a batch from ``first``."""
        its = [first]
        while len(its) < self.size and not self.last(its[-1]):
            its.append(its[-1] + 1)
        return its

    def last(self, iteration: int) -> bool:
        """Whether no iteration may run after ``iteration`` in its batch or ahead of the driver."""
        return ends_or_checkpoints(self.run, iteration, self.max_iters)

    def timed(self, seconds: list[float]) -> None:
        """The batch size for iterations of these ``seconds``."""
        if seconds:
            self.size = max(1, min(MAX_BATCH, int(BATCH_SECONDS / max(float(np.median(seconds)), 1e-3))))


class GraphModes:
    """Each mode its MTTKRP graph and one update task beside the model state ``F`` (a future): a
    whole iteration is submitted at once, so the modes follow each other on the cluster with no
    round trip to the driver, which reads the small summary once per iteration. Exact sweeps of a
    one-partition graph (the embedded default) run in batches, each one task (:class:`Batches`)."""

    def __init__(self, c: Any, graph: Any, F: Any, method: Any) -> None:
        o, on_cluster = method.o, graph.placement  # update tasks run where the MTTKRP partials are made
        if graph.device == "gpu":
            F = c.submit(U.on_device, F, pure=False, **on_cluster)
        N = method.store.nmodes
        self.nonneg = U.NonNegative(o.reg) if o.nonnegative else None
        self.exact = partial(exact_step, graph, N, nonneg=self.nonneg)
        self.step, self.warmup = self.exact, 0
        if method.randomized:
            if o.method == "sts":
                F = c.submit(with_trees, F, pure=False, **on_cluster)
            self.step = partial(randomized_step, c, graph, N, o.method, o.samples, method.params["sample_entropy"])
            self.warmup = int(o.warmup)
        # exact sweeps of a one-partition graph run as one task (one scheduling hop, not one a
        # mode), several iterations' sweeps a task where the run is exact
        self.fused = graph.fuses_modes()
        self.batches = Batches(method.run, o.max_iters)
        self.batch: dict[int, tuple] = {}  # iterations of the batch read last, not yet recorded
        self.ahead: tuple[list[int], Any] | None = None  # (iterations, their future) submitted ahead
        # where the sweep recorded last ended (the worker's clock): the next one's span starts there
        self.last_end: float | None = None
        self.worker_span: tuple[float, float] | None = None
        self.c, self.graph, self.F, self.N, self.method = c, graph, F, N, method

    def iterate(self, iteration: int, evaluate: bool) -> tuple[U.Summary, None]:
        step = self.exact if iteration < self.warmup else self.step  # randomized runs' exact warm-up
        if self.fused and step is self.exact and not self.method.randomized:
            if iteration not in self.batch:
                self.batch = self._run_batch(iteration)
            sm, self.worker_span = self.batch.pop(iteration)
            return sm, None
        F = self.F
        if self.fused and step is self.exact:  # a randomized run's exact warm-up: one sweep a task
            F = self._sweeps(F, [iteration], False, iteration - 1)
        else:
            for n in range(self.N):
                F = step(F, n, iteration, evaluate)
        self.F = F
        sm = self.c.submit(U.summary, F, pure=False, priority=1).result()
        self.worker_span, self.last_end = None, sm.finished[self.N - 1]
        return sm, None

    def _sweeps(self, F: Any, its: list[int], ahead: bool, known: int) -> Any:
        """Submit the sweeps ``its``; ``known``: the iteration whose fit the driver knows (m.fit)."""
        m = self.method
        stop = (m.normX2, m.o.tol, known, m.fit)
        return exact_sweeps(self.graph, self.N, F, its, stop, ahead, nonneg=self.nonneg)

    def _run_batch(self, iteration: int) -> dict[int, tuple]:
        """The sweeps from ``iteration`` on as one task: their summaries and spans (the worker's
        clock, from the end of the sweep before). The next batch goes ahead, before this one's
        summaries are read, unless this one ends the run or writes a checkpoint, or the run is
        inline (where a submitted task runs at once: nothing to overlap); it skips its sweeps where
        the driver's test stops the run."""
        if self.ahead is not None and self.ahead[0][0] == iteration:
            its, F = self.ahead
        else:
            its = self.batches.span(iteration)
            F = self._sweeps(self.F, its, False, iteration - 1)
        self.F, self.ahead = F, None
        # before the batch submitted ahead, which becomes ready at the same moment
        summaries = self.c.submit(U.sweep_summaries, F, pure=False, priority=1)
        if not (is_inline(self.c) or self.batches.last(its[-1])):
            nxt = self.batches.span(its[-1] + 1)
            self.ahead = (nxt, self._sweeps(F, nxt, True, iteration - 1))
        got = summaries.result()
        out = {}
        for k in its:
            if k not in got:  # the run stopped at a sweep before: the driver stops there too
                break
            end = got[k].finished[self.N - 1]
            out[k] = (got[k], (self.last_end, end) if self.last_end is not None else None)
            self.last_end = end
        if not out:
            raise RuntimeError(f"iteration {iteration + 1}: the sweep submitted ahead stopped where the driver goes on")
        # a sweep with no end before it (the run's first) is timed by its kernels and updates
        self.batches.timed(
            [span[1] - span[0] if span else sum(map(sum, sm.timings.values())) for sm, span in out.values()]
        )
        return out

    def checkpoint(self, path: str, weights: np.ndarray, *record: Any) -> float:
        return save_checkpoint(self.c, path, self.F, weights, *record)

    def final(self) -> list[np.ndarray]:
        if self.ahead is not None:  # sweeps after the run converged: they leave the state as it is
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
        self.batch: dict[int, tuple] = {}  # the iterations of the batch read last, not yet recorded
        self.ahead: list[int] | None = None  # the iterations of the batch submitted ahead
        self.batches = Batches(method.run, method.o.max_iters)
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
        m, o = self.method, self.method.o
        if m.randomized:
            sampled = iteration >= int(o.warmup)  # randomized runs' exact warm-up first
            sketch = (int(o.samples), m.params["sample_entropy"], evaluate) if sampled else None
            its, args, ahead_its = [iteration], [(iteration, iteration == 0, m.normX2, o.tol, sketch)], None
        else:
            its = self.ahead if self.ahead and self.ahead[0] == iteration else self.batches.span(iteration)
            args = [(k, k == 0, m.normX2, o.tol, None) for k in its]
            ahead_its = None if self.batches.last(its[-1]) else self.batches.span(its[-1] + 1)
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
        if not m.randomized:
            self.batches.timed([span[1] - span[0] for *_, span in out.values()])
        return out

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
