"""Stores in object storage, for real: a moto S3 server on 127.0.0.1 (started by these tests),
reached through s3fs with AWS_ENDPOINT_URL, by this process and by Dask worker processes; and the
workers' disk cache of remote chunks (tensorflow_ooc.store.chunk_cache)."""

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import random_coo
from s3_server import s3_server

import tensorflow_ooc as tfo
from tensorflow_ooc.store import chunk_cache
from tensorflow_ooc.store.chunk_cache import ChunkCache, parse_bytes


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """Every process's chunk cache under one folder of this module (workers inherit the variable)."""
    d = tmp_path_factory.mktemp("chunk-cache")
    old = os.environ.get(chunk_cache.ENV_DIR)
    os.environ[chunk_cache.ENV_DIR] = str(d)
    chunk_cache.reset_default_cache()
    yield d
    chunk_cache.reset_default_cache()
    if old is None:
        os.environ.pop(chunk_cache.ENV_DIR, None)
    else:
        os.environ[chunk_cache.ENV_DIR] = old


@pytest.fixture(scope="module")
def s3(cache_dir):
    """``s3://<bucket>`` on a moto server of this module."""
    with s3_server() as url:
        yield url


@pytest.fixture(scope="module")
def cluster(s3):
    """Two worker processes, one thread each, started after the server's variables are set."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc,
        Client(lc) as c,
    ):
        yield c


def worker_stats(client) -> dict:
    per = client.run(chunk_cache.stats)
    return {k: sum(s[k] for s in per.values()) for k in next(iter(per.values()))}


def chunk_bytes(store) -> int:
    """Stored bytes of the chunk arrays (what a worker fetches at most once)."""
    import s3fs

    fs = s3fs.S3FileSystem()
    root = store.path[len("s3://") :]
    return sum(fs.du(f"{root}/{name}/c", total=True) for name in ("alto", "values"))


def pair(rng, s3, tmp_path, shape, nnz, name, **kw):
    """The same random tensor converted to a local store and to ``s3://``."""
    coords, values = random_coo(rng, shape, nnz)
    local = tfo.convert((coords, values), tmp_path / f"{name}.zarr", **kw)
    remote = tfo.convert((coords, values), f"{s3}/{name}-{rng.integers(1 << 30)}.zarr", **kw)
    return coords, values, local, remote


@pytest.fixture(scope="module")
def module_rng():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"module rng seed = {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def order3(s3, tmp_path_factory, module_rng):
    """A fresh random 3-way tensor (3000 nonzeros, 12 chunks) as a local and an S3 store."""
    return pair(module_rng, s3, tmp_path_factory.mktemp("order3"), (40, 30, 20), 3000, "t3", chunk_nnz=256)


@pytest.fixture(scope="module")
def order4(s3, tmp_path_factory, module_rng):
    """A fresh random 4-way tensor (4000 nonzeros, 16 chunks) as a local and an S3 store."""
    return pair(module_rng, s3, tmp_path_factory.mktemp("order4"), (30, 20, 25, 10), 4000, "t4", chunk_nnz=256)


def test_convert_open_info_and_read(order3, rng):
    coords, values, local, remote = order3
    assert remote.path.startswith("s3://")
    store = tfo.open_store(remote.path)
    assert store.cached and not local.cached
    info = store.info()
    assert info["nnz"] == 3000 and info["chunks"] == local.nchunks == 12 and info["bytes_on_disk"] > 0
    assert info["norm"] == pytest.approx(local.norm(), rel=1e-12)
    c1, v1 = store.to_coo()
    c2, v2 = local.to_coo()
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_array_equal(v1, v2)
    F = [rng.random((s, 5)) for s in store.shape]
    for mode in range(3):
        np.testing.assert_allclose(tfo.mttkrp(store, F, mode), tfo.mttkrp(local, F, mode), rtol=0, atol=1e-12)
    # in-memory execution loads its partitions through the same reader
    kw = dict(seed=0, max_iters=2, tol=0, execution="in-memory", scheduler="inline")
    got, ref = tfo.cp_als(store, 2, **kw), tfo.cp_als(local, 2, **kw)
    for a, b in zip(got.factors, ref.factors):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    # converting onto an existing URL is refused before any input is read
    with pytest.raises(FileExistsError):
        tfo.convert((coords, values), remote.path)


def test_streaming_reads_each_chunk_once_then_from_the_cache(order4):
    _, _, local, remote = order4
    store = tfo.open_store(remote.path)
    before = chunk_cache.stats()
    first = tfo.cp_als(store, 3, seed=1, max_iters=1, tol=0, execution="streaming", scheduler="inline")
    after_first = chunk_cache.stats()
    assert after_first["fetched_bytes"] - before["fetched_bytes"] == chunk_bytes(store)  # each chunk once
    more = tfo.cp_als(store, 3, seed=1, max_iters=3, tol=0, execution="streaming", scheduler="inline")
    after = chunk_cache.stats()
    assert after["fetched_bytes"] == after_first["fetched_bytes"]  # no HTTP read after the first
    assert after["hits"] - after_first["hits"] >= 3 * 4 * 2 * store.nchunks  # iterations x modes x arrays
    ref = tfo.cp_als(local, 3, seed=1, max_iters=3, tol=0, execution="streaming", scheduler="inline")
    for a, b in zip(more.factors, ref.factors):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    assert first.iterations == 1


def test_corrupted_cached_chunk_is_discarded_and_fetched_again(order3, rng):
    _, _, local, remote = order3
    store = tfo.open_store(remote.path)
    F = [rng.random((s, 4)) for s in store.shape]
    want = tfo.mttkrp(local, F, 1)
    np.testing.assert_allclose(tfo.mttkrp(store, F, 1), want, rtol=0, atol=1e-12)
    cache = chunk_cache.default_cache()
    files = [p for p in Path(cache.folder, store.meta["store_id"]).rglob("*") if p.is_file()]
    assert len(files) == 2 * store.nchunks
    for p in files:  # damage in the middle, same size: only the checksum can tell
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    before = chunk_cache.stats()
    np.testing.assert_allclose(tfo.mttkrp(store, F, 1), want, rtol=0, atol=1e-12)
    after = chunk_cache.stats()
    assert after["discarded"] - before["discarded"] == len(files)
    assert after["fetched_bytes"] - before["fetched_bytes"] == chunk_bytes(store)
    # fetched again, intact: read from the cache without a fetch
    np.testing.assert_allclose(tfo.mttkrp(store, F, 0), tfo.mttkrp(local, F, 0), rtol=0, atol=1e-12)
    assert chunk_cache.stats()["fetched_bytes"] == after["fetched_bytes"]


def test_endpoint_from_fsspec_configuration(s3, rng, monkeypatch):
    """Without AWS_ENDPOINT_URL, the endpoint given as fsspec's storage options for s3 (its
    configuration: FSSPEC_S3_ENDPOINT_URL, or a file under ~/.config/fsspec) reaches the server."""
    import fsspec.config
    import s3fs

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setitem(fsspec.config.conf, "s3", {**fsspec.config.conf.get("s3", {}), "endpoint_url": endpoint})
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        coords, values = random_coo(rng, (10, 9, 8), 100)
        url = f"{s3}/cfg-{rng.integers(1 << 30)}.zarr"
        tfo.convert((coords, values), url)
        assert tfo.open_store(url).nnz == 100
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()


def test_corrupt_remote_chunk_is_refused_not_cached(s3, tmp_path, rng):
    import s3fs

    from tensorflow_ooc.errors import CorruptStoreError

    coords, values = random_coo(rng, (20, 20, 20), 1500)
    remote = tfo.convert((coords, values), f"{s3}/bad-{rng.integers(1 << 30)}.zarr", chunk_nnz=512)
    fs = s3fs.S3FileSystem()
    key = f"{remote.path[len('s3://') :]}/values/c/1"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(key, bytes(data))
    store = tfo.open_store(remote.path)
    F = [rng.random((s, 2)) for s in store.shape]
    with pytest.raises(CorruptStoreError, match="chunk 1"):
        tfo.mttkrp(store, F, 0)
    assert chunk_cache.default_cache().cached((store.meta["store_id"], "values", 1)) is None


@pytest.mark.parametrize("budget", ["64MiB", "1000"], ids=["cached", "chunks-larger-than-the-cache"])
def test_uncompressed_store_mapped_from_the_cache_or_read_from_memory(s3, tmp_path, rng, budget, monkeypatch):
    """Compression "none": chunks mapped where they lie, here the cache's files; a cache too small
    for any chunk serves each from memory instead, with the same checks."""
    monkeypatch.setenv(chunk_cache.ENV_BYTES, budget)
    chunk_cache.reset_default_cache()
    try:
        coords, values = random_coo(rng, (25, 20, 30), 2000)
        local = tfo.convert((coords, values), tmp_path / "raw.zarr", chunk_nnz=512, compression="none")
        remote = tfo.convert(
            (coords, values), f"{s3}/raw-{rng.integers(1 << 30)}.zarr", chunk_nnz=512, compression="none"
        )
        store = tfo.open_store(remote.path)
        assert store.mappable
        F = [rng.random((s, 3)) for s in store.shape]
        for mode in range(3):
            for _ in range(2):
                np.testing.assert_allclose(tfo.mttkrp(store, F, mode), tfo.mttkrp(local, F, mode), rtol=0, atol=1e-12)
        stats = chunk_cache.stats()
        if budget == "1000":
            assert stats["entries"] == 0 and stats["uncached"] >= 6 * 2 * store.nchunks
        else:
            assert stats["entries"] == 2 * store.nchunks and stats["fetched_bytes"] == chunk_bytes(store)
    finally:
        monkeypatch.undo()
        chunk_cache.reset_default_cache()


@pytest.mark.parametrize("tensor", ["order3", "order4"])
def test_cp_als_on_process_workers_equals_local_store(cluster, cache_dir, tensor, request):
    _, _, local, remote = request.getfixturevalue(tensor)
    N = local.nmodes
    kw = dict(seed=2, max_iters=4, tol=0, execution="streaming")
    out = f"{remote.path}.workers.cp.zarr"
    before = worker_stats(cluster)
    got = tfo.cp_als(remote.path, 3, client=cluster, out=out, **kw)
    stats = worker_stats(cluster)
    ref = tfo.cp_als(local.path, 3, scheduler="inline", **kw)
    assert got.iterations == ref.iterations == 4
    np.testing.assert_allclose(got.weights, ref.weights, rtol=1e-10)
    for a, b in zip(got.factors, ref.factors):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    # the result store in object storage reads back the same
    back = tfo.load_result(out)
    np.testing.assert_array_equal(back.weights, got.weights)
    for a, b in zip(back.factors, got.factors):
        np.testing.assert_array_equal(a, b)
    # each worker fetched each chunk at most once, though every mode of every iteration read them
    assert stats["hits"] - before["hits"] >= 4 * N * 2 * remote.nchunks - 4 * remote.nchunks
    assert 0 < stats["fetched_bytes"] - before["fetched_bytes"] <= 2 * chunk_bytes(remote)
    # copies damaged on the workers' disks are discarded and fetched again
    damaged = 0
    for p in cache_dir.glob(f"*/{remote.meta['store_id']}/*/*"):
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
        damaged += 1
    assert damaged >= 2 * remote.nchunks
    again = tfo.cp_als(remote.path, 3, client=cluster, **dict(kw, max_iters=1))
    first = tfo.cp_als(local.path, 3, scheduler="inline", **dict(kw, max_iters=1))
    for a, b in zip(again.factors, first.factors):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    assert worker_stats(cluster)["discarded"] - stats["discarded"] >= 2 * remote.nchunks


def test_cli_cpd_on_s3_store(order3, capsys):
    from tensorflow_ooc.cli import main

    remote = order3[3]
    code = main(["cpd", remote.path, "--rank", "2", "--max-iters", "3", "--seed", "0", "--execution", "streaming"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{remote.path}.cp-r2.zarr" in out
    assert tfo.load_result(f"{remote.path}.cp-r2.zarr").iterations == 3
    assert main(["info", remote.path]) == 0
    assert "nonzeros     3,000" in capsys.readouterr().out


def test_cli_relative_store_with_scheduler_is_made_absolute(cluster, tmp_path, rng, monkeypatch, capsys):
    """Workers started in another folder: a relative path sent as it is would not be found."""
    from tensorflow_ooc.cli import main

    coords, values = random_coo(rng, (15, 12, 10), 800)
    tfo.convert((coords, values), tmp_path / "rel.zarr", chunk_nnz=256)
    monkeypatch.chdir(tmp_path)
    address = cluster.scheduler.address
    code = main(["cpd", "rel.zarr", "--rank", "2", "--max-iters", "2", "--scheduler", address])
    out = capsys.readouterr().out
    assert code == 0, out
    assert str(tmp_path / "rel.zarr.cp-r2.zarr") in out
    assert tfo.load_result(tmp_path / "rel.zarr.cp-r2.zarr").iterations == 2


def test_workflow_with_storage_root_in_s3_keeps_run_records_there(s3, tmp_path, capsys):
    import s3fs

    from tensorflow_ooc.cli import main

    root = f"{s3}/wf-{os.urandom(4).hex()}"
    spec = tmp_path / "s3.yaml"
    spec.write_text(
        f"""name: s3wf
storage: {root}
steps:
  generate: {{kind: generate, out: t.tns, shape: [30, 20, 10], nnz: 2000, model: planted, rank: 3, seed: 0}}
  convert: {{kind: convert, input: t.tns, out: t.zarr}}
  decompose: {{kind: decompose, input: t.zarr, out: t.cp.zarr, rank: 3, max_iters: 3, seed: 1}}
"""
    )
    assert main(["run", str(spec)]) == 0
    assert f"{root}/t.cp.zarr" in capsys.readouterr().out
    assert tfo.load_result(f"{root}/t.cp.zarr").iterations == 3
    runs = s3fs.S3FileSystem().ls(f"{root[len('s3://') :]}/.tfooc/runs")
    assert len(runs) == 1 and runs[0].rsplit("/", 1)[1].startswith("s3wf-")
    assert main(["status", "--storage", root]) == 0
    assert "done" in capsys.readouterr().out
    assert main(["run", str(spec)]) == 3  # every step up to date, judged from the records in S3


# --- the cache itself -------------------------------------------------------------------------------


def _chunk(payload: bytes) -> bytes:
    from crc32c import crc32c

    return payload + crc32c(payload).to_bytes(4, "little")


def test_cache_is_bounded_least_recently_used_first(tmp_path):
    cache = ChunkCache(tmp_path / "c", max_bytes=3 * 104)
    fetches = []

    def fetch(i):
        fetches.append(i)
        return _chunk(bytes([i]) * 100)

    for i in range(3):
        assert cache.get(("s", "a", i), lambda i=i: fetch(i)).path.read_bytes() == _chunk(bytes([i]) * 100)
    cache.get(("s", "a", 0), lambda: fetch(0))  # 0 is now the most recently used
    cache.get(("s", "a", 3), lambda: fetch(3))  # evicts 1
    assert fetches == [0, 1, 2, 3]
    assert cache.cached(("s", "a", 1)) is None and cache.cached(("s", "a", 0)) is not None
    assert cache.stats()["bytes"] <= 3 * 104 and cache.stats()["evicted"] == 1
    assert not [p for p in (tmp_path / "c").rglob(".*tmp*")]  # no temporary file left
    assert len([p for p in (tmp_path / "c").rglob("*") if p.is_file()]) == 3
    cache.close()
    assert not (tmp_path / "c").exists()


def test_cache_checks_recorded_checksum_and_prefetches(tmp_path):
    from crc32c import crc32c

    cache = ChunkCache(tmp_path / "c", max_bytes=1 << 20, threads=4)
    good = _chunk(b"x" * 64)
    # bytes whose checksum is not the one recorded for the position: handed back, not cached
    got = cache.get(("s", "a", 0), lambda: good, expected=crc32c(b"y" * 64))
    assert got.path is None and got.data == good and cache.stats()["uncached"] == 1
    assert cache.get(("s", "a", 1), lambda: None) is None  # never written
    queued = cache.prefetch([(("s", "a", i), lambda: good, crc32c(b"x" * 64)) for i in range(2, 10)])
    assert queued == 8
    for i in range(2, 10):
        assert cache.get(("s", "a", i), lambda: pytest.fail("fetched twice")).path is not None
    assert cache.prefetch([(("s", "a", 2), lambda: good, None)]) == 0
    cache.close()


def test_parse_bytes_and_turning_the_cache_off(monkeypatch, tmp_path):
    assert parse_bytes("2GiB") == 2 << 30 and parse_bytes("512MB") == 512 * 10**6 and parse_bytes("1000") == 1000
    with pytest.raises(ValueError):
        parse_bytes("lots")
    monkeypatch.setenv(chunk_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(chunk_cache.ENV_BYTES, "0")
    chunk_cache.reset_default_cache()
    try:
        assert chunk_cache.default_cache() is None
        monkeypatch.setenv(chunk_cache.ENV_BYTES, "64MiB")
        chunk_cache.reset_default_cache()
        cache = chunk_cache.default_cache()
        assert cache.max_bytes == 64 << 20 and cache.folder.parent == tmp_path
    finally:
        monkeypatch.undo()
        chunk_cache.reset_default_cache()


def test_fiber_index_in_object_storage(s3, tmp_path, rng, cluster):
    """The fiber index built on an S3 store (shards written and read by ranged GETs) holds what
    the local one does, and STS-CP streamed from S3 through it on two workers equals local."""
    from tensorflow_ooc.execution.fiber_reads import indexed_sampled_partial
    from tensorflow_ooc.kernels.sampling.krp_sampler import SampleSet

    coords, values, local, remote = pair(rng, s3, tmp_path, (30, 25, 20), 3000, "fibers", chunk_nnz=512)
    tfo.build_fiber_index(local, "all", chunk_nnz=128)
    tfo.build_fiber_index(remote, "all", chunk_nnz=128)
    remote = tfo.open_store(remote.path)
    assert remote.fiber_modes() == [0, 1, 2]
    for mode in range(3):
        a, b = local.fibers.mode(mode), remote.fibers.mode(mode)
        ga, gb = a.read(np.arange(a.nchunks)), b.read(np.arange(b.nchunks))
        assert np.array_equal(ga.keys, gb.keys) and np.array_equal(ga.values, gb.values)
        s = coords[rng.integers(0, coords.shape[0], 50)]
        S = SampleSet(mode, s, np.ones(50), rng.random((50, 3)), 50)
        pa = indexed_sampled_partial(str(local.path), S, mode)
        pb = indexed_sampled_partial(remote.path, S, mode)
        assert pa.lo == pb.lo and np.array_equal(pa.rows, pb.rows)
    kw = dict(method="sts", samples=400, seed=3, max_iters=3, execution="streaming", distribution="graph")
    x = tfo.cp_als(local, 3, client=cluster, **kw)
    y = tfo.cp_als(remote, 3, client=cluster, **kw)
    assert set(y.params["sampled_reads"].values()) == {"index"}
    for fa, fb in zip(x.factors, y.factors):
        np.testing.assert_allclose(fa, fb, rtol=1e-10, atol=1e-12)
