"""Randomized TT-ALS (rTT-ALS) against dense NumPy on random sparse counts (not planted): the draws
follow the design's leverage scores, the sketched core update is the dense weighted least-squares
solve of the same draws, and the reported fit is the returned train's, never below 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.tt.tt_randomized import sketched_core
from tensorflow_ooc.decompositions.tt.tt_steps import check_ranks, initial_cores, left_orthonormalize
from tensorflow_ooc.kernels.sampling.tt_sampler import draw_core_samples

SHAPES = {3: (7, 6, 5), 4: (5, 4, 6, 4), 5: (4, 3, 4, 3, 3)}


def random_counts(rng, shape, density):
    """Sparse counts (1 + Poisson) at random cells: X dense, coords, values."""
    nnz = max(2, int(density * math.prod(shape)))
    coords, _ = random_coo(rng, shape, nnz)
    values = 1.0 + rng.poisson(2.0, coords.shape[0])
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    return X, coords, values


def store_of(tmp_path, name, coords, values, shape):
    return tfo.convert((coords, values), str(tmp_path / f"{name}.zarr"), shape=shape)


def to_dense(cores):
    out = cores[0]
    for c in cores[1:]:
        out = np.tensordot(out, c, axes=(-1, 0))
    return out.reshape([c.shape[1] for c in cores])


def canonical_cores(rng, shape, ranks, j):
    """Random cores with cores before ``j`` left- and after it right-orthonormal."""
    full = check_ranks(ranks, shape)
    cores = initial_cores("random", shape, full, int(rng.integers(1 << 30)))
    for k in range(j):
        left_orthonormalize(cores, k)
    return cores


def chain_matrices(cores, j):
    """Dense ``A_{<j}`` (prod I_<j, R_{j-1}) and ``A_{>j}^T`` (prod I_>j, R_j), rows in C order of
    the multi-indices."""
    left = np.ones((1, 1))
    for c in cores[:j]:
        left = np.einsum("sa,aib->sib", left, c).reshape(-1, c.shape[2])
    right = np.ones((1, 1))
    for c in cores[:j:-1]:
        right = np.einsum("aib,tb->ait", c, right).reshape(c.shape[0], -1).T
    return left, right


def dense_design(cores, j):
    """The design ``A_{<j} (x) A_{>j}^T`` with row ``(s, t)`` at ``s * len(t) + t``."""
    left, right = chain_matrices(cores, j)
    return np.einsum("sa,tb->stab", left, right).reshape(left.shape[0] * right.shape[0], -1)


def dense_fit(X, cores):
    return 1 - np.linalg.norm(X - to_dense(cores)) / np.linalg.norm(X)


@pytest.mark.parametrize("order", [3, 4, 5])
def test_draws_follow_the_leverage_scores(rng, order):
    shape = SHAPES[order]
    j = int(rng.integers(order))
    cores = canonical_cores(rng, shape, 2, j)
    A = dense_design(cores, j)
    np.testing.assert_allclose(A.T @ A, np.eye(A.shape[1]), atol=1e-10)  # orthonormal chains
    lev = np.einsum("rc,rc->r", A, A) / A.shape[1]
    J = 200_000
    s = draw_core_samples(cores, j, J, rng)
    assert s.counts.sum() == J
    rows = np.ravel_multi_index(tuple(np.delete(s.coords, j, axis=1).T), np.delete(shape, j))
    # the weights are counts / (J p) with p the design row's leverage score over its rank
    np.testing.assert_allclose(s.weights, s.counts / (J * lev[rows]), rtol=1e-10)
    freq = np.zeros(A.shape[0])
    freq[rows] = s.counts / J
    # total variation to the leverage distribution: about sqrt(rows / J) / 2 if drawn from it
    assert 0.5 * np.abs(freq - lev).sum() < 2 * math.sqrt(A.shape[0] / J), 0.5 * np.abs(freq - lev).sum()


@pytest.mark.parametrize("order", [3, 4, 5])
def test_sketched_update_is_the_dense_weighted_least_squares_of_its_draws(tmp_path, rng, order):
    shape = SHAPES[order]
    X, coords, values = random_counts(rng, shape, 0.3)
    store = store_of(tmp_path, "x", coords, values, shape)
    j = int(rng.integers(order))
    cores = canonical_cores(rng, shape, 3 if order == 3 else 2, j)
    seed = int(rng.integers(1 << 30))
    J = int(rng.integers(20, 400))
    got = sketched_core(store, cores, j, J, np.random.default_rng(seed))
    s = draw_core_samples(cores, j, J, np.random.default_rng(seed))  # the same draws
    # dense: the design rows of the draws from the dense chains, the sampled fibers X[s, :, t]
    A = dense_design(cores, j)
    other = np.delete(s.coords, j, axis=1)
    D = A[np.ravel_multi_index(tuple(other.T), np.delete(shape, j))]
    fibers = np.moveaxis(X, j, -1).reshape(-1, shape[j])[np.ravel_multi_index(tuple(other.T), np.delete(shape, j))]
    sw = np.sqrt(s.weights)[:, None]
    G, *_ = np.linalg.lstsq(sw * D, sw * fibers, rcond=None)  # (R_{j-1} R_j, I_j), the minimum-norm solution
    Ra, Rb = cores[j].shape[0], cores[j].shape[2]
    want = G.T.reshape(shape[j], Ra, Rb).transpose(1, 0, 2)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-8 * np.abs(want).max())


@pytest.mark.parametrize("order", [3, 4, 5])
def test_reported_fit_is_the_returned_trains_and_never_below_zero(tmp_path, rng, order):
    # few draws on random counts: the sketched cores are mostly noise, a train worse than zero
    # unless the fit comes from a state it is valid for
    shape = SHAPES[order]
    X, coords, values = random_counts(rng, shape, 0.2)
    store = store_of(tmp_path, "f", coords, values, shape)
    kw = dict(method="randomized", samples=int(rng.integers(4, 40)), seed=int(rng.integers(1 << 30)), tol=0)
    for sweeps in (1, 2, 3):  # seeded draws: each run's sweeps are the first sweeps of the longer ones
        r = tfo.tt_als(store, 2, max_sweeps=sweeps, **kw)
        truth = dense_fit(X, r.cores)
        assert r.fit >= 0 and truth >= 0, (r.fit, truth)
        assert abs(r.fit - truth) < 1e-9, (r.fit, truth)
        assert all(h["fit"] >= 0 for h in r.history)


@pytest.mark.parametrize("order", [4, 5])
def test_walks_prepared_ahead_are_the_ones_the_next_draws_walk(rng, order):
    """prepare_walks builds the walk structures of exactly the cached trees the draws for core ``j``
    walk (not the two cores next to ``j``, drawn by their slice masses, nor cores about to change),
    and the draws from those trees are the draws from trees built afresh."""
    from tensorflow_ooc.decompositions.tt.tt_randomized import draw_core, prepare_walks
    from tensorflow_ooc.decompositions.tt.tt_steps import start_state

    shape = SHAPES[order]
    ranks = check_ranks(2, shape)
    cores = initial_cores("random", shape, ranks, int(rng.integers(1 << 30)))
    seen = []
    for j in range(order):
        state = start_state(shape, ranks, cores)
        # cores before j left-orthonormal: draw with the canonical form the update keeps
        cs = [state.core(k).copy() for k in range(order)]
        for k in range(j):
            left_orthonormalize(cs, k)
        for k, c in enumerate(cs):
            state.set_core(k, c)
        fresh = draw_core(state.copy(), j, 300, (1, 2, j))
        # every tree of j's chains cached, none walked yet
        draw_core(state, j, 1, (0, 0, 0))
        for tr in state.trees.values():
            tr._walked = None
        skip = {int(rng.integers(order))}  # a core the update before changes
        prepare_walks(state, j, skip)
        walked = {k for (k, _), tr in state.trees.items() if tr._walked is not None}
        want = (set(range(j - 1)) | set(range(j + 2, order))) - skip
        assert walked == want
        seen.append(len(want))
        again = draw_core(state, j, 300, (1, 2, j))
        assert np.array_equal(again.coords, fresh.coords) and np.array_equal(again.weights, fresh.weights)
    assert max(seen) > 0
