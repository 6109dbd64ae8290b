"""Open, validate and read BLCO Zarr stores."""

from __future__ import annotations

import asyncio
import math
import os
import threading
import traceback
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from ..errors import CorruptStoreError, ForeignStoreError, IncompleteStoreError, StoreError
from ..format import BitLayout, BlockTable, delinearize, reencode
from ..format.index_encoding import (
    DELTA32,
    DELTA64,
    ENCODINGS,
    NO_PATCH_POSITIONS,
    NO_PATCH_WORDS,
    delta_words,
    split_at_patches,
)
from ..format.linearize import field_minmax
from . import chunk_cache, paths
from .chunk_files import ABSENT, UNCHECKED, ChunkDecodeError, ChunkFiles
from .codecs import quiet_numcodecs
from .metadata import (
    ARRAY_NAMES,
    CHECKSUM_KEY,
    FORMAT_NAME,
    META_KEY,
    SUPPORTED_VERSIONS,
    arrays_checksum,
    meta_checksum,
    patches_checksum,
)


@dataclass
class Block:
    """One BLCO block: re-encoded indices sharing ``base``; decode with ``delinearize``."""

    id: int
    start: int
    base: np.ndarray  # int64 (nmodes,)
    index: np.ndarray  # uint64 (count,)
    values: np.ndarray


@dataclass
class Chunk:
    """One storage chunk: a run of nonzeros and the block segments it holds.

    ``segments`` rows are (block id, first, stop) with first/stop relative to the chunk.
    """

    id: int
    start: int
    index: np.ndarray
    values: np.ndarray
    segments: np.ndarray  # int64 (nseg, 3)
    bases: np.ndarray  # int64 (nseg, nmodes)
    min: np.ndarray  # int64 (nmodes,) smallest index per mode in this chunk
    max: np.ndarray  # int64 (nmodes,)

    def coords(self, layout: BitLayout) -> np.ndarray:
        out = np.empty((self.index.shape[0], layout.nmodes), dtype=np.int64)
        for (_, s, e), base in zip(self.segments, self.bases):
            delinearize(self.index[s:e], base, layout, out=out[s:e])
        return out


@dataclass
class EncodedChunk:
    """A chunk as stored, before re-encoding: for the streaming reader, which decodes it into its
    own buffers (see :meth:`Store.read_encoded`).

    ``alto`` holds the low ALTO words, or their stored differences when ``alto_is_delta``:
    uint64 ones of the Delta filter (first value absolute), or ``delta32``'s uint32 ones with
    the chunk's ``patches`` (chunk-relative positions, words; the segments are cut at them).
    """

    id: int
    start: int
    alto: np.ndarray
    alto_is_delta: bool
    values: np.ndarray
    segments: np.ndarray  # int64 (nseg, 3), as in Chunk
    bases: np.ndarray  # int64 (nseg, nmodes)
    min: np.ndarray
    max: np.ndarray
    checksum: int | None = None  # CRC32C of the stored index chunk, when read from its bytes
    patches: tuple[np.ndarray, np.ndarray] | None = None  # delta32: (positions int64, words uint64)

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    def words(self, out: np.ndarray | None = None) -> np.ndarray:
        """The chunk's low ALTO words (uint64), whatever the index's encoding."""
        if not self.alto_is_delta:
            return self.alto
        if self.patches is None:
            return np.cumsum(self.alto, dtype=np.uint64, out=out)
        return delta_words(self.alto, *self.patches, out=out)


def chunk_index_range(chunk: Chunk, layout: BitLayout) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest decoded index per mode of a chunk, without materializing coordinates."""
    mins = np.full(layout.nmodes, np.iinfo(np.int64).max, dtype=np.int64)
    maxs = np.full(layout.nmodes, -1, dtype=np.int64)
    for (_, s, e), base in zip(chunk.segments, chunk.bases):
        if e > s:
            fmin, fmax = field_minmax(chunk.index[s:e], layout)
            np.minimum(mins, fmin + base, out=mins)
            np.maximum(maxs, fmax + base, out=maxs)
    return mins, maxs


def _fail(path: str, what: str) -> CorruptStoreError:
    return CorruptStoreError(f"{path}: corrupt store: {what}")


class Store:
    """A BLCO tensor stored in Zarr. Open with :func:`open_store`.

    Attributes
    ----------
    path, shape, nnz, nmodes, layout, value_dtype, chunk_nnz, nchunks, nblocks, meta
    """

    def __init__(self, path: str, root: zarr.Group, meta: dict) -> None:
        self.path = path
        self.root = root
        self.meta = meta
        self.shape: tuple[int, ...] = tuple(int(s) for s in meta["shape"])
        self.nnz: int = int(meta["nnz"])
        self.nmodes: int = len(self.shape)
        self.layout = BitLayout(self.shape)
        self.value_dtype = np.dtype(meta["value_dtype"])
        self.chunk_nnz: int = int(meta["chunk_nnz"])
        self.max_block_nnz: int = int(meta["max_block_nnz"])
        self.nchunks: int = int(meta["nchunks"])
        self.nblocks: int = int(meta["nblocks"])
        #: how ``alto`` is stored (format version 1: always ``delta64``)
        self.index_encoding: str = meta.get("index_encoding", DELTA64)
        self.index_dtype = np.dtype(np.uint32 if self.index_encoding == DELTA32 else np.uint64)

    def __repr__(self) -> str:
        return f"Store({self.path!r}, shape={self.shape}, nnz={self.nnz}, blocks={self.nblocks}, chunks={self.nchunks})"

    # --- summary ---------------------------------------------------------------------------------

    dense = False  # the decompositions' one input interface, shared with DenseArray

    def norm(self) -> float:
        """Frobenius norm of the tensor."""
        return math.sqrt(float(self.meta["norm_sq"]))

    @property
    def norm_sq(self) -> float:
        """||X||^2, recorded when the store was written."""
        return float(self.meta["norm_sq"])

    def stored_bytes(self) -> int:
        """Bytes one full pass reads: the compressed chunks of the index and value arrays."""
        base = str(self.path).rstrip("/")
        return sum(paths.disk_bytes(f"{base}/{name}") for name in ("alto", "values"))

    @cached_property
    def fibers(self):
        """The store's fiber index (:class:`~tensorflow_ooc.store.fiber_index.FiberIndex`), its
        binding to this store checked; None where it has none."""
        from .fiber_index import open_fiber_index

        return open_fiber_index(self)

    @cached_property
    def labels(self):
        """The store's label dictionaries (:class:`~tensorflow_ooc.store.labels.StoreLabels`), when
        it was converted from a table; None for a store of coordinates."""
        from .labels import open_labels

        return open_labels(self.path, self.meta, self.shape)

    @cached_property
    def mode_copies(self):
        """The store's mode-sorted copies (:class:`~tensorflow_ooc.store.mode_copies.ModeCopies`),
        their binding to this store checked; None where it has none."""
        from .mode_copies import open_mode_copies

        return open_mode_copies(self)

    def copy_modes(self) -> list[int]:
        """The modes the store keeps mode-sorted copies of (none without copies)."""
        return [] if self.mode_copies is None else self.mode_copies.modes

    def fiber_modes(self) -> list[int]:
        """The modes the fiber index holds (none without an index)."""
        return [] if self.fibers is None else self.fibers.modes

    @cached_property
    def blocks(self) -> BlockTable:
        g = self.root
        return BlockTable(g["blocks/key"][...], g["blocks/start"][...], g["blocks/count"][...], g["blocks/base"][...])

    @cached_property
    def patches(self) -> tuple[np.ndarray, np.ndarray]:
        """A ``delta32`` store's patch table: global positions (int64) and whole low ALTO words
        (uint64), empty for ``delta64``; checked at open."""
        if self.index_encoding != DELTA32:
            return NO_PATCH_POSITIONS, NO_PATCH_WORDS
        return self.root["patches/position"][...], self.root["patches/word"][...]

    def chunk_patches(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Patches of nonzeros ``[start, stop)`` (a ``delta32`` store; else None), relative to
        ``start``."""
        if self.index_encoding != DELTA32:
            return None
        pos, word = self.patches
        a, b = np.searchsorted(pos, [start, stop])
        return pos[a:b] - start, word[a:b]

    @cached_property
    def chunk_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Per chunk and mode, the smallest and largest index: two int64 arrays (nchunks, nmodes)."""
        return self.root["chunks/min"][...], self.root["chunks/max"][...]

    def disk_bytes(self) -> int:
        return paths.disk_bytes(self.path)

    def _stored_bytes(self, name: str) -> int:
        """Bytes array ``name``'s chunks (and metadata) take in the store."""
        try:
            return int(self.root[name].nbytes_stored())
        except Exception:  # a store whose listing is not available: unknown, not fatal for info
            return 0

    # --- reading ---------------------------------------------------------------------------------

    def _read(self, name: str, start: int, stop: int) -> np.ndarray:
        try:
            return self.root[name][start:stop]
        except Exception as exc:  # codec or checksum failure inside zarr
            first, last = start // self.chunk_nnz, max(start, stop - 1) // self.chunk_nnz
            raise _fail(self.path, f"array '{name}', chunks {first}..{last}: cannot decode ({exc})") from exc

    @cached_property
    def chunk_checksums(self) -> dict[str, np.ndarray] | None:
        """Per array ("alto", "values") and chunk, the CRC32C its stored bytes ended with when the
        store was written (``ABSENT``: no bytes stored); None for stores written before the table."""
        if "chunks/crc_alto" not in self.root:
            return None
        return {name: self.root[f"chunks/crc_{name}"][...] for name in ("alto", "values")}

    def check_chunk_position(self, c: int, name: str, got: int | None = None) -> None:
        """Raise :class:`CorruptStoreError` unless chunk ``c`` of array ``name`` holds the bytes
        written there: a checksum is recorded per position, so chunks that were swapped, copied
        over each other or taken from another store are refused, and so is a missing chunk (which
        Zarr would silently read back as zeros). ``got`` is the stored checksum if already read."""
        table = self.chunk_checksums
        if table is None:
            return
        want = int(table[name][c])
        if want == UNCHECKED:
            return
        files = self._chunk_files[0 if name == "alto" else 1]
        try:
            got = files.stored_checksum(c) if got is None else int(got)
        except ChunkDecodeError as exc:
            raise _fail(self.path, f"array '{name}', {exc}") from exc
        if got == want:
            return
        if got == ABSENT:
            raise _fail(self.path, f"chunk {c} of '{name}' is missing")
        if want == ABSENT:
            raise _fail(self.path, f"chunk {c} of '{name}' has stored bytes where the store wrote none")
        raise _fail(
            self.path,
            f"chunk {c} of '{name}' does not belong at this position (its checksum "
            f"{got:#010x} is not the {want:#010x} recorded when the store was written): "
            "chunks were moved, swapped, overwritten or copied from another store",
        )

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Re-encoded BLCO indices and values of nonzeros [start, stop)."""
        words, values = self._checked_words(start, stop)
        return reencode(words, self.layout), values

    def _checked_words(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Low ALTO words and values of nonzeros [start, stop) through Zarr, with their chunks'
        positions, their count and the layout's index bits checked."""
        for c in range(start // self.chunk_nnz, -(-stop // self.chunk_nnz)):
            self.check_chunk_position(c, "alto")
            self.check_chunk_position(c, "values")
        words = self._read_words(start, stop)
        values = self._read("values", start, stop)
        if words.shape[0] != stop - start or values.shape[0] != stop - start:
            raise _fail(self.path, f"nonzeros {start}..{stop} are missing")
        if self.layout.index_bits < 64 and words.size and int(words.max()) >> self.layout.index_bits:
            raise _fail(self.path, f"nonzeros {start}..{stop}: index bits beyond the layout's {self.layout.index_bits}")
        return words, values

    def _read_words(self, start: int, stop: int) -> np.ndarray:
        """Low ALTO words of nonzeros ``[start, stop)`` through Zarr (which undoes the Delta
        filter of ``delta64``; ``delta32`` differences are summed here from whole chunks, each
        starting with a patch)."""
        if self.index_encoding != DELTA32:
            return self._read("alto", start, stop)
        lo = start // self.chunk_nnz * self.chunk_nnz
        diffs = self._read("alto", lo, stop)
        patches = self.chunk_patches(lo, stop)
        if diffs.size and (patches[0].size == 0 or patches[0][0] != 0):
            raise _fail(self.path, f"nonzeros {lo}..{stop}: the patch table has no word for the chunk start")
        return delta_words(diffs, *patches)[start - lo :]

    def _segments(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.blocks
        ends = b.start + b.count
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(b.start, stop, side="left"))
        ids = np.arange(first, last)
        lo = np.maximum(b.start[ids], start) - start
        hi = np.minimum(ends[ids], stop) - start
        return np.stack([ids, lo, hi], axis=1).astype(np.int64), b.base[ids]

    @cached_property
    def _chunk_files(self) -> tuple[ChunkFiles, ChunkFiles]:
        # a store in object storage reads through this process's disk cache, keyed by store id
        store_id = self.meta.get("store_id")
        cache = chunk_cache.default_cache() if store_id and chunk_cache.wants_cache(self.root.store) else None
        table = self.chunk_checksums if cache is not None else None
        return tuple(
            ChunkFiles(
                self.root[name],
                cache,
                (str(store_id), name),
                None if table is None else table[name],
                delta=True if name == "alto" and self.index_encoding == DELTA32 else None,
            )
            for name in ("alto", "values")
        )

    @property
    def cached(self) -> bool:
        """Whether chunks are read through the worker's disk cache (a store in object storage;
        see :mod:`tensorflow_ooc.store.chunk_cache`)."""
        return any(f.cache is not None for f in self._chunk_files)

    def prefetch_window(self) -> int:
        """How many chunks ahead a reader should :meth:`prefetch` (0: nothing to fetch ahead)."""
        files = [f for f in self._chunk_files if f.cache is not None]
        if not files:
            return 0
        # an upper bound of a chunk's stored bytes: both arrays uncompressed
        chunk_bytes = self.chunk_nnz * (8 + self.value_dtype.itemsize)
        return chunk_cache.prefetch_window(chunk_bytes, files[0].cache)

    def prefetch(self, chunk_ids) -> int:
        """Start fetching chunks ``chunk_ids`` of a store in object storage into the worker's disk
        cache, in parallel, in the background; a no-op for local stores. Returns the number of
        chunk files queued."""
        ids = [c for c in chunk_ids if 0 <= c < self.nchunks]
        return sum(f.prefetch(ids) for f in self._chunk_files) if ids else 0

    def read_encoded(
        self,
        c: int,
        alto_out: np.ndarray,
        values_out: np.ndarray,
        map_values: bool = False,
        keep_nnz: int = 0,
        decode_threads: int = 1,
    ) -> EncodedChunk:
        """Chunk ``c`` decompressed into the caller's buffers (each at least ``chunk_nnz`` long),
        still ALTO-coded: the fast path for streaming, where re-encoding is fused with the Delta
        filter's prefix sum. Checksums are verified; index ranges are not (callers validate the
        re-encoded chunk with :meth:`check_chunk_range`).

        With ``map_values`` the values are mapped where they lie instead, where the store is
        :attr:`values_mappable` (mappings of up to ``keep_nnz`` values are kept, as in
        :meth:`view_encoded`); a chunk that cannot be mapped still goes to ``values_out``.
        ``decode_threads`` threads decompress (for callers that leave the other cores idle
        meanwhile)."""
        if not 0 <= c < self.nchunks:
            raise IndexError(f"chunk {c} out of range (store has {self.nchunks})")
        alto_files, value_files = self._chunk_files
        try:
            alto = alto_files.read(c, alto_out, decode_threads)
            values = value_files.view(c, keep_nnz) if map_values else None
            if values is None:
                values = value_files.read(c, values_out, decode_threads)
        except ChunkDecodeError as exc:
            raise _fail(self.path, f"chunk {c}: {exc}") from exc
        except Exception as exc:
            raise _fail(self.path, f"chunk {c}: cannot decode ({exc})") from exc
        return self._encoded(c, alto, values)

    @property
    def mappable(self) -> bool:
        """Whether :meth:`view_encoded` can hand out chunks without a copy (a store written with
        compression "none", local or copied into the chunk cache)."""
        alto_files, value_files = self._chunk_files
        return alto_files.raw and value_files.raw and alto_files.files and value_files.files

    @property
    def values_mappable(self) -> bool:
        """Whether :meth:`read_encoded` can map the values instead of copying them (a store, local
        or copied into the chunk cache, whose values are stored uncompressed: compression "none",
        or "fast" with values that barely compress)."""
        value_files = self._chunk_files[1]
        return value_files.raw and value_files.files

    def view_encoded(self, c: int, keep_nnz: int = 0) -> EncodedChunk | None:
        """Chunk ``c`` as :meth:`read_encoded` gives it, but mapped from its files instead of copied
        into buffers (checksums and positions checked the same way); None unless the store is
        :attr:`mappable` and both of the chunk's files exist. Mappings of up to ``keep_nnz``
        nonzeros are kept for later calls (see :meth:`ChunkFiles.view`)."""
        if not 0 <= c < self.nchunks:
            raise IndexError(f"chunk {c} out of range (store has {self.nchunks})")
        if not self.mappable:
            return None
        alto_files, value_files = self._chunk_files
        try:
            alto = alto_files.view(c, keep_nnz)
            values = value_files.view(c, keep_nnz)
        except ChunkDecodeError as exc:
            raise _fail(self.path, f"chunk {c}: {exc}") from exc
        if alto is None or values is None:
            return None
        return self._encoded(c, alto, values)

    def _encoded(self, c: int, alto, values) -> EncodedChunk:
        self.check_chunk_position(c, "alto", alto.checksum)
        self.check_chunk_position(c, "values", values.checksum)
        start = c * self.chunk_nnz
        stop = min(self.nnz, start + self.chunk_nnz)
        if alto.data.shape[0] != stop - start or values.data.shape[0] != stop - start:
            raise _fail(self.path, f"chunk {c}: nonzeros {start}..{stop} are missing")
        segs, bases, patches = self._chunk_segments(c)
        mins, maxs = self.chunk_ranges
        return EncodedChunk(
            c, start, alto.data, alto.is_delta, values.data, segs, bases, mins[c], maxs[c], alto.checksum, patches
        )

    def _chunk_segments(self, c: int) -> tuple[np.ndarray, np.ndarray, tuple | None]:
        start = c * self.chunk_nnz
        stop = min(self.nnz, start + self.chunk_nnz)
        segs, bases = self._segments(start, stop)
        patches = self.chunk_patches(start, stop)
        if patches is not None:
            if patches[0].size == 0 or patches[0][0] != 0:
                raise _fail(self.path, f"chunk {c}: the patch table has no word for its first nonzero")
            # a work item sums differences from its first word: none may span a patch
            segs, bases = split_at_patches(segs, bases, patches[0])
        return segs, bases, patches

    def chunk_segments(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``c``'s block segments (block id, first, stop; relative to the chunk) and their
        bases, split at the patches of a ``delta32`` store, as streamed work items are cut."""
        return self._chunk_segments(c)[:2]

    def check_chunk_range(self, c: int, cmin: np.ndarray, cmax: np.ndarray, alto_bits: int | None = None) -> None:
        """Raise :class:`CorruptStoreError` unless chunk ``c``'s decoded per-mode index range equals
        the stored range table (which lies inside the shape), and, given the OR of its ALTO words,
        no bit beyond the layout is set. This is what keeps a damaged store away from the
        unchecked kernels."""
        if alto_bits is not None and self.layout.index_bits < 64 and alto_bits >> self.layout.index_bits:
            raise _fail(self.path, f"chunk {c}: index bits beyond the layout's {self.layout.index_bits}")
        mins, maxs = self.chunk_ranges
        if (np.asarray(cmin) != mins[c]).any() or (np.asarray(cmax) != maxs[c]).any():
            raise _fail(self.path, f"chunk {c}: decoded indices disagree with the chunk range table")

    def read_chunk(self, c: int, validate: bool = True) -> Chunk:
        """Chunk ``c``. With ``validate`` its decoded indices are checked against the stored
        per-chunk ranges (which lie inside the shape), so a damaged store never reaches the kernels."""
        if not 0 <= c < self.nchunks:
            raise IndexError(f"chunk {c} out of range (store has {self.nchunks})")
        mins, maxs = self.chunk_ranges
        start = c * self.chunk_nnz
        stop = min(self.nnz, start + self.chunk_nnz)
        index, values = self.read_range(start, stop)
        segs, bases = self._segments(start, stop)
        chunk = Chunk(c, start, index, values, segs, bases, mins[c], maxs[c])
        if validate:
            self.check_chunk_range(c, *chunk_index_range(chunk, self.layout))
        return chunk

    def read_alto(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``c`` as the writer takes it: whole ALTO words (nwords, n) uint64 -- the stored
        low words and each block's key words above them -- and the values; validated as
        :meth:`read_chunk` validates (positions, index bits, decoded ranges)."""
        if not 0 <= c < self.nchunks:
            raise IndexError(f"chunk {c} out of range (store has {self.nchunks})")
        start = c * self.chunk_nnz
        stop = min(self.nnz, start + self.chunk_nnz)
        low, values = self._checked_words(start, stop)
        segs, bases = self._segments(start, stop)
        mins, maxs = self.chunk_ranges
        chunk = Chunk(c, start, reencode(low, self.layout), values, segs, bases, mins[c], maxs[c])
        self.check_chunk_range(c, *chunk_index_range(chunk, self.layout))
        keys = np.zeros((self.layout.nwords, low.shape[0]), dtype=np.uint64)
        keys[0] = low
        if self.layout.nwords > 1:
            key = self.blocks.key
            for b, lo, hi in segs:
                keys[1:, lo:hi] = key[b][: self.layout.nwords - 1, None]
        return keys, values

    def iter_chunks(self, validate: bool = True) -> Iterator[Chunk]:
        """Chunks in order (see :meth:`read_chunk`)."""
        for c in range(self.nchunks):
            yield self.read_chunk(c, validate)

    def iter_blocks(self) -> Iterator[Block]:
        """Blocks in order (a block may span several chunks)."""
        b = self.blocks
        lo = hi = 0
        index = values = None
        for i in range(b.nblocks):
            s, n = int(b.start[i]), int(b.count[i])
            if s + n > hi:
                # read whole chunks at a time: hypersparse stores have many tiny blocks per chunk
                lo = s
                hi = min(self.nnz, max(s + n, (s // self.chunk_nnz + 1) * self.chunk_nnz))
                index, values = self.read_range(lo, hi)
            yield Block(i, s, b.base[i], index[s - lo : s - lo + n], values[s - lo : s - lo + n])

    def to_coo(self) -> tuple[np.ndarray, np.ndarray]:
        """All nonzeros as 0-based coordinates (nnz, nmodes) int64 and values, in ALTO order."""
        coords = np.empty((self.nnz, self.nmodes), dtype=np.int64)
        values = np.empty(self.nnz, dtype=self.value_dtype)
        for ch in self.iter_chunks():
            n = ch.index.shape[0]
            coords[ch.start : ch.start + n] = ch.coords(self.layout)
            values[ch.start : ch.start + n] = ch.values
        return coords, values

    def info(self) -> dict:
        """Summary for ``tfooc info``: sizes, compression and per-mode statistics."""
        raw = self.nnz * (8 * self.nmodes + 8)
        disk = self.disk_bytes()
        mins, maxs = self.chunk_ranges
        width = (maxs - mins + 1) if self.nchunks else np.zeros((0, self.nmodes), np.int64)
        counts = self.blocks.count
        return {
            "path": self.path,
            "format_version": self.meta["format_version"],
            "shape": list(self.shape),
            "nnz": self.nnz,
            "density": self.nnz / math.prod(self.shape),
            "value_dtype": self.value_dtype.name,
            "compression": self.meta.get("compression", "small"),
            "index_encoding": self.index_encoding,
            "index_patches": int(self.patches[0].shape[0]),
            "norm": self.norm(),
            "blocks": self.nblocks,
            "block_nnz_min": int(counts.min()) if counts.size else 0,
            "block_nnz_max": int(counts.max()) if counts.size else 0,
            "chunks": self.nchunks,
            "chunk_nnz": self.chunk_nnz,
            "bytes_on_disk": disk,
            "bytes_per_nnz": disk / max(1, self.nnz),
            "index_bytes_per_nnz": self._stored_bytes("alto") / max(1, self.nnz),
            "values_bytes_per_nnz": self._stored_bytes("values") / max(1, self.nnz),
            "raw_coo_bytes": raw,
            "compression_ratio": disk / max(1, raw),
            "layout": self.meta["layout"],
            "modes": [
                {
                    "mode": n,
                    "length": self.shape[n],
                    "bits": int(self.layout.mode_bits[n]),
                    "key_bits": int(self.layout.key_bits[n]),
                    "chunk_index_span_mean": float(width[:, n].mean()) if self.nchunks else 0.0,
                    "chunk_index_span_max": int(width[:, n].max()) if self.nchunks else 0,
                }
                for n in range(self.nmodes)
            ],
            "fiber_index": self.fibers.describe() if self.fibers is not None else {},
            "mode_copies": self.mode_copies.describe() if self.mode_copies is not None else {},
            "labels": self.labels.describe() if self.labels is not None else [],
        }


class _StoreGroup:
    """A store's Zarr group whose member lookups keep zarr's numcodecs notice quiet (every lookup
    of a ``delta64`` store's ``alto`` re-creates its Delta filter, and zarr warns each time);
    everything else is the group's."""

    def __init__(self, group: zarr.Group) -> None:
        self._group = group

    def _lookup(self, name: str):
        with quiet_numcodecs():
            return self._group[name]

    def __getitem__(self, name: str):
        return self._lookup(name)

    def __contains__(self, name: str) -> bool:
        try:
            self[name]
        except KeyError as missing:
            # zarr's frames hold the error they caught and, through their callers, e.g. an MTTKRP's
            # output buffer: a reference cycle that kept the buffer from reuse until gc ran
            for err in (missing, missing.__cause__, missing.__context__):
                if err is not None:
                    traceback.clear_frames(err.__traceback__)
            return False
        return True

    def __getattr__(self, attr: str):
        return getattr(self._group, attr)


class _RemoteGroup(_StoreGroup):
    """A store's group in object storage, whose arrays are looked up once: every lookup of a
    Zarr group's member reads the member's ``zarr.json``, a request each (opening a store looked
    its arrays up 40 times). The arrays this package writes are fetched together, in parallel,
    when the group is wrapped."""

    def __init__(self, group: zarr.Group) -> None:
        super().__init__(group)
        self._nodes: dict[str, object] = {}
        self._lock = threading.Lock()
        agroup = group._async_group

        async def lookup(name):
            try:
                return name, await agroup.getitem(name)
            except KeyError:
                return name, None

        async def all_arrays():
            return await asyncio.gather(*(lookup(n) for n in ARRAY_NAMES))

        with quiet_numcodecs():
            found = zarr_sync(all_arrays())
        for name, node in found:
            self._nodes[name] = None if node is None else zarr.Array(node)

    def __getitem__(self, name: str):
        with self._lock:
            if name in self._nodes:
                node = self._nodes[name]
            else:
                try:
                    node = self._nodes[name] = self._lookup(name)
                except KeyError:
                    node = self._nodes[name] = None
        if node is None:
            raise KeyError(name)
        return node


def open_store(path: str | os.PathLike) -> Store:
    """Open and validate a BLCO store.

    Checks the format name and version, completeness, the bit layout against the shape, the block
    table against nnz, chunk shapes and the per-chunk range table. Raises a :class:`StoreError`
    subclass naming the problem.

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> s = tfo.convert((np.array([[0, 1], [2, 0]]), np.array([1.0, 2.0])), "memory://doc-open")
    >>> tfo.open_store("memory://doc-open").nnz
    2
    """
    path = str(path)
    if not paths.exists(path):
        raise StoreError(f"{path}: no such store")
    try:
        root = zarr.open_group(path, mode="r", **paths.read_options(path))
    except Exception as exc:
        raise ForeignStoreError(f"{path}: not a Zarr v3 group, so not a tensorflow_ooc store ({exc})") from exc
    # a remote store's arrays' metadata read once, all at once
    root = _RemoteGroup(root) if chunk_cache.wants_cache(root.store) else _StoreGroup(root)
    attrs = dict(root.attrs)
    meta = attrs.get(META_KEY)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ForeignStoreError(f"{path}: a Zarr group without '{META_KEY}' BLCO metadata: not a tensorflow_ooc store")
    if meta.get("format_version") not in SUPPORTED_VERSIONS:
        raise StoreError(
            f"{path}: format version {meta.get('format_version')!r} is not supported "
            f"(this build reads {list(SUPPORTED_VERSIONS)})"
        )
    if meta.get("complete") is not True:
        raise IncompleteStoreError(f"{path}: the store was not completely written")
    # structure first, so an inconsistent field is named; then the checksum, which sees the edits
    # that stay consistent (a doubled norm_sq, another shape of the same bit layout)
    _validate(path, root, meta)
    _check_meta_checksum(path, meta)
    if "arrays_checksum" in meta and meta["arrays_checksum"] != arrays_checksum(root):
        raise _fail(
            path,
            "the Zarr metadata of its arrays (codecs, dtypes, shapes, chunk grids) was changed after "
            "the store was written; convert the input again",
        )
    store = Store(path, root, meta)
    if CHECKSUM_KEY not in meta:
        _check_legacy_norm(store)
    if not paths.is_url(path):
        # local chunk files: every chunk's position checksum now (four bytes a chunk), so a store
        # with moved, swapped or missing chunks is refused at open rather than mid-decomposition
        for c in range(store.nchunks):
            store.check_chunk_position(c, "alto")
            store.check_chunk_position(c, "values")
    return store


def _check_meta_checksum(path: str, meta: dict) -> None:
    """Refuse metadata edited after the store was written (see :func:`meta_checksum`)."""
    if CHECKSUM_KEY not in meta:
        return
    try:
        expected = meta_checksum(meta)
    except (TypeError, ValueError) as exc:  # NaN / Infinity or a non-JSON value in a field
        raise _fail(path, f"metadata in zarr.json holds a value JSON cannot hold ({exc})") from exc
    if meta[CHECKSUM_KEY] != expected:
        raise _fail(
            path,
            "metadata in zarr.json does not match its checksum: it was edited or damaged after the "
            "store was written (the norm, shape, counts or layout results depend on can no longer be "
            "trusted); convert the input again",
        )


def _check_legacy_norm(store: Store) -> None:
    """Stores written before the metadata checksum: ||X||^2 re-derived from the values (one pass
    over the values array, not the indices) and compared with ``norm_sq``, the one field no
    structural check covers."""
    got = 0.0
    for start in range(0, store.nnz, store.chunk_nnz):
        v = store._read("values", start, min(store.nnz, start + store.chunk_nnz)).astype(np.float64, copy=False)
        got += float(np.dot(v, v))
    stated = store.meta["norm_sq"]
    if (
        not isinstance(stated, (int, float))
        or not math.isfinite(got)
        or not math.isclose(float(stated), got, rel_tol=1e-9, abs_tol=0.0)
    ):
        raise _fail(
            store.path,
            f"metadata field 'norm_sq' is {stated!r} but the values' squares sum to {got!r} "
            f"(a store without a metadata checksum, so its norm was re-derived)",
        )


def _keys_decrease(key: np.ndarray) -> bool:
    """True if consecutive block keys (most significant word last) ever decrease."""
    a, b = key[:-1], key[1:]
    decided = np.zeros(a.shape[0], dtype=bool)
    for w in range(key.shape[1] - 1, -1, -1):
        lt = ~decided & (b[:, w] < a[:, w])
        if lt.any():
            return True
        decided |= b[:, w] != a[:, w]
    return False


def _validate(path: str, root: zarr.Group, meta: dict) -> None:
    required = ("shape", "nnz", "value_dtype", "norm_sq", "chunk_nnz", "max_block_nnz", "nblocks", "nchunks", "layout")
    missing = [k for k in required if k not in meta]
    if missing:
        raise _fail(path, f"metadata field(s) {missing} missing")
    try:
        layout = BitLayout(tuple(meta["shape"]))
    except Exception as exc:
        raise _fail(path, f"metadata field 'shape': {exc}") from exc
    if meta["layout"] != layout.describe():
        raise _fail(path, f"metadata field 'layout' does not match shape {layout.shape}")
    nnz, chunk_nnz, nblocks, nchunks = (int(meta[k]) for k in ("nnz", "chunk_nnz", "nblocks", "nchunks"))
    if chunk_nnz < 1 or nnz < 0 or nchunks != -(-nnz // chunk_nnz):
        raise _fail(path, f"nnz={nnz}, chunk_nnz={chunk_nnz} and nchunks={nchunks} disagree")
    N = layout.nmodes
    encoding = meta.get("index_encoding", DELTA64)
    if encoding not in ENCODINGS or (meta.get("format_version") == 1 and encoding != DELTA64):
        raise _fail(path, f"metadata field 'index_encoding' is {encoding!r}, not one of {list(ENCODINGS)}")
    expect = {
        "alto": ((nnz,), (chunk_nnz,), np.dtype("<u4" if encoding == DELTA32 else "<u8")),
        "values": ((nnz,), (chunk_nnz,), np.dtype(meta["value_dtype"])),
        "blocks/key": ((nblocks, max(1, layout.nwords - 1)), None, np.dtype("<u8")),
        "blocks/start": ((nblocks,), None, np.dtype("<i8")),
        "blocks/count": ((nblocks,), None, np.dtype("<i8")),
        "blocks/base": ((nblocks, N), None, np.dtype("<i8")),
        "chunks/min": ((nchunks, N), None, np.dtype("<i8")),
        "chunks/max": ((nchunks, N), None, np.dtype("<i8")),
    }
    for name, (shape, chunks, dtype) in expect.items():
        try:
            arr = root[name]
        except KeyError:
            raise _fail(path, f"array '{name}' is missing") from None
        if tuple(arr.shape) != shape:
            raise _fail(path, f"array '{name}' has shape {tuple(arr.shape)}, expected {shape}")
        if chunks is not None and tuple(arr.chunks) != chunks:
            raise _fail(path, f"array '{name}' has chunks {tuple(arr.chunks)}, expected {chunks}")
        if np.dtype(arr.dtype) != dtype:
            raise _fail(path, f"array '{name}' has dtype {arr.dtype}, expected {dtype}")
    try:
        start, count = root["blocks/start"][...], root["blocks/count"][...]
        key, base = root["blocks/key"][...], root["blocks/base"][...]
        cmin, cmax = root["chunks/min"][...], root["chunks/max"][...]
    except Exception as exc:
        raise _fail(path, f"block or chunk table cannot be decoded ({exc})") from exc
    if nblocks:
        if (
            start[0] != 0
            or (count < 1).any()
            or (count > int(meta["max_block_nnz"])).any()
            or (start[1:] != start[:-1] + count[:-1]).any()
            or int(start[-1] + count[-1]) != nnz
        ):
            raise _fail(path, f"block table does not tile the {nnz} nonzeros")
        bad = np.flatnonzero((layout.keys_to_bases(key) != base).any(axis=1))
        if bad.size:
            raise _fail(path, f"block {int(bad[0])}: base does not match its key")
        if nblocks > 1 and _keys_decrease(key):
            raise _fail(path, "block keys are not in ALTO order")
    elif nnz:
        raise _fail(path, f"no blocks for {nnz} nonzeros")
    shape = np.array(layout.shape, dtype=np.int64)
    if nchunks and ((cmin < 0).any() or (cmax >= shape).any() or (cmin > cmax).any()):
        raise _fail(path, "chunk range table holds indices outside the shape")
    if encoding == DELTA32:
        _validate_patches(path, root, meta, nnz, chunk_nnz)
    for name in ("alto", "values"):
        key = f"chunks/crc_{name}"
        if key in root and (tuple(root[key].shape) != (nchunks,) or np.dtype(root[key].dtype) != np.dtype("<i8")):
            raise _fail(
                path,
                f"array '{key}' has shape {tuple(root[key].shape)} and dtype {root[key].dtype}, "
                f"expected ({nchunks},) int64",
            )


def _validate_patches(path: str, root, meta: dict, nnz: int, chunk_nnz: int) -> None:
    """A ``delta32`` store's patch table: both arrays, strictly increasing positions inside the
    tensor, one at every chunk's first nonzero, and the checksum the metadata recorded (which
    binds the table to this store: its own CRC32C holds for a table copied from another)."""
    try:
        pos, word = root["patches/position"], root["patches/word"]
    except KeyError:
        raise _fail(path, "array 'patches/position' or 'patches/word' is missing (index_encoding 'delta32')") from None
    if pos.ndim != 1 or pos.shape != word.shape or np.dtype(pos.dtype) != np.dtype("<i8"):
        raise _fail(path, "patch table arrays have mismatched shapes or dtypes")
    if np.dtype(word.dtype) != np.dtype("<u8"):
        raise _fail(path, f"array 'patches/word' has dtype {word.dtype}, expected uint64")
    try:
        pos, word = pos[...], word[...]
    except Exception as exc:
        raise _fail(path, f"patch table cannot be decoded ({exc})") from exc
    if meta.get("patches_checksum") != patches_checksum(pos, word):
        raise _fail(path, "the patch table does not match the checksum recorded when the store was written")
    starts = np.arange(0, nnz, chunk_nnz, dtype=np.int64)
    if (
        (pos.size and (pos[0] < 0 or pos[-1] >= nnz))
        or (np.diff(pos) <= 0).any()
        or not np.isin(starts, pos, assume_unique=True).all()
    ):
        raise _fail(path, "patch table positions are out of order, outside the tensor, or miss a chunk start")
