"""Functions that run on Dask workers: load a partition, MTTKRP a partition, combine partials.

A partial covers only the target-mode rows its partition touches (known from the store's
per-chunk ranges), so partials stay small for long modes and the reduction moves little data.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..format import BitLayout
from ..kernels import StackedFactors, WorkItems, run_items, work_items
from ..kernels.mttkrp import chunk_items, numba_threads
from ..store import Chunk, Store, open_store
from .partitions import Partition

_STORES: dict[str, Store] = {}
_STORES_LOCK = threading.Lock()


def cached_store(path: str) -> Store:
    """The store at ``path``, opened (and validated) once per worker process."""
    with _STORES_LOCK:
        s = _STORES.get(path)
        if s is None:
            s = _STORES[path] = open_store(path)
        return s


@dataclass
class PartitionData:
    """A decoded partition kept in worker memory (in-memory mode)."""

    part: Partition
    layout: BitLayout
    items: WorkItems

    @property
    def nbytes(self) -> int:
        return int(self.items.index.nbytes + self.items.values.nbytes)


@dataclass
class Partial:
    """Rows ``lo .. lo + len(rows) - 1`` of a mode's MTTKRP."""

    lo: int
    rows: np.ndarray


def _chunks(store: Store, part: Partition, read_ahead: bool = True) -> Iterator[Chunk]:
    """The partition's chunks; with ``read_ahead`` the next chunk is read and decompressed in a
    background thread while the caller computes on the current one."""
    ids = range(part.chunk_lo, part.chunk_hi)
    if not read_ahead or len(ids) < 2:
        for c in ids:
            yield store.read_chunk(c)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfooc-read-ahead") as pool:
        pending = pool.submit(store.read_chunk, ids[0])
        for c in ids[1:]:
            chunk = pending.result()
            pending = pool.submit(store.read_chunk, c)
            yield chunk
        yield pending.result()


def load_partition(path: str, part: Partition) -> PartitionData:
    """Read and decode a partition's chunks into one set of work items (kept on the worker)."""
    store = cached_store(path)
    index_parts, value_parts, starts, ends, bases = [], [], [], [], []
    pos = 0
    for ch in _chunks(store, part):
        n = ch.index.shape[0]
        index_parts.append(ch.index)
        value_parts.append(ch.values)
        starts.append(ch.segments[:, 1] + pos)
        ends.append(ch.segments[:, 2] + pos)
        bases.append(ch.bases)
        pos += n
    index = np.concatenate(index_parts)
    values = np.concatenate(value_parts)
    items = work_items(index, values, np.concatenate(starts), np.concatenate(ends), np.concatenate(bases),
                       store.layout)
    return PartitionData(part, store.layout, items)


def mttkrp_partition(source: PartitionData | tuple[str, Partition], factors: StackedFactors, mode: int,
                     threads: int = 1, read_ahead: bool = True) -> Partial:
    """Mode-``mode`` MTTKRP of one partition, from decoded data (in-memory mode) or by streaming
    its chunks from the store (streaming mode)."""
    if isinstance(source, PartitionData):
        part, layout, chunks = source.part, source.layout, None
    else:
        path, part = source
        store = cached_store(path)
        layout, chunks = store.layout, _chunks(store, part, read_ahead)
    lo, hi = part.row_lo[mode], part.row_hi[mode]
    out = np.zeros((hi - lo + 1, factors.rank), dtype=factors.dtype)
    with numba_threads(threads):
        if chunks is None:
            run_items(source.items, layout, factors, mode, out, out_lo=lo)
        else:
            for ch in chunks:
                run_items(chunk_items(ch, layout), layout, factors, mode, out, out_lo=lo)
    return Partial(lo, out)


def combine(*partials: Partial) -> Partial:
    """Sum partials into one covering the union of their row ranges."""
    lo = min(p.lo for p in partials)
    hi = max(p.lo + p.rows.shape[0] for p in partials)
    out = np.zeros((hi - lo, partials[0].rows.shape[1]), dtype=partials[0].rows.dtype)
    for p in partials:
        out[p.lo - lo:p.lo - lo + p.rows.shape[0]] += p.rows
    return Partial(lo, out)
