"""Matrix-free dense MTTKRP on CPUs: the ELEM, SLICE and TILE algorithms of seed 002 (numba).

For target mode ``k`` of a dense block ``X`` (order 3-6) with factor matrices ``A_m`` (I_m x R):

    G[i_k, :] = sum over i with that i_k of  X[i] * prod_{m != k} A_m[i_m, :]

No Khatri-Rao product is formed: beyond the tensor, memory is O(R * sum I_m) (the factor rows the
block touches, stacked row-major, and the output).

- **ELEM** (Algorithm 2): work items are runs of ``ELEM_RUN`` consecutive elements; the run's first
  multi-index is found with one division per mode (the anchor) and advanced like an odometer, so
  no element needs a division. Every element multiplies its ``d - 1`` factor rows and adds the
  product into ``G`` with one atomic add per column: N x R atomics, as in the seed.
- **SLICE** (Algorithm 3 with N_T = N_S): one work item per mode-``k`` slice; it sums the whole
  slice locally and writes its row of ``G`` once, without atomics.
- **TILE** (Algorithm 3): work items are (tile, slice) pairs; a tile is a box of width ``w`` in every
  mode but ``k`` (clipped where ``w`` does not divide a mode), except that on CPUs it spans the
  innermost (contiguous) loop mode whole: each tile row costs a fixed overhead, and rows of ``w``
  elements measured slower (R = 32, one thread, GFMA/s, rows of w -> whole rows: 61x41x12x66
  5.0 -> 7.9 at w = 12 and 2.2 -> 8.6 at w = 4; 30x30x30x8x12 6.4 -> 6.5 and 2.9 -> 6.8). A work
  item sums its tile in locals and adds that sum into row ``i_k`` of ``G`` with one atomic per
  column, I_k (N_S / N_T) R atomics in all. ``w`` defaults to Eq. 6 (:mod:`.tile`).

Inside a tile (and a slice) the elements are visited in memory order, row by row (a row: all
loop indices but the innermost fixed). Per row, the product of the outer modes' factor rows is
kept per loop level and recomputed only from the level whose index changed; along the innermost
(contiguous) mode the row sum ``t = sum_i X[.., i] * A_inner[i, j0:j0+W]`` is formed in vector
registers, ``W = 32`` columns at a time while that many remain, then ``COLUMN_CHUNK = 8`` (the
seed's F consecutive columns per work item; :mod:`.simd`), and ``prefix * t`` is added to
the tile's sum. That is one fused
multiply-add per element and column instead of the seed's ``d - 1`` multiplies and one add (the
model flop count f = N R d is still the one reported). The stacked factor copy has its columns
zero-padded to a multiple of 8, so any rank works (R = 1 included); only the first R columns are
written.

When the target mode is the contiguous one, a per-slice tile would read one element of every
cache line; there :func:`slab_kernel` runs instead: a work item is a tile (width ``w`` in every
other mode) times a slab of consecutive target indices, each tile row streams ``X[.., n0:n1]``
contiguously into a private (slab x R) block, added into the output once per item (atomically
unless one tile covers the other modes, as for SLICE; the update runs in vector registers,
:func:`.simd.axpy_rows`). 133x67x4x167, R = 32, one thread: that mode 0.174 -> 0.019 s
(SLICE), 0.080 -> 0.028 s (TILE); the other modes take 0.010-0.017 s.

Work items are grouped into ``prange`` iterations so scratch space is allocated once per group;
in :func:`tile_kernel` the target index ``n`` runs fastest, so consecutive items reuse the same
factor rows.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numba as nb
import numpy as np

from ..atomics import atomic_add
from .layout import (
    DenseLayout,
    check_call,
    check_finite_factors,
    check_out,
    check_variant,
    layout,
    memory_order,
    stack_factors,
)
from .simd import axpy_rows, row_dot8, row_dot32
from .tile import dense_tile_width

log = logging.getLogger(__name__)


COLUMN_CHUNK = 8  # columns summed at once in vector registers (the seed's F); R is padded to a multiple
WIDE_CHUNK = 32  # columns per row sum while at least that many remain (one x broadcast per 4 vectors)
SLAB_BYTES = 32 << 10  # private (slab x R) block of the slab kernel: stays in L1/L2
ELEM_RUN = 4096  # consecutive elements per ELEM work item (one anchor division each)
GROUPS_PER_THREAD = 16  # prange iterations per thread for TILE/SLICE (balance vs. scratch allocations)


@nb.njit(inline="always")
def _box_sum(flat, base, st, loop, lo, hi, F, Ff, rp, offs, acc, pref, t, idx):
    """acc[:rp] = sum over the box lo..hi (per loop level, outermost first) of the slice that starts
    at flat offset ``base``, of  X[..] * prod over loop modes m of F[offs[m] + i_m, :].

    flat : float (N,)          the block in memory order
    st : int64 (d,)            element strides of the canonical modes
    loop : int64 (D,)          canonical modes other than the target, outermost first (D >= 2)
    lo, hi : int64 (D,)        box bounds per loop level, hi exclusive, lo < hi
    F : float (rows, rp) C     stacked factor rows, rp a multiple of COLUMN_CHUNK; Ff : F flattened
    offs : int64 (d,)          first row of each canonical mode in F
    acc : float (rp,)          output; pref : float (D, rp); t : float (WIDE_CHUNK,); idx : int64 (D,)

    Rows of the box (all loop indices but the innermost fixed) are visited in memory order. For
    each row the product of the outer modes' factor rows is ``pref[D - 1]``, kept per level and
    recomputed only from the level whose index changed; the row's sum along the innermost mode is
    formed chunk by chunk of 8 columns in vector registers, then scaled by the prefix.
    """
    D = loop.shape[0]
    for c in range(rp):
        acc[c] = 0
        pref[0, c] = 1
    for lev in range(D - 1):
        idx[lev] = lo[lev]
        row = offs[loop[lev]] + idx[lev]
        for c in range(rp):
            pref[lev + 1, c] = pref[lev, c] * F[row, c]
    inner = loop[D - 1]
    sin = st[inner]
    ilo = lo[D - 1]
    count = hi[D - 1] - ilo
    fstart = (offs[inner] + ilo) * rp
    p = D - 1
    while True:
        off = base + ilo * sin
        for lev in range(D - 1):
            off += idx[lev] * st[loop[lev]]
        j0 = 0
        while j0 + WIDE_CHUNK <= rp:
            row_dot32(flat, off, sin, count, Ff, fstart + j0, rp, t)
            for c in range(WIDE_CHUNK):
                acc[j0 + c] += pref[p, j0 + c] * t[c]
            j0 += WIDE_CHUNK
        while j0 < rp:
            row_dot8(flat, off, sin, count, Ff, fstart + j0, rp, t)
            for c in range(COLUMN_CHUNK):
                acc[j0 + c] += pref[p, j0 + c] * t[c]
            j0 += COLUMN_CHUNK
        lev = D - 2
        while lev >= 0:
            idx[lev] += 1
            if idx[lev] < hi[lev]:
                break
            idx[lev] = lo[lev]
            lev -= 1
        if lev < 0:
            break
        for l2 in range(lev, D - 1):
            row = offs[loop[l2]] + idx[l2]
            for c in range(rp):
                pref[l2 + 1, c] = pref[l2, c] * F[row, c]


# contract: fused multiply-adds (one rounding instead of two)
@nb.njit(parallel=True, nogil=True, cache=True, fastmath={"contract"})
def tile_kernel(flat, shp, st, k, loop, F, offs, rank, width, inner_width, ngroups, atomic, out_flat):
    """TILE (and, with ``width`` >= every mode and ``atomic`` False, SLICE) dense MTTKRP.

    Parameters
    ----------
    flat : float (N,)           block in memory order (canonical C order)
    shp, st : int64 (d,)        canonical shape and element strides
    k : int                     canonical target mode
    loop : int64 (d-1,)         the other canonical modes, outermost first
    F : float (rows, rp) C      stacked factor rows (target mode left out), columns zero-padded to
                                a multiple of COLUMN_CHUNK; offs : int64 (d,) first row per mode
    rank : int                  R (<= rp); only these columns are written
    width : int                 tile width in every loop mode but the innermost (clipped at the edge)
    inner_width : int           tile width along the innermost loop mode (>= width)
    ngroups : int               prange iterations the work items are split into
    atomic : bool               add tile sums with atomics (False only when a slice is one tile)
    out_flat : float (I_k * R,) the output rows, row-major; sums are added to it
    """
    D = loop.shape[0]
    rp = F.shape[1]
    ntile = np.empty(D, dtype=np.int64)
    T = 1
    wl = np.empty(D, dtype=np.int64)
    for lev in range(D):
        wl[lev] = width if lev < D - 1 else inner_width
        ntile[lev] = (shp[loop[lev]] + wl[lev] - 1) // wl[lev]
        T *= ntile[lev]
    nk = shp[k]
    nitems = T * nk
    Ff = F.reshape(F.size)
    per = (nitems + ngroups - 1) // ngroups
    for g in nb.prange(ngroups):
        q0 = g * per
        q1 = min(nitems, q0 + per)
        lo = np.empty(D, dtype=np.int64)
        hi = np.empty(D, dtype=np.int64)
        idx = np.empty(D, dtype=np.int64)
        acc = np.empty(rp, dtype=F.dtype)
        t = np.empty(WIDE_CHUNK, dtype=F.dtype)
        pref = np.empty((D, rp), dtype=F.dtype)
        for q in range(q0, q1):
            n = q % nk
            tt = q // nk
            # the tile's anchor: one division per loop mode per work item, none per element
            for lev in range(D - 1, -1, -1):
                c0 = (tt % ntile[lev]) * wl[lev]
                tt //= ntile[lev]
                lo[lev] = c0
                hi[lev] = min(c0 + wl[lev], shp[loop[lev]])
            _box_sum(flat, n * st[k], st, loop, lo, hi, F, Ff, rp, offs, acc, pref, t, idx)
            dst = n * rank
            if atomic:
                for c in range(rank):
                    atomic_add(out_flat, dst + c, acc[c])
            else:
                for c in range(rank):
                    out_flat[dst + c] += acc[c]


@nb.njit(parallel=True, nogil=True, cache=True, fastmath={"contract"})
def slab_kernel(flat, shp, st, k, loop, F, offs, rank, width, slab, ngroups, atomic, out_flat):
    """TILE/SLICE when the target mode is the contiguous one (``st[k] == 1``).

    A work item is a tile of width ``width`` in every loop mode times a *slab* of ``slab``
    consecutive target indices ``n0 .. n1``. For each row of the tile (all loop indices fixed) the
    product ``P`` of all ``d - 1`` factor rows comes from the per-level prefixes, and the row's
    contiguous elements ``X[.., n0:n1]`` add ``X[.., n] * P`` into a private (slab, R') block: the
    tensor streams contiguously and each cache line is used whole, where per-slice tiles would read
    one element of every line (:func:`.simd.axpy_rows` does the row update). The block is added into ``out`` rows
    ``n0 .. n1`` at the end: with
    atomics when a mode has more than one tile, plainly when one tile covers the loop modes (SLICE).
    Other parameters as in :func:`tile_kernel`.
    """
    D = loop.shape[0]
    rp = F.shape[1]
    ntile = np.empty(D, dtype=np.int64)
    T = 1
    for lev in range(D):
        ntile[lev] = (shp[loop[lev]] + width - 1) // width
        T *= ntile[lev]
    nk = shp[k]
    nslab = (nk + slab - 1) // slab
    nitems = T * nslab
    per = (nitems + ngroups - 1) // ngroups
    for g in nb.prange(ngroups):
        q0 = g * per
        q1 = min(nitems, q0 + per)
        lo = np.empty(D, dtype=np.int64)
        hi = np.empty(D, dtype=np.int64)
        idx = np.empty(D, dtype=np.int64)
        pref = np.empty((D + 1, rp), dtype=F.dtype)
        acc = np.empty((slab, rp), dtype=F.dtype)
        acc_flat = acc.reshape(slab * rp)
        pref_last = pref[D]
        for c in range(rp):
            pref[0, c] = 1
        for q in range(q0, q1):
            tt = q // nslab
            n0 = (q % nslab) * slab
            cnt = min(nk, n0 + slab) - n0
            for lev in range(D - 1, -1, -1):
                c0 = (tt % ntile[lev]) * width
                tt //= ntile[lev]
                lo[lev] = c0
                hi[lev] = min(c0 + width, shp[loop[lev]])
            for j in range(cnt):
                for c in range(rp):
                    acc[j, c] = 0
            for lev in range(D):
                idx[lev] = lo[lev]
                row = offs[loop[lev]] + idx[lev]
                for c in range(rp):
                    pref[lev + 1, c] = pref[lev, c] * F[row, c]
            while True:
                off = n0
                for lev in range(D):
                    off += idx[lev] * st[loop[lev]]
                axpy_rows(flat, off, cnt, pref_last, acc_flat, rp)
                lev = D - 1
                while lev >= 0:
                    idx[lev] += 1
                    if idx[lev] < hi[lev]:
                        break
                    idx[lev] = lo[lev]
                    lev -= 1
                if lev < 0:
                    break
                for l2 in range(lev, D):
                    row = offs[loop[l2]] + idx[l2]
                    for c in range(rp):
                        pref[l2 + 1, c] = pref[l2, c] * F[row, c]
            for j in range(cnt):
                dst = (n0 + j) * rank
                if atomic:
                    for c in range(rank):
                        atomic_add(out_flat, dst + c, acc[j, c])
                else:
                    for c in range(rank):
                        out_flat[dst + c] += acc[j, c]


@nb.njit(parallel=True, nogil=True, cache=True)
def elem_kernel(flat, shp, k, F, offs, rank, run, out_flat):
    """ELEM dense MTTKRP: runs of ``run`` consecutive elements, one atomic per element and column.

    flat : float (N,) block in memory order; shp : int64 (d,) canonical shape; k : target mode;
    F, offs : stacked factor rows and first row per canonical mode; rank : R;
    out_flat : float (I_k * R,) output rows, row-major (added to).
    """
    d = shp.shape[0]
    N = flat.shape[0]
    nruns = (N + run - 1) // run
    for g in nb.prange(nruns):
        start = g * run
        end = min(N, start + run)
        idx = np.empty(d, dtype=np.int64)
        rem = start
        for c in range(d - 1, -1, -1):
            idx[c] = rem % shp[c]
            rem //= shp[c]
        for e in range(start, end):
            y = flat[e]
            dst = idx[k] * rank
            for r in range(rank):
                p = y
                for c in range(d):
                    if c != k:
                        p *= F[offs[c] + idx[c], r]
                atomic_add(out_flat, dst + r, p)
            c = d - 1
            while c >= 0:
                idx[c] += 1
                if idx[c] < shp[c]:
                    break
                idx[c] = 0
                c -= 1


def slab_length(rows: int, cols: int, itemsize: int, spread: int = 1) -> int:
    """Target indices per slab of :func:`slab_kernel`: a private block of about ``SLAB_BYTES``
    (at least 8 rows), and at most ``rows / spread`` so ``spread`` threads get a slab each."""
    slab = max(8, SLAB_BYTES // (cols * itemsize))
    return int(max(1, min(slab, -(-rows // max(1, spread)))))


def tile_items(shape: Sequence[int], mode: int, width: int, strides: Sequence[int] | None = None) -> int:
    """Work items (tile sums written to the output) of the CPU TILE kernel on a block of ``shape``
    (C order unless element ``strides`` are given) for target ``mode`` and tile width ``width``:
    ``I_k`` times the tiles per slice (the innermost loop mode counted as one tile, except when the
    target mode is the contiguous one and :func:`slab_kernel` runs)."""
    shape = [int(s) for s in shape]
    if strides is None:
        strides = [int(np.prod(shape[m + 1 :])) for m in range(len(shape))]
    lay = layout(shape, memory_order(shape, list(strides)), mode, 1, np.float64)
    items = shape[mode]
    # slab kernel (target contiguous): tiles in every loop mode; else the innermost loop mode is whole
    loop = lay.loop.tolist() if lay.mode == len(shape) - 1 else lay.loop[:-1].tolist()
    for c in loop:
        items *= -(-int(lay.shape[c]) // int(width))
    return int(items)


def prepare(
    block: np.ndarray,
    factors: Sequence[np.ndarray],
    mode: int,
    origin: Sequence[int] | None,
    variant: str,
    tile: int | None,
) -> tuple[DenseLayout, np.ndarray, tuple[int, ...]]:
    """Validate a host call; return its layout, the block's flat buffer in memory order and origin."""
    check_variant(variant, tile)
    if not isinstance(block, np.ndarray):
        raise TypeError(f"block must be a numpy.ndarray, got {type(block).__name__}")
    factors = list(factors)
    for m, f in enumerate(factors):
        if not isinstance(f, np.ndarray):
            raise TypeError(f"factor matrix {m} must be a numpy.ndarray, got {type(f).__name__}")
    origin, rank = check_call(block.shape, block.dtype, True, factors, mode, origin)
    flat, perm = host_flat(block)
    return layout(block.shape, perm, mode, rank, block.dtype), flat, origin


def host_flat(block: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """(flat buffer in memory order, memory order) of a host block; a view for any contiguous
    permutation, a C copy otherwise."""
    itemsize = block.dtype.itemsize
    perm = memory_order(block.shape, [s // itemsize if s % itemsize == 0 else -1 for s in block.strides])
    if perm is None:
        block = np.ascontiguousarray(block)
        perm = memory_order(block.shape, [s // itemsize for s in block.strides])
    return block.transpose(perm).reshape(-1), perm


def dense_mttkrp(
    block: np.ndarray,
    factors: Sequence[np.ndarray],
    mode: int,
    *,
    origin: Sequence[int] | None = None,
    out: np.ndarray | None = None,
    variant: str = "tile",
    tile: int | None = None,
) -> np.ndarray:
    """Mode-``mode`` MTTKRP of a dense block, matrix-free (seed 002's ELEM, SLICE or TILE).

    Parameters
    ----------
    block : numpy.ndarray
        float32 or float64, order 3 to 6, C- or F-ordered (any contiguous permutation; other
        layouts are copied first): the sub-array ``X[o0:o0+b0, o1:o1+b1, ...]`` of the full tensor
        whose corner is ``origin``.
    factors : sequence of numpy.ndarray
        The full factor matrices (I_m x R, the block's dtype); rows ``origin[m] ..
        origin[m] + block.shape[m] - 1`` of each are read.
    mode : int
        Target mode.
    origin : sequence of int, optional
        The block's corner in the full tensor (default all zeros: the block is the whole tensor).
    out : numpy.ndarray, optional
        (block.shape[mode], R) array of the block's dtype; the contribution is added to it and it is
        returned (pass the same view for every chunk along the other modes).
    variant : {"tile", "slice", "elem"}
        Parallelisation of seed 002 section III.
    tile : int, optional
        TILE width in every mode but ``mode``; default from Eq. 6 (:func:`dense_tile_width`).

    Returns
    -------
    numpy.ndarray
        (block.shape[mode], R): rows relative to ``origin[mode]``.

    Raises
    ------
    DenseArrayError
        Order outside 3-6, a dtype other than float32/float64, a bad mode, variant or tile width.
    ShapeError
        Factor matrices that do not cover the block, ragged ranks, a rank below 1, a wrong ``out``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((4, 5, 6))
    >>> A = [rng.standard_normal((s, 3)) for s in X.shape]
    >>> G = dense_mttkrp(X, A, 1)
    >>> bool(np.allclose(G, np.einsum("ijk,ir,kr->jr", X, A[0], A[2])))
    True
    """
    lay, flat, origin = prepare(block, factors, mode, origin, variant, tile)
    rows = int(block.shape[mode])
    R = lay.rank
    if out is not None:
        check_out(out, rows, R, block.dtype)
    target = out if out is not None and out.flags.c_contiguous else np.zeros((rows, R), dtype=block.dtype)
    if flat.shape[0] == 0:
        return target if out is None or target is out else out
    F = stack_factors(factors, lay, origin, pad_to=COLUMN_CHUNK if variant != "elem" else 1)
    check_finite_factors(F)
    out_flat = target.reshape(-1)
    if variant == "elem":
        elem_kernel(flat, lay.shape, lay.mode, F, lay.offs, R, ELEM_RUN, out_flat)
    else:
        if variant == "slice":
            width = int(lay.shape.max())
        else:
            width = int(tile) if tile is not None else dense_tile_width(block.shape, R, block.dtype.itemsize)
        threads = nb.get_num_threads()
        if lay.mode == len(lay.perm) - 1:
            slab = slab_length(rows, F.shape[1], F.dtype.itemsize, threads if variant == "slice" else 1)
            ntile = 1
            for c in lay.loop.tolist():
                ntile *= -(-int(lay.shape[c]) // width)
            nitems = ntile * -(-rows // slab)
            ngroups = max(1, min(nitems, GROUPS_PER_THREAD * threads))
            slab_kernel(
                flat,
                lay.shape,
                lay.strides,
                lay.mode,
                lay.loop,
                F,
                lay.offs,
                R,
                width,
                slab,
                ngroups,
                ntile > 1,
                out_flat,
            )
        else:
            # tiles span the innermost (contiguous) loop mode whole: long vector row sums
            inner_width = max(width, int(lay.shape[lay.loop[-1]]))
            ntile = 1
            for c in lay.loop[:-1].tolist():
                ntile *= -(-int(lay.shape[c]) // width)
            nitems = ntile * rows
            ngroups = max(1, min(nitems, GROUPS_PER_THREAD * threads))
            if ntile == 1:
                # a slice is one tile: give each group whole slices, so no two groups share a row
                ngroups = max(1, min(rows, ngroups))
                per = -(-nitems // ngroups)
                ngroups = -(-nitems // per)
            tile_kernel(
                flat,
                lay.shape,
                lay.strides,
                lay.mode,
                lay.loop,
                F,
                lay.offs,
                R,
                width,
                inner_width,
                ngroups,
                ntile > 1,
                out_flat,
            )
    if out is not None and target is not out:
        out += target
        return out
    return target
