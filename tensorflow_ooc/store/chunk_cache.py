"""Worker-local disk cache of the chunks of stores in object storage.

Streaming CP-ALS reads every chunk once per mode. From a local disk that is a page-cache read;
from object storage (``s3://``, ``gs://``, ... through fsspec) it is an HTTP request per chunk,
per array, per mode: the quickstart's tensor ran at 624 ms an iteration from a local S3 server
against 80 ms from local disk. This cache keeps the chunks a worker process has fetched in files
on its local disk, so that every pass after the first reads local files, mapped, as from a local
store (``store.chunk_files`` maps them the same way).

- **One cache per process**, shared by all tasks and threads of a worker (module level, thread
  safe: :func:`default_cache`), in its own folder ``<root>/<host>-<pid>-<start time>/``. Folders of
  processes on this host that no longer run are removed when a cache starts; a process removes
  its own at exit.
- **Bounded in bytes** (least recently used chunks evicted first): ``TFOOC_CHUNK_CACHE_BYTES``
  (a number of bytes, or with a unit: ``512MiB``, ``2GB``; ``0`` turns the cache off), by default
  ``DEFAULT_BYTES`` or a quarter of the free disk under the root, whichever is smaller. The root
  is ``TFOOC_CHUNK_CACHE_DIR``, by default ``tfooc-chunk-cache`` in the system's temporary folder.
- **Keyed** by store id (a fresh UUID for every store written), array and chunk index.
- **Written atomically**: a temporary name in the same folder, then a rename, so a reader never
  sees half a chunk.
- **Checked as a direct read is**: a chunk is cached only if its CRC32C matches its body and the
  checksum the store recorded for its position (``Store.chunk_checksums``). A cached file that
  changed since it was checked (another inode, size or modification time) is checked again; one
  that fails is discarded and fetched again (``stats()["discarded"]``). Bytes that fail their
  check on arrival are handed back uncached, so the reader raises the same ``CorruptStoreError``
  as without a cache.
- **Fetched in parallel, ahead**: :meth:`ChunkCache.prefetch` queues chunks on a pool of
  ``TFOOC_CHUNK_FETCH_THREADS`` threads (default ``FETCH_THREADS``; requests to object storage
  wait on the network, not on a core); the streaming reader queues the next chunks of its
  partition while it decodes the current one. A read of a chunk being fetched waits for that
  fetch instead of starting a second.

A chunk that cannot be cached (larger than the whole budget, a full disk) is served from memory.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable

import psutil

try:  # releases the GIL on big buffers
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - google-crc32c comes with zarr
    from google_crc32c import value as _crc32c

log = logging.getLogger(__name__)

ENV_DIR = "TFOOC_CHUNK_CACHE_DIR"
ENV_BYTES = "TFOOC_CHUNK_CACHE_BYTES"
ENV_THREADS = "TFOOC_CHUNK_FETCH_THREADS"
DEFAULT_BYTES = 2 << 30
FREE_DISK_FRACTION = 0.25
FETCH_THREADS = 8
# the streaming reader queues at most this many bytes of chunks ahead, and at most
# PREFETCH_CHUNKS chunks (see prefetch_window)
PREFETCH_BYTES = 256 << 20
PREFETCH_CHUNKS = 64

Key = tuple[Hashable, ...]
Fetch = Callable[[], "bytes | None"]

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``"2147483648"``, ``"2GiB"``, ``"512 MB"``, ``"0"``: a byte count (kB, MB, GB are powers
    of 1000, KiB, MiB, GiB of 1024, as Dask reads them)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 2GiB, 512MB, 1000000)")
    return int(float(m[1]) * _UNITS[(m[2] or "").lower()])


@dataclass
class CachedChunk:
    """A chunk's stored bytes: the checked file in the cache (``path``, whose (inode, modification
    time, size) at the check is ``version``) or, where it could not be cached, the bytes
    themselves (``data``; unchecked when they failed their checksum)."""

    path: Path | None = None
    version: tuple[int, int, int] | None = None
    data: bytes | None = None


@dataclass
class _Entry:
    path: Path
    size: int
    version: tuple[int, int, int]


def _version(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _intact(data, expected: int | None) -> bool:
    """A chunk's bytes end with the CRC32C of the rest, which is the one recorded for its
    position (``expected``; None or negative: no recorded checksum to compare with)."""
    if len(data) < 4:
        return False
    view = memoryview(data)
    got = int.from_bytes(view[-4:], "little")
    if expected is not None and expected >= 0 and got != expected:
        return False
    return _crc32c(view[:-4]) == got


def _owner_name() -> str:
    from ..tempdirs import host_tag

    return f"{host_tag()}-{os.getpid()}-{int(psutil.Process().create_time())}"


_OWNER = re.compile(r"^(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-(?P<started>\d+)$")


def _remove_dead(root: Path) -> None:
    """Remove the cache folders of processes on this host that are no longer running."""
    from ..tempdirs import host_tag

    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for d in entries:
        m = _OWNER.match(d.name)
        if not m or m["host"] != host_tag() or not d.is_dir():
            continue
        try:
            alive = int(psutil.Process(int(m["pid"])).create_time()) == int(m["started"])
        except psutil.NoSuchProcess:
            alive = False
        except psutil.Error:  # pragma: no cover - another user's process
            alive = True
        if not alive:
            shutil.rmtree(d, ignore_errors=True)


class ChunkCache:
    """Chunks of remote stores in files under ``folder``, at most ``max_bytes`` of them."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int, threads: int = FETCH_THREADS) -> None:
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        self.threads = max(1, int(threads))
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._absent: set[Key] = set()  # chunks the store holds no bytes for
        self._inflight: dict[Key, Future] = {}
        self._bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._counts = dict(hits=0, misses=0, fetched_bytes=0, prefetched=0, discarded=0, evicted=0, uncached=0)
        self._full_logged = False
        self._closed = False
        self.folder.mkdir(parents=True, exist_ok=True)

    # --- bookkeeping ------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Counters since the cache started: ``hits`` (reads served from a cached file),
        ``misses`` (reads that fetched, or waited for a fetch), ``fetched_bytes``, ``prefetched``
        (chunks fetched ahead), ``discarded`` (cached files that failed their check), ``evicted``,
        ``uncached`` (fetched chunks not cached: failed check, too big, full disk); and ``bytes``
        and ``entries`` cached now."""
        with self._lock:
            return dict(self._counts, bytes=self._bytes, entries=len(self._entries), max_bytes=self.max_bytes)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _file(self, key: Key) -> Path:
        return self.folder.joinpath(*(str(k) for k in key))

    def _drop(self, key: Key) -> None:
        """Forget ``key`` and remove its file (the lock held)."""
        e = self._entries.pop(key, None)
        if e is not None:
            self._bytes -= e.size
            try:
                os.unlink(e.path)  # a mapping of it stays valid until unmapped
            except FileNotFoundError:
                pass

    def clear(self) -> None:
        """Drop every cached chunk (the counters stay)."""
        with self._lock:
            for key in list(self._entries):
                self._drop(key)
            self._absent.clear()

    def close(self) -> None:
        """Stop the fetch threads and remove the cache's folder. Readers that still hold the cache
        fetch every chunk from then on, uncached."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- reading ------------------------------------------------------------------------------------

    def cached(self, key: Key) -> CachedChunk | None:
        """The cached copy of ``key`` if there is one (no fetch, no check, no count)."""
        with self._lock:
            e = self._entries.get(key)
            return None if e is None else CachedChunk(e.path, e.version)

    def get(self, key: Key, fetch: Fetch, expected: int | None = None) -> CachedChunk | None:
        """The chunk ``key``: its checked cached file, fetched with ``fetch`` (which returns the
        stored bytes, None where the store has none) if it is not cached or its file fails its
        check; None when the store holds no bytes for it. ``expected``: the checksum the store
        recorded for the chunk's position."""
        if self._closed:
            data = fetch()
            return None if data is None else CachedChunk(data=data)
        for _ in range(3):
            with self._lock:
                if key in self._absent:
                    return None
                e = self._entries.get(key)
                if e is not None:
                    self._entries.move_to_end(key)
                pending = self._inflight.get(key) if e is None else None
            if e is not None:
                got = self._check(key, e, expected)
                if got is not None:
                    self._count("hits")
                    return got
                continue  # discarded: fetch it again
            self._count("misses")
            if pending is None:
                pending = self._start(key, fetch, expected)
            got = pending.result()
            if got is None or got.path is None or got.path.exists():
                return got
            # evicted between its fetch and this read: once more
        return self._fetch_into(key, fetch, expected)

    def _check(self, key: Key, e: _Entry, expected: int | None) -> CachedChunk | None:
        """``e``'s file if it is unchanged since checked, or passes the check again; else None
        (the file is discarded)."""
        try:
            st = os.stat(e.path)
        except FileNotFoundError:
            with self._lock:
                if self._entries.get(key) is e:
                    self._bytes -= e.size
                    del self._entries[key]
            return None
        version = _version(st)
        if version == e.version:
            return CachedChunk(e.path, version)
        try:
            with open(e.path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        if st.st_size == len(data) and _intact(data, expected):
            with self._lock:
                e.version = version
            return CachedChunk(e.path, version)
        log.warning("chunk cache: %s fails its checksum; discarded and fetched again", e.path)
        with self._lock:
            if self._entries.get(key) is e:
                self._drop(key)
                self._counts["discarded"] += 1
        return None

    def _start(self, key: Key, fetch: Fetch, expected: int | None, pool: bool = False) -> Future:
        """A future of ``key``'s fetch: started now (in the calling thread, or on the pool with
        ``pool``), or the one already running."""
        with self._lock:
            pending = self._inflight.get(key)
            if pending is not None:
                return pending
            pending = self._inflight[key] = Future()
            if pool:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tfooc-chunk-fetch")
                executor = self._pool
        if pool:
            executor.submit(self._run, key, fetch, expected, pending)
        else:
            self._run(key, fetch, expected, pending)
        return pending

    def _run(self, key: Key, fetch: Fetch, expected: int | None, pending: Future) -> None:
        try:
            pending.set_result(self._fetch_into(key, fetch, expected))
        except BaseException as exc:
            pending.set_exception(exc)
        finally:
            with self._lock:
                if self._inflight.get(key) is pending:
                    del self._inflight[key]

    def prefetch(self, jobs: list[tuple[Key, Fetch, int | None]]) -> int:
        """Queue the fetch of each ``(key, fetch, expected)`` that is neither cached nor being
        fetched; returns how many were queued."""
        queued = 0
        if self._closed:
            return 0
        for key, fetch, expected in jobs:
            with self._lock:
                if key in self._entries or key in self._inflight or key in self._absent:
                    continue
            self._start(key, fetch, expected, pool=True)
            queued += 1
        if queued:
            self._count("prefetched", queued)
        return queued

    def _fetch_into(self, key: Key, fetch: Fetch, expected: int | None) -> CachedChunk | None:
        data = fetch()
        if data is None:
            with self._lock:
                self._absent.add(key)
            return None
        data = bytes(data) if not isinstance(data, bytes) else data
        self._count("fetched_bytes", len(data))
        if self._closed or len(data) > self.max_bytes or not _intact(data, expected):
            self._count("uncached")
            return CachedChunk(data=data)
        path = self._file(key)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            version = _version(os.stat(path))
        except OSError as exc:  # a full disk, a removed folder: serve from memory
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if not self._full_logged:
                self._full_logged = True
                log.warning("chunk cache: cannot write under %s (%s); chunks are read from the store", self.folder, exc)
            self._count("uncached")
            return CachedChunk(data=data)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[key] = _Entry(path, len(data), version)
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                oldest = next(iter(self._entries))
                if oldest == key:
                    break
                self._drop(oldest)
                self._counts["evicted"] += 1
        return CachedChunk(path, version)


# --- the process's cache ----------------------------------------------------------------------------

_DEFAULT: ChunkCache | None = None
_DEFAULT_LOCK = threading.Lock()
_DISABLED = False


def cache_root() -> Path:
    """Where the worker caches live: ``TFOOC_CHUNK_CACHE_DIR`` or the system's temporary folder."""
    return Path(os.environ.get(ENV_DIR) or os.path.join(tempfile.gettempdir(), "tfooc-chunk-cache"))


def configured_bytes(root: Path) -> int:
    """The cache's budget: ``TFOOC_CHUNK_CACHE_BYTES``, else the smaller of ``DEFAULT_BYTES`` and a
    quarter of the free disk under ``root``."""
    text = os.environ.get(ENV_BYTES)
    if text:
        return parse_bytes(text)
    from ..disk import free_bytes

    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = free_bytes(probe)
    return DEFAULT_BYTES if free is None else int(min(DEFAULT_BYTES, free * FREE_DISK_FRACTION))


def default_cache() -> ChunkCache | None:
    """This process's chunk cache, started on first use from the environment; None when turned
    off (``TFOOC_CHUNK_CACHE_BYTES=0``) or when its folder cannot be made."""
    global _DEFAULT, _DISABLED
    if _DEFAULT is not None or _DISABLED:
        return _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is not None or _DISABLED:
            return _DEFAULT
        root = cache_root()
        try:
            budget = configured_bytes(root)
            threads = int(os.environ.get(ENV_THREADS) or FETCH_THREADS)
        except ValueError as exc:
            log.warning("chunk cache off: %s", exc)
            _DISABLED = True
            return None
        if budget <= 0:
            _DISABLED = True
            return None
        try:
            root.mkdir(parents=True, exist_ok=True)
            _remove_dead(root)
            cache = ChunkCache(root / _owner_name(), budget, threads)
        except OSError as exc:
            log.warning("chunk cache off: cannot use %s (%s)", root, exc)
            _DISABLED = True
            return None
        atexit.register(cache.close)
        _DEFAULT = cache
        return cache


def reset_default_cache() -> None:
    """Close this process's cache; the next :func:`default_cache` starts a new one from the
    environment as it is then."""
    global _DEFAULT, _DISABLED
    with _DEFAULT_LOCK:
        cache, _DEFAULT, _DISABLED = _DEFAULT, None, False
    if cache is not None:
        atexit.unregister(cache.close)
        cache.close()


def stats() -> dict:
    """This process's cache counters (:meth:`ChunkCache.stats`), all zero when it has none."""
    cache = _DEFAULT
    if cache is None:
        return dict(
            hits=0, misses=0, fetched_bytes=0, prefetched=0, discarded=0, evicted=0, uncached=0, bytes=0, entries=0
        )
    return cache.stats()


def wants_cache(zarr_store) -> bool:
    """Whether a Zarr store's chunks come from object storage (or another remote file system),
    where a local copy pays; not for local files or fsspec's in-memory file system."""
    fs = getattr(zarr_store, "fs", None)
    if fs is None:
        return False
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    local = {"file", "local", "memory"}
    return not local.intersection(protocol)


def prefetch_window(chunk_bytes: int, cache: ChunkCache | None) -> int:
    """How many chunks of ``chunk_bytes`` (an upper bound of a chunk's stored size) to queue
    ahead: ``PREFETCH_BYTES`` worth, from 2 to ``PREFETCH_CHUNKS``, and no more than a quarter
    of the cache holds."""
    if cache is None:
        return 0
    ahead = min(PREFETCH_CHUNKS, max(2, PREFETCH_BYTES // max(1, chunk_bytes)))
    return int(max(1, min(ahead, cache.max_bytes // (4 * max(1, chunk_bytes)))))
