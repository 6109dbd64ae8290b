"""The CP-ALS mode update, as small functions the Dask workers run (Algorithm 1, lines 3-6)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from array_api_compat import array_namespace, is_numpy_array

from ...blas_threads import one_blas_thread
from ...execution.partials import SPARSE_ROWS, Partial, merged_reads, sparse_sum, to_host
from ...kernels import StackedFactors
from ...kernels.factors import aligned_copy
from ...kernels.sampling.krp_sampler import build_tree, update_tree
from ...kernels.update.column_scale import column_max_abs, column_sum_squares, nonzero_rows
from ...kernels.update.hals import hals_rows
from ...kernels.update.normal_equations import normal_inverse_of
from ...kernels.update.row_split import gram_rows, matmul_rows
from ..common.model_checks import check_seed

# HALS sweeps per mode update of nonnegative CP-ALS: the inner iterations TensorLy 0.10's
# non_negative_parafac_hals gives hals_nnls (5; releases before 0.10 allowed up to 100, stopped
# early once a sweep changes the factor by less than 1e-8 of the first sweep's change). A fixed
# count, with no early stop, keeps the rows independent (see kernels/update/hals.py).
HALS_SWEEPS = 5


@dataclass(frozen=True)
class NonNegative:
    """Nonnegative CP-ALS's mode update: ``sweeps`` HALS sweeps with L2 regularization ``reg``
    (:func:`~tensorflow_ooc.kernels.update.hals.hals_rows`) in place of ``A = M V^+``."""

    reg: float = 0.0
    sweeps: int = HALS_SWEEPS


def _gram(A: Any) -> Any:
    """A factor's Gram, formed as the update forms it (row blocks of a large NumPy factor)."""
    return gram_rows(A) if isinstance(A, np.ndarray) else A.T @ A


class CPState(StackedFactors):
    """The model between mode updates, as it lives on the cluster: the stacked factors (so MTTKRP
    tasks take it as their factors), each mode's Gram matrix, the column weights, and for the
    driver's fit the inner-product terms of the last mode and each update's finish time.

    ``data`` and the Grams are NumPy arrays, or CuPy arrays when the state lives on a GPU worker
    (:func:`on_device`); the update code is the same for both (array API namespace)."""

    def __init__(self, shape, rank, dtype=np.float64, data=None, grams: list[np.ndarray] | None = None) -> None:
        super().__init__(shape, rank, dtype, data)
        self.grams = list(grams) if grams is not None else [_gram(v) for v in self.views]
        self.weights = np.ones(self.rank)
        self.inner = np.zeros(self.rank)
        self.finished: dict[int, float] = {}
        self.timings: dict[int, tuple[float, float]] = {}  # mode -> (MTTKRP seconds, update seconds)
        self.sampling: dict[int, float] = {}  # mode -> seconds drawing its samples
        self.reads: dict[int, dict] = {}  # mode -> what its sampled MTTKRP read (Partial.reads)
        self.fit_seconds = 0.0  # randomized CP: the exact MTTKRP run for the last fit evaluation
        # randomized CP: per mode, how often its update was skipped (no sampled fiber had a nonzero)
        self.empty_sketches: dict[int, int] = {}
        # randomized CP (STS-CP): each mode's leverage-score segment tree, rebuilt after its update
        self.trees: list | None = None
        # randomized CP: per mode whose last update was sketched over few rows, the rows that may
        # be nonzero (every other row is zero); a mode not here may be nonzero anywhere
        self.support: dict[int, np.ndarray] = {}

    @classmethod
    def of(cls, factors: StackedFactors) -> "CPState":
        return cls(factors.shape, factors.rank, factors.dtype, factors.data)


def solve_normal(V: Any, M: Any, out: np.ndarray | None = None) -> Any:
    """A = M V^+ for the symmetric R x R Hadamard product of Grams V (into ``out`` if given, for
    NumPy arrays).

    NumPy: V^+ from V's Cholesky factor
    (:func:`~tensorflow_ooc.kernels.update.normal_equations.normal_inverse_of`), then one GEMM. Solving the I
    right-hand sides with the factor instead (LAPACK potrs, a triangular solve of R rows by I
    columns) ran at 4 GFLOP/s: 1.77 ms against 0.28 ms for 14,036 x 16, with results equal to
    7e-16. Device arrays use their namespace's Cholesky factor and solve, with the
    pseudo-inverse where the factor has non-finite entries (CuPy does not raise)."""
    if is_numpy_array(M):
        W = normal_inverse_of(None, -1, np.asarray(V)).astype(M.dtype, copy=False)
        return matmul_rows(M, W, out if out is not None else np.empty((M.shape[0], W.shape[1]), dtype=M.dtype))
    xp = array_namespace(M)
    A = None
    try:
        if bool(xp.all(xp.isfinite(xp.linalg.cholesky(V)))):
            A = xp.linalg.solve(V, M.T).T
    except Exception:  # namespaces that raise (NumPy's LinAlgError) instead of returning NaN
        A = None
    if A is None or not bool(xp.all(xp.isfinite(A))):
        return M @ xp.linalg.pinv(V)
    return A


def update_mode(
    state: CPState,
    partials: Partial | Sequence[Partial],
    mode: int,
    first_iteration: bool,
    last_mode: bool,
    in_place: bool = False,
    sketch: Any = None,
    exact: Sequence[Partial] | None = None,
    nonneg: NonNegative | None = None,
) -> CPState:
    """One mode update of Algorithm 1 (lines 3-6), as one task: V = Hadamard product of the other
    modes' Grams; A = M V^+ with M the MTTKRP (the last partials of its reduction, summed here);
    columns normalized by their 2-norm on the first iteration and max-norm (at least 1) after, as
    Tensor Toolbox and pyttb do. Returns a new state (a copy: earlier futures stay valid, which
    Dask's recomputation after a lost worker relies on). After the last mode it also holds the
    inner-product terms of the fit.

    With ``in_place`` (the memory plan's choice when a second copy of the factors does not fit
    the worker) the new rows overwrite the old ones in ``state``'s own factor array, solved a
    block of rows at a time; the returned state shares that array. Earlier futures of the state
    then see the new rows, so a lost worker is resumed from the checkpoint rather than recomputed.

    Randomized CP-ALS passes the ``sketch`` (a :class:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet`):
    M is then the *sampled* MTTKRP and V the sketch's Gram ``sum_s w_s h_s h_s^T``, the normal
    equations of the sampled least-squares problem. The inner-product terms of the fit come from
    ``exact``, the exact MTTKRP partials of the last mode, when the fit is evaluated (else NaN).
    Where the state keeps leverage-score trees (STS-CP), the updated mode's tree is rebuilt.

    Nonnegative CP-ALS passes ``nonneg``: A is then ``nonneg.sweeps`` HALS sweeps on the same
    normal equations (column by column, ``a_r <- max(0, (M_r - A V_r + V_rr a_r) / (V_rr + reg))``,
    :mod:`~tensorflow_ooc.kernels.update.hals`), warm-started from the mode's current factor times
    the current weights (the model as it stands: HALS depends on its start, unlike the solve, and
    is invariant to how the scale is spread over the modes, so this equals TensorLy's
    unnormalized iteration), then normalized as above.
    """
    t0 = time.perf_counter()
    parts = [partials] if isinstance(partials, Partial) else list(partials)
    inner_parts = parts if sketch is None else (list(exact) if exact is not None else None)
    if sketch is not None and not any(bool(np.any(p.rows)) for p in parts):
        out = _keep_mode(state, mode, last_mode, inner_parts)
    else:
        V = None if sketch is None else sketch.gram().astype(state.dtype)
        with one_blas_thread():
            hit, rows = None, parts
            if sketch is not None and nonneg is None and is_numpy_array(state.data):
                # a sketch that hits few rows is solved over them; else its sum, formed once here
                hit, M = _sketch_rows(parts, state.shape[mode])
                rows = [Partial(0, M)]
            if hit is not None:
                out = _update_mode_sparse(state, hit, M, mode, first_iteration, last_mode, V, inner_parts, in_place)
            else:
                if in_place and is_numpy_array(state.data):
                    out = _update_mode_in_place(state, rows, mode, first_iteration, last_mode, V, inner_parts, nonneg)
                else:
                    out = _update_mode(state, rows, mode, first_iteration, last_mode, V, inner_parts, nonneg)
                if state.trees is not None:
                    out.trees = list(state.trees)
                    out.trees[mode] = build_tree(to_host(out.views[mode]))
    out.timings = {**state.timings, mode: (max(p.seconds for p in parts), time.perf_counter() - t0)}
    out.sampling = (
        {**state.sampling, mode: getattr(sketch, "seconds", 0.0)} if sketch is not None else dict(state.sampling)
    )
    out.reads = dict(state.reads)
    if sketch is not None:
        out.reads[mode] = merged_reads(*(p.reads for p in parts)) or {}
    out.fit_seconds = max((p.seconds for p in exact), default=0.0) if (sketch is not None and exact) else 0.0
    # the finish time after every step the update's seconds count: a record's per-mode seconds then
    # always fit inside its iteration, timed from the finish before (a sweep run ahead)
    out.finished = {**out.finished, mode: time.time()}
    return out


def _keep_mode(state: CPState, mode: int, last_mode: bool, inner_parts: Sequence[Partial] | None) -> CPState:
    """No sampled fiber held a nonzero (too few samples for a very sparse tensor): the sketched
    right-hand side is zero and would zero the factor. Keep the mode's factor instead, and count
    it in ``empty_sketches`` so the driver can say so."""
    out = _with_arrays(state, state.data, list(state.grams))
    out.finished = {**state.finished, mode: time.time()}
    out.inner = _inner(state.views[mode], inner_parts, last_mode, state.inner)
    out.empty_sketches = {**state.empty_sketches, mode: state.empty_sketches.get(mode, 0) + 1}
    return out


def _sketch_rows(parts: list[Partial], nrows: int) -> tuple[np.ndarray | None, np.ndarray]:
    """A sampled MTTKRP as (its hit rows, their rows) when it hits at most ``nrows / SPARSE_ROWS``
    rows, else (None, the whole (nrows, R) MTTKRP). Dense partials (the in-memory and scanning
    paths) are summed, then their nonzero rows taken, so every path updates the same rows."""
    if all(p.index is not None for p in parts):
        hit, M = sparse_sum(parts)
        if hit.shape[0] * SPARSE_ROWS <= nrows:
            return hit, M
    M = full_rows(parts, nrows)
    hit = nonzero_rows(M)
    if hit.shape[0] * SPARSE_ROWS <= nrows:
        return hit, M[hit]
    return None, M


def _update_mode_sparse(
    state: CPState,
    hit: np.ndarray,
    M: np.ndarray,
    mode: int,
    first_iteration: bool,
    last_mode: bool,
    V: np.ndarray,
    inner_parts: Sequence[Partial] | None,
    in_place: bool,
) -> CPState:
    """A sketched update whose MTTKRP ``M`` is nonzero in the rows ``hit`` only: A = M V^+ is zero
    elsewhere, so the solve, the column norms, the Gram and the segment tree's leaves are computed
    over those rows, and only the rows the mode's last sketched update left nonzero are zeroed."""
    data = state.data if in_place else aligned_copy(state.data)
    out = CPState(state.shape, state.rank, state.dtype, data, grams=list(state.grams))
    out.empty_sketches = state.empty_sketches
    A = out.views[mode]
    old = state.support.get(mode)
    if old is None:
        A[...] = 0
    else:
        A[old] = 0
    Ah = np.matmul(M, normal_inverse_of(None, -1, V).astype(A.dtype, copy=False))
    stats = column_sum_squares(Ah) if first_iteration else column_max_abs(Ah)
    weights = np.sqrt(stats) if first_iteration else np.maximum(stats, 1.0)
    if not (weights == 0).all():
        Ah *= (1 / np.where(weights == 0, 1, weights)).astype(A.dtype)
    A[hit] = Ah
    out.weights = weights.astype(np.float64)
    out.grams[mode] = Ah.T @ Ah
    out.support = {**state.support, mode: hit}
    out.trees = state.trees
    if state.trees is not None:
        out.trees = list(state.trees)
        if in_place and old is not None:  # the tree is the factor's, which changes in place too
            out.trees[mode] = update_tree(state.trees[mode], A, np.concatenate([old, hit]))
        else:
            out.trees[mode] = build_tree(A)
    out.finished = {**state.finished, mode: time.time()}
    out.inner = _inner(A, inner_parts, last_mode, state.inner)
    return out


def _normal_matrix(state: CPState, mode: int, V: Any, xp: Any = np) -> Any:
    """V of the normal equations: given (a sketch's Gram), or the Hadamard product of the other
    modes' Grams."""
    if V is not None:
        return xp.asarray(V)
    V = xp.ones((state.rank, state.rank), dtype=state.data.dtype)
    for m, g in enumerate(state.grams):
        if m != mode:
            V = V * g
    return V


def _inner(A: Any, parts: Sequence[Partial] | None, last_mode: bool, previous: np.ndarray) -> np.ndarray:
    if not last_mode:
        return previous
    if parts is None:
        return np.full(A.shape[1], np.nan)
    return inner_terms(A, parts)


def _update_mode(
    state: CPState,
    parts: list[Partial],
    mode: int,
    first_iteration: bool,
    last_mode: bool,
    V: Any = None,
    inner_parts: Sequence[Partial] | None = None,
    nonneg: NonNegative | None = None,
) -> CPState:
    xp = array_namespace(state.data)
    R = state.rank
    V = _normal_matrix(state, mode, V, xp)
    M = xp.asarray(full_rows(parts, state.shape[mode]))
    if is_numpy_array(M):
        return _update_mode_numpy(state, M, V, mode, first_iteration, last_mode, inner_parts, nonneg)
    if nonneg is not None:
        A = state.views[mode] * xp.asarray(hals_start_scale(state.weights), dtype=state.data.dtype)  # a new array
        hals_columns(A, M, V, nonneg.reg, nonneg.sweeps)
    else:
        A = solve_normal(V, M)
    if first_iteration:
        weights = xp.sqrt(xp.sum(A * A, axis=0))
    else:
        weights = xp.maximum(xp.max(xp.abs(A), axis=0), xp.asarray(1, dtype=A.dtype))
    if not bool(xp.all(weights == 0)):
        A = A / xp.where(weights == 0, xp.asarray(1, dtype=A.dtype), weights)
    out = CPState(state.shape, R, state.dtype, xp.asarray(state.data, copy=True), grams=state.grams)
    out.trees, out.empty_sketches = state.trees, state.empty_sketches
    out.support = _without(state.support, mode)
    out.views[mode][...] = A
    out.grams[mode] = A.T @ A
    out.weights = to_host(weights).astype(np.float64)
    out.finished = {**state.finished, mode: time.time()}
    out.inner = _inner(out.views[mode], inner_parts, last_mode, state.inner)
    return out


def _update_mode_numpy(
    state: CPState,
    M: np.ndarray,
    V: np.ndarray | None,
    mode: int,
    first_iteration: bool,
    last_mode: bool,
    inner_parts: Sequence[Partial] | None,
    nonneg: NonNegative | None = None,
) -> CPState:
    """:func:`_update_mode` for NumPy states: the new rows go into a copy of the state (the
    algebra is :func:`_solve_rows`)."""
    out = CPState(state.shape, state.rank, state.dtype, aligned_copy(state.data), grams=state.grams)
    out.trees, out.empty_sketches = state.trees, state.empty_sketches
    out.support = _without(state.support, mode)
    A = out.views[mode]
    out.weights, out.grams[mode] = _solve_rows(
        A, [(0, state.shape[mode], M)], state.grams, mode, V, first_iteration, nonneg, state.weights
    )
    out.finished = {**state.finished, mode: time.time()}
    out.inner = _inner(A, inner_parts, last_mode, state.inner)
    return out


def _update_mode_in_place(
    state: CPState,
    parts: list[Partial],
    mode: int,
    first_iteration: bool,
    last_mode: bool,
    V: Any = None,
    inner_parts: Sequence[Partial] | None = None,
    nonneg: NonNegative | None = None,
) -> CPState:
    """:func:`_update_mode` writing A into the mode's rows of ``state.data``: beyond the state and
    the MTTKRP it needs no (I_n x R) temporary."""
    # partials with disjoint rows (one, or a reduce-scatter's slices) are solved where they are,
    # so no (I_n x R) sum is formed; overlapping ones are summed first
    spans = sorted(((p.lo, p.lo + p.rows.shape[0], p.rows) for p in parts if p.rows.shape[0]), key=lambda t: t[:2])
    if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
        spans = [(0, state.shape[mode], full_rows(parts, state.shape[mode]))]
    A = state.views[mode]
    grams = list(state.grams)
    weights, grams[mode] = _solve_rows(A, spans, state.grams, mode, V, first_iteration, nonneg, state.weights)
    out = CPState(state.shape, state.rank, state.dtype, state.data, grams=grams)
    out.trees, out.empty_sketches = state.trees, state.empty_sketches
    out.support = _without(state.support, mode)
    out.weights = weights
    out.finished = {**state.finished, mode: time.time()}
    out.inner = _inner(A, inner_parts, last_mode, state.inner)
    return out


def _solve_rows(
    A: np.ndarray,
    spans: list[tuple[int, int, np.ndarray]],
    grams: list,
    mode: int,
    V: Any,
    first_iteration: bool,
    nonneg: NonNegative | None = None,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1, lines 4-6, into A (a mode's factor rows) for NumPy states: A = M V^+ with M
    given as row spans ``(lo, hi, rows)`` (rows outside them are zero), columns normalized by
    their 2-norm on the first iteration and max-norm (at least 1) after, as Tensor Toolbox and
    pyttb do. Returns the weights (float64) and the new Gram A^T A.

    V^+ is one numba call (:func:`~tensorflow_ooc.kernels.update.normal_equations.normal_inverse_of`),
    then one GEMM per span. Solving the I right-hand sides with V's Cholesky factor instead
    (LAPACK potrs, a triangular solve of R rows by I columns) ran at 4 GFLOP/s: 1.77 ms against
    0.28 ms for 14,036 x 16 (1.8 s against 0.09 s for 4.8 M rows). Column statistics are one
    row-major pass (:mod:`~tensorflow_ooc.kernels.update.column_scale`).

    The new Gram is the product of the normalized rows, as a resumed run recomputes it from its
    checkpoint: a Gram scaled from the unnormalized product differs in the last bits, and a run
    resumed from a checkpoint then drifted from the uninterrupted one (a fit of 1 against
    1 - 2e-8 on an exactly fitted planted model).

    With ``nonneg`` (nonnegative CP-ALS) each span's rows are instead its HALS sweeps, from A's
    rows times ``weights`` (the current model); rows outside the spans are 0, which is what HALS
    gives them (a zero right-hand side, a nonnegative V and a nonnegative start: every column's
    update is <= 0 in the first sweep)."""
    R = A.shape[1]
    if nonneg is not None:
        Vn = _hadamard_except(grams, mode, R) if V is None else np.asarray(V, dtype=np.float64)
        start = hals_start_scale(np.ones(R) if weights is None else weights).astype(A.dtype)
    else:
        Vinv = normal_inverse_of(grams, mode, None if V is None else np.asarray(V)).astype(A.dtype, copy=False)
    prev = 0
    for lo, hi, M in spans:
        A[prev:lo] = 0
        if nonneg is not None:
            A[lo:hi] *= start
            hals_rows(A[lo:hi], M, Vn, nonneg.reg, nonneg.sweeps)
        else:
            matmul_rows(M, Vinv, A[lo:hi])
        prev = hi
    A[prev:] = 0
    stats = [column_sum_squares(A[lo:hi]) if first_iteration else column_max_abs(A[lo:hi]) for lo, hi, _ in spans]
    if first_iteration:
        weights = np.sqrt(np.sum(stats, axis=0)) if stats else np.zeros(R)
    else:
        weights = np.maximum(np.max(stats, axis=0) if stats else np.zeros(R), 1.0)
    if not (weights == 0).all():
        scale = (1 / np.where(weights == 0, 1, weights)).astype(A.dtype)
        for lo, hi, _ in spans:
            A[lo:hi] *= scale
    return weights.astype(np.float64), gram_rows(A)


def hals_start_scale(weights: np.ndarray) -> np.ndarray:
    """The column scale of a HALS warm start: the current weights (the factor times them is the
    model as it stands), with 1 for a zero weight. A zero weight is a zero column of the mode
    updated last, which makes this mode's V[r, r] zero, so HALS keeps the column as it starts;
    scaled by 0 it would become zero here and in every later mode, a component lost for good,
    where TensorLy keeps the other modes' columns and the zero one comes back at its next update."""
    w = np.asarray(weights, dtype=np.float64)
    return np.where(w == 0, 1.0, w)


def _hadamard_except(grams: Sequence[Any], mode: int, R: int) -> np.ndarray:
    """V = the Hadamard product of the Grams other than ``mode``'s, in float64."""
    V = np.ones((R, R))
    for m, g in enumerate(grams):
        if m != mode:
            V *= np.asarray(g, dtype=np.float64)
    return V


def hals_columns(A: Any, M: Any, V: Any, reg: float, sweeps: int) -> Any:
    """:func:`~tensorflow_ooc.kernels.update.hals.hals_rows` for any array namespace (device
    arrays: CuPy), in place on ``A``: per sweep, one matrix-vector product per column,
    ``a_r <- max(0, (M_r - A V_r + V_rr a_r) / (V_rr + reg))``. NaN stays NaN."""
    xp = array_namespace(A)
    diag = np.diagonal(np.asarray(to_host(V), dtype=np.float64))
    Vd = xp.asarray(V, dtype=A.dtype)
    for _ in range(sweeps):
        for r in range(A.shape[1]):
            den = float(diag[r]) + reg
            if not den > 0:
                continue
            x = (M[:, r] - A @ Vd[:, r] + float(diag[r]) * A[:, r]) / den
            A[:, r] = xp.where(x < 0, xp.zeros_like(x), x)
    return A


def full_rows(parts: Sequence[Partial], nrows: int) -> np.ndarray:
    """The summed partials as the whole (nrows, R) MTTKRP (no copy when one partial covers it)."""
    p0 = parts[0]
    if len(parts) == 1 and p0.lo == 0 and p0.rows.shape[0] == nrows:
        return p0.rows
    M = np.zeros((nrows, p0.rows.shape[1]), dtype=p0.rows.dtype)
    for p in parts:
        M[p.lo : p.lo + p.rows.shape[0]] += p.rows
    return M


@dataclass
class Summary:
    """The small part of a state the driver reads once per iteration."""

    weights: np.ndarray
    grams: list[np.ndarray]
    inner: np.ndarray
    finished: dict[int, float]
    timings: dict[int, tuple[float, float]]
    sampling: dict[int, float]
    fit_seconds: float
    empty_sketches: dict[int, int]
    reads: dict[int, dict] = field(default_factory=dict)


def summary(state: CPState, copy: bool = False) -> Summary:
    """What the driver reads of ``state``; with ``copy`` its arrays are copies (a summary kept
    while later updates of the same task may write the state's arrays in place)."""
    own = (lambda a: np.array(a, copy=True)) if copy else (lambda a: a)
    return Summary(
        own(to_host(state.weights)),
        [own(to_host(g)) for g in state.grams],
        own(to_host(state.inner)),
        dict(state.finished),
        dict(state.timings),
        dict(state.sampling),
        state.fit_seconds,
        dict(state.empty_sketches),
        dict(state.reads),
    )


def sweep_summaries(state: CPState) -> dict[int, Summary]:
    """The summaries of the sweeps of the task that made ``state`` (see
    :func:`~.cp_steps.exact_sweeps`), by iteration."""
    return dict(getattr(state, "sweeps", {}))


def inner_terms(A: Any, partials: Sequence[Partial]) -> np.ndarray:
    """Per component r: sum_i A_n[i, r] M_n[i, r]; with the weights this is <X, model>."""
    if is_numpy_array(A):
        out = np.zeros(A.shape[1], dtype=np.float64)
        for p in partials:
            out += np.einsum("ir,ir->r", A[p.lo : p.lo + p.rows.shape[0]], p.rows)
        return out
    xp = array_namespace(A)
    out = xp.zeros(A.shape[1], dtype=xp.float64)
    for p in partials:
        out += xp.sum(A[p.lo : p.lo + p.rows.shape[0]] * xp.asarray(p.rows), axis=0)
    return to_host(out)


def _with_arrays(state: CPState, data: Any, grams: list) -> CPState:
    """``state`` with its factors and Grams replaced by ``data`` and ``grams`` (moved arrays)."""
    out = CPState(state.shape, state.rank, state.dtype, data, grams=grams)
    out.weights, out.inner, out.finished, out.timings = (
        state.weights,
        state.inner,
        dict(state.finished),
        dict(state.timings),
    )
    out.sampling, out.trees, out.reads = dict(state.sampling), state.trees, dict(state.reads)
    out.fit_seconds, out.empty_sketches = state.fit_seconds, state.empty_sketches
    out.support = state.support
    return out


def _without(support: dict[int, np.ndarray], mode: int) -> dict[int, np.ndarray]:
    """``support`` after a dense update of ``mode`` (its rows may now be nonzero anywhere)."""
    return {m: rows for m, rows in support.items() if m != mode}


def on_device(state: CPState) -> CPState:
    """The state with its factors and Grams moved to the GPU as CuPy arrays, when CuPy and a real
    device are there (GPU workers); else unchanged (the simulator, or no CuPy)."""
    from ...kernels.gpu.device import visible_gpu_count

    try:
        import cupy
    except ImportError:
        return state
    if visible_gpu_count() == 0:
        return state
    return _with_arrays(state, cupy.asarray(state.data), [cupy.asarray(g) for g in state.grams])


def on_host(state: CPState) -> CPState:
    """The state with NumPy factors and Grams (for checkpoints and the result)."""
    if is_numpy_array(state.data):
        return state
    return _with_arrays(state, to_host(state.data), [to_host(g) for g in state.grams])


def factor_rows(state: CPState, mode: int) -> np.ndarray:
    """Mode ``mode``'s factor matrix (a view of the state: sent without another copy)."""
    return state.views[mode]


def random_factors(shape: tuple[int, ...], rank: int, seed: int | None, dtype: str) -> CPState:
    """Uniform [0, 1) initial factors, mode by mode from one generator (reproducible by seed)."""
    rng = np.random.default_rng(check_seed(seed))
    out = StackedFactors(shape, rank, dtype)
    for v in out.views:
        if v.dtype == np.float64:
            rng.random(out=v)  # straight into the stack: no second copy of a long mode
        else:
            v[...] = rng.random(v.shape)
    return CPState.of(out)


def stack(factors: list[np.ndarray] | StackedFactors, dtype: str, weights: np.ndarray | None = None) -> CPState:
    """Initial state from given factors (a list, or the stacked factors of a checkpoint)."""
    if isinstance(factors, StackedFactors):
        state = CPState(factors.shape, factors.rank, dtype, np.ascontiguousarray(factors.data, dtype=dtype))
    else:
        state = CPState.of(StackedFactors.from_list(factors, dtype))
    if weights is not None:
        state.weights = np.asarray(weights, dtype=np.float64)
    return state


def stacked_copy(factors: list[np.ndarray] | StackedFactors, dtype: str) -> StackedFactors:
    """Initial factors for a worker: its own copy (workers sharing a process must not share it)."""
    if isinstance(factors, StackedFactors):
        return StackedFactors(factors.shape, factors.rank, dtype, np.array(factors.data, dtype=dtype, order="C"))
    return StackedFactors.from_list([np.asarray(f) for f in factors], dtype)
