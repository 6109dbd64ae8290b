"""CP-APR's multiplicative updates on a tensor held in this process: an outer iteration is one or
two kernel calls per mode (:mod:`~tensorflow_ooc.kernels.apr.mu_mode`: the rows run their inner
iterations back to back on Khatri-Rao rows kept in the cache), the nonzeros kept as coordinates
sorted per mode, every buffer made once for the run.

At 10 k-100 k nonzeros an inner iteration's pass takes tens of microseconds; the per-mode task
graphs spent more than that per inner iteration on tasks, array allocation, the conflict plan and
waking numba's threads (issue 49: 1.2-2.3x ALTO's APR). The steps around the inner loop
(complementary-slackness fix, weights, normalization, summary) are :mod:`.apr_steps`', so the
results are the general path's up to the order of floating-point sums.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psutil

from ...kernels.apr.cpu import FIXED_RANKS
from ...kernels.apr.mu_mode import BLOCK_NNZ, mode_runs, model_sums, mu_mode, narrow_coords
from ...kernels.mttkrp.dispatch import numba_threads
from . import apr_steps as S

__all__ = [
    "INLINE_MU_FREE_FRACTION",
    "SERIAL_NNZ_RANK",
    "SMALL_MU_BYTES",
    "InlineMU",
    "inline_mu_bytes",
    "inline_mu_fits",
]

# up to this many nonzeros x rank, one thread: handing a share to another thread costs tens of
# microseconds (6.5 k binary nonzeros at rank 8 already gain from two threads)
SERIAL_NNZ_RANK = 1 << 15

# this path takes any run up to this many bytes of what it keeps
SMALL_MU_BYTES = 64 << 20

# above SMALL_MU_BYTES, a fixed rank still runs here where what it keeps takes at most this share
# of the memory free (else the general path's memory plan, streaming and partitions take over):
# its Khatri-Rao rows formed once a mode beat the general path's per-pass rows at 3.3 M nonzeros
# (docs/KERNELS.md, "CP-APR multiplicative updates in memory")
INLINE_MU_FREE_FRACTION = 0.25


def inline_mu_bytes(nnz: int, shape: tuple[int, ...], rank: int, max_inner: int, threads: int) -> int:
    """Bytes :class:`InlineMU` keeps: per mode the coordinates (32-bit where they fit) and values
    in its order, while it starts the nonzeros as read, each mode's rows before each inner
    iteration's update and Phi's sign (the longest mode's), the Khatri-Rao buffers."""
    nmodes, longest = len(shape), max(shape)
    width = 4 if longest <= np.iinfo(np.int32).max else 8
    return int(
        nnz * nmodes * (width * nmodes + 8)
        + nnz * (8 * nmodes + 8)
        + max_inner * longest * rank * 9
        + sum(shape) * rank
        + max(1, threads) * BLOCK_NNZ * rank * 8
    )


def inline_mu_fits(keeps: int, rank: int) -> bool:
    """Whether a run keeping ``keeps`` bytes (:func:`inline_mu_bytes`) at rank ``rank`` runs here."""
    if keeps <= SMALL_MU_BYTES:
        return True
    return rank in FIXED_RANKS and keeps <= INLINE_MU_FREE_FRACTION * psutil.virtual_memory().available


class InlineMU:
    """The multiplicative updates' outer iterations on ``store``'s nonzeros, read into memory once.

    Parameters
    ----------
    store : Store
        The sparse store (read whole with ``to_coo``).
    rank : int
        The rank.
    max_inner : int
        Inner iterations per mode at most.
    threads : int
        Numba threads of the kernels (each mode's rows are cut into as many shares); one up to
        :data:`SERIAL_NNZ_RANK` nonzeros x rank.
    """

    def __init__(self, store: Any, rank: int, max_inner: int, threads: int) -> None:
        coords, values = store.to_coo()
        coords = narrow_coords(coords)
        nnz = coords.shape[0]
        self.threads = 1 if nnz * int(rank) <= SERIAL_NNZ_RANK else max(1, int(threads))
        shape = tuple(int(i) for i in store.shape)
        # each mode keeps the coordinates in its own order
        self.runs = [mode_runs(coords, n, values, rows, self.threads) for n, rows in enumerate(shape)]
        R, T = int(rank), max(1, int(max_inner))
        self.pi = np.empty((self.threads, max(1, max(m.block_nnz for m in self.runs)), R))
        self.before = np.empty((max(shape), T, R))
        self.positive_at = np.zeros((max(shape), T, R), dtype=bool)
        self.worst = np.zeros((self.threads, T))
        self.positive = [np.zeros((rows, R), dtype=bool) for rows in shape]
        # inner iterations each mode took last (its next first kernel call runs as many)
        self.took = [T] * len(shape)
        # the kernels release the GIL: threads beyond this one run a share of each mode's rows
        # (no numba parallel region: its threads spin after one and took a core from these)
        self.pool = ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None

    def close(self) -> None:
        """Stop the pool's threads."""
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def outer(self, s: S.APRState, iteration: int, o: Any) -> S.APRSummary:
        """One outer iteration on ``s`` (changed in place) with the options ``o`` (``kappa``,
        ``kappa_tol``, ``eps_div_zero``, ``tol``, ``max_inner_iters``); its summary."""
        S.begin_outer(s)
        phi_seconds = 0.0
        scratch = (self.pi, self.before, self.positive_at, self.worst)
        # numba's own threads only where a factor is long (column sums and scaling)
        with numba_threads(self.threads):
            for n, m in enumerate(self.runs):
                S.mu_begin_mode(s, n, iteration, o.kappa, o.kappa_tol)
                t0 = time.perf_counter()
                kkt, inner, updates = mu_mode(
                    m,
                    s.data,
                    s.offsets,
                    n,
                    float(o.eps_div_zero),
                    float(o.tol),
                    int(o.max_inner_iters),
                    *scratch,
                    self.positive[n],
                    self.pool,
                    self.took[n],
                )
                self.took[n] = int(inner)
                phi_seconds += time.perf_counter() - t0
                s.inner_iters += int(inner)
                s.kkt_mode[n] = kkt
                s.phi_positive[n] = self.positive[n]
                if updates:
                    s.converged = False
                S.end_mode(s, n)
            t0 = time.perf_counter()
            last = self.runs[-1]
            args = (last.coords, last.values, s.data, s.offsets, s.weights, self.threads)
            ll, xm = model_sums(*args, self.pool)
        s.seconds["phi"] = phi_seconds
        return S.summary(s, [np.array([ll, xm, time.perf_counter() - t0])])
