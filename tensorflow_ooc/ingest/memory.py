"""Process memory: RSS readings and keeping freed memory from piling up in the C heap.

glibc raises its mmap threshold after large frees, so later large arrays come from the heap and
their memory is not returned; worker threads (zarr, blosc) each keep an arena. Out-of-core
conversion pins the threshold and trims the heap between buckets so RSS follows the working set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import psutil

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _libc():
    try:
        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "mallopt") else None
    except OSError:  # pragma: no cover - non-glibc platforms
        return None


_LIBC = _libc()


def rss() -> int:
    """Resident set size of this process, bytes."""
    return psutil.Process().memory_info().rss


def limit_heap_growth(mmap_threshold: int = 1 << 20, arenas: int = 2) -> None:
    """Serve allocations above ``mmap_threshold`` by mmap (returned on free) and cap the arenas."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        _LIBC.mallopt(_M_ARENA_MAX, arenas)


def trim() -> None:
    """Give freed heap memory back to the operating system."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
