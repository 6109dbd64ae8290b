"""The update's products ``A = M V^+`` and ``A^T A`` split by rows over the kernel's threads.

The update's algebra runs BLAS on one thread (``tensorflow_ooc.blas_threads``): threaded OpenBLAS
spins after each call on the cores the next MTTKRP needs. At high ranks that one thread is most
of the update (gen-skewed, 40000 x 100: 30 ms of a 57 ms update). Halves of the rows on two
threads of a pool that block, not spin, when idle take half of it (15 ms). A large product is
always computed in the same row blocks, whatever the thread count (OpenBLAS's result for a row
depends on where its block starts at some ranks), so one thread and several give the same bits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

# products of at least this many multiply-adds are split (40000 x 16 x 16 = 10 M: 0.9 -> 0.65 ms
# on two threads; a handoff costs tens of microseconds)
SPLIT_MIN_MADDS = 1 << 23
# the row blocks of a split product (a function of the shape only)
BLOCK_ROWS = 2048

_LOCK = threading.Lock()
_POOL: dict[int, ThreadPoolExecutor] = {}  # at most one, keyed by its worker count


def _pool(workers: int) -> ThreadPoolExecutor:
    with _LOCK:
        if not _POOL or max(_POOL) < workers:
            _POOL.clear()
            _POOL[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tfooc-update")
        return next(iter(_POOL.values()))


def _splits(n: int, madds: int) -> bool:
    """Whether a product over ``n`` rows of ``madds`` multiply-adds goes in row blocks."""
    return madds >= SPLIT_MIN_MADDS and n > BLOCK_ROWS


def _over_blocks(n: int, threads: int | None, block: Callable[[int, slice], None]) -> None:
    """``block(b, rows)`` for each fixed row block ``b`` of ``n`` rows (:data:`BLOCK_ROWS`),
    contiguous runs of blocks on ``threads`` threads (default: numba's thread count for this
    thread, the kernels' share), this thread taking the first."""
    threads = max(1, int(threads if threads is not None else numba.get_num_threads()))
    nblocks = -(-n // BLOCK_ROWS)
    # thread k takes blocks first[k] .. first[k + 1] - 1
    first = np.linspace(0, nblocks, min(threads, nblocks) + 1).astype(np.int64)

    def run(k: int) -> None:
        for b in range(first[k], first[k + 1]):
            block(b, slice(b * BLOCK_ROWS, min(n, (b + 1) * BLOCK_ROWS)))

    futures = [_pool(len(first) - 2).submit(run, k) for k in range(1, len(first) - 1)]
    run(0)
    for f in futures:
        f.result()


def matmul_rows(M: np.ndarray, W: np.ndarray, out: np.ndarray, threads: int | None = None) -> np.ndarray:
    """``out[...] = M @ W`` (M: I x R, W: R x R), split into row blocks over ``threads`` threads
    (default: numba's thread count for this thread, the kernels' share) where the product is
    large; BLAS runs on one thread in each.

    Examples
    --------
    >>> import numpy as np
    >>> M, W = np.ones((4, 2)), np.eye(2)
    >>> float(matmul_rows(M, W, np.empty((4, 2))).sum())
    8.0
    """
    n, r = M.shape
    if not _splits(n, n * r * W.shape[1]):
        return np.matmul(M, W, out=out)
    _over_blocks(n, threads, lambda b, rows: np.matmul(M[rows], W, out=out[rows]))
    return out


def gram_rows(A: np.ndarray, threads: int | None = None) -> np.ndarray:
    """``A.T @ A``; where the product is large (as in :func:`matmul_rows`), the sum in block order
    of each row block's Gram, the blocks' products spread over ``threads`` threads (the same
    bits on any thread count: a resumed run forms its Grams this way too).

    Examples
    --------
    >>> import numpy as np
    >>> gram_rows(np.ones((3, 2))).tolist()
    [[3.0, 3.0], [3.0, 3.0]]
    """
    n, r = A.shape
    if not _splits(n, n * r * r):
        return A.T @ A
    parts = np.empty((-(-n // BLOCK_ROWS), r, r), dtype=A.dtype)
    _over_blocks(n, threads, lambda b, rows: np.matmul(A[rows].T, A[rows], out=parts[b]))
    G = parts[0].copy()
    for b in range(1, parts.shape[0]):
        G += parts[b]
    return G
