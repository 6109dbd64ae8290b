"""GPU MTTKRP kernels on BLCO tiles (numba.cuda; seed 001 chapter 5, figure 5.1).

One thread block processes one *tile*: a contiguous run of re-encoded BLCO indices inside one
block of the format (so one base per tile; :func:`tensorflow_ooc.kernels.mttkrp.gpu_plan.device_tiles`).
Its ``WARPS`` warps take consecutive 32-nonzero sub-tiles, ``COARSEN`` each (thread coarsening).

Processing phase, per 32-nonzero sub-tile (steps 1-3):
  each lane loads one nonzero (coalesced), de-linearizes it with one shift and mask per mode,
  and the warp groups its nonzeros by target row: ``match_any`` finds the lanes with the same
  row, a warp scan of the group sizes gives each group its offset (histogram + prefix sum), and
  each nonzero is written to its new place in shared memory. A group's first slot is a segment
  start.
Computing phase (steps 4-7):
  lanes are re-assigned along the rank and walk the reordered nonzeros, accumulating in
  registers while the target row stays the same. For ``R > 16`` the whole warp works on one
  nonzero at a time (lane ``l`` owns columns ``l, l + 32, ...``); for smaller ranks the warp splits
  into ``32 / lanes`` groups of ``lanes`` (the next power of two >= R) and group ``g`` takes
  reordered slots ``g * lanes .. (g + 1) * lanes - 1``, so no lane idles on a rank of 8 or 16.
  The accumulator carries across sub-tiles, so a row that continues into the next sub-tile is
  not flushed. At a segment end the registers are flushed:
  - ``register``: atomic adds straight into the output (section 5.2);
  - ``hierarchical``: atomic adds into a shared-memory stash of ``stash_rows`` target rows from
    the tile's smallest row (ALTO keeps a tile's rows close together in every mode); when the
    block ends, the touched stash rows go to one of ``K`` global copies of the output (copy
    ``block % K``), and :func:`merge_copies_kernel` adds the copies into the output once
    (section 5.1). Rows past the stash window go to the block's copy directly.
The heuristic that chooses between them is :func:`tensorflow_ooc.kernels.mttkrp.gpu_plan.choose_conflict`.

Poisson form (``KernelConfig.poisson``: CP-APR's Phi, the twin of the CPU kernels' fused form in
:mod:`.cpu`; ``eps`` a last argument): in the computing phase each lane forms its columns of the
nonzero's Khatri-Rao row ``k`` once, in registers, and their terms ``B[i_n, r] k_r`` of the model
value (``B`` the target mode's rows of ``F``); the lane group sums the terms by a butterfly of
``shfl_idx`` (every lane gets the model value ``m``) and adds ``x / max(m, eps) * k_r``. Segments
and flushes are the MTTKRP's. The exchange is warp-wide (block-wide in the shared-memory form),
so every lane takes the same ``lanes`` steps per sub-tile, a group past the sub-tile's end adding
nothing. The plain kernel is compiled without any of it.

Inputs are trusted: indices must decode inside the factor matrices and the output (the store and
the batch planner validate them before launch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gpu.device import cuda
from ..gpu.launch import lanes_for
from ..gpu.warp_exchange import warp_exchange

CONFLICTS = ("hierarchical", "register")
DEFAULT_WARPS = 8
DEFAULT_COARSEN = 4
SHARED_BYTES = 46 * 1024  # static shared memory per block, under the 48 KiB limit
MAX_STASH_ROWS = 256


@dataclass(frozen=True)
class KernelConfig:
    """Compile-time parameters of one MTTKRP kernel variant."""

    nmodes: int
    rank_chunks: int  # columns per lane = ceil(R / lanes)
    conflict: str  # "hierarchical" or "register"
    exchange: str  # "intrinsics" or "shared"
    dtype: str = "float64"
    warps: int = DEFAULT_WARPS
    coarsen: int = DEFAULT_COARSEN
    lanes: int = 32  # lanes per nonzero in the computing phase (a power of two <= 32)
    poisson: bool = False  # CP-APR's Phi instead of the MTTKRP (takes ``eps`` as a last argument)

    @classmethod
    def for_rank(
        cls,
        nmodes: int,
        rank: int,
        conflict: str,
        exchange: str,
        dtype: str = "float64",
        warps: int = DEFAULT_WARPS,
        coarsen: int = DEFAULT_COARSEN,
        poisson: bool = False,
    ) -> "KernelConfig":
        """The variant for rank ``rank``: ``lanes`` = the next power of two >= R (at most 32)."""
        lanes = lanes_for(rank)
        return cls(
            nmodes,
            max(1, math.ceil(int(rank) / lanes)),
            conflict,
            exchange,
            dtype,
            warps,
            coarsen,
            lanes,
            bool(poisson),
        )

    def __post_init__(self) -> None:
        if not 2 <= self.nmodes <= 8:
            raise ValueError(f"GPU kernels take 2 to 8 modes, got {self.nmodes}")
        if self.conflict not in CONFLICTS:
            raise ValueError(f"conflict must be one of {CONFLICTS}, got {self.conflict!r}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.rank_chunks < 1 or self.warps < 1 or self.coarsen < 1:
            raise ValueError("rank_chunks, warps and coarsen must be >= 1")
        if self.lanes not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"lanes must be a power of two up to 32, got {self.lanes}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def tile_nnz(self) -> int:
        """Nonzeros one thread block processes."""
        return 32 * self.warps * self.coarsen

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def phase_shared_bytes(self) -> int:
        """Shared memory of the processing phase: values, targets, factor rows, exchange scratch
        (and, for a Poisson kernel with the shared-memory exchange, its float exchange scratch)."""
        model = self.itemsize if self.poisson and self.exchange == "shared" else 0
        return self.threads * (self.itemsize + 8 * self.nmodes + 8 + model)

    @property
    def stash_rows(self) -> int:
        """Target rows the hierarchical stash holds, within the block's static shared memory."""
        if self.conflict != "hierarchical":
            return 0
        room = (SHARED_BYTES - self.phase_shared_bytes - 16) // (self.stash_cols * self.itemsize)
        return int(max(1, min(MAX_STASH_ROWS, room)))

    @property
    def stash_cols(self) -> int:
        return self.lanes * self.rank_chunks

    @property
    def shared_bytes(self) -> int:
        """Static shared memory of the kernel (the register variant keeps a one-row stash)."""
        return self.phase_shared_bytes + max(1, self.stash_rows) * self.stash_cols * self.itemsize + 16


def _make(cfg: KernelConfig):
    """The Python kernel function for ``cfg`` (``cuda.jit`` it, or give it to ``compile_ptx``)."""
    ex = warp_exchange(cfg.exchange)
    match_any, shfl_idx, inclusive_scan, sync_tile = ex.match_any, ex.shfl_idx, ex.inclusive_scan, ex.sync_tile
    N = cfg.nmodes
    NM1 = N - 1
    RC = cfg.rank_chunks
    WARPS = cfg.warps
    COARSEN = cfg.coarsen
    TPB = cfg.threads
    HIER = cfg.conflict == "hierarchical"
    STASH_ROWS = max(1, cfg.stash_rows)
    LANES = cfg.lanes
    STASH_COLS = LANES * RC
    DT = np.float32 if cfg.dtype == "float32" else np.float64
    from numba import float32, float64

    nbt = float32 if cfg.dtype == "float32" else float64
    POISSON = cfg.poisson
    LOG_LANES = LANES.bit_length() - 1
    FSCRATCH = 32 if POISSON and cfg.exchange == "shared" else 1  # the intrinsic form reads no scratch

    @cuda.jit(device=True, inline=True)
    def flush(acc, row, col, rank, out, out_lo, stash, win, smin, smax, copies, copy):
        """Write one segment's registers: stash or copy (hierarchical), or output (register)."""
        rel = row - out_lo
        if HIER:
            srow = row - win
            if srow < STASH_ROWS:
                for k in range(RC):
                    r = col + LANES * k
                    if r < rank:
                        cuda.atomic.add(stash, (srow, r), acc[k])
                if col == 0:
                    cuda.atomic.min(smin, 0, srow)
                    cuda.atomic.max(smax, 0, srow)
            else:
                for k in range(RC):
                    r = col + LANES * k
                    if r < rank:
                        cuda.atomic.add(copies, (copy, rel, r), acc[k])
        else:
            for k in range(RC):
                r = col + LANES * k
                if r < rank:
                    cuda.atomic.add(out, (rel, r), acc[k])

    @cuda.jit(device=True, inline=True)
    def tiles(
        index,
        values,
        tile_start,
        tile_end,
        tile_base,
        tile_lo,
        shift,
        mask,
        F,
        offs,
        mode,
        rank,
        out,
        out_lo,
        copies,
        eps,
    ):
        """The body of both kernels (``eps`` is read by the Poisson form only)."""
        tid = cuda.threadIdx.x
        lane = tid & 31
        w = tid >> 5
        grp = lane // LANES  # lane group of the computing phase and its column
        col = lane % LANES
        b = cuda.blockIdx.x
        start = tile_start[b]
        end = tile_end[b]
        sval = cuda.shared.array((WARPS, 32), dtype=DT)
        starget = cuda.shared.array((WARPS, 32), dtype=np.int64)
        srows = cuda.shared.array((WARPS, NM1, 32), dtype=np.int64)
        scratch = cuda.shared.array((WARPS, 32), dtype=np.int64)
        stash = cuda.shared.array((STASH_ROWS, STASH_COLS), dtype=DT)
        smin = cuda.shared.array(1, dtype=np.int64)
        smax = cuda.shared.array(1, dtype=np.int64)
        copy = b % copies.shape[0]
        win = tile_lo[b, mode]
        if HIER:
            for e in range(tid, STASH_ROWS * STASH_COLS, TPB):
                stash[e // STASH_COLS, e % STASH_COLS] = 0
            if tid == 0:
                smin[0] = STASH_ROWS
                smax[0] = -1
            cuda.syncthreads()
        my_scratch = scratch[w]
        acc = cuda.local.array(RC, dtype=nbt)
        rows_here = cuda.local.array(NM1, dtype=np.int64)
        if POISSON:
            fscratch = cuda.shared.array((WARPS, FSCRATCH), dtype=DT)
            my_fscratch = fscratch[w]
            kr = cuda.local.array(RC, dtype=nbt)
            floor = nbt(eps)
            trows = offs[mode]  # B: the target mode's rows of F
        for k in range(RC):
            acc[k] = 0
        current = -1
        for c in range(COARSEN):
            first = start + (w * COARSEN + c) * 32
            pos = first + lane
            nvalid = min(max(end - first, 0), 32)
            # --- processing phase: load, de-linearize, group by target row ---------------------
            key = np.int64(-1)
            v = nbt(0)
            if pos < end:
                x = index[pos]
                v = values[pos]
                j = 0
                for m in range(N):
                    cm = tile_base[b, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                    if m == mode:
                        key = cm
                    else:
                        rows_here[j] = offs[m] + cm
                        j += 1
            group = match_any(key, lane, my_scratch)
            group32 = np.uint32(group)
            leader = cuda.ffs(group32) - 1
            size = cuda.popc(group32)
            before = cuda.popc(group32 & np.uint32((np.int64(1) << lane) - 1))
            own = size if lane == leader else 0
            incl = inclusive_scan(own, lane, my_scratch)
            offset = shfl_idx(incl - own, leader, lane, my_scratch)
            dest = offset + before
            if pos < end:
                sval[w, dest] = v
                starget[w, dest] = key
                for q in range(NM1):
                    srows[w, q, dest] = rows_here[q]
            sync_tile()
            # --- computing phase: lane groups along the rank, registers per segment -------------
            if POISSON:
                # every lane runs LANES steps (the model value's exchange is warp-wide; the
                # shared-memory form's is block-wide): a group past the sub-tile's end adds 0
                for s in range(LANES):
                    i = grp * LANES + s
                    mv = nbt(0)
                    if i < nvalid:
                        t = starget[w, i]
                        if t != current:
                            if current >= 0:
                                flush(acc, current, col, rank, out, out_lo, stash, win, smin, smax, copies, copy)
                            current = t
                            for k in range(RC):
                                acc[k] = 0
                        # the Khatri-Rao row once: the model value's terms and the row to add
                        for k in range(RC):
                            r = col + LANES * k
                            kr[k] = 0
                            if r < rank:
                                p = F[srows[w, 0, i], r]
                                for q in range(1, NM1):
                                    p *= F[srows[w, q, i], r]
                                kr[k] = p
                                mv += F[trows + t, r] * p
                    # the group's lanes sum their columns' terms (butterfly: each gets the sum)
                    for h in range(LOG_LANES):
                        mv += shfl_idx(mv, lane ^ (1 << h), lane, my_fscratch)
                    if i < nvalid:
                        vi = sval[w, i] / max(mv, floor)
                        for k in range(RC):
                            acc[k] += vi * kr[k]
            else:
                for i in range(grp * LANES, min(nvalid, grp * LANES + LANES)):
                    t = starget[w, i]
                    if t != current:
                        if current >= 0:
                            flush(acc, current, col, rank, out, out_lo, stash, win, smin, smax, copies, copy)
                        current = t
                        for k in range(RC):
                            acc[k] = 0
                    vi = sval[w, i]
                    for k in range(RC):
                        r = col + LANES * k
                        if r < rank:
                            p = vi
                            for q in range(NM1):
                                p *= F[srows[w, q, i], r]
                            acc[k] += p
            sync_tile()
        if current >= 0:
            flush(acc, current, col, rank, out, out_lo, stash, win, smin, smax, copies, copy)
        if HIER:
            cuda.syncthreads()
            lo = smin[0]
            n = (smax[0] - lo + 1) * rank
            for e in range(tid, n, TPB):
                srow = lo + e // rank
                r = e % rank
                val = stash[srow, r]
                if val != 0:
                    cuda.atomic.add(copies, (copy, win + srow - out_lo, r), val)

    if POISSON:

        def mttkrp_tiles_poisson(
            index,
            values,
            tile_start,
            tile_end,
            tile_base,
            tile_lo,
            shift,
            mask,
            F,
            offs,
            mode,
            rank,
            out,
            out_lo,
            copies,
            eps,
        ):
            """CP-APR's Phi of one tile per thread block: the arguments of :func:`mttkrp_tiles`
            (``F``'s target-mode rows hold ``B``) and ``eps``. Per nonzero the lane group forms its
            columns of the Khatri-Rao row ``k`` once, sums ``B[i_n, r] k_r`` over them and
            exchanges the sums (the model value ``m``), and adds ``x / max(m, eps) * k``."""
            tiles(
                index,
                values,
                tile_start,
                tile_end,
                tile_base,
                tile_lo,
                shift,
                mask,
                F,
                offs,
                mode,
                rank,
                out,
                out_lo,
                copies,
                eps,
            )

        return mttkrp_tiles_poisson

    def mttkrp_tiles(
        index, values, tile_start, tile_end, tile_base, tile_lo, shift, mask, F, offs, mode, rank, out, out_lo, copies
    ):
        """MTTKRP of one tile per thread block.

        index : uint64 (nnz,)            re-encoded BLCO indices
        values : float (nnz,)            nonzero values
        tile_start, tile_end : int64 (T,) nonzero range of each tile (inside one format block)
        tile_base : int64 (T, N)         the tile's block base coordinates
        tile_lo : int64 (T, N)           the smallest index per mode inside the tile's work item
                                         (hierarchical: the first row of the tile's stash window)
        shift : int64 (N,), mask : uint64 (N,)   BLCO field layout
        F : float (sum_m I_m, R)         stacked factor matrices, row-major
        offs : int64 (N,)                first row of each mode in F
        mode, rank : int64               target mode, R
        out : float (rows, R)            output rows ``out_lo ..`` of the target mode (added to)
        copies : float (K, rows, R)      hierarchical: zeroed global copies (unused for register)
        """
        tiles(
            index,
            values,
            tile_start,
            tile_end,
            tile_base,
            tile_lo,
            shift,
            mask,
            F,
            offs,
            mode,
            rank,
            out,
            out_lo,
            copies,
            0,
        )

    return mttkrp_tiles


def merge_copies_kernel(copies, out):
    """out[i, r] += sum over k of copies[k, i, r] (step 7 of figure 5.1); one thread per entry."""
    e = cuda.grid(1)
    rows = out.shape[0]
    R = out.shape[1]
    if e < rows * R:
        i = e // R
        r = e % R
        s = copies[0, i, r]
        for k in range(1, copies.shape[0]):
            s += copies[k, i, r]
        out[i, r] += s


_KERNELS: dict[KernelConfig, Any] = {}
_MERGE = None


def kernel_source(cfg: KernelConfig):
    """The uncompiled kernel function of ``cfg`` (for ``cuda.compile_ptx``)."""
    return _make(cfg)


def mttkrp_kernel(cfg: KernelConfig):
    """The compiled (lazily specialized by argument types) kernel of ``cfg``."""
    if cfg not in _KERNELS:
        _KERNELS[cfg] = cuda.jit(_make(cfg))
    return _KERNELS[cfg]


def merge_kernel():
    global _MERGE
    if _MERGE is None:
        _MERGE = cuda.jit(merge_copies_kernel)
    return _MERGE


def ptx_signature(cfg: KernelConfig):
    """The argument types of the ``cfg`` kernel, for ``cuda.compile_ptx`` (a Poisson kernel's
    ``eps`` last, in the kernel's float type)."""
    from numba import float32, float64, int64, types, uint64

    ft = float32 if cfg.dtype == "float32" else float64
    a1 = lambda t: types.Array(t, 1, "C")  # noqa: E731
    a2 = lambda t: types.Array(t, 2, "C")  # noqa: E731
    a3 = lambda t: types.Array(t, 3, "C")  # noqa: E731
    args = (
        a1(uint64),
        a1(ft),
        a1(int64),
        a1(int64),
        a2(int64),
        a2(int64),
        a1(int64),
        a1(uint64),
        a2(ft),
        a1(int64),
        int64,
        int64,
        a2(ft),
        int64,
        a3(ft),
    )
    return types.void(*args, ft) if cfg.poisson else types.void(*args)
