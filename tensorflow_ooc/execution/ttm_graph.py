"""Per-mode TTM-chain task graphs over a store: partition tasks, then a tree reduction by merge.

Tucker HOOI needs, for every mode ``n``, ``Y = X x_{m != n} U_m^T``: semi-sparse, one dense row
of ``prod_{m != n} J_m`` entries per non-empty mode-``n`` slice. It is a sum over nonzeros, so
each partition's chunks give a partial ``Y`` (rows for the slices its nonzeros touch) and the
partials are merged (row union, blocks summed) by a fixed-order tree reduction, as MTTKRP
partials are in :mod:`.graph`.

The partitions and execution modes are those of the MTTKRP graph: ``in-memory`` decodes each
partition's nonzeros into COO once and keeps them on a worker (the TTM kernels keep their
per-mode sort or unfolding beside them, so it is made once per run); ``streaming`` reads the
partition's chunks on every pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from distributed import Client, Future, wait

from ..kernels.ttm.chain import SemiSparse, TTMLayouts, merge, merge_many, ttm_chain
from ..store import Store
from .inline import is_inline
from .partitions import Partition
from .stream import BATCH_NNZ, batch_nnz_for
from .task_graph import DEFAULT_SPLIT_EVERY, PartitionedGraph, fits_in_memory, tree_reduce
from .tasks import cached_store

log = logging.getLogger(__name__)


@dataclass
class CooPartition:
    """A partition's nonzeros decoded to COO and kept in worker memory (in-memory execution), as
    a :class:`~tensorflow_ooc.kernels.ttm.chain.TTMLayouts`: the sorted layout of each mode is built on
    the first pass and reused by every later iteration."""

    part: Partition
    layouts: TTMLayouts


@dataclass
class TTMPartial:
    """A partial (or reduced) ``Y`` of one mode; the seconds of the slowest partition task that
    went into it (the TTM time the history reports) and, of those, the seconds its kernels spent
    building layouts (sorting, done once per mode in memory, on every pass when streaming)."""

    y: SemiSparse
    seconds: float = 0.0
    layout_seconds: float = 0.0


def decoded_bytes(nnz: int, nmodes: int) -> int:
    """Worker memory of decoded in-memory partitions at most: COO (``8 (N + 1)`` bytes a nonzero)
    and one sorted layout per mode (columns, values, fiber index and pointers: at most
    ``8 (N + 2)`` bytes a nonzero each)."""
    return int(nnz) * 8 * ((nmodes + 1) + nmodes * (nmodes + 2))


def read_coo(path: str, chunk_lo: int, chunk_hi: int) -> TTMLayouts:
    """Nonzeros of chunks ``[chunk_lo, chunk_hi)``, validated against the store's chunk range
    table as they are read (so damaged data never reaches a kernel)."""
    store = cached_store(path)
    chunks = [store.read_chunk(c) for c in range(chunk_lo, chunk_hi)]
    if chunks:
        coords = np.concatenate([ch.coords(store.layout) for ch in chunks])
        values = np.concatenate([ch.values for ch in chunks])
    else:
        coords, values = np.zeros((0, store.nmodes), dtype=np.int64), np.zeros(0, dtype=store.value_dtype)
    return TTMLayouts(coords, values, store.shape, validate=False)


def load_coo_partition(path: str, part: Partition) -> CooPartition:
    """Read and decode a partition (kept on the worker)."""
    return CooPartition(part, read_coo(path, part.chunk_lo, part.chunk_hi))


def ttm_partition(
    source: CooPartition | tuple[str, Partition],
    factors: Sequence[np.ndarray | None],
    mode: int,
    threads: int = 1,
    batch_nnz: int = BATCH_NNZ,
    kernel: str | None = None,
    device: str = "cpu",
) -> TTMPartial:
    """``X_p x_{m != mode} U_m^T`` of one partition ``X_p``: from its decoded layouts (in-memory)
    or by streaming its chunks, about ``batch_nnz`` nonzeros at a time, the batches' results
    merged (streaming). With ``device="gpu"`` the sparse TTM that starts each chain runs on this
    worker's GPU."""
    t0 = time.perf_counter()
    stats: dict = {}
    if isinstance(source, CooPartition):
        y = ttm_chain(source.layouts, factors, mode, kernel=kernel, device=device, threads=threads, stats=stats)
        layout_s = stats["layout_seconds"]
    else:
        path, part = source
        store = cached_store(path)
        per = max(1, int(batch_nnz) // store.chunk_nnz)
        y, layout_s = None, 0.0
        for c in range(part.chunk_lo, part.chunk_hi, per):
            yb = ttm_chain(
                read_coo(path, c, min(part.chunk_hi, c + per)),
                factors,
                mode,
                kernel=kernel,
                device=device,
                threads=threads,
                stats=stats,
            )
            layout_s += stats["layout_seconds"]
            y = yb if y is None else merge(y, yb)
        if y is None:  # partitions always hold chunks; an empty result keeps the types total
            y = ttm_chain(read_coo(path, 0, 0), factors, mode, kernel=kernel, threads=threads)
    return TTMPartial(y, time.perf_counter() - t0, layout_s)


def merge_partials(*partials: TTMPartial) -> TTMPartial:
    """Merge partials (row union, blocks summed) in the order given."""
    y = merge_many([p.y for p in partials]) if len(partials) > 1 else partials[0].y
    return TTMPartial(y, max(p.seconds for p in partials), max(p.layout_seconds for p in partials))


def _ttm_then(
    update: Callable,
    source,
    state,
    mode: int,
    threads: int,
    batch_nnz: int,
    kernel: str | None,
    device: str,
    args: tuple,
):
    """One task: a partition's TTM chain, then ``update`` on it (see :meth:`TTMGraph.mode_update`)."""
    partial = ttm_partition(source, state.chain_factors(mode), mode, threads, batch_nnz, kernel, device)
    return update(state, [partial], mode, *args)


class TTMGraph(PartitionedGraph):
    """Builds and submits TTM-chain graphs for one store on one Dask cluster.

    Parameters
    ----------
    client : distributed.Client (or the in-process client of :mod:`.inline`)
    path : str
        Store (used as opened) or its path or URL (workers open it themselves).
    execution : {"auto", "streaming", "in-memory"}
        ``auto``: in-memory when the decoded partitions and their layouts (:func:`decoded_bytes`)
        take at most half of the cluster's worker memory, else streaming.
    partitions : int, optional
        Partition tasks per mode (default one per Dask thread, more when one would exceed
        ``max_partition_nnz``).
    kernel : str, optional
        TTM kernel passed to :func:`~tensorflow_ooc.kernels.ttm.chain.ttm_chain` (default: its selector).
    device : {"cpu", "gpu", "auto"}
        Where partition tasks run: "gpu" on the cluster's GPU workers (one partition per GPU), whose
        sparse TTMs then run on the device (:func:`~tensorflow_ooc.kernels.ttm.chain.ttm_chain`'s ``device``);
        "auto" does so when the cluster has real GPUs.
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
        kernel: str | None = None,
        device: str = "cpu",
    ) -> None:
        self.kernel = kernel
        super().__init__(
            client,
            path,
            execution=execution,
            partitions=partitions,
            split_every=split_every,
            max_partition_nnz=max_partition_nnz,
            device=device,
        )
        budget = self.task_placement.memory_budget
        self.batch_nnz = batch_nnz_for(self.task_placement.smallest_limit)
        decoded = decoded_bytes(self.store.nnz, self.store.nmodes)
        if execution == "auto":
            execution = "in-memory" if fits_in_memory(decoded, budget) else "streaming"
        self.execution = execution
        log.info(
            "TTM graph: %d partitions on %s, %s execution (decoded %.1f MiB, worker memory %s), %d numba threads "
            "per task",
            len(self.parts),
            self.device,
            execution,
            decoded / 2**20,
            "unlimited" if budget is None else f"{budget / 2**20:.0f} MiB",
            self.numba_threads,
        )
        if execution == "in-memory":
            key = f"tfooc-coo-partition-{self.store.meta['store_id']}-{self.device}-{len(self.parts)}"
            self.data = [
                client.submit(load_coo_partition, self.path, p, key=f"{key}-{p.id}", **self.placement)
                for p in self.parts
            ]
            if not is_inline(client):
                wait(self.data)

    def partials(self, state: Future, mode: int) -> list[Future]:
        """Submit the mode-``mode`` TTM chain up to the last level of its reduction (at most
        ``split_every`` futures of :class:`TTMPartial`, which the consumer merges)."""
        parts = [
            self.client.submit(
                _ttm_partition_of,
                src,
                state,
                mode,
                self.numba_threads,
                self.batch_nnz,
                self.kernel,
                self.device,
                pure=False,
                **self.placement,
            )
            for src in self.sources()
        ]
        return self.reduce(parts, last=True)

    def mode_update(self, state: Future, mode: int, update: Callable, *args) -> Future:
        """Submit the mode-``mode`` TTM chain followed by ``update(state, partials, mode, *args)``;
        one task when there is one partition (the in-process default). Returns ``update``'s future."""
        sources = self.sources()
        if len(sources) == 1:
            return self.client.submit(
                _ttm_then,
                update,
                sources[0],
                state,
                mode,
                self.numba_threads,
                self.batch_nnz,
                self.kernel,
                self.device,
                args,
                pure=False,
                **self.placement,
            )
        return self.client.submit(update, state, self.partials(state, mode), mode, *args, pure=False)

    def reduce(self, futures: list[Future], last: bool = False) -> list[Future]:
        """Tree reduction by :func:`merge_partials` (see :func:`~tensorflow_ooc.execution.graph.tree_reduce`),
        down to one future, or with ``last`` to the last level."""
        return tree_reduce(self.client, futures, merge_partials, self.split_every, last)

    def release(self) -> None:
        """Drop decoded partitions from worker memory."""
        self.data = None


def _ttm_partition_of(
    source, state, mode: int, threads: int, batch_nnz: int, kernel: str | None, device: str
) -> TTMPartial:
    """:func:`ttm_partition` with the factors of a model state (what the graph passes around)."""
    return ttm_partition(source, state.chain_factors(mode), mode, threads, batch_nnz, kernel, device)
