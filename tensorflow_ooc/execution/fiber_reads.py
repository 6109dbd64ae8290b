"""Sampled MTTKRP through a store's fiber index: a round reads only the index chunks that hold the
sampled fibers, not every nonzero (seed 000, section 3.3.3: the sketched solve needs only them).

Each task takes one share of the distinct sample keys (a range of keys, so every fiber lies in
one share), finds the chunks of their fibers in the index's chunk table, reads those, and adds
each sample's fiber into its rows in sample order, as the in-memory index does
(:func:`~tensorflow_ooc.kernels.sampling.fiber_gather.index_gather`): one share gives the sums of
one in-memory partition exactly.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..format.fiber_keys import distinct_sorted, sample_keys
from ..kernels.mttkrp.dispatch import numba_threads
from ..kernels.sampling.fiber_gather import FENCE, FiberIndex, assign_row_slots, index_gather
from ..store.scratch import ScratchBuffers
from .partials import SPARSE_ROWS, Partial
from .tasks import cached_store


def share_keys(keys: np.ndarray, share: tuple[int, int]) -> np.ndarray:
    """The positions of the samples whose key falls in share ``k`` of ``K``: the distinct keys cut
    into ``K`` runs of about equal count, so all samples of one key (one fiber) go to one share."""
    k, K = share
    if K <= 1:
        return np.arange(keys.shape[0])
    distinct = distinct_sorted(keys)
    cuts = distinct[(np.arange(1, K) * distinct.shape[0]) // K] if distinct.shape[0] else distinct[:0]
    lo = np.uint64(0) if k == 0 else cuts[k - 1]
    keep = keys >= lo
    if k < K - 1:
        keep &= keys < cuts[k]
    return np.flatnonzero(keep)


def indexed_sampled_partial(
    path: str, samples: Any, mode: int, threads: int = 1, share: tuple[int, int] = (0, 1)
) -> Partial:
    """Mode-``mode`` sampled MTTKRP of the ``samples`` (a
    :class:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet`) in share ``share`` (k of K)
    of their keys, from the fiber index of the store at ``path``. Its ``reads`` say what the
    round read: nonzeros matched (``nnz``), entries and bytes read, chunks, fibers with nonzeros.

    The chunks are read in groups of at most :data:`GATHER_BYTES` of entries (each group the
    samples of one range of keys, so every fiber lies in one group): one group gives the sums of
    one in-memory partition exactly; more add each group's sums in turn. The sums are kept for the
    rows the matches hit only (:class:`HitRows`) while those are at most a
    :data:`~tensorflow_ooc.execution.partials.SPARSE_ROWS`-th of the mode's."""
    t0 = time.perf_counter()
    store = cached_store(path)
    idx = store.fibers.mode(mode) if store.fibers is not None else None
    if idx is None:
        raise ValueError(f"{path}: mode {mode} has no fiber index")
    keys = sample_keys(samples.coords, store.shape, mode)
    mine = share_keys(keys, share)
    skeys = keys[mine]
    # only fibers the Bloom filter may hold are looked up: the others hold no nonzero for certain
    with numba_threads(threads):
        held, filter_bytes = idx.may_hold(skeys)
    groups = _key_groups(idx, distinct_sorted(skeys[held]))
    reads = {
        "path": "index",
        "nnz": 0,
        "nnz_read": 0,
        "bytes_read": filter_bytes,  # the filter blocks read, and below the chunks
        "filter_bytes": filter_bytes,
        "chunks_read": 0,
        "fibers": 0,
    }
    # matches hit at most one row a chunk entry read
    entries = sum(int(g[2].shape[0]) for g in groups) * idx.chunk_nnz
    acc = HitRows(store.shape[mode], entries, samples.ncols, samples.dtype)
    scratch = ScratchBuffers()  # the groups' reads reuse one set of buffers
    for lo_key, hi_key, chunks in groups:
        keep = held & (skeys >= lo_key) & (skeys <= hi_key) if len(groups) > 1 else held
        sel = np.flatnonzero(keep)
        _gather_group(idx, samples, mine[sel], skeys[sel], chunks, threads, reads, acc, scratch)
    lo, out, hit = acc.result()
    return Partial(lo, out, time.perf_counter() - t0, reads, index=hit)


#: entries of index chunks a gather holds at once (about 20 bytes each: key, row, value)
GATHER_ENTRIES = 1 << 22
GATHER_BYTES = GATHER_ENTRIES * 24


class HitRows:
    """The sums of one gather, over the rows its matches hit only, in slots given in order of
    first hit (:func:`~tensorflow_ooc.kernels.sampling.fiber_gather.assign_row_slots`) across its
    groups: a gather of several groups over a 4.8 M-row mode formed, updated and reduced every
    row. Past ``nrows / SPARSE_ROWS`` rows hit, the sums move to rows of the whole mode (at most a
    quarter more than those, as the memory plan counts a gather's output).

    Parameters
    ----------
    nrows : int
        The mode's rows.
    bound : int
        Rows the matches may hit at most (the entries read).
    ncols, dtype
        The sums' columns and dtype.
    """

    def __init__(self, nrows: int, bound: int, ncols: int, dtype: Any) -> None:
        self.nrows = int(nrows)
        cap = min(self.nrows // SPARSE_ROWS, int(bound))
        self.slot_of = np.full(self.nrows, -1, dtype=np.int32 if cap < 2**31 else np.int64)
        self.hit = np.empty(cap, dtype=np.int64)
        self.sums = np.zeros((cap, ncols), dtype=dtype)
        self.dense: np.ndarray | None = None  # the whole mode's rows, once too many are hit
        self.n = 0

    def slots(
        self, rows: np.ndarray, first: np.ndarray, offsets: np.ndarray, scratch: ScratchBuffers | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Where the matches of one group's runs add: (the output, each entry's row of it), or
        (the whole mode's rows, None: entries add at their own row)."""
        if self.dense is None:
            n = rows.shape[0]
            local = np.empty(n, dtype=np.int64) if scratch is None else scratch.take("slot", n, np.int64)
            n, fits = assign_row_slots(rows, first, offsets, self.slot_of, self.hit, self.n, local)
            if fits:
                self.n = n
                return self.sums[:n], local
            # too many rows hit: what the groups before summed moves to the whole mode's rows
            self.dense = np.zeros((self.nrows, self.sums.shape[1]), dtype=self.sums.dtype)
            self.dense[self.hit[:n]] = self.sums[:n]
            self.sums = self.hit = self.slot_of = None
        return self.dense, None

    def result(self) -> tuple[int, np.ndarray, np.ndarray | None]:
        """(lo, rows, index) of the gather's :class:`Partial`: its hit rows, sorted, with their row
        numbers, or the whole mode's rows (index None)."""
        if self.dense is not None:
            return 0, self.dense, None
        order = np.argsort(self.hit[: self.n], kind="stable")
        return 0, self.sums[order], self.hit[order]


def _key_groups(idx: Any, keys: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """The sorted distinct ``keys`` cut into ranges whose chunks hold at most
    :data:`GATHER_ENTRIES` entries: (first key, last key, their chunks) each."""
    if keys.shape[0] == 0:
        return []
    chunks = idx.chunks_of(keys)
    if chunks.shape[0] * idx.chunk_nnz <= GATHER_ENTRIES:
        return [(int(keys[0]), int(keys[-1]), chunks)]
    per = max(1, GATHER_ENTRIES // idx.chunk_nnz)
    # each key's first and last chunk as positions among the chunks needed; a group ends where
    # the chunks it needs (not the span of chunk ids they lie in) reach the budget
    first = np.maximum(np.searchsorted(idx.first, keys, side="left") - 1, 0)
    last = np.maximum(np.searchsorted(idx.first, keys, side="right") - 1, 0)
    at_first, at_last = np.searchsorted(chunks, first), np.searchsorted(chunks, last)
    out, start = [], 0
    while start < keys.shape[0]:
        stop = max(int(np.searchsorted(at_last, at_first[start] + per, side="left")), start + 1)
        # keys sorted: their chunk spans are too, so the group's chunks are one slice of those needed
        out.append((int(keys[start]), int(keys[stop - 1]), chunks[at_first[start] : at_last[stop - 1] + 1]))
        start = stop
    return out


def _gather_group(
    idx: Any,
    samples: Any,
    mine: np.ndarray,
    skeys: np.ndarray,
    chunks: np.ndarray,
    threads: int,
    reads: dict,
    acc: HitRows,
    scratch: ScratchBuffers,
) -> None:
    """One group's sampled rows from its chunks, added into ``acc``; ``reads`` counts what it read."""
    with numba_threads(threads):  # the chunks decode on the task's threads
        got = idx.read(chunks, scratch)
    fence = np.ascontiguousarray(got.keys[::FENCE]) if got.keys.shape[0] >= FENCE else None
    index = FiberIndex(idx.mode, got.keys, got.rows, got.values, fence)
    runs = index.ranges(skeys)
    offsets, first = runs
    if offsets[-1]:
        out, local = acc.slots(index.rows, first, offsets, scratch)

        def rows_of(used: np.ndarray) -> np.ndarray:
            return samples.weighted_rows(mine[used])

        with numba_threads(threads):
            index_gather(index, skeys, rows_of, out, 0, runs, out_rows=local)
    reads["nnz"] += int(offsets[-1])
    reads["nnz_read"] += int(got.keys.shape[0])
    reads["bytes_read"] += int(got.bytes_read)
    reads["chunks_read"] += int(got.chunks_read)
    reads["fibers"] += int(np.count_nonzero(offsets[1:] > offsets[:-1]))
