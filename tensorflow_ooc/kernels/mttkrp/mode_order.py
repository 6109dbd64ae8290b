"""Mode-sorted copies of work items: each item's nonzeros ordered by one mode's index.

In ALTO order consecutive nonzeros rarely share a target row (runs of 1.0-1.5 nonzeros on
uber-, nips- and chicago-shaped tensors), so the direct kernel loads, adds and stores the target
row for every nonzero. That read-modify-write is most of the difference between the kernel and
its arithmetic: on a 2-core Zen 5, uber-shaped R16, summing each item's products in registers
instead (an experiment without the writes) ran 10.3 ms for all modes against 17.2 ms.

Sorting an item's nonzeros by the target mode's index (stably, so each row's nonzeros keep
their ALTO order) makes each target row one run: the runs kernel sums it in registers and adds
it once. The item keeps its nonzeros, so the other modes' rows stay within the item's intervals
and mostly in cache. All-mode in-memory MTTKRP, R16, 2 threads, best of 7, ALTO order against
sorted copies (with per-thread outputs where they move less, ``ThreadOutputs.for_sorted``): uber
15.6 -> 13.9 ms, nips 19.4 -> 15.8 ms, chicago 25.5 -> 18.0 ms (docs/KERNELS.md; the
``benchmarks/bench_mttkrp.py`` table shows both).

The price is memory: one copy of the indices and values per mode that pays, kept beside the
ALTO-ordered items (the streaming path and randomized CP read those). In-memory CP-ALS keeps them
where the worker memory plan has room (:mod:`~tensorflow_ooc.execution.memory_plan`); an
in-memory tensor keeps them while they stay under a share of the free memory.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import psutil

from ...format import BitLayout
from .cpu import item_profile
from .plan import WorkItems

# a copy's run table (24 bytes a run) is made where its runs are at most this share of the
# nonzeros (0.375 bytes a nonzero; the benchmark tensors have 0.0003-0.004 runs a nonzero): the
# table kernel then reads no target index (see kernels/mttkrp/cpu.py, "table_threads")
RUN_TABLE_MAX_FRACTION = 1 / 64
# a mode's sorted copy is kept only where its runs average at least this many nonzeros, those
# that get a run table: shorter runs ran slower than the ALTO-ordered items with per-thread
# outputs (docs/KERNELS.md, "Mode-sorted copies")
SORTED_RUN_MIN = 1 / RUN_TABLE_MAX_FRACTION
RUN_TABLE_BYTES_PER_NNZ = 24 * RUN_TABLE_MAX_FRACTION
# an in-memory tensor's copies may take at most this share of the memory free when they are made
TENSOR_COPIES_MAX_FREE_FRACTION = 0.25
# a mode of at most this many rows, or whose output (rows x rank x 8 bytes) is at most
# ALTO_ORDER_OUTPUT_BYTES, keeps no sorted copy where another mode reads the ALTO-ordered items
# anyway: its thread outputs stay in the cache, and one array a sweep instead of two won
# (gen-skewed's 400-row mode: sweeps 21.0 -> 19.1 ms at R8, 583 -> 521 at R100; gen-o4's 1500-row
# mode 18.1 -> 17.0 at R8, not at R16-R64; docs/KERNELS.md, "Small modes on the ALTO order")
ALTO_ORDER_ROWS_MAX = 1024
ALTO_ORDER_OUTPUT_BYTES = 128 << 10
# the rank assumed where it is not known when the copies are made
ALTO_ORDER_RANK = 16


@nb.njit(parallel=True, nogil=True, cache=True)
def _sort_items(
    index, values, item_start, item_end, item_lo, item_hi, item_base, shift, mask, mode, out_index, out_values, distinct
):
    """Counting sort of each item's nonzeros by their mode-``mode`` index (stable), into
    ``out_index`` / ``out_values`` at the same positions; ``distinct[k]``: rows item k touches."""
    s_ = np.uint64(shift[mode])
    m_ = np.uint64(mask[mode])
    for k in nb.prange(item_start.shape[0]):
        s, e = item_start[k], item_end[k]
        lo = item_lo[k, mode] - item_base[k, mode]
        rows = item_hi[k, mode] - item_lo[k, mode] + 1
        if e <= s or rows <= 0:
            distinct[k] = 0
            continue
        count = np.zeros(rows + 1, dtype=np.int64)
        for i in range(s, e):
            count[np.int64((index[i] >> s_) & m_) - lo + 1] += 1
        d = 0
        for r in range(1, rows + 1):
            if count[r] > 0:
                d += 1
            count[r] += count[r - 1]
        distinct[k] = d
        for i in range(s, e):
            j = s + count[np.int64((index[i] >> s_) & m_) - lo]
            count[np.int64((index[i] >> s_) & m_) - lo] += 1
            out_index[j] = index[i]
            out_values[j] = values[i]


@nb.njit(nogil=True, cache=True)
def _count_runs(index, item_start, item_end, shift, mask, mode):
    """Runs of one target row inside the items of a mode-sorted copy."""
    s_ = np.uint64(shift[mode])
    m_ = np.uint64(mask[mode])
    count = 0
    for k in range(item_start.shape[0]):
        prev = ~np.uint64(0)
        for i in range(item_start[k], item_end[k]):
            f = (index[i] >> s_) & m_
            if f != prev:
                count += 1
                prev = f
    return count


@nb.njit(nogil=True, cache=True)
def _fill_runs(index, item_start, item_end, item_base, shift, mask, mode, ptr, rows, run_item):
    """The run table (:attr:`WorkItems.runs`) of a mode-sorted copy whose items lie back to back."""
    s_ = np.uint64(shift[mode])
    m_ = np.uint64(mask[mode])
    r = 0
    for k in range(item_start.shape[0]):
        prev = ~np.uint64(0)
        for i in range(item_start[k], item_end[k]):
            f = (index[i] >> s_) & m_
            if f != prev:
                ptr[r] = i
                rows[r] = item_base[k, mode] + np.int64(f)
                run_item[r] = k
                r += 1
                prev = f
    ptr[r] = item_end[item_start.shape[0] - 1] if item_start.shape[0] else 0


def run_table(items: WorkItems, layout: BitLayout, mode: int) -> tuple | None:
    """The runs of one target row inside each item of a mode-sorted copy, as
    :attr:`WorkItems.runs`, or None where the items do not lie back to back or the table would
    exceed ``RUN_TABLE_MAX_FRACTION`` of the nonzeros (24 bytes a run)."""
    if items.nitems == 0 or not bool(np.all(items.start[1:] == items.end[:-1])):
        return None
    shift, mask = layout.field_shift, layout.field_mask
    count = _count_runs(items.index, items.start, items.end, shift, mask, mode)
    if count > RUN_TABLE_MAX_FRACTION * int(items.nnz.sum()):
        return None
    ptr = np.empty(count + 1, dtype=np.int64)
    rows = np.empty(count, dtype=np.int64)
    run_item = np.empty(count, dtype=np.int64)
    _fill_runs(items.index, items.start, items.end, items.base, shift, mask, mode, ptr, rows, run_item)
    return ptr, rows, run_item


def mode_sorted(items: WorkItems, layout: BitLayout, mode: int, run_min: float = SORTED_RUN_MIN) -> WorkItems | None:
    """The work items with each item's nonzeros sorted by their mode-``mode`` index, stably, or
    None where the sorted runs would average fewer than ``run_min`` nonzeros (the copy would not
    pay). Items, their intervals and block bases are those of ``items``.

    Parameters
    ----------
    items : WorkItems
        Re-encoded (not Delta) in-memory items.
    layout : BitLayout
        Their bit layout.
    mode : int
        The mode whose index orders each item.
    run_min : float
        The least average run (nonzeros per distinct target row) worth a copy.
    """
    if items.delta:
        raise ValueError("mode-sorted copies are made of re-encoded items, not Delta-encoded chunks")
    if items.nitems == 0:
        return None
    out_index = np.empty_like(items.index)
    out_values = np.empty_like(items.values)
    distinct = np.zeros(items.nitems, dtype=np.int64)
    _sort_items(
        items.index,
        items.values,
        items.start,
        items.end,
        items.lo,
        items.hi,
        items.base,
        layout.field_shift,
        layout.field_mask,
        mode,
        out_index,
        out_values,
        distinct,
    )
    nnz = int(items.nnz.sum())
    if nnz < run_min * max(1, int(distinct.sum())):
        return None
    lo = np.empty_like(items.lo)
    hi = np.empty_like(items.hi)
    changes = np.empty_like(items.changes)
    item_profile(out_index, items.start, items.end, items.base, layout.field_shift, layout.field_mask, lo, hi, changes)
    out = WorkItems(out_index, out_values, items.start, items.end, items.base, lo, hi, changes, sorted_mode=mode)
    out.runs = run_table(out, layout, mode)
    return out


def copies_fit(items: WorkItems, nmodes: int) -> bool:
    """Whether one copy of ``items`` per mode stays under ``TENSOR_COPIES_MAX_FREE_FRACTION`` of
    the memory free now."""
    need = nmodes * (items.index.nbytes + items.values.nbytes + int(items.nnz.sum() * RUN_TABLE_BYTES_PER_NNZ))
    return need <= TENSOR_COPIES_MAX_FREE_FRACTION * psutil.virtual_memory().available


def copy_order(shape: tuple[int, ...], modes: list[int], rank: int | None = None) -> tuple[list[int], list[int]]:
    """``modes`` (those that may get a sorted copy) split into the ones copied first and the small
    ones (at most :data:`ALTO_ORDER_ROWS_MAX` rows, or an output of at most
    :data:`ALTO_ORDER_OUTPUT_BYTES` at ``rank``, else at :data:`ALTO_ORDER_RANK`), copied only where
    every mode of the first list got its copy (else the sweep reads the ALTO-ordered items, and
    they read them too)."""
    row_bytes = 8 * int(rank or ALTO_ORDER_RANK)
    small = [m for m in modes if shape[m] <= ALTO_ORDER_ROWS_MAX or shape[m] * row_bytes <= ALTO_ORDER_OUTPUT_BYTES]
    return [m for m in modes if m not in small], small
