"""The fiber index of a store: per mode, its nonzeros ordered by fiber, so a sampled round reads
only the chunks that hold the sampled fibers.

A mode-``m`` fiber is the set of nonzeros sharing every index but the mode-``m`` one; its *key* is
the mixed-radix number of those other indices (:func:`~tensorflow_ooc.format.fiber_keys.key_strides`).
Under the store's ``fibers`` group, per indexed mode ``m`` (docs/FORMAT.md, "Fiber index"):

- ``m{m}/key`` uint64 (nnz,): the keys, sorted (nonzeros of one fiber in store order); Delta +
  the profile's fiber-key Blosc (lz4 where the ALTO index has lz4hc) + CRC32C; like the two
  below, a Zarr v3 *sharded* array: small inner chunks (the unit a fiber is read in), about
  262,144 entries to a shard file (:mod:`.shard_files`);
- ``m{m}/row`` uint32 (uint64 past 2^32 rows): each nonzero's mode-``m`` index;
- ``m{m}/value``: its value, coded as the store's values;
- ``m{m}/first`` uint64 (nchunks,): each chunk's first key, the small table that finds the chunks
  of a fiber (one binary search; a fiber longer than a chunk spans neighbours);
- ``m{m}/crc`` int64 (3, nchunks): the CRC32C each chunk of key, row and value ended with, by
  position, so moved or swapped chunks are refused as the store's own are;
- ``m{m}/size`` int64 (3, nchunks): each chunk's stored bytes (what a round reports it read);
- ``m{m}/bloom`` uint64: a blocked Bloom filter of the keys (8 bits a fiber, 4 hashes in one
  512-bit block), so sampled fibers that hold no nonzero (most draws on sparse tensors) cost no
  chunk read; sharded, uncompressed, in inner chunks of 8 blocks, so a query reads its block's
  chunk and never the whole filter;
- ``m{m}/bloom_crc`` int64 (bloom chunks,): each filter chunk's CRC32C, by position.

The group's metadata binds the index to the store: the store's id and metadata checksum, and per
mode the checksums of its arrays' Zarr metadata and of its tables. An index built for another
store, or edited, is refused at open; a store without one (or without a mode) is unchanged: the
sampled rounds then scan the store.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from ..errors import CorruptStoreError
from ..format.fiber_keys import (
    BLOOM_BLOCK_WORDS,
    blocked_insert_by_region,
    blocked_query,
    bloom_blocks,
    bloom_words,
    distinct_sorted,
    exact_keys,
    folded_filter,
    key_space,
)
from . import paths
from .chunk_files import ABSENT
from .codecs import IndexCodecs, TableCodecs, ValueCodecs, quiet_numcodecs, value_padding
from .metadata import CHECKSUM_KEY, arrays_checksum, meta_checksum
from .scratch import ScratchBuffers
from .shard_decode import undelta_chunks
from .shard_files import ShardError, ShardReader, ShardWriter, shard_chunks

# ``Store`` (store.reader) is not imported here: the reader imports this module to open the index
Store = Any

GROUP = "fibers"
INDEX_KEY = "fiber_index"
#: 2: the Bloom filter blocked and read per query (version 1 kept it as one array, read whole)
INDEX_VERSION = 2
#: nonzeros per chunk of an index: a sampled fiber costs the read of its chunks, so chunks are
#: small; by default chosen per mode from its fibers' mean length (:func:`auto_chunk_nnz`;
#: docs/FORMAT.md, "Fiber index", has the measurements that chose it)
DEFAULT_FIBER_CHUNK_NNZ = 1024
MIN_AUTO_CHUNK_NNZ = 128
#: fibers shorter than this on average keep the largest chunks (see :func:`auto_chunk_nnz`)
SHORT_FIBER_ENTRIES = 16
ARRAYS = ("key", "row", "value")
#: the blocked Bloom filter's inner chunks (8 blocks: a query reads 512 bytes) and shard files
BLOOM_CHUNK_WORDS = 64
BLOOM_SHARD_CHUNKS = 4096
#: distinct keys a filter build gathers before inserting them, at least (else half the words of
#: the filter it fills)
BLOOM_GROUP_ENTRIES = 1 << 20


def auto_chunk_nnz(entries: int, fibers: int) -> int:
    """Entries per index chunk for a mode whose ``entries`` sorted entries hold ``fibers`` fibers.

    About one mean fiber (the nearest power of two, 128 to 1024), so reading a sampled fiber
    reads about twice its entries instead of a 1024-entry chunk shared with fibers not drawn.
    Fibers under 16 entries on average keep 1024: their draws are mostly empty fibers that the
    Bloom filter answers, and 128-entry chunks there built 2.6x slower and 7 % larger.
    """
    mean = entries / max(1, fibers)
    if mean < SHORT_FIBER_ENTRIES:
        return DEFAULT_FIBER_CHUNK_NNZ
    return int(min(DEFAULT_FIBER_CHUNK_NNZ, max(MIN_AUTO_CHUNK_NNZ, 1 << round(math.log2(mean)))))


def _arrays_checksum(group) -> str:
    """SHA-256 over the Zarr metadata of a mode's arrays (codecs, dtypes, shapes, chunk grids)."""
    return arrays_checksum(group, (*ARRAYS, "first", "crc", "size", "bloom", "bloom_crc"))


def _tables_checksum(first: np.ndarray, crc: np.ndarray, size: np.ndarray, bloom_crc: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(first, dtype="<u8").tobytes())
    h.update(np.ascontiguousarray(crc, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(size, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(bloom_crc, dtype="<i8").tobytes())
    return "sha256:" + h.hexdigest()


def row_dtype(length: int) -> np.dtype:
    """The dtype of a mode's ``row`` array: uint32 where its indices fit."""
    return np.dtype(np.uint32 if length <= 2**32 else np.uint64)


@dataclass
class Gathered:
    """The index entries of some chunks of one mode, in key order: what a sampled round reads.

    ``keys`` uint64, ``rows`` (the stored dtype) and ``values`` (n,), with the bytes and chunks read."""

    keys: np.ndarray
    rows: np.ndarray
    values: np.ndarray
    bytes_read: int
    chunks_read: int


class ModeIndex:
    """One mode's fiber index, opened: its small tables in memory, its chunks read on demand."""

    def __init__(self, store: Store, mode: int, group, meta: dict) -> None:
        self.store = store
        self.mode = mode
        self.group = group
        self.meta = meta
        self.nnz = int(meta["nnz"])
        self.chunk_nnz = int(meta["chunk_nnz"])
        self.nchunks = int(meta["nchunks"])
        self.first: np.ndarray = group["first"][...] if self.nchunks else np.zeros(0, np.uint64)
        self.crc: np.ndarray = group["crc"][...] if self.nchunks else np.zeros((3, 0), np.int64)
        self.size: np.ndarray = group["size"][...] if self.nchunks else np.zeros((3, 0), np.int64)
        # the filter's chunk checksums (its words are read per query)
        self.bloom_crc: np.ndarray = group["bloom_crc"][...]

    def check(self) -> None:
        """Refuse arrays or tables that are not the ones the index was built with."""
        where = f"fiber index of mode {self.mode}"
        if _arrays_checksum(self.group) != self.meta["arrays_checksum"]:
            raise CorruptStoreError(
                f"{self.store.path}: {where}: the Zarr metadata of its arrays was changed after it was built; "
                f"build it again (tfooc fiber-index --overwrite)"
            )
        tables = (self.first.shape, self.crc.shape, self.size.shape)
        bloom_chunks = int(self.meta["bloom_words"]) // BLOOM_CHUNK_WORDS
        if tables != ((self.nchunks,), (3, self.nchunks), (3, self.nchunks)) or self.bloom_crc.shape != (bloom_chunks,):
            raise CorruptStoreError(f"{self.store.path}: {where}: its chunk tables do not have {self.nchunks} chunks")
        if _tables_checksum(self.first, self.crc, self.size, self.bloom_crc) != self.meta["tables_checksum"]:
            raise CorruptStoreError(
                f"{self.store.path}: {where}: its chunk tables were edited after it was built; build it again"
            )
        if self.nchunks and np.any(self.first[1:] < self.first[:-1]):
            raise CorruptStoreError(f"{self.store.path}: {where}: its chunk table is not sorted")

    @cached_property
    def _files(self) -> tuple[ShardReader, ...]:
        return tuple(ShardReader(self.group[name], self.store.path) for name in ARRAYS)

    @property
    def row_dtype(self) -> np.dtype:
        return np.dtype(self.meta["row_dtype"])

    def chunks_of(self, keys: np.ndarray) -> np.ndarray:
        """The sorted distinct chunks that may hold the fibers of ``keys`` (uint64, any order): for
        each key, the chunk its run starts in through the chunk its run ends in."""
        if self.nchunks == 0 or keys.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        keys = distinct_sorted(np.asarray(keys, dtype=np.uint64))
        lo = np.maximum(np.searchsorted(self.first, keys, side="left") - 1, 0)
        hi = np.maximum(np.searchsorted(self.first, keys, side="right") - 1, 0)
        # keys sorted: each key's span starts at or after where the one before ended, so the spans
        # laid end to end are sorted and need only their repeats dropped
        if np.array_equal(lo, hi):
            return distinct_sorted(lo)
        span = hi - lo + 1
        starts = np.repeat(lo - np.cumsum(np.concatenate([[0], span[:-1]])), span)
        return distinct_sorted(starts + np.arange(int(span.sum())))

    @cached_property
    def _bloom_file(self) -> ShardReader:
        return ShardReader(self.group["bloom"], self.store.path)

    def may_hold(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """Whether each key's fiber may hold nonzeros (False: it holds none, for certain), and the
        bytes of the filter read to say so (the chunks of these keys' blocks only)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        per = BLOOM_CHUNK_WORDS // BLOOM_BLOCK_WORDS
        blocks = bloom_blocks(keys, int(self.meta["bloom_words"]) // BLOOM_BLOCK_WORDS)
        chunks = distinct_sorted(blocks // per)
        words = np.empty(chunks.shape[0] * BLOOM_CHUNK_WORDS, dtype=np.uint64)
        try:
            crcs, nbytes = self._bloom_file.read_many(chunks, words)
        except (ShardError, OSError) as exc:
            raise CorruptStoreError(f"{self.store.path}: fiber index of mode {self.mode}, 'bloom': {exc}") from exc
        if not np.array_equal(crcs, self.bloom_crc[chunks]):
            raise CorruptStoreError(
                f"{self.store.path}: fiber index of mode {self.mode}: its Bloom filter was edited after it was built; "
                "build it again"
            )
        slots = np.searchsorted(chunks, blocks // per) * BLOOM_CHUNK_WORDS + (blocks % per) * BLOOM_BLOCK_WORDS
        return blocked_query(keys, words, slots), nbytes

    def chunk_bytes(self, chunks: np.ndarray) -> int:
        """Stored bytes of ``chunks`` (of the three arrays): what reading them costs."""
        return int(self.size[:, np.asarray(chunks, dtype=np.int64)].sum())

    def read(self, chunks: np.ndarray, scratch: ScratchBuffers | None = None) -> Gathered:
        """The entries of ``chunks`` (sorted chunk ids), concatenated in key order; every chunk's
        CRC32C and position checked. Each array's chunks are read together and decoded straight
        into their places in the output (rows keep their stored dtype) on the calling numba
        threads (:meth:`ShardReader.read_many`). With ``scratch`` the entries (and the bytes read)
        are views of its buffers, valid until its next use."""
        chunks = np.asarray(chunks, dtype=np.int64)
        n, C = self.nnz, self.chunk_nnz
        total = int(np.sum(np.minimum(n, (chunks + 1) * C) - chunks * C))
        # chunk j decodes whole into slot j: only the array's last chunk is short, and it sorts last
        space = chunks.shape[0] * C
        if scratch is None:
            keys = np.empty(space, dtype=np.uint64)
            rows = np.empty(space, dtype=self.row_dtype)
            values = np.empty(space, dtype=self.store.value_dtype)
        else:
            keys = scratch.take("key", space, np.uint64)
            rows = scratch.take("row", space, self.row_dtype)
            values = scratch.take("value", space, self.store.value_dtype)
        nbytes = 0
        for k, (f, out) in enumerate(zip(self._files, (keys, rows, values))):
            try:
                crcs, got = f.read_many(chunks, out, scratch)
            except (ShardError, FileNotFoundError) as exc:
                raise CorruptStoreError(
                    f"{self.store.path}: fiber index of mode {self.mode}, '{ARRAYS[k]}': {exc}"
                ) from exc
            except OSError as exc:  # the system's limits (open files, I/O errors) are not the index's fault
                raise OSError(
                    exc.errno, f"{self.store.path}: reading the fiber index of mode {self.mode}: {exc.strerror}"
                ) from exc
            moved = crcs != self.crc[k, chunks]
            if np.any(moved):
                j = int(np.argmax(moved))
                self._check_position(k, int(chunks[j]), int(crcs[j]))
            nbytes += got
        if self._files[0].delta:
            undelta_chunks(keys, chunks.shape[0], C)
        keys, rows, values = keys[:total], rows[:total], values[:total]
        self._check_entries(chunks, np.arange(chunks.shape[0], dtype=np.int64) * C, keys, rows)
        return Gathered(keys, rows, values, nbytes, int(chunks.shape[0]))

    def _check_position(self, k: int, c: int, got: int | None) -> None:
        want = int(self.crc[k, c])
        if got is None or got == want:
            return
        name = ARRAYS[k]
        if got == ABSENT:
            raise CorruptStoreError(
                f"{self.store.path}: fiber index of mode {self.mode}: chunk {c} of '{name}' is missing"
            )
        raise CorruptStoreError(
            f"{self.store.path}: fiber index of mode {self.mode}: chunk {c} of '{name}' does not belong at this "
            f"position (checksum {got:#010x}, recorded {want:#010x}); build the index again"
        )

    def _check_entries(self, chunks: np.ndarray, starts: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
        """What the kernels index with is checked here: rows inside the mode, keys sorted and
        starting at each chunk's recorded first key, inside the key space."""
        if keys.shape[0] == 0:
            return
        length = self.store.shape[self.mode]
        fault = _entries_fault(keys, rows, starts, self.first[chunks], length)
        if fault == _ROW_OUTSIDE:  # unsigned: never below 0
            raise CorruptStoreError(
                f"{self.store.path}: fiber index of mode {self.mode}: a row index outside 0..{length - 1}"
            )
        if fault == _KEYS_OUT_OF_ORDER:
            raise CorruptStoreError(
                f"{self.store.path}: fiber index of mode {self.mode}: chunk keys do not match the chunk table"
            )
        if int(keys[-1]) >= int(self.meta["key_space"]):
            raise CorruptStoreError(f"{self.store.path}: fiber index of mode {self.mode}: a key beyond the key space")

    def stored_bytes(self) -> int:
        return int(self.size.sum())


_ROW_OUTSIDE, _KEYS_OUT_OF_ORDER = 1, 2


@nb.njit(parallel=True, nogil=True, cache=True)
def _entries_fault(keys, rows, starts, first, length):
    """0 where read entries are sound; :data:`_ROW_OUTSIDE` where a row is ``length`` or more,
    else :data:`_KEYS_OUT_OF_ORDER` where the keys are not sorted or a chunk (from ``starts[j]``)
    does not start at its recorded first key ``first[j]``. One parallel pass over the chunks, where
    four NumPy passes (and a temporary a key) took 10 ms a group of 4 M entries."""
    n = keys.shape[0]
    nchunks = starts.shape[0]
    fault = np.zeros(nchunks, dtype=np.int8)
    for j in nb.prange(nchunks):
        lo = starts[j]
        hi = starts[j + 1] if j + 1 < nchunks else n
        if keys[lo] != first[j] or (lo > 0 and keys[lo] < keys[lo - 1]):
            fault[j] = _KEYS_OUT_OF_ORDER
        for i in range(lo, hi):
            if rows[i] >= length:
                fault[j] = _ROW_OUTSIDE
                break
            if i > lo and keys[i] < keys[i - 1]:
                fault[j] = _KEYS_OUT_OF_ORDER
    worst = 0
    for j in range(nchunks):
        if fault[j] == _ROW_OUTSIDE:
            return _ROW_OUTSIDE
        worst = max(worst, fault[j])
    return worst


class FiberIndex:
    """A store's fiber index: the modes it holds (see :func:`open_fiber_index`)."""

    def __init__(self, store: Store, meta: dict, group) -> None:
        self.store = store
        self.meta = meta
        self.group = group
        self._modes: dict[int, ModeIndex] = {}

    @property
    def modes(self) -> list[int]:
        return sorted(int(m) for m in self.meta["modes"])

    def mode(self, mode: int) -> ModeIndex | None:
        """Mode ``mode``'s index, opened and checked on first use; None where it has none."""
        if str(mode) not in self.meta["modes"]:
            return None
        if mode not in self._modes:
            try:
                with quiet_numcodecs():  # the key array's Delta filter
                    idx = ModeIndex(self.store, mode, self.group[f"m{mode}"], self.meta["modes"][str(mode)])
                    idx.check()
                    idx._files  # noqa: B018 - its arrays opened here, inside the quiet block
            except KeyError as exc:
                raise CorruptStoreError(
                    f"{self.store.path}: fiber index of mode {mode}: array {exc} is missing; build it again"
                ) from exc
            self._modes[mode] = idx
        return self._modes[mode]

    def bloom_bytes(self, modes: list[int] | None = None, samples: int = 0) -> int:
        """Bytes the Bloom filters of ``modes`` (default all) hold in memory: their chunk checksums
        and shard tables, kept once read, and the chunks one query of ``samples`` keys reads
        (twice: as read and decoded; one mode is queried at a time)."""
        modes = self.modes if modes is None else modes
        chunks = [int(self.meta["modes"][str(m)]["bloom_words"]) // BLOOM_CHUNK_WORDS for m in modes]
        query = max((min(c, int(samples)) for c in chunks), default=0)
        return 24 * sum(chunks) + query * BLOOM_CHUNK_WORDS * 8 * 2

    def describe(self) -> dict:
        """Per mode, for ``tfooc info``: chunks, bytes and bytes per nonzero."""
        out = {}
        for m in self.modes:
            mm = self.meta["modes"][str(m)]
            # the entries' chunks, and the Bloom filter beside them (8 bits a fiber, before compression)
            nbytes = int(mm["bytes"])
            bloom = _bloom_bytes(mm)
            out[str(m)] = {
                "nnz": mm["nnz"],
                "fibers": mm.get("fibers"),
                "chunks": mm["nchunks"],
                "chunk_nnz": mm["chunk_nnz"],
                "bytes": nbytes,
                "bloom_bytes": bloom,
                "bytes_per_nnz": (nbytes + bloom) / max(1, mm["nnz"]),
                "build_seconds": mm.get("build_seconds"),
            }
        return out


def _bloom_bytes(mode_meta: dict) -> int:
    """Bytes of a mode's Bloom filter (8 bits a fiber, uncompressed) from its metadata."""
    return 8 * int(mode_meta["bloom_words"])


def open_fiber_index(store: Store) -> FiberIndex | None:
    """The fiber index of ``store``, its binding checked; None where it has none.

    Raises :class:`~tensorflow_ooc.errors.CorruptStoreError` for an index that another store wrote,
    or whose metadata was edited."""
    if GROUP not in store.root:
        return None
    group = store.root[GROUP]
    meta = dict(group.attrs).get(INDEX_KEY)
    if not isinstance(meta, dict) or not meta.get("modes"):
        return None
    where = f"{store.path}: fiber index"
    if meta.get(CHECKSUM_KEY) != meta_checksum(meta):
        raise CorruptStoreError(f"{where}: its metadata was edited after it was built; build it again")
    if meta.get("version") != INDEX_VERSION:
        raise CorruptStoreError(
            f"{where}: version {meta.get('version')!r} is not supported (this build reads {INDEX_VERSION}: its Bloom "
            "filter is read per query); build it again (tfooc fiber-index --overwrite)"
        )
    if meta.get("store_id") != store.meta.get("store_id") or meta.get("store_checksum") != store.meta.get(CHECKSUM_KEY):
        raise CorruptStoreError(
            f"{where}: it was built for another store (or before this store's metadata changed); build it again "
            f"(tfooc fiber-index --overwrite)"
        )
    return FiberIndex(store, meta, group)


# --- writing ------------------------------------------------------------------------------------


class ModeIndexWriter:
    """Writes one mode's index from entries appended in key order, a shard at a time, into a
    staging group; :func:`publish_modes` moves finished modes into the store and records them."""

    def __init__(self, store: Store, mode: int, chunk_nnz: int | None = None) -> None:
        if not exact_keys(store.shape, mode):
            cells = key_space(store.shape, mode)
            raise ValueError(
                f"mode {mode}: the other modes' index space ({cells:,} cells) exceeds 2^63, so its fibers "
                "have no exact key; that mode cannot be indexed"
            )
        if chunk_nnz is not None and chunk_nnz < 1:
            raise ValueError(f"chunk_nnz must be >= 1, got {chunk_nnz}")
        self.store = store
        self.mode = mode
        # None: chosen at the first write from the fibers of the entries pending then (auto_chunk_nnz)
        self.chunk_nnz = None if chunk_nnz is None else int(chunk_nnz)
        provisional = self.chunk_nnz or DEFAULT_FIBER_CHUNK_NNZ
        self.shard_nnz = provisional * shard_chunks(provisional)
        self.t0 = time.perf_counter()
        self.compression = store.meta.get("compression", "small")
        self.row_dtype = row_dtype(store.shape[mode])
        self.remote = paths.is_url(store.path)
        base = store.path.rstrip("/")
        if self.remote:
            self.staging = f"{base}/{GROUP}/m{mode}"
            paths.remove(self.staging)
        else:
            parent = Path(base).parent
            self.staging = str(parent / f".{Path(base).name}.{GROUP}-m{mode}.staging-{uuid.uuid4().hex[:8]}")
        self.group = zarr.open_group(self.staging, mode="w", **{**paths.read_options(self.staging), "zarr_format": 3})
        self.arrays: dict = {}
        self.writers: dict[str, ShardWriter] = {}
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending_n = 0
        self.written = 0
        self.first: list[np.ndarray] = []
        self.crc: dict[str, list[np.ndarray]] = {name: [] for name in ARRAYS}
        self.size: dict[str, list[np.ndarray]] = {name: [] for name in ARRAYS}
        self.last_key = -1
        self.distinct = 0  # distinct keys (fibers): the Bloom filter's size
        # the filter is filled as keys are appended, sized for a fiber a nonzero (the most there
        # can be) and folded at the end to the size of the fibers' count (folded_filter): keeping
        # the distinct keys in a file to read back wrote and read 8 bytes a fiber (4 GB a mode of
        # a 500 M heavy-tailed store); allocated at the first append
        self.bloom: np.ndarray | None = None
        self.bloom_keys = ScratchBuffers()  # the gathered keys and the grouped inserts' scratch
        self.bloom_pending = 0

    def _create(self, sample_values: np.ndarray) -> None:
        """The three sharded arrays (the values' codecs chosen from a sample, as the store's)."""
        n = max(1, self.store.nnz)
        opts = {"shape": (n,), "chunks": (self.chunk_nnz,), "shards": (self.shard_nnz,), "fill_value": 0}
        padding = value_padding(self.store.nnz, self.chunk_nnz)
        codecs = {
            "key": IndexCodecs(self.compression, "delta64", fiber_keys=True).array_options(),
            "row": ValueCodecs(self.row_dtype, self.compression).array_options(),
            "value": ValueCodecs.for_sample(
                self.store.value_dtype, self.compression, sample_values, padding
            ).array_options(),
        }
        dtypes = {"key": np.uint64, "row": self.row_dtype, "value": self.store.value_dtype}
        with quiet_numcodecs():
            for name in ARRAYS:
                self.arrays[name] = self.group.create_array(name, dtype=dtypes[name], **opts, **codecs[name])
                self.writers[name] = ShardWriter(self.arrays[name], self.staging)

    def append(self, keys: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """Entries following every entry appended so far in key order; none of them is kept past
        the call (what waits for the next shard is copied), so the caller may reuse the arrays."""
        if keys.shape[0] == 0:
            return
        if int(keys[0]) < self.last_key:
            raise ValueError("fiber index entries must be appended in key order")
        new = np.empty(keys.shape[0], dtype=bool)
        new[0] = int(keys[0]) != self.last_key
        np.not_equal(keys[1:], keys[:-1], out=new[1:])
        fresh = keys[new]
        self.distinct += fresh.shape[0]
        self._gather_fibers(fresh)
        self.last_key = int(keys[-1])
        self.pending.append((keys, rows, values))
        self.pending_n += keys.shape[0]
        if self.pending_n >= self.shard_nnz:
            self._flush(final=False)
        else:
            self.pending[-1] = (keys.copy(), rows.copy(), values.copy())

    def _flush(self, final: bool) -> None:
        if not self.pending:
            return
        if len(self.pending) == 1:  # a sorted run longer than a shard: written from where it is
            keys, rows, values = self.pending[0]
        else:
            keys = np.concatenate([p[0] for p in self.pending])
            rows = np.concatenate([p[1] for p in self.pending])
            values = np.concatenate([p[2] for p in self.pending])
        if self.chunk_nnz is None:
            # from the mode's first (provisional) shard of entries, whatever the build's runs: the
            # same choice under any memory limit
            head = keys[: self.shard_nnz]
            fibers = 1 + int(np.count_nonzero(head[1:] != head[:-1]))
            self.chunk_nnz = auto_chunk_nnz(head.shape[0], fibers)
            self.shard_nnz = self.chunk_nnz * shard_chunks(self.chunk_nnz)
        take = keys.shape[0] if final else keys.shape[0] // self.shard_nnz * self.shard_nnz
        if not self.arrays:
            self._create(values[: self.chunk_nnz])
        for at in range(0, take, self.shard_nnz):
            stop = min(take, at + self.shard_nnz)
            shard = (self.written + at) // self.shard_nnz
            for name, data in (
                ("key", keys[at:stop]),
                ("row", rows[at:stop].astype(self.row_dtype, copy=False)),
                ("value", values[at:stop].astype(self.store.value_dtype, copy=False)),
            ):
                crcs, sizes = self.writers[name].write(shard, data)
                self.crc[name].append(crcs)
                self.size[name].append(sizes)
            self.first.append(np.ascontiguousarray(keys[at : stop : self.chunk_nnz]))
        self.written += take
        rest = keys.shape[0] - take
        # the rest copied, so the run it came from is freed
        self.pending = [(keys[take:].copy(), rows[take:].copy(), values[take:].copy())] if rest else []
        self.pending_n = rest

    def finish(self) -> dict:
        """Write what is pending and the chunk tables; the mode's metadata for :func:`publish_modes`."""
        self._flush(final=True)
        self.chunk_nnz = self.chunk_nnz or DEFAULT_FIBER_CHUNK_NNZ  # no entries: nothing chose it
        if self.written != self.store.nnz:
            raise RuntimeError(
                f"fiber index of mode {self.mode}: {self.written:,} entries written for {self.store.nnz:,} nonzeros"
            )
        if not self.arrays:
            self._create(np.zeros(1, self.store.value_dtype))
        first = np.concatenate([np.zeros(0, np.uint64), *self.first])
        nchunks = first.shape[0]
        crc = np.array([np.concatenate([np.zeros(0, np.int64), *self.crc[name]]) for name in ARRAYS]).reshape(
            3, nchunks
        )
        size = np.array([np.concatenate([np.zeros(0, np.int64), *self.size[name]]) for name in ARRAYS]).reshape(
            3, nchunks
        )
        bloom = self._bloom()
        bloom_crc = self._write_bloom(bloom)
        for name, arr in (("first", first), ("crc", crc), ("size", size), ("bloom_crc", bloom_crc)):
            a = self.group.create_array(
                name,
                shape=arr.shape,
                chunks=tuple(max(1, s) for s in arr.shape),
                dtype=arr.dtype,
                fill_value=0,
                **TableCodecs().array_options(),
            )
            if arr.size:
                a[...] = arr
        with quiet_numcodecs():
            arrays_sum = _arrays_checksum(self.group)
        return {
            "nnz": self.written,
            "chunk_nnz": self.chunk_nnz,
            "nchunks": nchunks,
            "row_dtype": self.row_dtype.str,
            "key_space": key_space(self.store.shape, self.mode),
            "arrays_checksum": arrays_sum,
            "tables_checksum": _tables_checksum(first, crc, size, bloom_crc),
            "bytes": int(size.sum()),
            "fibers": self.distinct,
            "bloom_words": int(bloom.shape[0]),
            "build_seconds": time.perf_counter() - self.t0,
        }

    def _gather_fibers(self, fresh: np.ndarray) -> None:
        """Distinct keys into the filter, gathered in groups of about half its words: grouped by
        region, each region's inserts hit the cache."""
        if self.bloom is None:
            self.bloom = np.zeros(max(BLOOM_CHUNK_WORDS, bloom_words(self.store.nnz)), dtype=np.uint64)
        group = min(max(1, self.store.nnz), max(BLOOM_GROUP_ENTRIES, self.bloom.shape[0] // 2))
        at = 0
        while at < fresh.shape[0]:
            buf = self.bloom_keys.take("keys", group, np.uint64)
            take = min(group - self.bloom_pending, fresh.shape[0] - at)
            buf[self.bloom_pending : self.bloom_pending + take] = fresh[at : at + take]
            self.bloom_pending += take
            at += take
            if self.bloom_pending == group:
                self._insert_fibers()

    def _insert_fibers(self) -> None:
        if self.bloom_pending:
            assert self.bloom is not None
            keys = self.bloom_keys.take("keys", self.bloom_pending, np.uint64)
            blocked_insert_by_region(keys, self.bloom, self.bloom_keys.take("scratch", keys.shape[0], np.uint64))
            self.bloom_pending = 0

    def _bloom(self) -> np.ndarray:
        """The blocked Bloom filter of the mode's keys: the one filled as they were appended,
        folded to the size of their count."""
        self._insert_fibers()
        words = self.bloom if self.bloom is not None else np.zeros(BLOOM_CHUNK_WORDS, dtype=np.uint64)
        self.bloom, self.bloom_keys = None, ScratchBuffers()
        return folded_filter(words, max(BLOOM_CHUNK_WORDS, bloom_words(self.distinct)))

    def _write_bloom(self, words: np.ndarray) -> np.ndarray:
        """The filter as a sharded, uncompressed array of small chunks; their CRC32Cs."""
        shard = BLOOM_CHUNK_WORDS * min(BLOOM_SHARD_CHUNKS, words.shape[0] // BLOOM_CHUNK_WORDS)
        array = self.group.create_array(
            "bloom",
            shape=words.shape,
            chunks=(BLOOM_CHUNK_WORDS,),
            shards=(shard,),
            dtype=np.uint64,
            fill_value=0,
            compressors=[Crc32cCodec()],
        )
        writer = ShardWriter(array, self.staging)
        crcs = [writer.write(s, words[at : at + shard])[0] for s, at in enumerate(range(0, words.shape[0], shard))]
        return np.concatenate(crcs)

    def abort(self) -> None:
        """Remove the staging group (the store's published index is untouched; remote: the mode)."""
        self.bloom, self.bloom_keys = None, ScratchBuffers()
        paths.remove(self.staging)


def publish_modes(store: Store, written: dict[int, tuple[ModeIndexWriter, dict]]) -> None:
    """Move finished modes into the store's ``fibers`` group and record them in its metadata (the
    last write: until then readers see the index as it was, less the replaced modes)."""
    base = store.path.rstrip("/")
    group_path = f"{base}/{GROUP}"
    opts = paths.read_options(group_path)
    if GROUP in store.root:
        meta = dict(dict(zarr.open_group(group_path, mode="r", **opts).attrs).get(INDEX_KEY) or {})
    else:
        meta = {}
    modes = dict(meta.get("modes") or {}) if meta.get("store_id") == store.meta.get("store_id") else {}
    group = zarr.open_group(group_path, mode="a", **{**opts, "zarr_format": 3})
    for m in written:
        modes.pop(str(m), None)
    group.attrs.put({INDEX_KEY: _with_checksum(store, modes)})  # replaced modes leave first
    for m, (w, mode_meta) in written.items():
        if not w.remote:
            final = Path(group_path) / f"m{m}"
            if final.exists():
                shutil.rmtree(final)  # this package's own index of the mode, replaced
            Path(w.staging).rename(final)
        modes[str(m)] = mode_meta
    group.attrs.put({INDEX_KEY: _with_checksum(store, modes)})


def _with_checksum(store: Store, modes: dict) -> dict:
    meta = {
        "version": INDEX_VERSION,
        "store_id": store.meta.get("store_id"),
        "store_checksum": store.meta.get(CHECKSUM_KEY),
        "modes": modes,
    }
    meta[CHECKSUM_KEY] = meta_checksum(meta)
    return meta
