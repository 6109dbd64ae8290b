"""Per-mode MTTKRP task graphs over a store: partition tasks, then a tree reduction.

Two execution modes:

- **streaming**: every MTTKRP task reads its partition's chunks from Zarr (with read-ahead, so
  reading and decompression overlap the kernel); nothing stays on the workers between passes.
- **in-memory**: partitions are decoded once into worker memory (futures kept by the driver) and
  MTTKRP tasks run where their partition lives.

``execution="auto"``: given the CP rank, the worker memory plan (:mod:`.memory_plan`) picks the
fastest execution whose peak fits each worker's memory limit (and whether mode updates copy the
factors or overwrite them), or refuses with the smallest limit that works. Without a rank (a bare
MTTKRP graph) it takes in-memory when the decoded partitions use at most half of the cluster's
worker memory, else streaming.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import psutil
from distributed import Client, Future, wait

from ..kernels.mttkrp.plan import DEFAULT_MAX_PRIVATE_BYTES
from ..store import Store
from .cluster import in_this_process
from .fiber_reads import GATHER_BYTES, indexed_sampled_partial
from .inline import is_inline
from .memory_plan import MemoryPlan, MemoryPlanError, candidates, choose, plan_order
from .output_buffers import release_outputs
from .pair_tasks import PairMemo, pair_partition
from .partitions import contiguous_runs, owner_rows, plan_partitions
from .sorted_stream import streamed_copy_modes
from .stream import batch_nnz_for
from .task_graph import (
    DEFAULT_SPLIT_EVERY,
    EXECUTION_MODES,
    PartitionedGraph,
    fits_in_memory,
    tree_reduce,
)
from .tasks import PartitionData, combine, load_partition, mttkrp_partition, row_slice, sampled_partition

log = logging.getLogger(__name__)

# the task graphs' shared names, importable from here as before
__all__ = ["DEFAULT_SPLIT_EVERY", "EXECUTION_MODES", "MTTKRPGraph", "PlanRequest", "tree_reduce"]


def _mttkrp_then(
    update: Callable,
    source,
    factors,
    mode: int,
    threads: int,
    batch_nnz: int,
    device: str,
    device_options,
    max_private_bytes: int,
    args: tuple,
    lend_target: bool = False,
):
    """One task: a partition's MTTKRP, then ``update`` on it (see :meth:`MTTKRPGraph.mode_update`)."""
    partial = mttkrp_partition(
        source,
        factors,
        mode,
        threads,
        batch_nnz=batch_nnz,
        device=device,
        device_options=device_options,
        max_private_bytes=max_private_bytes,
        lend_target=lend_target,
    )
    return update(factors, [partial], mode, *args)


def _modes_then(update: Callable, source, factors, steps: tuple, proceed: Callable | None, *options):
    """One task: ``_mttkrp_then`` for each ``(mode, args)`` of ``steps`` in turn, each on the state
    the one before returned, unless ``proceed(factors)`` is false: then ``factors`` as they are
    (see :meth:`MTTKRPGraph.sweeps_update`). A decoded partition's memoized mode pairs keep their
    memo from a pair's first mode to its second when the steps take them in turn (:mod:`.pair_tasks`)."""
    if proceed is not None and not proceed(factors):
        return factors
    threads, batch_nnz, device, device_options, max_private_bytes, lend_target = options
    memo = PairMemo()
    pairs = source.mode_pairs if isinstance(source, PartitionData) else {}
    for mode, args in steps:
        if mode in pairs:
            factors = update(factors, [pair_partition(source, factors, mode, threads, memo)], mode, *args)
            continue
        memo.forget()
        factors = _mttkrp_then(
            update,
            source,
            factors,
            mode,
            threads,
            batch_nnz,
            device,
            device_options,
            max_private_bytes,
            args,
            lend_target,
        )
    return factors


def _sweeps_then(batch: Callable, update: Callable, source, factors, *options):
    """One task: ``batch(factors, sweep)``, where ``sweep(state, steps)`` is :func:`_modes_then`'s
    fused steps on this partition (see :meth:`MTTKRPGraph.sweeps_update`)."""

    def sweep(state, steps: tuple):
        return _modes_then(update, source, state, steps, None, *options)

    return batch(factors, sweep)


def _done(_: Any) -> None:
    """Nothing, once its argument is ready: a gate that other tasks wait on without receiving it."""
    return None


def _gated(gate: Any, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, run once ``gate`` (futures, or None) is ready."""
    return fn(*args, **kwargs)


def _pass_then(update: Callable, fn: Callable, source, state, fn_args: tuple, args: tuple):
    """One task: a partition pass, then ``update`` on its result (see :meth:`MTTKRPGraph.pass_update`)."""
    return update(state, [fn(source, state, *fn_args)], *args)


def _sampled_then(
    update: Callable,
    source,
    factors,
    samples,
    mode: int,
    threads: int,
    batch_nnz: int,
    exact: bool,
    max_private_bytes: int,
    args: tuple,
):
    """One task: a partition's sampled MTTKRP (and with ``exact`` its exact MTTKRP, for the fit),
    then ``update`` (see :meth:`MTTKRPGraph.sampled_mode_update`)."""
    partial = sampled_partition(source, samples, mode, threads, batch_nnz)
    full = (
        [mttkrp_partition(source, factors, mode, threads, batch_nnz=batch_nnz, max_private_bytes=max_private_bytes)]
        if exact
        else None
    )
    return update(factors, [partial], mode, *args, sketch=samples, exact=full)


def _device_limit(device_options) -> int:
    """Run on a GPU worker: the device memory its tasks may use."""
    from .device_stream import DeviceOptions

    return (device_options or DeviceOptions()).memory_limit()


def _rss() -> int:
    """Run on a worker: its process's resident bytes."""
    return psutil.Process().memory_info().rss


@dataclass(frozen=True)
class PlanRequest:
    """What a graph's worker memory plan was asked for (an owner-computes run plans again from it)."""

    execution: str
    rank: int | None
    dtype: str
    samples: int


class MTTKRPGraph(PartitionedGraph):
    """Builds and submits MTTKRP graphs for one store on one Dask cluster.

    Parameters
    ----------
    client : distributed.Client
    path : str
        Store (used as opened) or its path or URL (workers open it themselves).
    execution : {"auto", "streaming", "in-memory"}
    partitions : int, optional
        Number of partition tasks (default: 1 per Dask thread, more if a partition would exceed
        ``max_partition_nnz``).
    split_every : int
        Fan-in of the tree reduction.
    max_partition_nnz : int
        Largest partition, bounding one task's memory.
    device : {"auto", "cpu", "gpu"}
        Where partition tasks run: "gpu" places them on GPU workers (``GPU`` resource, or the
        workers that can run GPU kernels); "auto" does so when the cluster has real GPUs.
    device_options : DeviceOptions, optional
        GPU kernel and streaming settings (:class:`tensorflow_ooc.execution.DeviceOptions`).
    rank, dtype : int and str, optional
        The CP rank and factor dtype: with a rank, CPU graphs follow the worker memory plan
        (``self.memory_plan``; :class:`~.memory_plan.MemoryPlanError` when nothing fits).
    samples : int
        Randomized CP-ALS: Khatri-Rao rows drawn per mode (the plan counts its samplers and indexes).
    load : bool
        Load in-memory partitions now (False: only plan them, for an owner-computes run whose
        workers load their own, :mod:`.owner_computes`).
    keep_target : bool
        The mode update reads the target mode's old rows (nonnegative CP's HALS warm start): they
        are never lent to the MTTKRP as scratch (``lend_target``), and the plan counts no lending.
    """

    def __init__(
        self,
        client: Client,
        path: str | Store,
        *,
        execution: str = "auto",
        partitions: int | None = None,
        split_every: int = DEFAULT_SPLIT_EVERY,
        max_partition_nnz: int = 1 << 26,
        device: str = "cpu",
        device_options: object | None = None,
        rank: int | None = None,
        dtype: str = "float64",
        samples: int = 0,
        load: bool = True,
        sampler: str = "sts",
        keep_target: bool = False,
        memo_pairs: bool = False,
    ) -> None:
        self.device_options = device_options
        self.memo_pairs = bool(memo_pairs)
        self.sampler = sampler
        super().__init__(
            client,
            path,
            execution=execution,
            partitions=partitions,
            split_every=split_every,
            max_partition_nnz=max_partition_nnz,
            device=device,
        )
        res = self.resources
        decoded = sum(p.decoded_bytes(self.store.nmodes) for p in self.parts)
        budget = self.task_placement.memory_budget
        if self.device == "gpu":
            dev_limits = client.run(_device_limit, device_options, workers=self.task_placement.gpu_workers)
            budget = sum(dev_limits.values())
        self._batch_nnz_cap = batch_nnz_for(self.task_placement.smallest_limit)  # what the limits allow
        self.batch_nnz = self._batch_nnz_cap
        self.max_private_bytes = DEFAULT_MAX_PRIVATE_BYTES
        # one worker running one task at a time: workers of one process may share a state object
        # (in-process transfers pass it by reference), so lending needs a single worker
        self._one_task_at_a_time = len(res) == 1 and all(r["dask_threads"] == 1 for r in res.values())
        self._may_lend = self._one_task_at_a_time and not keep_target
        # a plan of one partition task at a time (memory_plan's single_task) may lend as well: its
        # one partition task a mode is the only one that writes the target rows
        self._keep_target = bool(keep_target)
        self.memory_plan: MemoryPlan | None = None
        self._asked = PlanRequest(execution, rank, dtype, int(samples))  # for plan_owner_computes
        self.memory_plan_error: MemoryPlanError | None = None
        if rank is not None and self.device == "cpu":
            try:
                self.memory_plan = self._plan_memory(
                    client, res, int(rank), np.dtype(dtype).itemsize, execution, int(samples)
                )
            except MemoryPlanError as exc:
                if len(res) == 1:
                    raise
                # several workers: an owner-computes run needs less of each (its own plan says
                # whether it fits); a run of these task graphs raises this (require_plan)
                self.memory_plan_error = exc
        if self.memory_plan is not None:
            execution = self._adopt(self.memory_plan, "memory plan")
        elif self.memory_plan_error is not None:
            execution = "streaming"
        elif execution == "auto":
            execution = "in-memory" if fits_in_memory(decoded, budget) else "streaming"
        self.execution = execution
        self.in_place = bool(self.memory_plan and self.memory_plan.in_place)
        # exact CP-ALS mode updates may lend the target mode's factor rows to the MTTKRP as a
        # per-thread output copy (ThreadOutputs) when the update overwrites them in place and no
        # other task can read them meanwhile
        self.lend_target = self.in_place and self._lends(bool(self.memory_plan and self.memory_plan.single_task))
        # several CPU workers: partials are reduce-scattered instead of tree-reduced onto one
        self.scatter_reduce = len(res) > 1 and self.device == "cpu"
        log.info(
            "MTTKRP graph: %d partitions on %s, %s execution (decoded %.1f MiB, %s memory %s), "
            "%d numba threads per task",
            len(self.parts),
            self.device,
            execution,
            decoded / 2**20,
            "device" if self.device == "gpu" else "worker",
            "unlimited" if budget is None else f"{budget / 2**20:.0f} MiB",
            self.numba_threads,
        )
        if execution == "in-memory" and load:
            self.load()

    def load(self) -> None:
        """Decode the partitions into worker memory (in-memory execution)."""
        self.data = [self._load(p) for p in self.parts]
        if not is_inline(self.client):
            wait(self.data)

    def _load(self, part) -> Future:
        """Submit the task that holds ``part`` in worker (or device) memory for in-memory execution."""
        copies = bool(self.memory_plan and self.memory_plan.mode_copies)
        pairs = bool(copies and self.memory_plan.mode_pairs)
        # which small modes keep a copy depends on the rank (mode_order.copy_order)
        rank = self._asked.rank if copies else None
        return self.client.submit(
            load_partition,
            self.path,
            part,
            self.device,
            self.device_options,
            copies,
            self.numba_threads,
            pairs,
            rank,
            key=f"tfooc-partition-{self.store.meta['store_id']}-{self.device}-{part.id}"
            + ("-sorted" if copies else "")
            + ("-pairs" if pairs else "")
            + (f"-r{rank}" if rank else ""),
            **self.placement,
        )

    def require_plan(self) -> None:
        """Raise the memory plan's refusal of these task graphs, if it refused them (a run that
        goes owner-computes plans again instead, :meth:`plan_owner_computes`)."""
        if self.memory_plan_error is not None:
            raise self.memory_plan_error

    def plan_owner_computes(self) -> None:
        """Plan the worker memory again for an owner-computes run of these workers (no state copies
        or whole factors in transit; one task a worker with all its cores), choosing its
        execution: its in-memory partitions are each worker's share, where the task graphs' plan
        would have streamed (STS-CP at 86 M on 2 workers of 12 GB: in memory, not 17.7 s/it
        streaming the whole store for each mode's sampled fibers)."""
        asked = self._asked
        if asked.rank is None or self.device != "cpu":
            return
        self.memory_plan = self._plan_memory(
            self.client,
            self.resources,
            int(asked.rank),
            np.dtype(asked.dtype).itemsize,
            asked.execution,
            asked.samples,
            owner=True,
        )
        self.execution = self._adopt(self.memory_plan, "owner-computes memory plan")
        self.in_place = self.lend_target = False

    def _adopt(self, plan: MemoryPlan, what: str) -> str:
        """Take ``plan``'s batch size and private bound, log it, and return its execution."""
        self.batch_nnz = min(self._batch_nnz_cap, plan.batch_nnz)
        self.max_private_bytes = plan.max_private_bytes
        if plan.single_task:
            self.numba_threads = plan.kernel_threads
        if plan.execution == "streaming" and self.device == "cpu" and isinstance(self.store, Store):
            # the plan names the modes its sparse streamed passes read from mode-sorted copies
            plan.streamed_copies = tuple(streamed_copy_modes(self.store))
        # the figures ride along for the run's events: the monitoring page sets each worker's
        # limit against the plan's peak
        log.info("%s: %s", what, plan.describe(), extra={"memory_plan": plan.as_dict()})
        return plan.execution

    def _plan_memory(
        self,
        client: Client,
        res: dict,
        rank: int,
        itemsize: int,
        execution: str,
        samples: int = 0,
        owner: bool = False,
    ) -> MemoryPlan:
        """The worker memory plan for a rank-``rank`` CP-ALS. In-memory executions keep this graph's
        partitions (capped so one decoded partition stays small); streaming ones take one partition
        per Dask thread, uncapped (a streaming task holds one batch, not its partition), so a
        single-threaded worker sums no partials. The chosen plan's partitions replace ``self.parts``."""
        baseline = max(client.run(_rss).values(), default=0)
        nworkers = len(res)
        limits = [r["memory_limit"] for r in res.values()]
        threads = min(r["dask_threads"] for r in res.values())
        plans: list[MemoryPlan] = []
        parts_of: dict[int, list] = {}
        common = dict(
            owner=owner,
            rank=rank,
            itemsize=itemsize,
            workers=nworkers,
            baseline=baseline,
            limit=min(limits) if all(limits) else None,
            split_every=self.split_every,
        )
        for mode in ("in-memory", "streaming"):
            if execution not in ("auto", mode):
                continue
            parts = self.parts if mode == "in-memory" else self._streaming_parts(itemsize)
            per_worker = math.ceil(len(parts) / nworkers)
            found = self._candidates(
                parts,
                per_worker,
                samples,
                # owner-computes: one task a worker, its kernels on all the worker's cores
                tasks=1 if owner else max(1, min(threads, per_worker)),
                partitions_per_mode=len(parts),
                execution=mode,
                **common,
            )
            parts_of.update({id(p): parts for p in found})
            # (a single partition runs one task at a time already)
            one = None if owner or len(parts) < 2 else self._single_task_parts(mode)
            if one is not None:
                # one partition task at a time on all the worker's cores: one output of the mode
                # and no partials to sum, where a task per Dask thread holds one each and their sum
                cores = sum(r["numba_threads"] * r["dask_threads"] for r in res.values())
                single = self._candidates(
                    one,
                    1,
                    samples,
                    tasks=1,
                    partitions_per_mode=1,
                    execution=mode,
                    single_task=True,
                    kernel_threads=cores,
                    **common,
                )
                parts_of.update({id(p): one for p in single})
                found += single
            plans += found
        plans.sort(key=plan_order)
        if is_inline(client) or in_this_process(res):
            # in this process nothing recomputes an earlier state (no worker can be lost alone: the
            # inline scheduler, or the embedded in-process cluster), so the copy a mode update makes
            # to keep earlier futures valid buys nothing; updating in place also spares a fresh
            # state allocation per mode and lends the target rows to the MTTKRP (docs/EXECUTION.md)
            plans.sort(key=lambda p: not p.in_place)
        plan = choose(plans, f"a rank-{rank} CP-ALS of {self.path}")
        self.parts = parts_of[id(plan)]
        return plan

    def _streaming_parts(self, itemsize: int) -> list:
        """The partitions of a streaming execution: one per Dask thread, uncapped."""
        return plan_partitions(self.store, self.n_parts, None)

    def _single_task_parts(self, execution: str) -> list | None:
        """The one partition of an ``execution`` run as one task at a time on all of a worker's
        cores, where that is a plan of its own: one CPU worker of several Dask threads, partitions
        not fixed by the caller, and (in memory) the store within one partition's cap. None elsewhere."""
        res = self.resources
        if self.device != "cpu" or self.partitions_asked or len(res) != 1:
            return None
        if all(r["dask_threads"] <= 1 for r in res.values()):
            return None
        parts = plan_partitions(self.store, 1, self.max_partition_nnz if execution == "in-memory" else None)
        return parts if len(parts) == 1 else None

    def _candidates(
        self, parts: list, per_worker: int, samples: int, owner: bool = False, **common
    ) -> list[MemoryPlan]:
        """The memory plans of one execution with these partitions (``common``: the arguments every
        plan takes, see :func:`~.memory_plan.candidates`)."""
        res = self.resources
        if owner:
            common["owner_rows"] = owner_rows(contiguous_runs(parts, len(res)), tuple(self.store.shape))
        common.setdefault("kernel_threads", self._kernel_threads(owner))
        return candidates(
            shape=tuple(self.store.shape),
            worker_nnz=per_worker * max((p.nnz for p in parts), default=0),
            chunk_nnz=self.store.chunk_nnz,
            value_itemsize=self.store.value_dtype.itemsize,
            samples=samples,
            trees=self.sampler == "sts",
            index_reads=GATHER_BYTES if self.store.fiber_modes() else 0,
            index_filters=self.store.fibers.bloom_bytes(samples=samples) if self.store.fiber_modes() else 0,
            lend_target=self._lends(common.get("single_task", False)) and not owner,
            owner=owner,
            memo_pairs=self.memo_pairs,
            **common,
        )

    def _lends(self, single_task: bool) -> bool:
        """Whether in-place updates may lend the target rows: one task at a time runs on this
        worker (one worker of one Dask thread, or a single-task plan) and the caller keeps no target."""
        return self._may_lend or (single_task and not self._keep_target)

    def _kernel_threads(self, owner: bool) -> int:
        """Numba threads of a partition task: an owner-computes worker's one task takes all its cores."""
        if owner:
            return min(r["numba_threads"] * r["dask_threads"] for r in self.resources.values())
        return self.numba_threads

    def partials(
        self, factors: Future, mode: int, lend_target: bool = False, after: list[Future] | None = None
    ) -> list[Future]:
        """Submit the mode-``mode`` MTTKRP up to the last level of its reduction: at most
        ``split_every`` futures of :class:`Partial`, which the consumer sums (the CP-ALS update
        does, saving one task hop per mode). ``lend_target``: see ``mttkrp_partition``.
        ``after``: futures the partition tasks wait for (their results are not sent to them)."""
        head: tuple = (mttkrp_partition,)
        if after is not None:
            head = (_gated, [self.client.submit(_done, f, pure=False, **self.placement) for f in after], *head)
        partials = [
            self.client.submit(
                *head,
                src,
                factors,
                mode,
                self.numba_threads,
                batch_nnz=self.batch_nnz,
                max_private_bytes=self.max_private_bytes,
                lend_target=lend_target,
                device=self.device,
                device_options=self.device_options,
                pure=False,
                **self.placement,
            )
            for src in self.sources()
        ]
        if self.scatter_reduce and len(partials) > 1:
            return self.reduce_scatter(partials, self.store.shape[mode])
        return self.reduce(partials, last=True)

    def reduce_scatter(self, futures: list[Future], nrows: int) -> list[Future]:
        """Sum ``futures`` (partials of an ``nrows``-row output) as disjoint row slices, one per
        worker: each partial is cut where it lies (views) and worker k sums slice k of all of
        them, so no worker gathers whole partials; the consumer receives the slices, one output's
        worth in all. Slices follow the partials' order, so sums are reproducible."""
        workers = sorted(self.resources)
        W = len(workers)
        bounds = [nrows * k // W for k in range(W + 1)]
        out = []
        for k, addr in enumerate(workers):
            pieces = [self.client.submit(row_slice, f, bounds[k], bounds[k + 1], pure=False) for f in futures]
            out.append(self.client.submit(combine, *pieces, pure=False, workers=[addr], allow_other_workers=True))
        return out

    def mode_update(self, factors: Future, mode: int, update: Callable, *args) -> Future:
        """Submit the mode-``mode`` MTTKRP followed by ``update(factors, partials, mode, *args)``.

        With a single partition (the embedded default has one Dask thread) both run as one task,
        one scheduling hop per mode instead of two; otherwise the partition tasks, the reduction
        and the update task. Returns the future of ``update``'s result."""
        sources = self.sources()
        if len(sources) == 1:
            return self.client.submit(
                _mttkrp_then,
                update,
                sources[0],
                factors,
                mode,
                self.numba_threads,
                self.batch_nnz,
                self.device,
                self.device_options,
                self.max_private_bytes,
                args,
                self.lend_target,
                pure=False,
                **self.placement,
            )
        return self.client.submit(
            update, factors, self.partials(factors, mode, self.lend_target), mode, *args, pure=False, **self.placement
        )

    def fuses_modes(self) -> bool:
        """Whether :meth:`sweeps_update` runs whole sweeps over the modes as one task: a single
        partition, so each mode is one task anyway and the next needs nothing but its result."""
        return len(self.sources()) == 1

    def sweeps_update(self, factors: Future, update: Callable, batch: Callable) -> Future:
        """Submit, as one task, ``batch(factors, sweep)``: ``sweep(state, steps)`` runs, for each
        ``(mode, args)`` of ``steps`` in turn, :meth:`mode_update`'s fused task
        (``update(state, partials, mode, *args)`` after the mode's MTTKRP, each on the state the
        one before returned) and returns the state after them, as often as ``batch`` calls it:
        several iterations' sweeps in one task (each task cost the in-process cluster 4-5 ms of
        CPU on the kernels' cores). Only where :meth:`fuses_modes`. Returns the future of what
        ``batch`` returns."""
        if not self.fuses_modes():
            raise ValueError("sweeps_update takes a graph of one partition (see fuses_modes)")
        source = self.sources()[0]
        return self.client.submit(
            _sweeps_then, batch, update, source, factors, *self._fused_options(), pure=False, **self.placement
        )

    def _fused_options(self) -> tuple:
        return (
            self.numba_threads,
            self.batch_nnz,
            self.device,
            self.device_options,
            self.max_private_bytes,
            self.lend_target,
        )

    def reads_fiber_index(self, mode: int) -> bool:
        """Whether mode ``mode``'s sampled rounds read the store's fiber index: a streamed run of a
        store indexed in that mode (in memory, each partition keeps its own index)."""
        return self.execution == "streaming" and self.device == "cpu" and mode in self.store.fiber_modes()

    def sampled_reads(self) -> dict[str, str]:
        """Per mode, how a sampled round finds its fibers: "index" (the store's fiber index),
        "memory" (each in-memory partition's) or "scan" (every nonzero streamed past the samples)."""
        return {
            str(m): "index" if self.reads_fiber_index(m) else ("memory" if self.execution == "in-memory" else "scan")
            for m in range(self.store.nmodes)
        }

    def local_partitions(self) -> list[Future] | None:
        """The futures of the decoded partitions when one task may read them all where they are
        (in memory on one CPU worker that runs one task at a time): a sampled update then gathers
        them in that one task (:mod:`.concurrent_gather`); None otherwise."""
        if self.data is None or self.device != "cpu" or not self._one_task_at_a_time:
            return None
        return list(self.data)

    def sampled_mode_update(
        self, factors: Future, samples: Future, mode: int, update: Callable, exact: bool, *args
    ) -> Future:
        """Randomized CP-ALS: submit the mode-``mode`` sampled MTTKRP of the drawn ``samples``
        (with ``exact`` also the exact MTTKRP, whose inner products give the fit), then
        ``update(factors, partials, mode, *args, sketch=samples, exact=exact_partials)``; one task
        when there is one partition. Runs on CPU workers."""
        sources = self.sources()
        if self.reads_fiber_index(mode):
            sampled = self.sampled_partials(samples, mode)
            return self.client.submit(
                update,
                factors,
                sampled,
                mode,
                *args,
                sketch=samples,
                # the fit's exact pass after the gather, not beside it: run together they shared
                # the worker's cores, and the round's time (less the pass's) kept 0.5 s of the pass
                exact=self.partials(factors, mode, after=sampled) if exact else None,
                pure=False,
                **self.placement,
            )
        if len(sources) == 1:
            return self.client.submit(
                _sampled_then,
                update,
                sources[0],
                factors,
                samples,
                mode,
                self.numba_threads,
                self.batch_nnz,
                exact,
                self.max_private_bytes,
                args,
                pure=False,
                **self.placement,
            )
        partials = [
            self.client.submit(
                sampled_partition,
                src,
                samples,
                mode,
                self.numba_threads,
                batch_nnz=self.batch_nnz,
                pure=False,
                **self.placement,
            )
            for src in sources
        ]
        full = self.partials(factors, mode) if exact else None
        return self.client.submit(
            update,
            factors,
            self.reduce(partials, last=True),
            mode,
            *args,
            sketch=samples,
            exact=full,
            pure=False,
            **self.placement,
        )

    def sampled_partials(self, samples: Future, mode: int, threads: int | None = None) -> list[Future]:
        """The mode-``mode`` sampled MTTKRP of the drawn ``samples`` (CP's or the tensor train's), reduced
        to the last level: through the store's fiber index where :meth:`reads_fiber_index` (one share
        of the sample keys a worker, each reading only the chunks of its fibers), else a pass over
        every partition. ``threads``: numba threads a task (default the graph's; through the index,
        a worker's cores)."""
        if not self.reads_fiber_index(mode):
            threads = self.numba_threads if threads is None else int(threads)
            return self.partition_pass(sampled_partition, samples, mode, threads, self.batch_nnz)
        if threads is None:
            # the worker's one gather task runs alone between the draw and the update: on one
            # numba thread (its cores over its Dask threads) the worker's other cores idled
            threads = min(int(r["numba_threads"]) * int(r["dask_threads"]) for r in self.resources.values())
        shares = max(1, len(self.resources))
        partials = [
            self.client.submit(
                indexed_sampled_partial,
                self.path,
                samples,
                mode,
                threads,
                (k, shares),
                pure=False,
                **self.placement,
            )
            for k in range(shares)
        ]
        return self.reduce(partials, last=True)

    def partition_pass(self, fn: Callable, state: Future, *args, reduce: Callable = combine) -> list[Future]:
        """Submit ``fn(source, state, *args)`` on every partition and reduce the results by
        ``reduce`` down to the last level (at most ``split_every`` futures, for the consumer to
        sum): the passes of CP-APR (:mod:`.apr_tasks`)."""
        futures = [self.client.submit(fn, src, state, *args, pure=False, **self.placement) for src in self.sources()]
        return tree_reduce(self.client, futures, reduce, self.split_every, last=True)

    def pass_update(self, fn: Callable, fn_args: tuple, update: Callable, state: Future, *args) -> Future:
        """Submit a :meth:`partition_pass` of ``fn`` then ``update(state, parts, *args)``; one task
        when there is one partition (as :meth:`mode_update`). Returns the future of ``update``'s result."""
        sources = self.sources()
        if len(sources) == 1:
            return self.client.submit(
                _pass_then, update, fn, sources[0], state, fn_args, args, pure=False, **self.placement
            )
        parts = self.partition_pass(fn, state, *fn_args)
        return self.client.submit(update, state, parts, *args, pure=False, **self.placement)

    def mttkrp(self, factors: Future, mode: int) -> Future:
        """Submit the mode-``mode`` MTTKRP; returns the future of the reduced :class:`Partial`."""
        return self.reduce(self.partials(factors, mode))[0]

    def reduce(self, futures: list[Future], last: bool = False) -> list[Future]:
        """Tree reduction by :func:`~tensorflow_ooc.execution.tasks.combine` (see :func:`tree_reduce`),
        down to one future, or with ``last`` to the last level (at most ``split_every``)."""
        return tree_reduce(self.client, futures, combine, self.split_every, last)

    def release(self) -> None:
        """Drop decoded partitions from worker memory."""
        # dropping the futures releases the data; an explicit cancel races with running tasks
        self.data = None
        try:
            self.client.run(release_outputs)
        except Exception as exc:  # a worker lost at the end keeps nothing anyway
            log.debug("could not release kept output buffers: %s", exc)
