"""BLAS on one thread for the mode updates' small products.

The update's algebra is tiny, and threaded BLAS keeps spinning on the cores the MTTKRP kernels
need next, so updates run BLAS on one thread (docs/EXECUTION.md, "Measurements").
threadpoolctl's ``ThreadpoolController.limit`` does so, but builds a limiter over every library
it found on each call: 13 us on a quiet core, 0.05-0.1 ms a call inside a CP-ALS sweep, three
to five calls an iteration. :func:`one_blas_thread` keeps the BLAS libraries' controllers and only
reads and sets their thread counts (about 1 us each).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from threadpoolctl import ThreadpoolController

_LOCK = threading.Lock()
_FOUND: tuple[int, list[Any]] = (-1, [])  # (len(sys.modules) at the search, the controllers)


def _blas_libraries() -> list[Any]:
    """The BLAS libraries' controllers, searched again only where modules were imported since
    the last search (a BLAS library is loaded by the import of an extension module: SciPy's
    comes with ``scipy.linalg``)."""
    global _FOUND
    loaded = len(sys.modules)
    if _FOUND[0] != loaded:
        with _LOCK:
            if _FOUND[0] != loaded:
                _FOUND = (loaded, list(ThreadpoolController().select(user_api="blas").lib_controllers))
    return _FOUND[1]


class one_blas_thread:  # named as the function it stands for: ``with one_blas_thread():``
    """Within the block every BLAS library found runs on one thread; each is set back to its
    own count after. A class rather than a generator: 2 us a block instead of 7."""

    __slots__ = ("changed",)

    def __enter__(self) -> None:
        self.changed = []
        for lib in _blas_libraries():
            n = lib.get_num_threads()
            if n != 1:
                lib.set_num_threads(1)
                self.changed.append((lib, n))

    def __exit__(self, *exc: object) -> None:
        for lib, n in self.changed:
            lib.set_num_threads(n)
