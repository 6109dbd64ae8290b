"""Streaming from a store's mode-sorted copies, read instead of its ALTO-ordered chunks.

A streamed mode's MTTKRP over ALTO-ordered chunks loads, adds and stores its target row for
nearly every nonzero (runs of 1.0-1.5); in memory the kernel runs over mode-sorted copies with run
tables instead (docs/KERNELS.md). A store may keep those copies (:mod:`tensorflow_ooc.store.mode_copies`,
written by :mod:`.mode_copies_build`, uncompressed so nothing is decoded when they are read).
:func:`sorted_batches` maps a mode's sorted chunks and hands each out as mode-sorted work items
with its run table, which the run-table kernel of the in-memory path consumes as it is. A chunk's
items and run table are computed and validated against the store's chunk range table the first
time a process maps its bytes, then cached under its checksums (as the ALTO chunks' profiles are).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

import numba as nb
import numpy as np

from ..kernels import WorkItems, work_items
from ..kernels.mttkrp.dispatch import ThreadOutputs
from ..kernels.mttkrp.mode_order import run_table
from ..store import Store
from ..store.mode_copies import ModeCopy, SortedChunk


@dataclass
class SortedProfile:
    """Work items and run table of one sorted chunk, positions relative to its first nonzero."""

    start: np.ndarray
    end: np.ndarray
    base: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    changes: np.ndarray
    runs: tuple | None


_PROFILES: dict[tuple[str, int, int], tuple[tuple[int, int], SortedProfile]] = {}
_PROFILES_LOCK = threading.Lock()
MAX_PROFILES = 1 << 17
#: a streamed mode reads its sorted copy where the copy's runs average at least this many
#: nonzeros: lower than the in-memory copies' bar (SORTED_RUN_MIN), because the ALTO-ordered
#: chunks a stream falls back to get per-thread outputs only for long modes (nips R8/R16, runs
#: of 4-64: 74-77 % of in-memory from the copies, 47-49 % from the chunks; docs/KERNELS.md)
STREAMED_RUN_MIN = 4.0


def copy_for(store: Store, mode: int) -> ModeCopy | None:
    """The store's mode-sorted copy of ``mode`` where it keeps one whose runs pay (average at
    least ``STREAMED_RUN_MIN`` nonzeros), else None (the ALTO-ordered chunks are streamed)."""
    copies = store.mode_copies
    if copies is None or mode not in copies.modes:
        return None
    if copies.describe()[str(mode)]["mean_run"] < STREAMED_RUN_MIN:
        return None
    return copies.mode(mode)


def streamed_copy_modes(store: Store) -> list[int]:
    """The modes whose streamed MTTKRP reads the store's mode-sorted copy (:func:`copy_for`)."""
    return [m for m in range(store.nmodes) if copy_for(store, m) is not None]


def _profile(store: Store, copy: ModeCopy, chunk: SortedChunk) -> SortedProfile:
    key = (str(store.meta["store_id"]), copy.mode, chunk.id)
    with _PROFILES_LOCK:
        hit = _PROFILES.get(key)
    if hit is not None and hit[0] == chunk.checksum:
        return hit[1]
    seg, bases = store.chunk_segments(chunk.id)
    layout = store.layout
    items = work_items(chunk.index, chunk.values, seg[:, 1], seg[:, 2], bases, layout, store.mode_copies.item_nnz)
    # what the kernels index with is checked once per version of the bytes: every item's rows
    # inside the chunk's recorded range, which lies inside the shape
    cmin, cmax = (items.lo.min(axis=0), items.hi.max(axis=0)) if items.nitems else (chunk.min, chunk.max)
    store.check_chunk_range(chunk.id, cmin, cmax)
    items.sorted_mode = copy.mode
    prof = SortedProfile(
        items.start, items.end, items.base, items.lo, items.hi, items.changes, run_table(items, layout, copy.mode)
    )
    with _PROFILES_LOCK:
        if len(_PROFILES) >= MAX_PROFILES:
            _PROFILES.clear()
        _PROFILES[key] = (chunk.checksum, prof)
    return prof


def sorted_batches(
    store: Store, copy: ModeCopy, chunk_lo: int, chunk_hi: int, keep_nnz: int = 0
) -> Iterator[WorkItems]:
    """Mode-sorted work items of chunks ``[chunk_lo, chunk_hi)`` of ``copy``, one batch a chunk,
    mapped where they lie (mappings of up to ``keep_nnz`` nonzeros kept for later passes)."""
    for c in range(chunk_lo, chunk_hi):
        chunk = copy.chunk(c, keep_nnz)
        p = _profile(store, copy, chunk)
        yield WorkItems(
            chunk.index, chunk.values, p.start, p.end, p.base, p.lo, p.hi, p.changes, sorted_mode=copy.mode, runs=p.runs
        )


def sorted_threads_fit(out_nbytes: int, max_bytes: int, lent: bool = False) -> bool:
    """Whether a pass over sorted chunks into an output of ``out_nbytes`` takes per-thread
    outputs: their copies (one fewer with a ``lent`` scratch) fit ``max_bytes``. The run-table
    kernel (``table_threads``) then adds each run once into its thread's output, and no item
    zeroes and merges private rows (in-memory copies choose per tensor,
    :meth:`ThreadOutputs.for_sorted`; a streamed chunk's items are not known before the pass)."""
    return ThreadOutputs.extra_copies(nb.get_num_threads(), lent) * out_nbytes <= max_bytes


def sorted_thread_outputs(out: np.ndarray, max_bytes: int, scratch: np.ndarray | None = None) -> ThreadOutputs | None:
    """:class:`ThreadOutputs` for a pass over sorted chunks into ``out`` where they fit
    (:func:`sorted_threads_fit`), else None."""
    if sorted_threads_fit(out.nbytes, max_bytes, scratch is not None):
        return ThreadOutputs(out, nb.get_num_threads(), scratch)
    return None
