"""The CP-ALS mode update, as small functions the Dask workers run (Algorithm 1, lines 3-6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from ..execution.tasks import Partial
from ..kernels import StackedFactors


@dataclass
class ModeUpdate:
    """A new factor matrix with its column weights and Gram matrix."""

    factor: np.ndarray    # (I_n, R), columns normalized
    weights: np.ndarray   # (R,)
    gram: np.ndarray      # (R, R)


def solve_normal(V: np.ndarray, M: np.ndarray) -> np.ndarray:
    """A = M V^+ for the symmetric R x R Hadamard product of Grams V: Cholesky (LAPACK potrf and
    potrs, M^T passed without a copy) when V is positive definite, else the pseudo-inverse
    (rank-deficient or zero Grams)."""
    try:
        return cho_solve(cho_factor(V, lower=True, check_finite=False), M.T, check_finite=False).T
    except np.linalg.LinAlgError:
        return M @ np.linalg.pinv(V)


def update_factor(partials: Partial | Sequence[Partial], V: np.ndarray, nrows: int,
                  first_iteration: bool) -> ModeUpdate:
    """Solve for the new factor from the MTTKRP (the last partials of its reduction, summed
    here) and normalize its columns: 2-norm on the first iteration, max-norm (at least 1)
    after, as Tensor Toolbox and pyttb do."""
    parts = [partials] if isinstance(partials, Partial) else list(partials)
    M = full_rows(parts, nrows)
    A = solve_normal(V.astype(M.dtype, copy=False), M)
    if first_iteration:
        weights = np.sqrt((A * A).sum(axis=0))
    else:
        weights = np.maximum(np.abs(A).max(axis=0), 1)
    if not (weights == 0).all():
        A = A / np.where(weights == 0, 1, weights)
    return ModeUpdate(np.ascontiguousarray(A), weights, A.T @ A)


def full_rows(parts: Sequence[Partial], nrows: int) -> np.ndarray:
    """The summed partials as the whole (nrows, R) MTTKRP (no copy when one partial covers it)."""
    p0 = parts[0]
    if len(parts) == 1 and p0.lo == 0 and p0.rows.shape[0] == nrows:
        return p0.rows
    M = np.zeros((nrows, p0.rows.shape[1]), dtype=p0.rows.dtype)
    for p in parts:
        M[p.lo:p.lo + p.rows.shape[0]] += p.rows
    return M


def summary(update: ModeUpdate) -> tuple[np.ndarray, np.ndarray]:
    """The small part the driver reads: (weights, Gram)."""
    return update.weights, update.gram


def restack(factors: StackedFactors, update: ModeUpdate, mode: int) -> StackedFactors:
    """New stacked factors with mode ``mode`` replaced (a copy: earlier futures stay valid)."""
    out = StackedFactors(factors.shape, factors.rank, factors.dtype, factors.data.copy())
    out.views[mode][...] = update.factor
    return out


def inner_terms(update: ModeUpdate, partials: Partial | Sequence[Partial]) -> np.ndarray:
    """Per component r: sum_i A_n[i, r] M_n[i, r]; with the weights this is <X, model>."""
    out = np.zeros(update.factor.shape[1], dtype=np.float64)
    for p in ([partials] if isinstance(partials, Partial) else partials):
        A = update.factor[p.lo:p.lo + p.rows.shape[0]]
        out += np.einsum("ir,ir->r", A, p.rows)
    return out


def random_factors(shape: tuple[int, ...], rank: int, seed: int | None, dtype: str) -> StackedFactors:
    """Uniform [0, 1) initial factors, mode by mode from one generator (reproducible by seed)."""
    rng = np.random.default_rng(seed)
    out = StackedFactors(shape, rank, dtype)
    for v in out.views:
        v[...] = rng.random(v.shape)
    return out


def stack(factors: list[np.ndarray], dtype: str) -> StackedFactors:
    return StackedFactors.from_list(factors, dtype)


def gram(factors: StackedFactors, mode: int) -> np.ndarray:
    A = factors.views[mode]
    return A.T @ A
