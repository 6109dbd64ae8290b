"""Every indexed mode's fiber-index entries from one decode of the store, split by key range.

A fiber index of ``M`` modes needs, per mode, the store's nonzeros sorted by fiber key. Sorting
them in bounded memory took one decode of the store per key range and mode (4 a mode of an 86 M
store under 4 GiB: most of a 114 s build). Here one decode serves several modes: each chunk's
entries of every mode (key, row, value) go to that mode's partition of their key range (the key's
top bits), kept in memory for the modes the build holds and otherwise appended to raw files in a
spill folder. A partition is then sorted alone (its keys span fewer bits, so its sort is one word
where the whole mode's was two) and read back in key order of partitions.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

import numba as nb
import numpy as np

from ..disk import disk_full_error, is_disk_full
from ..format.fiber_keys import key_space, key_strides
from ..store import Store
from ..store import paths as store_paths
from ..store.fiber_index import row_dtype
from ..store.scratch import ScratchBuffers
from .phase_clock import PhaseClock

#: a partition's average entries: sorted in cache-sized digit runs, and its keys one word with
#: their positions (36 + 21 bits for an Amazon-shaped mode)
PARTITION_ENTRIES = 1 << 21
MAX_PARTITIONS = 1 << 12
#: bytes of spilled entries gathered before they are written, one append a partition's file, on
#: a thread while the next are gathered: a store chunk's share of a partition is a few 10 KB, and
#: an open-append-close of 32 KB cost about 140 us (990 k of them for a 500 M store's 3 modes)
SPILL_BATCH_BYTES = 512 << 20


ARRAYS = ("key", "row", "value")


def entry_dtypes(store: Store, mode: int) -> dict[str, np.dtype]:
    """An entry's arrays as held in a partition: key, mode-``mode`` row (the index's dtype), value."""
    return {"key": np.dtype("<u8"), "row": row_dtype(store.shape[mode]), "value": np.dtype(store.value_dtype)}


def entry_bytes(store: Store, mode: int) -> int:
    """Bytes an entry of mode ``mode`` takes held."""
    return sum(dt.itemsize for dt in entry_dtypes(store, mode).values())


@nb.njit(nogil=True, cache=True)
def _partition(coords, values, mode, strides, shift, counts, keys, rows, vals, scratch):
    # one chunk's keys, rows and values grouped by partition (each in store order); scratch:
    # uint64 (n,), the keys in store order
    n = coords.shape[0]
    for i in range(n):
        k = np.uint64(0)
        for m in range(coords.shape[1]):
            if m != mode:
                k += np.uint64(coords[i, m]) * strides[m]
        scratch[i] = k
        counts[np.int64(k >> shift)] += 1
    at = np.empty(counts.shape[0], dtype=np.int64)
    s = 0
    for p in range(counts.shape[0]):
        at[p] = s
        s += counts[p]
    for i in range(n):
        k = scratch[i]
        p = np.int64(k >> shift)
        j = at[p]
        at[p] = j + 1
        keys[j] = k
        rows[j] = coords[i, mode]
        vals[j] = values[i]


def joined(
    pieces: list[tuple[np.ndarray, ...]], dtypes: dict[str, np.dtype], buffers: ScratchBuffers | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of entries (keys, rows, values) end to end, in ``buffers`` when given (views valid
    until their next use: a fresh array a run cost its pages' faults), else in new arrays."""
    n = sum(q[0].shape[0] for q in pieces)
    out = []
    for i, name in enumerate(ARRAYS):
        dest = np.empty(n, dtypes[name]) if buffers is None else buffers.take(f"joined-{name}", n, dtypes[name])
        if pieces:
            np.concatenate([q[i] for q in pieces], out=dest)
        out.append(dest)
    return tuple(out)


class FiberPartitions:
    """The entries of ``modes`` of ``store``, partitioned by key range in one decode of the store.

    Parameters
    ----------
    store : Store
        The store.
    modes : list of int
        Modes whose entries are kept.
    max_entries : int
        Entries one sort may hold: partitions average at most a quarter of it.
    held : list of int
        Modes whose entries stay in memory (:meth:`held_bytes` of them); the others' go to files
        in a spill folder (removed by :meth:`close`).
    spill_dir : str, optional
        Where the spill folder goes (default: beside a local store, else the system's temporary
        folder).
    clock : PhaseClock, optional
        Where the reads, partitioning, spill writes and read-backs are timed.
    spill_batch_bytes : int, optional
        Spilled entries gathered before they are written (default :data:`SPILL_BATCH_BYTES`); two
        batches are held at most, one being written.
    """

    def __init__(
        self,
        store: Store,
        modes: Sequence[int],
        max_entries: int,
        held: Sequence[int],
        spill_dir: str | None = None,
        clock: PhaseClock | None = None,
        spill_batch_bytes: int = SPILL_BATCH_BYTES,
    ) -> None:
        self.store = store
        self.clock = clock or PhaseClock()
        self.spill_batch_bytes = max(1, int(spill_batch_bytes))
        self._batch: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self._batch_bytes = 0
        # a spilled mode's partitioned entries of a store chunk, whole: those of the batch being
        # gathered, and those free for another chunk once their batch is written (fresh arrays a
        # chunk cost 20-24 bytes an entry a mode of page faults)
        self._batch_arrays: list[tuple[int, tuple[np.ndarray, ...]]] = []
        self._free: dict[int, list[tuple[np.ndarray, ...]]] = {m: [] for m in modes}
        self._spilling: Future | None = None
        self._scratch = ScratchBuffers()
        self._spiller: ThreadPoolExecutor | None = None
        self.modes = list(modes)
        self.dtypes = {m: entry_dtypes(store, m) for m in self.modes}
        self.held = set(held)
        self.shift: dict[int, int] = {}
        for m in self.modes:
            bits = (max(1, key_space(store.shape, m)) - 1).bit_length()
            want = -(-store.nnz // max(1, min(PARTITION_ENTRIES, max_entries // 4)))
            p = min((max(1, want) - 1).bit_length(), MAX_PARTITIONS.bit_length() - 1, bits)
            self.shift[m] = bits - p
        self.counts = {m: np.zeros(self.nparts(m), dtype=np.int64) for m in self.modes}
        self._memory: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.folder: Path | None = None
        if any(m not in self.held for m in self.modes):
            where = spill_dir
            if where is None and not store_paths.is_url(store.path):
                where = str(store_paths.local_path(store.path).absolute().parent)
            self.folder = Path(tempfile.mkdtemp(prefix=".fiber-index-spill-", dir=where))
        # spilled partitions are read ahead, and removed once sorted, on threads of their own: at
        # 500 M nonzeros the reads waited 86 s and the removals (ext4 with discard) 27 s of a
        # 370 s build, on the sorting thread
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="fiber-index-read-ahead") if self.folder else None
        self._remover = ThreadPoolExecutor(1, thread_name_prefix="fiber-index-remove") if self.folder else None

    @staticmethod
    def held_bytes(store: Store, modes: Sequence[int]) -> int:
        """Bytes the entries of ``modes`` take, all of them held."""
        return store.nnz * sum(entry_bytes(store, m) for m in modes)

    def nparts(self, mode: int) -> int:
        return ((max(1, key_space(self.store.shape, mode)) - 1) >> self.shift[mode]) + 1

    def bounds(self, mode: int, p: int) -> tuple[int, int]:
        """Keys ``[lo, hi)`` of partition ``p`` of ``mode``."""
        lo = p << self.shift[mode]
        return lo, min(key_space(self.store.shape, mode), (p + 1) << self.shift[mode])

    def _file(self, mode: int, p: int, name: str) -> Path:
        assert self.folder is not None
        return self.folder / f"m{mode}-p{p}.{name}"

    def fill(self, progress: bool = False) -> None:
        """The one decode of the store: every chunk's entries into their partitions."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.store.nnz, unit="nnz", unit_scale=True, desc="fiber index, reading the store")
        try:
            # the next chunk is read and decoded on a thread while this one is partitioned (the
            # partitioning kernel is serial: only the reader's kernels use numba's thread pool)
            with (
                ThreadPoolExecutor(1, thread_name_prefix="fiber-index-reader") as pool,
                ThreadPoolExecutor(1, thread_name_prefix="fiber-index-spill") as self._spiller,
            ):
                ahead = pool.submit(self._decoded, 0) if self.store.nchunks else None
                for c in range(self.store.nchunks):
                    assert ahead is not None
                    with self.clock("waiting on the decode"):
                        coords, values = ahead.result()
                    ahead = pool.submit(self._decoded, c + 1) if c + 1 < self.store.nchunks else None
                    scratch = self._scratch.take("keys", coords.shape[0], np.uint64)
                    for m in self.modes:
                        self._add(m, coords, values, scratch)
                    if self._batch_bytes >= self.spill_batch_bytes:
                        self._spill()
                    if bar is not None:
                        bar.update(coords.shape[0])
                    del coords, values
                self._spill()
                self._spilled()
        finally:
            self._spiller = None
            self._batch.clear()
            self._batch_arrays.clear()
            for free in self._free.values():
                free.clear()
            if bar is not None:
                bar.close()

    def _spill(self) -> None:
        """The gathered batch of spilled entries handed to the spill thread (once the batch before
        is written)."""
        if not self._batch:
            return
        batch, self._batch, self._batch_bytes = self._batch, {}, 0
        arrays, self._batch_arrays = self._batch_arrays, []
        self._spilled()
        assert self._spiller is not None
        self._spilling = self._spiller.submit(self._write_batch, batch, arrays)

    def _spilled(self) -> None:
        """Wait for the batch being written; its error raised here."""
        if self._spilling is not None:
            with self.clock("waiting on spill writes"):
                done, self._spilling = self._spilling, None
                done.result()

    def _write_batch(
        self,
        batch: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
        arrays: list[tuple[int, tuple[np.ndarray, ...]]],
    ) -> None:
        with self.clock("spill write (spill thread)"):
            for (mode, p), parts in batch.items():
                for i, name in enumerate(ARRAYS):
                    self._append_file(self._file(mode, p, name), [part[i] for part in parts])
        for mode, got in arrays:
            self._free[mode].append(got)

    def _chunk_arrays(self, mode: int, n: int) -> tuple[np.ndarray, ...]:
        """Arrays for ``n`` partitioned entries of ``mode``: a spilled mode's from those its
        written batches freed (kept whole with the batch they go to), else new."""
        dts = self.dtypes[mode]
        if mode in self.held:
            return tuple(np.empty(n, dtype=dts[name]) for name in ARRAYS)
        free = self._free[mode]
        got = free.pop() if free and free[-1][0].shape[0] >= n else None
        if got is None:
            got = tuple(np.empty(n, dtype=dts[name]) for name in ARRAYS)
        self._batch_arrays.append((mode, got))
        return tuple(a[:n] for a in got)

    def _decoded(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        with self.clock("decode (reader thread)"):
            ch = self.store.read_chunk(c)
            return ch.coords(self.store.layout), ch.values

    def _add(self, mode: int, coords: np.ndarray, values: np.ndarray, scratch: np.ndarray) -> None:
        n = coords.shape[0]
        counts = np.zeros(self.nparts(mode), dtype=np.int64)
        got = self._chunk_arrays(mode, n)
        strides = key_strides(self.store.shape, mode)
        with self.clock("partition"):
            _partition(coords, values, mode, strides, np.uint64(self.shift[mode]), counts, *got, scratch)
        self.counts[mode] += counts
        ends = np.cumsum(counts)
        for p in np.flatnonzero(counts).tolist():
            part = tuple(a[ends[p] - counts[p] : ends[p]] for a in got)
            if mode in self.held:
                self._memory.setdefault((mode, p), []).append(part)
            else:
                self._batch.setdefault((mode, p), []).append(part)
                self._batch_bytes += sum(a.nbytes for a in part)

    @staticmethod
    def _append_file(path: Path, parts: list[np.ndarray]) -> None:
        try:
            with open(path, "ab") as f:
                for part in parts:
                    part.tofile(f)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(exc, str(path), needed=sum(a.nbytes for a in parts)) from exc
            raise

    def pieces(self, mode: int, p: int, most: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Partition ``p`` of ``mode`` (keys, rows, values) in store order, in pieces of at most
        ``most`` entries (where it is in memory: the pieces it was added in)."""
        if mode in self.held:
            yield from self._memory.get((mode, p), [])
            return
        n = int(self.counts[mode][p])
        dts = self.dtypes[mode]
        files = [open(self._file(mode, p, name), "rb") for name in ARRAYS]
        try:
            for at in range(0, n, max(1, most)):
                k = min(most, n - at)
                with self.clock("spill read"):
                    got = tuple(np.fromfile(f, dtype=dts[name], count=k) for f, name in zip(files, ARRAYS))
                yield got
        finally:
            for f in files:
                f.close()

    def entries(
        self, mode: int, p: int, buffers: ScratchBuffers | None = None, slot: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All of partition ``p`` of ``mode`` (keys, rows, values), in store order (joined into
        ``buffers`` when given: views valid until their next use; a spilled partition into the
        buffers of ``slot``)."""
        if mode not in self.held and buffers is not None:
            return self._read_into(mode, p, buffers, slot)
        parts = list(self.pieces(mode, p, int(self.counts[mode][p])))
        if len(parts) == 1:
            return parts[0]
        return joined(parts, self.dtypes[mode], buffers)

    def read_ahead(
        self, mode: int, p: int, buffers: ScratchBuffers, slot: int
    ) -> Future[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """:meth:`entries` of a spilled partition into the buffers of ``slot``, on the read-ahead
        thread (None for a partition held in memory)."""
        if mode in self.held or self._reader is None:
            return None
        return self._reader.submit(self._read_into, mode, p, buffers, slot)

    def _read_into(
        self, mode: int, p: int, buffers: ScratchBuffers, slot: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A spilled partition read straight into ``buffers`` (fresh arrays a partition cost their
        pages' faults)."""
        n = int(self.counts[mode][p])
        out = []
        with self.clock("spill read"):
            for name in ARRAYS:
                dest = buffers.take(f"spilled-{name}{slot}", n, self.dtypes[mode][name])
                with open(self._file(mode, p, name), "rb") as f:
                    got = f.readinto(memoryview(dest).cast("B"))
                if got != dest.nbytes:
                    raise RuntimeError(f"fiber index spill file {self._file(mode, p, name)} cut short: {got:,} bytes")
                out.append(dest)
        return tuple(out)

    def drop(self, mode: int, p: int) -> None:
        """Forget partition ``p`` of ``mode`` (its memory or files) once it is sorted."""
        self._memory.pop((mode, p), None)
        if mode not in self.held and self._remover is not None:
            for name in ARRAYS:
                self._remover.submit(self._file(mode, p, name).unlink, missing_ok=True)

    def close(self) -> None:
        """Remove the spill folder (this build's own) and what is held."""
        self._memory.clear()
        for pool in (self._reader, self._remover):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> FiberPartitions:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
