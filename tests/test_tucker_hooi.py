"""Tucker HOOI: pyttb agreement, subspaces, streaming and Dask partitions, checkpoints, exports, bad input."""

import re
import runpy
from pathlib import Path

import numpy as np
import pytest
from conftest import random_coo
from distributed import Client, LocalCluster
from scipy.linalg import subspace_angles

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.decompositions.tucker import tucker_updates as T
from tensorflow_ooc.errors import DecompositionError, TfoocError

SHAPES = {3: (14, 11, 9), 4: (10, 8, 7, 6), 5: (7, 6, 5, 5, 4)}


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        yield c


def sptensor(coords, values, shape):
    import pyttb

    return pyttb.sptensor(coords, values.reshape(-1, 1), shape)


def dense(coords, values, shape):
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    return X


def random_ranks(rng, shape):
    return [int(rng.integers(2, min(4, s) + 1)) for s in shape]


def max_angle(A, B):
    return float(np.max(subspace_angles(A, B)))


@pytest.mark.parametrize("order", [3, 4, 5])
def test_matches_pyttb_tucker_als_from_identical_init(tmp_path, rng, order):
    import pyttb

    shape = SHAPES[order]
    coords, values = random_coo(rng, shape, 60 * sum(shape))
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    ranks = random_ranks(rng, shape)
    init = [None] + [rng.random((s, j)) for s, j in zip(shape[1:], ranks[1:])]
    X = sptensor(coords, values, shape)
    ref, _, out = pyttb.tucker_als(
        X, ranks, stoptol=0, maxiters=3, init=[None if a is None else a.copy() for a in init], printitn=0
    )
    ours = tfo.tucker_hooi(store, ranks, init=init, max_iters=3, tol=0)
    assert ours.iterations == 3 and len(ours.history) == 3
    assert abs(ours.fit - out["fit"]) < 1e-8
    for n in range(order):
        assert ours.factors[n].shape == (shape[n], ranks[n])
        assert np.allclose(ours.factors[n].T @ ours.factors[n], np.eye(ranks[n]), atol=1e-12)
        assert max_angle(ours.factors[n], ref.factor_matrices[n]) < 1e-6
    Xd = dense(coords, values, shape)
    # the same model, and the fit is 1 - ||X - model|| / ||X|| of that model (dense NumPy)
    assert np.abs(ours.full() - ref.full().double()).max() < 1e-8 * np.abs(Xd).max()
    assert abs(ours.fit - (1 - np.linalg.norm(Xd - ours.full()) / np.linalg.norm(Xd))) < 1e-10
    h = ours.history[-1]
    for key in ("ttm_seconds", "svd_seconds", "layout_seconds", "mode_seconds", "svd_methods"):
        assert len(h[key]) == order
    assert h["svd_methods"] == ["gram"] * order

    # pyttb's stopping rule (fit change below tol, the first iteration included)
    ref, _, out = pyttb.tucker_als(
        X, ranks, stoptol=1e-3, maxiters=40, init=[None if a is None else a.copy() for a in init], printitn=0
    )
    ours = tfo.tucker_hooi(store, ranks, init=init, max_iters=40, tol=1e-3)
    assert ours.iterations == out["iters"] + 1
    assert abs(ours.fit - out["fit"]) < 1e-8


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")  # pyttb's nvecs returns complex vectors
def test_random_and_nvecs_init_as_pyttb(tmp_path, rng, monkeypatch):
    import pyttb

    shape = SHAPES[4]
    coords, values = random_coo(rng, shape, 800)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    ranks = random_ranks(rng, shape)
    X = sptensor(coords, values, shape)
    # random: uniform [0, 1) for every mode but the first, drawn from the seed
    state = T.random_init(shape, ranks, 7)
    assert state.factors[0] is None
    again = T.random_init(shape, ranks, 7)
    for n in range(1, 4):
        assert state.factors[n].shape == (shape[n], ranks[n])
        assert 0 <= state.factors[n].min() and state.factors[n].max() < 1
        assert np.array_equal(state.factors[n], again.factors[n])
    a = tfo.tucker_hooi(store, ranks, seed=7, max_iters=2, tol=0)
    b = tfo.tucker_hooi(store, ranks, init=state.factors, max_iters=2, tol=0)
    assert a.fit == b.fit
    # nvecs: the leading eigenvectors of X_(n) X_(n)^T with pyttb's signs; dense and ARPACK paths
    for gram_max in (T.GRAM_MAX, 3):
        monkeypatch.setattr(T, "GRAM_MAX", gram_max)
        for n in range(1, 4):
            r = min(ranks[n], shape[n] - 2)
            ours = T.nvecs(coords, values, shape, n, r)
            ref = np.real(X.nvecs(n, r))
            assert max_angle(ours, ref) < 1e-6
            gram = np.reshape(np.moveaxis(dense(coords, values, shape), n, 0), (shape[n], -1))
            gram = gram @ gram.T
            w = np.linalg.eigvalsh(gram)[::-1][:r]
            assert np.allclose(np.einsum("ir,ij,jr->r", ours, gram, ours), w, rtol=1e-9)
            assert (ours[np.argmax(np.abs(ours), axis=0), np.arange(r)] > 0).all()
    monkeypatch.undo()
    ranks = [min(j, s - 2) for j, s in zip(ranks, shape)]
    ref, _, out = pyttb.tucker_als(X, ranks, stoptol=0, maxiters=2, init="nvecs", printitn=0)
    ours = tfo.tucker_hooi(store, ranks, init="nvecs", max_iters=2, tol=0)
    assert abs(ours.fit - out["fit"]) < 1e-8


def test_leading_vectors_every_method(rng):
    # a planted spectrum with a gap after the 5th singular value; F > P and F < P
    for F, P in ((300, 120), (80, 260)):
        L, _ = np.linalg.qr(rng.standard_normal((F, 40)))
        R, _ = np.linalg.qr(rng.standard_normal((P, 40)))
        s = np.concatenate([[50, 40, 30, 20, 10], 0.05 * rng.random(35)])
        B = (L * s) @ R.T
        for method in ("gram", "randomized"):
            U, used = T.leading_left_vectors(B, 5, method, seed=(1, 2, 3))
            assert used == method
            assert np.allclose(U.T @ U, np.eye(5), atol=1e-12)
            assert max_angle(U, L[:, :5]) < 1e-6
        assert T.choose_method(F, P) == "gram"
    assert T.choose_method(T.GRAM_MAX + 1, T.GRAM_MAX + 1) == "randomized"
    assert T.choose_method(10**6, T.GRAM_MAX) == "gram"


def test_randomized_svd_run_matches_gram(tmp_path, rng):
    shape = (40, 30, 20)
    coords, values = random_coo(rng, shape, 3000)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    init = [None] + [rng.random((s, 3)) for s in shape[1:]]
    a = tfo.tucker_hooi(store, 3, init=init, max_iters=4, tol=0, svd="gram")
    b = tfo.tucker_hooi(store, 3, init=init, max_iters=4, tol=0, svd="randomized", seed=5)
    assert b.history[-1]["svd_methods"] == ["randomized"] * 3
    assert abs(a.fit - b.fit) < 1e-6
    for fa, fb in zip(a.factors, b.factors):
        assert max_angle(fa, fb) < 1e-4


def test_empty_slices_and_rank_above_rank_of_unfolding(tmp_path, rng):
    shape = (12, 9, 8)
    coords, values = random_coo(rng, (5, 9, 8), 150)  # slices 5..11 of mode 0 are empty
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    r = tfo.tucker_hooi(store, (3, 3, 3), seed=1, max_iters=3, tol=0)
    assert np.abs(r.factors[0][5:]).max() == 0  # rows of empty slices are zero
    assert r.history[-1]["nonempty_slices"][0] == 5
    # ranks above the rank of Y_(n): mode 0 asks for 7 > 5 non-empty slices, mode 2 for 5 > 2 x 2
    # columns of Y_(2): orthonormal completions, and the fit is still that of the model
    Xd = dense(coords, values, shape)
    for ranks in ((7, 2, 5), (2, 2, 5)):
        r = tfo.tucker_hooi(store, ranks, seed=1, max_iters=3, tol=0)
        for U in r.factors:
            assert np.allclose(U.T @ U, np.eye(U.shape[1]), atol=1e-12)
        assert abs(r.fit - (1 - np.linalg.norm(Xd - r.full()) / np.linalg.norm(Xd))) < 1e-10


@pytest.mark.parametrize("order", [3, 4])
def test_streamed_and_partitioned_equal_in_memory(tmp_path, rng, client, order):
    shape = SHAPES[order]
    coords, values = random_coo(rng, shape, 1500)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape, chunk_nnz=200)
    ranks = random_ranks(rng, shape)
    base = tfo.tucker_hooi(store, ranks, seed=3, max_iters=3, tol=0)
    assert base.params["scheduler"] == "inline" and base.params["execution"] == "in-memory"
    runs = [
        tfo.tucker_hooi(
            store, ranks, seed=3, max_iters=3, tol=0, execution="streaming", partitions=3, scheduler="inline"
        ),
        tfo.tucker_hooi(store, ranks, seed=3, max_iters=3, tol=0, client=client, partitions=5),
        tfo.tucker_hooi(store, ranks, seed=3, max_iters=3, tol=0, client=client, partitions=7, execution="streaming"),
    ]
    assert runs[1].params["scheduler"] == "dask" and runs[1].params["partitions"] == 5
    assert runs[2].params["execution"] == "streaming"
    assert runs[2].history[-1]["bytes_read"] > 0 and runs[1].history[-1]["bytes_read"] == 0
    for r in runs:
        assert abs(r.fit - base.fit) < 1e-12
        for a, b in zip(r.factors, base.factors):
            assert np.abs(a - b).max() < 1e-10
        assert np.abs(r.core - base.core).max() < 1e-10 * np.abs(base.core).max()


def test_checkpoint_resume_gives_the_same_result(tmp_path, rng, client):
    shape = SHAPES[3]
    coords, values = random_coo(rng, shape, 900)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape, chunk_nnz=300)
    ck = tmp_path / "ck.npz"
    full = tfo.tucker_hooi(store, (3, 2, 4), seed=2, max_iters=6, tol=0)
    part = tfo.tucker_hooi(store, (3, 2, 4), seed=2, max_iters=3, tol=0, checkpoint=ck)
    assert ck.exists() and part.iterations == 3
    resumed = tfo.tucker_hooi(
        store, (3, 2, 4), seed=2, max_iters=6, tol=0, checkpoint=ck, resume=True, client=client, partitions=2
    )
    assert resumed.params["resumed_after"] == 3 and resumed.iterations == 6
    assert [h["iteration"] for h in resumed.history] == list(range(1, 7))
    assert abs(resumed.fit - full.fit) < 1e-12
    for a, b in zip(resumed.factors, full.factors):
        assert np.abs(a - b).max() < 1e-10
    # resuming a finished run returns its result without iterating
    done = tfo.tucker_hooi(store, (3, 2, 4), seed=2, max_iters=6, tol=0, checkpoint=ck, resume=True)
    assert done.iterations == 6 and abs(done.fit - full.fit) < 1e-12
    assert np.abs(done.core - resumed.core).max() < 1e-12
    with pytest.raises(DecompositionError, match="other ranks"):
        tfo.tucker_hooi(store, (2, 2, 2), checkpoint=ck, resume=True)


def test_exports_round_trip(tmp_path, rng):
    import tensorly as tl

    shape = SHAPES[4]
    coords, values = random_coo(rng, shape, 700)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    r = tfo.tucker_hooi(store, (3, 2, 3, 2), seed=0, max_iters=3, tol=0, out=tmp_path / "r.zarr")
    model = r.full()
    assert np.abs(r.to_pyttb().full().double() - model).max() < 1e-12
    tt = r.to_tensorly()
    assert np.abs(tl.tucker_to_tensor(tt) - model).max() < 1e-12
    core, factors = tt
    assert core.shape == (3, 2, 3, 2) and len(factors) == 4
    for loaded in (tfo.load_tucker(tmp_path / "r.zarr"), tfo.load_result(tmp_path / "r.zarr")):
        assert isinstance(loaded, tfo.TuckerResult)
        assert loaded.fit == r.fit and loaded.iterations == 3 and loaded.params["ranks"] == [3, 2, 3, 2]
        assert np.array_equal(loaded.core, r.core) and loaded.history == r.history
        assert all(np.array_equal(a, b) for a, b in zip(loaded.factors, r.factors))
    r.save_npz(tmp_path / "r.npz")
    z = np.load(tmp_path / "r.npz")
    assert np.array_equal(z["core"], r.core) and np.array_equal(z["factor3"], r.factors[3])
    with pytest.raises(TfoocError, match="exists"):
        r.save(tmp_path / "r.zarr")
    with pytest.raises(TfoocError, match="not a tensorflow_ooc Tucker result"):
        tfo.load_tucker(store.path)


def test_bad_input_is_refused_and_nothing_written(tmp_path, rng):
    shape = (6, 5, 4)
    coords, values = random_coo(rng, shape, 60)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    out, ck = tmp_path / "r.zarr", tmp_path / "ck.npz"
    bad = [
        ({"ranks": (2, 2)}, "order 3"),
        ({"ranks": (2, 2, 2, 2)}, "order 3"),
        ({"ranks": (2, 0, 2)}, "mode 1"),
        ({"ranks": (2, 6, 2)}, r"mode 1 is 6; it must lie in 1\.\.5"),
        ({"ranks": (2, 2.5, 2)}, "mode 1"),
        ({"ranks": "abc"}, "mode 0 must be an integer"),
        ({"ranks": None}, "one integer per mode"),
        ({"ranks": 2, "init": "hosvd"}, "init must be one of"),
        ({"ranks": 2, "init": [None, np.ones((5, 3)), np.ones((4, 2))]}, r"mode 1 has shape \(5, 3\)"),
        ({"ranks": 2, "init": [None, np.full((5, 2), np.nan), np.ones((4, 2))]}, "mode 1 holds NaN"),
        ({"ranks": 2, "init": [np.ones((6, 2))] * 2}, "init holds 2 matrices"),
        ({"ranks": 2, "svd": "qr"}, "svd must be"),
        ({"ranks": 2, "max_iters": 0}, "max_iters"),
        ({"ranks": 2, "tol": float("nan")}, "tol"),
        ({"ranks": 2, "execution": "disk"}, "execution"),
        ({"ranks": 2, "kernel": "dense"}, "kernel must be"),
        ({"ranks": 2, "device": "tpu"}, "device must be"),
        ({"ranks": 2, "seed": 1.5}, "seed must be"),
    ]
    for kwargs, match in bad:
        with pytest.raises(DecompositionError, match=match):
            tfo.tucker_hooi(store, out=out, checkpoint=ck, **kwargs)
        assert not out.exists() and not ck.exists()
    tfo.tucker_hooi(store, 2, max_iters=1, out=out)
    with pytest.raises(DecompositionError, match="already holds a Tucker result"):
        tfo.tucker_hooi(store, 2, max_iters=1, out=out)


def _exit_status(argv: list[str]) -> int:
    """The CLI's exit status, whether ``main`` returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_cli(tmp_path, rng, capsys):
    shape = (9, 8, 7)
    coords, values = random_coo(rng, shape, 200)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape)
    out = tmp_path / "t.zarr"
    assert (
        main(
            [
                "tucker",
                str(store.path),
                "--ranks",
                "3,2,3",
                "--iters",
                "4",
                "--tol",
                "0",
                "--seed",
                "1",
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "fit" in text and str(out) in text
    r = tfo.load_tucker(out)
    assert r.ranks == (3, 2, 3) and r.iterations == 4
    ref = tfo.tucker_hooi(store, (3, 2, 3), seed=1, max_iters=4, tol=0)
    assert abs(r.fit - ref.fit) < 1e-12
    assert main(["tucker", str(store.path), "--ranks", "3,2,3", "--out", str(out), "-q"]) == 2  # exists
    assert (
        main(
            [
                "tucker",
                str(store.path),
                "--ranks",
                "3,2,3",
                "--iters",
                "6",
                "--tol",
                "0",
                "--seed",
                "1",
                "--out",
                str(out),
                "--resume",
                "-q",
            ]
        )
        == 0
    )
    assert tfo.load_tucker(out).iterations == 6
    for ranks in ("3,2", "3,9,3", "0"):
        # refused when the ranks are checked against the store, or ("0") when the flag is parsed
        assert (
            _exit_status(["tucker", str(store.path), "--ranks", ranks, "--out", str(tmp_path / "bad.zarr"), "-q"]) == 2
        )
        assert "rank" in capsys.readouterr().err
        assert not (tmp_path / "bad.zarr").exists()
    with pytest.raises(SystemExit) as e:
        main(["tucker", str(store.path), "--ranks", "a,b"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["tucker", "--help"])
    assert e.value.code == 0
    helptext = capsys.readouterr().out
    for opt in (
        "--ranks",
        "--iters",
        "--tol",
        "--init",
        "--seed",
        "--svd",
        "--kernel",
        "--execution",
        "--out",
        "--checkpoint",
        "--resume",
        "--overwrite",
        "--scheduler",
        "--partitions",
        "--device",
    ):
        assert opt in helptext


def test_readme_tucker_example_runs(tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("### Tucker decomposition") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "tucker_hooi" in block
    script = tmp_path / "tucker_example.py"
    script.write_text(block)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script))


def test_gpu_workers_equal_cpu(tmp_path, rng, client):
    # on the cluster's GPU workers (the CUDA simulator here: tiny input), the fiber and coo kernels;
    # one partition, as the simulator's kernels are not safe to run from two threads at once
    shape = (6, 5, 4)
    coords, values = random_coo(rng, shape, 40)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", shape=shape, chunk_nnz=16)  # 3 chunks
    base = tfo.tucker_hooi(store, 2, seed=4, max_iters=2, tol=0)
    for kernel in ("fiber", "coo"):
        r = tfo.tucker_hooi(
            store,
            2,
            seed=4,
            max_iters=2,
            tol=0,
            client=client,
            device="gpu",
            kernel=kernel,
            partitions=1,
            execution="streaming",
        )
        assert r.params["device"] == "gpu" and r.params["partitions"] == 1
        assert abs(r.fit - base.fit) < 1e-12
        for a, b in zip(r.factors, base.factors):
            assert np.abs(a - b).max() < 1e-10
