"""Warp data exchange for the GPU kernels, in two interchangeable forms.

The processing phase of BLCO's MTTKRP (seed 001, section 5.1.1) groups the 32 nonzeros of a
warp tile by target row with warp-level exchange. On hardware that is ``match.any``, ``vote`` and
``shfl``; the CUDA simulator has none of them, so each helper also has a shared-memory form with
the same signature. A kernel is built against one form (``exchange="intrinsics"|"shared"``) and
never branches on it at run time.

Every helper takes ``(..., lane, scratch)`` where ``scratch`` is the calling warp's row of an
int64 shared array of 32 entries; the intrinsic forms ignore it. The shared forms synchronize with
``syncthreads`` (the simulator has no ``syncwarp``), so all threads of the block must call a helper
the same number of times: the kernels call them unconditionally, outside any data-dependent branch.
"""

from __future__ import annotations

from types import SimpleNamespace

from .device import cuda, simulator_enabled

FULL_MASK = 0xFFFFFFFF
EXCHANGES = ("intrinsics", "shared")
_FORMS: dict[str, SimpleNamespace] = {}


def _intrinsic_form() -> SimpleNamespace:
    @cuda.jit(device=True, inline=True)
    def match_any(key, lane, scratch):
        """Lanes whose ``key`` equals this lane's, as a 32-bit mask."""
        return cuda.match_any_sync(FULL_MASK, key)

    @cuda.jit(device=True, inline=True)
    def shfl_idx(value, src, lane, scratch):
        """``value`` of lane ``src``."""
        return cuda.shfl_sync(FULL_MASK, value, src)

    @cuda.jit(device=True, inline=True)
    def inclusive_scan(value, lane, scratch):
        """Sum of ``value`` over lanes ``0 .. lane`` (five shuffles up)."""
        d = 1
        while d < 32:
            y = cuda.shfl_up_sync(FULL_MASK, value, d)
            if lane >= d:
                value += y
            d *= 2
        return value

    @cuda.jit(device=True, inline=True)
    def sync_tile():
        cuda.syncwarp(FULL_MASK)

    return SimpleNamespace(match_any=match_any, shfl_idx=shfl_idx, inclusive_scan=inclusive_scan, sync_tile=sync_tile)


def _shared_form() -> SimpleNamespace:
    @cuda.jit(device=True, inline=True)
    def match_any(key, lane, scratch):
        scratch[lane] = key
        cuda.syncthreads()
        m = 0
        for j in range(32):
            if scratch[j] == key:
                m |= 1 << j
        cuda.syncthreads()
        return m

    @cuda.jit(device=True, inline=True)
    def shfl_idx(value, src, lane, scratch):
        scratch[lane] = value
        cuda.syncthreads()
        out = scratch[src]
        cuda.syncthreads()
        return out

    @cuda.jit(device=True, inline=True)
    def inclusive_scan(value, lane, scratch):
        scratch[lane] = value
        cuda.syncthreads()
        out = 0
        for j in range(lane + 1):
            out += scratch[j]
        cuda.syncthreads()
        return out

    @cuda.jit(device=True, inline=True)
    def sync_tile():
        cuda.syncthreads()

    return SimpleNamespace(match_any=match_any, shfl_idx=shfl_idx, inclusive_scan=inclusive_scan, sync_tile=sync_tile)


def warp_exchange(kind: str) -> SimpleNamespace:
    """The helpers ``match_any``, ``shfl_idx``, ``inclusive_scan`` and ``sync_tile`` of one form."""
    if kind not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {kind!r}")
    if kind not in _FORMS:
        _FORMS[kind] = _intrinsic_form() if kind == "intrinsics" else _shared_form()
    return _FORMS[kind]


def default_exchange() -> str:
    """Intrinsics on hardware; the shared-memory form under the simulator, which lacks them."""
    return "shared" if simulator_enabled() else "intrinsics"
