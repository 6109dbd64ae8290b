"""CP-ALS on dense tensors: pyttb agreement, planted recovery, NumPy/Dask/Zarr inputs, checkpoints,
out-of-core streaming under a worker memory limit, bad inputs, and the CLI."""

import json
import math
import os
import tracemalloc

import dask.array as da
import numpy as np
import pytest
import zarr
from conftest import fixed
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.cli import main
from tensorflow_ooc.execution.memory_plan import choose, dense_candidates


def to_zarr(path, X, chunks):
    z = zarr.create_array(str(path), shape=X.shape, chunks=chunks, dtype=X.dtype, zarr_format=3)
    z[...] = X
    return str(path)


def assert_same_as_pyttb(ours, X, init, R, iters=10):
    import pyttb

    ref, _, out = pyttb.cp_als(
        pyttb.tensor(X.copy()), R, maxiters=iters, stoptol=0, init=pyttb.ktensor([a.copy() for a in init]), printitn=0
    )
    assert ours.iterations == iters
    assert abs(ours.fit - out["fit"]) < 1e-8
    a, b = fixed(ours.to_pyttb()), fixed(ref)
    assert np.allclose(a.weights, b.weights, rtol=1e-8, atol=1e-8)
    for fa, fb in zip(a.factor_matrices, b.factor_matrices):
        assert np.abs(fa - fb).max() < 1e-8


@pytest.mark.parametrize("shape", [(13, 17, 11), (9, 8, 7, 6), (5, 6, 4, 3, 5), (4, 3, 5, 2, 3, 4)])
def test_in_memory_matches_pyttb(rng, shape):
    R = 4
    X = rng.standard_normal(shape)
    init = [rng.random((s, R)) for s in shape]
    ours = tfo.cp_als(X, R, init=init, max_iters=10, tol=0)
    assert ours.params["execution"] == "in-memory" and ours.params["input_kind"] == "dense numpy array"
    assert_same_as_pyttb(ours, X, init, R)


@pytest.mark.parametrize("shape,chunks", [((13, 17, 11), (5, 6, 4)), ((9, 8, 7, 6), (4, 8, 3, 5))])
def test_streamed_zarr_matches_pyttb(tmp_path, rng, client, shape, chunks):
    """Streamed from a chunked Zarr array on a LocalCluster, three partitions tree-reduced."""
    R = 5
    X = rng.random(shape)
    path = to_zarr(tmp_path / "x.zarr", X, chunks)
    init = [rng.random((s, R)) for s in shape]
    ours = tfo.cp_als(path, R, client=client, init=init, max_iters=10, tol=0, execution="streaming", partitions=3)
    assert ours.params["execution"] == "streaming" and ours.params["scheduler"] == "dask"
    assert ours.input["path"] == path and ours.input["nnz"] == X.size
    assert math.isclose(ours.input["norm_sq"], float((X * X).sum()), rel_tol=1e-12)
    assert_same_as_pyttb(ours, X, init, R)


def test_gpu_workers_take_dense_partitions(tmp_path, rng, client):
    """device="gpu": the partition tasks run dense_mttkrp_gpu (the CUDA simulator here; tiny input)
    and give the CPU run's model."""
    shape, R = (3, 4, 5), 2
    X = rng.random(shape)
    path = to_zarr(tmp_path / "x.zarr", X, (2, 4, 3))
    init = [rng.random((s, R)) for s in shape]
    gpu = tfo.cp_als(
        path, R, client=client, init=init, max_iters=2, tol=0, device="gpu", execution="streaming", partitions=2
    )
    cpu = tfo.cp_als(X, R, init=init, max_iters=2, tol=0)
    assert gpu.params["device"] == "gpu"
    assert abs(gpu.fit - cpu.fit) < 1e-12
    for a, b in zip(gpu.factors, cpu.factors):
        assert np.abs(a - b).max() < 1e-10


def test_planted_rank5_with_noise_recovered(tmp_path, rng):
    """From the leading left singular vectors of each unfolding (pyttb's init="nvecs"): uniform
    random starts land in swamps on a fair share of planted tensors, which says nothing of ours."""
    p = synthetic.planted_dense((30, 40, 50), 5, noise=0.01, seed=int(rng.integers(1 << 30)))
    X = p.tensor
    init = [
        np.linalg.svd(np.moveaxis(X, n, 0).reshape(X.shape[n], -1), full_matrices=False)[0][:, :5] for n in range(3)
    ]
    path = to_zarr(tmp_path / "p.zarr", X, (10, 40, 25))
    r = tfo.cp_als(path, 5, init=init, max_iters=200, tol=1e-9, execution="streaming")
    assert r.fit >= 0.98
    # the recovered components are the planted ones (congruence, as pyttb's score)
    import pyttb

    truth = pyttb.ktensor([f.copy() for f in p.factors], p.weights.copy())
    assert r.to_pyttb().score(truth)[0] >= 0.95


def test_numpy_dask_zarr_inputs_agree(tmp_path, rng, client):
    shape, R = (14, 9, 12), 3
    X = rng.standard_normal(shape)
    init = [rng.random((s, R)) for s in shape]
    runs = {
        "numpy C": tfo.cp_als(X, R, init=init, max_iters=6, tol=0),
        "numpy F": tfo.cp_als(np.asfortranarray(X), R, init=init, max_iters=6, tol=0),
        "dask": tfo.cp_als(da.from_array(X, chunks=(5, 9, 7)), R, init=init, max_iters=6, tol=0),
        "dask on cluster": tfo.cp_als(
            da.from_array(X, chunks=(5, 9, 7)), R, client=client, init=init, max_iters=6, tol=0, partitions=2
        ),
        "numpy streamed on cluster": tfo.cp_als(
            X, R, client=client, init=init, max_iters=6, tol=0, execution="streaming", partitions=2
        ),
        "zarr": tfo.cp_als(to_zarr(tmp_path / "a.zarr", X, (4, 9, 5)), R, init=init, max_iters=6, tol=0),
        "zarr.Array": tfo.cp_als(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"), R, init=init, max_iters=6, tol=0),
    }
    ref = runs.pop("numpy C")
    for name, r in runs.items():
        assert abs(r.fit - ref.fit) < 1e-12, name
        for a, b in zip(r.factors, ref.factors):
            assert np.abs(a - b).max() < 1e-10, name
    # integer and float32 arrays are cast chunk by chunk to the factors' dtype
    Xi = rng.integers(-5, 6, shape).astype(np.int16)
    ri = tfo.cp_als(Xi, R, init=init, max_iters=4, tol=0)
    rf = tfo.cp_als(Xi.astype(np.float64), R, init=init, max_iters=4, tol=0)
    assert abs(ri.fit - rf.fit) < 1e-12


def test_streamed_reads_equal_zarr_reads(tmp_path, rng):
    """Streamed chunks come into reused buffers: raw chunk files read straight in where the array is
    uncompressed (whole chunks, and edge chunks, which Zarr stores at the full chunk shape; an
    all-zero chunk Zarr did not write reads as the fill value), Zarr's decoder otherwise
    (compressed arrays); a truncated chunk file is refused."""
    from tensorflow_ooc.store.dense import open_dense

    X = rng.standard_normal((10, 9, 7))
    X[:4, :4, :] = 0.0  # chunk (0, 0, 0): all fill value, not written
    for codec in ("none", "zstd"):
        path = str(tmp_path / f"{codec}.zarr")
        kw = {"compressors": None} if codec == "none" else {}
        zarr.create_array(path, shape=X.shape, chunks=(4, 4, 7), dtype="float64", zarr_format=3, **kw)[...] = X
        d = open_dense(path)
        buffer = np.empty(math.prod(d.chunk_shape))
        raw = mapped = 0
        for c in range(d.nchunks):
            lo, shp = d.chunk_box(c)
            raw += d._raw_chunk_file(c) is not None
            want = X[tuple(slice(a, a + b) for a, b in zip(lo, shp))]
            got = d.read_chunk(c, buffer)
            assert np.array_equal(got, want)
            view = d.map_chunk(c)  # the file mapped in place of a read, edges too
            if view is not None:
                mapped += 1
                assert view.shape == want.shape and np.array_equal(view, want)
        assert raw == (9 if codec == "none" else 0)  # every chunk of the 3 x 3 grid, edges too
        assert mapped == (8 if codec == "none" else 0)  # all but the fill-value chunk
    for codec, message in (("none", "a chunk file of 100 bytes"), ("zstd", r"chunk \[0, 1, 0\] could not be read")):
        # the streamed pass maps raw chunk files: a short one is refused before it is mapped
        with open(os.path.join(str(tmp_path / f"{codec}.zarr"), "c", "0", "1", "0"), "r+b") as f:
            f.truncate(100)
        with pytest.raises(tfo.CorruptStoreError, match=message):
            tfo.cp_als(str(tmp_path / f"{codec}.zarr"), 2, execution="streaming", max_iters=1)


def test_checkpoint_resume_result_store(tmp_path, rng, client):
    shape, R = (10, 12, 8), 3
    X = rng.random(shape)
    path = to_zarr(tmp_path / "x.zarr", X, (5, 5, 8))
    init = [rng.random((s, R)) for s in shape]
    ck = tmp_path / "run.ck.npz"
    straight = tfo.cp_als(path, R, init=init, max_iters=8, tol=0)
    first = tfo.cp_als(path, R, init=init, max_iters=5, tol=0, checkpoint=ck)
    assert first.iterations == 5 and ck.exists()
    resumed = tfo.cp_als(
        path,
        R,
        client=client,
        init=init,
        max_iters=8,
        tol=0,
        checkpoint=ck,
        resume=True,
        out=tmp_path / "res.zarr",
        execution="streaming",
    )
    assert resumed.params["resumed_after"] == 5 and resumed.iterations == 8
    assert abs(resumed.fit - straight.fit) < 1e-12
    for a, b in zip(resumed.factors, straight.factors):
        assert np.abs(a - b).max() < 1e-10
    back = tfo.load_result(tmp_path / "res.zarr")
    assert back.fit == resumed.fit and back.input["store_id"] == resumed.input["store_id"]
    for a, b in zip(back.factors, resumed.factors):
        assert np.array_equal(a, b)
    # the checkpoint belongs to this array: another one, or other data at the same path, is refused
    other = to_zarr(tmp_path / "y.zarr", X, (5, 5, 8))
    with pytest.raises(ValueError, match="another store"):
        tfo.cp_als(other, R, init=init, max_iters=8, checkpoint=ck, resume=True)
    zarr.open_array(path, mode="r+")[0, 0, 0] += 1.0
    with pytest.raises(ValueError, match="another store"):
        tfo.cp_als(path, R, init=init, max_iters=8, checkpoint=ck, resume=True)


def test_memory_plan_streams_an_array_four_times_the_headroom():
    """The dense plan: an array 4x the worker's limit is streamed, and the streaming peak (two chunks
    and one being decoded per task) fits; one 16x smaller is held in memory."""
    shape, R, itemsize = (800, 1000, 1250), 32, 8  # 8 GB
    chunk = 100 * 100 * 125 * itemsize
    base = dict(
        shape=shape,
        rank=R,
        itemsize=itemsize,
        chunk_bytes=chunk,
        chunk_shape=(100, 100, 125),
        tasks=1,
        kernel_threads=2,
        partitions_per_mode=1,
        workers=1,
        baseline=200 << 20,
    )
    array = math.prod(shape) * itemsize
    limit = array // 4
    plan = choose(dense_candidates(worker_bytes=array, limit=limit, **base))
    assert plan.execution == "streaming" and plan.peak <= 0.7 * limit
    assert plan.terms["data"] == 3 * chunk
    small = choose(dense_candidates(worker_bytes=array // 16, limit=limit, **base))
    assert small.execution == "in-memory"


def test_out_of_core_on_cluster_under_memory_limit(tmp_path, rng):
    """A LocalCluster worker whose memory limit leaves a quarter of the array for data (beyond the
    process as it is and the kernels' code): the plan streams the array, and the run's peak
    allocation (every thread, traced) stays under that quarter."""
    import psutil

    from tensorflow_ooc.execution.memory_plan import (
        ESTIMATE_MARGIN,
        KERNEL_CODE_BYTES,
        usable_fraction,
    )

    shape, chunks, R = (64, 128, 512), (8, 16, 512), 4  # 32 MiB of float64, 512 KiB chunks
    X = rng.standard_normal(shape)
    path = to_zarr(tmp_path / "big.zarr", X, chunks)
    init = [rng.random((s, R)) for s in shape]
    ref = tfo.cp_als(X, R, init=init, max_iters=3, tol=0)
    array_bytes = X.nbytes
    del X
    headroom = array_bytes // 4
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        baseline = psutil.Process().memory_info().rss
        limit = int(((baseline + KERNEL_CODE_BYTES) * ESTIMATE_MARGIN + headroom) / usable_fraction())
        # the limit the scheduler reports to the plan, and the one the worker enforces
        for ws in cluster.scheduler.workers.values():
            ws.memory_limit = limit
        for w in cluster.workers.values():
            w.memory_manager.memory_limit = limit
        tracemalloc.start()
        try:
            r = tfo.cp_als(path, R, client=c, init=init, max_iters=3, tol=0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert r.params["execution"] == "streaming", r.params["memory_plan"]
    assert r.params["memory_plan"]["limit"] == limit
    assert peak < headroom, f"traced peak {peak / 2**20:.1f} MiB"
    assert abs(r.fit - ref.fit) < 1e-12


@pytest.mark.parametrize(
    "make,problem",
    [
        (lambda rng: rng.random((4, 5, 6)), None),
        (lambda rng: rng.random((40, 50)), "order 2"),
        (lambda rng: rng.random((2,) * 7), "order 7"),
        (lambda rng: rng.random((4, 5, 6)) + 1j, "not a real numeric"),
        (lambda rng: rng.random((4, 5, 6)) > 0.5, "not a real numeric"),
        (lambda rng: np.zeros((4, 0, 6)), "empty"),
    ],
)
def test_bad_arrays_refused(rng, tmp_path, make, problem):
    X = make(rng)
    if problem is None:
        assert tfo.cp_als(X, 2, max_iters=2).iterations == 2
        return
    with pytest.raises(tfo.DenseArrayError, match=problem):
        tfo.cp_als(X, 2, max_iters=2, out=tmp_path / "r.zarr", checkpoint=tmp_path / "c.npz")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_zarr_refused_before_anything_is_written(tmp_path, rng, bad):
    X = rng.random((10, 12, 9))
    idx = tuple(int(rng.integers(s)) for s in X.shape)
    X[idx] = bad
    path = to_zarr(tmp_path / "x.zarr", X, (3, 5, 4))
    with pytest.raises(
        tfo.NonFiniteValueError,
        match=r"1 NaN or infinite entries \(the first at index "
        + str(list(idx)).replace("[", r"\[").replace("]", r"\]"),
    ) as e:
        tfo.cp_als(path, 2, out=tmp_path / "r.zarr", checkpoint=tmp_path / "c.npz", execution="streaming")
    assert path in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["x.zarr"]


def test_non_numeric_zarr_and_randomized_refused(tmp_path):
    z = zarr.create_array(str(tmp_path / "s.zarr"), shape=(3, 4, 5), chunks=(3, 4, 5), dtype=str, zarr_format=3)
    with pytest.raises(tfo.DenseArrayError, match="s.zarr: dtype .* not a real numeric"):
        tfo.cp_als(str(tmp_path / "s.zarr"), 2)
    del z
    with pytest.raises(tfo.DenseArrayError, match="method='exact'"):
        tfo.cp_als(np.ones((3, 4, 5)), 2, method="sts")


def test_rank_beyond_memory_refused_naming_the_array(tmp_path, rng):
    """The dense kernels take any rank (column chunks with a tail); the rank that cannot run is
    one whose factors do not fit a worker: the memory plan refuses it before anything is allocated."""
    from tensorflow_ooc.execution.memory_plan import MemoryPlanError

    path = to_zarr(tmp_path / "x.zarr", rng.random((3, 4, 5)), (3, 4, 5))
    with pytest.raises(MemoryPlanError, match=r"rank-1000000000 CP-ALS of .*x.zarr") as e:
        tfo.cp_als(path, 10**9, out=tmp_path / "r.zarr", checkpoint=tmp_path / "c.npz")
    assert isinstance(e.value, tfo.TfoocError)
    assert sorted(os.listdir(tmp_path)) == ["x.zarr"]


def test_cli_generate_info_cpd_dense(tmp_path, capsys):
    arr = str(tmp_path / "d.zarr")
    assert (
        main(
            [
                "generate",
                arr,
                "--dense",
                "20,24,30",
                "--rank",
                "5",
                "--noise",
                "0.01",
                "--chunks",
                "8,24,16",
                "--seed",
                "3",
                "-q",
            ]
        )
        == 0
    )
    truth = np.load(arr + ".factors.npz")
    assert truth["factor2"].shape == (30, 5)
    z = zarr.open_array(arr, mode="r")
    assert z.shape == (20, 24, 30) and z.chunks == (8, 24, 16)
    capsys.readouterr()
    assert main(["info", arr, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shape"] == [20, 24, 30] and info["chunks"] == [8, 24, 16] and info["nchunks"] == 6
    assert info["bytes"] == 20 * 24 * 30 * 8 and info["planted"]["rank"] == 5
    assert math.isclose(info["norm"], float(np.linalg.norm(z[...])), rel_tol=1e-9)
    assert info["compressors"] == []  # uncompressed by default
    assert main(["info", arr]) == 0
    assert "20 x 24 x 30" in capsys.readouterr().out
    packed = str(tmp_path / "z.zarr")
    assert main(["generate", packed, "--dense", "6,7,8", "--codec", "zstd", "--dtype", "float32", "-q"]) == 0
    assert capsys.readouterr().out.strip() == packed
    assert main(["info", packed, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["compressors"] == ["ZstdCodec"] and info["dtype"] == "float32"
    assert main(["cpd", arr, "--rank", "5", "--max-iters", "8", "--tol", "0", "--seed", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "14,400 entries" in out and "M entry-modes/s" in out
    r = tfo.load_result(arr + ".cp-r5.zarr")
    api = tfo.cp_als(arr, 5, seed=1, max_iters=8, tol=0)
    assert r.iterations == 8 and r.fit == api.fit and r.input["store_id"] == api.input["store_id"]
    assert os.path.exists(arr + ".cp-r5.zarr.checkpoint.npz")


def test_cli_bad_dense_input_exit_2(tmp_path, capsys, rng):
    X = rng.random((6, 7, 8))
    X[1, 2, 3] = np.nan
    arr = to_zarr(tmp_path / "nan.zarr", X, (3, 7, 8))
    assert main(["cpd", arr, "--rank", "2", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfooc: error:") and "nan.zarr" in err and "[1, 2, 3]" in err
    assert sorted(os.listdir(tmp_path)) == ["nan.zarr"]
    flat = to_zarr(tmp_path / "flat.zarr", rng.random((6, 7)), (3, 7))
    assert main(["cpd", flat, "--rank", "2", "-q"]) == 2
    assert "order 2" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "x.tns"), "--dense", "4,5,6", "-q"]) == 2


def test_readme_dense_example_runs(tmp_path, monkeypatch):
    import re
    import runpy
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("### Dense tensors") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "dense_example.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "dense_example.py"))
    r = tfo.load_result(tmp_path / "storage" / "dense-example.cp.zarr")
    assert r.fit >= 0.98 and r.input["shape"] == [60, 50, 40]
