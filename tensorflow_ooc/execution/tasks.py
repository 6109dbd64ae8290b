"""Functions that run on Dask workers: load a partition, MTTKRP a partition, combine partials.

A partial covers only the target-mode rows its partition touches (known from the store's
per-chunk ranges), so partials stay small for long modes and the reduction moves little data.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..format import BitLayout
from ..kernels import StackedFactors, WorkItems
from ..kernels.apr.cpu import model_values
from ..kernels.mttkrp.dispatch import MttkrpPass, ThreadOutputs, numba_threads, threads_for
from ..kernels.mttkrp.mode_order import copy_order, mode_sorted
from ..kernels.mttkrp.mode_pairs import ModePair, choose_pairs, item_nonzeros, mode_pair
from ..kernels.mttkrp.packed import PackedItems, pack_items, packed_pays, packed_rank, run_packed
from ..kernels.mttkrp.plan import DEFAULT_MAX_PRIVATE_BYTES, PRIVATE_REUSE
from ..kernels.sampling.fiber_gather import FiberIndex, SampleTable, exact_keys, sample_keys, sampled_mttkrp_items
from ..store import Store, open_store
from ..store.paths import is_url
from .output_buffers import zeroed_output
from .pair_tasks import outside_pair, pair_other_partition, pair_partition
from .partials import Partial, merged_reads, sparse_sum, worker_threads
from .partitions import Partition
from .sorted_stream import copy_for, sorted_batches, sorted_thread_outputs, sorted_threads_fit
from .stream import BATCH_NNZ, MAP_MAX_OUTPUT_BYTES, BatchBuffers, fill_batch, read_ahead_pays, stream_batches

_STORES: dict[str, tuple[tuple, Store]] = {}
_STORES_LOCK = threading.Lock()


def _local_version(path: str) -> tuple:
    """(inode, mtime, size) of a local store's metadata and its fiber index's: a store replaced
    (``convert(..., overwrite=True)`` stages and moves in a new one) or re-indexed since it was
    opened reads as another version; () for object storage."""
    if is_url(path):
        return ()
    out = []
    for meta in (os.path.join(path, "zarr.json"), os.path.join(path, "fibers", "zarr.json")):
        try:
            st = os.stat(meta)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def cached_store(path: str) -> Store:
    """The store at ``path``, opened (and validated) once per worker process, and again where a
    local store was replaced or re-indexed since (two ``stat`` calls a lookup)."""
    version = _local_version(path)
    with _STORES_LOCK:
        got = _STORES.get(path)
        if got is None or got[0] != version:
            got = _STORES[path] = (version, open_store(path))
        return got[1]


@dataclass
class PartitionData:
    """A decoded partition kept in worker memory (in-memory mode)."""

    part: Partition
    layout: BitLayout
    items: WorkItems
    # randomized CP: per mode, the nonzeros sorted by their other coordinates (built on first use)
    fiber_index: dict[int, FiberIndex] = field(default_factory=dict)
    # exact CP-ALS where the memory plan has room: per mode, the items sorted by that mode's index
    # (absent where the copy would not pay; kernels/mttkrp/mode_order.py)
    mode_items: dict[int, WorkItems] = field(default_factory=dict)
    # exact CP-ALS sweeps of one task: both modes of each memoized pair, to the pair's copy
    # (kernels/mttkrp/mode_pairs.py; such modes have no mode-sorted copy)
    mode_pairs: dict[int, ModePair] = field(default_factory=dict)
    # with the copies, where a mode has neither copy nor pair: the items' 32-bit packed form
    # (kernels/mttkrp/packed.py), which those modes' passes with per-thread outputs read
    packed: PackedItems | None = None

    @property
    def nbytes(self) -> int:
        return int(
            self.items.index.nbytes
            + self.items.values.nbytes
            + (self.packed.nbytes if self.packed is not None else 0)
            + sum(f.nbytes for f in self.fiber_index.values())
            + sum(
                m.index.nbytes + m.values.nbytes + sum(a.nbytes for a in m.runs or ()) for m in self.mode_items.values()
            )
            + sum(p.nbytes for p in {id(p): p for p in self.mode_pairs.values()}.values())
        )


@dataclass
class DevicePartitionData:
    """A partition uploaded to a GPU and decoded there once (in-memory mode on a GPU worker)."""

    part: Partition
    layout: BitLayout
    batch: object  # execution.device_stream.DeviceBatch

    @property
    def nbytes(self) -> int:
        """Device memory of the resident batch."""
        return int(self.batch.index.nbytes + self.batch.values.nbytes)


def load_partition(
    path: str,
    part: Partition,
    device: str = "cpu",
    device_options: object | None = None,
    mode_copies: bool = False,
    threads: int | None = None,
    mode_pairs: bool = False,
    rank: int | None = None,
) -> PartitionData | DevicePartitionData:
    """Read and decode a partition's chunks into one set of work items (kept on the worker), or
    with ``device="gpu"`` into device memory (decoded on the device). ``mode_copies``: also keep
    a mode-sorted copy of the items for each mode where it pays (sorted on ``threads`` numba threads;
    small modes, at ``rank`` where given, only where every larger one has its copy:
    :func:`~..kernels.mttkrp.mode_order.copy_order`);
    ``mode_pairs`` (with ``mode_copies``): first memoized mode pairs where they pay
    (:func:`~tensorflow_ooc.kernels.mttkrp.mode_pairs.choose_pairs`), whose modes then keep no
    mode-sorted copy. Where a mode keeps neither, the items' 32-bit packed form too (at a
    ``rank`` its kernels take, or an unknown one: :func:`~..kernels.mttkrp.packed.packed_rank`)."""
    store = cached_store(path)
    if device == "gpu":
        from .device_stream import DeviceOptions, resident_batch

        opts = device_options or DeviceOptions()
        batch = resident_batch(store, part.chunk_lo, part.chunk_hi, opts, 32 * opts.warps * opts.coarsen)
        return DevicePartitionData(part, store.layout, batch)
    bufs = BatchBuffers(store, part.chunk_hi - part.chunk_lo)
    items = fill_batch(store, range(part.chunk_lo, part.chunk_hi), bufs, delta=False)
    if part.nz_lo is not None:
        items = part.own_items(items, part.chunk_lo, store.chunk_nnz)
        del bufs
    data = PartitionData(part, store.layout, items)
    if mode_copies:
        with numba_threads(threads):
            if mode_pairs:
                _keep_pairs(data, store.shape, rank)
            copyable = [m for m in range(store.layout.nmodes) if m not in data.mode_pairs]
            large, small = copy_order(store.shape, copyable, rank)
            _keep_copies(data, large)
            if all(m in data.mode_items for m in large):
                _keep_copies(data, small)
            bare = [m for m in range(store.layout.nmodes) if m not in data.mode_items and m not in data.mode_pairs]
            if bare and packed_rank(rank):
                # 4 bytes a nonzero, within the memory plan's copy of a mode that made none
                data.packed = pack_items(items, store.layout)
    return data


def _keep_copies(data: PartitionData, modes: list[int]) -> None:
    """A mode-sorted copy of ``data``'s items for each of ``modes`` where it pays."""
    for m in modes:
        copy = mode_sorted(data.items, data.layout, m)
        if copy is not None:
            data.mode_items[m] = copy


def _keep_pairs(data: PartitionData, shape: tuple[int, ...], rank: int | None) -> None:
    """Add the partition's memoized mode pairs where they pay (at ``rank`` where known) to
    ``data.mode_pairs``."""
    coords, values = item_nonzeros(data.items, data.layout)
    for a, b in choose_pairs(coords, tuple(shape), wrap=True, rank=rank):
        pair = mode_pair(coords, values, tuple(shape), a, b)
        if pair is not None:
            data.mode_pairs[a] = data.mode_pairs[b] = pair


def partition_batches(
    store: Store, part: Partition, batch_nnz: int, read_ahead: bool | None, map_chunks: bool = True
) -> Iterator[WorkItems]:
    """The streamed work items of ``part``: its chunks' (:func:`stream_batches`), and for a
    partition with a nonzero range only the items that start in it; the chunks it shares with its
    neighbours are streamed on their own and filtered, the ones between as they are."""
    if part.nz_lo is None:
        yield from stream_batches(store, part.chunk_lo, part.chunk_hi, batch_nnz, read_ahead, map_chunks=map_chunks)
        return
    cn = store.chunk_nnz
    inner_lo, inner_hi = -(-part.nz_lo // cn), part.nz_hi // cn  # chunks wholly inside the range
    pieces = [(part.chunk_lo, min(inner_lo, part.chunk_hi), True)] if part.chunk_lo < inner_lo else []
    if inner_lo < inner_hi:
        pieces.append((inner_lo, inner_hi, False))
    if max(inner_hi, inner_lo) < part.chunk_hi:
        pieces.append((max(inner_hi, inner_lo), part.chunk_hi, True))
    for a, b, clip in pieces:
        for c0, c1 in [(c, c + 1) for c in range(a, b)] if clip else [(a, b)]:
            for items in stream_batches(store, c0, c1, batch_nnz, read_ahead, map_chunks=map_chunks):
                yield part.own_items(items, c0, cn) if clip else items


def mttkrp_partition(
    source: PartitionData | DevicePartitionData | tuple[str, Partition],
    factors: StackedFactors,
    mode: int,
    threads: int = 1,
    read_ahead: bool | None = None,
    batch_nnz: int = BATCH_NNZ,
    device: str = "cpu",
    device_options: object | None = None,
    max_private_bytes: int = DEFAULT_MAX_PRIVATE_BYTES,
    lend_target: bool = False,
    poisson_eps: float | None = None,
) -> Partial:
    """Mode-``mode`` MTTKRP of one partition, from decoded data (in-memory mode) or by streaming
    its chunks from the store in batches (streaming mode); with ``device="gpu"`` on this worker's
    GPU (:mod:`tensorflow_ooc.execution.device_stream`). Dense partitions go to the dense kernels
    (:func:`~tensorflow_ooc.execution.dense_tasks.dense_mttkrp_partition`).

    ``lend_target``: the target mode's rows of ``factors`` may be overwritten (CP-ALS with
    in-place updates on one worker running one task at a time: the MTTKRP does not read them and
    the update overwrites them next); they then serve as a per-thread output copy
    (:class:`~tensorflow_ooc.kernels.mttkrp.dispatch.ThreadOutputs`).

    ``poisson_eps``: CP-APR's Phi instead of the MTTKRP (:mod:`.apr_tasks`): each value
    divided by ``max(model value, poisson_eps)``, the target mode's rows of ``factors`` holding the
    model's; in the MTTKRP kernels' fused form, or where the rank runs in column groups, by a
    model-value pass over each batch first (:func:`~tensorflow_ooc.kernels.apr.cpu.model_values`);
    on a GPU by the GPU kernels' Poisson form. Dense partitions have none (CP-APR takes sparse stores)."""
    from .dense_tasks import DensePartition, DensePartitionData, dense_mttkrp_partition

    if isinstance(source, PartitionData) and poisson_eps is None and source.mode_pairs:
        if mode in source.mode_pairs:
            return pair_partition(source, factors, mode, threads)
        pair = outside_pair(source, factors, mode)
        if pair is not None:
            return pair_other_partition(source, pair, factors, mode, threads)
    if isinstance(source, DensePartitionData) or (isinstance(source, tuple) and isinstance(source[1], DensePartition)):
        if poisson_eps is not None:
            raise ValueError("CP-APR's Phi takes sparse partitions, not dense ones")
        return dense_mttkrp_partition(source, factors, mode, threads, read_ahead, device, device_options)
    t0 = time.perf_counter()
    lo_hi = source.part if isinstance(source, (PartitionData, DevicePartitionData)) else source[1]
    lo, hi = lo_hi.row_lo[mode], lo_hi.row_hi[mode]
    if device == "gpu" or isinstance(source, DevicePartitionData):
        rows = _mttkrp_partition_gpu(source, factors, mode, lo, hi - lo + 1, device_options, poisson_eps)
        return Partial(lo, rows, time.perf_counter() - t0)
    out = zeroed_output((hi - lo + 1, factors.rank), factors.dtype)
    if read_ahead is None:
        read_ahead = read_ahead_pays(threads * worker_threads())
    nnz = source.items.nnz.sum() if isinstance(source, PartitionData) else lo_hi.nnz
    # a small partition runs on one thread, as a small dense chunk does (threads_for)
    with numba_threads(threads_for(threads, nnz)):
        resident = isinstance(source, PartitionData)
        sorted_items = source.mode_items.get(mode) if resident else None
        shared = ThreadOutputs.for_items(
            out,
            sorted_items if sorted_items is not None else (source.items if resident else None),
            mode,
            int(nnz),
            max_private_bytes,
            scratch=factors.views[mode][lo : hi + 1] if lend_target else None,
        )
        run = MttkrpPass(factors, out, shared, poisson_eps)
        two_pass = poisson_eps is not None and run.poisson_eps is None
        packed = source.packed if resident and sorted_items is None and poisson_eps is None else None
        if packed is not None and shared is not None and run.groups is None and packed_pays(factors, factors.rank):
            # the ALTO-ordered items' 32-bit form, 12 bytes a nonzero (kernels/mttkrp/packed.py)
            first, bufs = shared.buffers()
            run_packed(packed, factors, mode, out, lo, shared.threads, first, bufs)
        elif isinstance(source, PartitionData):
            items = sorted_items if sorted_items is not None else source.items
            run.run(
                _reweighted(items, source.layout, factors, poisson_eps) if two_pass else items,
                source.layout,
                mode,
                max_private_bytes=max_private_bytes,
                out_lo=lo,
            )
        else:
            path, part = source
            store = cached_store(path)
            copy = copy_for(store, mode) if part.nz_lo is None else None
            if copy is not None:
                # the mode's sorted copy (sorted_stream): its chunks through the run-table kernel
                batches = sorted_batches(store, copy, part.chunk_lo, part.chunk_hi, 2 * batch_nnz)
                # per-thread outputs within what the memory plan counts for a batch's private rows
                bound = min(max_private_bytes, batch_nnz * PRIVATE_REUSE * out.shape[1] * out.itemsize)
                if shared is None and sorted_threads_fit(out.nbytes, bound, lend_target):
                    scratch = factors.views[mode][lo : hi + 1] if lend_target else None
                    run = MttkrpPass(factors, out, sorted_thread_outputs(out, bound, scratch), poisson_eps)
            else:
                batches = partition_batches(
                    store, part, batch_nnz, read_ahead, map_chunks=out.nbytes <= MAP_MAX_OUTPUT_BYTES
                )
            for items in batches:
                if two_pass:
                    items = _reweighted(items, store.layout, factors, poisson_eps)
                run.run(items, store.layout, mode, max_private_bytes=max_private_bytes, out_lo=lo)
        run.finish()
    return Partial(lo, out, time.perf_counter() - t0)


def _reweighted(items: WorkItems, layout: BitLayout, factors: StackedFactors, eps: float) -> WorkItems:
    """``items`` with values ``x / max(m, eps)``, ``m`` the model value under ``factors`` (CP-APR's
    Phi as an MTTKRP of reweighted values, for ranks run in column groups)."""
    w = np.empty(items.values.shape[0], dtype=factors.dtype)
    model_values(items, layout, factors, np.ones(factors.rank, dtype=factors.dtype), eps, w)
    return dataclasses.replace(items, values=w)


def sampled_partition(
    source: PartitionData | tuple[str, Partition], samples, mode: int, threads: int = 1, batch_nnz: int = BATCH_NNZ
) -> Partial:
    """Mode-``mode`` *sampled* MTTKRP of one partition for randomized CP-ALS:
    ``sum_s w_s X[fiber of sample s] h_s`` over the drawn ``samples`` (a
    :class:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet`). Decoded partitions look fibers up in
    a per-mode :class:`~tensorflow_ooc.kernels.sampling.fiber_gather.FiberIndex` kept beside them; streamed
    ones join the samples' hash table against every batch."""
    t0 = time.perf_counter()
    part = source.part if isinstance(source, PartitionData) else source[1]
    lo, hi = part.row_lo[mode], part.row_hi[mode]
    out = np.zeros((hi - lo + 1, samples.ncols), dtype=samples.dtype)
    Hw = samples.weighted_rows  # asked only for the samples whose fibers meet nonzeros here
    with numba_threads(threads):
        if isinstance(source, PartitionData):
            index = partition_fiber_index(source, mode)
            sampled_mttkrp_items(source.items, source.layout, mode, samples.coords, Hw, out, lo, index=index)
            reads = {"path": "memory", "nnz_read": 0, "bytes_read": 0}
        else:
            path, part = source
            store = cached_store(path)
            table = SampleTable.build(sample_keys(samples.coords, store.shape, mode))
            for items in partition_batches(store, part, batch_nnz, read_ahead_pays(threads * worker_threads())):
                sampled_mttkrp_items(items, store.layout, mode, samples.coords, Hw, out, lo, table=table)
            # every nonzero of the partition streamed past the samples: its share of the store's bytes
            reads = {"path": "scan", "nnz_read": part.nnz, "bytes_read": _share_of_bytes(store, part.nnz)}
    return Partial(lo, out, time.perf_counter() - t0, reads)


def partition_fiber_index(data: PartitionData, mode: int, threads: int | None = None) -> FiberIndex | None:
    """The decoded partition's mode-``mode`` fiber index, built on first use (on ``threads``
    numba threads, default the caller's) and kept beside it; None where the other modes' keys
    wrap (the gather then scans)."""
    if not exact_keys(data.layout.shape, mode):
        return None
    index = data.fiber_index.get(mode)
    if index is None:
        with numba_threads(threads):
            index = data.fiber_index[mode] = FiberIndex.build(data.items, data.layout, mode)
    return index


def _share_of_bytes(store: Store, nnz: int) -> int:
    """The compressed bytes of ``nnz`` of the store's nonzeros, at its average (listed once a
    process)."""
    total = _STORED_BYTES.get(store.path)
    if total is None:
        total = _STORED_BYTES[store.path] = store.stored_bytes()
    return int(total * nnz / max(1, store.nnz))


_STORED_BYTES: dict[str, int] = {}


def _mttkrp_partition_gpu(
    source, factors: StackedFactors, mode: int, lo: int, rows: int, device_options, poisson_eps: float | None = None
) -> np.ndarray:
    """The partition's rows on this worker's GPU; ``poisson_eps``: CP-APR's Phi (the GPU kernels'
    Poisson form: every rank in one pass, no column groups or reweighting pass)."""
    from .device_stream import DeviceOptions, mttkrp_resident, mttkrp_stream

    opts = device_options or DeviceOptions()
    if isinstance(source, DevicePartitionData):
        return mttkrp_resident(source.batch, source.layout, factors, mode, lo, rows, opts, poisson_eps=poisson_eps)
    path, part = source
    return mttkrp_stream(
        cached_store(path), part.chunk_lo, part.chunk_hi, factors, mode, lo, rows, opts, poisson_eps=poisson_eps
    )


def row_slice(partial: Partial, lo: int, hi: int) -> Partial:
    """The rows ``lo .. hi - 1`` of ``partial`` that it has (a view; no rows where they do not
    meet), for a reduce-scatter: each worker then sums one slice of every partial."""
    a, b = max(lo, partial.lo), min(hi, partial.lo + partial.rows.shape[0])
    if b <= a:
        return Partial(lo, partial.rows[:0], partial.seconds)
    return Partial(a, partial.rows[a - partial.lo : b - partial.lo], partial.seconds)


def combine(*partials: Partial) -> Partial:
    """Sum partials into one covering the union of their row ranges (partials without rows add
    nothing to it)."""
    seconds, reads = max(p.seconds for p in partials), merged_reads(*(p.reads for p in partials))
    if all(p.index is not None for p in partials):  # sparse sampled partials stay sparse
        index, rows = sparse_sum(list(partials))
        return Partial(0, rows, seconds, reads, index=index)
    some = [p for p in partials if p.rows.shape[0]] or list(partials[:1])
    lo = min(p.row_span[0] for p in some)
    hi = max(p.row_span[1] for p in some)
    out = np.zeros((hi - lo, partials[0].rows.shape[1]), dtype=partials[0].rows.dtype)
    for p in some:
        p.add_into(out, lo)
    return Partial(lo, out, seconds, reads)
