"""FastTuckerPlus tensor completion (seed 003): the kernels' gradients and matrixized updates
against NumPy references, the GPU kernels under the simulator, the decomposition on a planted
model, the train/test split, results and bad input."""

import math

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.decompositions.completion.fasttucker_result import CompletionError
from tensorflow_ooc.execution import completion as T
from tensorflow_ooc.kernels.completion import fasttucker_cpu as K

# ---------------------------------------------------------------- NumPy references (float64) ---


def stacked(shape, ranks, R, rng, scale=0.7):
    """Random stacked model (A, B, offsets) with zero padding past each mode's rank."""
    N = len(shape)
    J = max(ranks)
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]]).astype(np.int64)
    A = np.zeros((sum(shape), J))
    B = np.zeros((N, J, R))
    for n, (L, j) in enumerate(zip(shape, ranks)):
        A[offsets[n] : offsets[n] + L, :j] = scale * rng.standard_normal((L, j))
        B[n, :j] = scale * rng.standard_normal((j, R))
    return A, B, offsets


def predict_ref(coords, A, B, offsets):
    """xhat = sum_r prod_n (a_{i_n} B^(n))_r, by einsum."""
    out = np.ones((coords.shape[0], B.shape[2]))
    for n in range(coords.shape[1]):
        out *= np.einsum("ej,jr->er", A[offsets[n] + coords[:, n]], B[n])
    return out.sum(axis=1)


def loss(coords, values, A, B, offsets, reg_a, reg_b):
    """The seed's objective, halved: 1/2 sum e^2 + reg_a/2 sum_samples sum_n |a|^2 + reg_b/2 sum |B|^2."""
    e = values - predict_ref(coords, A, B, offsets)
    rows = coords + offsets[None, :]
    return 0.5 * (e**2).sum() + 0.5 * reg_a * (A[rows] ** 2).sum() + 0.5 * reg_b * (B**2).sum()


def per_sample_updates(coords, values, order, A, B, offsets, lr, reg, normalized=False):
    """Rule 12 of the seed applied sample by sample (each sample sees the previous updates); with
    ``normalized``, each sample's step divided by |g|^2 + delta, g its gradient over all its rows."""
    A = A.copy()
    N = coords.shape[1]
    for e in order:
        rows = offsets + coords[e]
        C = np.stack([A[rows[n]] @ B[n] for n in range(N)])
        err = values[e] - np.prod(C, axis=0).sum()
        g = [B[n] @ np.prod(np.delete(C, n, axis=0), axis=0) for n in range(N)]
        step = lr / (sum(x @ x for x in g) + K.NORMALIZED_DELTA) if normalized else lr
        new = []
        for n in range(N):
            new.append(A[rows[n]] + step * (err * g[n] - reg * A[rows[n]]))
        for n in range(N):
            A[rows[n]] = new[n]
    return A


def distinct_entries(rng, shape, m):
    """m entries no two of which share an index in any mode (so a batch repeats no index)."""
    return np.stack([rng.permutation(L)[:m] for L in shape], axis=1).astype(np.int64)


# ------------------------------------------------------------------ gradients and updates ---


@pytest.mark.parametrize("N", [3, 4, 5])
def test_factor_moves_are_the_loss_gradient(rng, N):
    shape = tuple(int(x) for x in rng.integers(6, 10, N))
    ranks = tuple(int(x) for x in rng.integers(2, 5, N))
    R = int(rng.integers(2, 5))
    A, B, off = stacked(shape, ranks, R, rng)
    coords = distinct_entries(rng, shape, 5)
    values = rng.standard_normal(5)
    lr, reg = 1e-3, 0.05
    A1 = A.copy()
    K.factor_pass(coords, values, np.arange(5, dtype=np.int64), off, A1, B, 5, lr, reg, 1)
    grad = -(A1 - A) / lr
    # the model is linear in any one entry, so the loss is quadratic in it: a central difference is
    # exact, and a large step keeps roundoff (eps * loss / h) far below the tolerance
    h = 1e-2
    for row in np.unique(coords + off):
        for j in range(A.shape[1]):
            Ap, Am = A.copy(), A.copy()
            Ap[row, j] += h
            Am[row, j] -= h
            fd = (loss(coords, values, Ap, B, off, reg, 0) - loss(coords, values, Am, B, off, reg, 0)) / (2 * h)
            assert grad[row, j] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    untouched = np.setdiff1d(np.arange(A.shape[0]), coords + off)
    assert np.array_equal(A1[untouched], A[untouched])


@pytest.mark.parametrize("N", [3, 4, 5])
def test_core_gradient_and_step_are_the_loss_gradient(rng, N):
    shape = tuple(int(x) for x in rng.integers(4, 8, N))
    ranks = tuple(int(x) for x in rng.integers(2, 4, N))
    R = int(rng.integers(2, 4))
    A, B, off = stacked(shape, ranks, R, rng)
    coords, values = random_coo(rng, shape, 40)
    grad, sse = K.core_gradient(coords, values, off, A, B, 2)
    assert sse == pytest.approx(((values - predict_ref(coords, A, B, off)) ** 2).sum(), rel=1e-12)
    # the model is linear in any one entry, so the loss is quadratic in it: a central difference is
    # exact, and a large step keeps roundoff (eps * loss / h) far below the tolerance
    h = 1e-2
    for n in range(N):
        for j in range(ranks[n]):
            for r in range(R):
                Bp, Bm = B.copy(), B.copy()
                Bp[n, j, r] += h
                Bm[n, j, r] -= h
                fd = (loss(coords, values, A, Bp, off, 0, 0) - loss(coords, values, A, Bm, off, 0, 0)) / (2 * h)
                assert grad[n, j, r] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    # the step: B - lr * gradient of (1/|Omega|) 1/2 sum e^2 + reg/2 |B|^2
    state = T.FastTuckerState(A, B, off, shape, ranks)
    lr, reg = 0.1, 0.01
    stepped = T.apply_core(state, lr, reg, T.CoreGradient(grad, sse, coords.shape[0])).B
    want = B - lr * (grad / coords.shape[0] + reg * B)
    for n, j in enumerate(ranks):
        want[n, j:] = 0
    np.testing.assert_allclose(stepped, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("N", [3, 4, 5])
def test_matrixized_batch_equals_per_sample_updates_without_repeated_indices(rng, N, normalized):
    shape = tuple(int(x) for x in rng.integers(40, 60, N))
    ranks = tuple(int(x) for x in rng.integers(2, 6, N))
    A, B, off = stacked(shape, ranks, 4, rng)
    M = 16
    lr = 0.3 if normalized else 0.01
    coords = distinct_entries(rng, shape, M)
    values = rng.standard_normal(M)
    order = rng.permutation(M).astype(np.int64)
    want = per_sample_updates(coords, values, order, A, B, off, lr, 0.02, normalized)
    got = A.copy()
    K.factor_pass(coords, values, order, off, got, B, M, lr, 0.02, 1, normalized)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert not np.allclose(got, A)
    # with a repeated row the batch moves it twice from the same start (moves add)
    coords[1, 0] = coords[0, 0]
    got = A.copy()
    K.factor_pass(coords, values, np.arange(M, dtype=np.int64), off, got, B, M, lr, 0.0, 1, normalized)
    single = [A.copy(), A.copy()]
    for k in range(2):
        K.factor_pass(
            coords[k : k + 1], values[k : k + 1], np.zeros(1, np.int64), off, single[k], B, 1, lr, 0.0, 1, normalized
        )
    row = off[0] + coords[0, 0]
    np.testing.assert_allclose(got[row], A[row] + (single[0][row] - A[row]) + (single[1][row] - A[row]), rtol=1e-12)


@pytest.mark.parametrize("scale", [1.0, 2.0, 4.0])
def test_normalized_step_removes_the_rate_fraction_of_the_error_at_any_scale(rng, scale):
    """To first order, a normalized step of rate lr turns a sample's error e into (1 - lr) e,
    whatever the scale of the model (a plain step's reach grows with it)."""
    shape = (20, 30, 25, 10)
    A, B, off = stacked(shape, (3, 4, 2, 3), 3, rng, scale=scale)
    coords = distinct_entries(rng, shape, 1)
    e0 = 1.0 - predict_ref(coords, A, B, off)[0]
    lr = 1e-6
    got = A.copy()
    K.factor_pass(coords, np.ones(1), np.zeros(1, np.int64), off, got, B, 1, lr, 0.0, 1, True)
    e1 = 1.0 - predict_ref(coords, got, B, off)[0]
    C = np.stack([A[off[n] + coords[0, n]] @ B[n] for n in range(4)])
    g2 = sum(np.sum((B[n] @ np.prod(np.delete(C, n, axis=0), axis=0)) ** 2) for n in range(4))
    assert (e0 - e1) / e0 == pytest.approx(lr * g2 / (g2 + K.NORMALIZED_DELTA), rel=1e-3)


def test_gauge_rebalance_keeps_every_prediction_and_conditions_the_core(rng):
    shape = (30, 20, 25, 15)
    ranks = (5, 2, 4, 5)  # J_n above, below and at R
    A, B, off = stacked(shape, ranks, 4, rng)
    B[0] *= 50.0  # badly scaled, badly conditioned gauge
    B[1, :, 0] *= 1e-3
    A2, B2 = T.rebalance_gauge(A, B, off, shape, ranks)
    coords, _ = random_coo(rng, shape, 300)
    before = predict_ref(coords, A, B, off)
    np.testing.assert_allclose(predict_ref(coords, A2, B2, off), before, rtol=1e-10, atol=1e-12 * np.abs(before).max())
    rms = []
    for n, (L, J) in enumerate(zip(shape, ranks)):
        k = min(J, 4)
        np.testing.assert_allclose(B2[n, :k] @ B2[n, :k].T, np.eye(k), atol=1e-12)  # orthonormal rows
        assert not B2[n, k:].any() and not A2[off[n] : off[n] + L, k:].any()
        C = A2[off[n] : off[n] + L] @ B2[n]
        rms.append(np.sqrt((C**2).mean(axis=0)))
    np.testing.assert_allclose(np.array(rms), np.broadcast_to(rms[0], (4, 4)), rtol=1e-10)  # equal column scales


def test_one_thread_is_reproducible_and_predict_matches_reference(rng):
    shape = (30, 20, 10)
    # rows of scale 0.5: at 0.7 the plain step (lr 0.01) diverged to NaN on 2 draws in 400
    # (predictions up to 80, so lr |g|^2 > 2); at 0.5 none in 3000, the rows staying below 2.5
    A, B, off = stacked(shape, (3, 3, 3), 3, rng, scale=0.5)
    coords, values = random_coo(rng, shape, 500)
    order = rng.permutation(500).astype(np.int64)
    runs = []
    for _ in range(2):
        a = A.copy()
        K.factor_pass(coords, values, order, off, a, B, 16, 0.01, 0.01, 1)
        runs.append(a)
    assert np.isfinite(runs[0]).all() and np.array_equal(runs[0], runs[1])
    np.testing.assert_allclose(K.predict_entries(coords, off, A, B), predict_ref(coords, A, B, off), rtol=1e-12)


# ------------------------------------------------------------------------------- GPU kernels ---


@pytest.mark.parametrize("normalized", [False, True])
def test_gpu_kernels_match_cpu_within_fp16_rounding(rng, normalized):
    """Under the simulator (tiny): two batches of 16 entries sharing no row, so the order in which
    warps run does not matter; inputs of the tile products are rounded to fp16, sums in fp32."""
    from tensorflow_ooc.kernels.gpu.device import gpu_unavailable

    if gpu_unavailable():
        pytest.skip(gpu_unavailable())
    from tensorflow_ooc.kernels.completion.fasttucker_gpu import core_gradient_gpu, factor_pass_gpu

    shape = (40, 40, 40)
    A, B, off = stacked(shape, (4, 3, 4), 5, rng)
    coords = distinct_entries(rng, shape, 32)
    values = rng.standard_normal(32)
    order = rng.permutation(32).astype(np.int64)
    want = A.copy()
    lr = 0.3 if normalized else 0.05
    K.factor_pass(coords, values, order, off, want, B, 16, lr, 0.01, 1, normalized)
    got = factor_pass_gpu(coords, values, order, off, A, B, lr, 0.01, normalized=normalized, warps=1, max_blocks=2)
    moves, ref = got - A, want - A
    assert np.abs(ref).max() > 1e-3
    # each move sums products of 3-4 inputs rounded to fp16 (2^-11 each), terms larger than the
    # move where they cancel: 1.25 % of the largest move seen once in CI (5e-3 allowed then)
    np.testing.assert_allclose(moves, ref, atol=2e-2 * np.abs(ref).max())
    grad = core_gradient_gpu(coords, values, off, A, B, warps=1, max_blocks=2)
    ref_grad, _ = K.core_gradient(coords, values, off, A, B, 1)
    np.testing.assert_allclose(grad, ref_grad, atol=5e-3 * np.abs(ref_grad).max())


def test_gpu_config_pads_to_tiles_and_refuses_what_does_not_fit():
    from tensorflow_ooc.kernels.completion.fasttucker_gpu import FastTuckerConfig

    cfg = FastTuckerConfig.for_ranks(3, 5, 17, "shared")
    assert (cfg.jp, cfg.rp) == (16, 32)
    with pytest.raises(ValueError, match="shared memory"):
        FastTuckerConfig.for_ranks(8, 64, 64, "shared")


# ------------------------------------------------------------- decomposition, split, results ---


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small planted FastTucker store (two partitions' worth of chunks) and its model."""
    d = tmp_path_factory.mktemp("fasttucker")
    p = synthetic.planted_fasttucker((30, 20, 10), 3, 3, 3000, noise=0.05, seed=11)
    store = tfo.convert((p.coords, p.values), str(d / "train.zarr"), shape=p.shape, chunk_nnz=1024)
    return p, store, d


def test_split_is_seeded_and_disjoint(small):
    p, store, _ = small
    from tensorflow_ooc.execution.partitions import plan_partitions

    offsets = np.array([0, 30, 50], np.int64)
    parts = plan_partitions(store, 3)
    assert len(parts) > 1

    def split(seed):
        loaded = [T.load_observed(store.path, part, offsets, 0.1, seed) for part in parts]
        train = np.concatenate([x.coords for x in loaded])
        test = np.concatenate([x.test_coords for x in loaded])
        return train, test

    train, test = split(5)
    keys = lambda c: set(map(tuple, c.tolist()))  # noqa: E731
    assert not keys(train) & keys(test)
    assert keys(train) | keys(test) == keys(p.coords)
    assert 0.06 < test.shape[0] / p.coords.shape[0] < 0.14
    again_train, again_test = split(5)
    assert keys(again_test) == keys(test)
    assert keys(split(6)[1]) != keys(test)
    # the mask depends on the coordinates only, not on their order or partition
    mask = K.held_out_mask(p.coords, np.uint64(5), 0.1)
    assert keys(p.coords[mask]) == keys(test)


def dense_reference(factors, core_factors):
    """Dense Tucker model: the Kruskal core by einsum, then the factors mode by mode (tensordot)."""
    N = len(factors)
    core = np.zeros(tuple(b.shape[0] for b in core_factors))
    for r in range(core_factors[0].shape[1]):
        outer = core_factors[0][:, r]
        for b in core_factors[1:]:
            outer = np.multiply.outer(outer, b[:, r])
        core += outer
    X = core
    for n in range(N):
        X = np.moveaxis(np.tensordot(factors[n], X, axes=(1, n)), 0, n)
    return X


@pytest.mark.parametrize("N", [3, 4, 5])
def test_predict_matches_the_dense_model(rng, N):
    shape = tuple(int(x) for x in rng.integers(3, 6, N))
    ranks = tuple(int(rng.integers(1, L + 1)) for L in shape)
    R = int(rng.integers(1, 4))
    res = tfo.FastTuckerResult(
        [rng.standard_normal((L, j)) for L, j in zip(shape, ranks)],
        [rng.standard_normal((j, R)) for j in ranks],
        0.0,
        0.0,
        0,
        0,
    )
    dense = dense_reference(res.factors, res.core_factors)
    coords = np.stack(np.unravel_index(np.arange(dense.size), shape), axis=1)
    np.testing.assert_allclose(res.predict(coords), dense.ravel(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.full(), dense, rtol=1e-12, atol=1e-12)
    with pytest.raises(CompletionError, match="outside"):
        res.predict(np.array([list(shape)]))


def test_run_keeps_the_best_epoch_saves_and_loads(small, tmp_path):
    p, store, _ = small
    seen = []
    r = tfo.tucker_sgd(
        store,
        3,
        3,
        test_fraction=0.2,
        epochs=6,
        seed=2,
        progress=True,
        out=tmp_path / "r.zarr",
        callback=seen.append,
        threads=1,
    )
    assert len(seen) == len(r.history) == r.epochs == 6
    for h in r.history:
        assert {"test_rmse", "test_mae", "train_rmse", "factor_seconds", "core_seconds"} <= set(h)
    best = min(r.history, key=lambda h: h["test_rmse"])
    assert r.best_epoch == best["epoch"] and r.test_rmse == best["test_rmse"]
    assert r.history[-1]["test_rmse"] < r.history[0]["test_rmse"]
    # the kept model's test error is the recorded one
    mask = K.held_out_mask(p.coords, np.uint64(2), 0.2)
    err = p.values[mask] - r.predict(p.coords[mask])
    assert math.sqrt(np.mean(err**2)) == pytest.approx(r.test_rmse, rel=1e-9)
    assert np.mean(np.abs(err)) == pytest.approx(r.test_mae, rel=1e-9)
    # reproducible with one thread
    again = tfo.tucker_sgd(store, 3, 3, test_fraction=0.2, epochs=6, seed=2, progress=False, threads=1)
    assert [h["test_rmse"] for h in again.history] == [h["test_rmse"] for h in r.history]
    back = tfo.load_fasttucker_result(tmp_path / "r.zarr")
    for a, b in zip(back.factors + back.core_factors, r.factors + r.core_factors):
        np.testing.assert_array_equal(a, b)
    assert back.history == r.history and back.best_epoch == r.best_epoch
    assert isinstance(tfo.load_result(tmp_path / "r.zarr"), tfo.FastTuckerResult)  # the one reader of result stores
    with pytest.raises(tfo.TfoocError, match="not a tensorflow_ooc CP result"):
        tfo.load_result(store.path)
    r.save_npz(tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as z:
        np.testing.assert_array_equal(z["core_factor1"], r.core_factors[1])


def test_user_test_store_and_dask_partitions(small, tmp_path):
    """A separate test store, on an embedded Dask cluster with several partitions (tree reductions)."""
    p, _, _ = small
    n = p.coords.shape[0]
    train = tfo.convert(
        (p.coords[: n - 300], p.values[: n - 300]), str(tmp_path / "tr.zarr"), shape=p.shape, chunk_nnz=512
    )
    test = tfo.convert((p.coords[n - 300 :], p.values[n - 300 :]), str(tmp_path / "te.zarr"), shape=p.shape)
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cl,
        Client(cl) as client,
    ):
        r = tfo.tucker_sgd(train, 3, 3, test=test, epochs=4, seed=0, progress=False, client=client, partitions=6)
    assert r.params["partitions"] == 6 and r.params["n_test"] == 300 and r.params["n_train"] == n - 300
    err = p.values[n - 300 :] - r.predict(p.coords[n - 300 :])
    assert math.sqrt(np.mean(err**2)) == pytest.approx(r.test_rmse, rel=1e-9)
    assert r.history[-1]["test_rmse"] < r.history[0]["test_rmse"]


def test_partition_moves_average_rows_several_partitions_touched(rng):
    A, B, off = stacked((6, 5, 4), (2, 2, 2), 2, rng)
    state = T.FastTuckerState(A, B, off, (6, 5, 4), (2, 2, 2))
    m1 = T.RowMoves(np.array([0, 3, 7]), rng.standard_normal((3, 2)), np.ones(3, np.int64))
    m2 = T.RowMoves(np.array([3, 9]), rng.standard_normal((2, 2)), np.ones(2, np.int64))
    m3 = T.RowMoves(np.array([3]), rng.standard_normal((1, 2)), np.ones(1, np.int64))
    new = T.apply_moves(state, T.combine_moves(m1, m2), m3).A
    want = A.copy()
    want[0] += m1.moves[0]
    want[7] += m1.moves[2]
    want[9] += m2.moves[1]
    want[3] += (m1.moves[1] + m2.moves[0] + m3.moves[0]) / 3
    np.testing.assert_allclose(new, want, rtol=1e-14)
    assert np.array_equal(state.A, A)  # the input state is not modified


# ----------------------------------------------------------------------------- bad input ---


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ranks=(3, 25, 3)), "exceeds its length 20"),
        (dict(ranks=(0, 3, 3)), "must be an integer >= 1"),
        (dict(ranks=(3, 3)), "2 given for the 3 modes"),
        (dict(core_rank=0), "core_rank"),
        (dict(lr_factors=float("nan")), "lr_factors"),
        (dict(lr_core=float("nan")), "lr_core"),
        (dict(reg_factors=-1.0), "reg_factors"),
        (dict(test_fraction=1.5), "test_fraction"),
        (dict(epochs=0), "epochs"),
        (dict(step="adam"), "step must be"),
        (dict(lr_factors=2.5), "in \\(0, 2\\)"),
        (dict(lr_decay=-0.1), "lr_decay"),
        (dict(revive_epochs=-1), "revive_epochs"),
        (dict(revive_epochs=2.5), "revive_epochs"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(small, tmp_path, kwargs, match):
    _, store, _ = small
    args = dict(ranks=3, core_rank=3, test_fraction=0.1, epochs=2, progress=False, out=tmp_path / "out.zarr")
    args.update(kwargs)
    ranks, core_rank = args.pop("ranks"), args.pop("core_rank")
    with pytest.raises(CompletionError, match=match):
        tfo.tucker_sgd(store, ranks, core_rank, **args)
    assert not (tmp_path / "out.zarr").exists()
    assert issubclass(CompletionError, tfo.TfoocError)


def test_bad_test_sets_are_refused(small, tmp_path):
    p, store, _ = small
    overlap = tfo.convert((p.coords[:50], p.values[:50]), str(tmp_path / "overlap.zarr"), shape=p.shape)
    with pytest.raises(CompletionError, match="overlaps the training store.*50 entries"):
        tfo.tucker_sgd(store, 3, 3, test=overlap, epochs=2, progress=False, out=tmp_path / "o.zarr")
    outside = tfo.convert((np.array([[31, 0, 0]]), np.array([1.0])), str(tmp_path / "outside.zarr"))
    with pytest.raises(CompletionError, match="index 31 of mode 0 lies outside"):
        tfo.tucker_sgd(store, 3, 3, test=outside, epochs=2, progress=False, out=tmp_path / "o.zarr")
    with pytest.raises(CompletionError, match="not both"):
        tfo.tucker_sgd(store, 3, 3, test=overlap, test_fraction=0.1, epochs=2, progress=False)
    assert not (tmp_path / "o.zarr").exists()


# -------------------------------------------------------------------------- CLI and README ---


def tfooc(capsys, *args):
    """Run the CLI in this process (its imports are paid once); returns (status, stdout, stderr)."""
    from tensorflow_ooc.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse: --help and usage errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_complete(small, tmp_path, capsys):
    _, store, _ = small
    _, help_text, _ = tfooc(capsys, "complete", "--help")
    for flag in (
        "--ranks",
        "--core-rank",
        "--test",
        "--test-fraction",
        "--epochs",
        "--batch",
        "--lr-factors",
        "--lr-core",
        "--reg-factors",
        "--reg-core",
        "--seed",
        "--out",
        "--step",
        "--no-rebalance",
        "--revive-epochs",
    ):
        assert flag in help_text
    out = tmp_path / "cli.zarr"
    code, _, err = tfooc(
        capsys, "complete", store.path, "--ranks", "3,3,3", "--core-rank", "3", "--lr-factors", "nan", "--out", out
    )
    # refused at parse time now, naming the option as given (the API names its keyword, above)
    assert code == 2 and "--lr-factors" in err and "tfooc: error:" in err and not out.exists()
    code, _, err = tfooc(capsys, "complete", store.path, "--ranks", "3,30,3", "--core-rank", "3", "--out", out)
    assert code == 2 and "exceeds" in err and not out.exists()
    code, _, err = tfooc(capsys, "complete", store.path, "--ranks", "3,a", "--core-rank", "3")
    assert code == 2 and "not ranks" in err
    code, _, err = tfooc(
        capsys,
        "complete",
        store.path,
        "--ranks",
        "3",
        "--core-rank",
        "3",
        "--test",
        store.path,
        "--test-fraction",
        "0.1",
    )
    assert code == 2 and "not allowed with" in err
    code, stdout, err = tfooc(
        capsys,
        "-q",
        "complete",
        store.path,
        "--ranks",
        "3",
        "--core-rank",
        "3",
        "--epochs",
        "3",
        "--test-fraction",
        "0.2",
        "--seed",
        "4",
        "--out",
        out,
    )
    assert code == 0, err
    assert "test RMSE" in stdout and out.exists()
    r = tfo.load_fasttucker_result(out)
    assert r.params["test_fraction"] == 0.2 and r.epochs == 3
    assert r.params["step"] == "normalized" and r.params["rebalance"] and r.params["lr_factors"] == 0.3
    assert r.params["revive_epochs"] == 10
    code, _, err = tfooc(
        capsys,
        "-q",
        "complete",
        store.path,
        "--ranks",
        "3",
        "--core-rank",
        "3",
        "--epochs",
        "2",
        "--step",
        "plain",
        "--no-rebalance",
        "--revive-epochs",
        "0",
        "--out",
        out,
        "--overwrite",
    )
    assert code == 0, err
    r = tfo.load_fasttucker_result(out)
    assert r.params["step"] == "plain" and not r.params["rebalance"] and r.params["lr_factors"] == 0.01
    assert r.params["revive_epochs"] == 0
    assert r.params["lr_decay"] == 0.0


def test_readme_completion_example_runs(tmp_path, monkeypatch):
    import re
    import runpy
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "tucker_sgd(" in b)
    (tmp_path / "example.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "example.py"))
    assert (tmp_path / "storage" / "completion-example.r.zarr").exists()


# ------------------------------------------------------------------------ planted convergence ---


def test_planted_model_is_recovered_near_the_noise_level(rng):
    """The issue's case: 300 x 200 x 50, 200 k observed entries of a planted FastTucker model
    (J = R = 8) with 5 % noise, fitted at J = R = 8, 90/10 split, 50 epochs, default settings.

    Measured over 120 fresh (model, start) pairs with the lost-component restart: a median of
    1.06 x the noise, 4 runs above 1.2 x (swamps: two components that share one planted one for
    tens of epochs; without the restart 10-14 of 30 ended at 1.6-3.3 x). So a run may take
    up to three starts to get under 1.2 x, as a user would restart."""
    p = synthetic.planted_fasttucker((300, 200, 50), 8, 8, 200_000, noise=0.05, seed=int(rng.integers(2**31)))
    store = tfo.convert((p.coords, p.values), f"memory://planted-{rng.integers(2**62)}", shape=p.shape)
    for _ in range(3):
        r = tfo.tucker_sgd(
            store, 8, 8, test_fraction=0.1, epochs=50, seed=int(rng.integers(2**31)), progress=False, patience=None
        )
        if r.test_rmse < 1.2 * p.noise_std:
            break
    ratios = [round(h["test_rmse"] / p.noise_std, 3) for h in r.history]
    print("test RMSE / noise by epoch:", ratios, "restarts:", [h["revived"] for h in r.history if "revived" in h])
    assert r.params["n_test"] == pytest.approx(20_000, rel=0.05)
    assert r.params["step"] == "normalized" and r.params["rebalance"] and r.params["lr_factors"] == 0.3
    assert r.params["revive_epochs"] == 10
    assert r.test_rmse < 1.2 * p.noise_std, ratios
    assert r.test_rmse < r.history[0]["test_rmse"], ratios  # still learning after the first epoch


def test_gpu_device_path_end_to_end(rng):
    """device="gpu" runs both passes through the warp-per-batch kernels (the simulator here)."""
    from tensorflow_ooc.kernels.gpu.device import gpu_unavailable

    if gpu_unavailable():
        pytest.skip(gpu_unavailable())
    p = synthetic.planted_fasttucker((20, 16, 12), 3, 3, 120, noise=0.05, seed=int(rng.integers(2**31)))
    store = tfo.convert((p.coords, p.values), f"memory://gpu-{rng.integers(2**62)}", shape=p.shape)
    r = tfo.tucker_sgd(
        store, 3, 3, test_fraction=0.25, epochs=1, seed=3, progress=False, device="gpu", scheduler="inline"
    )
    assert r.params["device"] == "gpu" and math.isfinite(r.test_rmse)
    mask = K.held_out_mask(p.coords, np.uint64(3), 0.25)
    err = p.values[mask] - r.predict(p.coords[mask])
    assert math.sqrt(np.mean(err**2)) == pytest.approx(r.test_rmse, rel=1e-6)


@pytest.mark.parametrize("test_fraction, seed", [(0.1, 1005), (None, 5000), (0.1, None), (None, None)])
def test_an_overshooting_core_step_is_redone_not_kept(rng, test_fraction, seed, caplog):
    """Small planted models where the first epoch's core step overshoots (model error 10^2-10^4 x
    the values' RMS) although the training error, measured before the core step, looks sane. It
    used to be kept, and every later epoch then diverged at any rate until the run gave up
    (``seed`` 1005 with a 10 % test split, 5000 without: both failed so before the epoch's final
    model was checked; 4 of 17 seeds with the split did, 3 of 81 without). Now the overshooting
    epoch is redone at half the rates, checked on held-out entries or on a training sample when
    none are held out (0 of 400 seeds gave up). ``None``: fresh seeds."""
    import logging

    learned = []
    for _ in range(1 if seed is not None else 5):
        s = seed if seed is not None else int(rng.integers(1 << 30))
        p = synthetic.planted_fasttucker((20, 15, 10), 3, 3, 1500, noise=0.05, seed=s)
        store = tfo.convert((p.coords, p.values), f"memory://overshoot-{rng.integers(2**62)}", shape=p.shape)
        with caplog.at_level(logging.WARNING, logger="tensorflow_ooc"):
            r = tfo.tucker_sgd(store, 3, 3, test_fraction=test_fraction, epochs=4, threads=1, progress=False, seed=1)
        rms = math.sqrt(float(np.mean(p.values**2)))
        train = [h["train_rmse"] for h in r.history]
        assert len(train) == 4 and all(math.isfinite(t) for t in train), (s, train)
        learned.append((train[-1] < rms, s, train, rms))  # learned, not merely survived
        if seed is not None:  # the known overshoot was caught in epoch 1 and redone
            assert "epoch 1 diverged" in caplog.text and r.history[0]["rate_factor"] == 0.5
        if test_fraction is not None:
            # the result is the epoch with the best held-out RMSE (a later one may overfit 150 entries)
            assert r.test_rmse < rms and r.test_rmse == min(h["test_rmse"] for h in r.history), (s, r.history)
    # without a test split about 1 seed in 150 is still above the zero model's error after 4 epochs
    # at the default rates (seed 621564037: an accepted first epoch left it 2.4x that error, and the
    # halved rates that followed learn slowly): every seed survives, the known ones learn, and of
    # fresh ones all but one at most
    assert sum(ok for ok, *_ in learned) >= len(learned) - (seed is None), learned
