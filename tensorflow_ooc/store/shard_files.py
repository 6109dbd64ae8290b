"""Inner chunks of sharded 1-D Zarr arrays, written and read straight from their shard files.

Zarr v3's sharding codec keeps many small inner chunks in one file per shard, followed by an index
of (offset, bytes) per inner chunk and its CRC32C. A sampled round reads a few thousand inner
chunks scattered over a fiber index: one file a chunk cost about 30 us an array in opening,
mapping and checking it (measured in docs/FORMAT.md, "Fiber index"); here the chunks a round needs are read
as runs of touching chunks, one ``pread`` of a file kept open each (ranged GETs in object storage),
their CRC32Cs checked, and decoded together into the caller's buffer in native code
(:mod:`.shard_decode`). The bytes are those Zarr writes and reads (a test compares them), for this
package's inner chains only: optional Delta on uint64, little-endian bytes, Blosc, CRC32C.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import zarr

from ..disk import disk_full_error, is_disk_full
from .chunk_files import _crc32c
from .codecs import StoredChain
from .scratch import ScratchBuffers
from .shard_decode import BAD_HEADER, OK, chunk_crcs, decode_chunks, pread_ranges
from .shard_encode import FrameBuffers, framed_chunks, framed_raw_chunks

EMPTY = np.uint64(2**64 - 1)  # an inner chunk never written (Zarr's fill value)
SHARD_ENTRIES = 262_144  # entries a shard file holds (its inner chunks: this over the chunk's length)
#: shard files a reader keeps open (idle ones past this are closed, least recently used first):
#: a 500 M-nonzero index with 128-entry chunks has thousands of shards an array
MAX_OPEN_SHARDS = 32


def shard_chunks(chunk_len: int) -> int:
    """Inner chunks a shard of ``chunk_len``-entry chunks: files of about ``SHARD_ENTRIES``
    entries whatever the chunk size, so a smaller chunk does not mean more files."""
    return max(1, SHARD_ENTRIES // max(1, chunk_len))


class ShardError(ValueError):
    """A shard's index or an inner chunk fails its checksum or does not decode."""


def _inner(array: zarr.Array) -> tuple[int, int, StoredChain]:
    codec = array.metadata.codecs[0]
    inner = int(codec.chunk_shape[0])
    per = int(array.metadata.chunk_grid.chunk_shape[0]) // inner
    chain = StoredChain.of(SimpleNamespace(metadata=SimpleNamespace(codecs=list(codec.codecs)), dtype=array.dtype))
    if not chain.known or not chain.crc:
        raise ValueError(f"{array.path}: not one of this package's inner codec chains")
    return inner, per, chain


class _Files:
    """Where an array's shard files are: under ``root``, the path or URL of the Zarr store the
    array is in (URLs through fsspec's synchronous file systems)."""

    def __init__(self, array: zarr.Array, root: str) -> None:
        self.array = array
        root = str(root).rstrip("/")
        if "://" in root and not root.startswith("file://"):
            import fsspec

            self.fs, self.prefix = fsspec.core.url_to_fs(root)
            self.local = None
        else:
            self.fs, self.prefix = None, ""
            self.local = Path(root.removeprefix("file://"))

    def path(self, s: int) -> str:
        key = self.array.metadata.chunk_key_encoding.encode_chunk_key((s,))
        rel = f"{self.array.path}/{key}" if self.array.path else key
        if self.local is not None:
            return str(self.local / rel)
        return f"{self.prefix.rstrip('/')}/{rel}"


class ShardWriter:
    """Writes whole shards of a sharded 1-D array, as Zarr would (the bytes are Zarr's)."""

    def __init__(self, array: zarr.Array, root: str) -> None:
        self.array = array
        self.chunk_len, self.per_shard, chain = _inner(array)
        self.delta = chain.delta
        self.blosc = chain.numcodecs_blosc()
        self.dtype = np.dtype(array.dtype)
        self.files = _Files(array, root)
        self.buffers = FrameBuffers()
        self._made = False  # the shard folder exists

    def write(self, s: int, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shard ``s`` from ``data`` (a whole shard, or the array's last entries); the last inner
        chunk is padded with zeros as Zarr pads it. Returns per inner chunk written its CRC32C
        and stored bytes."""
        data = np.ascontiguousarray(data, dtype=self.dtype)
        C = self.chunk_len
        n = -(-data.shape[0] // C)
        if n * C != data.shape[0]:
            data = np.concatenate([data, np.zeros(n * C - data.shape[0], dtype=self.dtype)])
        index = np.full((self.per_shard, 2), EMPTY, dtype="<u8")
        # every chunk of the shard encoded in one native loop (the bytes numcodecs writes)
        if self.blosc is not None:
            body, crcs, sizes = framed_chunks(data, C, self.delta, self.blosc, self.buffers)
        else:
            body, crcs, sizes = framed_raw_chunks(data, C, self.delta, self.buffers)
        index[:n, 0] = np.cumsum(sizes) - sizes
        index[:n, 1] = sizes
        parts = [memoryview(body)]
        raw = index.tobytes()
        parts.append(raw + int(_crc32c(raw)).to_bytes(4, "little"))
        path = self.files.path(s)
        try:
            if self.files.local is not None:
                if not self._made:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                    self._made = True
                with open(path, "wb") as f:
                    f.writelines(parts)
            else:
                self.files.fs.pipe_file(path, b"".join(parts))
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            if self.files.local is not None:
                Path(path).unlink(missing_ok=True)
            raise disk_full_error(exc, path, needed=sum(len(p) for p in parts)) from exc
        return crcs, sizes


class ShardReader:
    """Reads inner chunks of a sharded 1-D array: each shard's index once, then one ranged read
    per run of touching chunks (local files stay open)."""

    def __init__(self, array: zarr.Array, root: str) -> None:
        self.array = array
        self.chunk_len, self.per_shard, chain = _inner(array)
        self.delta = chain.delta
        self.raw = chain.raw
        self.dtype = np.dtype(array.dtype)
        self.files = _Files(array, root)
        # every chunk's (offset, bytes) in its shard file, filled a shard at a time as its index
        # is first read (the memory the indexes took when kept per shard): a read then looks its
        # chunks up in one step, where a step a shard cost 10 % of a round's gather
        self.nchunks = -(-int(array.shape[0]) // self.chunk_len)
        nshards = -(-max(1, self.nchunks) // self.per_shard)
        self._where = np.empty((nshards * self.per_shard, 2), dtype="<u8")
        self._loaded = np.zeros(nshards, dtype=bool)
        self._fds: OrderedDict[int, int] = OrderedDict()  # shard -> open fd, least recently used first
        self._users: dict[int, int] = {}  # shard -> reads using its fd now (never closed under them)
        self._lock = threading.Lock()

    def _acquire(self, s: int) -> int:
        with self._lock:
            fd = self._fds.get(s)
            if fd is None:
                fd = self._fds[s] = os.open(self.files.path(s), os.O_RDONLY)
            self._fds.move_to_end(s)
            self._users[s] = self._users.get(s, 0) + 1
            if len(self._fds) > MAX_OPEN_SHARDS:
                for k in [k for k in self._fds if not self._users.get(k)][: len(self._fds) - MAX_OPEN_SHARDS]:
                    os.close(self._fds.pop(k))
            return fd

    def _release(self, s: int) -> None:
        with self._lock:
            left = self._users[s] - 1
            if left:
                self._users[s] = left
            else:
                del self._users[s]

    def _range(self, s: int, start: int, stop: int) -> bytes:
        if self.files.local is not None:
            fd = self._acquire(s)
            try:
                return os.pread(fd, stop - start, start)
            finally:
                self._release(s)
        return self.files.fs.cat_file(self.files.path(s), start=start, end=stop)

    def _shard_index(self, s: int) -> np.ndarray:
        if self._loaded[s]:
            return self._where[s * self.per_shard : (s + 1) * self.per_shard]
        n = self.per_shard * 16 + 4
        try:
            if self.files.local is not None:
                size = os.path.getsize(self.files.path(s))
            else:
                size = int(self.files.fs.size(self.files.path(s)))
        except FileNotFoundError:
            raise ShardError(f"shard {s} is missing") from None
        if size < n:
            raise ShardError(f"shard {s} is shorter than its index")
        raw = self._range(s, size - n, size)
        if int(_crc32c(raw[:-4])) != int.from_bytes(raw[-4:], "little"):
            raise ShardError(f"shard {s}: its index fails its CRC32C checksum")
        index = np.frombuffer(raw[:-4], dtype="<u8").reshape(self.per_shard, 2)
        live = index[:, 0] != EMPTY
        if np.any(index[live, 0] + index[live, 1] > size - n):
            raise ShardError(f"shard {s}: its index points past its chunks")
        self._where[s * self.per_shard : (s + 1) * self.per_shard] = index
        self._loaded[s] = True
        return index

    def read_many(
        self, chunks: np.ndarray, out: np.ndarray, scratch: ScratchBuffers | None = None
    ) -> tuple[np.ndarray, int]:
        """Inner chunks ``chunks`` (int64) decoded into ``out``, chunk ``j`` into slot ``j`` of
        ``chunk_len`` elements (Delta's differences left for the caller). Chunks next to each
        other in a shard file are read together (one ``pread``, or one ranged GET of the ranges at
        once); each one's CRC32C is checked before it is decoded. Returns their CRC32Cs and the
        bytes read."""
        chunks = np.asarray(chunks, dtype=np.int64)
        n = chunks.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.int64), 0
        if int(chunks.min()) < 0 or int(chunks.max()) >= self.nchunks:
            raise ShardError(f"chunks {int(chunks.min())}..{int(chunks.max())}: outside the array's chunks")
        shard = chunks // self.per_shard
        touched = np.zeros(self._loaded.shape[0], dtype=bool)
        touched[shard] = True
        for s in np.flatnonzero(touched & ~self._loaded).tolist():
            self._shard_index(s)
        where = self._where[chunks]
        empty = where[:, 0] == EMPTY
        if np.any(empty):
            raise ShardError(f"chunk {int(chunks[int(np.argmax(empty))])} is missing")
        off, length = where[:, 0].astype(np.int64), where[:, 1].astype(np.int64)
        # byte ranges: chunks that touch in one shard file are one read (chunks in order, as a
        # round asks for them, are in file order already: no sort)
        ordered = n < 2 or bool(np.all((shard[1:] > shard[:-1]) | ((shard[1:] == shard[:-1]) & (off[1:] > off[:-1]))))
        order = np.arange(n) if ordered else np.lexsort((off, shard))
        s_, o_, e_ = shard[order], off[order], off[order] + length[order]
        new = np.ones(n, dtype=bool)
        new[1:] = (s_[1:] != s_[:-1]) | (o_[1:] != e_[:-1])
        rid = np.cumsum(new) - 1
        r_start, r_shard = o_[new], s_[new]
        r_end = np.maximum.reduceat(e_, np.flatnonzero(new))
        r_at = np.concatenate([[0], np.cumsum(r_end - r_start)])
        nbuf = int(r_at[-1])
        buf = np.empty(nbuf, dtype=np.uint8) if scratch is None else scratch.take("read", nbuf, np.uint8)
        self._read_ranges(r_shard, r_start, r_end, r_at, buf)
        pos = np.empty(n, np.int64)
        pos[order] = r_at[rid] + o_ - r_start[rid]
        crcs = self._check_crcs(chunks, buf, pos, length)
        status = decode_chunks(
            buf,
            pos,
            length - 4,
            out[: n * self.chunk_len].view(np.uint8),
            self.chunk_len * self.dtype.itemsize,
            self.raw,
        )
        if np.any(status != OK):
            j = int(np.argmax(status != OK))
            if status[j] == BAD_HEADER:
                raise ShardError(f"chunk {int(chunks[j])}: does not decode to {self.chunk_len} elements")
            raise ShardError(f"chunk {int(chunks[j])}: Blosc cannot decode it")
        return crcs, int(buf.shape[0])

    def _read_ranges(self, shard: np.ndarray, start: np.ndarray, end: np.ndarray, at: np.ndarray, buf) -> None:
        if self.files.local is not None:
            # ranges come sorted by shard; up to MAX_OPEN_SHARDS shard files at a time, their
            # ranges read by native pread calls on the task's threads
            cuts = np.concatenate([[0], np.flatnonzero(np.diff(shard)) + 1, [shard.shape[0]]])
            for g in range(0, cuts.shape[0] - 1, MAX_OPEN_SHARDS):
                i, j = int(cuts[g]), int(cuts[min(g + MAX_OPEN_SHARDS, cuts.shape[0] - 1)])
                held = [int(shard[c]) for c in cuts[g : min(g + MAX_OPEN_SHARDS, cuts.shape[0] - 1)]]
                fds = {s: self._acquire(s) for s in held}
                try:
                    fd = np.array([fds[s] for s in shard[i:j].tolist()], dtype=np.int64)
                    got = pread_ranges(fd, start[i:j], end[i:j], at[i:j], buf)
                    short = np.flatnonzero(got != end[i:j] - start[i:j])
                    if short.shape[0]:
                        k = int(short[0])
                        s = int(shard[i + k])
                        if got[k] < 0:  # the call failed: the system's error, while the file is still held
                            os.pread(fds[s], int(end[i + k] - start[i + k]), int(start[i + k]))
                        raise ShardError(f"shard {s} is shorter than its index says")
                finally:
                    for s in held:
                        self._release(s)
            return
        paths_ = [self.files.path(s) for s in shard.tolist()]
        for p, got in zip(at.tolist(), self.files.fs.cat_ranges(paths_, start.tolist(), end.tolist())):
            if isinstance(got, Exception):
                raise got
            buf[p : p + len(got)] = np.frombuffer(got, dtype=np.uint8)

    @staticmethod
    def _check_crcs(chunks: np.ndarray, buf: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
        tail = pos + length - 4
        stored = (
            buf[tail].astype(np.int64)
            | (buf[tail + 1].astype(np.int64) << 8)
            | (buf[tail + 2].astype(np.int64) << 16)
            | (buf[tail + 3].astype(np.int64) << 24)
        )
        got = chunk_crcs(buf, pos, length - 4)
        if not np.array_equal(got, stored):
            raise ShardError(f"chunk {int(chunks[int(np.argmax(got != stored))])}: CRC32C checksum mismatch")
        return stored

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __del__(self) -> None:  # pragma: no cover - process exit
        try:
            self.close()
        except Exception:
            pass
