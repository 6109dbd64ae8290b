"""GPU kernels of FastTuckerPlus (numba.cuda; seed 003 section 4, Algorithms 4 and 5).

One warp processes one batch Psi of ``TILE = 16`` sampled entries at a time (the seed's M = 16),
looping over batches ``warp, warp + warps, ...``. Its tile products are the seed's tensor-core
tiles, emulated on CUDA cores with the tensor core's numerics: every input of a tile product is
rounded to fp16 and the products are accumulated in fp32 (WMMA 16x16x16 half precision with a
float accumulator). ``J`` and ``R`` are padded to multiples of 16 (zero columns of ``A``, zero
rows and columns of ``B``), so every product is a whole number of 16 x 16 tiles; padded entries
stay zero.

Per batch (shared memory per warp: the batch's ``A_Psi`` rows, its ``C_Psi``, the errors):
  1. lanes load the batch's rows of every mode (the seed's ``A_Psi^(n)``);
  2. ``C_Psi^(n) = A_Psi^(n) B^(n)`` (tile product), shared by every mode's ``D_Psi^(n)``;
  3. ``xhat = C_Psi^(1) . D_Psi^(1)``, ``e = x - xhat`` (lanes 0-15, one sample each);
  4. factor kernel: ``G = D_Psi^(n) B^(n)T`` (tile product, kept in shared memory), the sample's
     step (``lr``, or ``lr / (|g_s|^2 + delta)`` when normalized), then
     ``A_Psi^(n) += step (e * G - reg A_Psi^(n))``, the moves added to global memory by atomic
     adds: a row two samples of one batch share gets both moves, as on the CPU, and warps read
     rows without synchronization (Hogwild, as the seed);
     core kernel: each lane accumulates its fixed share of ``E_Psi^(n)T D_Psi^(n)`` with
     ``E = e * A_Psi`` (tile product) in registers over all its batches, and adds it to the
     global gradient once at the end (the seed's line 27, atomicAdd).

Warps of a block synchronize through the ``sync_tile`` helper of :mod:`..gpu.warp_exchange`
(``syncwarp`` on hardware, ``syncthreads`` in the simulator, which has no ``syncwarp``); every
thread calls it the same number of times. Inputs are trusted (the orchestration validates them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gpu.device import cuda
from ..gpu.warp_exchange import default_exchange, warp_exchange
from .fasttucker_cpu import NORMALIZED_DELTA

TILE = 16  # entries per batch and the WMMA tile edge
SHARED_BUDGET = 44 * 1024  # static shared memory per block, under the 48 KiB limit


def padded(k: int) -> int:
    """``k`` rounded up to a multiple of the 16-wide tile."""
    return TILE * max(1, math.ceil(int(k) / TILE))


@dataclass(frozen=True)
class FastTuckerConfig:
    """Compile-time parameters of one FastTuckerPlus kernel pair."""

    nmodes: int
    jp: int  # J padded to a multiple of 16
    rp: int  # R padded to a multiple of 16
    exchange: str = "intrinsics"
    warps: int = 0  # warps per block; 0: as many as fit SHARED_BUDGET, at most 4

    @classmethod
    def for_ranks(cls, nmodes: int, J: int, R: int, exchange: str | None = None, warps: int = 0) -> "FastTuckerConfig":
        return cls(int(nmodes), padded(J), padded(R), exchange or default_exchange(), warps)

    def __post_init__(self) -> None:
        if not 2 <= self.nmodes <= 8:
            raise ValueError(f"the FastTuckerPlus GPU kernels take 2 to 8 modes, got {self.nmodes}")
        if self.jp % TILE or self.rp % TILE or self.jp < TILE or self.rp < TILE:
            raise ValueError(f"padded ranks must be multiples of {TILE}, got J={self.jp}, R={self.rp}")
        if self.warp_shared_bytes > SHARED_BUDGET:
            raise ValueError(
                f"ranks J={self.jp}, R={self.rp} with {self.nmodes} modes need "
                f"{self.warp_shared_bytes} B of shared memory per warp, over {SHARED_BUDGET}"
            )

    @property
    def warp_shared_bytes(self) -> int:
        return 4 * TILE * self.nmodes * (2 * self.jp + self.rp) + 8 * TILE * self.nmodes + 8 * TILE

    @property
    def block_warps(self) -> int:
        return self.warps or max(1, min(4, SHARED_BUDGET // self.warp_shared_bytes))

    @property
    def grad_per_lane(self) -> int:
        """Core-gradient entries each lane accumulates in registers."""
        return math.ceil(self.nmodes * self.jp * self.rp / 32)


_KERNELS: dict[FastTuckerConfig, tuple] = {}


def kernel_sources(cfg: FastTuckerConfig):
    """The (factor kernel, core-gradient kernel) Python functions of ``cfg``, not yet compiled.

    Factor kernel ``(coords, values, order, offsets, A, B, J, lr, reg, normalized)``; core kernel
    ``(coords, values, order, offsets, A, B, J, grad)``: ``coords`` (n, N) int64, ``values`` (n,)
    float32, ``order`` (n,) int64 (the epoch's permutation), ``offsets`` (N,) int64, ``A``
    (rows, jp) float32, ``B`` (N, jp, rp) float32, ``J`` the unpadded rank, ``grad`` (N, jp, rp)
    float32 (accumulated into).
    """
    N, JP, RP = cfg.nmodes, cfg.jp, cfg.rp
    WARPS = cfg.block_warps
    GPL = cfg.grad_per_lane
    sync_tile = warp_exchange(cfg.exchange).sync_tile
    f16 = _f16()
    f32 = np.float32

    @cuda.jit(device=True, inline=True)
    def load_batch(coords, values, order, offsets, A, B, b, lane, rows, At, Ct, err):
        """Steps 1-3: the batch's rows, ``C_Psi``, errors (``err[s]`` 0 past the last entry)."""
        n_entries = order.shape[0]
        for idx in range(lane, TILE * N, 32):
            s = idx // N
            n = idx - s * N
            p = b * TILE + s
            rows[n, s] = offsets[n] + coords[order[p], n] if p < n_entries else -1
        sync_tile()
        for idx in range(lane, N * TILE * JP, 32):
            n = idx // (TILE * JP)
            s = (idx // JP) % TILE
            j = idx % JP
            row = rows[n, s]
            At[n, s, j] = A[row, j] if row >= 0 else f32(0.0)
        sync_tile()
        # tensor-core tile: fp16 inputs, fp32 accumulation
        for idx in range(lane, N * TILE * RP, 32):
            n = idx // (TILE * RP)
            s = (idx // RP) % TILE
            r = idx % RP
            acc = f32(0.0)
            for j in range(JP):
                acc += f32(f16(At[n, s, j])) * f32(f16(B[n, j, r]))
            Ct[n, s, r] = acc
        sync_tile()
        if lane < TILE:
            p = b * TILE + lane
            xhat = f32(0.0)
            for r in range(RP):
                prod = f32(1.0)
                for n in range(N):
                    prod *= Ct[n, lane, r]
                xhat += prod
            err[lane] = values[order[p]] - xhat if p < n_entries else f32(0.0)
        sync_tile()

    @cuda.jit(device=True, inline=True)
    def others(Ct, n, s, r):
        """``D_Psi^(n)[s, r] = prod_{k != n} C_Psi^(k)[s, r]``."""
        prod = f32(1.0)
        for k in range(N):
            if k != n:
                prod *= Ct[k, s, r]
        return prod

    def factor_kernel(coords, values, order, offsets, A, B, J, lr, reg, normalized):
        rows_all = cuda.shared.array((WARPS, N, TILE), np.int64)
        A_all = cuda.shared.array((WARPS, N, TILE, JP), np.float32)
        C_all = cuda.shared.array((WARPS, N, TILE, RP), np.float32)
        G_all = cuda.shared.array((WARPS, N, TILE, JP), np.float32)
        e_all = cuda.shared.array((WARPS, TILE), np.float32)
        step_all = cuda.shared.array((WARPS, TILE), np.float32)
        lane = cuda.threadIdx.x % 32
        w = cuda.threadIdx.x // 32
        rows, At, Ct, G, err, step = rows_all[w], A_all[w], C_all[w], G_all[w], e_all[w], step_all[w]
        n_batches = (order.shape[0] + TILE - 1) // TILE
        n_warps = cuda.gridDim.x * WARPS
        # every warp of the block runs the same number of rounds (sync_tile may be a block barrier)
        rounds = (n_batches + n_warps - 1) // n_warps
        for k in range(rounds):
            b = k * n_warps + cuda.blockIdx.x * WARPS + w
            active = b < n_batches
            load_batch(coords, values, order, offsets, A, B, b, lane, rows, At, Ct, err)
            if active:
                for idx in range(lane, N * TILE * JP, 32):
                    n = idx // (TILE * JP)
                    s = (idx // JP) % TILE
                    j = idx % JP
                    acc = f32(0.0)
                    if rows[n, s] >= 0 and j < J:
                        # (D_Psi^(n) B^(n)T)[s, j] as a tensor-core tile: fp16 inputs, fp32 sum
                        for r in range(RP):
                            acc += f32(f16(others(Ct, n, s, r))) * f32(f16(B[n, j, r]))
                    G[n, s, j] = acc
            sync_tile()
            if active and lane < TILE:
                # the sample's step: plain, or normalized by |g|^2 over all its rows (as on CPUs)
                g2 = f32(0.0)
                for n in range(N):
                    for j in range(JP):
                        g2 += G[n, lane, j] * G[n, lane, j]
                step[lane] = lr / (g2 + f32(NORMALIZED_DELTA)) if normalized else lr
            sync_tile()
            if active:
                for idx in range(lane, N * TILE * JP, 32):
                    n = idx // (TILE * JP)
                    s = (idx // JP) % TILE
                    j = idx % JP
                    row = rows[n, s]
                    if row >= 0 and j < J:
                        cuda.atomic.add(A, (row, j), step[s] * (err[s] * G[n, s, j] - reg * At[n, s, j]))
            sync_tile()

    def core_kernel(coords, values, order, offsets, A, B, J, grad):
        rows_all = cuda.shared.array((WARPS, N, TILE), np.int64)
        A_all = cuda.shared.array((WARPS, N, TILE, JP), np.float32)
        C_all = cuda.shared.array((WARPS, N, TILE, RP), np.float32)
        e_all = cuda.shared.array((WARPS, TILE), np.float32)
        lane = cuda.threadIdx.x % 32
        w = cuda.threadIdx.x // 32
        rows, At, Ct, err = rows_all[w], A_all[w], C_all[w], e_all[w]
        acc = cuda.local.array(GPL, np.float32)
        for q in range(GPL):
            acc[q] = f32(0.0)
        n_batches = (order.shape[0] + TILE - 1) // TILE
        n_warps = cuda.gridDim.x * WARPS
        rounds = (n_batches + n_warps - 1) // n_warps
        for k in range(rounds):
            b = k * n_warps + cuda.blockIdx.x * WARPS + w
            active = b < n_batches
            load_batch(coords, values, order, offsets, A, B, b, lane, rows, At, Ct, err)
            if active:
                # lane owns gradient entries lane, lane + 32, ... of (N, JP, RP): E^T D as a tile
                for q in range(GPL):
                    idx = lane + 32 * q
                    if idx < N * JP * RP:
                        n = idx // (JP * RP)
                        j = (idx // RP) % JP
                        r = idx % RP
                        part = f32(0.0)
                        for s in range(TILE):
                            part += f32(f16(err[s] * At[n, s, j])) * f32(f16(others(Ct, n, s, r)))
                        acc[q] -= part
            sync_tile()
        for q in range(GPL):
            idx = lane + 32 * q
            if idx < N * JP * RP:
                n = idx // (JP * RP)
                j = (idx // RP) % JP
                r = idx % RP
                if j < J:
                    cuda.atomic.add(grad, (n, j, r), acc[q])

    return factor_kernel, core_kernel


def _f16():
    from numba.types import float16

    return float16


def ptx_signatures(cfg: FastTuckerConfig):
    """numba signatures of the factor and core kernels (for :mod:`.ptx_report`)."""
    from numba import float32, int64, types

    i2 = types.Array(int64, 2, "C")
    i1 = types.Array(int64, 1, "C")
    f1 = types.Array(float32, 1, "C")
    f2 = types.Array(float32, 2, "C")
    f3 = types.Array(float32, 3, "C")
    return (
        types.void(i2, f1, i1, i1, f2, f3, int64, float32, float32, types.boolean),
        types.void(i2, f1, i1, i1, f2, f3, int64, f3),
    )


def ptx_variants() -> list[tuple[str, object, object]]:
    """(name, function, signature) of the variants :mod:`.ptx_report` compiles: orders 3-5 with
    16-wide tiles and order 3 with 32-wide tiles, factor and core kernels."""
    out = []
    for nmodes, jp, rp in ((3, 16, 16), (4, 16, 16), (5, 16, 16), (3, 32, 32)):
        cfg = FastTuckerConfig(nmodes, jp, rp, "intrinsics")
        for kind, fn, sig in zip(("factor", "core"), kernel_sources(cfg), ptx_signatures(cfg)):
            out.append((f"fasttucker {kind} N={nmodes} J={jp} R={rp}", fn, sig))
    return out


def kernels(cfg: FastTuckerConfig):
    """The compiled (factor, core) kernels of ``cfg`` (cached per process)."""
    if cuda is None:
        from ..gpu.device import require_gpu

        require_gpu()
    if cfg not in _KERNELS:
        fk, ck = kernel_sources(cfg)
        _KERNELS[cfg] = (cuda.jit(fk), cuda.jit(ck))
    return _KERNELS[cfg]


def _grid(cfg: FastTuckerConfig, n_entries: int, max_blocks: int | None) -> int:
    from ..gpu.device import sm_count

    n_batches = max(1, -(-n_entries // TILE))
    cap = max_blocks or 8 * sm_count()
    return max(1, min(cap, -(-n_batches // cfg.block_warps)))


def pad_model(A: np.ndarray, B: np.ndarray, cfg: FastTuckerConfig) -> tuple[np.ndarray, np.ndarray]:
    """Float32 copies of the stacked factors and core factors, padded to the tile sizes."""
    Ap = np.zeros((A.shape[0], cfg.jp), np.float32)
    Ap[:, : A.shape[1]] = A
    Bp = np.zeros((B.shape[0], cfg.jp, cfg.rp), np.float32)
    Bp[:, : B.shape[1], : B.shape[2]] = B
    return Ap, Bp


def factor_pass_gpu(
    coords: np.ndarray,
    values: np.ndarray,
    order: np.ndarray,
    offsets: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    lr: float,
    reg: float,
    *,
    normalized: bool = False,
    exchange: str | None = None,
    warps: int = 0,
    max_blocks: int | None = None,
) -> np.ndarray:
    """One factor pass on the GPU (batches of 16 in ``order``); returns the new stacked factors
    (float64, unpadded). Host arrays in, host arrays out: the device copies live for the call.
    ``normalized``: the normalized step of :func:`.fasttucker_cpu.factor_pass`."""
    N, J, R = B.shape
    cfg = FastTuckerConfig.for_ranks(N, J, R, exchange, warps)
    fk, _ = kernels(cfg)
    Ap, Bp = pad_model(A, B, cfg)
    d_A = cuda.to_device(Ap)
    fk[_grid(cfg, order.shape[0], max_blocks), 32 * cfg.block_warps](
        cuda.to_device(np.ascontiguousarray(coords, np.int64)),
        cuda.to_device(np.asarray(values, np.float32)),
        cuda.to_device(np.ascontiguousarray(order, np.int64)),
        cuda.to_device(np.asarray(offsets, np.int64)),
        d_A,
        cuda.to_device(Bp),
        np.int64(J),
        np.float32(lr),
        np.float32(reg),
        bool(normalized),
    )
    return d_A.copy_to_host()[:, :J].astype(np.float64)


def core_gradient_gpu(
    coords: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    *,
    exchange: str | None = None,
    warps: int = 0,
    max_blocks: int | None = None,
) -> np.ndarray:
    """The accumulated core gradient ``-sum e a^T d`` (N, J, R) over all entries, on the GPU."""
    N, J, R = B.shape
    cfg = FastTuckerConfig.for_ranks(N, J, R, exchange, warps)
    _, ck = kernels(cfg)
    Ap, Bp = pad_model(A, B, cfg)
    d_grad = cuda.to_device(np.zeros((N, cfg.jp, cfg.rp), np.float32))
    n = coords.shape[0]
    ck[_grid(cfg, n, max_blocks), 32 * cfg.block_warps](
        cuda.to_device(np.ascontiguousarray(coords, np.int64)),
        cuda.to_device(np.asarray(values, np.float32)),
        cuda.to_device(np.arange(n, dtype=np.int64)),
        cuda.to_device(np.asarray(offsets, np.int64)),
        cuda.to_device(Ap),
        cuda.to_device(Bp),
        np.int64(J),
        d_grad,
    )
    return d_grad.copy_to_host()[:, :J, :R].astype(np.float64)
