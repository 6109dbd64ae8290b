"""The update's product ``A = M V^+`` split by rows over the kernel's threads.

The update's algebra runs BLAS on one thread (``tensorflow_ooc.blas_threads``): threaded OpenBLAS
spins after each call on the cores the next MTTKRP needs. At high ranks that one thread is most
of the update (gen-skewed, 40000 x 100: 30 ms of a 57 ms update). Halves of the rows on two
threads of a pool that block, not spin, when idle take half of it (15 ms). A large product is
always computed in the same row blocks, whatever the thread count (OpenBLAS's result for a row
depends on where its block starts at some ranks), so one thread and several give the same bits.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

# products of at least this many multiply-adds are split (40000 x 16 x 16 = 10 M: 0.9 -> 0.65 ms
# on two threads; a handoff costs tens of microseconds)
SPLIT_MIN_MADDS = 1 << 23
# the row blocks of a split product (a function of the shape only)
BLOCK_ROWS = 2048

_LOCK = threading.Lock()
_POOL: list[ThreadPoolExecutor] = []


def _pool(workers: int) -> ThreadPoolExecutor:
    with _LOCK:
        if not _POOL or _POOL[0]._max_workers < workers:
            _POOL[:] = [ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tfooc-update")]
        return _POOL[0]


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
    if n * r * W.shape[1] < SPLIT_MIN_MADDS or n <= BLOCK_ROWS:
        return np.matmul(M, W, out=out)
    threads = max(1, int(threads if threads is not None else numba.get_num_threads()))
    nblocks = -(-n // BLOCK_ROWS)
    # thread k takes blocks first[k] .. first[k + 1] - 1, one GEMM a block
    first = np.linspace(0, nblocks, min(threads, nblocks) + 1).astype(np.int64)

    def blocks(k: int) -> None:
        for b in range(first[k], first[k + 1]):
            rows = slice(b * BLOCK_ROWS, min(n, (b + 1) * BLOCK_ROWS))
            np.matmul(M[rows], W, out=out[rows])

    futures = [_pool(len(first) - 2).submit(blocks, k) for k in range(1, len(first) - 1)] if len(first) > 2 else []
    blocks(0)
    for f in futures:
        f.result()
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
    if n * r * r < SPLIT_MIN_MADDS or n <= BLOCK_ROWS:
        return A.T @ A
    threads = max(1, int(threads if threads is not None else numba.get_num_threads()))
    nblocks = -(-n // BLOCK_ROWS)
    first = np.linspace(0, nblocks, min(threads, nblocks) + 1).astype(np.int64)
    parts = np.empty((nblocks, r, r), dtype=A.dtype)

    def blocks(k: int) -> None:
        for b in range(first[k], first[k + 1]):
            rows = A[b * BLOCK_ROWS : min(n, (b + 1) * BLOCK_ROWS)]
            np.matmul(rows.T, rows, out=parts[b])

    futures = [_pool(len(first) - 2).submit(blocks, k) for k in range(1, len(first) - 1)] if len(first) > 2 else []
    blocks(0)
    for f in futures:
        f.result()
    G = parts[0].copy()
    for b in range(1, nblocks):
        G += parts[b]
    return G
