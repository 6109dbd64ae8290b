"""BLAS on one thread for the mode updates' small products.

The update's algebra is tiny, and threaded BLAS keeps spinning on the cores the MTTKRP kernels
need next, so updates run BLAS on one thread (docs/EXECUTION.md, "Measurements").
threadpoolctl's ``ThreadpoolController.limit`` does so, but builds a limiter over every library
it found on each call: 13 us on a quiet core, 0.05-0.1 ms a call inside a CP-ALS sweep, three
to five calls an iteration. :func:`one_blas_thread` keeps the BLAS libraries' controllers and only
reads and sets their thread counts (about 1 us each).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from threadpoolctl import ThreadpoolController

_LOCK = threading.Lock()
_LIBS: list[Any] | None = None


def _blas_libraries() -> list[Any]:
    """The BLAS libraries' controllers, found once (on first use: the libraries loaded by then)."""
    global _LIBS
    with _LOCK:
        if _LIBS is None:
            _LIBS = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return _LIBS


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Within the block every BLAS library found runs on one thread; each is set back to its
    own count after."""
    changed = []
    for lib in _blas_libraries():
        n = lib.get_num_threads()
        if n != 1:
            lib.set_num_threads(1)
            changed.append((lib, n))
    try:
        yield
    finally:
        for lib, n in changed:
            lib.set_num_threads(n)
