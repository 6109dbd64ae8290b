"""Khatri-Rao leverage-score samplers (STS-CP exact, CP-ARLS-LEV product of factor scores) against
explicitly formed products: draw frequencies (chi-square), reported probabilities and weights,
unbiased sketched Grams, the segment tree, reproducibility and argument errors."""

import itertools

import numba
import numpy as np
import pytest
from scipy.stats import chisquare

import tensorflow_ooc.kernels.sampling.krp_sampler as ks
from tensorflow_ooc.kernels.sampling.arls_lev import arls_lev_sample
from tensorflow_ooc.kernels.sampling.krp_sampler import (
    PINV_RTOL,
    SampleSet,
    build_tree,
    marginal_mode,
    sts_sample,
)

J_STAT = 100_000  # draws per chi-square test


def sampled_modes(N, mode):
    return [k for k in range(N) if k != mode]


def explicit_krp(factors, mode):
    """Every row of the Khatri-Rao product of the factors except ``mode``: (rows, multi-indices),
    multi-indices in lexicographic order over the sampled modes."""
    ks = sampled_modes(len(factors), mode)
    grid = np.array(list(itertools.product(*[range(factors[k].shape[0]) for k in ks])), dtype=np.int64)
    A = np.ones((grid.shape[0], factors[0].shape[1]))
    for col, k in enumerate(ks):
        A *= factors[k][grid[:, col]]
    return A, grid


def exact_leverage(A):
    """Leverage scores over their sum (the rank), from an SVD of the explicit matrix."""
    U, S, _ = np.linalg.svd(A, full_matrices=False)
    keep = S**2 > PINV_RTOL * S[0] ** 2
    return (U[:, keep] ** 2).sum(1) / keep.sum()


def factor_probs(U):
    """Normalized leverage scores of one factor's rows (by SVD, independent of the module)."""
    return exact_leverage(U)


def cell_of(s, factors):
    """Row of the explicit product (``explicit_krp`` order) of each distinct sample."""
    ks = sampled_modes(len(factors), s.mode)
    return np.ravel_multi_index(tuple(s.coords[:, ks].T), [factors[k].shape[0] for k in ks])


def cell_counts(s, factors, ncells, which=None):
    counts = np.zeros(ncells, dtype=np.int64)
    sel = slice(None) if which is None else which
    np.add.at(counts, cell_of(s, factors)[sel], s.counts[sel])
    return counts


def chi2_pvalue(counts, probs):
    """Goodness of fit of cell counts to cell probabilities; cells expecting fewer than 5 draws are
    merged into one. Draws in a cell of probability zero give 0."""
    if counts[probs <= 0].any():
        return 0.0
    counts, probs = counts[probs > 0], probs[probs > 0]
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    obs = counts[~small].astype(float)
    exp = expected[~small]
    if small.any():
        obs = np.append(obs, counts[small].sum())
        exp = np.append(exp, expected[small].sum())
    exp *= obs.sum() / exp.sum()
    return chisquare(obs, exp).pvalue


def rel_err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def make_factors(rng, shape, rank, deficient=None):
    """Gaussian factors; ``deficient=(kind, modes)`` makes those factors of rank 2 (``"rank2"``) or
    1 (``"rank1"``), null spaces not aligned with the axes, or zeroes one of their columns
    (``"zerocol"``)."""
    factors = [rng.standard_normal((s, rank)) for s in shape]
    if deficient is not None:
        kind, modes = deficient
        for k in modes:
            if kind == "zerocol":
                factors[k][:, rank // 2] = 0.0
            else:
                r = 2 if kind == "rank2" else 1
                factors[k] = rng.standard_normal((shape[k], r)) @ rng.standard_normal((r, rank))
    return factors


# (shape, rank, deficiency): R above some mode lengths, rank-deficient factors, 2 to 6 modes.
# Rank-deficient products: with two rank-1 factors (rank 1 when both are sampled), a zero column
# (axis-aligned null space), and the 2-mode case excluding mode 0 (4 rows, 5 columns).
STS_CASES = [
    ((7, 5, 6), 4, None),
    ((7, 5, 6), 5, ("rank2", (2,))),
    ((5, 4, 3), 3, ("rank1", (1, 2))),
    ((4, 3, 5, 3), 6, None),
    ((4, 3, 5, 3), 3, ("zerocol", (1,))),
    ((3, 2, 3, 2, 3), 3, None),
    ((2, 3, 2, 2, 2, 3), 2, ("zerocol", (0,))),
    ((6, 4), 5, None),
]


@pytest.mark.parametrize("case", range(len(STS_CASES)))
def test_sts_draws_follow_exact_leverage_scores(case):
    shape, rank, deficient = STS_CASES[case]
    rng = np.random.default_rng(1000 + case)  # fixed: a statistical test
    factors = make_factors(rng, shape, rank, deficient)
    trees = [build_tree(f) for f in factors]
    for mode in range(len(shape)):
        s = sts_sample(factors, trees, mode, J_STAT, seed=2000 + 10 * case + mode)
        A, _ = explicit_krp(factors, mode)
        counts = cell_counts(s, factors, A.shape[0])
        assert counts.sum() == J_STAT == s.draws
        p = chi2_pvalue(counts, exact_leverage(A))
        assert p > 1e-3, (shape, rank, deficient, mode, p)

        # the same test on the scores of a perturbed factor (row 0 copied over the last row of
        # the first sampled factor) must fail: the check above can tell distributions apart
        perturbed = [f.copy() for f in factors]
        k0 = sampled_modes(len(shape), mode)[0]
        perturbed[k0][-1] = perturbed[k0][0]
        A2, _ = explicit_krp(perturbed, mode)
        assert chi2_pvalue(counts, exact_leverage(A2)) < 1e-6, (shape, rank, deficient, mode)


@pytest.mark.parametrize("stage1", ["walk", "by_history"])
@pytest.mark.parametrize("case", [0, 3, 6])
def test_sts_tree_walks_alone_follow_exact_leverage_scores(case, stage1, monkeypatch):
    """``marginal=False``: every mode drawn by tree walks, the first one too (the default draws
    the first mode from its marginal, which the test above covers); the eigen-component of every
    draw by walking the stage-1 tree, or from its history's whole component distribution (the
    default picks per mode by cost)."""
    monkeypatch.setattr(ks, "STAGE1_BY_HISTORY", 0.0 if stage1 == "walk" else np.inf)
    shape, rank, deficient = STS_CASES[case]
    rng = np.random.default_rng(3100 + case)
    factors = make_factors(rng, shape, rank, deficient)
    for mode in range(len(shape)):
        s = sts_sample(factors, None, mode, J_STAT, seed=5000 + 10 * case + mode, marginal=False)
        A, _ = explicit_krp(factors, mode)
        assert chi2_pvalue(cell_counts(s, factors, A.shape[0]), exact_leverage(A)) > 1e-3, (shape, mode)


def test_marginal_mode_saves_the_most_walk_work():
    # J draws walk log2(leaves) + 1 levels; the marginal costs one pass over the factor's rows
    assert marginal_mode([1000, 30000], [8, 256], 65536) == 1
    assert marginal_mode([30000, 1000], [256, 8], 65536) == 0
    assert marginal_mode([5_000_000, 8_000_000], [1 << 15, 1 << 16], 4096) is None
    assert marginal_mode([5_000_000, 900], [1 << 15, 4], 4096) == 1


@pytest.mark.parametrize(
    "shape,rank", [((5, 6, 4), 3), ((1, 4, 7), 5), ((3, 1, 9, 2), 4), ((2,) * 8, 3), ((40, 3, 30), 1)]
)
def test_sts_probabilities_weights_rows(rng, shape, rank):
    factors = [rng.standard_normal((s, rank)) for s in shape]
    trees = [build_tree(f, leaf_rows=int(rng.integers(1, 5))) for f in factors]
    J = 3000
    for mode in range(len(shape)):
        s = sts_sample(factors, trees, mode, J, seed=int(rng.integers(2**32)))
        A, _ = explicit_krp(factors, mode)
        cells = cell_of(s, factors)
        lev = exact_leverage(A)
        np.testing.assert_allclose(s.probs, lev[cells], rtol=1e-8, atol=1e-14)
        np.testing.assert_allclose(s.weights, s.counts / (J * lev[cells]), rtol=1e-8)
        np.testing.assert_array_equal(s.rows, A[cells])
        # distinct, sorted, excluded column zero
        assert np.all(s.coords[:, mode] == 0)
        order = np.lexsort(s.coords.T[::-1])
        np.testing.assert_array_equal(order, np.arange(len(s)))
        assert np.all(np.any(np.diff(s.coords, axis=0) != 0, axis=1))
        assert s.counts.sum() == J and not s.deterministic.any()


def test_sts_gram_is_unbiased(rng):
    shape, rank = (6, 5, 7, 4), 4
    factors = [rng.standard_normal((s, rank)) for s in shape]
    factors[1][:, 0] *= 0.1  # uneven scores
    trees = [build_tree(f) for f in factors]
    for mode in (0, 2):
        A, _ = explicit_krp(factors, mode)
        grams = [sts_sample(factors, trees, mode, 20_000, seed=int(rng.integers(2**32))).gram() for _ in range(10)]
        assert rel_err(np.mean(grams, axis=0), A.T @ A) < 0.03
        # a single sketch is already close: leverage sampling needs only O(R) rows
        assert rel_err(grams[0], A.T @ A) < 0.1


@pytest.mark.parametrize("rank", [1, 3, 8])
def test_build_tree_node_grams(rng, rank):
    for nrows in sorted({1, max(rank - 1, 1), 2 * rank, 1000}):
        U = rng.standard_normal((nrows, rank))
        for leaf_rows in (None, 1, 3, 7, nrows):
            t = build_tree(U, leaf_rows)
            P, F = t.nleaves, t.leaf_rows
            assert P & (P - 1) == 0 and t.nrows == nrows and t.grams.shape == (2 * P - 1, rank, rank)
            assert F == -(-nrows // P)
            if leaf_rows is not None:
                assert F <= leaf_rows
            elif nrows >= 4 * rank:
                assert 2 * rank <= F <= 4 * rank and t.nbytes <= U.nbytes
            else:
                assert P == 1
            depth = P.bit_length() - 1
            for v in range(2 * P - 1):
                d = (v + 1).bit_length() - 1
                span = 1 << (depth - d)
                first_leaf = (v - (2**d - 1)) * span
                rows = U[min(first_leaf * F, nrows) : min((first_leaf + span) * F, nrows)]
                np.testing.assert_allclose(t.node_gram(v), rows.T @ rows, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(t.gram, U.T @ U, rtol=1e-12, atol=1e-12)


def test_reproducible_for_any_thread_count(rng):
    shape, rank = (30, 200, 150), 5
    factors = [rng.standard_normal((s, rank)) for s in shape]
    seed = int(rng.integers(2**32))
    runs = []
    saved = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            trees = [build_tree(f) for f in factors]
            runs.append(
                [
                    sts_sample(factors, trees, 1, 5000, seed),
                    sts_sample(factors, None, 1, 5000, np.random.SeedSequence(seed)),
                    arls_lev_sample(factors, 0, 5000, seed, hybrid=True),
                    arls_lev_sample(factors, 2, 5000, np.random.default_rng(seed)),
                ]
            )
    finally:
        numba.set_num_threads(saved)
    for a, b in zip(*runs):
        for field in ("coords", "weights", "rows", "counts", "probs", "deterministic"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert a.draws == b.draws
    # an int seed and the SeedSequence built from it draw the same uniforms
    np.testing.assert_array_equal(runs[0][0].coords, runs[0][1].coords)


@pytest.mark.parametrize("shape,rank", [((7, 5, 6), 4), ((4, 3, 5, 3), 6)])
def test_arls_lev_draws_follow_product_of_factor_scores(shape, rank):
    rng = np.random.default_rng(sum(shape) + rank)  # fixed: a statistical test
    factors = [rng.standard_normal((s, rank)) for s in shape]
    for mode in range(len(shape)):
        s = arls_lev_sample(factors, mode, J_STAT, seed=3000 + mode)
        A, grid = explicit_krp(factors, mode)
        probs = np.ones(A.shape[0])
        for col, k in enumerate(sampled_modes(len(shape), mode)):
            probs *= factor_probs(factors[k])[grid[:, col]]
        counts = cell_counts(s, factors, A.shape[0])
        assert chi2_pvalue(counts, probs) > 1e-3
        assert chi2_pvalue(counts, exact_leverage(A)) < 1e-6  # not the exact scores
        cells = cell_of(s, factors)
        np.testing.assert_allclose(s.probs, probs[cells], rtol=1e-8)
        np.testing.assert_allclose(s.weights, s.counts / (J_STAT * probs[cells]), rtol=1e-8)
        np.testing.assert_array_equal(s.rows, A[cells])


def product_probs(factors, mode):
    A, grid = explicit_krp(factors, mode)
    probs = np.ones(A.shape[0])
    for col, k in enumerate(sampled_modes(len(factors), mode)):
        probs *= factor_probs(factors[k])[grid[:, col]]
    return A, probs


@pytest.mark.parametrize(
    "shape,rank,J",
    [((5, 6, 4), 3, 50), ((9, 4, 3, 6), 2, 200), ((3, 40, 50), 4, 3000), ((6, 2, 3), 2, 4096), ((5, 40), 3, 20)],
)
def test_arls_lev_hybrid_deterministic_rows(rng, shape, rank, J):
    factors = [rng.standard_normal((s, rank)) for s in shape]
    for mode in range(len(shape)):
        s = arls_lev_sample(factors, mode, J, int(rng.integers(2**32)), hybrid=True)
        A, probs = product_probs(factors, mode)
        cells = cell_of(s, factors)
        heavy = np.flatnonzero(probs >= 1.0 / J)
        np.testing.assert_array_equal(np.sort(cells[s.deterministic]), heavy)
        np.testing.assert_array_equal(s.weights[s.deterministic], 1.0)
        np.testing.assert_array_equal(s.counts[s.deterministic], 1)
        np.testing.assert_allclose(s.probs, probs[cells], rtol=1e-8)
        rest = 1.0 - probs[heavy].sum()
        rand = ~s.deterministic
        assert s.counts.sum() == s.draws
        if rand.any():
            jrand = J - heavy.size
            assert s.draws == J
            np.testing.assert_allclose(s.weights[rand], s.counts[rand] * rest / (jrand * probs[cells[rand]]), rtol=1e-8)
        else:
            assert rest < 1e-9
        np.testing.assert_array_equal(s.rows, A[cells])


def test_arls_lev_hybrid_random_part_is_restricted_distribution():
    rng = np.random.default_rng(7)  # fixed: a statistical test
    shape, rank = (8, 5, 6), 3
    factors = [rng.standard_normal((s, rank)) for s in shape]
    factors[1][0] *= 4  # a few heavy rows
    for mode, tau in ((0, 1 / 60), (1, 1 / 20)):
        s = arls_lev_sample(factors, mode, J_STAT, seed=11 + mode, hybrid=True, tau=tau)
        A, probs = product_probs(factors, mode)
        heavy = probs >= tau
        assert 0 < heavy.sum() == s.deterministic.sum()
        counts = cell_counts(s, factors, A.shape[0], which=~s.deterministic)
        assert counts.sum() == J_STAT - heavy.sum()
        restricted = np.where(heavy, 0.0, probs)
        assert chi2_pvalue(counts, restricted) > 1e-3
        # the unrestricted product distribution is rejected (heavy rows are never drawn)
        assert chi2_pvalue(counts, probs) < 1e-6


def test_arls_lev_hybrid_heavy_rows_holding_almost_all_mass(rng):
    # J far above the number of rows: nearly every row is deterministic and the few light rows
    # hold little mass, where rejecting heavy draws would need ~1/(1 - p_det) tries per draw
    factors = [rng.standard_normal((s, 3)) for s in (4, 6, 5)]
    factors[2][0] *= 1e-3
    J = 1 << 16
    # an ill-conditioned draw of the other 4 rows can keep the scaled row's leverage above 1/J
    # (seed 2990611693: no light row at all); scaled further until some rows are light
    while not (product_probs(factors, 0)[1] < 1 / J).any():
        factors[2][0] *= 0.1
    s = arls_lev_sample(factors, 0, J, int(rng.integers(2**32)), hybrid=True)
    A, probs = product_probs(factors, 0)
    cells = cell_of(s, factors)
    assert s.deterministic.sum() == np.count_nonzero(probs >= 1 / J) and (~s.deterministic).any()
    np.testing.assert_array_equal(np.sort(cells), np.flatnonzero(probs > 0))
    assert rel_err(s.gram(), A.T @ A) < 1e-3


@pytest.mark.parametrize("hybrid", [False, True])
def test_arls_lev_gram_is_unbiased(rng, hybrid):
    shape, rank = (6, 12, 15), 3
    factors = [rng.standard_normal((s, rank)) for s in shape]
    factors[1][2] *= 3
    A, _ = explicit_krp(factors, 0)  # 180 rows, J = 400: hybrid takes about 100 of them whole
    sets = [arls_lev_sample(factors, 0, 400, int(rng.integers(2**32)), hybrid=hybrid) for _ in range(200)]
    assert all(s.deterministic.any() == hybrid and not s.deterministic.all() for s in sets)
    assert rel_err(np.mean([s.gram() for s in sets], axis=0), A.T @ A) < 0.05


@pytest.mark.parametrize("sampler", ["sts", "arls"])
def test_argument_errors(rng, sampler):
    def run(factors, exclude=0, J=10):
        if sampler == "sts":
            return sts_sample(factors, [None] * len(factors), exclude, J, 0)
        return arls_lev_sample(factors, exclude, J, 0, hybrid=True)

    factors = [rng.standard_normal((s, 3)) for s in (4, 5, 6)]
    with pytest.raises(ValueError, match="exclude=3 is out of range"):
        run(factors, exclude=3)
    with pytest.raises(ValueError, match="exclude=-1 is out of range"):
        run(factors, exclude=-1)
    with pytest.raises(ValueError, match="J must be at least 1"):
        run(factors, J=0)
    with pytest.raises(ValueError, match="mismatched ranks"):
        run([factors[0], factors[1], rng.standard_normal((6, 2))])
    with pytest.raises(ValueError, match="at least 2 factors"):
        run(factors[:1])
    zero = [factors[0], np.zeros((5, 3)), factors[2]]
    with pytest.raises(ValueError, match="mode 1 is entirely zero"):
        run(zero)
    run(zero, exclude=1)  # the excluded factor may be zero
    # nonzero factors whose Khatri-Rao product is zero (disjoint column supports)
    a, b = np.zeros((5, 3)), np.zeros((6, 3))
    a[:, 0], b[:, 1] = 1.0, 1.0
    with pytest.raises(ValueError, match="Khatri-Rao product of modes .* is zero"):
        run([factors[0], a, b])


def test_sts_tree_mismatch_and_sample_set_gram(rng):
    factors = [rng.standard_normal((s, 3)) for s in (4, 5, 6)]
    with pytest.raises(ValueError, match="tree of mode 2"):
        sts_sample(factors, [None, build_tree(factors[1]), build_tree(factors[1])], 0, 10, 0)
    s = SampleSet(
        mode=0,
        coords=np.zeros((2, 3), dtype=np.int64),
        weights=np.array([1.0, 2.0]),
        rows=np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]]),
        draws=3,
    )
    np.testing.assert_array_equal(s.gram(), [[1, 0, 2], [0, 2, 2], [2, 2, 6]])


def test_large_factors_get_longer_leaves_and_the_plan_counts_them(monkeypatch, rng):
    U = rng.standard_normal((5000, 4))
    small = build_tree(U)
    assert small.nbytes == ks.tree_nbytes(5000, 4)
    monkeypatch.setattr(ks, "LARGE_FACTOR_BYTES", 1000)
    large = build_tree(U)
    assert large.nbytes == ks.tree_nbytes(5000, 4)
    assert 4 * small.nbytes >= large.nbytes * 3.5 and large.leaf_rows >= 8 * 4
    for v in (0, 1, large.nleaves - 1):
        lo = (v - (large.nleaves - 1)) * large.leaf_rows if v >= large.nleaves - 1 else None
        if lo is not None:
            seg = U[lo : lo + large.leaf_rows]
            np.testing.assert_allclose(large.node_gram(v), seg.T @ seg, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(large.gram, U.T @ U, rtol=1e-10)


@pytest.mark.parametrize(
    "dims, rows",
    [
        ((183, 24, 1717), 65536),  # codes radix-sorted on one thread, rows copied from their positions
        ((2**28, 2**28), 5000),  # codes fit in int64, with their positions not: decoded
        ((40, 3, 7, 5), 300000),  # many repeats, sorted by several threads
        ((1, 9, 1), 1000),  # constant columns
        ((6,), 1),
        ((5, 4), 0),
        ((2**40, 2**40), 5000),  # codes beyond int64: the lexsort
    ],
)
def test_unique_rows_is_numpys_unique(rng, dims, rows):
    idx = np.stack([rng.integers(0, d, rows) for d in dims], axis=1).astype(np.int64).reshape(rows, len(dims))
    if rows > 10:
        idx[: rows // 10] = idx[rows // 10 : 2 * (rows // 10)]  # repeated rows for certain
    got, counts = ks.unique_rows(idx)
    want, want_counts = np.unique(idx, axis=0, return_counts=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(counts, want_counts)
    assert counts.sum() == rows
    neg = idx - 3  # negative entries: the lexsort
    got, counts = ks.unique_rows(neg)
    np.testing.assert_array_equal(got, want - 3)
    np.testing.assert_array_equal(counts, want_counts)
