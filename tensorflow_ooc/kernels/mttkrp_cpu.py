"""CPU MTTKRP kernels on BLCO work items (seed 001 chapter 5, ALTO's CPU scheme).

A *work item* is a contiguous range of the ALTO order inside one block. Threads take whole items.
For target mode ``n`` every item either

- accumulates into a **private** buffer over its own row interval ``[lo_n, hi_n]`` of mode ``n``
  (no synchronisation), merged afterwards by a row-tiled pass that owns each output row once; or
- adds straight into the output with **atomic** float adds.

In both cases consecutive nonzeros with the same target row are summed in a register-like local
vector and written once per run (segment), as in BLCO's register-based resolution.

Inputs are trusted: indices must decode inside the factor matrices (validated by the store).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .atomics import atomic_add


@nb.njit(inline="always")
def _flush(acc, R, row, private, priv_off, lo, priv_buf, out_flat):
    if private:
        base = priv_off + (row - lo) * R
        for r in range(R):
            priv_buf[base + r] += acc[r]
    else:
        base = row * R
        for r in range(R):
            atomic_add(out_flat, base + r, acc[r])


@nb.njit(inline="always")
def _items_body(index, values, item_start, item_end, item_base, item_lo, shift, mask, factors, mode, R,
                private, priv_off, priv_size, priv_buf, out_flat):
    nmodes = shift.shape[0]
    nitems = item_start.shape[0]
    dtype = priv_buf.dtype
    for k in nb.prange(nitems):
        is_private = private[k]
        off = priv_off[k]
        lo = item_lo[k, mode]
        if is_private:
            for j in range(off, off + priv_size[k]):
                priv_buf[j] = 0
        coord = np.empty(nmodes, dtype=np.int64)
        row = np.empty(R, dtype=dtype)
        acc = np.zeros(R, dtype=dtype)
        current = -1
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            for m in range(nmodes):
                coord[m] = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
            v = values[i]
            for r in range(R):
                row[r] = v
            for m in range(nmodes):
                if m != mode:
                    A = factors[m]
                    c = coord[m]
                    for r in range(R):
                        row[r] *= A[c, r]
            target = coord[mode]
            if target == current:
                for r in range(R):
                    acc[r] += row[r]
            else:
                if current >= 0:
                    _flush(acc, R, current, is_private, off, lo, priv_buf, out_flat)
                current = target
                for r in range(R):
                    acc[r] = row[r]
        if current >= 0:
            _flush(acc, R, current, is_private, off, lo, priv_buf, out_flat)


@nb.njit(parallel=True, nogil=True, cache=True)
def mttkrp_items_fixed(index, values, item_start, item_end, item_base, item_lo, shift, mask, factors, mode, R,
                       private, priv_off, priv_size, priv_buf, out_flat):
    """Rank-specialized kernel: ``R`` is compiled in as a constant (8, 16, 32, 64)."""
    nb.literally(R)
    _items_body(index, values, item_start, item_end, item_base, item_lo, shift, mask, factors, mode, R,
                private, priv_off, priv_size, priv_buf, out_flat)


@nb.njit(parallel=True, nogil=True, cache=True)
def mttkrp_items_any(index, values, item_start, item_end, item_base, item_lo, shift, mask, factors, mode, R,
                     private, priv_off, priv_size, priv_buf, out_flat):
    """General-rank kernel.

    Parameters
    ----------
    index : uint64 (nnz,)          re-encoded BLCO indices
    values : float (nnz,)          nonzero values
    item_start, item_end : int64 (K,)   nonzero range of each work item
    item_base : int64 (K, N)       block base coordinates of each item
    item_lo : int64 (K, N)         smallest index per mode inside each item
    shift : int64 (N,), mask : uint64 (N,)   BLCO field layout
    factors : UniTuple of float (I_m, R) C arrays, one per mode (the target mode's is ignored)
    mode : int                      target mode
    R : int                         rank
    private : bool (K,)             item uses a private accumulator (else atomics)
    priv_off, priv_size : int64 (K,)   its slice of ``priv_buf`` (rows * R)
    priv_buf : float (P,)           private accumulators
    out_flat : float (I_mode * R,)  output, row-major, added to (atomic items only)
    """
    _items_body(index, values, item_start, item_end, item_base, item_lo, shift, mask, factors, mode, R,
                private, priv_off, priv_size, priv_buf, out_flat)


@nb.njit(parallel=True, nogil=True, cache=True)
def merge_private(out, private, priv_off, item_lo, item_hi, mode, priv_buf, tile):
    """Add every private accumulator into ``out`` (I, R); each tile of rows is owned by one thread,
    and items are added in a fixed order, so the result does not depend on the thread count."""
    nrows, R = out.shape
    ntiles = (nrows + tile - 1) // tile
    for t in nb.prange(ntiles):
        r0 = t * tile
        r1 = min(nrows, r0 + tile)
        for k in range(private.shape[0]):
            if not private[k]:
                continue
            lo = item_lo[k, mode]
            a = max(lo, r0)
            b = min(item_hi[k, mode] + 1, r1)
            for row in range(a, b):
                base = priv_off[k] + (row - lo) * R
                for r in range(R):
                    out[row, r] += priv_buf[base + r]


@nb.njit(parallel=True, nogil=True, cache=True)
def item_intervals(index, item_start, item_end, item_base, shift, mask, lo, hi):
    """Per work item and mode, the smallest and largest index (one decode pass, done once)."""
    nmodes = shift.shape[0]
    for k in nb.prange(item_start.shape[0]):
        for m in range(nmodes):
            lo[k, m] = np.iinfo(np.int64).max
            hi[k, m] = -1
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            for m in range(nmodes):
                c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                if c < lo[k, m]:
                    lo[k, m] = c
                if c > hi[k, m]:
                    hi[k, m] = c
