"""Sketched CP updates over the hit rows only: a sampled MTTKRP that hits few rows is kept as those
rows (a sparse partial), and the update solves, normalizes, sums the Gram and rebuilds the
leverage-score tree over them, against dense NumPy references and the dense update."""

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.cp.randomized import draw_samples, with_trees
from tensorflow_ooc.decompositions.cp.updates import random_factors, update_mode
from tensorflow_ooc.execution.fiber_reads import indexed_sampled_partial
from tensorflow_ooc.execution.partials import SPARSE_ROWS, Partial, sparse_sum
from tensorflow_ooc.execution.tasks import combine
from tensorflow_ooc.kernels.sampling.krp_sampler import SampleSet, build_tree, update_tree


def test_update_tree_equals_a_fresh_build(rng):
    I, R = int(rng.integers(300, 3000)), int(rng.integers(1, 9))
    U = rng.standard_normal((I, R))
    leaf = int(rng.integers(1, 40))
    tree = build_tree(U, leaf_rows=leaf)
    for _ in range(3):
        rows = rng.choice(I, int(rng.integers(1, I // 5)), replace=False)
        U[rows] = np.where(rng.random((rows.shape[0], 1)) < 0.3, 0.0, rng.standard_normal((rows.shape[0], R)))
        update_tree(tree, U, np.concatenate([rows, rows[:3]]))  # repeats allowed
        assert np.array_equal(tree.grams, build_tree(U, leaf_rows=leaf).grams)  # the same sums
    with pytest.raises(ValueError, match="outside"):
        update_tree(tree, U, np.array([I + 10 * leaf]))


def test_sparse_sum_and_combine_equal_the_dense_sum(rng):
    n, R = 500, 3
    parts, dense = [], np.zeros((n, R))
    for _ in range(4):
        idx = np.sort(rng.choice(n, int(rng.integers(0, 60)), replace=False))
        rows = rng.standard_normal((idx.shape[0], R))
        parts.append(Partial(0, rows, index=idx))
        dense[idx] += rows
    index, rows = sparse_sum(parts)
    got = np.zeros((n, R))
    got[index] = rows
    assert np.array_equal(got, dense) and np.all(np.diff(index) > 0)
    both = combine(*parts)
    assert both.index is not None
    # a dense partial among them: one dense sum over their span
    lo = int(rng.integers(0, 100))
    extra = rng.standard_normal((50, R))
    mixed = combine(*parts, Partial(lo, extra))
    assert mixed.index is None
    want = dense.copy()
    want[lo : lo + 50] += extra
    full = np.zeros((n, R))
    mixed.add_into(full)
    np.testing.assert_allclose(full, want, rtol=0, atol=1e-14)


def _reference_update(state, mode, M, V, first):
    """Dense NumPy: A = M V^+, columns normalized (2-norm first, max-norm at least 1 after)."""
    A = M @ np.linalg.pinv(V)
    w = np.sqrt((A * A).sum(0)) if first else np.maximum(np.abs(A).max(0), 1.0)
    return A / np.where(w == 0, 1, w), w


@pytest.mark.parametrize("in_place", [False, True])
def test_sparse_sketched_update_against_dense_numpy(rng, in_place):
    shape = (int(rng.integers(2000, 4000)), 30, 25)
    R = int(rng.integers(2, 6))
    state = with_trees(random_factors(shape, R, int(rng.integers(1 << 30)), "float64"))
    mode = 0
    for step in range(3):  # the second and third zero only the rows the one before left nonzero
        S = draw_samples(state, mode, "sts", 200, (1, step, mode))
        hit = np.sort(rng.choice(shape[0], int(rng.integers(5, shape[0] // (2 * SPARSE_ROWS))), replace=False))
        rows = rng.standard_normal((hit.shape[0], R))
        M = np.zeros((shape[0], R))
        M[hit] = rows
        first = step == 0
        dense_in = Partial(0, M.copy())
        before = state.data.copy()
        out = update_mode(state, Partial(0, rows, index=hit), mode, first, False, in_place=in_place, sketch=S)
        want, w = _reference_update(state, mode, M, S.gram(), first)
        np.testing.assert_allclose(out.views[mode], want, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out.weights, w, rtol=1e-9)
        np.testing.assert_allclose(out.grams[mode], want.T @ want, rtol=1e-9, atol=1e-12)
        assert np.array_equal(out.trees[mode].grams, build_tree(out.views[mode]).grams)
        for m in (1, 2):
            assert np.array_equal(out.views[m], before[state.offsets[m] : state.offsets[m] + shape[m]])
        assert np.array_equal(out.support[mode], hit)
        if not in_place:  # the dense partial of the same rows takes the same path: bit-identical
            again = update_mode(state, dense_in, mode, first, False, in_place=False, sketch=S)
            assert np.array_equal(again.views[mode], out.views[mode])
            assert np.array_equal(again.grams[mode], out.grams[mode])
            assert np.array_equal(state.data, before)  # the input state is untouched
        state = out
    # an exact (dense) update of the mode forgets its support
    exact = update_mode(state, Partial(0, rng.standard_normal((shape[0], R))), mode, False, False)
    assert mode not in exact.support


def test_index_gather_keeps_few_hit_rows_sparse(tmp_path, rng):
    shape = (int(rng.integers(3000, 6000)), 40, 30)
    coords, values = random_coo(rng, shape, 30000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape, chunk_nnz=1024)
    tfo.build_fiber_index(store, [0], chunk_nnz=128)
    # 12 fibers of about 25 nonzeros: at most 300 of at least 3000 rows hit
    hits = np.unique(coords[rng.integers(0, coords.shape[0], 12)][:, 1:], axis=0)
    hits = np.concatenate([np.zeros((hits.shape[0], 1), dtype=hits.dtype), hits], axis=1)
    R, n = 4, hits.shape[0]
    S = SampleSet(0, hits, rng.random(n) + 0.5, rng.standard_normal((n, R)), n)
    got = indexed_sampled_partial(str(store.path), S, 0)
    assert got.index is not None and 0 < got.index.shape[0] * SPARSE_ROWS <= shape[0]
    assert got.rows.shape == (got.index.shape[0], R)
    # against dense NumPy: X_(0) times the sampled rows of the Khatri-Rao product, weighted
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    want = np.zeros((shape[0], R))
    Hw = S.weighted_rows()
    for s, (_, j, k) in enumerate(S.coords):
        want += np.outer(X[:, j, k], Hw[s])
    full = np.zeros_like(want)
    got.add_into(full)
    np.testing.assert_allclose(full, want, rtol=1e-12, atol=1e-12)
    assert np.array_equal(got.index, np.flatnonzero(np.abs(want).sum(1)))


def test_sts_on_a_long_mode_through_the_index_equals_in_memory(tmp_path, rng):
    # fibers of about 3 nonzeros and 120 draws: a few hundred of at least 6000 rows hit
    shape = (int(rng.integers(6000, 9000)), int(rng.integers(40, 60)), int(rng.integers(40, 60)))
    coords, values = random_coo(rng, shape, 8000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape, chunk_nnz=2048)
    plain = tfo.convert((coords, values), tmp_path / "plain", shape=shape, chunk_nnz=2048)
    tfo.build_fiber_index(store, "all", chunk_nnz=256)
    kw = dict(method="sts", samples=120, seed=int(rng.integers(1 << 30)), max_iters=4, partitions=1, warmup=0)
    mem = tfo.cp_als(plain, 3, execution="in-memory", **kw)
    idx = tfo.cp_als(store, 3, execution="streaming", **kw)
    assert set(idx.params["sampled_reads"].values()) == {"index"}
    for a, b in zip(mem.factors, idx.factors):
        assert np.array_equal(a, b)  # sparse and dense partials: the same update
    # mode 0 was solved over its hit rows: every other row is zero
    A0 = idx.factors[0]
    assert 0 < np.count_nonzero(np.abs(A0).sum(1)) * SPARSE_ROWS <= shape[0]
