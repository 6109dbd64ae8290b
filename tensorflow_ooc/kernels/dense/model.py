"""Performance model of the dense MTTKRP (seed 002, section IV-B) and a bandwidth probe.

For a tensor of N elements and order d, rank R, values of s_f bytes, target mode k and a
parallelisation that sums tiles of N_T elements (ELEM: N_T = 1, SLICE: N_T = N_S = N / I_k):

    f         = N R d                                              (model flops)
    m_inf     = s_f (N + R sum_n I_n)                              (infinite cache)
    m_0       = s_f (N + N R (d-1) + (N_S / N_T) I_k R)            (no cache)
    m_0,LM    = s_f (N + (N_S / N_T) I_k R) + s_f N R (d-1) / l    (factor rows from the middle cache)
    T_x       = f / tau_f + m_x / tau_m

``(N_S / N_T) I_k`` is the number of tile sums written to the output, i.e. the number of work items;
the functions take it as ``items`` so clipped tiles (a width that does not divide a mode) are
counted exactly (:func:`work_items`). The seed's Table III TILE rows are reproduced only with
``N_T = w``, the tile *width* (12 and 4 on its CPU, 6 and 4 on its GPU): with the tile volume
``N_T = w^(d-1)`` of Algorithm 3 they would come out within 0.001 s of the SLICE rows. The test
(``tests/test_dense_mttkrp.py``) passes ``items = N / w`` for them; the benchmark counts the
tiles this implementation really writes.

``tau_f`` is the peak flop rate, ``tau_m`` the memory bandwidth (bytes/s) and ``l`` the ratio of
middle-cache to memory bandwidth. :func:`measure_machine` estimates all three on this machine:
a BLAS GEMM for ``tau_f``, a parallel STREAM triad over a large array for ``tau_m`` and over an
L2-sized array for the cache bandwidth (as the seed does for its CPU).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import numba as nb
import numpy as np

from .tile import FALLBACK_L2_BYTES, cpu_caches


@dataclass(frozen=True)
class Machine:
    """Peak flop rate tau_f (flop/s), memory bandwidth tau_m (bytes/s), cache/memory bandwidth ratio l."""

    tau_f: float
    tau_m: float
    l: float

    def as_dict(self) -> dict:
        return asdict(self)


def model_flops(shape: Sequence[int], rank: int) -> float:
    """f = N R d."""
    return float(math.prod(int(s) for s in shape)) * int(rank) * len(shape)


def work_items(shape: Sequence[int], mode: int, variant: str, width: int | None = None) -> float:
    """(N_S / N_T) I_k: tile sums written to the output for ``variant`` ("elem", "slice", "tile" with
    tile width ``width``, tiles clipped at the edges of each mode)."""
    shape = [int(s) for s in shape]
    if variant == "elem":
        return float(math.prod(shape))
    if variant == "slice":
        return float(shape[mode])
    if variant != "tile" or width is None or width < 1:
        raise ValueError(f"work_items needs variant 'elem', 'slice' or 'tile' with a width, got {variant!r}, {width!r}")
    tiles = 1
    for m, s in enumerate(shape):
        if m != mode:
            tiles *= -(-s // int(width))
    return float(tiles * shape[mode])


def m_inf(shape: Sequence[int], rank: int, itemsize: int) -> float:
    """Bytes moved with an infinite cache: the tensor once, every factor matrix and the output once."""
    return itemsize * (float(math.prod(int(s) for s in shape)) + int(rank) * sum(int(s) for s in shape))


def m_0(shape: Sequence[int], rank: int, itemsize: int, items: float) -> float:
    """Bytes moved with no cache: the tensor, d-1 factor rows per element, one output row per work item."""
    N = float(math.prod(int(s) for s in shape))
    d = len(shape)
    return itemsize * (N + N * rank * (d - 1) + items * rank)


def m_0_lm(shape: Sequence[int], rank: int, itemsize: int, items: float, l: float) -> float:
    """Bytes moved when only the factor rows hit the middle cache (at l times memory bandwidth)."""
    N = float(math.prod(int(s) for s in shape))
    d = len(shape)
    return itemsize * (N + items * rank) + itemsize * N * rank * (d - 1) / float(l)


def predict(
    shape: Sequence[int],
    rank: int,
    itemsize: int,
    mode: int,
    variant: str,
    machine: Machine,
    width: int | None = None,
    items: float | None = None,
) -> dict:
    """Model flops, bytes and times T_0, T_0,LM, T_inf (seconds) for one mode.

    Examples
    --------
    >>> m = Machine(tau_f=34e12, tau_m=3.35 * 1024**4, l=10)          # the seed's H100 (Table II)
    >>> round(predict((401, 201, 12, 501), 32, 8, 0, "slice", m)["T_0"], 3)
    0.104
    """
    if items is None:
        items = work_items(shape, mode, variant, width)
    f = model_flops(shape, rank)
    mi = m_inf(shape, rank, itemsize)
    m0 = m_0(shape, rank, itemsize, items)
    mlm = m_0_lm(shape, rank, itemsize, items, machine.l)
    tf = f / machine.tau_f
    return {
        "flops": f,
        "m_inf": mi,
        "m_0": m0,
        "m_0_lm": mlm,
        "items": items,
        "T_inf": tf + mi / machine.tau_m,
        "T_0": tf + m0 / machine.tau_m,
        "T_0_lm": tf + mlm / machine.tau_m,
        "intensity": f / mi,
        "compute_bound": f / mi > machine.tau_f / machine.tau_m,
    }


def predict_modes(
    shape: Sequence[int],
    rank: int,
    itemsize: int,
    variant: str,
    machine: Machine,
    width: int | None = None,
    items_per_mode: Sequence[float] | None = None,
) -> dict:
    """:func:`predict` averaged over all modes (the seed's Tables III and IV average over modes)."""
    rows = [
        predict(
            shape, rank, itemsize, k, variant, machine, width, None if items_per_mode is None else items_per_mode[k]
        )
        for k in range(len(shape))
    ]
    keys = ("flops", "m_inf", "m_0", "m_0_lm", "items", "T_inf", "T_0", "T_0_lm", "intensity")
    out = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    out["compute_bound"] = bool(rows[0]["compute_bound"])
    return out


def gflops(flops: float, seconds: float) -> float:
    """The seed's throughput unit: f / t / 1024^3."""
    return flops / seconds / 1024.0**3


# --- bandwidth and flop-rate probes ------------------------------------------------------------


@nb.njit(parallel=True, nogil=True, cache=True)
def _triad(a, b, c, s, nthreads, reps):
    """Each thread sweeps its own segment ``reps`` times (one parallel launch per timing, so small
    cache-sized arrays measure the cache, not the launch); a and b swap roles every sweep."""
    n = a.shape[0] // nthreads
    for t in nb.prange(nthreads):
        lo = t * n
        hi = lo + n
        x = a
        y = b
        for _ in range(reps):
            for i in range(lo, hi):
                x[i] = y[i] + s * c[i]
            x, y = y, x


def stream_triad(nbytes: int, repeats: int = 5, per_thread: bool = False) -> float:
    """Best STREAM-triad bandwidth in bytes/s (24 bytes counted per element: two reads, one write)
    over ``repeats`` timings with all numba threads. ``nbytes`` is the footprint of the three arrays
    in all, or per thread with ``per_thread`` (for a cache-sized probe)."""
    threads = nb.get_num_threads()
    n = max(512, int(nbytes) // 24) * (threads if per_thread else 1)
    n -= n % threads
    a = np.zeros(n)
    b = np.ones(n)
    c = np.full(n, 1e-9)
    reps = max(1, int((256 << 20) // (24 * n)))  # small arrays: many sweeps per timing
    _triad(a, b, c, 0.5, threads, 1)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        _triad(a, b, c, 0.5, threads, reps)
        best = min(best, time.perf_counter() - t0)
    return 24.0 * (n // threads * threads) * reps / best


def gemm_rate(n: int = 1024, repeats: int = 3) -> float:
    """Best float64 GEMM rate (flop/s) of NumPy's BLAS on n x n matrices: this machine's tau_f."""
    a = np.random.default_rng(0).standard_normal((n, n))
    b = a.T.copy()
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def measure_machine(memory_bytes: int | None = None, quick: bool = False) -> Machine:
    """tau_f, tau_m and l of this CPU: GEMM, triad over ``memory_bytes`` (default: 1 GiB or twice
    the last-level cache, at most a quarter of RAM; the seed: 2 GB) and over a third of each core's
    L2 per thread (the seed: 0.6 MB for a 2 MB L2). ``quick`` times a smaller GEMM."""
    caches = cpu_caches()
    l2 = caches.get(2, (FALLBACK_L2_BYTES, 1))[0]
    if memory_bytes is None:
        llc = max((size for size, _ in caches.values()), default=0)
        memory_bytes = max(1 << 30, 2 * llc)
        try:
            memory_bytes = min(memory_bytes, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)
        except (ValueError, OSError, AttributeError):
            pass
    tau_m = stream_triad(memory_bytes, repeats=3)
    cache_bw = stream_triad(max(l2 * 3 // 10, 48 << 10), repeats=5, per_thread=True)
    tau_f = gemm_rate(1024 if quick else 2048)
    return Machine(tau_f=tau_f, tau_m=tau_m, l=max(1.0, cache_bw / tau_m))
