"""A CP-ALS mode of an owner-computes run in one message round, its normalization one mode late.

Owner-computes sends a mode's partial rows to their owners, which solve them and send the solved
rows back: two message rounds a mode, each a wait for the slower worker. Where every row is touched
by at most two workers (always on two workers; :attr:`ModePlan.one_round`) the same rows can go
in one round: each worker sends every other the partials of the rows both touch, sums the rows it
touches in the same order as they do, and solves them itself (``A = M V^+``; the owned rows are
then solved on every worker that touches them, which sends as many rows as the owner's round trip).

What is left of the second round is the all-reduce of the column statistics and Gram (and, last
mode, ``<A, M>``) of the owned rows, which the mode's normalization and the next mode's ``V``
need. They travel with the next mode's partials: the next MTTKRP runs over this mode's rows as
solved, not yet scaled, and since the MTTKRP is linear in each factor's columns its output lacks
exactly that column scaling, which the next solve applies (``A = M' diag(s) V^+``). A memo of a
mode pair filled over the unscaled rows lacks it too
(:meth:`~tensorflow_ooc.execution.owner_computes.WorkerState.local_mttkrp`'s ``memo_scale``). The
last mode's terms (and those of a mode whose next mode goes in two rounds) are all-reduced alone,
so an iteration of N such modes takes N + 1 rounds instead of 2N, and ends with every factor
scaled as one worker's :func:`~tensorflow_ooc.decompositions.cp.updates.update_mode` leaves it.
A mode every worker touches whole (:attr:`ModePlan.whole`) whose terms would need that round of
their own needs no all-reduce at all: each worker solved every row and takes the terms itself
(vast-shaped on 2 workers: 3 rounds, not 6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...blas_threads import one_blas_thread
from ...execution.owner_computes import WorkerState
from ...execution.partials import Partial
from ...kernels.update.column_scale import column_max_abs, column_sum_squares
from ...kernels.update.normal_equations import normal_inverse_of
from ...kernels.update.row_split import matmul_rows

SOLVE_BLOCK_ROWS = 1 << 16


@dataclass
class Deferred:
    """A mode solved but not yet normalized: its owned rows' terms, for the next round to carry."""

    mode: int
    small: np.ndarray


@dataclass
class RoundsCarry:
    """What a worker's CP-ALS keeps from one iteration to the next (in ``WorkerState.model``):
    the column scale its pair memos, filled in the last mode, lack."""

    memo_scale: np.ndarray | None = None


def rounds_carry(ws: WorkerState) -> RoundsCarry:
    if not isinstance(ws.model, RoundsCarry):
        ws.model = RoundsCarry()
    return ws.model


def one_round_mode(
    ws: WorkerState,
    mode: int,
    P: Partial,
    pending: Deferred | None,
    tag: tuple,
    first_iteration: bool,
    last: bool,
    next_one_round: bool,
) -> tuple[Deferred | None, np.ndarray | None, float, np.ndarray | None]:
    """Mode ``mode``'s exchange, solve and statistics, from this worker's MTTKRP ``P`` (taken with
    ``pending``'s mode solved but not scaled); ``pending``'s normalization on the way.

    Returns the mode left pending (None when its terms were all-reduced here: the last mode, or
    the next one goes in two rounds), the scale ``pending``'s mode got (None without one; the
    memo filled by this mode's MTTKRP lacks it), the update's seconds (exchange waits left out),
    and ``<A, M>`` of the last mode (scaled as its rows are; None for the other modes)."""
    t0 = time.perf_counter()
    team, R = ws.team, ws.factors.rank
    exchanged0 = team.wait_seconds + team.send_seconds
    carried = pending.small if pending is not None else np.zeros(0)
    smalls, M = ws.exchange_partials(mode, P, carried, (*tag, "M"))
    scale = None
    with one_blas_thread():
        if pending is not None:
            scale, _ = finish(ws, pending.mode, smalls, first_iteration)
        V = normal_inverse_of(ws.grams, mode).astype(M.dtype, copy=False)
        if scale is not None:  # M lacks the scale the pending mode's columns got since the MTTKRP
            V = (scale[:, None] * V).astype(M.dtype, copy=False)
        # a mode every worker holds whole takes its terms itself where they would need a round of
        # their own; where the next round can carry them, the owned rows' terms are cheaper (the
        # Gram of every row of vast's 11,374-row mode cost 2-3 ms a worker)
        local = ws.plans[mode].whole and (last or not next_one_round)
        A, Mo = solve_touched(ws, mode, P.lo, M, V, every_row=local)
        stat = (column_sum_squares(A) if first_iteration else column_max_abs(A)) if A.shape[0] else np.zeros(R)
        inner = np.einsum("ir,ir->r", A, Mo) * (1.0 if scale is None else scale) if last else np.zeros(R)
        small = np.concatenate([stat, (A.T @ A).ravel(), inner])
    ws.factors_written()
    done: Deferred | None = Deferred(mode, small)
    inner_out = None
    if local:  # every worker solved every row: the terms are its own
        _, inner_out = finish(ws, mode, small[None], first_iteration)
        done = None
    elif last or not next_one_round:  # nothing left to carry these terms
        smalls = ws.all_reduce(small, (*tag, "S"))
        _, inner_out = finish(ws, mode, smalls, first_iteration)
        done = None
    seconds = time.perf_counter() - t0 - (team.wait_seconds + team.send_seconds - exchanged0)
    return done, scale, seconds, inner_out if last else None


def finish(ws: WorkerState, mode: int, smalls: np.ndarray, first_iteration: bool) -> tuple[np.ndarray, np.ndarray]:
    """Normalize mode ``mode`` from every rank's terms ``smalls`` (stacked in rank order): the
    weights (2-norms the first iteration, else max-norms of at least 1), its touched rows scaled,
    its Gram; returns the scale and ``<A, M>`` (its last R terms) scaled."""
    R = ws.factors.rank
    total = smalls.sum(axis=0)
    weights, scale = column_weights(smalls[:, :R], first_iteration)
    dtype = ws.factors.dtype
    ws.scale_touched(mode, scale.astype(dtype))
    ws.grams[mode] = (total[R : R + R * R].reshape(R, R) * np.outer(scale, scale)).astype(dtype)
    ws.weights = weights
    return scale, total[R + R * R : R + R * R + R] * scale


def column_weights(stats: np.ndarray, first_iteration: bool) -> tuple[np.ndarray, np.ndarray]:
    """A mode's column weights from every rank's column statistics ``stats`` (W, R): 2-norms the
    first iteration (sums of squares summed), else max-norms of at least 1; and the scale that
    normalizes the columns (1 where a weight is 0, all ones for a zero factor)."""
    if first_iteration:
        weights = np.sqrt(stats.sum(axis=0))
    else:
        weights = np.maximum(stats.max(axis=0), 1.0)
    scale = np.ones(weights.shape[0]) if (weights == 0).all() else 1 / np.where(weights == 0, 1, weights)
    return weights, scale


def solve_touched(
    ws: WorkerState, mode: int, lo: int, M: np.ndarray, V: np.ndarray, every_row: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``A = M V`` for every row this worker touches (``M``'s rows from row ``lo`` of the mode),
    written into its factor rows: rows in one range in one GEMM straight into them, others a
    block at a time. Returns the owned rows of ``A`` and of ``M`` (views where in one range), or
    with ``every_row`` (a mode every worker holds whole) all the rows it touched."""
    plan, view = ws.plans[mode], ws.factors.views[mode]
    span = plan.touched_span
    if span is not None:
        matmul_rows(M[span[0] - lo : span[1] - lo], V, view[span[0] : span[1]])
    elif plan.touched is not None:
        for b in range(0, plan.touched.shape[0], SOLVE_BLOCK_ROWS):
            ids = plan.touched[b : b + SOLVE_BLOCK_ROWS]
            view[ids] = M[ids - lo] @ V
    rows = plan.touched if every_row else plan.owned
    own = plan.touched_span if every_row else plan.span
    if own is not None:
        return view[own[0] : own[1]], M[own[0] - lo : own[1] - lo]
    return view[rows], M[rows - lo]
