"""CP-APR's multiplicative updates on a small tensor in this process: an outer iteration is one
call per mode into :mod:`~tensorflow_ooc.kernels.apr.mu_mode` (all its inner iterations), the
nonzeros kept as coordinates sorted per mode, every buffer made once for the run.

At 10 k-100 k nonzeros a pass over the nonzeros takes tens of microseconds; the per-mode task
graphs spend more than that per inner iteration on tasks, array allocation, the conflict plan and
the start of numba's threads. The steps around the inner loop (complementary-slackness fix,
weights, normalization, summary) are :mod:`.apr_steps`', so the results are the general path's up
to the order of floating-point sums.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...kernels.apr.mu_mode import khatri_rao_rows, mode_runs, model_sums, mu_mode_iterations
from ...kernels.mttkrp.dispatch import numba_threads
from . import apr_steps as S

__all__ = ["SMALL_MU_BYTES", "InlineMU", "inline_mu_bytes"]

# the largest run this path takes: the Khatri-Rao rows of one mode and the per-mode sorted
# nonzeros (above, the general path's passes are dominated by the kernels anyway)
SMALL_MU_BYTES = 64 << 20


def inline_mu_bytes(nnz: int, shape: tuple[int, ...], rank: int) -> int:
    """Bytes :class:`InlineMU` keeps: coordinates, per mode the sorted order and values, the
    Khatri-Rao rows of one mode, Phi and its sign per mode."""
    nmodes = len(shape)
    return int(nnz * 8 * (nmodes + 2 * nmodes + 1 + rank) + sum(shape) * rank * 9)


class InlineMU:
    """The multiplicative updates' outer iterations on ``store``'s nonzeros, read into memory once.

    Parameters
    ----------
    store : Store
        The sparse store (read whole with ``to_coo``).
    rank : int
        The rank.
    threads : int
        Numba threads of the kernels (the nonzeros of each mode are cut into as many shares).
    """

    def __init__(self, store: Any, rank: int, threads: int) -> None:
        coords, values = store.to_coo()
        self.coords = np.ascontiguousarray(coords)
        self.threads = max(1, int(threads))
        shape = tuple(int(i) for i in store.shape)
        self.runs = [mode_runs(self.coords[:, n], values, rows, self.threads) for n, rows in enumerate(shape)]
        self.pi = np.empty((self.coords.shape[0], int(rank)))
        self.phi = [np.zeros((rows, int(rank))) for rows in shape]
        self.positive = [np.zeros((rows, int(rank)), dtype=bool) for rows in shape]

    def outer(self, s: S.APRState, iteration: int, o: Any) -> S.APRSummary:
        """One outer iteration on ``s`` (changed in place) with the options ``o`` (``kappa``,
        ``kappa_tol``, ``eps_div_zero``, ``tol``, ``max_inner_iters``); its summary."""
        S.begin_outer(s)
        phi_seconds = 0.0
        with numba_threads(self.threads):
            for n, m in enumerate(self.runs):
                S.mu_begin_mode(s, n, iteration, o.kappa, o.kappa_tol)
                t0 = time.perf_counter()
                khatri_rao_rows(self.coords, m.perm, s.data, s.offsets, n, self.pi)
                kkt, inner, updates = mu_mode_iterations(
                    m.ptr,
                    m.rows,
                    m.empty,
                    m.share,
                    m.first_run,
                    m.last_run,
                    m.cut_rows,
                    m.cut_ptr,
                    m.cut_parts,
                    m.values,
                    self.pi,
                    s.views[n],
                    self.phi[n],
                    self.positive[n],
                    float(o.eps_div_zero),
                    float(o.tol),
                    int(o.max_inner_iters),
                )
                phi_seconds += time.perf_counter() - t0
                s.inner_iters += int(inner)
                s.kkt_mode[n] = kkt
                s.phi_positive[n] = self.positive[n]
                if updates:
                    s.converged = False
                S.end_mode(s, n)
            t0 = time.perf_counter()
            # the last mode's Khatri-Rao rows still hold: the other factors have not changed since
            last = self.runs[-1]
            ll, xm = model_sums(last.ptr, last.rows, last.values, self.pi, s.views[-1], s.weights)
        s.seconds["phi"] = phi_seconds
        return S.summary(s, [np.array([ll, xm, time.perf_counter() - t0])])
