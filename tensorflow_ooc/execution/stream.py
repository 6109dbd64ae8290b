"""Streaming reader: a partition's chunks as batches of decoded work items, read ahead.

Streaming MTTKRP reads every chunk once per mode, so per-chunk work beyond decompression must be
small next to the kernel. Three things keep it small:

- chunks are decompressed straight into reusable batch buffers (``Store.read_encoded``) and,
  on CPUs with BMI2, left as the Delta filter's differences, which the ``delta`` kernels decode
  themselves (elsewhere the prefix sum is fused with re-encoding, ``format.decode_alto``);
  uncompressed arrays are not copied at all but used where they lie, mapped: whole chunks of
  "none" stores, the values of "fast" stores whose values barely compress;
- where no core is left for a background reader, the reader decodes with every core the
  kernel uses, between kernel calls (``chunk_files.decompress``);
- a chunk's work-item profile (item boundaries and per-mode index intervals) is computed and
  validated against the store's chunk range table the first time a worker reads the chunk, then
  cached under the chunk's CRC32C: later passes that read the same bytes reuse it. Different
  bytes (a rewritten or damaged chunk) mean a different checksum and a fresh validation;
- a background thread fills the next batch while the kernel runs on the current one, and the
  kernel sees several chunks per call, so its threads stay balanced;
- from a store in object storage, the next chunks of the partition are fetched in parallel into
  the worker's disk cache while the current ones are decoded (:class:`Prefetch`); every later
  pass reads the cached files as it would a local store's.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator

import numba
import numpy as np

from ..format import BLCOTensor, decode_alto
from ..format.bits import HAS_BMI2
from ..kernels import WorkItems, work_items
from ..kernels import mttkrp as kernel_mttkrp
from ..kernels.mttkrp.dispatch import numba_threads
from ..kernels.mttkrp.plan import DEFAULT_MAX_PRIVATE_BYTES
from ..store import EncodedChunk, Store
from .sorted_stream import copy_for, sorted_batches, sorted_threads_fit

BATCH_NNZ = 1 << 22
# MTTKRP outputs above this take mapped ("none") chunks in batches of copies (see stream_batches)
MAP_MAX_OUTPUT_BYTES = 64 << 20
BATCH_MEMORY_FRACTION = 1 / 8


def batch_nnz_for(memory_limit: int | None) -> int:
    """Nonzeros per streaming batch: ``BATCH_NNZ`` (fewer, larger kernel calls measured faster:
    4 M nonzeros 5-10 % over 1 M), but the two batch buffers (16 bytes a nonzero each) take at
    most ``BATCH_MEMORY_FRACTION`` of the worker's memory limit."""
    if not memory_limit:
        return BATCH_NNZ
    return int(max(1 << 16, min(BATCH_NNZ, memory_limit * BATCH_MEMORY_FRACTION / (2 * 16))))


DELTA_KERNELS = HAS_BMI2


@dataclass
class ChunkProfile:
    """Work items of one chunk, positions relative to the chunk's first nonzero."""

    start: np.ndarray
    end: np.ndarray
    base: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    changes: np.ndarray
    prev: np.ndarray  # uint64: the low ALTO word before each item (0 at the chunk start)


class _ThreadScratch(threading.local):
    def get(self, n: int, dtype=np.uint64, role: str = "raw") -> np.ndarray:
        """This thread's buffer for ``role`` (one per role and dtype: a chunk's stored index, its
        re-encoded copy and its words are alive at once)."""
        bufs = self.__dict__.setdefault("bufs", {})
        key = (role, np.dtype(dtype))
        buf = bufs.get(key)
        if buf is None or buf.shape[0] < n:
            buf = bufs[key] = np.empty(n, dtype=key[1])
        return buf[:n]


_SCRATCH = _ThreadScratch()
_PROFILES: dict[tuple[str, int], tuple[int, ChunkProfile]] = {}
_PROFILES_LOCK = threading.Lock()
MAX_PROFILES = 1 << 17  # about 200 MB of profiles at most; 2^17 chunks are 10^11 nonzeros


def _cached_profile(store: Store, enc: EncodedChunk) -> ChunkProfile | None:
    if enc.checksum is None:
        return None
    with _PROFILES_LOCK:
        hit = _PROFILES.get((str(store.meta["store_id"]), enc.id))
    return hit[1] if hit is not None and hit[0] == enc.checksum else None


def profile_chunk(store: Store, enc: EncodedChunk, index: np.ndarray, alto_bits: int) -> ChunkProfile:
    """Work items of a chunk whose re-encoded indices are ``index``, validated against the store's
    chunk range table (and cached under the chunk's checksum)."""
    seg = enc.segments
    it = work_items(index, enc.values, seg[:, 1], seg[:, 2], enc.bases, store.layout)
    if it.nitems:
        cmin, cmax = it.lo.min(axis=0), it.hi.max(axis=0)
    else:
        cmin, cmax = enc.min, enc.max
    store.check_chunk_range(enc.id, cmin, cmax, alto_bits)
    if enc.alto_is_delta:
        # the word a kernel starts each item's sum from: its first word less its first difference
        # (0 at a delta64 chunk's start, whose first difference is absolute; the whole word at a
        # delta32 patch, whose difference is 0)
        first = it.start.astype(np.int64)
        words = enc.words(_SCRATCH.get(enc.n, np.uint64, "words"))
        prev = (words[first] - enc.alto[first].astype(np.uint64)).astype(np.uint64)
    else:
        prev = np.where(it.start > 0, enc.alto[np.maximum(it.start - 1, 0)], 0).astype(np.uint64)
    prof = ChunkProfile(it.start, it.end, it.base, it.lo, it.hi, it.changes, prev)
    if enc.checksum is not None:
        with _PROFILES_LOCK:
            if len(_PROFILES) >= MAX_PROFILES:
                _PROFILES.clear()
            _PROFILES[(str(store.meta["store_id"]), enc.id)] = (enc.checksum, prof)
    return prof


class BatchBuffers:
    """Index and values for up to ``chunks`` chunks (at most 16 bytes a nonzero); ``alloc`` makes
    the arrays (``numba.cuda.pinned_array`` for page-locked staging of GPU transfers).

    The index buffer holds what the kernels read: re-encoded uint64 indices, or the stored
    differences for the ``delta`` kernels, which fill it in ``index_dtype``: the store's own
    (uint32 for ``delta32``) where the CPU kernels read them, uint64 where they are widened
    (the GPU path's staging)."""

    def __init__(
        self, store: Store, chunks: int, alloc: Callable[..., np.ndarray] = np.empty, index_dtype=np.uint64
    ) -> None:
        cap = chunks * store.chunk_nnz
        self.chunks = chunks
        self.index = alloc(cap, dtype=np.dtype(index_dtype))
        self.values = alloc(cap, dtype=store.value_dtype)

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.values.nbytes


# Batch buffers are reused across tasks: fresh 100 MB allocations would be page-faulted in on
# every pass. At most KEEP_BUFFERS idle ones are kept per process, whatever the store.
_BUFFERS: list[BatchBuffers] = []
_BUFFERS_LOCK = threading.Lock()
KEEP_BUFFERS = 2


def _take_buffers(store: Store, chunks: int) -> BatchBuffers:
    """Buffers for ``fill_batch``'s default (``DELTA_KERNELS``): the stored differences as they are,
    or re-encoded uint64 indices."""
    cap = chunks * store.chunk_nnz
    index_dtype = np.dtype(store.index_dtype if DELTA_KERNELS else np.uint64)
    with _BUFFERS_LOCK:
        for i, b in enumerate(_BUFFERS):
            if b.index.shape[0] == cap and b.values.dtype == store.value_dtype and b.index.dtype == index_dtype:
                return _BUFFERS.pop(i)
    return BatchBuffers(store, chunks, index_dtype=index_dtype)


def _give_buffers(bufs: BatchBuffers) -> None:
    with _BUFFERS_LOCK:
        _BUFFERS.append(bufs)
        del _BUFFERS[:-KEEP_BUFFERS]


def release_buffers() -> None:
    """Drop the cached batch buffers and chunk profiles of this process."""
    with _BUFFERS_LOCK:
        _BUFFERS.clear()
    with _PROFILES_LOCK:
        _PROFILES.clear()


class Prefetch:
    """Queues the fetch of the chunks ahead of the one being read, up to ``chunk_hi`` (the end of
    the partition), from a store in object storage into the worker's disk cache
    (:meth:`Store.prefetch`); a no-op for a local store. Call it with each chunk before reading it."""

    def __init__(self, store: Store, chunk_hi: int) -> None:
        self.store = store
        self.chunk_hi = chunk_hi
        self.window = store.prefetch_window()
        self.queued_to = 0  # chunks below this were queued already

    def __call__(self, c: int) -> None:
        if not self.window:
            return
        lo, hi = max(c, self.queued_to), min(self.chunk_hi, c + 1 + self.window)
        if lo < hi:
            self.store.prefetch(range(lo, hi))
            self.queued_to = hi


def _mapped_items(store: Store, c: int, keep_nnz: int = 0) -> WorkItems | None:
    """Work items of chunk ``c`` straight from its mapped files (a store written with compression
    "none"), for the ``delta`` kernels; None if the chunk cannot be mapped or was never profiled
    (its first read re-encodes and validates it through the buffers)."""
    enc = store.view_encoded(c, keep_nnz)
    if enc is None or not enc.alto_is_delta:
        return None
    prof = _cached_profile(store, enc)
    if prof is None:
        return None
    return WorkItems(
        enc.alto,
        enc.values,
        prof.start,
        prof.end,
        prof.base,
        prof.lo,
        prof.hi,
        prof.changes,
        prev=prof.prev,
        delta=True,
    )


def _fill_chunk(
    store: Store,
    c: int,
    bufs: BatchBuffers,
    pos: int,
    delta: bool,
    map_values: bool = False,
    keep_nnz: int = 0,
    decode_threads: int = 1,
) -> tuple[ChunkProfile, np.ndarray]:
    """Chunk ``c`` into the batch buffers at ``pos`` (its values mapped instead, where
    ``map_values`` and the store allows); its work-item profile and its values."""
    slot = slice(pos, pos + store.chunk_nnz)
    if not delta and bufs.index.dtype != np.uint64:
        raise ValueError(f"re-encoded indices need a uint64 index buffer, got {bufs.index.dtype}")
    # the stored index goes straight into the batch for the delta kernels (when the buffer has
    # its dtype), else into a scratch buffer to be re-encoded (or widened) from
    raw_into_batch = delta and bufs.index.dtype == store.index_dtype
    raw = bufs.index[slot] if raw_into_batch else _SCRATCH.get(store.chunk_nnz, store.index_dtype)
    enc = store.read_encoded(c, raw, bufs.values[slot], map_values, keep_nnz, decode_threads)
    n = enc.n
    index = bufs.index[pos : pos + n]
    if delta and not raw_into_batch:  # differences widened to the batch's uint64 (GPU staging)
        index[:] = enc.alto
        enc.alto = index
    if delta and not enc.alto_is_delta:  # Zarr's own read path of a delta64 store: absolute words
        index[1:] = np.diff(enc.alto)
        enc.alto_is_delta = True
    prof = _cached_profile(store, enc)
    if prof is None:
        # re-encoded for validation on a chunk's first read (a scratch buffer of its own)
        decoded = _SCRATCH.get(n, np.uint64, "decoded") if delta else index
        bits = decode_alto(enc.alto, store.layout, decoded, enc.alto_is_delta, enc.patches)
        prof = profile_chunk(store, enc, decoded, bits)
    elif not delta:
        decode_alto(enc.alto, store.layout, index, enc.alto_is_delta, enc.patches)
    return prof, enc.values


def fill_batch(
    store: Store,
    chunk_ids: range,
    bufs: BatchBuffers,
    delta: bool | None = None,
    map_values: bool = False,
    keep_nnz: int = 0,
    decode_threads: int = 1,
    prefetch: Prefetch | None = None,
) -> WorkItems:
    """Read, decode and profile ``chunk_ids`` into ``bufs``; their work items, batch positions.

    With ``delta`` (default: where the CPU has BMI2) the index buffer receives the stored
    differences as they come out of the decompressor, for the ``delta`` kernels (widened when the
    buffer is uint64 and the store's ``delta32`` index uint32); else it receives
    re-encoded BLCO indices. A chunk is fully re-encoded and validated only the first time a
    process sees its bytes. With ``map_values`` (one chunk only) the items' values are the
    chunk's mapped values where the store keeps them uncompressed (see
    :meth:`Store.read_encoded`). ``decode_threads`` threads decompress each chunk. From a store
    in object storage the chunks after each are fetched ahead (``prefetch``, by default up to the
    end of ``chunk_ids``).
    """
    delta = DELTA_KERNELS if delta is None else bool(delta)
    if map_values and len(chunk_ids) != 1:
        raise ValueError("map_values reads one chunk per batch")
    parts = []
    pos = 0
    values = bufs.values
    if prefetch is None and len(chunk_ids):
        prefetch = Prefetch(store, chunk_ids[-1] + 1)
    for c in chunk_ids:
        prefetch(c)
        prof, chunk_values = _fill_chunk(store, c, bufs, pos, delta, map_values, keep_nnz, decode_threads)
        if map_values:
            values = chunk_values
        parts.append((pos, prof))
        pos += min(store.nnz, (c + 1) * store.chunk_nnz) - c * store.chunk_nnz
    N = store.nmodes

    def cat(name: str, shift: bool = False) -> np.ndarray:
        arrays = [getattr(p, name) + off if shift else getattr(p, name) for off, p in parts]
        if arrays:
            return np.concatenate(arrays)
        return np.zeros(
            (0, N) if name in ("base", "lo", "hi", "changes") else 0, dtype=np.uint64 if name == "prev" else np.int64
        )

    return WorkItems(
        bufs.index[:pos],
        values[:pos],
        cat("start", True),
        cat("end", True),
        cat("base"),
        cat("lo"),
        cat("hi"),
        cat("changes"),
        prev=cat("prev"),
        delta=delta,
    )


def read_ahead_pays(kernel_threads: int) -> bool:
    """Whether a background reader has a core of its own beside ``kernel_threads`` kernel threads.

    Without one, the reader's decompression preempts the kernel's threads and the pass is slower
    than reading and computing in turn (uber-shaped, 2 cores, 2 kernel threads: 0.15 s against
    0.125 s for all four modes), since both are bound by the same cores and memory bandwidth."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores > kernel_threads


def stream_batches(
    store: Store,
    chunk_lo: int,
    chunk_hi: int,
    batch_nnz: int = BATCH_NNZ,
    read_ahead: bool | None = None,
    map_chunks: bool = True,
) -> Iterator[WorkItems]:
    """Work items of chunks ``[chunk_lo, chunk_hi)``, a batch of about ``batch_nnz`` nonzeros at a
    time. With ``read_ahead`` the next batch is filled in a background thread while the caller
    computes on the current one; a batch stays valid until the caller asks for the next but one.
    The default reads ahead where :func:`read_ahead_pays` for numba's current thread count.

    Chunks of a store written with compression "none" are handed out where they lie, mapped, one
    batch per chunk, with ``map_chunks``; without it they are copied into batches of ``batch_nnz``
    (no decoding either), which callers ask for when the MTTKRP output is far larger than the
    caches: its row-owned tiles (:mod:`tensorflow_ooc.kernels.mttkrp.owned`) reuse a tile once per
    batch, and one-chunk batches took an 86 M-nonzero Amazon-shaped pass from 8.3 to 10.6 s."""
    # a store in object storage: the next chunks are fetched while these are decoded
    prefetch = Prefetch(store, chunk_hi)
    if DELTA_KERNELS and map_chunks and store.mappable:
        # uncompressed chunks are used where they lie, one batch per chunk: nothing to read ahead
        for c in range(chunk_lo, chunk_hi):
            prefetch(c)
            # mappings kept between passes fill at most what two batch buffers would hold
            items = _mapped_items(store, c, 2 * batch_nnz)
            if items is None:  # first sight of the chunk: read, validate and profile it
                bufs = _take_buffers(store, 1)
                try:
                    items = fill_batch(store, range(c, c + 1), bufs, prefetch=prefetch)
                    yield items
                finally:
                    _give_buffers(bufs)
            else:
                yield items
        return
    if read_ahead is None:
        read_ahead = read_ahead_pays(numba.get_num_threads())
    # values stored uncompressed ("fast" stores of values that barely compress) are used where
    # they lie, one batch per chunk; only the index is decompressed
    map_values = DELTA_KERNELS and map_chunks and store.values_mappable
    per = 1 if map_values else max(1, batch_nnz // store.chunk_nnz)
    # read in turn with the kernel, decoding takes every core the kernel uses
    fill = partial(
        fill_batch,
        map_values=map_values,
        keep_nnz=2 * batch_nnz,
        decode_threads=1 if read_ahead else numba.get_num_threads(),
        prefetch=prefetch,
    )
    # the first batch is read before any compute can overlap it, so it is one chunk
    first = min(chunk_hi, chunk_lo + 1)
    groups = [range(chunk_lo, first)] if chunk_hi > chunk_lo else []
    groups += [range(c, min(chunk_hi, c + per)) for c in range(first, chunk_hi, per)]
    if not groups:
        return
    bufs = [_take_buffers(store, per)]
    try:
        if not read_ahead or len(groups) == 1:
            for g in groups:
                yield fill(store, g, bufs[0])
            return
        bufs.append(_take_buffers(store, per))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfooc-read-ahead") as pool:
            pending = pool.submit(fill, store, groups[0], bufs[0])
            for i in range(1, len(groups)):
                items = pending.result()
                # the buffer filled now was last used two batches ago: the caller is done with it
                pending = pool.submit(fill, store, groups[i], bufs[i % 2])
                yield items
            yield pending.result()
    finally:
        for b in bufs:
            _give_buffers(b)


def mttkrp(tensor: Store | BLCOTensor, factors, mode: int, *, mode_copies: bool = True, **kwargs) -> np.ndarray:
    """Mode-``mode`` MTTKRP of a store or an in-memory BLCO tensor (the public ``tfo.mttkrp``).

    A store is streamed through the fast chunk reader of the streaming execution (chunks
    decompressed into reusable buffers, read ahead, validated once per process and cached under
    their checksums; a store written with compression "none" mapped instead), not Zarr's generic
    read path; where the store keeps a mode-sorted copy of ``mode`` (and ``mode_copies``, the
    default), that copy is read instead, through the run-table kernel (:mod:`.sorted_stream`).
    Other keyword arguments and the result are those of
    :func:`tensorflow_ooc.kernels.mttkrp.dispatch`.

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> t = tfo.encode_coo(np.array([[0, 1, 2], [1, 1, 0]]), np.array([2.0, 3.0]), (2, 2, 3))
    >>> A = [np.ones((2, 4)), np.ones((2, 4)), np.ones((3, 4))]
    >>> tfo.mttkrp(t, A, 0)[:, 0]
    array([2., 3.])
    """
    if isinstance(tensor, Store):
        rank = factors.rank if hasattr(factors, "rank") else np.shape(factors[0])[1]
        big = tensor.shape[mode] * rank * 8 > MAP_MAX_OUTPUT_BYTES
        copy = copy_for(tensor, mode) if mode_copies and kwargs.get("conflict", "auto") == "auto" else None
        if copy is not None:
            # the mode's sorted copy, through the run-table kernel on per-thread outputs where
            # their copies fit (sorted_thread_outputs)
            bound = kwargs.get("max_private_bytes", DEFAULT_MAX_PRIVATE_BYTES)
            with numba_threads(kwargs.get("threads")):
                fits = sorted_threads_fit(tensor.shape[mode] * rank * 8, bound)
            return kernel_mttkrp(
                sorted_batches(tensor, copy, 0, tensor.nchunks, 2 * BATCH_NNZ),
                factors,
                mode,
                layout=tensor.layout,
                **{**kwargs, "conflict": "threads" if fits else "auto"},
            )
        return kernel_mttkrp(
            stream_batches(tensor, 0, tensor.nchunks, map_chunks=not big), factors, mode, layout=tensor.layout, **kwargs
        )
    return kernel_mttkrp(tensor, factors, mode, **kwargs)
