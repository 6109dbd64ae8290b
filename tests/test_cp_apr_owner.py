"""Owner-computes CP-APR on real multi-process Dask clusters: MU and PDN-R equal one process (the
log-likelihood to 1e-10 relative, the factors to 1e-8), in memory and streamed, on 2 and 3
workers; the bytes sent against their lower bound; checkpoints and resume; the per-mode task
graphs still there; nothing left on the workers."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from test_cp_apr import poisson_tensor, store_of

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.owner_computes import _RUNS


def _counts(rng, tmp_path, order: int, total: float, empty_rows: bool = False):
    """A count tensor of a random order-``order`` shape, in small chunks (many partitions); with
    ``empty_rows`` some rows of each mode hold no nonzero (no worker touches them)."""
    shape = tuple(int(s) for s in rng.integers(5, 9 if order > 3 else 12, order))
    X, coords, vals = poisson_tensor(rng, shape, 3, total)
    if empty_rows:
        keep = np.ones(len(vals), dtype=bool)
        for n, I in enumerate(shape):
            keep &= coords[:, n] != I - 2
        coords, vals = coords[keep], vals[keep]
    return store_of(tmp_path, f"x{order}", coords, vals, shape, chunk_nnz=64)


def _assert_same(got, ref):
    assert got.iterations == ref.iterations
    assert got.loglik == pytest.approx(ref.loglik, rel=1e-10)
    assert got.kkt == pytest.approx(ref.kkt, rel=1e-6, abs=1e-12)
    assert [h["inner_iterations"] for h in got.history] == [h["inner_iterations"] for h in ref.history]
    for a, b in zip(got.history, ref.history):
        assert a["loglik"] == pytest.approx(b["loglik"], rel=1e-10)
    np.testing.assert_allclose(got.weights, ref.weights, rtol=1e-8)
    for a, b in zip(got.factors, ref.factors):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)


def _max_rel(got, ref) -> tuple[float, float]:
    ll = abs(got.loglik - ref.loglik) / abs(ref.loglik)
    f = max(float(np.abs(a - b).max()) for a, b in zip(got.factors, ref.factors))
    return ll, f


@pytest.mark.parametrize("algorithm", ["mu", "pdnr"])
def test_two_workers_equal_one_process(two_workers, rng, tmp_path, algorithm):
    # a fresh order (3-5) each run: every order compiles its kernels on both worker processes,
    # 10-25 s of CI each; the three-worker test below runs order 4
    order = int(rng.integers(3, 6))
    store = _counts(rng, tmp_path, order, 3000, empty_rows=bool(rng.integers(2)))
    kw = dict(algorithm=algorithm, seed=int(rng.integers(1 << 30)), max_iters=4, max_inner_iters=4)
    ref = tfo.cp_apr(store, 3, scheduler="inline", **kw)
    got = tfo.cp_apr(store, 3, client=two_workers, execution="in-memory", **kw)
    assert got.params["distribution"] == {"kind": "owner-computes", "workers": 2}
    print(algorithm, order, "max differences (loglik rel, factors abs):", _max_rel(got, ref))
    _assert_same(got, ref)
    for h in got.history:
        # rows travel only where shared: the row payload is the lower bound, and the rest is the
        # all-reduced terms and positions (a few hundred bytes per exchange)
        assert h["bytes_lower_bound"] > 0
        assert h["bytes_lower_bound"] <= h["bytes_sent"]
        assert len(h["mode_bytes_sent"]) == order and len(h["exchange_seconds"]) == order
        exchanges = order * (2 * 4 * (4 if algorithm == "pdnr" else 1) + 2) + 1
        overhead = 2 * exchanges * (3 + 3 * order + 3 * 3 * order) * 8
        if algorithm == "mu":
            assert h["bytes_sent"] - h["bytes_lower_bound"] <= overhead
    print("bytes sent", got.history[-1]["bytes_sent"], "lower bound", got.history[-1]["bytes_lower_bound"])


@pytest.mark.parametrize("algorithm", ["mu", "pdnr"])
def test_three_workers_streaming_and_in_memory_equal_one_process(three_workers, rng, tmp_path, algorithm):
    store = _counts(rng, tmp_path, 4, 4000, empty_rows=True)
    kw = dict(algorithm=algorithm, seed=int(rng.integers(1 << 30)), max_iters=3, max_inner_iters=3)
    ref = tfo.cp_apr(store, 3, scheduler="inline", **kw)
    for execution in ("streaming", "in-memory"):
        got = tfo.cp_apr(store, 3, client=three_workers, execution=execution, **kw)
        assert got.params["distribution"]["workers"] == 3
        assert got.params["execution"] == execution
        print(algorithm, execution, "max differences (loglik rel, factors abs):", _max_rel(got, ref))
        _assert_same(got, ref)


@pytest.mark.parametrize("algorithm", ["mu", "pdnr"])
def test_checkpoint_resume_and_graph_distribution(two_workers, rng, tmp_path, algorithm):
    store = _counts(rng, tmp_path, 3, 2500)
    init = [rng.random((s, 3)) for s in store.shape]
    kw = dict(algorithm=algorithm, init=init, max_iters=5, max_inner_iters=3)
    ref = tfo.cp_apr(store, 3, scheduler="inline", **kw)
    straight = tfo.cp_apr(store, 3, client=two_workers, execution="streaming", **kw)
    _assert_same(straight, ref)
    ck = tmp_path / f"{algorithm}.ck.npz"

    def stop_after_two(rec):
        if rec["iteration"] == 2:
            raise KeyboardInterrupt  # a user stopping the run from a callback

    with pytest.raises(KeyboardInterrupt):
        tfo.cp_apr(store, 3, client=two_workers, checkpoint=ck, callback=stop_after_two, **kw)
    assert ck.exists()
    shutil.copy(ck, tmp_path / "after2.npz")
    resumed = tfo.cp_apr(store, 3, client=two_workers, checkpoint=ck, resume=True, **kw)
    assert resumed.params["resumed_after"] == 2
    _assert_same(resumed, ref)
    # a checkpoint of the owner-computes run resumes on one process too, and the other way round
    one = tfo.cp_apr(store, 3, scheduler="inline", checkpoint=tmp_path / "after2.npz", resume=True, **kw)
    _assert_same(one, ref)
    ck1 = tmp_path / "one.ck.npz"
    with pytest.raises(KeyboardInterrupt):
        tfo.cp_apr(store, 3, scheduler="inline", checkpoint=ck1, callback=stop_after_two, **kw)
    _assert_same(tfo.cp_apr(store, 3, client=two_workers, checkpoint=ck1, resume=True, **kw), ref)
    # a finished run's checkpoint resumes to its result, with nothing left to run
    again = tfo.cp_apr(store, 3, client=two_workers, checkpoint=ck, resume=True, **kw)
    _assert_same(again, ref)
    graph = tfo.cp_apr(store, 3, client=two_workers, distribution="graph", **kw)
    assert "distribution" not in graph.params and "bytes_sent" not in graph.history[-1]
    _assert_same(graph, ref)
    left = two_workers.run(lambda: len(_RUNS))
    assert set(left.values()) == {0}, left


def test_converged_run_stops_where_one_process_stops(two_workers, rng, tmp_path):
    store = _counts(rng, tmp_path, 3, 2000)
    kw = dict(seed=int(rng.integers(1 << 30)), max_iters=200, tol=1e-2)
    ref = tfo.cp_apr(store, 2, scheduler="inline", **kw)
    got = tfo.cp_apr(store, 2, client=two_workers, **kw)
    assert ref.iterations < 200
    _assert_same(got, ref)


def test_refusals(rng, tmp_path):
    store = _counts(rng, tmp_path, 3, 500)
    with pytest.raises(ValueError, match="distribution must be one of"):
        tfo.cp_apr(store, 2, max_iters=1, scheduler="inline", distribution="mpi")
    with pytest.raises(ValueError, match="distribution='owner' runs CP-APR"):
        tfo.cp_apr(store, 2, max_iters=1, scheduler="inline", distribution="owner")


def test_mu_complementary_slackness_fix_reaches_the_rows_other_workers_hold(two_workers, rng, tmp_path):
    # a kappa_tol this large moves entries off zero in most outer iterations: the owners' moved
    # rows must reach the workers that touch them before the mode's first Phi
    store = _counts(rng, tmp_path, 4, 3000)
    kw = dict(seed=int(rng.integers(1 << 30)), max_iters=5, max_inner_iters=6, kappa_tol=0.05, kappa=0.02)
    ref = tfo.cp_apr(store, 3, scheduler="inline", **kw)
    got = tfo.cp_apr(store, 3, client=two_workers, **kw)
    assert sum(h["violations"] for h in ref.history) > 0
    assert [h["violations"] for h in got.history] == [h["violations"] for h in ref.history]
    _assert_same(got, ref)


@pytest.mark.parametrize("dead", [False, True])
def test_pdnr_safeguards_on_workers_as_in_one_process(two_workers, rng, tmp_path, dead):
    """A binary tensor from a clustered start (most nonzeros at model value 0): the owners' rows
    take the same safeguarded steps as one process's, counted in the same history field; also where
    one component is held by no row of the last mode (rows zero throughout, lifted alike)."""
    from test_cp_apr_pdnr import clustered_start, without_component

    shape, R = (120, 36, 20), 4  # about 7 nonzeros a first-mode row: some have only unreachable ones
    lin = rng.choice(int(np.prod(shape)), 900, replace=False)
    coords = np.stack(np.unravel_index(lin, shape), axis=1)
    store = store_of(tmp_path, "binary", coords, np.ones(len(lin)), shape, chunk_nnz=64)
    init = clustered_start(rng, shape, R)
    if dead:
        init = without_component(init, 2, int(rng.integers(R)))
    kw = dict(algorithm="pdnr", init=init, max_iters=3)
    ref = tfo.cp_apr(store, R, scheduler="inline", **kw)
    got = tfo.cp_apr(store, R, client=two_workers, execution="in-memory", **kw)
    assert got.params["distribution"] == {"kind": "owner-computes", "workers": 2}
    assert got.history[0]["safeguards"] == ref.history[0]["safeguards"]
    assert sum(ref.history[0]["safeguards"]["unreachable_nonzeros"]) > 0
    assert ref.history[0]["safeguards"]["frozen_rows"][0] > 0
    assert np.isfinite(got.loglik) and got.loglik == pytest.approx(ref.loglik, rel=1e-6)
