"""Exact TT-ALS: against a dense NumPy TT-ALS (same init, same QR sweeps) at orders 3 to 6, the
contraction kernel against dense einsum, recovery of an exact tensor train, streaming against
in-memory, two worker processes against this process, checkpoint resume, results, bad input, CLI."""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
import pytest
from conftest import random_coo
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.decompositions.tt.tt_steps import initial_cores
from tensorflow_ooc.errors import DecompositionError
from tensorflow_ooc.execution.partitions import plan_partitions
from tensorflow_ooc.execution.tasks import load_partition
from tensorflow_ooc.execution.tt_tasks import contraction_partition
from tensorflow_ooc.kernels.tt import TTCores

SHAPES = {3: (7, 6, 5), 4: (5, 4, 6, 4), 5: (4, 3, 4, 3, 4), 6: (3, 4, 3, 3, 2, 3)}


# --- a dense NumPy TT-ALS: the reference ---------------------------------------------------------


def qr_pos(a):
    q, r = np.linalg.qr(a)
    s = np.where(np.diag(r) < 0, -1.0, 1.0)
    return q * s, r * s[:, None]


def left_orth(cores, k):
    a, i, b = cores[k].shape
    q, r = qr_pos(cores[k].reshape(a * i, b))
    cores[k] = q.reshape(a, i, b)
    cores[k + 1] = np.einsum("ab,bic->aic", r, cores[k + 1])


def right_orth(cores, k):
    a, i, b = cores[k].shape
    q, r = qr_pos(cores[k].reshape(a, i * b).T)
    cores[k] = q.T.reshape(a, i, b)
    cores[k - 1] = np.einsum("aib,bc->aic", cores[k - 1], r.T)


def ref_init(shape, full_ranks, seed):
    """Standard normal cores from default_rng(seed), core 0 first, made right-orthonormal from the last."""
    rng = np.random.default_rng(seed)
    cores = [rng.standard_normal((full_ranks[k], shape[k], full_ranks[k + 1])) for k in range(len(shape))]
    for k in range(len(shape) - 1, 0, -1):
        right_orth(cores, k)
    return cores


def dense_Y(X, cores, j):
    """Y_j[a, i, b] = sum X[i_<j, i, i_>j] L(i_<j)[a] Rt(i_>j)[b], by dense einsum."""
    N = X.ndim
    L = np.ones((1, 1))  # (prod I_<j, R_{j-1})
    for k in range(j):
        L = np.einsum("pa,aib->pib", L, cores[k]).reshape(-1, cores[k].shape[2])
    Rt = np.ones((1, 1))  # (R_j, prod I_>j)
    for k in range(N - 1, j, -1):
        Rt = np.einsum("aib,bq->aiq", cores[k], Rt).reshape(cores[k].shape[0], -1)
    Xm = X.reshape(L.shape[0], X.shape[j], Rt.shape[1])
    return np.einsum("pa,piq,bq->aib", L, Xm, Rt)


def to_dense(cores):
    out = cores[0]
    for c in cores[1:]:
        out = np.tensordot(out, c, axes=(-1, 0))
    return out.reshape([c.shape[1] for c in cores])


def ref_tt_als(X, cores, sweeps):
    """The same sweeps: cores 0..N-2 left to right (then left-orthonormal), N-1..1 back (then
    right-orthonormal); the fit of each sweep from the dense model."""
    cores = [c.copy() for c in cores]
    N = X.ndim
    fits = []
    for _ in range(sweeps):
        for j in range(N - 1):
            cores[j] = dense_Y(X, cores, j)
            left_orth(cores, j)
        for j in range(N - 1, 0, -1):
            cores[j] = dense_Y(X, cores, j)
            right_orth(cores, j)
        fits.append(1 - np.linalg.norm(X - to_dense(cores)) / np.linalg.norm(X))
    return cores, fits


def valid_ranks(rng, shape, rmax):
    """Random inner ranks in 1..rmax, lowered until every core's unfoldings keep them."""
    full = [1] + [int(r) for r in rng.integers(1, rmax + 1, len(shape) - 1)] + [1]
    for _ in range(len(shape)):
        for k in range(len(shape)):
            full[k + 1] = min(full[k + 1], full[k] * shape[k])
            full[k] = min(full[k], shape[k] * full[k + 1])
    return full


def sparse_tensor(rng, shape, density=0.5):
    nnz = max(1, int(density * math.prod(shape)))
    coords, values = random_coo(rng, shape, nnz)
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    return X, coords, values


def store_of(tmp_path, name, coords, values, shape, **kw):
    return tfo.convert((coords, values), str(tmp_path / f"{name}.zarr"), shape=shape, **kw)


def assert_cores_close(got, want, rtol=1e-10):
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and a.dtype == np.float64, k
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(1.0, np.abs(b).max()), err_msg=f"core {k}")


# --- correctness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [3, 4, 5, 6])
def test_matches_dense_numpy_tt_als(tmp_path, rng, order):
    shape = SHAPES[order]
    X, coords, values = sparse_tensor(rng, shape)
    store = store_of(tmp_path, "x", coords, values, shape)
    full = valid_ranks(rng, shape, 3)
    seed = int(rng.integers(1 << 30))
    sweeps = 3
    r = tfo.tt_als(store, full[1:-1], seed=seed, max_sweeps=sweeps, tol=0)
    want, fits = ref_tt_als(X, ref_init(shape, full, seed), sweeps)
    assert r.ranks == tuple(full) and r.sweeps == sweeps and len(r.history) == sweeps
    assert_cores_close(r.cores, want)
    # the fit by the inner-product identity against the dense model's, every sweep
    np.testing.assert_allclose([h["fit"] for h in r.history], fits, rtol=0, atol=1e-10)
    assert r.fit == r.history[-1]["fit"]
    # the canonical form the sweeps leave: cores 1..N-1 right-orthonormal
    for c in r.cores[1:]:
        m = c.reshape(c.shape[0], -1)
        np.testing.assert_allclose(m @ m.T, np.eye(c.shape[0]), atol=1e-12)


def test_contraction_kernel_matches_dense_einsum(tmp_path, rng):
    """Every mode's Y_j from one partition, decoded in memory and streamed, and from several
    partitions summed, against the dense einsum (chains of any orthonormality)."""
    shape = (6, 5, 7, 4)
    X, coords, values = sparse_tensor(rng, shape, 0.4)
    # small chunks and blocks: several partitions, and items with different block bases
    store = store_of(tmp_path, "k", coords, values, shape, chunk_nnz=64, max_block_nnz=100)
    full = valid_ranks(rng, shape, 4)
    cores = [rng.standard_normal((full[k], shape[k], full[k + 1])) for k in range(len(shape))]
    tt = TTCores.of(cores)
    whole = plan_partitions(store, 1)[0]
    parts = plan_partitions(store, 3)
    assert len(parts) == 3
    for j in range(len(shape)):
        want = dense_Y(X, cores, j).transpose(1, 0, 2).reshape(shape[j], -1)
        for sources in ([load_partition(store.path, whole)], [(store.path, whole)], [(store.path, p) for p in parts]):
            got = np.zeros_like(want)
            for source in sources:
                p = contraction_partition(source, tt, j, threads=2)
                got[p.lo : p.lo + p.rows.shape[0]] += p.rows
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_recovers_an_exact_tensor_train(tmp_path, rng):
    """A tensor that is a TT of the requested ranks, every cell stored: fit 1."""
    shape = (5, 6, 4, 5)
    full = [1, 3, 4, 2, 1]
    cores = [rng.standard_normal((full[k], shape[k], full[k + 1])) for k in range(len(shape))]
    X = to_dense(cores)
    coords = np.argwhere(np.ones(shape, dtype=bool))
    store = store_of(tmp_path, "tt", coords, X[tuple(coords.T)], shape)
    r = tfo.tt_als(store, full[1:-1], seed=int(rng.integers(1 << 30)), max_sweeps=20, tol=1e-12)
    assert r.fit >= 1 - 1e-8, r.history
    np.testing.assert_allclose(r.to_dense(), X, atol=1e-6 * np.abs(X).max())


def test_given_init_and_tensorly_export(tmp_path, rng):
    shape = (6, 5, 4)
    X, coords, values = sparse_tensor(rng, shape)
    store = store_of(tmp_path, "g", coords, values, shape)
    full = [1, 3, 2, 1]
    init = [rng.standard_normal((full[k], shape[k], full[k + 1])) for k in range(3)]
    r = tfo.tt_als(store, [3, 2], init=init, max_sweeps=2, tol=0)
    start = [c.copy() for c in init]
    for k in (2, 1):
        right_orth(start, k)
    want, _ = ref_tt_als(X, start, 2)
    assert_cores_close(r.cores, want)
    assert r.params["init"] == "given"
    from tensorly.tt_tensor import tt_to_tensor

    tt = r.to_tensorly()
    assert tuple(tt.rank) == (1, 3, 2, 1)
    np.testing.assert_allclose(tt_to_tensor(tt), r.to_dense(), rtol=1e-12, atol=1e-12)


# --- execution ------------------------------------------------------------------------------------


def test_streaming_equals_in_memory_and_partitions(tmp_path, rng):
    shape = (9, 7, 8, 6)
    X, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "s", coords, values, shape, chunk_nnz=200)  # 5 chunks
    kw = dict(seed=int(rng.integers(1 << 30)), max_sweeps=3, tol=0, scheduler="inline")
    base = tfo.tt_als(store, [3, 4, 2], execution="in-memory", **kw)
    assert base.params["execution"] == "in-memory"
    for execution, parts in (("streaming", None), ("streaming", 3), ("in-memory", 3)):
        r = tfo.tt_als(store, [3, 4, 2], execution=execution, partitions=parts, **kw)
        assert r.params["execution"] == execution and r.params["partitions"] == (parts or 1)
        assert_cores_close(r.cores, base.cores, rtol=1e-12)
        assert abs(r.fit - base.fit) < 1e-12


def test_two_worker_processes_equal_this_process(tmp_path, rng):
    shape = (8, 7, 6, 5)
    X, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "w", coords, values, shape, chunk_nnz=100)  # 6 chunks
    kw = dict(seed=int(rng.integers(1 << 30)), max_sweeps=2, tol=0)
    one = tfo.tt_als(store, 3, scheduler="inline", **kw)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        for execution in ("streaming", "in-memory"):
            r = tfo.tt_als(store, 3, client=c, partitions=4, execution=execution, **kw)
            assert r.params["scheduler"] == "dask" and r.params["partitions"] >= 2
            assert_cores_close(r.cores, one.cores, rtol=1e-12)
            assert abs(r.fit - one.fit) < 1e-12


def test_checkpoint_resume_is_bit_identical(tmp_path, rng):
    shape = (7, 6, 5)
    X, coords, values = sparse_tensor(rng, shape)
    store = store_of(tmp_path, "c", coords, values, shape)
    kw = dict(seed=int(rng.integers(1 << 30)), tol=0)
    whole = tfo.tt_als(store, [3, 2], max_sweeps=4, checkpoint=tmp_path / "a.npz", **kw)
    first = tfo.tt_als(store, [3, 2], max_sweeps=2, checkpoint=tmp_path / "b.npz", **kw)
    assert first.sweeps == 2
    seen = []
    rest = tfo.tt_als(
        store, [3, 2], max_sweeps=4, checkpoint=tmp_path / "b.npz", resume=True, callback=seen.append, **kw
    )
    assert rest.sweeps == 4 and rest.params["resumed_after"] == 2 and [h["sweep"] for h in seen] == [3, 4]
    for a, b in zip(rest.cores, whole.cores):
        assert np.array_equal(a, b)
    assert rest.fit == whole.fit
    assert [h["fit"] for h in rest.history] == [h["fit"] for h in whole.history]
    with pytest.raises(DecompositionError, match="ranks"):
        tfo.tt_als(store, [2, 2], max_sweeps=5, checkpoint=tmp_path / "b.npz", resume=True)


def test_results_save_and_load(tmp_path, rng):
    shape = (6, 5, 4)
    X, coords, values = sparse_tensor(rng, shape)
    store = store_of(tmp_path, "r", coords, values, shape)
    out = tmp_path / "tt.zarr"
    r = tfo.tt_als(store, 2, seed=3, max_sweeps=2, out=out)
    for back in (tfo.TTResult.load(out), tfo.load_result(out)):
        assert isinstance(back, tfo.TTResult)
        assert back.ranks == r.ranks and back.sweeps == r.sweeps and back.fit == r.fit
        assert back.history == r.history and back.params == r.params
        for a, b in zip(back.cores, r.cores):
            assert np.array_equal(a, b)
    r.save_npz(tmp_path / "tt.npz")
    back = tfo.TTResult.load(tmp_path / "tt.npz")
    assert (
        back.fit == r.fit
        and back.history == r.history
        and all(np.array_equal(a, b) for a, b in zip(back.cores, r.cores))
    )
    with pytest.raises(DecompositionError, match="already holds a tensor-train result"):
        tfo.tt_als(store, 2, max_sweeps=1, out=out)
    rec = r.history[0]
    assert {"sweep", "fit", "fit_change", "seconds", "contraction_seconds", "update_seconds"} <= set(rec)
    assert rec["modes"] == [0, 1, 2, 1]  # left to right, then back


# --- bad input ------------------------------------------------------------------------------------


def test_bad_ranks_and_arguments_are_refused_clearly(tmp_path, rng):
    shape = (4, 3, 5)
    X, coords, values = sparse_tensor(rng, shape)
    store = store_of(tmp_path, "b", coords, values, shape)
    for ranks, match in (
        ([2], r"2 inner ranks"),
        ([2, 2, 2], r"2 inner ranks"),
        ([0, 2], r"ranks\[0\] is 0"),
        ([2, -1], r"ranks\[1\] is -1"),
        ([5, 2], r"ranks\[0\] is 5 .*at most 4"),  # > I_0 = 4
        ([2, 6], r"ranks\[1\] is 6 .*at most 5"),  # > I_2 = 5
        ([4, 1], r"ranks\[0\] is 4 .*I_1 \* R_2 = 3 \* 1 = 3"),  # core 1 cannot be right-orthonormal
        ([1, 4], r"ranks\[1\] is 4 .*R_1 \* I_1 = 1 \* 3 = 3"),  # core 1 cannot be left-orthonormal
        ([2.5, 2], r"ranks\[0\] must be an integer"),
        ("x", r"ranks must be an integer or 2 integers"),
    ):
        with pytest.raises(ValueError, match=match):
            tfo.tt_als(store, ranks, max_sweeps=1)
    with pytest.raises(DecompositionError, match="method"):
        tfo.tt_als(store, 2, method="approx")
    with pytest.raises(DecompositionError, match="samples"):
        tfo.tt_als(store, 2, method="randomized", samples=0)
    with pytest.raises(DecompositionError, match="fit_every"):
        tfo.tt_als(store, 2, method="randomized", fit_every=0)
    with pytest.raises(DecompositionError, match="init core 1"):
        tfo.tt_als(store, 2, init=[np.ones((1, 4, 2)), np.ones((2, 3, 3)), np.ones((2, 5, 1))])
    with pytest.raises(DecompositionError, match="max_sweeps"):
        tfo.tt_als(store, 2, max_sweeps=0)
    with pytest.raises(DecompositionError, match="tol"):
        tfo.tt_als(store, 2, tol=float("nan"))


def test_initial_cores_are_right_orthonormal():
    cores = initial_cores("random", (4, 5, 6, 3), (1, 2, 3, 3, 1), seed=7)
    for c in cores[1:]:
        m = c.reshape(c.shape[0], -1)
        np.testing.assert_allclose(m @ m.T, np.eye(c.shape[0]), atol=1e-13)
    again = initial_cores("random", (4, 5, 6, 3), (1, 2, 3, 3, 1), seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(cores, again))


def _householder_qr(a):
    """The positive-diagonal QR by NumPy's Householder QR (the reference)."""
    q, r = np.linalg.qr(a)
    sign = np.where(np.diag(r) < 0, -1.0, 1.0)
    return q * sign, r * sign[:, None]


@pytest.mark.parametrize("cond", [1.0, 1e3, 1e5, 1e9, "rank deficient"])
def test_qr_positive_is_the_householder_qr_or_falls_back_to_it(rng, cond):
    """Tall matrices are factored by Cholesky QR twice while well conditioned: the same Q and R as
    Householder QR to rounding, Q orthonormal, R upper triangular with a positive diagonal; past the
    condition bound (or rank deficient) Householder QR itself runs."""
    from tensorflow_ooc.decompositions.tt.tt_steps import CHOLESKY_QR_MAX_COND, _cholesky_qr2, qr_positive

    m, n = int(rng.integers(200, 2000)), int(rng.integers(2, 12))
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    if cond == "rank deficient":
        sv = np.r_[np.ones(n - 1), 0.0]
    else:
        sv = np.logspace(0, -np.log10(cond), n)
    a = (u * sv) @ v.T * float(rng.uniform(0.1, 10))
    q, r = qr_positive(a)
    assert q.shape == (m, n) and r.shape == (n, n)
    # Cholesky QR where the condition number is below the bound, else Householder
    assert (_cholesky_qr2(a) is None) == (cond == "rank deficient" or float(cond) >= CHOLESKY_QR_MAX_COND)
    np.testing.assert_allclose(q @ r, a, atol=1e-13 * np.abs(a).max())
    assert np.array_equal(r, np.triu(r)) and np.all(np.diag(r) >= 0)
    if cond == "rank deficient":
        return  # Q's last column is any unit vector orthogonal to the rest: Householder's, not compared
    np.testing.assert_allclose(q.T @ q, np.eye(n), atol=1e-13)
    want_q, want_r = _householder_qr(a)
    # a QR's rounding error grows with the condition number (either algorithm's)
    tol = 1e-13 * max(1.0, float(cond))
    np.testing.assert_allclose(q, want_q, atol=tol)
    np.testing.assert_allclose(r, want_r, atol=tol * np.abs(want_r).max())


def test_orthonormal_slices_move_the_orthogonality_as_the_cores_do(rng):
    """The slice-major steps of an update give the cores of the unfolding steps, to rounding."""
    from tensorflow_ooc.decompositions.tt.tt_steps import (
        left_orthonormal_slices,
        left_orthonormalize,
        right_orthonormal_slices,
        right_orthonormalize,
    )

    for Ra, I, Rb, Rc in ((1, 300, 4, 3), (3, 200, 4, 5), (4, 250, 3, 1)):
        core, nxt = rng.standard_normal((Ra, I, Rb)), rng.standard_normal((Rb, 60, Rc))
        want = [core.copy(), nxt.copy()]
        left_orthonormalize(want, 0)
        got = left_orthonormal_slices(np.ascontiguousarray(core.transpose(1, 0, 2)), nxt.transpose(1, 0, 2).copy())
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.transpose(1, 0, 2), w, atol=1e-12)
        prev, core = rng.standard_normal((Rc, 70, Ra)), rng.standard_normal((Ra, I, Rb))
        want = [prev.copy(), core.copy()]
        right_orthonormalize(want, 1)
        got = right_orthonormal_slices(prev.transpose(1, 0, 2).copy(), np.ascontiguousarray(core.transpose(1, 0, 2)))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.transpose(1, 0, 2), w, atol=1e-12)


# --- command line ---------------------------------------------------------------------------------


def test_cli(tmp_path, rng, capsys):
    shape = (7, 6, 5)
    X, coords, values = sparse_tensor(rng, shape)
    store = store_of(tmp_path, "cli", coords, values, shape)
    out = tmp_path / "t.zarr"
    args = ["tt", str(store.path), "--ranks", "3,2", "--sweeps", "3", "--tol", "0", "--seed", "1", "--out", str(out)]
    assert main([*args, "-q"]) == 0
    text = capsys.readouterr().out
    assert "fit" in text and str(out) in text
    r = tfo.TTResult.load(out)
    assert r.ranks == (1, 3, 2, 1) and r.sweeps == 3
    ref = tfo.tt_als(store, [3, 2], seed=1, max_sweeps=3, tol=0)
    assert abs(r.fit - ref.fit) < 1e-12
    assert main([*args, "-q"]) == 2  # the result exists
    assert "holds a tensor-train result written by tensorflow_ooc" in capsys.readouterr().err
    assert main([*args[:-4], "--sweeps", "5", "--out", str(out), "--resume", "-q"]) == 0
    assert tfo.TTResult.load(out).sweeps == 5
    capsys.readouterr()
    # one JSON line per sweep
    assert main([*args[:-2], "--out", str(tmp_path / "j.zarr"), "--log-format", "json"]) == 0
    records = [json.loads(s) for s in capsys.readouterr().err.splitlines() if s.startswith("{")]
    assert [d["iteration"] for d in records if "iteration" in d] == [1, 2, 3]
    for bad in (
        ["--ranks", "3,2,2"],
        ["--ranks", "9,2"],
    ):
        code = main(["tt", str(store.path), *bad, "--out", str(tmp_path / "bad.zarr"), "-q"])
        err = capsys.readouterr().err
        assert code == 2 and "tfooc: error" in err and "Traceback" not in err, err
        assert not (tmp_path / "bad.zarr").exists()
    rnd = ["tt", str(store.path), "--ranks", "3,2", "--method", "randomized", "--samples", "300", "--sweeps", "2"]
    assert main([*rnd, "--fit-every", "2", "--warmup", "0", "--out", str(tmp_path / "r.zarr"), "-q"]) == 0
    r = tfo.TTResult.load(tmp_path / "r.zarr")
    assert r.params["method"] == "randomized" and r.params["samples"] == 300 and r.params["fit_every"] == 2
    assert r.params["warmup"] == 0 and [h["fit_evaluated"] for h in r.history] == [False, True]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["tt", str(store.path), "--ranks", "a,b"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["tt", "--help"])
    assert e.value.code == 0
    helptext = capsys.readouterr().out
    for opt in ("--ranks", "--method", "--samples", "--sweeps", "--tol", "--seed", "--out", "--resume", "--execution"):
        assert opt in helptext


# --- randomized TT-ALS (rTT-ALS) ------------------------------------------------------------------


def planted_tt(rng, shape, ranks, noise):
    """A random tensor train of ``ranks`` plus ``noise`` times Gaussian noise of the same norm, every
    cell stored."""
    full = [1, *ranks, 1]
    cores = [rng.standard_normal((full[k], shape[k], full[k + 1])) for k in range(len(shape))]
    T = to_dense(cores)
    E = rng.standard_normal(shape)
    X = T + noise * np.linalg.norm(T) / np.linalg.norm(E) * E
    coords = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).reshape(-1, len(shape))
    return X, coords, X[tuple(coords.T)]


@pytest.mark.parametrize("order", [3, 4, 5])
def test_randomized_fits_like_exact_on_planted_trains(tmp_path, rng, order):
    shape = {3: (14, 12, 13), 4: (9, 8, 10, 7), 5: (6, 5, 6, 5, 6)}[order]
    ranks = [3] * (order - 1)
    X, coords, values = planted_tt(rng, shape, ranks, noise=0.1)
    store = store_of(tmp_path, "p", coords, values, shape)
    kw = dict(seed=int(rng.integers(1 << 30)), max_sweeps=6, tol=0)
    exact = tfo.tt_als(store, ranks, **kw)
    rnd = tfo.tt_als(store, ranks, method="randomized", samples=2000, **kw)
    assert exact.fit > 0.85  # the planted train explains all but the noise
    assert rnd.fit >= 0.97 * exact.fit, (rnd.fit, exact.fit)
    # the fit reported is the model's against the tensor, whatever the method
    dense_fit = 1 - np.linalg.norm(X - to_dense(rnd.cores)) / np.linalg.norm(X)
    assert abs(rnd.fit - dense_fit) < 1e-9
    # the chains are kept orthonormal as in the exact method
    for c in rnd.cores[1:]:
        m = c.reshape(c.shape[0], -1)
        np.testing.assert_allclose(m @ m.T, np.eye(c.shape[0]), atol=1e-10)


@pytest.mark.parametrize("order", [3, 4, 5])
def test_randomized_warmup_sweeps_are_exact_sweeps(tmp_path, rng, order):
    """A randomized run's first ``warmup`` sweeps are the exact method's (same cores, same fits),
    evaluated and marked; the sketched ones follow."""
    shape = {3: (9, 8, 7), 4: (9, 8, 7, 6), 5: (6, 5, 6, 5, 4)}[order]
    _, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "w", coords, values, shape)
    kw = dict(seed=int(rng.integers(1 << 30)), tol=0)
    exact = tfo.tt_als(store, 2, max_sweeps=2, **kw)
    only = tfo.tt_als(store, 2, method="randomized", samples=300, warmup=2, max_sweeps=2, **kw)
    assert_cores_close(only.cores, exact.cores, rtol=1e-12)
    r = tfo.tt_als(store, 2, method="randomized", samples=300, warmup=2, max_sweeps=4, fit_every=4, **kw)
    assert r.params["warmup"] == 2
    assert [h.get("warmup", False) for h in r.history] == [True, True, False, False]
    assert [h["fit_evaluated"] for h in r.history] == [True, True, False, True]
    np.testing.assert_allclose([h["fit"] for h in r.history[:2]], [h["fit"] for h in exact.history], rtol=1e-12)
    with pytest.raises(ValueError, match="warmup"):
        tfo.tt_als(store, 2, method="randomized", warmup=-1)


def test_randomized_fit_on_a_sparse_store_is_the_models(tmp_path, rng):
    # on a sparse store ||X - T||^2 is the error at the nonzeros plus the model's mass off them
    shape = (9, 8, 7, 6)
    X, coords, values = sparse_tensor(rng, shape, 0.2)
    store = store_of(tmp_path, "s", coords, values, shape)
    r = tfo.tt_als(store, [3, 3, 2], method="randomized", samples=500, seed=int(rng.integers(1 << 30)), max_sweeps=3)
    dense_fit = 1 - np.linalg.norm(X - to_dense(r.cores)) / np.linalg.norm(X)
    assert abs(r.fit - dense_fit) < 1e-9


def test_randomized_fit_cadence_defaults_as_randomized_cp_als(tmp_path, rng, monkeypatch):
    """By default the fit is evaluated every sweep up to 2^24 nonzeros, else every 5th and at the
    last (the bound lowered below this store's nonzeros for the second run)."""
    # the module (the package's ``tt_als`` attribute is the function)
    tt_module = importlib.import_module("tensorflow_ooc.decompositions.tt.tt_als")
    shape = (9, 8, 7)
    _, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "s", coords, values, shape)
    kw = dict(method="randomized", samples=200, seed=int(rng.integers(1 << 30)), max_sweeps=6, tol=0, warmup=0)
    r = tfo.tt_als(store, 2, **kw)
    assert r.params["fit_every"] == 1 and all(h["fit_evaluated"] for h in r.history)
    monkeypatch.setattr(tt_module, "FIT_EVERY_ITERATION_NNZ", store.nnz - 1)
    r = tfo.tt_als(store, 2, **kw)
    assert r.params["fit_every"] == 5
    assert [h["fit_evaluated"] for h in r.history] == [False, False, False, False, True, True]


def test_randomized_streamed_workers_and_resume_draw_what_one_run_drew(tmp_path, rng):
    shape = (9, 7, 8, 6)
    X, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "r", coords, values, shape, chunk_nnz=200)  # 5 chunks
    kw = dict(method="randomized", samples=400, seed=int(rng.integers(1 << 30)), tol=0)
    base = tfo.tt_als(store, [3, 4, 2], max_sweeps=3, scheduler="inline", execution="in-memory", **kw)
    assert base.params["sample_entropy"] is not None
    for execution, parts in (("streaming", None), ("streaming", 3), ("in-memory", 3)):
        r = tfo.tt_als(store, [3, 4, 2], max_sweeps=3, scheduler="inline", execution=execution, partitions=parts, **kw)
        assert_cores_close(r.cores, base.cores, rtol=1e-9)
        assert abs(r.fit - base.fit) < 1e-10
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        r = tfo.tt_als(store, [3, 4, 2], max_sweeps=3, client=c, partitions=4, execution="in-memory", **kw)
        assert r.params["scheduler"] == "dask"
        assert_cores_close(r.cores, base.cores, rtol=1e-9)
    # interrupted after sweep 1 and resumed: the draws of sweeps 2 and 3 are those of the whole run
    ck = tmp_path / "r.npz"
    tfo.tt_als(store, [3, 4, 2], max_sweeps=1, checkpoint=ck, scheduler="inline", execution="in-memory", **kw)
    rest = tfo.tt_als(
        store, [3, 4, 2], max_sweeps=3, checkpoint=ck, resume=True, scheduler="inline", execution="in-memory", **kw
    )
    for a, b in zip(rest.cores, base.cores):
        assert np.array_equal(a, b)
    assert rest.fit == base.fit


# --- stopping: the relative change of the fit; sweeps whose fit is not evaluated ---------------------


def test_stops_by_the_relative_change_of_the_fit(tmp_path, rng):
    """Uniform sparse counts: from most random starts a rank-2 train explains a few millionths after
    2 sweeps and 15-40 times more a few sweeps later. cp_als's absolute rule (|fit - fit_old| < 1e-5) stops where the
    fit is still rising by tens of percent per sweep; TT-ALS stops at the first sweep whose fit changed
    by less than tol times the fit before it."""
    shape = (1000, 1000, 1000)
    coords = np.unique(np.stack([rng.integers(0, I, 100_000) for I in shape], axis=1), axis=0)
    values = (1 + rng.geometric(0.3, len(coords))).astype(np.float64)
    store = store_of(tmp_path, "counts", coords, values, shape)
    # about half the random starts gain over 1e-5 in sweep 2 (the absolute rule then stops later,
    # where little is left): draw starts until one shows the case this test is about
    for _ in range(12):
        seed = int(rng.integers(1 << 30))
        free = tfo.tt_als(store, 2, seed=seed, max_sweeps=10, tol=0)
        fits = [h["fit"] for h in free.history]
        if abs(fits[1] - fits[0]) < 1e-5:
            break
    assert free.history[0]["fit_change_relative"] is None  # no fit before the first sweep
    for k in range(1, len(fits)):
        h = free.history[k]
        assert h["fit_change"] == pytest.approx(abs(fits[k] - fits[k - 1]), rel=1e-12)
        assert h["fit_change_relative"] == pytest.approx(abs(fits[k] - fits[k - 1]) / abs(fits[k - 1]), rel=1e-12)
    absolute_stop = next(k + 1 for k in range(1, len(fits)) if abs(fits[k] - fits[k - 1]) < 1e-5)
    assert absolute_stop == 2, fits
    relative = [free.history[k]["fit_change_relative"] for k in range(len(fits))]
    relative_stop = next((k + 1 for k in range(1, len(fits)) if relative[k] < 1e-5), len(fits))
    r = tfo.tt_als(store, 2, seed=seed, max_sweeps=10)  # tol's default, 1e-5
    assert r.params["tol"] == 1e-5 and r.sweeps == relative_stop
    assert [h["fit"] for h in r.history] == fits[: r.sweeps]
    assert fits[absolute_stop - 1] < 1e-3 and relative[absolute_stop - 1] >= 1e-5
    assert r.sweeps > absolute_stop and r.fit > fits[absolute_stop - 1] * (1 + 1e-3), (fits, absolute_stop)


def test_unevaluated_sweeps_are_logged_and_recorded_as_such(tmp_path, rng, caplog):
    shape = (9, 8, 7)
    _, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "s", coords, values, shape)
    kw = dict(
        method="randomized", samples=200, fit_every=3, seed=int(rng.integers(1 << 30)), max_sweeps=4, tol=0, warmup=0
    )
    with caplog.at_level("INFO", logger="tensorflow_ooc"):
        r = tfo.tt_als(store, 2, **kw)
    lines = [m for m in caplog.messages if m.startswith("sweep ")]
    assert [m.split(":")[0] for m in lines] == ["sweep 1", "sweep 2", "sweep 3", "sweep 4"]
    assert "fit not evaluated" in lines[0] and "fit not evaluated" in lines[1]
    assert "not evaluated" not in lines[2] and "relative" in lines[3]
    assert not any("fit 0.000000" in m or "fit 0 " in m for m in lines)
    assert [h["fit_evaluated"] for h in r.history] == [False, False, True, True]
    for h in r.history[:2]:
        assert not {"fit", "fit_change", "fit_change_relative"} & set(h)
    # the first evaluated sweep has no fit before it; the next is compared with it
    assert r.history[2]["fit_change_relative"] is None
    f3, f4 = r.history[2]["fit"], r.history[3]["fit"]
    assert r.history[3]["fit_change_relative"] == pytest.approx(abs(f4 - f3) / abs(f3), rel=1e-12)
    assert r.fit == f4


def test_randomized_stopping_rule_is_relative():
    from tensorflow_ooc.decompositions.tt.tt_als import stalled

    tiny = [1e-6, 2e-6, 3.0e-6, 3.1e-6, 3.2e-6, 3.3e-6]  # absolute gains of 3e-7, relative 10 %
    assert not stalled(tiny, 1e-5) and stalled(tiny, 0.2)
    big = [0.5, 0.6, 0.7, 0.7000001, 0.7000002, 0.7000003]
    assert stalled(big, 1e-5) and not stalled(big, 1e-7)
    assert not stalled(big[:3], 1.0) and not stalled(big, 0)


def test_randomized_one_task_updates_equal_the_partition_tasks(tmp_path, rng, monkeypatch):
    """On one worker holding every decoded partition a sweep's sketched updates are one task (draws,
    the partitions gathered at once on threads, solve, in turn): the cores are those of the
    partition tasks, bit for bit, inline and on an embedded one-worker cluster, for sweeps wholly
    sketched (fit_every 2: the first) and sweeps that end with an exact update."""
    from tensorflow_ooc.execution.graph import MTTKRPGraph

    shape = (9, 7, 8, 6)
    _, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "r", coords, values, shape, chunk_nnz=200)  # 5 chunks
    kw = dict(method="randomized", samples=400, seed=int(rng.integers(1 << 30)), tol=0, max_sweeps=3, warmup=0)
    kw.update(execution="in-memory", partitions=3, fit_every=2)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        runs = {"inline": dict(scheduler="inline"), "cluster": dict(client=c)}
        fused = {k: tfo.tt_als(store, [3, 4, 2], **kw, **v) for k, v in runs.items()}
        monkeypatch.setattr(MTTKRPGraph, "local_partitions", lambda self: None)
        tasks = {k: tfo.tt_als(store, [3, 4, 2], **kw, **v) for k, v in runs.items()}
    for k in runs:
        assert fused[k].params["sketched_update"] == "one task" and fused[k].params["partitions"] == 3
        assert tasks[k].params["sketched_update"] == "partition tasks"
        for a, b in zip(fused[k].cores, tasks[k].cores):
            assert np.array_equal(a, b), k
        assert fused[k].fit == tasks[k].fit
        assert all(len(h["draw_seconds"]) == 2 * (len(shape) - 1) for h in fused[k].history)
        assert [h["fit_evaluated"] for h in fused[k].history] == [False, True, True]
    assert_cores_close(fused["cluster"].cores, fused["inline"].cores, rtol=1e-12)


def test_randomized_sweeps_run_ahead_where_they_cannot_end_the_run(tmp_path, rng, monkeypatch):
    """On a cluster a randomized sweep whose fit is not evaluated cannot end the run, so the next
    one is submitted before its summary is read: not after a sweep that writes a checkpoint (the
    checkpoint holds that sweep's cores) nor after the last. The cores, the fit and the checkpoint
    are those of the inline run, and the sweeps run ahead are timed on the worker, their updates
    inside their seconds."""
    from tensorflow_ooc.decompositions.tt import tt_als as tt_module
    from tensorflow_ooc.decompositions.tt.tt_checkpoint import read_tt_checkpoint

    shape = (9, 7, 8, 6)
    _, coords, values = sparse_tensor(rng, shape, 0.3)
    store = store_of(tmp_path, "r", coords, values, shape, chunk_nnz=200)  # 5 chunks
    kw = dict(method="randomized", samples=400, seed=int(rng.integers(1 << 30)), tol=0, max_sweeps=5, fit_every=5)
    kw.update(execution="in-memory", partitions=2, checkpoint_every=2, warmup=0)
    inline = tfo.tt_als(store, [3, 4, 2], scheduler="inline", checkpoint=tmp_path / "inline.npz", **kw)
    ahead = []
    submit_ahead = tt_module.TTSweeps._submit_ahead

    def spy(self, F, sweep, evaluate):
        got = submit_ahead(self, F, sweep, evaluate)
        ahead.append(None if got is None else got[0])
        return got

    monkeypatch.setattr(tt_module.TTSweeps, "_submit_ahead", spy)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        r = tfo.tt_als(store, [3, 4, 2], client=c, checkpoint=tmp_path / "cluster.npz", **kw)
    # sweeps 2 and 4 (0-based 1, 3) write checkpoints, sweep 5 is the last: sweeps 2 and 4 run ahead
    assert ahead == [1, None, 3, None, None]
    assert r.params["sketched_update"] == "one task"
    assert_cores_close(r.cores, inline.cores, rtol=1e-12)
    assert abs(r.fit - inline.fit) < 1e-12
    ck, ck_inline = read_tt_checkpoint(tmp_path / "cluster.npz"), read_tt_checkpoint(tmp_path / "inline.npz")
    assert ck.sweep == ck_inline.sweep == 4
    assert_cores_close(ck.state.cores(), ck_inline.state.cores(), rtol=1e-12)
    for h in r.history:
        inside = sum(h["contraction_seconds"]) + sum(h["update_seconds"]) + sum(h["draw_seconds"])
        assert 0 < inside <= h["seconds"]
