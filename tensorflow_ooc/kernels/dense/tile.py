"""Tile width of the dense TILE MTTKRP: the heuristic of seed 002, Eq. 6, with this machine's caches.

    N_T = min{ (((s_LM / 4) / (s_f * c / 2)) ** (1 / (d - 1))) ** (d - 1),  (min_n I_n) ** (d - 1) }

``s_LM`` is the middle cache level in bytes (the per-core L2 on a CPU, the per-SM L1 on a GPU),
``s_f`` the size of one value and ``c`` the number of tiles that share one cache unit at a time
(the hardware threads sharing an L2 on a CPU; on a GPU the teams resident on one SM at the seed's
50 % occupancy). The tile *width* is the integer root, ``w = floor(((s_LM/4)/(s_f c/2)) ** (1/(d-1)))``,
capped by the shortest mode. Modes of length one are left out of the cap: a tile always spans
them whole, and capping by them would shrink every tile to one element.

The rank does not enter Eq. 6 (the seed finds it valid for most ranks); it is logged with the width.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

FALLBACK_L2_BYTES = 1 << 20  # when the OS reports no cache sizes
GPU_OCCUPANCY = 0.5  # the seed's conservative occupancy assumption (section IV-C1)

_SIZE_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    if text and text[-1] in _SIZE_SUFFIX:
        return int(text[:-1]) * _SIZE_SUFFIX[text[-1]]
    return int(text)


def _count_cpus(cpu_list: str) -> int:
    n = 0
    for part in cpu_list.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        n += (int(b) - int(a) + 1) if b else 1
    return n


@functools.lru_cache(maxsize=1)
def cpu_caches() -> dict[int, tuple[int, int]]:
    """Data/unified caches of CPU 0 as {level: (bytes, cpus sharing it)} from sysfs (Linux), else
    from ``os.sysconf`` (level 2 only); {} when the OS reports neither."""
    out: dict[int, tuple[int, int]] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in sorted(root.glob("index*")):
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            level = int((idx / "level").read_text())
            size = _parse_size((idx / "size").read_text())
            shared = _count_cpus((idx / "shared_cpu_list").read_text())
            out[level] = (size, max(1, shared))
    except (OSError, ValueError):
        out = {}
    if 2 not in out:
        try:
            size = int(os.sysconf("SC_LEVEL2_CACHE_SIZE"))
            if size > 0:
                out[2] = (size, 1)
        except (ValueError, OSError, AttributeError):
            pass
    return out


def cpu_middle_cache() -> tuple[int, int]:
    """(bytes, tiles sharing it) of the CPU's middle cache level: the L2 and the hardware threads
    sharing it (one tile per thread at a time); ``FALLBACK_L2_BYTES`` and 1 when unknown."""
    caches = cpu_caches()
    if 2 in caches:
        return caches[2]
    return FALLBACK_L2_BYTES, 1


def gpu_middle_cache(device=None) -> tuple[int, int]:
    """(bytes, tiles sharing it) of a GPU's middle cache level: the per-SM L1/shared memory
    (device attribute ``MAX_SHARED_MEMORY_PER_MULTIPROCESSOR``, rounded up to the unified L1
    size of 256 KiB on cc 9.0 / 192 KiB on cc 8.0) and the 32-lane teams resident per SM at
    ``GPU_OCCUPANCY`` (32 on an H100, as in the seed)."""
    from ..gpu.device import simulator_enabled

    if device is None and simulator_enabled():
        return 256 << 10, 32
    if device is None:
        from ..gpu.device import cuda

        device = cuda.get_current_device()
    smem = int(getattr(device, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", 228 << 10))
    cc = getattr(device, "compute_capability", (9, 0))
    l1 = max(smem, (256 << 10) if tuple(cc) >= (9, 0) else (192 << 10))
    threads = int(getattr(device, "MAX_THREADS_PER_MULTIPROCESSOR", 2048))
    return l1, max(1, int(threads / 32 * GPU_OCCUPANCY))


def eq6_width(order: int, itemsize: int, cache_bytes: int, tiles_per_cache: int) -> int:
    """The uncapped tile width of Eq. 6: the integer (d-1)-th root of (s_LM/4) / (s_f c/2)."""
    volume = (cache_bytes / 4.0) / (itemsize * tiles_per_cache / 2.0)
    w = int(math.floor(volume ** (1.0 / (order - 1)) + 1e-9))
    return max(1, w)


def dense_tile_width(
    shape: Sequence[int], rank: int, itemsize: int, cache_bytes: int | None = None, tiles_per_cache: int | None = None
) -> int:
    """Tile width for the TILE MTTKRP on a dense tensor of ``shape`` (seed 002, Eq. 6).

    Parameters
    ----------
    shape : sequence of int
        Shape of the tensor (or chunk) the kernel runs on; order 3 to 6.
    rank : int
        CP rank (logged; Eq. 6 does not depend on it).
    itemsize : int
        Bytes per value (4 or 8).
    cache_bytes, tiles_per_cache : int, optional
        Middle cache level in bytes and tiles sharing it; default: this machine's per-core L2 and
        the hardware threads sharing it, read from the OS.

    Returns
    -------
    int
        Width ``w >= 1``; tiles are ``w`` long in every mode except the target mode.

    Examples
    --------
    >>> dense_tile_width((401, 201, 12, 501), 32, 8, cache_bytes=2 << 20, tiles_per_cache=1)
    12
    """
    shape = tuple(int(s) for s in shape)
    if cache_bytes is None:
        cache_bytes, shared = cpu_middle_cache()
        if tiles_per_cache is None:
            tiles_per_cache = shared
    if tiles_per_cache is None:
        tiles_per_cache = 1
    return _width(shape, int(rank), int(itemsize), int(cache_bytes), int(tiles_per_cache))


@functools.lru_cache(maxsize=256)
def _width(shape: tuple[int, ...], rank: int, itemsize: int, cache_bytes: int, tiles_per_cache: int) -> int:
    """Eq. 6, capped; logged once per distinct call (a streamed array asks once per chunk)."""
    order = len(shape)
    w = eq6_width(max(order, 2), int(itemsize), int(cache_bytes), int(tiles_per_cache))
    longer = [s for s in shape if s > 1]
    cap = min(longer) if longer else 1
    width = max(1, min(w, cap))
    log.info(
        "dense TILE width %d for shape %s, rank %d, %d-byte values (Eq. 6: %d from %d-byte cache "
        "shared by %d tiles; shortest mode %d)",
        width,
        tuple(shape),
        int(rank),
        int(itemsize),
        w,
        int(cache_bytes),
        int(tiles_per_cache),
        cap,
    )
    return width
