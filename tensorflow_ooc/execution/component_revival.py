"""Restarting a FastTucker component that SGD lost, from the training residual.

SGD on the FastTucker model (a Kruskal core, so a CP model of rank R in ``C^(n) = A^(n) B^(n)``)
sometimes loses a component in its first epochs: one column of every ``C^(n)`` shrinks toward
zero, and the gradient with respect to it, a product of the other modes' columns, shrinks with
it, so the component never comes back (a saddle). On planted 300 x 200 x 50 models at
J = R = 8, that happened in about a third of the runs, which then ended at 1.6-3.3 x the noise.

The remedy: a component whose strength (the product over modes of its columns' RMS) is below
``WEAK_FRACTION`` of the median strength is replaced by the best rank-1 fit of the training
residual on the observed entries, found by ``SWEEPS`` alternating row solves
(:mod:`tensorflow_ooc.kernels.completion.rank1_residual`), each a pass over every partition summed by a tree
reduction. They start from ``POWER_SWEEPS`` sweeps of the power method on the zero-filled
residual (the numerators alone, normalized): from a random start the row solves alone often
crawl (a planted rank-1 term on 6000 entries of a 4-way tensor: 41 % of it explained after 30
sweeps; after 3 power sweeps, all of it in 4 row-solve sweeps). Even so some starts end in
spurious local minima of this sparse rank-1 problem, so ``STARTS`` fits run side by side through
the same passes (fewer where the columns of all starts would pass ``STARTS_MAX_BYTES``) and the
best is kept.

The fit is kept only if it takes away at least ``MIN_GAIN`` of the residual's squared sum and at
least ``NOISE_GAIN_FACTOR`` times what a rank-1 term fitted to pure noise would (its ``sum I_n``
parameters over the ``n`` entries), so a residual that is noise is left alone. Planted
300 x 200 x 50 models at J = R = 8, 50 epochs: 10-14 of 30 (model, start) pairs ended above
1.2 x the noise without it, 4 of 120 with it (median 1.06 x;
``benchmarks/bench_fasttucker_convergence.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..kernels.completion import fasttucker_cpu as K
from ..kernels.completion.rank1_residual import rank1_row_sums, rank1_sse
from .completion import FastTuckerState, ObservedPartition, rebalance_gauge
from .task_graph import tree_reduce

log = logging.getLogger(__name__)

WEAK_FRACTION = 0.05
POWER_SWEEPS = 3
SWEEPS = 5
STARTS = 8
STARTS_MAX_BYTES = 64 << 20  # the columns of all starts travel to every partition task
MIN_GAIN = 0.01
NOISE_GAIN_FACTOR = 4.0


def component_strengths(state: FastTuckerState) -> np.ndarray:
    """Strength of each of the R components: the product over modes of the RMS of column ``r``
    of ``C^(n) = A^(n) B^(n)`` (gauge-free: a column scaling whose product is one keeps it)."""
    s = np.ones(state.B.shape[2])
    for n in range(len(state.shape)):
        C = state.factor(n) @ state.core_factor(n)
        s *= np.sqrt(np.einsum("ir,ir->r", C, C) / C.shape[0])
    return s


def weakest_lost_component(strengths: np.ndarray) -> int | None:
    """The weakest component if it is below ``WEAK_FRACTION`` of the median strength, else None."""
    if strengths.shape[0] < 2:
        return None
    r = int(np.argmin(strengths))
    return r if strengths[r] < WEAK_FRACTION * float(np.median(strengths)) else None


def residual_partition(data: ObservedPartition, state: FastTuckerState) -> np.ndarray:
    """The model's residuals ``x - xhat`` on a partition's training entries."""
    if data.coords.shape[0] == 0:
        return np.zeros(0)
    return data.values - K.predict_entries(data.coords, state.offsets, state.A, state.B)


@dataclass
class RowSums:
    num: np.ndarray
    den: np.ndarray


def row_sums_partition(
    data: ObservedPartition, resid: np.ndarray, cols: np.ndarray, offsets: np.ndarray, mode: int, rows: int
) -> RowSums:
    """A partition's share of one mode's row solve for every fit (columns of ``cols``;
    :func:`~tensorflow_ooc.kernels.completion.rank1_residual.rank1_row_sums`)."""
    num, den = np.zeros((rows, cols.shape[1])), np.zeros((rows, cols.shape[1]))
    if data.coords.shape[0]:
        rank1_row_sums(data.coords, resid, cols, offsets, int(mode), num, den)
    return RowSums(num, den)


def combine_row_sums(*parts: RowSums) -> RowSums:
    return RowSums(sum(p.num for p in parts), sum(p.den for p in parts))


def sse_partition(data: ObservedPartition, resid: np.ndarray, cols: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``[entries, sum e^2, sum (e - fit_s)^2 for each fit s]`` over a partition's training entries."""
    if data.coords.shape[0] == 0:
        return np.zeros(2 + cols.shape[1])
    before, after = rank1_sse(data.coords, resid, cols, offsets)
    return np.concatenate([[data.coords.shape[0], before], after])


def replace_component(state: FastTuckerState, r: int, cols: np.ndarray, rebalance: bool) -> FastTuckerState:
    """``state`` with column ``r`` of every ``C^(n)`` set to mode ``n``'s part of the stacked
    ``cols`` (scaled alike in every mode) and the other columns kept: ``C^(n) = U S V^T`` gives
    ``A^(n) = U S``, ``B^(n) = V^T``, exact when ``J_n >= R``; with ``J_n < R`` the nearest
    ``C^(n)`` of rank ``J_n`` (its truncated SVD)."""
    N = len(state.shape)
    parts = [cols[int(state.offsets[n]) : int(state.offsets[n]) + state.shape[n]] for n in range(N)]
    rms = np.array([np.sqrt(np.mean(p * p)) for p in parts])
    scale = np.exp(np.log(np.maximum(rms, 1e-300)).mean())
    A, B = np.zeros_like(state.A), np.zeros_like(state.B)
    for n in range(N):
        o, L, J = int(state.offsets[n]), state.shape[n], state.ranks[n]
        C = state.factor(n) @ state.core_factor(n)
        C[:, r] = parts[n] * (scale / max(rms[n], 1e-300))
        U, S, Vt = np.linalg.svd(C, full_matrices=False)
        k = min(J, S.shape[0])
        A[o : o + L, :k] = U[:, :k] * S[:k]
        B[n, :k] = Vt[:k]
    if rebalance:
        A, B = rebalance_gauge(A, B, state.offsets, state.shape, state.ranks)
    return FastTuckerState(A, B, state.offsets, state.shape, state.ranks, dict(state.info))


def revive_component(
    client,
    sources: list,
    state,
    r: int,
    shape: tuple[int, ...],
    offsets: np.ndarray,
    seed: int,
    rebalance: bool,
    split: int,
):
    """Fit component ``r`` afresh to the training residual of ``state`` (a future) over the
    partitions ``sources``; returns ``(state, gain)``: the new state (a future) and the fraction of
    the residual's squared sum the fit took away, or the old state and that fraction where it is
    below the bar (see the module's docstring)."""
    resid = [client.submit(residual_partition, s, state, pure=False) for s in sources]
    rng = np.random.default_rng([int(seed) % 2**63, 0x5EED, int(r)])
    starts = max(1, min(STARTS, STARTS_MAX_BYTES // (8 * int(sum(shape)))))
    cols = rng.standard_normal((int(sum(shape)), starts))
    for sweep in range(POWER_SWEEPS + SWEEPS):
        for n in range(len(shape)):
            sums = [
                client.submit(row_sums_partition, s, e, cols, offsets, n, shape[n], pure=False)
                for s, e in zip(sources, resid)
            ]
            total = client.submit(
                combine_row_sums, *tree_reduce(client, sums, combine_row_sums, split, last=True), pure=False
            ).result()
            o = int(offsets[n])
            if sweep < POWER_SWEEPS:
                norm = np.linalg.norm(total.num, axis=0)
                cols[o : o + shape[n]] = total.num / np.where(norm > 0, norm, 1.0)
            else:
                cols[o : o + shape[n]] = np.divide(
                    total.num, total.den, out=np.zeros_like(total.num), where=total.den > 0
                )
    sums = [client.submit(sse_partition, s, e, cols, offsets, pure=False) for s, e in zip(sources, resid)]
    n_entries, before, *after = sum(f.result() for f in sums)
    best = int(np.argmin(after))
    cols = cols[:, best]
    gain = 1.0 - float(after[best]) / float(before) if before > 0 else 0.0
    if gain < max(MIN_GAIN, NOISE_GAIN_FACTOR * sum(shape) / max(int(n_entries), 1)):
        return state, gain
    return client.submit(replace_component, state, r, cols, rebalance, pure=False), gain
