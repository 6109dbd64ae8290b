"""Row-owned MTTKRP for work items whose target rows spread too far for private accumulators.

On long modes (millions of rows) most work items span so many target rows that a private
accumulator would cost more than the item, and they fall back to atomic adds: one compare-and-
swap per rank column per nonzero, on an output row that is rarely in cache. That made Amazon-
shaped tensors spend ~360 ns per nonzero and thread in MTTKRP. Here instead (the TILE view of
seed 002, as SPLATT's and ALTO's output-oriented traversals do): the target rows are cut into
tiles and each tile is owned by one thread, which adds into its rows with plain stores.

1. ``owned_count``: per item, how many of its nonzeros fall in each tile (one decode pass).
2. ``owned_scatter``: each nonzero's index word, item and value go to its tile's bucket, items in
   order, so every tile sees its nonzeros in item order and ALTO order within an item.
3. ``owned_compute``: per tile (threads take whole tiles), decode and accumulate into the tile's
   output rows. The summation order depends only on the items, not on the thread count.

Buckets take 20 bytes per nonzero; the caller processes items in groups to bound them.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...format.bits import pext


def _build(nmodes: int, rank_const: int, delta: bool):
    NM1 = nmodes - 1
    DELTA = bool(delta)

    @nb.njit(parallel=True, nogil=True, cache=True)
    def owned_count(
        index, item_start, item_end, item_base, item_prev, shift, mask, mode, todo, out_lo, tile_shift, counts
    ):
        """counts[t, tile] = nonzeros of item todo[t] whose target row is in tile
        (rows out_lo + tile << tile_shift ..)."""
        for t in nb.prange(todo.shape[0]):
            k = todo[t]
            word = item_prev[k]
            for i in range(item_start[k], item_end[k]):
                if DELTA:
                    word += index[i]
                    c = item_base[k, mode] + np.int64(pext(word, mask[mode]))
                else:
                    c = item_base[k, mode] + np.int64((index[i] >> np.uint64(shift[mode])) & mask[mode])
                counts[t, (c - out_lo) >> tile_shift] += 1

    @nb.njit(parallel=True, nogil=True, cache=True)
    def owned_scatter(
        index,
        values,
        item_start,
        item_end,
        item_base,
        item_prev,
        shift,
        mask,
        mode,
        todo,
        out_lo,
        tile_shift,
        starts,
        bx,
        bk,
        bv,
    ):
        """Bucket each nonzero at starts[t, tile] (advanced): its absolute index word, item, value."""
        for t in nb.prange(todo.shape[0]):
            k = todo[t]
            word = item_prev[k]
            for i in range(item_start[k], item_end[k]):
                if DELTA:
                    word += index[i]
                    x = word
                    c = item_base[k, mode] + np.int64(pext(x, mask[mode]))
                else:
                    x = index[i]
                    c = item_base[k, mode] + np.int64((x >> np.uint64(shift[mode])) & mask[mode])
                tile = (c - out_lo) >> tile_shift
                p = starts[t, tile]
                starts[t, tile] = p + 1
                bx[p] = x
                bk[p] = k
                bv[p] = values[i]

    @nb.njit(parallel=True, nogil=True, cache=True)
    def owned_compute(bx, bk, bv, tile_ptr, item_base, shift, mask, F, offs, mode, rank, out, out_lo):
        """Each tile's nonzeros, in bucket order, added into out (rows out_lo ..) without atomics."""
        R = rank_const if rank_const > 0 else rank
        for tile in nb.prange(tile_ptr.shape[0] - 1):
            rows = np.empty(NM1, dtype=np.int64)
            for p in range(tile_ptr[tile], tile_ptr[tile + 1]):
                x = bx[p]
                k = bk[p]
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
                v = bv[p]
                dest = target - out_lo
                for r in range(R):
                    q = v
                    for s in range(NM1):
                        q *= F[rows[s], r]
                    out[dest, r] += q

    return owned_count, owned_scatter, owned_compute


_OWNED: dict[tuple[int, int, bool], tuple] = {}
SPECIALIZED_RANKS = (32, 64)


def owned_kernels(nmodes: int, rank: int, delta: bool):
    key = (nmodes, rank if rank in SPECIALIZED_RANKS else 0, bool(delta))
    if key not in _OWNED:
        _OWNED[key] = _build(*key)
    return _OWNED[key]


TILE_BYTES = 1 << 20  # output rows per tile: about 1 MiB of them, so a tile's rows stay in L2
MIN_TILES_PER_THREAD = 16
GROUP_NNZ = 1 << 22  # nonzeros bucketed at once (20 bytes each)


def tile_shift_for(nrows: int, rank: int, itemsize: int, threads: int) -> int:
    """log2 of the rows per tile: tiles of about TILE_BYTES, and at least MIN_TILES_PER_THREAD
    tiles per thread so heavy rows spread over the threads."""
    by_bytes = max(1, TILE_BYTES // max(1, rank * itemsize))
    by_threads = max(1, nrows // max(1, MIN_TILES_PER_THREAD * threads))
    rows = max(1, min(by_bytes, by_threads))
    return int(rows).bit_length() - 1


def run_owned(items, layout, factors, mode: int, out: np.ndarray, out_lo: int, todo: np.ndarray) -> None:
    """Add the MTTKRP of items ``todo`` into ``out`` (rows ``out_lo ..``) by row-owned tiles."""
    R = out.shape[1]
    count, scatter, compute = owned_kernels(layout.nmodes, R, items.delta)
    mask = items.masks(layout)
    shift = tile_shift_for(out.shape[0], R, out.dtype.itemsize, nb.get_num_threads())
    ntiles = ((out.shape[0] - 1) >> shift) + 1
    nnz = (items.end - items.start)[todo]
    # groups of consecutive items up to GROUP_NNZ nonzeros bound the buckets
    bounds = [0]
    acc = 0
    for j, n in enumerate(nnz.tolist()):
        if acc and acc + n > GROUP_NNZ:
            bounds.append(j)
            acc = 0
        acc += n
    bounds.append(len(todo))
    cap = int(max((nnz[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])), default=0))
    bx = np.empty(cap, dtype=np.uint64)
    bk = np.empty(cap, dtype=np.int64)
    bv = np.empty(cap, dtype=items.values.dtype)
    for a, b in zip(bounds[:-1], bounds[1:]):
        group = np.ascontiguousarray(todo[a:b])
        counts = np.zeros((group.shape[0], ntiles), dtype=np.int64)
        count(
            items.index,
            items.start,
            items.end,
            items.base,
            items.prev,
            layout.field_shift,
            mask,
            mode,
            group,
            out_lo,
            shift,
            counts,
        )
        per_tile = counts.sum(axis=0)
        tile_ptr = np.zeros(ntiles + 1, dtype=np.int64)
        np.cumsum(per_tile, out=tile_ptr[1:])
        # item t's bucket in tile j starts after the tile's earlier items
        starts = (tile_ptr[:-1][None, :] + np.cumsum(counts, axis=0) - counts).astype(np.int64)
        scatter(
            *items.kernel_args(layout),
            mode,
            group,
            out_lo,
            shift,
            starts,
            bx,
            bk,
            bv,
        )
        compute(
            bx,
            bk,
            bv,
            tile_ptr,
            items.base,
            layout.field_shift,
            mask,
            factors.data,
            factors.offsets,
            mode,
            R,
            out,
            out_lo,
        )
