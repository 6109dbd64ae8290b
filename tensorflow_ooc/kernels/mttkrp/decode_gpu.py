"""On-device decoding of a streamed batch: stored ALTO words to re-encoded BLCO indices.

Chunks arrive as stored: the Delta filter's differences of the low ALTO words (each work item
starts from a known word, ``prev``). Three kernels turn them into BLCO indices in place, so the
host never re-encodes:

1. :func:`tile_sums` - one thread block per tile sums the tile's differences (wrapping uint64);
2. :func:`tile_prefix` - one thread per work item scans its tiles' sums from the item's ``prev``
   word, giving each tile the ALTO word before its first nonzero;
3. :func:`decode_tiles` - one thread block per tile: a block scan of the differences plus the tile
   prefix gives the ALTO words, and eight byte-table lookups (``BitLayout.reencode_table``)
   re-encode each into one contiguous field per mode (seed 001 section 4.1).

Batches of absolute words (``delta=False``) skip steps 1-2. All arithmetic is uint64 and wraps,
as the Delta filter does.
"""

from __future__ import annotations

import numpy as np

from ..gpu.device import cuda

DECODE_THREADS = 256
_KERNELS: dict[tuple[str, int], object] = {}


def _block_scan(tpb: int):
    @cuda.jit(device=True, inline=True)
    def block_inclusive_scan(x, tid, sh):
        """Inclusive sum of ``x`` over the block's threads (Hillis-Steele in shared memory)."""
        sh[tid] = x
        cuda.syncthreads()
        d = 1
        while d < tpb:
            y = np.uint64(0)
            if tid >= d:
                y = sh[tid - d]
            cuda.syncthreads()
            sh[tid] = sh[tid] + y
            cuda.syncthreads()
            d *= 2
        out = sh[tid]
        cuda.syncthreads()
        return out

    return block_inclusive_scan


def _make_tile_sums(tpb: int):
    scan = _block_scan(tpb)

    def tile_sums(words, tile_start, tile_end, sums):
        """sums[t] = sum of words[tile_start[t]:tile_end[t]] (uint64, wrapping)."""
        sh = cuda.shared.array(tpb, dtype=np.uint64)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        s = np.uint64(0)
        for i in range(tile_start[b] + tid, tile_end[b], tpb):
            s = s + words[i]
        total = scan(s, tid, sh)
        if tid == tpb - 1:
            sums[b] = total

    return tile_sums


def tile_prefix(item_prev, item_first_tile, sums, prefix):
    """prefix[t] = the ALTO word before tile t: item prev + the sums of the item's earlier tiles.
    One thread per work item; item k owns tiles ``item_first_tile[k] .. item_first_tile[k+1]``."""
    k = cuda.grid(1)
    if k < item_prev.shape[0]:
        acc = item_prev[k]
        for t in range(item_first_tile[k], item_first_tile[k + 1]):
            prefix[t] = acc
            acc = acc + sums[t]


def _make_decode(tpb: int):
    scan = _block_scan(tpb)

    def decode_tiles(words, tile_start, tile_end, prefix, is_delta, table, nbytes):
        """Replace the tile's stored words by BLCO indices (one thread block per tile).

        words : uint64 (nnz,)        differences (``is_delta``) or absolute low ALTO words
        prefix : uint64 (T,)         ALTO word before each tile (read only with ``is_delta``)
        table : uint64 (8, 256)      re-encoding byte table of the layout
        nbytes : int                 bytes of the low ALTO word that carry index bits
        """
        sh = cuda.shared.array(tpb, dtype=np.uint64)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        start = tile_start[b]
        end = tile_end[b]
        carry = np.uint64(0)
        if is_delta:
            carry = prefix[b]
        for base in range(start, end, tpb):
            i = base + tid
            x = np.uint64(0)
            if i < end:
                x = words[i]
            if is_delta:
                incl = scan(x, tid, sh)
                last = min(tpb, end - base) - 1
                x = carry + incl
                # every thread reads the last sum before anyone overwrites the scan buffer
                sh[tid] = incl
                cuda.syncthreads()
                carry = carry + sh[last]
                cuda.syncthreads()
            if i < end:
                r = np.uint64(0)
                for j in range(nbytes):
                    r |= table[j, (x >> np.uint64(8 * j)) & np.uint64(255)]
                words[i] = r

    return decode_tiles


def decode_kernels(tpb: int = DECODE_THREADS):
    """The compiled (tile_sums, tile_prefix, decode_tiles) kernels for ``tpb`` threads per block."""
    key = ("decode", tpb)
    if key not in _KERNELS:
        _KERNELS[key] = (cuda.jit(_make_tile_sums(tpb)), cuda.jit(tile_prefix), cuda.jit(_make_decode(tpb)))
    return _KERNELS[key]


def kernel_sources(tpb: int = DECODE_THREADS) -> dict:
    """The uncompiled decode kernels with their argument types, for ``cuda.compile_ptx``."""
    from numba import boolean, int64, types, uint64

    a1 = lambda t: types.Array(t, 1, "C")  # noqa: E731
    return {
        "tile_sums": (_make_tile_sums(tpb), types.void(a1(uint64), a1(int64), a1(int64), a1(uint64))),
        "tile_prefix": (tile_prefix, types.void(a1(uint64), a1(int64), a1(uint64), a1(uint64))),
        "decode_tiles": (
            _make_decode(tpb),
            types.void(a1(uint64), a1(int64), a1(int64), a1(uint64), boolean, types.Array(uint64, 2, "C"), int64),
        ),
    }
