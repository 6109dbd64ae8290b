"""ALTO-ordered work items with 32-bit indices: each nonzero's offsets from its item's smallest
index in every mode, packed into one uint32 word.

At small ranks a pass over in-memory items is bound by the nonzero stream more than by the
arithmetic: an 8-byte index and an 8-byte value per nonzero and mode. Within a work item ALTO's
order keeps every mode's indices in a small interval, so each nonzero's offsets from the item's
smallest indices fit far fewer bits than the tensor's index. Items are cut (greedily, in ALTO
order) where the offsets' widths would sum past 32 bits, and each piece keeps its smallest index
and a ``pext`` mask per mode: 12 bytes a nonzero with the value instead of 16. The values are the
items' own array (the pieces cut its positions, they do not reorder them), so the packed form
costs 4 bytes a nonzero beside the items.

The kernel (``packed_threads`` in :mod:`.cpu`) is the per-thread-output kernel over these words;
results equal the ALTO-ordered items' to rounding (the same sums per thread, in the same order
when the thread shares fall on the same nonzeros). Measurements: docs/KERNELS.md, "32-bit packed
items".
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from ...format import BitLayout
from ..factors import StackedFactors
from .cpu import PREFETCH_MIN_BYTES, SPECIALIZED_RANKS, kernel_for
from .plan import WorkItems, balanced_bounds

PACKED_BITS = 32
# the fixed ranks that read packed items: in CP-ALS sweeps gen-skewed's ALTO-ordered modes ran 10 %
# faster at R8 and R16 and the same at R32 (docs/KERNELS.md), where 12 against 16 bytes is a
# smaller share of a nonzero's work; no kernel is compiled for ranks it would not help
PACKED_RANKS = tuple(r for r in SPECIALIZED_RANKS if r <= 16)


@dataclass
class PackedItems:
    """Pieces of ALTO-ordered work items whose offsets fit :data:`PACKED_BITS` bits."""

    index: np.ndarray  # uint32 (nnz,): each nonzero's offsets from its piece's ``lo``, packed
    values: np.ndarray  # (nnz,), the items' values (shared, same positions)
    start: np.ndarray  # int64 (P,) first nonzero of each piece
    end: np.ndarray  # int64 (P,)
    lo: np.ndarray  # int64 (P, N): each piece's smallest index per mode (absolute)
    masks: np.ndarray  # uint64 (P, N): each mode's ``pext`` mask in the piece's words

    @property
    def nbytes(self) -> int:
        """Bytes beyond the items' (the values are theirs)."""
        return int(self.index.nbytes + self.start.nbytes + self.end.nbytes + self.lo.nbytes + self.masks.nbytes)


@nb.njit(nogil=True, cache=True)
def _bit_width(x: int) -> int:
    """Bits needed for the offsets 0 .. x."""
    b = 0
    while x > 0:
        x >>= 1
        b += 1
    return b


@nb.njit(nogil=True, cache=True)
def _piece_end(index, i, end, shift, mask, limit, lo, hi):
    """The end of the longest piece from nonzero ``i`` (at most ``end``) whose in-block offsets
    fit ``limit`` bits in all; ``lo`` / ``hi`` get the piece's smallest and largest in-block index
    per mode. A piece holds at least one nonzero."""
    nmodes = shift.shape[0]
    for m in range(nmodes):
        c = np.int64((index[i] >> np.uint64(shift[m])) & np.uint64(mask[m]))
        lo[m] = c
        hi[m] = c
    j = i + 1
    while j < end:
        x = index[j]
        bits = 0
        for m in range(nmodes):
            c = np.int64((x >> np.uint64(shift[m])) & np.uint64(mask[m]))
            bits += _bit_width(max(hi[m], c) - min(lo[m], c))
        if bits > limit:
            break
        for m in range(nmodes):
            c = np.int64((x >> np.uint64(shift[m])) & np.uint64(mask[m]))
            lo[m] = min(lo[m], c)
            hi[m] = max(hi[m], c)
        j += 1
    return j


@nb.njit(parallel=True, nogil=True, cache=True)
def _count_pieces(index, item_start, item_end, shift, mask, limit, counts):
    """counts[k]: the pieces item k is cut into."""
    nmodes = shift.shape[0]
    for k in nb.prange(item_start.shape[0]):
        lo = np.empty(nmodes, dtype=np.int64)
        hi = np.empty(nmodes, dtype=np.int64)
        n = 0
        i = item_start[k]
        while i < item_end[k]:
            i = _piece_end(index, i, item_end[k], shift, mask, limit, lo, hi)
            n += 1
        counts[k] = n


@nb.njit(parallel=True, nogil=True, cache=True)
def _pack_pieces(index, item_start, item_end, item_base, shift, mask, limit, first, words, start, end, lo, masks):
    """Cut item k into pieces ``first[k] ..`` (as :func:`_count_pieces` counted them) and write
    each piece's bounds, smallest indices, masks and packed words (mode 0 in the low bits)."""
    nmodes = shift.shape[0]
    for k in nb.prange(item_start.shape[0]):
        plo = np.empty(nmodes, dtype=np.int64)
        phi = np.empty(nmodes, dtype=np.int64)
        sh = np.empty(nmodes, dtype=np.uint64)
        p = first[k]
        i = item_start[k]
        while i < item_end[k]:
            j = _piece_end(index, i, item_end[k], shift, mask, limit, plo, phi)
            start[p] = i
            end[p] = j
            at = np.uint64(0)
            for m in range(nmodes):
                lo[p, m] = item_base[k, m] + plo[m]
                w = _bit_width(phi[m] - plo[m])
                sh[m] = at
                masks[p, m] = ((np.uint64(1) << np.uint64(w)) - np.uint64(1)) << at
                at += np.uint64(w)
            for q in range(i, j):
                x = index[q]
                word = np.uint64(0)
                for m in range(nmodes):
                    c = np.int64((x >> np.uint64(shift[m])) & np.uint64(mask[m])) - plo[m]
                    word |= np.uint64(c) << sh[m]
                words[q] = np.uint32(word)
            p += 1
            i = j


def pack_items(items: WorkItems, layout: BitLayout) -> PackedItems:
    """The 32-bit packed form of ALTO-ordered, re-encoded ``items`` (not Delta-coded or
    mode-sorted ones: the pieces must keep the items' order and decoded fields)."""
    if items.delta or items.sorted_mode >= 0:
        raise ValueError("packed items are made from ALTO-ordered, re-encoded work items")
    shift = np.ascontiguousarray(layout.field_shift, dtype=np.int64)
    mask = np.ascontiguousarray(layout.field_mask, dtype=np.uint64)
    counts = np.zeros(items.nitems, dtype=np.int64)
    _count_pieces(items.index, items.start, items.end, shift, mask, PACKED_BITS, counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if items.nitems else counts
    P = int(counts.sum())
    N = layout.nmodes
    out = PackedItems(
        np.empty(items.index.shape[0], dtype=np.uint32),
        items.values,
        np.empty(P, dtype=np.int64),
        np.empty(P, dtype=np.int64),
        np.empty((P, N), dtype=np.int64),
        np.empty((P, N), dtype=np.uint64),
    )
    _pack_pieces(
        items.index,
        items.start,
        items.end,
        items.base,
        shift,
        mask,
        PACKED_BITS,
        first,
        out.index,
        out.start,
        out.end,
        out.lo,
        out.masks,
    )
    return out


def packed_rank(rank: int | None) -> bool:
    """Whether a load at ``rank`` (None: not known) should keep packed items: only the kernels of
    :data:`PACKED_RANKS` read them."""
    return rank is None or rank in PACKED_RANKS


def packed_pays(factors: StackedFactors, rank: int) -> bool:
    """Whether a pass with per-thread outputs may run on packed items: a rank of :data:`PACKED_RANKS`,
    and factors without prefetching (the prefetching kernels are for factors far past the caches)."""
    return rank in PACKED_RANKS and factors.data.nbytes <= PREFETCH_MIN_BYTES


def run_packed(
    packed: PackedItems,
    factors: StackedFactors,
    mode: int,
    out: np.ndarray,
    out_lo: int,
    threads: int,
    first: np.ndarray,
    bufs: np.ndarray,
) -> None:
    """Add the mode-``mode`` MTTKRP of ``packed`` into per-thread outputs: thread 0 into ``out``
    (rows ``out_lo ..``), thread 1 into ``first``, thread g into ``bufs[g - 2]`` (as
    :class:`~tensorflow_ooc.kernels.mttkrp.dispatch.ThreadOutputs` hands them out; the caller
    merges), each of ``threads`` a contiguous, nonzero-balanced share of the pieces. Requires
    :func:`packed_pays`."""
    R = out.shape[1]
    nmodes = packed.lo.shape[1]
    P = packed.start.shape[0]
    if P == 0:
        return
    bounds = balanced_bounds(packed.end - packed.start, threads)
    kernel = kernel_for(nmodes, R).packed_threads
    kernel(
        packed.index,
        packed.values,
        packed.start,
        packed.end,
        packed.lo,
        packed.masks,
        factors.data,
        factors.offsets,
        mode,
        bounds,
        out,
        first,
        bufs,
        out_lo,
    )
