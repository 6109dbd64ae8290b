"""BLAS on one thread for the small dense algebra between the numba passes.

The updates, solves and sketches between kernels are tiny, and a threaded BLAS keeps its threads
spinning after each call on the cores the next MTTKRP needs (docs/EXECUTION.md, "Measurements").
Only ``limit`` contexts are used: threadpoolctl lets one thread at a time set a pthreads OpenBLAS's
process-wide pool and gives that ownership back when the thread's context ends; a bare
``set_num_threads`` keeps it, and every other thread's limit (a Dask worker's) then does nothing
(docs/KERNELS.md). So every stage goes through here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from threadpoolctl import ThreadpoolController

_controller: ThreadpoolController | None = None


def one_blas_thread(when: bool = True) -> AbstractContextManager:
    """A context in which every BLAS library the process has loaded runs on one thread
    (``when`` False: a context that changes nothing, for algebra large enough to use them all).

    Examples
    --------
    >>> import numpy as np
    >>> with one_blas_thread():
    ...     g = np.ones((4, 3)).T @ np.ones((4, 3))
    """
    global _controller
    if not when:
        return nullcontext()
    if _controller is None:  # made at first use, when the stages have loaded their BLAS libraries
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
