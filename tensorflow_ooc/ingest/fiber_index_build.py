"""Build a store's fiber index out of core: per mode, the nonzeros sorted by fiber key
(``tfooc fiber-index``, ``convert --fiber-index``).

The store is decoded once for every mode that fits the budget (:mod:`.fiber_partitions`): each
entry goes to its mode's partition of key range, held in memory; modes that do not fit beside the
ones held are a further read of the store (:func:`plan_rounds`), and a mode that does not fit
alone is spilled to files. Each partition is then sorted alone, stably (each fiber in store
order), in key order, and appended to the mode's index on a writer thread; a partition heavier
than a sort's share of the budget is sorted in key ranges of it, one read of its pieces each.
Memory: the entries held (20-24 bytes an entry a mode, or none when spilled) and about 156 bytes
an entry of the largest sort (its keys, rows, values and the sort's scratch, and the run written
beside it), whatever the store's size.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Iterable, Iterator, Sequence

import numpy as np
import psutil

from ..format.fiber_keys import exact_keys
from ..format.radix_sort import stable_sort_by_key
from ..store import Store, open_store
from ..store.chunk_cache import parse_bytes
from ..store.fiber_index import DEFAULT_FIBER_CHUNK_NNZ, FiberIndex, ModeIndexWriter, open_fiber_index, publish_modes
from ..store.output_lock import OutputLock
from ..store.scratch import ScratchBuffers
from .fiber_partitions import PARTITION_ENTRIES, SPILL_BATCH_BYTES, FiberPartitions, joined
from .memory import limit_heap_growth, trim
from .phase_clock import PhaseClock

log = logging.getLogger(__name__)

#: bytes an entry of a sort costs: keys, rows and values as read and concatenated (and the next
#: run's, read ahead), the sort's joined words, positions and scratch, the reordered copies (a
#: 500 M build at 64 held 11.3 GB under a 10 GB limit)
ENTRY_BYTES = 132
#: bytes an entry of the sorted run being written while the next one is sorted
RUN_BYTES = 24
_HIST_BITS = 16


def parse_modes(modes: str | int | Iterable[int] | None, nmodes: int) -> list[int]:
    """``"all"`` / None: every mode; else mode numbers (0-based; ints or a comma list), checked."""
    if modes is None or (isinstance(modes, str) and modes.strip().lower() == "all"):
        return list(range(nmodes))
    if isinstance(modes, str):
        try:
            items = [int(x) for x in modes.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"fiber index modes must be 'all' or mode numbers like 0,2; got {modes!r}") from None
    elif isinstance(modes, int):
        items = [modes]
    else:
        items = [int(x) for x in modes]
    if not items:
        raise ValueError("fiber index modes: none given (use 'all' or mode numbers like 0,2)")
    bad = [m for m in items if not 0 <= m < nmodes]
    if bad:
        raise ValueError(f"fiber index modes {bad} are not modes of an order-{nmodes} tensor (0..{nmodes - 1})")
    return sorted(set(items))


def _buckets(keys: Iterable[np.ndarray], lo: int, hi: int, max_entries: int) -> list[tuple[int, int]]:
    """Key ranges ``[a, b)`` covering ``[lo, hi)`` in order, each of at most ``max_entries`` of the
    entries whose ``keys`` are given in pieces, where one range of a 2^16-bin histogram allows
    (a single heavier range is one bucket of its own)."""
    shift = max(0, (hi - lo - 1).bit_length() - _HIST_BITS)
    hist = np.zeros(((hi - lo - 1) >> shift) + 1, dtype=np.int64)
    for k in keys:
        hist += np.bincount(((k - np.uint64(lo)) >> np.uint64(shift)).astype(np.int64), minlength=hist.shape[0])
    out, a, n = [], lo, 0
    for b, count in enumerate(hist.tolist()):
        if n and n + count > max_entries:
            out.append((a, lo + (b << shift)))
            a, n = lo + (b << shift), 0
        n += count
    out.append((a, hi))
    return out


class RunBuffers:
    """The buffers the runs of a build are sorted in, reused run after run: the entries read back,
    the sort's scratch, and two sets of sorted entries (one being written on the writer thread
    while the next run is sorted into the other). Fresh arrays a run cost their pages' faults,
    about 64 bytes an entry a mode (an 86 M build spent 15-21 s of system time)."""

    def __init__(self, clock: PhaseClock | None = None) -> None:
        self.scratch = ScratchBuffers()
        self.turn = 0
        self.clock = clock or PhaseClock()

    def sort(
        self, keys: np.ndarray, lo: int, hi: int, rows: np.ndarray, values: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`stable_sort_by_key` into the set not handed out last (valid until the sort
        after next)."""
        n, t = keys.shape[0], self.turn
        self.turn ^= 1
        take = self.scratch.take
        out = (take(f"key{t}", n, np.uint64), take(f"row{t}", n, rows.dtype), take(f"value{t}", n, values.dtype))
        with self.clock("sort"):
            return stable_sort_by_key(keys, lo, hi, rows, values, out, take("sort", 3 * n, np.uint64))


def _mode_runs(
    parts: FiberPartitions, mode: int, max_entries: int, buffers: RunBuffers
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Mode ``mode``'s entries sorted by key, run by run: a partition at a time, or a heavier
    partition in key ranges of at most ``max_entries`` entries (one read of it each). Each run
    lives in ``buffers`` until the run after next."""
    most = max(1, max_entries // 4)
    todo = np.flatnonzero(parts.counts[mode]).tolist()
    ahead = None  # the next partition, read on the read-ahead thread while this one sorts
    for i, p in enumerate(todo):
        n = int(parts.counts[mode][p])
        lo, hi = parts.bounds(mode, p)
        if n <= max_entries:
            with parts.clock("read back"):
                got = ahead.result() if ahead is not None else parts.entries(mode, p, buffers.scratch, i % 2)
                keys, rows, values = got
            ahead = None
            if i + 1 < len(todo) and parts.counts[mode][todo[i + 1]] <= max_entries:
                ahead = parts.read_ahead(mode, todo[i + 1], buffers.scratch, (i + 1) % 2)
            # stably (each fiber in store order), keys relative to lo: fewer bits
            yield buffers.sort(keys, lo, hi, rows, values)
        else:
            for a, b in _buckets((e[0] for e in parts.pieces(mode, p, most)), lo, hi, max_entries):
                kept: list[tuple[np.ndarray, ...]] = []
                with parts.clock("read back"):
                    for e in parts.pieces(mode, p, most):
                        keep = (e[0] >= np.uint64(a)) & (e[0] < np.uint64(b))
                        kept.append(tuple(x[keep] for x in e))
                    keys, rows, values = joined(kept, parts.dtypes[mode], buffers.scratch)
                del kept
                yield buffers.sort(keys, a, b, rows, values)
        with parts.clock("drop"):
            parts.drop(mode, p)
            trim()


def build_fiber_index(
    store: Store | str | os.PathLike,
    modes: str | Sequence[int] | None = "all",
    *,
    chunk_nnz: int | None = None,
    memory_limit: int | str | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> FiberIndex:
    """Write the fiber index of ``store`` for ``modes``: per mode, the nonzeros ordered by their
    fiber (their indices in the other modes), so randomized CP (STS-CP, CP-ARLS-LEV) and rTT-ALS
    read only the sampled fibers instead of every nonzero.

    Parameters
    ----------
    store : Store or path
        A BLCO store (local path or URL) this package wrote.
    modes : "all" or mode numbers
        Modes to index (0-based). A mode whose other modes span more than 2^63 cells cannot be.
    chunk_nnz : int, optional
        Entries per index chunk: the unit a sampled fiber is read in. Default: per mode about its
        fibers' mean length, 128 to 1024 (1024 where fibers average under 16 entries).
    memory_limit : int or str, optional
        Bytes the build may hold, a count or ``"4GiB"`` (default: half the memory available, as
        ``convert``): the store is read once; its entries are held, or spilled to files beside
        a local store, and sorted in key ranges that fit it.
    overwrite : bool
        Replace the index of modes that have one (else they are an error).
    progress : bool
        A progress bar per mode.

    Returns
    -------
    FiberIndex
        The store's index, opened (``.modes``, ``.describe()``).

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> s = tfo.convert((np.array([[0, 1, 2], [1, 1, 2], [2, 0, 1]]), np.ones(3)), "memory://doc-fibers")
    >>> tfo.build_fiber_index(s, "all").modes
    [0, 1, 2]
    """
    src = store if isinstance(store, Store) else open_store(store)
    todo = parse_modes(modes, src.nmodes)
    wide = [m for m in todo if not exact_keys(src.shape, m)]
    if wide:
        raise ValueError(
            f"{src.path}: modes {wide} cannot be indexed: the product of the other modes' lengths exceeds 2^63"
        )
    existing = open_fiber_index(src)
    have = [m for m in todo if existing is not None and m in existing.modes]
    if have and not overwrite:
        raise FileExistsError(f"{src.path}: modes {have} already have a fiber index; pass overwrite=True to rebuild")
    # as convert: half the memory available now, unless given
    budget = parse_bytes(memory_limit) if memory_limit else psutil.virtual_memory().available // 2
    rounds = plan_rounds(src, todo, budget)
    limit_heap_growth()
    clock = PhaseClock()
    with OutputLock([f"{src.path.rstrip('/')}/fibers"], f"fiber index of {src.path}"):
        written: dict[int, tuple[ModeIndexWriter, dict]] = {}
        try:
            least = chunk_nnz or DEFAULT_FIBER_CHUNK_NNZ  # a sort holds at least a chunk
            for held, spilled, max_entries in rounds:
                modes = [m for m in todo if m in held or m in spilled]
                sorts = max(least, max_entries)
                # the sorts' room is free while the store is read: two batches of spilled entries
                # (one written, one gathered) with their reused arrays, and a store chunk's share
                # past the batch, take half of it (half each went 8 MiB past a 24 MiB limit)
                batch = min(SPILL_BATCH_BYTES, sorts * (ENTRY_BYTES + RUN_BYTES) // 4)
                with FiberPartitions(src, modes, sorts, held, clock=clock, spill_batch_bytes=batch) as parts:
                    t0 = time.perf_counter()
                    parts.fill(progress)
                    log.info(
                        "fiber index: the store read for modes %s in %.1f s (entries of modes %s in memory, of "
                        "modes %s spilled to %s)",
                        modes,
                        time.perf_counter() - t0,
                        held,
                        spilled,
                        parts.folder,
                    )
                    written.update(_write_modes(src, modes, parts, chunk_nnz, sorts, progress))
            with clock("publish"):
                publish_modes(src, written)
        except BaseException:
            for w, _ in written.values():
                w.abort()
            raise
    log.info("fiber index: seconds by phase (the writer thread's overlap the sorts): %s", clock.summary())
    out = open_fiber_index(open_store(src.path))
    assert out is not None
    return out


def plan_rounds(src: Store, modes: list[int], budget: int) -> list[tuple[list[int], list[int], int]]:
    """How the build reads the store for ``modes`` under ``budget`` bytes: a list of rounds, each
    one read of the store, as (modes whose entries it holds in memory, modes whose entries it
    spills to files, entries a sort may hold).

    Modes are held together, in order, while their entries leave a partition's sort its room; a
    further group of modes is one more read of the store (a decode costs less than writing and
    reading back a mode's entries: 28 s against 7 s for the read of an 86 M store). Only a mode
    that does not fit alone is spilled, in the first round."""
    room = PARTITION_ENTRIES * (ENTRY_BYTES + RUN_BYTES)
    # beside entries and sorts: a mode's filter (at most 16 bits a fiber) and its keys grouped by
    # region (as many bytes again), and two store chunks decoded (the one partitioned and the next)
    reserve = 4 * src.nnz + 2 * src.chunk_nnz * (8 * src.nmodes + 32)
    fits = budget - room - reserve
    spilled = [m for m in modes if FiberPartitions.held_bytes(src, [m]) > fits]
    groups: list[list[int]] = [[]]
    for m in modes:
        if m in spilled:
            continue
        if groups[-1] and FiberPartitions.held_bytes(src, [*groups[-1], m]) > fits:
            groups.append([])
        groups[-1].append(m)
    rounds = []
    for k, held in enumerate(groups):
        free = budget - FiberPartitions.held_bytes(src, held) - reserve
        rounds.append((held, spilled if k == 0 else [], free // (ENTRY_BYTES + RUN_BYTES)))
    return rounds


def _write_modes(
    src: Store, todo: list[int], parts: FiberPartitions, chunk_nnz: int | None, max_entries: int, progress: bool
) -> dict[int, tuple[ModeIndexWriter, dict]]:
    """Every mode's index, staged: runs are sorted here while the run before is encoded and
    written on a writer thread (the numba kernels and file writes release the GIL), and a mode's
    filter and tables are finished there while the next mode sorts. One run is written at a time."""
    writers: dict[int, ModeIndexWriter] = {}
    finished: dict[int, Future] = {}
    buffers = RunBuffers(parts.clock)
    clock = parts.clock

    def timed(name: str, call, *args):
        with clock(name):
            return call(*args)

    counts = dict.fromkeys(todo, 0)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=src.nnz * len(todo), unit="entries", unit_scale=True, desc="fiber index, sorting")
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="fiber-index-writer") as pool:
            inflight: Future | None = None
            try:
                for m in todo:
                    w = writers[m] = ModeIndexWriter(src, m, chunk_nnz)
                    for keys, rows, values in _mode_runs(parts, m, max_entries, buffers):
                        if inflight is not None:
                            with clock("writer (waited)"):
                                inflight.result()
                        inflight = pool.submit(timed, "encode and write", w.append, keys, rows, values)
                        counts[m] += 1
                        if bar is not None:
                            bar.update(keys.shape[0])
                        del keys, rows, values
                    if inflight is not None:
                        with clock("writer (waited)"):
                            inflight.result()
                    inflight = finished[m] = pool.submit(timed, "filter and tables", w.finish)
                out = {m: (writers[m], finished[m].result()) for m in todo}
            finally:
                if inflight is not None:
                    wait([inflight])  # the writer thread idle before anything is removed
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    for m, (_, meta) in out.items():
        log.info(
            "fiber index of mode %d: %s nonzeros, %d chunks, %.2f bytes a nonzero, %d sorted run(s) in %.1f s",
            m,
            f"{src.nnz:,}",
            meta["nchunks"],
            meta["bytes"] / max(1, src.nnz),
            counts[m],
            meta["build_seconds"],
        )
    return out
