"""Read whole chunks of a 1-D store array straight from their stored bytes, into caller buffers.

Streaming MTTKRP reads every chunk once per mode, so the read path is hot. For the codec chains
this package writes (optional Delta filter, little-endian bytes, Blosc, CRC32C) the chunk's bytes
are fetched in one call, the CRC32C is checked, and Blosc decompresses directly into the caller's
buffer. The Delta filter is *not* undone here: the reader fuses its prefix sum with re-encoding
(:func:`tensorflow_ooc.format.decode_alto`), which saves a pass over the data.

Any other chain, and chunks that were never written (Zarr's fill value), go through Zarr's own
read path instead, so every store Zarr can read stays readable.

Chunks of a store in object storage come through the worker's disk cache
(:mod:`tensorflow_ooc.store.chunk_cache`): once fetched they are local files, read (and mapped)
exactly as a local store's.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import zarr
from numcodecs import blosc
from zarr.abc.store import SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from .chunk_cache import CachedChunk, ChunkCache
from .codecs import StoredChain
from .huge_pages import map_private

BLOSC_HEADER = 16
ABSENT = -1  # recorded checksum of a chunk with no stored bytes (Zarr skips all-fill-value chunks)
UNCHECKED = -2  # the array's codec chain does not end with a CRC32C: nothing to record
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

try:  # releases the GIL on big buffers, so a read-ahead thread does not stall the others
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - google-crc32c comes with zarr
    from google_crc32c import value as _crc32c


_BLOSC_THREADS = threading.Lock()


def decompress(body: np.ndarray, dest: np.ndarray, threads: int = 1) -> None:
    """Blosc-decompress ``body`` into ``dest`` with ``threads`` threads.

    Zarr turns numcodecs' Blosc threads off for the whole process (its reads run in an event
    loop), so every call decodes on one core. A reader that decodes between kernel calls (no
    read-ahead: see ``execution.stream.read_ahead_pays``) leaves the other cores idle meanwhile;
    with ``threads > 1`` it borrows Blosc's global, multi-threaded context for the call (numcodecs
    serialises that context with its own lock) and turns ``use_threads`` back after. The global
    context's thread count is left at ``threads``: c-blosc rebuilds its pool whenever the count
    changes, which restoring it after every chunk would do twice a chunk (it only matters to
    callers that turn ``use_threads`` on themselves). 2^20 delta-coded indices: 0.56 ms on one
    thread, about half on two."""
    if threads <= 1:
        blosc.decompress(body, dest)
        return
    with _BLOSC_THREADS:
        use = blosc.use_threads
        blosc.use_threads = True
        if blosc.get_nthreads() != threads:
            blosc.set_nthreads(threads)
        try:
            blosc.decompress(body, dest)
        finally:
            blosc.use_threads = use


class ChunkDecodeError(ValueError):
    """A chunk's bytes fail their checksum or do not decode to the chunk's size."""


def _unreadable(c: int, key: str, exc: OSError) -> ChunkDecodeError:
    return ChunkDecodeError(f"chunk {c} ({key}) cannot be read: {exc.strerror or exc}")


class FileVersion(NamedTuple):
    """One version of a chunk's file: a file replaced or changed in place gets another, and with
    it another CRC32C check. ``version[1:]`` is the chunk cache's version of its copies."""

    chunk: int
    inode: int
    mtime_ns: int
    size: int


@dataclass
class ChunkRead:
    """Decoded chunk: ``data`` (a view of the caller's buffer) holds the index's differences when
    ``is_delta`` is true (Delta's with the first value absolute, or ``delta32``'s), else the
    values themselves."""

    data: np.ndarray
    is_delta: bool
    checksum: int | None = None  # the stored CRC32C, ABSENT for no stored bytes, None: not read here


class ChunkFiles:
    """Chunk reader for one 1-D array of a store (the ``alto`` or ``values`` array).

    A remote store's chunks are read through ``cache`` (the worker's disk cache), under
    ``cache_key`` + chunk index, each checked against ``expected[c]``, the checksum the store
    recorded for its position."""

    def __init__(
        self,
        array: zarr.Array,
        cache: ChunkCache | None = None,
        cache_key: tuple = (),
        expected: np.ndarray | None = None,
        delta: bool | None = None,
    ) -> None:
        self.array = array
        self.chunk_len = int(array.chunks[0])
        self.dtype = np.dtype(array.dtype)
        chain = StoredChain.of(array)
        # the Delta filter in the chain (format version 1's index), which Zarr's own reads undo
        self.filtered = chain.delta
        # whether the chunks hold differences: the filter's, or (``delta`` given) ``delta32``'s,
        # which are the stored elements themselves
        self.delta = self.filtered if delta is None else bool(delta)
        # compression "none": the chunk's bytes are the little-endian elements and their CRC32C
        self.raw = chain.raw
        self.fast = chain.known
        self.has_crc = chain.crc
        store = array.store
        self.local_root = Path(store.root) if isinstance(store, LocalStore) else None
        # the cache holds the stored bytes the fast path reads; other chains go through Zarr
        self.cache = cache if self.local_root is None and self.fast else None
        self._cache_key = tuple(cache_key)
        self._expected = expected
        self._verified: set[FileVersion] = set()  # mapped chunk files whose CRC32C held
        self._mapped: dict[int, tuple[FileVersion, mmap.mmap]] = {}  # kept mappings
        self._kept = 0

    def _key(self, c: int) -> str:
        key = self.array.metadata.chunk_key_encoding.encode_chunk_key((c,))
        return f"{self.array.path}/{key}" if self.array.path else key

    @property
    def files(self) -> bool:
        """Whether chunks are read from local files: a local store's, or a remote store's copies
        in the chunk cache."""
        return self.local_root is not None or self.cache is not None

    def _fetch(self, c: int) -> bytes | None:
        """Chunk ``c``'s stored bytes from the store itself (None if it was never written)."""
        buf = sync(self.array.store.get(self._key(c), prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def _cache_job(self, c: int) -> tuple[tuple, partial, int | None]:
        want = None if self._expected is None else int(self._expected[c])
        return self._cache_key + (c,), partial(self._fetch, c), want

    def _cached(self, c: int) -> CachedChunk | None:
        """Chunk ``c`` through the cache (fetched if not cached); None if it was never written."""
        return self.cache.get(*self._cache_job(c))

    def prefetch(self, chunks) -> int:
        """Queue the fetch of ``chunks`` into the cache (a remote store's); how many were queued."""
        if self.cache is None:
            return 0
        return self.cache.prefetch([self._cache_job(c) for c in chunks])

    def _map_file(self, path: Path, c: int, key: str) -> tuple[np.ndarray, FileVersion]:
        """A chunk file mapped, pre-faulted, and its version; FileNotFoundError if there is none."""
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                version = FileVersion(c, st.st_ino, st.st_mtime_ns, st.st_size)
                if st.st_size == 0:
                    return np.zeros(0, dtype=np.uint8), version
                mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ)
        except FileNotFoundError:
            raise
        except OSError as exc:  # a directory, a FIFO, no permission: damage, named as such
            raise _unreadable(c, key, exc) from exc
        return np.frombuffer(mm, dtype=np.uint8), version  # the array keeps the mapping alive

    def _bytes(self, c: int) -> tuple[np.ndarray | None, FileVersion | None]:
        """The stored bytes of chunk ``c`` (None if it was never written) and, for a local file,
        its version (chunk, inode, modification time, size). Local files are memory-mapped,
        pre-faulted: checksum and decompression then read the page cache directly, which halves
        the memory traffic of a read. Store files are never modified in place (a rewrite
        publishes a new directory), so a mapping cannot see a file shrink under it; nor are the
        cache's files (a fetch writes a new one and renames it over the old)."""
        key = self._key(c)
        if self.cache is not None:
            got = self._cached(c)
            if got is None:
                return None, None
            if got.path is not None:
                try:
                    raw, version = self._map_file(got.path, c, key)
                except FileNotFoundError:  # evicted since: from the store, unchecked (read() checks)
                    data = self._fetch(c)
                    return (None if data is None else np.frombuffer(data, dtype=np.uint8)), None
                if version[1:] == got.version:  # the cache checked these very bytes
                    self._verified.add(version)
                return raw, version
            return np.frombuffer(got.data, dtype=np.uint8), None
        if self.local_root is None:
            data = self._fetch(c)
            return (None if data is None else np.frombuffer(data, dtype=np.uint8)), None
        try:
            return self._map_file(self.local_root / key, c, key)
        except FileNotFoundError:
            return None, None

    def stored_checksum(self, c: int) -> int:
        """The CRC32C that ends chunk ``c``'s stored bytes (the writer records it per chunk, which
        binds each chunk to its position); ``ABSENT`` when no bytes are stored, ``UNCHECKED`` when
        the codec chain has no CRC32C. Reads four bytes, not the chunk."""
        if not self.has_crc:
            return UNCHECKED
        key = self._key(c)
        hit = self.cache.cached(self._cache_key + (c,)) if self.cache is not None else None
        if hit is not None:  # the cached copy's last four bytes (checked when it was cached)
            try:
                with open(hit.path, "rb", buffering=0) as f:
                    size = os.fstat(f.fileno()).st_size
                    tail = os.pread(f.fileno(), 4, size - 4) if size >= 4 else b""
                return int.from_bytes(tail, "little") if len(tail) == 4 else UNCHECKED
            except FileNotFoundError:  # evicted since
                pass
        if self.local_root is None:
            buf = sync(self.array.store.get(key, prototype=default_buffer_prototype(), byte_range=SuffixByteRequest(4)))
            tail = None if buf is None else buf.to_bytes()
        else:
            try:
                with open(self.local_root / key, "rb", buffering=0) as f:
                    size = os.fstat(f.fileno()).st_size
                    tail = os.pread(f.fileno(), 4, size - 4) if size >= 4 else b""
            except FileNotFoundError:
                tail = None
            except OSError as exc:
                raise _unreadable(c, key, exc) from exc
        if tail is None:
            return ABSENT
        return int.from_bytes(tail, "little") if len(tail) == 4 else UNCHECKED

    def _checked_raw(self, c: int, raw: np.ndarray) -> np.ndarray:
        """The elements of an uncompressed chunk's stored bytes, after their CRC32C is checked."""
        body = raw[:-4]
        if len(raw) < 4 or _crc32c(body) != int.from_bytes(raw[-4:].tobytes(), "little"):
            raise ChunkDecodeError(f"chunk {c}: CRC32C checksum mismatch")
        if body.shape[0] != self.chunk_len * self.dtype.itemsize:
            raise ChunkDecodeError(
                f"chunk {c}: holds {body.shape[0]} bytes, expected {self.chunk_len * self.dtype.itemsize}"
            )
        return body.view(self.dtype)

    def view(self, c: int, keep_elements: int = 0) -> ChunkRead | None:
        """Chunk ``c`` without a copy: the elements where they lie in its mapped file, for a local
        uncompressed (compression "none") array; None otherwise, or for a chunk never written.

        The mapping is private and writable (copy-on-write; nothing writes to it) so that the
        kernels see the writable arrays they are compiled for, a read-only array being another
        numba type; it is mapped on 2 MiB pages where the kernel can (:mod:`.huge_pages`). Its
        CRC32C is checked the first time this reader maps each version of the file (a later pass
        over an unchanged file skips it: 2.2 ms of a 13 ms pass over 3.3 M nonzeros).

        Mappings are kept for later passes while the kept chunks hold at most ``keep_elements``
        elements (the streaming reader passes the batch buffers' size, which the memory plan counts
        and the mapped path does not use): mapping and unmapping every chunk on every pass, with its
        page faults, took a chicago-shaped all-mode MTTKRP from 83 % to 61 % of in-memory speed."""
        if not self.raw or not self.files:
            return None
        checked = None  # the version of a cached copy the cache has checked
        if self.cache is not None:
            got = self._cached(c)
            if got is None:  # never written: Zarr's fill value (read() has it)
                return None
            if got.path is None:  # fetched but not cached (too big, a full disk): a writable copy
                raw = np.frombuffer(bytearray(got.data), dtype=np.uint8)
                data = self._checked_raw(c, raw)
                start = c * self.chunk_len
                n = min(self.array.shape[0], start + self.chunk_len) - start
                return ChunkRead(data[:n], self.delta, int.from_bytes(raw[-4:].tobytes(), "little"))
            path, checked = got.path, got.version
        else:
            path = self.local_root / self._key(c)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise ChunkDecodeError(f"chunk {c} ({self._key(c)}) is not a regular file")
        size = st.st_size
        if size == 0:
            return None
        version = FileVersion(c, st.st_ino, st.st_mtime_ns, size)
        kept = self._mapped.get(c)
        if kept is not None and kept[0] == version:
            mm = kept[1]
        else:
            try:
                with open(path, "rb", buffering=0) as f:
                    # first sight of this version (its CRC32C reads every page): cached in 2 MiB folios
                    mm = map_private(f.fileno(), fresh=version not in self._verified)
            except FileNotFoundError:
                return None
            if kept is None and (self._kept + 1) * self.chunk_len <= keep_elements:
                self._kept += 1
                self._mapped[c] = (version, mm)
            elif kept is not None:  # a changed file: keep its new version instead
                self._mapped[c] = (version, mm)
        raw = np.frombuffer(mm, dtype=np.uint8)
        if checked is not None and version[1:] == checked:
            self._verified.add(version)
        # the CRC32C is computed once per version of the file: a file changed in place gets a new
        # modification time and is checked again (its position is checked on every read)
        if version in self._verified:
            data = raw[:-4].view(self.dtype)
        else:
            data = self._checked_raw(c, raw)
            self._verified.add(version)
        start = c * self.chunk_len
        n = min(self.array.shape[0], start + self.chunk_len) - start
        raw_tail = np.frombuffer(mm, dtype=np.uint8, count=4, offset=size - 4)
        return ChunkRead(data[:n], self.delta, int.from_bytes(raw_tail.tobytes(), "little"))

    def read(self, c: int, out: np.ndarray, threads: int = 1) -> ChunkRead:
        """Chunk ``c`` into ``out`` (at least ``chunk_len`` elements of the array's dtype),
        decompressed by ``threads`` threads (see :func:`decompress`)."""
        start = c * self.chunk_len
        n = min(self.array.shape[0], start + self.chunk_len) - start
        if self.raw and self.files:
            # a copy of the mapped chunk (batches of several chunks; the CRC32C as for view)
            mapped = self.view(c)
            if mapped is not None:
                out[:n] = mapped.data
                return ChunkRead(out[:n], self.delta, mapped.checksum)
        raw, version = self._bytes(c) if self.fast else (None, None)
        if raw is None:
            out[:n] = self.array[start : start + n]
            return ChunkRead(out[:n], self.delta and not self.filtered, ABSENT if self.fast else None)
        if self.raw:
            view = self._checked_raw(c, raw)
            out[: view.shape[0]] = view
            return ChunkRead(out[:n], self.delta, int.from_bytes(raw[-4:].tobytes(), "little"))
        body = raw[:-4]
        checksum = int.from_bytes(raw[-4:].tobytes(), "little")
        if len(raw) < BLOSC_HEADER + 4:
            raise ChunkDecodeError(f"chunk {c}: CRC32C checksum mismatch")
        # as for mapped chunks, a local file's CRC32C is computed once per version of the file
        # (1.4 ms of a 27 ms uber-shaped all-mode pass); its position is checked on every read
        if version is None or version not in self._verified:
            if _crc32c(body) != checksum:
                raise ChunkDecodeError(f"chunk {c}: CRC32C checksum mismatch")
            if version is not None:
                self._verified.add(version)
        nbytes = int.from_bytes(raw[4:8].tobytes(), "little")
        if nbytes != self.chunk_len * self.dtype.itemsize:
            raise ChunkDecodeError(
                f"chunk {c}: decodes to {nbytes} bytes, expected {self.chunk_len * self.dtype.itemsize}"
            )
        dest = out[: self.chunk_len]
        try:
            decompress(body, dest, threads)
        except Exception as exc:
            raise ChunkDecodeError(f"chunk {c}: Blosc cannot decode it ({exc})") from exc
        return ChunkRead(out[:n], self.delta, checksum)
