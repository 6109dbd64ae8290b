"""Partitions of a store: contiguous chunk ranges, the unit of work of the MTTKRP task graph."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.mttkrp.plan import WorkItems, items_starting_in
from ..store import Store


@dataclass(frozen=True)
class Partition:
    """Chunks ``[chunk_lo, chunk_hi)`` of a store and the rows they touch in every mode."""

    id: int
    chunk_lo: int
    chunk_hi: int
    nnz: int
    row_lo: tuple[int, ...]
    row_hi: tuple[int, ...]  # inclusive
    # with a nonzero range (global positions): only the work items that start in it, for a
    # balance finer than whole chunks (owner-computes runs; in-memory execution only)
    nz_lo: int | None = None
    nz_hi: int | None = None

    def own_items(self, items: WorkItems, first_chunk: int, chunk_nnz: int) -> WorkItems:
        """The work items of a batch read from chunk ``first_chunk`` on that belong to this
        partition: those that start in its nonzero range (all of them without one)."""
        if self.nz_lo is None:
            return items
        first = first_chunk * chunk_nnz  # batch positions count from the batch's first chunk
        return items_starting_in(items, self.nz_lo - first, self.nz_hi - first)

    def decoded_bytes(self, nmodes: int) -> int:
        """Memory of the decoded partition: index + value, plus work-item metadata."""
        return self.nnz * 16 + (self.nnz // 65536 + 1) * (5 * nmodes + 2) * 8


def plan_partitions(store: Store, n_parts: int, max_nnz: int | None = None) -> list[Partition]:
    """Cut the store's chunks into about ``n_parts`` contiguous, equally sized partitions.

    ``max_nnz`` caps a partition's nonzeros (more partitions are made if needed), so one task's
    memory stays bounded whatever the store size.
    """
    nchunks = store.nchunks
    if nchunks == 0:
        return []
    if max_nnz:
        n_parts = max(n_parts, -(-store.nnz // max(max_nnz, store.chunk_nnz)))
    n_parts = max(1, min(n_parts, nchunks))
    cuts = np.unique((np.arange(n_parts + 1) * nchunks) // n_parts)
    mins, maxs = store.chunk_ranges
    parts = []
    for i, (a, b) in enumerate(zip(cuts[:-1].tolist(), cuts[1:].tolist())):
        nnz = min(store.nnz, b * store.chunk_nnz) - a * store.chunk_nnz
        parts.append(
            Partition(
                i,
                a,
                b,
                int(nnz),
                tuple(int(x) for x in mins[a:b].min(axis=0)),
                tuple(int(x) for x in maxs[a:b].max(axis=0)),
            )
        )
    return parts


def split_nonzeros(store: Store, n_parts: int) -> list[Partition]:
    """Cut the store's nonzeros into ``n_parts`` ranges of equal size (at work-item granularity
    when loaded: an item belongs to the range its first nonzero lies in), each with the chunks that
    hold it. Whole chunks balance poorly when a worker's share is a few chunks: the uber-shaped
    store's 4 chunks of 2^20 split 2.10 M / 1.21 M nonzeros over 2 workers (MTTKRP 20 against
    10 ms a mode)."""
    nnz, cn = store.nnz, store.chunk_nnz
    if nnz == 0:
        return []
    n_parts = max(1, min(n_parts, nnz))
    mins, maxs = store.chunk_ranges
    parts = []
    for i in range(n_parts):
        a, b = nnz * i // n_parts, nnz * (i + 1) // n_parts
        c0, c1 = a // cn, -(-b // cn)
        parts.append(
            Partition(
                i,
                c0,
                c1,
                b - a,
                tuple(int(x) for x in mins[c0:c1].min(axis=0)),
                tuple(int(x) for x in maxs[c0:c1].max(axis=0)),
                a,
                b,
            )
        )
    return parts


def contiguous_runs(parts: list[Partition], workers: int) -> list[list[Partition]]:
    """``parts`` shared out to ``workers`` in contiguous runs balanced by nonzeros: each cut where
    the running count comes nearest to its share (owner-computes keeps its partitions so)."""
    ends = np.concatenate([[0], np.cumsum([p.nnz for p in parts])])
    cuts = [int(np.abs(ends - ends[-1] * k / workers).argmin()) for k in range(workers + 1)]
    return [parts[cuts[k] : cuts[k + 1]] for k in range(workers)]


def owner_rows(runs: list[list[Partition]], shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Per mode, the most rows the partitions of one run can touch (the span of their row ranges),
    and about how many of a worker's rows other workers touch too: the runs' ranges' overlap,
    shared out (none where they are disjoint, as in a mode the ALTO order splits by its top bits;
    a 1/W share of the mode where every run spans it), at most a 1/W share."""
    W = max(1, len(runs))
    touched, shared = [0] * len(shape), [0] * len(shape)
    for n, rows in enumerate(shape):
        spans = [max(p.row_hi[n] for p in run) - min(p.row_lo[n] for p in run) + 1 for run in runs if run]
        touched[n] = max(spans, default=0)
        shared[n] = min(-(-rows // W), -(-max(0, sum(spans) - rows) // W))
    return touched, shared
