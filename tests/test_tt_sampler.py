"""Orthonormal core-chain leverage sampling and the sketched TT core solve (seed 000, sections
5.3-5.4) against explicitly formed chain matricizations: draw frequencies (chi-square), reported
probabilities, the sketched solve against the exact least-squares core, and recovery of a planted
tensor train by sketched ALS sweeps."""

import itertools

import numpy as np
import pytest
from test_leverage_sampling import chi2_pvalue, exact_leverage

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.tt.tt_randomized import load_fibers, sketched_core, sketched_rhs, solve_sketched
from tensorflow_ooc.kernels.sampling.tt_sampler import (
    build_core_tree,
    chain_trees,
    design_rows,
    draw_core_samples,
    draw_left_chain,
    draw_right_chain,
    left_chain_rows,
    right_chain_rows,
)

J_STAT = 40_000  # draws per chi-square test


def random_cores(rng, shape, ranks):
    R = [1, *ranks, 1]
    return [rng.standard_normal((R[k], shape[k], R[k + 1])) for k in range(len(shape))]


def left_orthonormal(core):
    Ra, I, Rb = core.shape
    q, r = np.linalg.qr(core.reshape(Ra * I, Rb))
    return q.reshape(Ra, I, -1), r


def right_orthonormal(core):
    Ra, I, Rb = core.shape
    q, r = np.linalg.qr(core.reshape(Ra, I * Rb).T)
    return q.T.reshape(-1, I, Rb), r.T


def canonical(cores, j):
    """Cores before ``j`` left-orthonormal, after ``j`` right-orthonormal, the same tensor (the
    R factors pushed into core ``j``)."""
    cores = [c.copy() for c in cores]
    for k in range(j):
        cores[k], r = left_orthonormal(cores[k])
        cores[k + 1] = np.einsum("ab,bic->aic", r, cores[k + 1])
    for k in range(len(cores) - 1, j, -1):
        cores[k], r = right_orthonormal(cores[k])
        cores[k - 1] = np.einsum("aib,bc->aic", cores[k - 1], r)
    return cores


def left_matrix(cores, j):
    """``A_{<j}`` (prod I_{<j}, R_{j-1}), rows in C order of the multi-index."""
    M = np.ones((1, 1))
    for c in cores[:j]:
        M = np.einsum("pa,aib->pib", M, c).reshape(-1, c.shape[2])
    return M


def right_matrix(cores, j):
    """``A_{>j}^T`` (prod I_{>j}, R_j), rows in C order of the multi-index."""
    M = np.ones((1, 1))
    for c in reversed(cores[j + 1 :]):
        M = np.einsum("aib,pb->ipa", c, M).reshape(-1, c.shape[0])
    return M


def full(cores):
    X = np.ones((1, 1))
    for c in cores:
        X = np.einsum("pa,aib->pib", X, c).reshape(-1, c.shape[2])
    return X.reshape([c.shape[1] for c in cores])


# (shape, ranks): orders 3 to 5, ranks above some mode lengths (R_{k-1} I_k < R_k is impossible for
# an orthonormal core, so ranks stay within the mode products)
CASES = [
    ((5, 4, 6), (3, 2)),
    ((4, 3, 5, 3), (2, 3, 3)),
    ((3, 4, 2, 3), (3, 4, 3)),
    ((3, 2, 3, 2, 3), (2, 3, 3, 2)),
    ((2, 3, 2, 2, 3), (2, 2, 3, 3)),
    ((30, 20, 25), (2, 3)),  # long modes: trees of several levels
]


@pytest.mark.parametrize(
    "case, leaf_rows",
    [(c, None) for c in range(len(CASES))] + [(1, 1), (5, 1)],  # leaf_rows=1: the deepest trees
)
def test_chain_draws_follow_exact_leverage_scores(case, leaf_rows):
    shape, ranks = CASES[case]
    rng = np.random.default_rng(4000 + case)  # fixed: a statistical test
    N = len(shape)
    for j in range(N):
        cores = canonical(random_cores(rng, shape, ranks), j)
        trees = chain_trees(cores, j, leaf_rows)
        for side in ("left", "right"):
            if (side == "left" and j == 0) or (side == "right" and j == N - 1):
                continue
            if side == "left":
                idx, p = draw_left_chain(cores, j, J_STAT, np.random.default_rng(10 * case + j), trees)
                M, dims = left_matrix(cores, j), shape[:j]
            else:
                idx, p = draw_right_chain(cores, j, J_STAT, np.random.default_rng(10 * case + j + 5), trees)
                M, dims = right_matrix(cores, j), shape[j + 1 :]
            assert idx.shape == (J_STAT, len(dims)) and idx.dtype == np.int64
            cell = np.ravel_multi_index(tuple(idx.T), dims)
            lev = exact_leverage(M)
            # reported probabilities: squared row norms over the rank, the exact leverage scores
            np.testing.assert_allclose(p, lev[cell], rtol=1e-10, atol=1e-14)
            counts = np.bincount(cell, minlength=M.shape[0])
            pval = chi2_pvalue(counts, lev)
            assert pval > 1e-3, (shape, ranks, j, side, pval)
            # the test can tell distributions apart: the scores with the heaviest and lightest rows
            # swapped (where they differ: a square chain, R = prod I, has uniform scores)
            order = np.argsort(lev)
            if lev[order[-1]] > 1.5 * lev[order[0]]:
                swapped = lev.copy()
                swapped[order[[0, -1]]] = lev[order[[-1, 0]]]
                assert chi2_pvalue(counts, swapped) < 1e-6


def test_rows_trees_and_argument_errors():
    rng = np.random.default_rng(5)
    shape, ranks = (4, 3, 5, 3), (2, 3, 3)
    j = 2
    cores = canonical(random_cores(rng, shape, ranks), j)
    idx = np.stack([rng.integers(0, s, 7) for s in shape], axis=1)
    L = left_matrix(cores, j)[np.ravel_multi_index(tuple(idx[:, :j].T), shape[:j])]
    Rt = right_matrix(cores, j)[np.ravel_multi_index(tuple(idx[:, j + 1 :].T), shape[j + 1 :])]
    np.testing.assert_allclose(left_chain_rows(cores, j, idx[:, :j]), L, atol=1e-14)
    np.testing.assert_allclose(right_chain_rows(cores, j, idx[:, j + 1 :]), Rt, atol=1e-14)
    np.testing.assert_array_equal(left_chain_rows(cores, 0, np.zeros((7, 0), dtype=int)), np.ones((7, 1)))
    with pytest.raises(ValueError, match="out of range"):
        left_chain_rows(cores, j, idx[:, :j] + np.array(shape[:j]))
    with pytest.raises(ValueError, match="indices must be"):
        right_chain_rows(cores, j, idx[:, j:])

    # given trees give the same draws as trees built on the fly
    trees = chain_trees(cores, j)
    assert trees[j] is None and trees[0].side == "left" and trees[3].side == "right"
    for draw in (draw_left_chain, draw_right_chain):
        a = draw(cores, j, 500, np.random.default_rng(1), trees)
        b = draw(cores, j, 500, np.random.default_rng(1))
        np.testing.assert_array_equal(a[0], b[0])
    # a tree of the wrong side or shape is refused
    bad = list(trees)
    bad[0] = build_core_tree(cores[0], "right")
    with pytest.raises(ValueError, match="left tree"):
        draw_left_chain(cores, j, 10, rng, bad)
    with pytest.raises(ValueError, match="out of range"):
        draw_left_chain(cores, 4, 10, rng)
    with pytest.raises(ValueError, match="count"):
        draw_right_chain(cores, 1, 0, rng)
    with pytest.raises(ValueError, match="outer ranks"):
        draw_left_chain(cores[1:], 1, 10, rng)
    with pytest.raises(ValueError, match="left rank"):
        draw_left_chain([cores[0], cores[2]], 1, 10, rng)

    # the ends: empty chains
    idx0, p0 = draw_left_chain(cores, 0, 3, rng)
    assert idx0.shape == (3, 0) and np.all(p0 == 1)
    idx3, p3 = draw_right_chain(cores, 3, 3, rng)
    assert idx3.shape == (3, 0) and np.all(p3 == 1)


def exact_core(X, cores, j):
    """The exact least-squares core ``j``: the design is orthonormal, so ``G = D^T mat(X, j)^T``."""
    L = left_matrix(cores, j)
    Rt = right_matrix(cores, j)
    Ra, Rb = L.shape[1], Rt.shape[1]
    Xj = X.reshape(L.shape[0], X.shape[j], Rt.shape[0])
    return np.einsum("sa,sit,tb->aib", L, Xj, Rt).reshape(Ra, X.shape[j], Rb)


def as_store(X, path):
    coords = np.array(list(itertools.product(*[range(s) for s in X.shape])), dtype=np.int64)
    return tfo.convert((coords, X.ravel()), path, shape=X.shape, chunk_nnz=256, max_block_nnz=100)


def sparse_store(rng, shape, nnz, path):
    coords = np.unique(np.stack([rng.integers(0, s, nnz) for s in shape], axis=1), axis=0)
    values = rng.standard_normal(coords.shape[0])
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    return X, tfo.convert((coords, values), path, shape=shape, chunk_nnz=256, max_block_nnz=100)


@pytest.mark.parametrize("j", [0, 1, 3])
def test_sketched_core_approaches_the_exact_solution(tmp_path, j):
    rng = np.random.default_rng(77 + j)  # fixed: tolerances on a random sketch
    shape, ranks = (5, 4, 6, 3), (2, 3, 2)
    X, store = sparse_store(rng, shape, 150, tmp_path / "x.zarr")
    cores = canonical(random_cores(rng, shape, ranks), j)
    want = exact_core(X, cores, j)
    fibers = load_fibers(store)
    errs = []
    for J in (1000, 64000):
        got = sketched_core(fibers, cores, j, J, np.random.default_rng(J))
        assert got.shape == want.shape
        errs.append(np.linalg.norm(got - want) / np.linalg.norm(want))
    # the error of a leverage sketch falls as 1/sqrt(J)
    assert errs[1] < 0.1 and errs[1] < errs[0] / 3, errs
    # the same draws from the store itself (decoded for the call)
    a = sketched_core(store, cores, j, 1000, np.random.default_rng(3))
    b = sketched_core(fibers, cores, j, 1000, np.random.default_rng(3))
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("j", [0, 2, 3])
def test_sketched_core_is_exact_for_a_representable_tensor(tmp_path, j):
    """With ``X`` in the range of the design (a tensor train whose other cores are the current
    ones) every sketch whose Gram has full rank gives the exact core: first with (nearly) every
    design row drawn, the Gram checked to be nonsingular, then with few draws."""
    rng = np.random.default_rng(11 + j)
    shape, ranks = (4, 3, 5, 3), (2, 3, 2)
    cores = canonical(random_cores(rng, shape, ranks), j)
    planted = [c.copy() for c in cores]
    planted[j] = rng.standard_normal(cores[j].shape)
    X = full(planted)
    store = as_store(X, tmp_path / "x.zarr")
    s = draw_core_samples(cores, j, 20000, np.random.default_rng(2))
    rows = int(np.prod(shape)) // shape[j]
    assert len(s) >= rows * 0.9  # (nearly) every row of the design drawn: some have scores ~1e-5
    assert np.linalg.eigvalsh(s.gram())[0] > 0.1
    got = solve_sketched(s, sketched_rhs(store, s, shape[j]), cores[j].shape[::2])
    np.testing.assert_allclose(got, planted[j], atol=1e-10)
    np.testing.assert_allclose(exact_core(X, cores, j), planted[j], atol=1e-10)
    # few draws (not every row) still solve it exactly while the Gram has full rank
    got = sketched_core(store, cores, j, 60, np.random.default_rng(4))
    np.testing.assert_allclose(got, planted[j], atol=1e-8)


def test_sketched_sweeps_recover_a_planted_tensor_train(tmp_path):
    rng = np.random.default_rng(2024)
    shape, ranks = (6, 5, 7, 4), (2, 3, 2)
    N = len(shape)
    X = full(random_cores(rng, shape, ranks))
    fibers = load_fibers(as_store(X, tmp_path / "x.zarr"))
    cores = canonical(random_cores(rng, shape, ranks), 0)
    draws = np.random.default_rng(5)
    fit = 0.0
    for _ in range(6):
        for j in range(N - 1):  # left to right: the new core left-orthonormalized, R pushed right
            cores[j] = sketched_core(fibers, cores, j, 1000, draws)
            cores[j], r = left_orthonormal(cores[j])
            cores[j + 1] = np.einsum("ab,bic->aic", r, cores[j + 1])
        for j in range(N - 1, 0, -1):  # right to left
            cores[j] = sketched_core(fibers, cores, j, 1000, draws)
            cores[j], r = right_orthonormal(cores[j])
            cores[j - 1] = np.einsum("aib,bc->aic", cores[j - 1], r)
        fit = 1 - np.linalg.norm(full(cores) - X) / np.linalg.norm(X)
        if fit > 0.999:
            break
    assert fit >= 0.99, fit


def test_draws_do_not_depend_on_threads_or_cached_trees():
    """The same draws for any numba thread count and from trees built afresh or taken from a cache;
    the Gram and weighted rows from the chain rows are those of the design rows."""
    import numba

    rng = np.random.default_rng(8)
    shape, ranks = (30, 20, 25, 6), (3, 4, 2)
    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    for j in range(len(shape)):
        cores = canonical(random_cores(rng, shape, ranks), j)
        cache = {}
        got = []
        old = numba.get_num_threads()
        try:
            for t in (1, threads, threads):  # the last from the cache the second filled
                numba.set_num_threads(t)
                trees = chain_trees(cores, j, cache=cache)
                got.append(draw_core_samples(cores, j, 3000, np.random.default_rng(9), trees))
        finally:
            numba.set_num_threads(old)
        assert set(cache) == {(k, "left" if k < j else "right") for k in range(len(shape)) if k != j}
        for s in got[1:]:
            np.testing.assert_array_equal(s.coords, got[0].coords)
            np.testing.assert_array_equal(s.counts, got[0].counts)
            np.testing.assert_array_equal(s.probs, got[0].probs)
        s = got[0]
        dense = (s.rows * s.weights[:, None]).T @ s.rows
        np.testing.assert_allclose(s.gram(), dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())
        assert np.array_equal(s.gram(), s.gram().T)
        which = np.arange(0, len(s), 3)
        np.testing.assert_allclose(s.weighted_rows(which), (s.weights[:, None] * s.rows)[which], rtol=1e-14)
        assert s.ncols == s.rows.shape[1] == cores[j].shape[0] * cores[j].shape[2]


def test_state_keeps_the_trees_of_unchanged_cores():
    """rTT-ALS's state caches sampler trees: draws from the cache are those from fresh trees; a
    core's trees go when it is written; copies hand them on; pickles leave them out."""
    import pickle

    from tensorflow_ooc.decompositions.tt import tt_steps as S
    from tensorflow_ooc.decompositions.tt.tt_randomized import draw_core

    shape = (12, 10, 9, 8)
    full = S.check_ranks((3, 4, 2), shape)
    st = S.start_state(shape, full, S.initial_cores("random", shape, full, 3))
    a = draw_core(st, 0, 2000, (1, 2, 3))
    assert set(st.trees) == {(1, "right"), (2, "right"), (3, "right")}
    b = draw_core(st, 0, 2000, (1, 2, 3))
    c = draw_core(S.start_state(shape, full, st.cores()), 0, 2000, (1, 2, 3))
    for s in (b, c):
        np.testing.assert_array_equal(s.coords, a.coords)
        np.testing.assert_array_equal(s.weights, a.weights)
    cp = st.copy()
    assert all(cp.trees[k] is st.trees[k] for k in st.trees)
    cp.set_core(2, cp.core(2))
    assert (2, "right") not in cp.trees and (1, "right") in cp.trees and (2, "right") in st.trees
    assert pickle.loads(pickle.dumps(st)).trees == {}


def test_design_rows_of_no_samples_keep_their_width(rng):
    """Before: reshape(0, -1) raised, so a partition that matched none of a sweep's samples ended
    the run (seed 2890721824 of test_randomized_streamed_workers_and_resume_draw_what_one_run_drew)."""
    r1, r2 = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    assert design_rows(np.zeros((0, r1)), np.zeros((0, r2))).shape == (0, r1 * r2)
    left, right = rng.standard_normal((5, r1)), rng.standard_normal((5, r2))
    np.testing.assert_array_equal(design_rows(left, right), np.stack([np.kron(a, b) for a, b in zip(left, right)]))


@pytest.mark.parametrize("order", [3, 4, 5])
def test_grouped_draws_are_the_walks_inverse_cdf(monkeypatch, order):
    """The core drawn second from its histories' whole row masses (``_grouped_draws``) and by walks
    (``_walk_draws``) follow the exact leverage scores and give the same rows for the same
    uniforms, but where rounding puts a uniform on the other side of a row boundary (fresh random
    cores, float64)."""
    import tensorflow_ooc.kernels.sampling.tt_sampler as ts

    rng = np.random.default_rng()
    shape = tuple(int(n) for n in rng.integers(3, 9, order))
    ranks = tuple(int(r) for r in rng.integers(2, 4, order - 1))
    for j in (0, order - 1):  # the longest chains: a walked core after the grouped one
        cores = canonical(random_cores(rng, shape, ranks), j)
        seed = int(rng.integers(2**32))
        got = {}
        for name, rows in (("grouped", 10**9), ("walked", 0)):
            monkeypatch.setattr(ts, "GROUPED_ROWS", rows)
            draw = draw_left_chain if j else draw_right_chain
            got[name] = draw(cores, j, J_STAT, np.random.default_rng(seed), chain_trees(cores, j))
        assert np.mean(np.any(got["grouped"][0] != got["walked"][0], axis=1)) <= 1e-3
        idx, p = got["grouped"]
        M, dims = (left_matrix(cores, j), shape[:j]) if j else (right_matrix(cores, j), shape[1:])
        cell = np.ravel_multi_index(tuple(idx.T), dims)
        lev = exact_leverage(M)
        np.testing.assert_allclose(p, lev[cell], rtol=1e-10, atol=1e-14)
        assert chi2_pvalue(np.bincount(cell, minlength=M.shape[0]), lev) > 1e-4
