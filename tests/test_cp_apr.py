"""CP-APR (Poisson CP): the kernels against dense NumPy references, MU and PDN-R against pyttb's
cp_apr from the same start, streaming against in-memory, several workers against one, resume,
and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import pyttb as ttb

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.apr import apr_steps as S
from tensorflow_ooc.errors import DecompositionError
from tensorflow_ooc.execution.apr_tasks import candidates_partition, newton_partition, phi_partition
from tensorflow_ooc.execution.partitions import plan_partitions
from tensorflow_ooc.execution.tasks import load_partition
from tensorflow_ooc.kernels.apr.cpu import hessian_width, model_values
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items

LETTERS = "abcdef"


def dense_model(factors, weights=None):
    N = len(factors)
    R = factors[0].shape[1]
    w = np.ones(R) if weights is None else weights
    spec = ",".join(f"{c}r" for c in LETTERS[:N]) + ",r->" + LETTERS[:N]
    return np.einsum(spec, *factors, w)


def poisson_tensor(rng, shape, rank, total):
    """Counts drawn from a random nonnegative CP model (dense, small), as coordinates and values."""
    A = [rng.random((I, rank)) ** 2 for I in shape]
    M = dense_model(A, rng.uniform(1, 3, rank))
    X = rng.poisson(M / M.sum() * total).astype(np.float64)
    coords = np.argwhere(X > 0)
    return X, coords, X[X > 0]


def store_of(tmp_path, name, coords, values, shape, **kw):
    return tfo.convert((coords, values), str(tmp_path / f"{name}.zarr"), shape=shape, **kw)


def sources(store):
    """One partition's sources: decoded in memory (with mode-sorted copies) and streamed."""
    part = plan_partitions(store, 1)[0]
    return [load_partition(store.path, part, mode_copies=True), (store.path, part)]


@pytest.mark.parametrize(
    "order,rank,groups",
    [(3, 8, True), (4, 16, True), (5, 11, True), (6, 3, True), (3, 40, True), (4, 11, False), (3, 16, False)],
)
def test_phi_and_model_values_match_dense_reference(tmp_path, rng, monkeypatch, order, rank, groups):
    """Every form of the Phi pass: fixed-rank kernels (8, 16), one padded column group (11, 3),
    several groups (40: model values first, then the MTTKRP of the weights) and, without column
    groups, the run-time-rank tiled kernels (11), these two also as the prefetching kernels that
    factors far beyond the caches take."""
    from tensorflow_ooc.kernels.mttkrp import column_groups, dispatch

    if not groups:
        monkeypatch.setattr(column_groups, "GROUP_MAX_FACTOR_BYTES", -1)
        monkeypatch.setattr(dispatch, "PREFETCH_MIN_BYTES", -1)
    shape = tuple(int(s) for s in rng.integers(3, 7, order))
    R = rank
    X, coords, vals = poisson_tensor(rng, shape, 2, 4 * int(np.prod(shape)))
    store = store_of(tmp_path, "s", coords, vals, shape, chunk_nnz=64)
    A = [rng.random((I, R)) for I in shape]
    lam = rng.uniform(0.5, 2, R)
    # model values, log-likelihood and <X, M> on the in-memory items
    state = S.start_state(A, None, "float64")
    for v, a in zip(state.views, A):
        v[...] = a
    tensor = tfo.encode_coo(coords, vals, shape)
    items = tensor_items(tensor)
    M = dense_model(A, lam)
    nz = X > 0
    ll, xm = model_values(items, tensor.layout, state, lam, 1e-10)
    assert ll == pytest.approx(float(np.sum(X[nz] * np.log(M[nz]))), rel=1e-12)
    assert xm == pytest.approx(float(np.sum(X * M)), rel=1e-12)
    for n in range(order):
        B = A[n] * lam
        state.views[n][...] = B
        others = [A[m] if m != n else B for m in range(order)]
        Mn = dense_model(others)
        W = np.where(nz, X / np.maximum(Mn, 1e-10), 0.0)
        spec = LETTERS[:order] + "," + ",".join(f"{LETTERS[m]}r" for m in range(order) if m != n) + f"->{LETTERS[n]}r"
        ref = np.einsum(spec, W, *[A[m] for m in range(order) if m != n])
        for src in sources(store):
            p = phi_partition(src, state, n, 2, 1000, 1e-10, 1 << 20)
            got = np.zeros_like(ref)
            got[p.lo : p.lo + p.rows.shape[0]] = p.rows
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
        state.views[n][...] = A[n]


@pytest.mark.parametrize("order", [3, 4, 6])
def test_newton_row_terms_match_dense_reference(tmp_path, rng, order):
    shape = tuple(int(s) for s in rng.integers(3, 6, order))
    R = int(rng.choice([2, 3, 5]))
    X, coords, vals = poisson_tensor(rng, shape, 2, 3 * int(np.prod(shape)))
    store = store_of(tmp_path, "s", coords, vals, shape, chunk_nnz=50)
    A = [rng.random((I, R)) for I in shape]
    state = S.start_state(A, None, "float64")
    for v, a in zip(state.views, A):
        v[...] = a
    nz = X > 0
    for n in range(order):
        lo, hi = 1, shape[n]
        state.block = S.RowBlock(lo, rng.random(hi - lo) < 0.8, np.ones(hi - lo), np.zeros(hi - lo, int))
        state.block.candidates = rng.random((hi - lo, 10, R))
        Xn = np.moveaxis(X, n, 0).reshape(shape[n], -1)
        nzn = np.moveaxis(nz, n, 0).reshape(shape[n], -1)
        others = [A[m] for m in range(order) if m != n]
        Pi = others[0]
        for o in others[1:]:  # Khatri-Rao product matching the C-order unfolding
            Pi = (Pi[:, None, :] * o[None, :, :]).reshape(-1, R)
        T = hessian_width(R)
        ref = np.zeros((hi - lo, T))
        ref_c = np.zeros((hi - lo, 10))
        iu = np.triu_indices(R)
        for d in range(hi - lo):
            if not state.block.active[d]:
                continue
            i = lo + d
            j = np.flatnonzero(nzn[i])
            x, P = Xn[i, j], Pi[j]
            v = P @ A[n][i]
            ref[d, :R] = (x / np.maximum(v, 1e-10)) @ P
            H = (P * (x / np.maximum(v * v, 1e-10))[:, None]).T @ P
            ref[d, R : R + iu[0].size] = H[iu]
            ref[d, -3] = np.sum(x * np.log(v))
            ref[d, -2] = j.size  # nonzeros; none with a zero Khatri-Rao row (positive factors): last column 0
            ref_c[d] = np.log(P @ state.block.candidates[d].T).T @ x
        for src in sources(store):
            got = newton_partition(src, state, n, 2, 1000, 1e-10)
            np.testing.assert_allclose(got.rows, ref, rtol=1e-11, atol=1e-11)
            got_c = candidates_partition(src, state, n, 2, 1000)
            np.testing.assert_allclose(got_c.rows, ref_c, rtol=1e-11, atol=1e-11)


def pyttb_apr(coords, vals, shape, rank, algorithm, init, iters):
    Xs = ttb.sptensor(coords, vals[:, None], shape)
    M, _, out = ttb.cp_apr(
        Xs, rank, algorithm=algorithm, init=ttb.ktensor([a.copy() for a in init]), maxiters=iters, printitn=0
    )
    return M, out


@pytest.mark.parametrize("algorithm,order", [("mu", 3), ("mu", 4), ("mu", 5), ("pdnr", 3), ("pdnr", 4), ("pdnr", 5)])
def test_matches_pyttb_from_the_same_start(tmp_path, rng, algorithm, order):
    shape = tuple(int(s) for s in rng.integers(4, 8, order))
    R = 3
    X, coords, vals = poisson_tensor(rng, shape, R, 6 * int(np.prod(shape)) ** 0.8)
    store = store_of(tmp_path, "s", coords, vals, shape)
    init = [rng.random((I, R)) for I in shape]
    iters = 4
    r = tfo.cp_apr(store, R, algorithm=algorithm, init=init, max_iters=iters)
    M, out = pyttb_apr(coords, vals, shape, R, algorithm, init, iters)
    assert r.iterations == len(out["kktViolations"])
    assert r.loglik == pytest.approx(out["obj"], rel=1e-8)
    assert r.kkt == pytest.approx(out["kktViolations"][-1], rel=1e-8)
    assert [h["inner_iterations"] for h in r.history] == [int(k) for k in out["nInnerIters"]]
    # factors: both as unit 1-norm columns sorted by weight
    ref = tfo.PoissonResult.arranged(M.weights, M.factor_matrices, 0, 0, 0, 0, [], {}, {})
    np.testing.assert_allclose(r.weights, ref.weights, rtol=1e-6)
    for a, b in zip(r.factors, ref.factors):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    assert min(float(f.min()) for f in r.factors) >= 0


def test_streaming_equals_in_memory_and_resume_is_bit_identical(tmp_path, rng):
    shape = (9, 8, 7, 6)
    X, coords, vals = poisson_tensor(rng, shape, 3, 4000)
    store = store_of(tmp_path, "s", coords, vals, shape, chunk_nnz=128)
    kw = dict(seed=int(rng.integers(1 << 30)), max_iters=6)
    for algorithm in ("mu", "pdnr"):
        a = tfo.cp_apr(store, 3, algorithm=algorithm, execution="in-memory", **kw)
        b = tfo.cp_apr(store, 3, algorithm=algorithm, execution="streaming", partitions=3, **kw)
        assert b.loglik == pytest.approx(a.loglik, rel=1e-12)
        for fa, fb in zip(a.factors, b.factors):
            np.testing.assert_allclose(fa, fb, rtol=1e-9, atol=1e-12)
        ck = tmp_path / f"{algorithm}.ck.npz"

        def stop_after_three(rec):
            if rec["iteration"] == 3:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            tfo.cp_apr(store, 3, algorithm=algorithm, checkpoint=ck, callback=stop_after_three, **kw)
        c = tfo.cp_apr(store, 3, algorithm=algorithm, checkpoint=ck, resume=True, **kw)
        assert c.iterations == a.iterations and c.loglik == a.loglik
        for fa, fc in zip(a.factors, c.factors):
            assert np.array_equal(fa, fc)


def test_several_workers_equal_one(tmp_path, rng):
    from distributed import Client, LocalCluster

    shape = (12, 10, 9)
    X, coords, vals = poisson_tensor(rng, shape, 3, 5000)
    store = store_of(tmp_path, "s", coords, vals, shape, chunk_nnz=100)
    kw = dict(seed=int(rng.integers(1 << 30)), max_iters=5)
    one = {a: tfo.cp_apr(store, 3, algorithm=a, **kw) for a in ("mu", "pdnr")}
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        for a in ("mu", "pdnr"):
            r = tfo.cp_apr(store, 3, algorithm=a, client=c, partitions=4, execution="streaming", **kw)
            assert r.loglik == pytest.approx(one[a].loglik, rel=1e-10)
            for fa, fb in zip(one[a].factors, r.factors):
                np.testing.assert_allclose(fa, fb, rtol=1e-8, atol=1e-12)


def test_result_store_and_exports(tmp_path, rng):
    shape = (8, 7, 6)
    X, coords, vals = poisson_tensor(rng, shape, 2, 1500)
    store = store_of(tmp_path, "s", coords, vals, shape)
    r = tfo.cp_apr(store, 2, seed=3, max_iters=5, out=tmp_path / "r.zarr")
    back = tfo.load_result(tmp_path / "r.zarr")
    assert isinstance(back, tfo.PoissonResult) and back.loglik == r.loglik and back.kkt == r.kkt
    K = r.to_pyttb()
    np.testing.assert_allclose(K.full().data, r.full(), rtol=1e-12)
    for f in r.factors:
        np.testing.assert_allclose(f.sum(axis=0), 1.0, rtol=1e-12)
    rec = r.history[-1]
    assert {"loglik", "kkt_violation", "fit", "inner_iterations"} <= rec.keys()


def test_bad_input_is_refused_clearly(tmp_path, rng):
    shape = (5, 6, 7)
    X, coords, vals = poisson_tensor(rng, shape, 2, 600)
    store = store_of(tmp_path, "s", coords, vals, shape)
    with pytest.raises(ValueError, match="algorithm"):
        tfo.cp_apr(store, 2, algorithm="newton")
    with pytest.raises(ValueError, match="rank"):
        tfo.cp_apr(store, 0)
    bad = [rng.random((I, 2)) for I in shape]
    bad[1][2, 1] = -0.5
    with pytest.raises(DecompositionError, match="factor matrix 1 has a negative entry"):
        tfo.cp_apr(store, 2, init=bad)
    neg = vals.copy()
    neg[len(neg) // 2] = -3.0
    nstore = store_of(tmp_path, "neg", coords, neg, shape)
    with pytest.raises(Exception, match="-3"):
        tfo.cp_apr(nstore, 2)


def test_planted_poisson_model_is_recovered(tmp_path, rng):
    from tensorflow_ooc import synthetic

    seed = int(rng.integers(1 << 30))
    p = synthetic.planted_poisson((30, 40, 50), 3, 12000, seed=seed)
    store = store_of(tmp_path, "planted", p.coords, p.values, p.shape)
    truth = ttb.ktensor([np.array(f) for f in p.factors], np.array(p.weights))
    for algorithm, iters in (("pdnr", 60), ("mu", 80)):
        r = tfo.cp_apr(store, 3, algorithm=algorithm, seed=seed + 1, max_iters=iters)
        score = r.to_pyttb().score(truth)[0]
        assert score >= 0.95, f"{algorithm}: factor match score {score:.3f} (seed {seed})"


def test_cli_distribution(tmp_path, rng, capsys):
    from tensorflow_ooc.cli import main

    shape = (6, 5, 4)
    X, coords, vals = poisson_tensor(rng, shape, 2, 400)
    store = store_of(tmp_path, "s", coords, vals, shape)
    base = ["apr", str(store.path), "--rank", "2", "--max-iters", "2", "--seed", "1", "-q"]
    # inline (this tensor's default), per-mode task graphs are the one path: "graph" is accepted
    assert main([*base, "--distribution", "graph", "--out", str(tmp_path / "g.zarr")]) == 0
    assert "log-likelihood" in capsys.readouterr().out
    assert tfo.load_result(tmp_path / "g.zarr").iterations == 2
    # owner-computes needs Dask CPU workers: one error line, exit 2, no traceback, nothing written
    code = main([*base, "--distribution", "owner", "--scheduler", "inline", "--out", str(tmp_path / "o.zarr")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "tfooc: error: --distribution owner runs CP-APR on Dask CPU workers (not the inline scheduler or a GPU)"
    ]
    assert not (tmp_path / "o.zarr").exists()
    with pytest.raises(SystemExit):
        main(["apr", "--help"])
    assert "--distribution {auto,owner,graph}" in capsys.readouterr().out
