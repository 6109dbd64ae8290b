"""The pieces of CP-APR (Poisson CP), each a small function a Dask worker runs on the model state:
the multiplicative updates of Chi & Kolda (2012) and the row-wise damped Newton method PDN-R of
Hansen, Plantenga & Kolda (2015), step for step as pyttb's ``cp_apr`` takes them.

PDN-R solves one small problem per row of the mode's factor. Here the rows of a block move in
lockstep: one pass over the nonzeros gives every active row its gradient term, Hessian and
log-likelihood (:func:`~tensorflow_ooc.kernels.apr.cpu.newton_terms`), the search directions
are solved for all rows at once, and a second pass evaluates every row's ten backtracking
steps together (:func:`~tensorflow_ooc.kernels.apr.cpu.candidate_terms`), from which each row
takes the step its own sequential line search would have taken. Rows are independent, so the
result is the row-by-row method's, with two passes over the nonzeros per inner iteration
however many rows there are, streamed or in memory, on any number of workers.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...errors import DecompositionError
from ...execution.partials import Partial
from ...kernels import StackedFactors
from ...kernels.apr.cpu import hessian_width, mu_kappa_fix, mu_kkt, mu_multiply
from ...kernels.update.column_scale import column_abs_sums, scale_columns

log = logging.getLogger(__name__)

# rows of APRState.safeguards (per mode): what PDN-R did beyond pyttb where a nonzero's model value
# was 0 (pyttb's log-likelihood is -inf there): rows that started with such a nonzero and took a step
# with a finite objective, nonzeros left out of their row's problem (no row value reaches them), rows
# all of whose nonzeros were such (kept, then lifted), rows lifted off zero (LIFT)
ZERO_MODEL, UNREACHABLE, FROZEN, LIFTED = 0, 1, 2, 3
SAFEGUARDS = ("zero_model_rows", "unreachable_nonzeros", "frozen_rows", "lifted_rows")
# a row with nonzeros it cannot reach takes this fraction of its mean entry on its zero entries
# after each step, so the next modes' rows can reach those nonzeros (row updates alone never can)
LIFT = 1e-3

# line search of pyttb's tt_linesearch_prowsubprob: steps 1, 1/2, ... 1/2^9, Armijo constant 1e-4
LINE_STEPS = 0.5 ** np.arange(10)
SUFFICIENT_DECREASE = 1e-4
MIN_DESCENT = 1e-7  # a candidate whose entries sum below this is refused
SMALL_STEP = 1e-7  # a step whose entries sum below this falls back to the multiplicative update


@dataclass
class RowBlock:
    """PDN-R: the rows ``lo ..`` of the current mode whose problems advance together."""

    lo: int
    active: np.ndarray  # bool (rows,): still iterating
    mu: np.ndarray  # damping per row
    inner: np.ndarray  # int (rows,): inner iterations counted (pyttb's countInnerIters)
    started: bool = False  # the first Newton pass of the block has run (empty rows known)
    unreachable: np.ndarray | None = None  # per row: nonzeros no value of the row reaches
    frozen: np.ndarray | None = None  # bool per row: every nonzero unreachable (lifted, then kept)
    notconverged: bool = False  # some row took a step
    # between the Newton pass and the candidate pass
    grad: np.ndarray | None = None
    phi: np.ndarray | None = None
    f_old: np.ndarray | None = None
    direction: np.ndarray | None = None
    pred_red: np.ndarray | None = None
    candidates: np.ndarray = field(default_factory=lambda: np.zeros((0, len(LINE_STEPS), 1)))


class APRState(StackedFactors):
    """The Poisson CP model between steps: stacked factors (whose target mode holds the factor
    times the weights while that mode is updated), weights, each mode's last Phi (for the
    complementary-slackness fix of MU), and the counters pyttb reports per outer iteration."""

    def __init__(self, shape, rank, dtype=np.float64, data=None) -> None:
        super().__init__(shape, rank, dtype, data)
        self.weights = np.ones(self.rank)
        # per mode, where its last Phi was positive (MU's complementary-slackness fix reads only
        # that: a bool mask instead of a second copy of the factors)
        self.phi_positive: list[np.ndarray | None] = [None] * len(self.shape)
        self.kkt_mode = np.zeros(len(self.shape))
        self.inner_iters = 0
        self.violations = 0
        self.converged = True  # no row or mode took a step this outer iteration
        self.skip = False  # the current mode (or row block) is done: its passes return at once
        self.block: RowBlock | None = None
        self.seconds: dict[str, float] = {}  # pass kind -> seconds of the slowest partition task
        self.singular_logged = False  # a nearly singular damped Hessian was logged as a warning
        self.safeguards = np.zeros((len(SAFEGUARDS), len(self.shape)), dtype=np.int64)  # per outer iteration
        self.zero_floor = 0.0  # PDN-R: what a zero row's entries are lifted to (see zero_row_floor)

    def copy(self) -> "APRState":
        out = APRState(self.shape, self.rank, self.dtype, self.data.copy())
        out.weights = self.weights.copy()
        out.zero_floor = self.zero_floor
        out.phi_positive = [None if p is None else p.copy() for p in self.phi_positive]
        return out


def start_state(factors: Sequence[np.ndarray], weights: np.ndarray | None, dtype: str) -> APRState:
    """The initial model: the given factors and weights, every column scaled to unit 1-norm (the
    norms into the weights), as pyttb's ``M.normalize(normtype=1)``."""
    shape = [np.shape(f)[0] for f in factors]
    s = APRState(shape, np.shape(factors[0])[1], dtype)
    for v, f in zip(s.views, factors):
        v[...] = f
    s.weights = np.ones(s.rank) if weights is None else np.array(weights, dtype=np.float64)
    with np.errstate(over="ignore"):  # checked below, with the error naming it
        for n in range(len(shape)):
            normalize_mode(s, n)
    if not np.isfinite(s.weights).all():
        raise DecompositionError(
            "init: the products of the factor matrices' column sums (the components' weights) exceed "
            "float64's range; scale the initial factors down"
        )
    return s


def inverse_norms(norms: np.ndarray) -> np.ndarray:
    """``1 / norms`` where a norm is positive, 1 elsewhere (a zero column stays zero): what
    normalizing multiplies each column by (one multiply per entry instead of a masked division)."""
    positive = norms > 0
    return np.where(positive, 1.0 / np.where(positive, norms, 1.0), 1.0)


def normalize_mode(s: APRState, n: int) -> None:
    """Scale mode ``n``'s columns to unit 1-norm, the norms into the weights (pyttb's
    ``normalize(mode=n, normtype=1)``; a zero column stays zero)."""
    A = s.views[n]
    norms = column_abs_sums(A)
    scale_columns(A, inverse_norms(norms))
    s.weights = s.weights * norms


def redistribute(s: APRState, n: int) -> None:
    """Move the weights into mode ``n``'s factor (pyttb's ``redistribute``)."""
    scale_columns(s.views[n], s.weights.astype(np.float64))
    s.weights = np.ones(s.rank)


def begin_outer(s: APRState) -> APRState:
    """Reset the per-outer-iteration counters."""
    s.kkt_mode = np.zeros(len(s.shape))
    s.inner_iters = 0
    s.violations = 0
    s.converged = True
    s.seconds = {}
    s.safeguards = np.zeros((len(SAFEGUARDS), len(s.shape)), dtype=np.int64)
    return s


# --- multiplicative updates (Chi & Kolda 2012) -------------------------------------------------------


def mu_begin_mode(s: APRState, n: int, iteration: int, kappa: float, kappa_tol: float) -> APRState:
    """Before mode ``n``'s inner iterations: entries that violate complementary slackness (Phi > 0
    but the entry below ``kappa_tol``) are moved off zero by ``kappa``; then the weights go into
    the mode's factor."""
    if iteration > 0 and s.phi_positive[n] is not None:
        if mu_kappa_fix(s.views[n], s.phi_positive[n], kappa, kappa_tol):
            s.violations += 1
    redistribute(s, n)
    s.skip = False
    return s


def mu_inner(s: APRState, parts: Sequence[Partial], n: int, tol: float) -> APRState:
    """One inner iteration: Phi from the reweighted MTTKRP; stop the mode when
    ``max |min(B, 1 - Phi)| < tol`` (the KKT conditions), else ``B <- B * Phi``."""
    if s.skip:
        return s
    whole = [p for p in parts if p.rows.shape[0]]
    if len(whole) == 1 and whole[0].lo == 0 and whole[0].rows.shape == s.views[n].shape:
        phi = whole[0].rows  # one partial with every row: no copy (long modes)
    else:
        phi = np.zeros(s.views[n].shape, dtype=s.dtype)
        for p in whole:
            phi[p.lo : p.lo + p.rows.shape[0]] += p.rows
    s.seconds["phi"] = s.seconds.get("phi", 0.0) + max((p.seconds for p in parts), default=0.0)
    s.inner_iters += 1
    positive = np.empty(phi.shape, dtype=bool)
    s.kkt_mode[n] = mu_kkt(s.views[n], phi, positive)
    s.phi_positive[n] = positive
    if s.kkt_mode[n] < tol:
        s.skip = True
        return s
    s.converged = False
    mu_multiply(s.views[n], phi)
    return s


def end_mode(s: APRState, n: int) -> APRState:
    """After mode ``n``: its columns back to unit 1-norm, the norms into the weights."""
    normalize_mode(s, n)
    s.skip = False
    s.block = None
    return s


# --- PDN-R (Hansen, Plantenga & Kolda 2015) ------------------------------------------------------------


def zero_row_floor(weights: np.ndarray, rows: int) -> float:
    """``LIFT`` times a mode's mean entry once the weights are in it (its columns have unit 1-norm
    before): the entries a row that is zero throughout is lifted to. Every worker computes the same
    from the weights and the mode's length."""
    return LIFT * float(np.sum(weights)) / (rows * len(weights))


def lifted(rows: np.ndarray, zero_floor: float, before: np.ndarray | None = None) -> np.ndarray:
    """``rows`` (float64, nonnegative) with each zero entry raised to ``LIFT`` times the row's mean
    entry (the larger of its sums now and ``before`` the step); a row that is zero throughout (its
    only components had weight 0: no row of another mode held them) takes ``zero_floor``."""
    sums = rows.sum(axis=1) if before is None else np.maximum(rows.sum(axis=1), before)
    floor = LIFT * sums / rows.shape[1]
    floor[floor <= 0] = zero_floor
    return np.where(rows > 0, rows, floor[:, None])


def pdnr_begin_block(s: APRState, n: int, lo: int, hi: int, mu0: float, first_block: bool) -> APRState:
    """Start rows ``lo .. hi - 1`` of mode ``n`` (the weights go into the mode's factor with the
    first block)."""
    if first_block:
        s.zero_floor = zero_row_floor(s.weights, s.shape[n])
        redistribute(s, n)
    rows = hi - lo
    s.block = RowBlock(lo, np.ones(rows, dtype=bool), np.full(rows, float(mu0)), np.zeros(rows, dtype=np.int64))
    s.skip = False
    return s


def _unpack(terms: np.ndarray, R: int) -> tuple[np.ndarray, ...]:
    """phi (rows, R), the symmetric Hessian (rows, R, R), sum x log v, nonzero counts, counts of
    nonzeros left out (a zero Khatri-Rao row)."""
    phi = terms[:, :R]
    iu = np.triu_indices(R)
    H = np.zeros((terms.shape[0], R, R))
    H[:, iu[0], iu[1]] = terms[:, R : R + iu[0].size]
    H[:, iu[1], iu[0]] = terms[:, R : R + iu[0].size]
    return phi, H, terms[:, -3], terms[:, -2], terms[:, -1]


def _summed(parts: Sequence[Partial], rows: int, width: int) -> tuple[np.ndarray, float]:
    out = np.zeros((rows, width))
    lo = parts[0].lo if parts else 0
    for p in parts:
        if p.rows.shape[0]:
            out[p.lo - lo : p.lo - lo + p.rows.shape[0]] += p.rows
    return out, max((p.seconds for p in parts), default=0.0)


def _quiet(step: Callable) -> Callable:
    """``step`` with NumPy's floating-point warnings off: values beyond float64's range end in a
    log-likelihood that is not finite, which stops the run with an error naming the cause
    (a RuntimeWarning would only print a source line first)."""

    @functools.wraps(step)
    def run(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return step(*args, **kwargs)

    return run


@_quiet
def pdnr_direction(
    s: APRState, parts: Sequence[Partial], n: int, inner: int, inner_max: int, row_tol: float, eps_active: float
) -> APRState:
    """Inner iteration ``inner`` of every active row, up to its line search: the gradient
    ``1 - phi`` and the row's KKT violation (rows below ``row_tol`` stop), the free set (entries
    not held at zero by a positive gradient, Bertsekas' ``eps_active``), the damped Newton
    direction on the free set (the others move along the negative gradient), its predicted
    reduction, and the line-search candidates ``max(b + t d, 0)``."""
    b = s.block
    if s.skip:
        return s
    R = s.rank
    terms, sec = _summed(parts, b.active.shape[0], hessian_width(R))
    s.seconds["newton"] = s.seconds.get("newton", 0.0) + sec
    phi_all, H_all, ll_all, count, unreachable = _unpack(terms, R)
    A = s.views[n][b.lo : b.lo + b.active.shape[0]]
    if not b.started:
        # rows without nonzeros: pyttb sets them to zero and counts no inner iteration
        empty = count == 0
        A[empty] = 0
        # beyond pyttb: rows all of whose nonzeros have a zero Khatri-Rao row (model value 0
        # whatever the row is) have no problem to solve; they are kept, not emptied, and lifted off
        # zero like any row with such nonzeros, or the next modes could not reach those nonzeros either
        frozen = (count > 0) & (unreachable == count) & b.active
        if frozen.any():
            A[frozen] = lifted(A[frozen].astype(np.float64), s.zero_floor)
            s.safeguards[LIFTED, n] += int(frozen.sum())
        b.active &= ~(empty | frozen)
        b.frozen = frozen
        b.started = True
        b.unreachable = unreachable.copy()
        s.safeguards[UNREACHABLE, n] += int(unreachable.sum())
        s.safeguards[FROZEN, n] += int(frozen.sum())
    act = np.flatnonzero(b.active)
    m = A[act].astype(np.float64)
    phi = phi_all[act]
    grad = 1 - phi
    kkt = np.max(np.abs(np.minimum(m, grad)), axis=1) if act.size else np.zeros(0)
    # a row with a nonzero of model value 0 (sum x log v = -inf) has a gradient from the floor eps of
    # the division, not a KKT violation: it would set the next outer iteration's row tolerance
    counted = np.isfinite(ll_all[act])
    if inner == 0 and counted.any():
        s.kkt_mode[n] = max(s.kkt_mode[n], float(kkt[counted].max()))
    done = kkt < row_tol
    if inner == 0:
        done &= b.unreachable[act] == 0  # such a row steps at least once, to be lifted
    b.inner[act[done]] += inner + 1
    b.active[act[done]] = False
    keep = ~done
    act, m, phi, grad = act[keep], m[keep], phi[keep], grad[keep]
    if act.size:
        b.notconverged = True
    H = H_all[act]
    mu = b.mu[act]
    # the free set (pyttb's get_search_dir_pdnr)
    proj = (m - grad) * (m - (grad > 0))
    wk = np.linalg.norm(m - proj, axis=1)
    fixed = (m <= np.minimum(eps_active, wk)[:, None]) & (grad > 0)
    free = ~fixed
    d = np.where(fixed & (m != 0), -grad, 0.0)
    eye = np.eye(R)
    both = free[:, :, None] & free[:, None, :]
    Hd = np.where(both, H + mu[:, None, None] * eye, eye)  # fixed entries decoupled (identity rows)
    rhs = np.where(free, -grad, 0.0)
    try:
        sol = np.linalg.solve(Hd, rhs[..., None])[..., 0]
        bad = np.zeros(act.size, dtype=bool)
    except np.linalg.LinAlgError:
        sol = np.zeros_like(rhs)
        bad = np.zeros(act.size, dtype=bool)
        for j in range(act.size):
            try:
                sol[j] = np.linalg.solve(Hd[j], rhs[j])
            except np.linalg.LinAlgError:
                bad[j] = True
    d = np.where(free, sol, d)
    if bad.any():
        # a log line, not a Python warning (which prints with a source line): a warning the first
        # time in a state's life, debug after that, so a long run does not repeat it per row block
        level = logging.DEBUG if getattr(s, "singular_logged", False) else logging.WARNING
        log.log(
            level,
            "CP-APR: the damped Hessian of %d row(s) is nearly singular; they step along the negative gradient",
            int(bad.sum()),
        )
        s.singular_logged = True
        d[bad] = -grad[bad]
    df = np.where(free, d, 0.0)
    q = np.einsum("ir,irs,is->i", df, np.where(both, H + mu[:, None, None] * eye, 0.0), df)
    pred = np.einsum("ir,ir->i", df, np.where(free, grad, 0.0)) + 0.5 * q
    up = pred > 0
    d[up] = -grad[up]
    cand = np.maximum(m[:, None, :] + LINE_STEPS[None, :, None] * d[:, None, :], 0.0)
    full = np.zeros((b.active.shape[0], len(LINE_STEPS), R))
    full[act] = cand
    b.grad, b.phi, b.direction, b.pred_red = grad, phi, d, pred
    b.f_old = np.sum(m, axis=1) - ll_all[act]  # +inf: a nonzero of the row has model value 0
    b.candidates = full
    b.step_rows = act
    if not act.size:
        s.skip = True
    elif inner == inner_max - 1:
        b.last = True
    return s


@_quiet
def pdnr_step(s: APRState, parts: Sequence[Partial], n: int, inner: int, inner_max: int) -> APRState:
    """Each active row takes the step its backtracking line search would take (the first
    candidate with sufficient decrease; the multiplicative update where the search fails) and
    adjusts its damping by the ratio of actual to predicted reduction."""
    b = s.block
    if s.skip:
        return s
    terms, sec = _summed(parts, b.active.shape[0], len(LINE_STEPS))
    s.seconds["line_search"] = s.seconds.get("line_search", 0.0) + sec
    act = b.step_rows
    m = s.views[n][b.lo + act].astype(np.float64)
    cand = b.candidates[act]
    ll = terms[act]
    gd = np.einsum("ikr,ir->ik", cand - m[:, None, :], b.grad)
    csum = cand.sum(axis=2)
    with np.errstate(invalid="ignore"):
        f = np.where((gd > 0) | (csum < MIN_DESCENT), np.inf, csum - ll)
        f = np.where(np.isnan(f), np.inf, f)
        ok = f <= b.f_old[:, None] + SUFFICIENT_DECREASE * gd
    # beyond pyttb: a row with a nonzero of model value 0 starts at f_old = inf, where pyttb's test
    # takes the unit step even when its objective stays infinite; here the first step with a finite
    # one (every nonzero of the row above 0), else the multiplicative update below
    infinite = np.isinf(b.f_old)
    if infinite.any():
        ok[infinite] = np.isfinite(f[infinite])
        if inner == 0:
            s.safeguards[ZERO_MODEL, n] += int(infinite.sum())
    accepted = ok.any(axis=1)
    k = np.where(accepted, ok.argmax(axis=1), len(LINE_STEPS) - 1)
    rows = np.arange(act.size)
    new = cand[rows, k]
    f_new = f[rows, k]
    f_1 = np.where(np.isinf(f[:, 0]), b.f_old, f[:, 0])
    fallback = (~accepted & ((f_new > b.f_old) | infinite)) | (new.sum(axis=1) < SMALL_STEP)
    if fallback.any():
        mu_step = m[fallback] * b.phi[fallback]
        new[fallback] = mu_step * (mu_step > 0)
        f_1[fallback] = b.f_old[fallback]
    # rows with nonzeros they cannot reach, and rows that found no step with a finite objective
    lift = (b.unreachable[act] > 0) | (infinite & ~accepted)
    if lift.any():
        new[lift] = lifted(new[lift], s.zero_floor, m[lift].sum(axis=1))  # candidates and MU steps are >= 0
        if inner == 0:
            s.safeguards[LIFTED, n] += int(lift.sum())
    s.views[n][b.lo + act] = new
    with np.errstate(divide="ignore", invalid="ignore"):
        # a row whose model value is 0 at a nonzero has f_old = f_1 = inf: its actual reduction is
        # NaN, so rho is NaN and neither test below moves its damping
        actual = b.f_old - f_1
        rho = actual / -b.pred_red
    mu = b.mu[act]
    zero = b.pred_red == 0
    mu = np.where(zero, mu * 10, np.where(rho < 0.25, mu * 3.5, np.where(rho > 0.75, mu * (2 / 7), mu)))
    b.mu[act] = mu
    if inner == inner_max - 1:
        b.inner[act] += inner_max
        b.active[act] = False
        s.skip = True
    return s


def pdnr_end_block(s: APRState) -> APRState:
    """Count the block's inner iterations; the outer iteration has not converged if a row moved."""
    b = s.block
    s.inner_iters += int(b.inner.sum())
    if b.notconverged:
        s.converged = False
    s.block = None
    s.skip = False
    return s


# --- the summary the driver reads once per outer iteration ------------------------------------------


@dataclass
class APRSummary:
    weights: np.ndarray
    loglik: float  # sum x log m - sum m
    inner_product: float  # <X, M>
    norm_model_sq: float  # ||M||^2
    kkt: float
    inner_iters: int
    violations: int
    converged: bool
    zeros: int
    seconds: dict
    finished: float
    safeguards: np.ndarray | None = None  # (len(SAFEGUARDS), modes): PDN-R beyond pyttb


def summary(s: APRState, parts: Sequence[np.ndarray]) -> APRSummary:
    """The outer iteration's figures: the log-likelihood ``sum x log m - sum m`` (pyttb's
    ``tt_loglikelihood``), <X, M> and ||M||^2 for the least-squares fit, the KKT violation and
    counters."""
    sums = np.sum([p[:2] for p in parts], axis=0)
    total = float(np.sum(s.weights * np.prod([v.sum(axis=0) for v in s.views], axis=0)))
    G = np.ones((s.rank, s.rank))
    for v in s.views:
        G *= v.T @ v
    norm2 = float(s.weights @ G @ s.weights)
    sec = dict(s.seconds)
    sec["loglik"] = max(float(p[2]) for p in parts)
    return APRSummary(
        s.weights.copy(),
        float(sums[0]) - total,
        float(sums[1]),
        norm2,
        float(np.max(s.kkt_mode)),
        int(s.inner_iters),
        int(s.violations),
        bool(s.converged),
        int(sum(int(np.count_nonzero(v == 0)) for v in s.views)),
        sec,
        time.time(),
        s.safeguards.copy(),
    )


def safeguard_record(safeguards: np.ndarray | None) -> dict:
    """History fields of the PDN-R safeguards (per mode), only where one acted."""
    if safeguards is None or not np.any(safeguards):
        return {}
    return {name: [int(v) for v in row] for name, row in zip(SAFEGUARDS, safeguards)}


def factors_of(s: APRState) -> list[np.ndarray]:
    """The factor matrices (copies)."""
    return [np.array(v) for v in s.views]
