"""Partitions of a store: contiguous chunk ranges, the unit of work of the MTTKRP task graph."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
