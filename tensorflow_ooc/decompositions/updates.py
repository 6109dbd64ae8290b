"""The CP-ALS mode update, as small functions the Dask workers run (Algorithm 1, lines 3-6)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..execution.tasks import Partial
from ..kernels import StackedFactors


@dataclass
class ModeUpdate:
    """A new factor matrix with its column weights and Gram matrix."""

    factor: np.ndarray    # (I_n, R), columns normalized
    weights: np.ndarray   # (R,)
    gram: np.ndarray      # (R, R)


def solve_normal(V: np.ndarray, M: np.ndarray) -> np.ndarray:
    """A = M V^+ for the symmetric R x R Hadamard product of Grams V: Cholesky when V is positive
    definite, else the pseudo-inverse (rank-deficient or zero Grams)."""
    try:
        L = np.linalg.cholesky(V)
        return np.linalg.solve(L.T, np.linalg.solve(L, M.T)).T
    except np.linalg.LinAlgError:
        return M @ np.linalg.pinv(V)


def update_factor(partial: Partial, V: np.ndarray, nrows: int, first_iteration: bool) -> ModeUpdate:
    """Solve for the new factor from the reduced MTTKRP and normalize its columns: 2-norm on the
    first iteration, max-norm (at least 1) after, as Tensor Toolbox and pyttb do."""
    M = np.zeros((nrows, partial.rows.shape[1]), dtype=partial.rows.dtype)
    M[partial.lo:partial.lo + partial.rows.shape[0]] = partial.rows
    A = solve_normal(V.astype(M.dtype, copy=False), M)
    if first_iteration:
        weights = np.sqrt((A * A).sum(axis=0))
    else:
        weights = np.maximum(np.abs(A).max(axis=0), 1)
    if not (weights == 0).all():
        A = A / np.where(weights == 0, 1, weights)
    return ModeUpdate(np.ascontiguousarray(A), weights, A.T @ A)


def summary(update: ModeUpdate) -> tuple[np.ndarray, np.ndarray]:
    """The small part the driver reads: (weights, Gram)."""
    return update.weights, update.gram


def restack(factors: StackedFactors, update: ModeUpdate, mode: int) -> StackedFactors:
    """New stacked factors with mode ``mode`` replaced (a copy: earlier futures stay valid)."""
    out = StackedFactors(factors.shape, factors.rank, factors.dtype, factors.data.copy())
    out.views[mode][...] = update.factor
    return out


def inner_terms(update: ModeUpdate, partial: Partial) -> np.ndarray:
    """Per component r: sum_i A_n[i, r] M_n[i, r]; with the weights this is <X, model>."""
    lo = partial.lo
    A = update.factor[lo:lo + partial.rows.shape[0]]
    return (A * partial.rows).sum(axis=0)


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
