"""GPU execution: batches of a partition streamed to the device over several CUDA streams.

A partition's chunks are read by the existing fast chunk reader straight into *pinned* host
buffers (the stored ALTO differences, no re-encoding on the host), copied to a device buffer on
the buffer's stream, decoded there (:mod:`tensorflow_ooc.kernels.mttkrp.decode_gpu`) and handed to the
MTTKRP kernel on the same stream (seed 001 section 4.2). With S streams, S buffer sets rotate:
while the kernel of batch b runs on its stream, the host fills and copies batch b + 1 on the next.
A buffer set is refilled only after the event recorded behind the kernel that last read it has
completed; :class:`StreamSchedule` is that order as a plain object, which the executor follows
step by step and tests inspect.

When a partition fits one buffer it is *resident*: uploaded and decoded once, then every mode's
MTTKRP reads it from device memory (in-memory execution on a GPU worker).

Factors are read from device memory for the whole task (uploaded once per model state, or used
in place when the CP-ALS state already lives on the device as a CuPy array); the output is
accumulated on the device and copied back once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..format import BitLayout, BLCOTensor
from ..kernels import StackedFactors, WorkItems
from ..kernels.gpu.device import cuda, default_device_memory_limit, require_gpu, simulator_enabled, sm_count
from ..kernels.mttkrp.gpu_plan import DEFAULT_COPIES, TileTable, choose_conflict, copies_for, device_tiles
from ..store import Store
from .stream import BATCH_NNZ, BatchBuffers, fill_batch

DEFAULT_STREAMS = 8


@dataclass
class DeviceOptions:
    """How GPU tasks run.

    conflict : "auto" | "hierarchical" | "register"
        Conflict resolution; "auto" is hierarchical when the target mode has fewer rows than
        ``hierarchical_rows`` (default: the device's SM count), else register-based.
    copies : global output copies for hierarchical resolution.
    warps, coarsen : warps per thread block and 32-nonzero sub-tiles per warp (thread coarsening).
    exchange : "intrinsics" | "shared" | None (None: intrinsics on hardware, shared in the simulator).
    streams : CUDA streams (and buffer sets) for out-of-memory streaming.
    device_memory_limit : bytes the task may use on the device (default: a fraction of free memory).
    batch_nnz : largest streamed batch.
    decode_threads : threads per block of the decode kernels (None: 256 on hardware, 32 in the
        simulator, which runs a Python thread per CUDA thread and then starts 8x fewer).
    """

    conflict: str = "auto"
    hierarchical_rows: int | None = None
    copies: int = DEFAULT_COPIES
    warps: int = 8
    coarsen: int = 4
    exchange: str | None = None
    streams: int = DEFAULT_STREAMS
    device_memory_limit: int | None = None
    batch_nnz: int = BATCH_NNZ
    decode_threads: int | None = None

    def memory_limit(self) -> int:
        return int(self.device_memory_limit) if self.device_memory_limit else default_device_memory_limit()


# --- the schedule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a streamed pass: ``kind`` on ``batch`` with buffer set (and stream) ``slot``.

    kinds: ``wait`` (host blocks on the event recorded after batch ``batch``'s kernel),
    ``fill`` (host reads the batch into the slot's pinned buffers), ``copy`` (host-to-device on the
    slot's stream), ``compute`` (decode + MTTKRP on the slot's stream), ``record`` (event after the
    kernel on the slot's stream).
    """

    kind: str
    batch: int
    slot: int


@dataclass
class StreamSchedule:
    """Round-robin schedule of ``nbatches`` over ``streams`` buffer sets."""

    nbatches: int
    streams: int
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.streams = max(1, min(int(self.streams), max(1, self.nbatches)))
        for b in range(self.nbatches):
            s = b % self.streams
            if b >= self.streams:
                self.steps.append(Step("wait", b - self.streams, s))
            self.steps += [Step("fill", b, s), Step("copy", b, s), Step("compute", b, s), Step("record", b, s)]

    def check(self) -> None:
        """Raise if any buffer set is written (fill or copy) before the kernel that last read it
        is known complete, or if a batch is computed before it is copied."""
        last_reader: dict[int, int] = {}
        completed: set[int] = set()
        copied: set[int] = set()
        for st in self.steps:
            if st.kind == "wait":
                completed.add(st.batch)
            elif st.kind in ("fill", "copy"):
                prev = last_reader.get(st.slot)
                if prev is not None and prev != st.batch and prev not in completed:
                    raise AssertionError(
                        f"buffer {st.slot} reused by batch {st.batch} before batch {prev}'s kernel completed"
                    )
                if st.kind == "copy":
                    copied.add(st.batch)
            elif st.kind == "compute":
                if st.batch not in copied:
                    raise AssertionError(f"batch {st.batch} computed before it was copied")
                last_reader[st.slot] = st.batch


# --- device buffers -----------------------------------------------------------------------------


class DeviceBatch:
    """One buffer set: pinned host staging, device copies of a batch and its tile table."""

    def __init__(self, store: Store, chunks: int) -> None:
        self.host = BatchBuffers(store, chunks, alloc=cuda.pinned_array)
        cap = self.host.index.shape[0]
        self.index = cuda.device_array(cap, dtype=np.uint64)
        self.values = cuda.device_array(cap, dtype=store.value_dtype)
        self.delta = False
        self.tiles: TileTable | None = None
        self.d_tiles: DeviceTiles | None = None
        self._spaces: dict[str, Any] = {}
        self.stream = cuda.stream()
        self.event = cuda.event()

    @classmethod
    def of_items(cls, items: WorkItems, tile_nnz: int) -> "DeviceBatch":
        """A batch of work items already in host memory (not pinned), copied to the device."""
        batch = cls.__new__(cls)
        batch.host = None
        batch._spaces = {}
        batch.stream = cuda.stream()
        batch.event = cuda.event()
        batch.index = cuda.to_device(np.ascontiguousarray(items.index), stream=batch.stream)
        batch.values = cuda.to_device(np.ascontiguousarray(items.values), stream=batch.stream)
        batch._upload_tables(items, tile_nnz)
        batch.stream.synchronize()
        return batch

    @staticmethod
    def device_bytes(cap: int, value_itemsize: int) -> int:
        return cap * (8 + value_itemsize)

    def upload(self, items: WorkItems, tile_nnz: int) -> None:
        """Copy the batch in ``self.host`` (already filled) and its tile table to the device,
        asynchronously on this buffer's stream."""
        n = int(items.index.shape[0])
        s = self.stream
        if n:
            self.index[:n].copy_to_device(self.host.index[:n], stream=s)
            self.values[:n].copy_to_device(self.host.values[:n], stream=s)
        self._upload_tables(items, tile_nnz)

    def space(self, name: str, shape: tuple, dtype: Any) -> Any:
        """Device array ``name`` of ``shape``, kept with this buffer set across batches and grown
        (doubled) when a batch needs more rows: no allocation per batch in the steady state."""
        have = self._spaces.get(name)
        if have is None or have.shape[0] < shape[0] or have.shape[1:] != tuple(shape[1:]):
            cap = max(int(shape[0]), 2 * (have.shape[0] if have is not None else 0), 64)
            have = self._spaces[name] = cuda.device_array((cap,) + tuple(shape[1:]), dtype=dtype)
        return have[: shape[0]]

    def _upload_tables(self, items: WorkItems, tile_nnz: int) -> None:
        s = self.stream
        t = self.tiles = device_tiles(items, tile_nnz)
        # small tables (a few bytes per thousand nonzeros) from pageable memory into kept space
        host = {
            "start": t.start,
            "end": t.end,
            "base": t.base,
            "lo": t.lo,
            "first": t.item_first_tile,
            "prev": np.asarray(items.prev, dtype=np.uint64),
        }
        dev = {}
        for name, a in host.items():
            a = np.ascontiguousarray(a)
            d = dev[name] = self.space(name, a.shape, a.dtype)
            if a.size:
                d.copy_to_device(a, stream=s)
        self.d_tiles = DeviceTiles(**dev)
        self.delta = bool(items.delta)


@dataclass
class DeviceTiles:
    """A batch's tile table on the device (see :class:`tensorflow_ooc.kernels.mttkrp.gpu_plan.TileTable`)
    and each work item's ALTO word before its first nonzero (``prev``)."""

    start: Any
    end: Any
    base: Any
    lo: Any
    first: Any
    prev: Any


def decode_on_device(batch: DeviceBatch, layout: BitLayout, opts: DeviceOptions) -> None:
    """Stored ALTO words of ``batch`` to BLCO indices, in place, on its stream."""
    from ..kernels.mttkrp.decode_gpu import decode_kernels

    t = batch.tiles
    if t is None or t.ntiles == 0:
        return
    tpb = opts.decode_threads or (32 if simulator_enabled() else 256)
    sums_k, prefix_k, decode_k = decode_kernels(tpb)
    d = batch.d_tiles
    s = batch.stream
    prefix = batch.space("prefix", (t.ntiles,), np.uint64)
    if batch.delta:
        sums = batch.space("sums", (t.ntiles,), np.uint64)
        sums_k[t.ntiles, tpb, s](batch.index, d.start, d.end, sums)
        nitems = d.prev.shape[0]
        prefix_k[(nitems + 127) // 128, 128, s](d.prev, d.first, sums, prefix)
    table = _device_table(layout)
    decode_k[t.ntiles, tpb, s](batch.index, d.start, d.end, prefix, batch.delta, table, int(layout.index_nbytes))
    batch.delta = False


_TABLES: dict[tuple, Any] = {}
_TABLES_LOCK = threading.Lock()


def _device_table(layout: BitLayout):
    with _TABLES_LOCK:
        key = layout.shape
        if key not in _TABLES:
            _TABLES[key] = cuda.to_device(np.ascontiguousarray(layout.reencode_table))
        return _TABLES[key]


# --- factors on the device ----------------------------------------------------------------------

_FACTORS: dict[int, tuple[Any, Any]] = {}
_FACTORS_LOCK = threading.Lock()


def device_factors(factors: StackedFactors):
    """The stacked factors as a device array: in place when they already live on the device
    (CuPy), else uploaded once per factor object and kept while that object lives."""
    data = factors.data
    if hasattr(data, "__cuda_array_interface__") and not isinstance(data, np.ndarray):
        return cuda.as_cuda_array(data)
    with _FACTORS_LOCK:
        hit = _FACTORS.get(id(factors))
        if hit is not None and hit[0] is data:
            return hit[1]
        d = cuda.to_device(np.ascontiguousarray(data))
        _FACTORS.clear()  # one model state per worker at a time: the previous one is stale
        _FACTORS[id(factors)] = (data, d)
        return d


def forget_device_factors(factors: StackedFactors) -> None:
    """Drop the device copy of ``factors``: their host rows were written in place (owner-computes
    updates the rows a worker holds in its one factor object), so the copy is stale."""
    with _FACTORS_LOCK:
        _FACTORS.pop(id(factors), None)


# --- the MTTKRP of a stream of batches ----------------------------------------------------------


@dataclass
class DeviceMTTKRP:
    """Runs MTTKRP of batches on one device for one target mode, into a device output.

    ``poisson_eps``: CP-APR's Phi instead (the kernels' Poisson form, see
    :mod:`tensorflow_ooc.kernels.mttkrp.gpu`): each value divided by ``max(model value, eps)``,
    with the target mode's rows of ``factors`` as the model's."""

    layout: BitLayout
    factors: StackedFactors
    mode: int
    out_lo: int
    rows: int
    opts: DeviceOptions
    stats: dict = field(default_factory=dict)
    poisson_eps: float | None = None

    def __post_init__(self) -> None:
        from ..kernels.gpu.launch import zero_fill
        from ..kernels.gpu.warp_exchange import default_exchange
        from ..kernels.mttkrp.gpu import KernelConfig, mttkrp_kernel

        require_gpu()
        R = self.factors.rank
        dtype = np.dtype(self.factors.dtype).name
        self.conflict = choose_conflict(self.rows, sm_count(), self.opts.conflict, self.opts.hierarchical_rows)
        self.cfg = KernelConfig.for_rank(
            self.layout.nmodes,
            R,
            self.conflict,
            self.opts.exchange or default_exchange(),
            dtype,
            self.opts.warps,
            self.opts.coarsen,
            poisson=self.poisson_eps is not None,
        )
        self.kernel = mttkrp_kernel(self.cfg)
        # the Poisson kernel's eps, in its float type (an argument: no recompile per eps)
        self.extra = () if self.poisson_eps is None else (np.dtype(self.cfg.dtype).type(self.poisson_eps),)
        self.F = device_factors(self.factors)
        self.offs = cuda.to_device(self.factors.offsets)
        self.shift = cuda.to_device(self.layout.field_shift)
        self.mask = cuda.to_device(self.layout.field_mask)
        self.out = cuda.device_array((self.rows, R), dtype=self.factors.dtype)
        zero_fill(self.out)
        if self.conflict == "hierarchical":
            k = hierarchical_copies(self.rows, R, self.cfg.itemsize, self.opts)
            self.copies = cuda.device_array((k, self.rows, R), dtype=self.factors.dtype)
            zero_fill(self.copies)
        else:
            self.copies = cuda.device_array((1, 1, 1), dtype=self.factors.dtype)
        self.stats.update(conflict=self.conflict, copies=int(self.copies.shape[0]), tiles=0, launches=0)

    def launch(self, batch: DeviceBatch) -> None:
        """MTTKRP of one batch (decoded: BLCO indices) on the batch's stream."""
        t = batch.tiles
        if t is None or t.ntiles == 0:
            return
        d = batch.d_tiles
        self.kernel[t.ntiles, self.cfg.threads, batch.stream](
            batch.index,
            batch.values,
            d.start,
            d.end,
            d.base,
            d.lo,
            self.shift,
            self.mask,
            self.F,
            self.offs,
            self.mode,
            self.factors.rank,
            self.out,
            self.out_lo,
            self.copies,
            *self.extra,
        )
        self.stats["tiles"] += t.ntiles
        self.stats["launches"] += 1

    def result(self) -> np.ndarray:
        """Merge the copies (hierarchical), wait for every stream, and return the output on the host."""
        cuda.synchronize()
        if self.conflict == "hierarchical":
            from ..kernels.mttkrp.gpu import merge_kernel

            n = self.rows * self.factors.rank
            if n:
                merge_kernel()[(n + 255) // 256, 256](self.copies, self.out)
            cuda.synchronize()
        return self.out.copy_to_host()


COPIES_MEMORY_FRACTION = 0.25


def hierarchical_copies(rows: int, rank: int, itemsize: int, opts: DeviceOptions) -> int:
    """Global output copies for hierarchical resolution: ``opts.copies``, fewer when they would
    take more than ``COPIES_MEMORY_FRACTION`` of the device memory limit."""
    return copies_for(rows, rank, itemsize, int(COPIES_MEMORY_FRACTION * opts.memory_limit()), opts.copies)


def stream_groups(chunk_lo: int, chunk_hi: int, chunks_per_batch: int) -> list[range]:
    return [range(c, min(chunk_hi, c + chunks_per_batch)) for c in range(chunk_lo, chunk_hi, chunks_per_batch)]


def plan_batches(
    store: Store, chunk_lo: int, chunk_hi: int, rows: int, factors: StackedFactors, mode: int, opts: DeviceOptions
) -> tuple[int, int]:
    """(chunks per batch, streams) so that the S buffer sets, the factors, the output and (for
    hierarchical resolution) its copies fit the device memory limit. Raises MemoryError, naming the
    numbers, when not even one chunk fits beside them."""
    itemsize = np.dtype(factors.dtype).itemsize
    hierarchical = choose_conflict(rows, sm_count(), opts.conflict, opts.hierarchical_rows) == "hierarchical"
    copies = hierarchical_copies(rows, factors.rank, itemsize, opts) if hierarchical else 0
    fixed = (sum(store.shape) + rows * (1 + copies)) * factors.rank * itemsize
    budget = opts.memory_limit() - fixed
    per_chunk = DeviceBatch.device_bytes(store.chunk_nnz, np.dtype(store.value_dtype).itemsize)
    nchunks = chunk_hi - chunk_lo
    if budget < per_chunk:
        raise MemoryError(
            f"device memory limit {opts.memory_limit() / 2**20:.1f} MiB leaves "
            f"{max(budget, 0) / 2**20:.1f} MiB after factors and output "
            f"({fixed / 2**20:.1f} MiB); one chunk needs {per_chunk / 2**20:.1f} MiB"
        )
    max_per = max(1, opts.batch_nnz // store.chunk_nnz)
    if nchunks <= max_per and nchunks * per_chunk <= budget:
        return max(1, nchunks), 1  # resident: one batch, one stream
    streams = int(max(1, min(opts.streams, nchunks, budget // per_chunk)))
    per = int(max(1, min(max_per, budget // (streams * per_chunk))))
    return per, streams


def mttkrp_stream(
    store: Store,
    chunk_lo: int,
    chunk_hi: int,
    factors: StackedFactors,
    mode: int,
    out_lo: int,
    rows: int,
    opts: DeviceOptions,
    stats: dict | None = None,
    poisson_eps: float | None = None,
) -> np.ndarray:
    """Mode-``mode`` MTTKRP of chunks ``[chunk_lo, chunk_hi)`` streamed through the device; the
    ``rows`` output rows from ``out_lo``, on the host. ``poisson_eps``: CP-APR's Phi instead
    (see :class:`DeviceMTTKRP`)."""
    per, streams = plan_batches(store, chunk_lo, chunk_hi, rows, factors, mode, opts)
    groups = stream_groups(chunk_lo, chunk_hi, per)
    schedule = StreamSchedule(len(groups), streams)
    run = DeviceMTTKRP(store.layout, factors, mode, out_lo, rows, opts, poisson_eps=poisson_eps)
    slots = [_take_slot(store, per) for _ in range(schedule.streams)]
    try:
        return _run_schedule(store, schedule, groups, slots, run, opts, stats, per)
    finally:
        _give_slots(store, per, slots)


# Pinned host memory and device buffers are slow to allocate (page locking, cudaMalloc): a
# worker keeps the buffer sets of its last streamed pass for the next mode and iteration.
_SLOTS: dict[tuple, list[DeviceBatch]] = {}
_SLOTS_LOCK = threading.Lock()


def _slot_key(store: Store, per: int) -> tuple:
    return (per * store.chunk_nnz, np.dtype(store.value_dtype).str)


def _take_slot(store: Store, per: int) -> DeviceBatch:
    with _SLOTS_LOCK:
        free = _SLOTS.get(_slot_key(store, per))
        if free:
            return free.pop()
    return DeviceBatch(store, per)


def _give_slots(store: Store, per: int, slots: list[DeviceBatch]) -> None:
    with _SLOTS_LOCK:
        key = _slot_key(store, per)
        for k in [k for k in _SLOTS if k != key]:
            del _SLOTS[k]  # one buffer geometry at a time per worker
        _SLOTS.setdefault(key, []).extend(slots)


def _run_schedule(
    store: Store,
    schedule: StreamSchedule,
    groups: list[range],
    slots: list[DeviceBatch],
    run: DeviceMTTKRP,
    opts: DeviceOptions,
    stats: dict | None,
    per: int,
) -> np.ndarray:
    """Follow ``schedule`` step by step (see :class:`StreamSchedule`)."""
    tile_nnz = run.cfg.tile_nnz
    items: dict[int, WorkItems] = {}
    for st in schedule.steps:
        slot = slots[st.slot]
        if st.kind == "wait":
            slot.event.synchronize()
        elif st.kind == "fill":
            items[st.batch] = fill_batch(store, groups[st.batch], slot.host, delta=True)
        elif st.kind == "copy":
            slot.upload(items.pop(st.batch), tile_nnz)
        elif st.kind == "compute":
            decode_on_device(slot, store.layout, opts)
            run.launch(slot)
        elif st.kind == "record":
            slot.event.record(slot.stream)
    if stats is not None:
        stats.update(run.stats, batches=len(groups), streams=schedule.streams, chunks_per_batch=per)
    return run.result()


def resident_batch(store: Store, chunk_lo: int, chunk_hi: int, opts: DeviceOptions, tile_nnz: int) -> DeviceBatch:
    """A partition uploaded and decoded once, to serve every mode (in-memory GPU execution)."""
    require_gpu()
    batch = DeviceBatch(store, chunk_hi - chunk_lo)
    items = fill_batch(store, range(chunk_lo, chunk_hi), batch.host, delta=True)
    batch.upload(items, tile_nnz)
    decode_on_device(batch, store.layout, opts)
    batch.stream.synchronize()
    batch.host = None  # the pinned staging copy is not needed once the batch is resident
    return batch


def mttkrp_resident(
    batch: DeviceBatch,
    layout: BitLayout,
    factors: StackedFactors,
    mode: int,
    out_lo: int,
    rows: int,
    opts: DeviceOptions,
    stats: dict | None = None,
    poisson_eps: float | None = None,
) -> np.ndarray:
    """Mode-``mode`` MTTKRP of a resident batch; the ``rows`` output rows from ``out_lo``, on the
    host. ``poisson_eps``: CP-APR's Phi instead (see :class:`DeviceMTTKRP`)."""
    run = DeviceMTTKRP(layout, factors, mode, out_lo, rows, opts, poisson_eps=poisson_eps)
    run.launch(batch)
    if stats is not None:
        stats.update(run.stats, batches=1, streams=1)
    return run.result()


def mttkrp_gpu(
    tensor: Store | BLCOTensor,
    factors: StackedFactors | list,
    mode: int,
    opts: DeviceOptions | None = None,
    stats: dict | None = None,
    poisson_eps: float | None = None,
) -> np.ndarray:
    """Mode-``mode`` MTTKRP of a whole store (streamed through the device in batches) or of an
    in-memory BLCO tensor (uploaded once) on the GPU; the ``(I_mode, R)`` result on the host.
    ``poisson_eps``: CP-APR's Phi instead, ``factors[mode]`` holding the model's ``B`` (see
    :class:`DeviceMTTKRP`).

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo                      # doctest: +SKIP
    >>> from tensorflow_ooc.execution import mttkrp_gpu                # doctest: +SKIP
    >>> t = tfo.encode_coo(np.array([[0, 1, 2], [1, 1, 0]]), np.array([2.0, 3.0]), (2, 2, 3))
    >>> mttkrp_gpu(t, [np.ones((2, 4)), np.ones((2, 4)), np.ones((3, 4))], 0)[:, 0]   # doctest: +SKIP
    array([2., 3.])
    """
    from ..kernels import tensor_items
    from ..kernels.mttkrp.dispatch import check_factors

    opts = opts or DeviceOptions()
    A = check_factors(factors, tensor.shape, mode)
    rows = int(tensor.shape[mode])
    if isinstance(tensor, Store):
        return mttkrp_stream(tensor, 0, tensor.nchunks, A, mode, 0, rows, opts, stats, poisson_eps)
    require_gpu()
    items = tensor_items(tensor)  # re-encoded BLCO indices already: no device decode
    batch = DeviceBatch.of_items(items, 32 * opts.warps * opts.coarsen)
    return mttkrp_resident(batch, tensor.layout, A, mode, 0, rows, opts, stats, poisson_eps)
