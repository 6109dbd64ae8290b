"""CPU MTTKRP kernels on BLCO work items (seed 001 chapter 5, ALTO's CPU scheme).

A *work item* is a contiguous range of the ALTO order inside one block. Threads take whole items.
For target mode ``n`` every item either

- accumulates into a **private** buffer over its own row interval ``[lo_n, hi_n]`` of mode ``n``
  (no synchronisation), merged afterwards by a row-tiled pass that owns each output row once; or
- adds straight into the output with **atomic** float adds.

Consecutive nonzeros with the same target row can be summed in a local vector and written once
per run (BLCO's register-based resolution): always on the atomic path (one atomic per run instead
of per nonzero), and on the private path where the plan found runs long enough to pay for it.

Kernels are built per (number of modes, rank): both are compile-time constants, so the loop over
the other modes unrolls and the rank loop vectorizes into one fused multiply chain per nonzero.
Factor matrices come stacked in one array ``F`` (sum of mode lengths, R) with row offsets ``offs``.
Inputs are trusted: indices must decode inside the factor matrices (the store validates them).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..format.bits import pext
from .atomics import atomic_add
from .prefetch import prefetch_row

# Kernels for factor matrices far larger than the caches prefetch the factor rows of the nonzero
# PREFETCH_DISTANCE ahead. Amazon-shaped (1 GiB of factors, 5 M nonzeros, rank 16, mostly atomic
# items): 2.75 -> 2.59 s for all three modes. Where the factors fit the caches the extra decode
# only costs (nips-shaped: 0.066 -> 0.085 s), so they are chosen above PREFETCH_MIN_BYTES.
PREFETCH_DISTANCE = 16
PREFETCH_MIN_BYTES = 256 << 20

# Ranks compiled with the rank as a constant. For 8 and 16 a constant rank makes LLVM unroll the
# rank loop completely and vectorize it worse than the run-time loop (uber-shaped, mode 2, rank 16:
# 0.036 s constant vs 0.019 s run-time; rank 8: 0.025 vs 0.022), so those ranks take the run-time
# kernel; at 32 and 64 both forms measure the same and the constant form is kept.
SPECIALIZED_RANKS = (32, 64)


@nb.njit(inline="always")
def _flush(acc, R, row, is_private, shift_row, priv_buf, out_flat, out_lo):
    """Write one run's sum: into the private rows, or atomically into the output."""
    if is_private:
        dest = shift_row + row
        for r in range(R):
            priv_buf[dest, r] += acc[r]
    else:
        base = (row - out_lo) * R
        for r in range(R):
            atomic_add(out_flat, base + r, acc[r])


def _build(nmodes: int, rank_const: int, delta: bool = False, prefetch: bool = False):
    """Kernels for ``nmodes`` modes; ``rank_const`` > 0 fixes the rank, 0 takes it at run time.

    ``delta`` kernels read streamed chunks as stored: Delta differences of the low ALTO words,
    summed along each item from ``item_prev`` and split into modes with one BMI2 ``pext`` per mode.
    That spares the reader a re-encoding pass per chunk and mode (about a third of its work).

    Two kernels, each over its own list of items: one adds every nonzero straight into private
    rows, one sums runs first (private or atomic). Keeping the hot loops apart keeps their bodies
    simple; numba loses vectorization when one prange body holds both (5-8x slower here).
    The decode loop is written out in both on purpose: moving it into an inlined helper that
    takes the item's base row as a view measured 5-10x slower.
    """
    NM1 = nmodes - 1
    DELTA = bool(delta)
    PF = PREFETCH_DISTANCE if prefetch else 0

    @nb.njit(parallel=True, nogil=True, cache=True)
    def direct_items(index, values, item_start, item_end, item_base, item_prev, item_lo, shift, mask, F, offs, mode,
                     rank, todo, priv_row, priv_rows, priv_buf):
        """Private items without run accumulation: every nonzero adds into its private row.

        Parameters
        ----------
        index : uint64 (nnz,)              re-encoded BLCO indices; for ``delta`` kernels the Delta
                                           differences of the low ALTO words
        values : float (nnz,)              nonzero values
        item_start, item_end : int64 (K,)  nonzero range of each work item
        item_base : int64 (K, N)           block base coordinates of each item
        item_prev : uint64 (K,)            ``delta`` kernels: the ALTO word before each item's first
                                           nonzero (0 where a chunk starts); ignored otherwise
        item_lo : int64 (K, N)             smallest index per mode inside each item
        shift : int64 (N,), mask : uint64 (N,)   BLCO field layout; ``delta`` kernels take the
                                           per-mode ``pext`` masks of the ALTO word in ``mask``
        F : float (sum_m I_m, R) C array   stacked factor matrices
        offs : int64 (N,)                  first row of each mode's factor in F
        mode : int                         target mode
        rank : int                         R (ignored when compiled for a fixed rank)
        todo : int64 (T,)                  the items to process
        priv_row, priv_rows : int64 (K,)   item k owns rows priv_row[k] .. + priv_rows[k] of priv_buf;
                                           index i of the target mode goes to row priv_row[k] + i - lo
        priv_buf : float (P, R)            private accumulators (zeroed here)

        The rank loop indexes ``[row, r]`` with the row formed once per nonzero, which keeps
        numba's negative-index check out of the vectorized loop; no short-circuit ``and``/``or``
        in the body for the same reason.
        """
        R = rank_const if rank_const > 0 else rank
        for t in nb.prange(todo.shape[0]):
            k = todo[t]
            first = priv_row[k]
            for j in range(first, first + priv_rows[k]):
                for r in range(R):
                    priv_buf[j, r] = 0
            shift_row = first - item_lo[k, mode]
            rows = np.empty(NM1, dtype=np.int64)
            word = item_prev[k]
            end = item_end[k]
            ahead = word
            if DELTA and PF > 0:
                for i in range(item_start[k], min(end, item_start[k] + PF)):
                    ahead += index[i]
            for i in range(item_start[k], end):
                if PF > 0:
                    if i + PF < end:
                        if DELTA:
                            ahead += index[i + PF]
                            xa = ahead
                        else:
                            xa = index[i + PF]
                        for m in range(NM1 + 1):
                            if m != mode:
                                if DELTA:
                                    ca = item_base[k, m] + np.int64(pext(xa, mask[m]))
                                else:
                                    ca = item_base[k, m] + np.int64((xa >> np.uint64(shift[m])) & mask[m])
                                prefetch_row(F, offs[m] + ca)
                if DELTA:
                    word += index[i]
                    x = word
                else:
                    x = index[i]
                target = 0
                j = 0
                for m in range(NM1 + 1):
                    if DELTA:
                        c = item_base[k, m] + np.int64(pext(x, mask[m]))
                    else:
                        c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                    if m == mode:
                        target = c
                    else:
                        rows[j] = offs[m] + c
                        j += 1
                v = values[i]
                dest = shift_row + target
                for r in range(R):
                    p = v
                    for q in range(NM1):
                        p *= F[rows[q], r]
                    priv_buf[dest, r] += p

    @nb.njit(parallel=True, nogil=True, cache=True)
    def run_items(index, values, item_start, item_end, item_base, item_prev, item_lo, shift, mask, F, offs, mode,
                  rank, todo, private, priv_row, priv_rows, priv_buf, out_flat, out_lo):
        """Items that sum runs of one target row in a local vector, then write once per run:
        into private rows (``private[k]``) or with atomic adds into ``out_flat``, the output rows
        ``out_lo ..`` of the target mode, row-major. Other parameters as in ``direct_items``."""
        R = rank_const if rank_const > 0 else rank
        for t in nb.prange(todo.shape[0]):
            k = todo[t]
            is_private = private[k]
            first = priv_row[k]
            for j in range(first, first + priv_rows[k]):
                for r in range(R):
                    priv_buf[j, r] = 0
            shift_row = first - item_lo[k, mode]
            rows = np.empty(NM1, dtype=np.int64)
            acc = np.zeros(R, dtype=F.dtype)
            current = -1
            word = item_prev[k]
            end = item_end[k]
            ahead = word
            if DELTA and PF > 0:
                for i in range(item_start[k], min(end, item_start[k] + PF)):
                    ahead += index[i]
            for i in range(item_start[k], end):
                if PF > 0:
                    if i + PF < end:
                        if DELTA:
                            ahead += index[i + PF]
                            xa = ahead
                        else:
                            xa = index[i + PF]
                        for m in range(NM1 + 1):
                            if m != mode:
                                if DELTA:
                                    ca = item_base[k, m] + np.int64(pext(xa, mask[m]))
                                else:
                                    ca = item_base[k, m] + np.int64((xa >> np.uint64(shift[m])) & mask[m])
                                prefetch_row(F, offs[m] + ca)
                if DELTA:
                    word += index[i]
                    x = word
                else:
                    x = index[i]
                target = 0
                j = 0
                for m in range(NM1 + 1):
                    if DELTA:
                        c = item_base[k, m] + np.int64(pext(x, mask[m]))
                    else:
                        c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                    if m == mode:
                        target = c
                    else:
                        rows[j] = offs[m] + c
                        j += 1
                if target != current:
                    if current >= 0:
                        _flush(acc, R, current, is_private, shift_row, priv_buf, out_flat, out_lo)
                    current = target
                    for r in range(R):
                        acc[r] = 0
                v = values[i]
                for r in range(R):
                    p = v
                    for q in range(NM1):
                        p *= F[rows[q], r]
                    acc[r] += p
            if current >= 0:
                _flush(acc, R, current, is_private, shift_row, priv_buf, out_flat, out_lo)

    return direct_items, run_items


_KERNELS: dict[tuple[int, int, bool, bool], object] = {}


def kernel_for(nmodes: int, rank: int, delta: bool = False, prefetch: bool = False):
    """The compiled kernels for this order, rank and index encoding (constant-rank code for 32 and
    64); ``prefetch`` kernels prefetch factor rows ahead (for factors far larger than the caches)."""
    key = (nmodes, rank if rank in SPECIALIZED_RANKS else 0, bool(delta), bool(prefetch))
    if key not in _KERNELS:
        _KERNELS[key] = _build(*key)
    return _KERNELS[key]


@nb.njit(parallel=True, nogil=True, cache=True)
def merge_private(out, out_lo, private, priv_row, item_lo, item_hi, mode, priv_buf, tile):
    """Add every private accumulator into ``out``, which holds target rows ``out_lo ..``; each
    tile of rows is owned by one thread and items are added in a fixed order, so the result does
    not depend on the thread count."""
    nrows, R = out.shape
    ntiles = (nrows + tile - 1) // tile
    for t in nb.prange(ntiles):
        r0 = out_lo + t * tile
        r1 = min(out_lo + nrows, r0 + tile)
        for k in range(private.shape[0]):
            if not private[k]:
                continue
            lo = item_lo[k, mode]
            a = max(lo, r0)
            b = min(item_hi[k, mode] + 1, r1)
            for row in range(a, b):
                src = priv_row[k] + row - lo
                dst = row - out_lo
                for r in range(R):
                    out[dst, r] += priv_buf[src, r]


@nb.njit(parallel=True, nogil=True, cache=True)
def item_profile(index, item_start, item_end, item_base, shift, mask, lo, hi, changes):
    """Per work item and mode: smallest and largest index, and how often consecutive nonzeros
    change that index (runs = nnz / changes). One decode pass, done once per tensor."""
    nmodes = shift.shape[0]
    for k in nb.prange(item_start.shape[0]):
        prev = np.full(nmodes, -1, dtype=np.int64)
        for m in range(nmodes):
            lo[k, m] = np.iinfo(np.int64).max
            hi[k, m] = -1
            changes[k, m] = 0
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            for m in range(nmodes):
                c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                if c < lo[k, m]:
                    lo[k, m] = c
                if c > hi[k, m]:
                    hi[k, m] = c
                if c != prev[m]:
                    changes[k, m] += 1
                    prev[m] = c
