"""CP-ALS through Dask: pyttb agreement, planted models, exports, result store, checkpoints."""

import numpy as np
import pytest
from conftest import fixed, random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic


@pytest.mark.parametrize("shape", [(30, 40, 50), (12, 15, 9, 7)])
@pytest.mark.parametrize("execution", ["streaming", "in-memory"])
def test_matches_pyttb_from_identical_init(tmp_path, rng, client, shape, execution):
    import pyttb

    coords, values = random_coo(rng, shape, 4000)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", chunk_nnz=700)
    R = 5
    init = [rng.random((s, R)) for s in shape]
    ours = tfo.cp_als(store, R, client=client, init=init, max_iters=10, tol=0, execution=execution)
    X = pyttb.sptensor(coords, values.reshape(-1, 1), shape)
    ref, _, out = pyttb.cp_als(X, R, maxiters=10, stoptol=0, init=pyttb.ktensor([a.copy() for a in init]), printitn=0)
    assert ours.iterations == 10
    assert abs(ours.fit - out["fit"]) < 1e-8
    for h in ours.history:  # per-mode seconds from the pipelined iteration
        assert len(h["mode_seconds"]) == len(shape) and min(h["mode_seconds"]) >= 0
        assert sum(h["mode_seconds"]) <= h["seconds"] + 1e-3
    a, b = fixed(ours.to_pyttb()), fixed(ref)
    assert np.allclose(a.weights, b.weights, rtol=1e-8, atol=1e-8)
    for fa, fb in zip(a.factor_matrices, b.factor_matrices):
        assert np.abs(fa - fb).max() < 1e-8


def test_planted_without_noise_fits(tmp_path, client):
    p = synthetic.planted_cp((40, 50, 60), 8, 30_000, seed=int(np.random.default_rng().integers(1 << 30)))
    store = tfo.convert((p.coords, p.values), tmp_path / "p.zarr", shape=p.shape)
    best = max(tfo.cp_als(store, 8, client=client, seed=s, max_iters=150, tol=1e-9).fit for s in (1, 2))
    assert best >= 0.99


def test_planted_with_noise_recovers_factors(tmp_path, client):
    import pyttb

    p = synthetic.planted_cp((30, 40, 50), 4, 25_000, noise=0.05, seed=int(np.random.default_rng().integers(1 << 30)))
    store = tfo.convert((p.coords, p.values), tmp_path / "n.zarr", shape=p.shape)
    truth = pyttb.ktensor([f.copy() for f in p.factors], p.weights.copy())
    scores = []
    for s in (1, 2, 3):
        r = tfo.cp_als(store, 4, client=client, seed=s, max_iters=200, tol=1e-9)
        scores.append(r.to_pyttb().score(truth)[0])
    assert max(scores) >= 0.95, scores


def test_result_store_and_exports(tmp_path, rng, client):
    coords, values = random_coo(rng, (10, 11, 12), 600)
    store = tfo.convert((coords, values), tmp_path / "x.zarr")
    r = tfo.cp_als(store, 3, client=client, seed=7, max_iters=5, out=tmp_path / "res.zarr")
    back = tfo.load_result(tmp_path / "res.zarr")
    assert np.array_equal(back.weights, r.weights) and all(
        np.array_equal(a, b) for a, b in zip(back.factors, r.factors)
    )
    assert back.input["store_id"] == store.meta["store_id"] and len(back.history) == r.iterations
    assert {"fit", "seconds", "mode_seconds"} <= set(back.history[0])
    full = r.full()
    assert np.allclose(r.to_pyttb().full().data, full)
    import tensorly

    assert np.allclose(tensorly.cp_to_tensor(r.to_tensorly()), full)
    r.save_npz(tmp_path / "r.npz")
    z = np.load(tmp_path / "r.npz")
    assert np.array_equal(z["factor1"], r.factors[1])


def test_same_seed_same_result_and_resume(tmp_path, rng, client):
    coords, values = random_coo(rng, (20, 25, 30), 3000)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", chunk_nnz=500)
    full = tfo.cp_als(store, 4, client=client, seed=3, max_iters=8, tol=0)
    ck = tmp_path / "ck.npz"
    tfo.cp_als(store, 4, client=client, seed=3, max_iters=4, tol=0, checkpoint=ck)
    resumed = tfo.cp_als(store, 4, client=client, seed=3, max_iters=8, tol=0, checkpoint=ck, resume=True)
    assert resumed.iterations == 8
    assert abs(resumed.fit - full.fit) < 1e-10
    for a, b in zip(resumed.factors, full.factors):
        assert np.abs(a - b).max() < 1e-10
    other = tfo.convert((coords[:100], values[:100]), tmp_path / "y.zarr", shape=(20, 25, 30))
    with pytest.raises(ValueError, match="another store or rank"):
        tfo.cp_als(other, 4, client=client, checkpoint=ck, resume=True)


def test_bad_arguments(tmp_path, rng, client):
    coords, values = random_coo(rng, (5, 6, 7), 50)
    store = tfo.convert((coords, values), tmp_path / "x.zarr")
    with pytest.raises(ValueError, match="rank"):
        tfo.cp_als(store, 0, client=client)
    with pytest.raises(ValueError, match="init"):
        tfo.cp_als(store, 2, client=client, init=[np.ones((5, 2))])
    with pytest.raises(ValueError, match="execution"):
        tfo.cp_als(store, 2, client=client, execution="fast")


@pytest.mark.parametrize("execution", ["streaming", "in-memory"])
def test_history_splits_each_iteration(tmp_path, rng, client, execution):
    """Per mode, the MTTKRP seconds (slowest partition task) and the update seconds; the rest of
    the iteration is scheduling and transfers."""
    shape = (20, 25, 30, 6)
    coords, values = random_coo(rng, shape, 4000)
    store = tfo.convert((coords, values), tmp_path / "h.zarr", chunk_nnz=1000)
    r = tfo.cp_als(store, 3, client=client, seed=1, max_iters=3, tol=0, execution=execution)
    for h in r.history:
        assert len(h["mttkrp_seconds"]) == len(h["update_seconds"]) == len(h["mode_seconds"]) == 4
        assert all(t > 0 for t in h["mttkrp_seconds"] + h["update_seconds"])
        assert h["other_seconds"] >= 0
        # work inside tasks never exceeds the iteration it belongs to (up to clock granularity)
        assert sum(h["mttkrp_seconds"]) + sum(h["update_seconds"]) <= h["seconds"] + 1e-3


def test_small_tensors_run_inline_with_the_same_result(tmp_path, rng, client):
    """The embedded default runs small tensors in this process without Dask: same functions, same
    numbers; a client or scheduler="embedded" still gets the distributed graph."""
    shape = (15, 20, 25, 8, 6)
    coords, values = random_coo(rng, shape, 3000)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=1000)
    ck = tmp_path / "ck.npz"
    inline = tfo.cp_als(store, 4, seed=2, max_iters=5, tol=0, checkpoint=ck)
    assert inline.params["scheduler"] == "inline" and ck.exists()
    dask = tfo.cp_als(store, 4, client=client, seed=2, max_iters=5, tol=0)
    assert dask.params["scheduler"] == "dask"
    assert abs(inline.fit - dask.fit) < 1e-12
    for a, b in zip(inline.factors, dask.factors):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for execution in ("streaming", "in-memory"):
        r = tfo.cp_als(store, 4, seed=2, max_iters=5, tol=0, execution=execution, scheduler="inline")
        assert r.params["execution"] == execution and abs(r.fit - dask.fit) < 1e-12
    resumed = tfo.cp_als(store, 4, seed=2, max_iters=7, tol=0, checkpoint=ck, resume=True)
    assert resumed.iterations == 7 and resumed.params["resumed_after"] == 5


def test_update_helpers_match_numpy(rng):
    """The update's column max-norm kernel and its inverse-and-GEMM solve against NumPy, float64 and
    float32, with a zero-row factor and a singular normal matrix (pseudo-inverse)."""
    from tensorflow_ooc.decompositions.cp.updates import solve_normal
    from tensorflow_ooc.kernels.update.column_scale import STAT_BLOCK_ROWS, column_max_abs, column_sum_squares

    for dtype in (np.float64, np.float32):
        # sizes inside one row block and across several (the blocks run on numba's threads)
        for n in (int(rng.integers(1, 300)), int(rng.integers(2, 4) * STAT_BLOCK_ROWS + rng.integers(1, 999))):
            A = rng.standard_normal((n, 7)).astype(dtype)
            assert np.array_equal(column_max_abs(A), np.abs(A).max(axis=0).astype(np.float64))
            np.testing.assert_allclose(column_sum_squares(A), (A.astype(np.float64) ** 2).sum(axis=0), rtol=1e-12)
        assert np.array_equal(column_max_abs(A[:0]), np.zeros(7))
        assert np.array_equal(column_sum_squares(A[:0]), np.zeros(7))
    B = rng.standard_normal((40, 5))
    V = B.T @ B
    M = rng.standard_normal((123, 5))
    out = np.empty_like(M)
    assert solve_normal(V, M, out=out) is out
    np.testing.assert_allclose(out, np.linalg.solve(V, M.T).T, rtol=1e-10, atol=1e-12)
    V[:, 2] = V[2, :] = 0.0  # singular: the pseudo-inverse's least-norm answer
    np.testing.assert_allclose(solve_normal(V, M), M @ np.linalg.pinv(V), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("order", [3, 4, 6])
def test_normal_inverse_of_grams_matches_numpy(rng, order):
    """The update's V^+ kernel (Hadamard product of the other modes' Grams, Cholesky inverse) against
    NumPy's inverse for every mode; a given V; a zero Gram (V singular: NumPy's pseudo-inverse)."""
    from tensorflow_ooc.kernels.update.normal_equations import normal_inverse_of

    R = int(rng.integers(2, 20))
    grams = [(lambda B: B.T @ B)(rng.standard_normal((R + int(rng.integers(1, 30)), R))) for _ in range(order)]
    for mode in range(order):
        V = np.ones((R, R))
        for m, g in enumerate(grams):
            if m != mode:
                V *= g
        np.testing.assert_allclose(normal_inverse_of(grams, mode), np.linalg.inv(V), rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(normal_inverse_of(None, mode, V), np.linalg.inv(V), rtol=1e-8, atol=1e-12)
    zero = [g.copy() for g in grams]
    zero[1][:, 0] = zero[1][0, :] = 0.0
    V = np.ones((R, R))
    for g in zero[1:]:
        V *= g
    np.testing.assert_allclose(normal_inverse_of(zero, 0), np.linalg.pinv(V), rtol=1e-8, atol=1e-12)


def test_resumed_run_is_bit_identical_to_the_uninterrupted_one(tmp_path, rng):
    """The state carried between updates equals what a resume rebuilds from the checkpoint, to the
    last bit (Grams recomputed from the normalized factors), so resuming changes nothing; on an
    exactly fitted planted model, rounding-level drift shows in the fit (1 against 1 - 2e-8)."""
    shape = (19, 22, 26)
    p = synthetic.planted_cp(shape, 3, 1500, seed=int(rng.integers(2**31)))
    s = tfo.convert((p.coords, p.values), tmp_path / "p.zarr", shape=shape)
    seed = int(rng.integers(2**31))
    whole = tfo.cp_als(s, 3, max_iters=30, tol=0, seed=seed)
    tfo.cp_als(s, 3, max_iters=10, tol=0, seed=seed, checkpoint=tmp_path / "c.npz")
    resumed = tfo.cp_als(s, 3, max_iters=30, tol=0, seed=seed, checkpoint=tmp_path / "c.npz", resume=True)
    assert resumed.fit == whole.fit
    assert all(np.array_equal(a, b) for a, b in zip(resumed.factors, whole.factors))


def test_given_factors_are_scattered_not_embedded_in_the_graph(tmp_path, rng, client):
    """A long mode's initial rows (here 12 MB) reach the workers by scatter: Dask warns about (and
    copies) task graphs of over 10 MB. The same start gives the same result inline and on Dask."""
    import warnings

    shape = (800_000, 6, 5)
    coords, values = random_coo(rng, shape, 2000)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape)
    init = [rng.random((s, 2)) for s in shape]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*large graph.*")
        dask = tfo.cp_als(store, 2, client=client, init=init, max_iters=2, tol=0)
    inline = tfo.cp_als(store, 2, init=init, max_iters=2, tol=0, scheduler="inline")
    assert dask.params["scheduler"] == "dask" and inline.params["scheduler"] == "inline"
    assert abs(dask.fit - inline.fit) < 1e-12
