"""Matrix-free dense MTTKRP on GPUs (numba.cuda): seed 002's ELEM, SLICE and TILE.

Kokkos' hierarchy maps onto CUDA as in the seed: a thread block is a *league*, ``threadIdx.y``
picks a *team* inside it and ``threadIdx.x`` a *lane*; a block is (``lanes`` x ``teams``) with
``lanes * teams = 128`` (the seed's b_x = 128 / b_y). ``lanes`` is the next power of two >= R, at
most 32, so no lane idles at small ranks.

- **TILE / SLICE** (Algorithm 3): a team takes one work item, a (tile, slice) pair, in a
  grid-stride loop (target index fastest, so neighbouring teams read the same factor rows). Lane
  ``l`` owns columns ``j0 + l + lanes * f`` for ``f < FC`` of each column chunk (coalesced,
  row-major factor reads) and keeps their sums in registers. Per row of the tile (all loop modes
  but the innermost fixed) it forms the product of the outer modes' factor entries once; along the
  innermost mode it accumulates ``y * A_inner[i, col]``. At the end of a chunk it adds the tile
  sum into ``G[n, col]``: one float atomic per tile and column (TILE), or a plain add when a slice
  is one tile (SLICE: a team owns the slice's row).
- **ELEM** (Algorithm 2): a team takes a run of ``ELEM_RUN`` consecutive elements, finds the
  run's first multi-index with one division per mode and steps it like an odometer; every element
  adds its product into ``G`` with one atomic per column.

Columns past R are masked, so any rank works (the chunk loop handles R > lanes * FC).
Tile anchors use one division per loop mode per work item; no element needs a division.
Inputs are validated on the host (:mod:`.layout`) before any launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..gpu.device import cuda, require_gpu
from ..gpu.launch import lanes_for
from .layout import DenseLayout, check_call, check_finite_factors, check_out, check_variant, layout, stack_factors
from .tile import dense_tile_width, gpu_middle_cache

THREADS = 128  # lanes x teams per block (the seed's block of (4, 32) for R >= 32)
MAX_FC = 4  # register columns per lane and chunk
ELEM_RUN = 32  # consecutive elements per ELEM team
MAX_BLOCKS = 65535 * 16


@dataclass(frozen=True)
class DenseGpuConfig:
    """Compile-time parameters of one dense GPU kernel."""

    order: int  # d, 3..6
    lanes: int  # threads along the columns (power of two <= 32)
    fc: int  # register columns per lane and chunk
    dtype: str = "float64"
    kind: str = "tile"  # "tile" (TILE and SLICE) or "elem"

    @classmethod
    def for_rank(cls, order: int, rank: int, dtype: str = "float64", kind: str = "tile") -> "DenseGpuConfig":
        lanes = lanes_for(rank)
        return cls(int(order), lanes, max(1, min(MAX_FC, math.ceil(int(rank) / lanes))), str(dtype), kind)

    def __post_init__(self) -> None:
        if not 3 <= self.order <= 6:
            raise ValueError(f"dense GPU kernels take orders 3 to 6, got {self.order}")
        if self.lanes not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"lanes must be a power of two up to 32, got {self.lanes}")
        if not 1 <= self.fc <= MAX_FC:
            raise ValueError(f"fc must be 1..{MAX_FC}, got {self.fc}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.kind not in ("tile", "elem"):
            raise ValueError(f"kind must be 'tile' or 'elem', got {self.kind!r}")

    @property
    def teams(self) -> int:
        return max(1, THREADS // self.lanes)


def _make_tile(cfg: DenseGpuConfig):
    D = cfg.order - 1
    LANES = cfg.lanes
    FC = cfg.fc
    TEAMS = cfg.teams
    from numba import float32, float64

    nbt = float32 if cfg.dtype == "float32" else float64

    def dense_tile(flat, lshp, lst, loffs, kst, nk, width, rank, atomic, F, out):
        """TILE (SLICE when a slice is one tile and ``atomic`` is 0) for one team per work item.

        flat : float (N,)          block in memory order
        lshp, lst, loffs : int64 (D,)   per loop level (outermost first): length, element stride,
                                   first row in F
        kst, nk : int64            element stride and length of the target mode
        width : int64              tile width in every loop mode
        rank : int64               R
        atomic : int64             1: atomic adds into ``out``; 0: plain adds (a team owns the row)
        F : float (rows, R)        stacked factor rows, row-major
        out : float (nk, R)        added to
        """
        lane = cuda.threadIdx.x
        team = cuda.threadIdx.y
        lo = cuda.local.array(D, dtype=np.int64)
        hi = cuda.local.array(D, dtype=np.int64)
        idx = cuda.local.array(D, dtype=np.int64)
        acc = cuda.local.array(FC, dtype=nbt)
        t = cuda.local.array(FC, dtype=nbt)
        pre = cuda.local.array(FC, dtype=nbt)
        T = np.int64(1)
        for lev in range(D):
            T *= (lshp[lev] + width - 1) // width
        nitems = T * nk
        q = np.int64(cuda.blockIdx.x) * TEAMS + team
        step = np.int64(cuda.gridDim.x) * TEAMS
        while q < nitems:
            n = q % nk
            tt = q // nk
            for lev in range(D - 1, -1, -1):
                ntl = (lshp[lev] + width - 1) // width
                c0 = (tt % ntl) * width
                tt //= ntl
                lo[lev] = c0
                hi[lev] = min(c0 + width, lshp[lev])
            base = n * kst
            sin = lst[D - 1]
            rin = loffs[D - 1]
            for j0 in range(0, rank, LANES * FC):
                for f in range(FC):
                    acc[f] = 0
                for lev in range(D - 1):
                    idx[lev] = lo[lev]
                while True:
                    off = base
                    for lev in range(D - 1):
                        off += idx[lev] * lst[lev]
                    for f in range(FC):
                        col = j0 + lane + LANES * f
                        p = nbt(0)
                        if col < rank:
                            p = nbt(1)
                            for lev in range(D - 1):
                                p *= F[loffs[lev] + idx[lev], col]
                        pre[f] = p
                        t[f] = 0
                    for i in range(lo[D - 1], hi[D - 1]):
                        y = flat[off + i * sin]
                        for f in range(FC):
                            col = j0 + lane + LANES * f
                            if col < rank:
                                t[f] += y * F[rin + i, col]
                    for f in range(FC):
                        acc[f] += pre[f] * t[f]
                    lev = D - 2
                    while lev >= 0:
                        idx[lev] += 1
                        if idx[lev] < hi[lev]:
                            break
                        idx[lev] = lo[lev]
                        lev -= 1
                    if lev < 0:
                        break
                for f in range(FC):
                    col = j0 + lane + LANES * f
                    if col < rank:
                        if atomic:
                            cuda.atomic.add(out, (n, col), acc[f])
                        else:
                            out[n, col] += acc[f]
            q += step

    return dense_tile


def _make_elem(cfg: DenseGpuConfig):
    d = cfg.order
    LANES = cfg.lanes
    FC = cfg.fc
    TEAMS = cfg.teams
    RUN = ELEM_RUN

    def dense_elem(flat, shp, offs, k, rank, F, out):
        """ELEM: a team per run of ``ELEM_RUN`` consecutive elements, one atomic per element and
        column. flat : float (N,) in memory order; shp, offs : int64 (d,) canonical lengths and
        first rows in F (the target's unused); k : target mode; rank : R; out : float (I_k, R)."""
        lane = cuda.threadIdx.x
        team = cuda.threadIdx.y
        idx = cuda.local.array(d, dtype=np.int64)
        N = flat.shape[0]
        nruns = (N + RUN - 1) // RUN
        g = np.int64(cuda.blockIdx.x) * TEAMS + team
        step = np.int64(cuda.gridDim.x) * TEAMS
        while g < nruns:
            start = g * RUN
            end = min(N, start + RUN)
            rem = start
            for c in range(d - 1, -1, -1):
                idx[c] = rem % shp[c]
                rem //= shp[c]
            for e in range(start, end):
                y = flat[e]
                n = idx[k]
                for j0 in range(0, rank, LANES * FC):
                    for f in range(FC):
                        col = j0 + lane + LANES * f
                        if col < rank:
                            p = y
                            for c in range(d):
                                if c != k:
                                    p *= F[offs[c] + idx[c], col]
                            cuda.atomic.add(out, (n, col), p)
                c = d - 1
                while c >= 0:
                    idx[c] += 1
                    if idx[c] < shp[c]:
                        break
                    idx[c] = 0
                    c -= 1
            g += step

    return dense_elem


_KERNELS: dict[DenseGpuConfig, Any] = {}


def kernel_source(cfg: DenseGpuConfig):
    """The uncompiled kernel function of ``cfg`` (for ``cuda.compile_ptx``)."""
    return _make_elem(cfg) if cfg.kind == "elem" else _make_tile(cfg)


def dense_kernel(cfg: DenseGpuConfig):
    if cfg not in _KERNELS:
        _KERNELS[cfg] = cuda.jit(kernel_source(cfg))
    return _KERNELS[cfg]


def ptx_signature(cfg: DenseGpuConfig):
    """Argument types of the ``cfg`` kernel, for ``cuda.compile_ptx``."""
    from numba import float32, float64, int64, types

    ft = float32 if cfg.dtype == "float32" else float64
    a1 = lambda t: types.Array(t, 1, "C")  # noqa: E731
    a2 = lambda t: types.Array(t, 2, "C")  # noqa: E731
    if cfg.kind == "elem":
        return types.void(a1(ft), a1(int64), a1(int64), int64, int64, a2(ft), a2(ft))
    return types.void(a1(ft), a1(int64), a1(int64), a1(int64), int64, int64, int64, int64, int64, a2(ft), a2(ft))


def ptx_variants() -> list[tuple[str, object, object]]:
    """(name, kernel function, signature) of the dense kernels for ``ptx_report``: TILE/SLICE for
    orders 3-6 at the most register columns per lane, both dtypes, a small-rank form, and ELEM."""
    cfgs = [DenseGpuConfig.for_rank(d, 500, "float64") for d in range(3, 7)]
    cfgs += [
        DenseGpuConfig.for_rank(4, 500, "float32"),
        DenseGpuConfig.for_rank(4, 10, "float64"),
        DenseGpuConfig.for_rank(4, 32, "float64", "elem"),
    ]
    return [
        (f"dense {c.kind} N={c.order} lanes={c.lanes} fc={c.fc} {c.dtype}", kernel_source(c), ptx_signature(c))
        for c in cfgs
    ]


def _is_device(a) -> bool:
    """A numba device array (or the simulator's stand-in); CuPy and other CUDA-array-interface
    arrays are wrapped by :func:`_as_device` first."""
    return not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host")


def _as_device(a):
    if not isinstance(a, np.ndarray) and not hasattr(a, "copy_to_host") and hasattr(a, "__cuda_array_interface__"):
        return cuda.as_cuda_array(a)
    return a


def _device_flat(block) -> tuple[Any, tuple[int, ...]]:
    """(flat device view, memory order) of a C- or F-contiguous device block."""
    d = len(block.shape)
    if block.is_c_contiguous():
        return block.ravel(order="C"), tuple(range(d))
    if block.is_f_contiguous():
        return block.ravel(order="F"), tuple(range(d - 1, -1, -1))
    from ...errors import DenseArrayError

    raise DenseArrayError("a device block must be C- or F-contiguous")


def _device_stack(factors, lay: DenseLayout, origin) -> Any:
    """Stack device factor rows on the device (device-to-device copies)."""
    total = int(sum(int(lay.shape[c]) for c in range(len(lay.perm)) if c != lay.mode))
    dF = cuda.device_array((max(total, 1), lay.rank), dtype=lay.dtype)
    for c, m in enumerate(lay.perm):
        if c == lay.mode:
            continue
        o = int(lay.offs[c])
        b = int(lay.shape[c])
        dF[o : o + b].copy_to_device(factors[m][origin[m] : origin[m] + b])
    return dF


def dense_mttkrp_gpu(
    block,
    factors: Sequence,
    mode: int,
    *,
    origin: Sequence[int] | None = None,
    out=None,
    variant: str = "tile",
    tile: int | None = None,
    stream=0,
):
    """Mode-``mode`` dense MTTKRP on the GPU; the same contract as
    :func:`tensorflow_ooc.kernels.dense.cpu.dense_mttkrp`.

    ``block`` and ``factors`` may be host arrays (copied to the device) or numba device arrays.
    The result is a host array, unless ``out`` is a device array: then the contribution is added
    into it on the device and ``out`` is returned. A host ``out`` is added to and returned.
    ``tile=None`` takes Eq. 6 with the device's L1 size and resident teams per SM.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((3, 4, 2))
    >>> A = [rng.standard_normal((s, 2)) for s in X.shape]
    >>> G = dense_mttkrp_gpu(X, A, 2)                                  # doctest: +SKIP
    >>> bool(np.allclose(G, np.einsum("ijk,ir,jr->kr", X, A[0], A[1])))  # doctest: +SKIP
    True
    """
    require_gpu()
    check_variant(variant, tile)
    block = _as_device(block)
    factors = [_as_device(f) for f in factors]
    if out is not None:
        out = _as_device(out)
    if _is_device(block):
        origin, rank = check_call(block.shape, block.dtype, True, factors, mode, origin)
        flat, perm = _device_flat(block)
    else:
        from .cpu import host_flat

        if not isinstance(block, np.ndarray):
            raise TypeError(f"block must be a numpy.ndarray or a device array, got {type(block).__name__}")
        origin, rank = check_call(block.shape, block.dtype, True, factors, mode, origin)
        flat_host, perm = host_flat(block)
        flat = cuda.to_device(flat_host, stream=stream) if flat_host.shape[0] else None
    shape = tuple(int(s) for s in block.shape)
    lay = layout(shape, perm, mode, rank, block.dtype)
    rows = shape[mode]
    dtype = np.dtype(block.dtype)
    if out is not None:
        check_out(out, rows, rank, dtype)
    dev_out = out is not None and _is_device(out)
    if dev_out and not out.is_c_contiguous():
        from ...errors import DenseArrayError

        raise DenseArrayError("a device out must be C-contiguous")
    if int(np.prod(shape)) == 0:
        return out if out is not None else np.zeros((rows, rank), dtype=dtype)
    if any(_is_device(f) for f in factors):
        dF = _device_stack(factors, lay, origin)
    else:
        F = stack_factors(factors, lay, origin)
        check_finite_factors(F)
        dF = cuda.to_device(F, stream=stream)
    if dev_out:
        d_out = out
    else:
        d_out = cuda.to_device(np.zeros((rows, rank), dtype=dtype), stream=stream)
    kind = "elem" if variant == "elem" else "tile"
    cfg = DenseGpuConfig.for_rank(len(shape), rank, dtype.name, kind)
    kern = dense_kernel(cfg)
    threads = (cfg.lanes, cfg.teams)
    if kind == "elem":
        nwork = -(-int(np.prod(shape)) // ELEM_RUN)
        blocks = max(1, min(MAX_BLOCKS, -(-nwork // cfg.teams)))
        kern[blocks, threads, stream](
            flat,
            cuda.to_device(lay.shape, stream=stream),
            cuda.to_device(lay.offs, stream=stream),
            np.int64(lay.mode),
            np.int64(rank),
            dF,
            d_out,
        )
    else:
        loop = lay.loop.tolist()
        if variant == "slice":
            width = int(lay.shape.max())
        elif tile is not None:
            width = int(tile)
        else:
            size, sharing = gpu_middle_cache()
            width = dense_tile_width(shape, rank, dtype.itemsize, cache_bytes=size, tiles_per_cache=sharing)
        ntile = 1
        for c in loop:
            ntile *= -(-int(lay.shape[c]) // width)
        nwork = ntile * rows
        blocks = max(1, min(MAX_BLOCKS, -(-nwork // cfg.teams)))
        lshp = np.array([lay.shape[c] for c in loop], dtype=np.int64)
        lst = np.array([lay.strides[c] for c in loop], dtype=np.int64)
        loffs = np.array([lay.offs[c] for c in loop], dtype=np.int64)
        kern[blocks, threads, stream](
            flat,
            cuda.to_device(lshp, stream=stream),
            cuda.to_device(lst, stream=stream),
            cuda.to_device(loffs, stream=stream),
            np.int64(lay.strides[lay.mode]),
            np.int64(rows),
            np.int64(width),
            np.int64(rank),
            np.int64(ntile > 1),
            dF,
            d_out,
        )
    if dev_out:
        return out
    result = d_out.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()
    if out is not None:
        out += result
        return out
    return result
