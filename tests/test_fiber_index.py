"""The store's fiber index: contents against a sort of to_coo, fibers read against the in-memory
gather, sampled decompositions streamed through it equal to in memory, its binding to the store,
and a store without one unchanged."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import CorruptStoreError
from tensorflow_ooc.execution.fiber_reads import indexed_sampled_partial, share_keys
from tensorflow_ooc.format.fiber_keys import key_strides
from tensorflow_ooc.kernels.sampling.fiber_gather import FiberIndex, sampled_mttkrp_items
from tensorflow_ooc.kernels.sampling.krp_sampler import SampleSet
from tensorflow_ooc.store.chunk_files import _crc32c as crc32c
from tensorflow_ooc.store.codecs import quiet_numcodecs
from tensorflow_ooc.store.fiber_index import open_fiber_index
from tensorflow_ooc.store.shard_files import shard_chunks


def _store(tmp_path, rng, nmodes, nnz=3000, name="s", **kw):
    shape = tuple(int(s) for s in rng.integers(4, 16 if nmodes < 5 else 8, nmodes))
    coords, values = random_coo(rng, shape, nnz)
    store = tfo.convert((coords, values), tmp_path / name, shape=shape, chunk_nnz=512, **kw)
    return store, coords, values


def _sorted_by_fiber(store, mode):
    coords, values = store.to_coo()
    keys = (coords.astype(np.uint64) * key_strides(store.shape, mode)).sum(axis=1, dtype=np.uint64)
    order = np.argsort(keys, kind="stable")  # each fiber in store order
    return keys[order], coords[order, mode], values[order]


def _samples(rng, coords, shape, mode, count, R):
    """Draws of the other modes' indices, half on nonzeros' fibers, some repeated; weights and rows."""
    hits = coords[rng.integers(0, coords.shape[0], count // 2)]
    rand = np.stack([rng.integers(0, s, count - count // 2) for s in shape], axis=1)
    s = np.concatenate([hits, rand, hits[: count // 8]])
    s[:, mode] = 0
    return SampleSet(mode, s, rng.random(s.shape[0]) + 0.5, rng.standard_normal((s.shape[0], R)), s.shape[0])


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_index_holds_the_nonzeros_sorted_by_fiber(tmp_path, rng, nmodes):
    store, _, _ = _store(tmp_path, rng, nmodes)
    # a budget of a few hundred entries: several key-range passes per mode
    index = tfo.build_fiber_index(store, "all", chunk_nnz=int(rng.choice([64, 100, 512])), memory_limit=64 * 700)
    assert index.modes == list(range(nmodes))
    for mode in range(nmodes):
        got = index.mode(mode).read(np.arange(index.mode(mode).nchunks))
        keys, rows, values = _sorted_by_fiber(store, mode)
        assert np.array_equal(got.keys, keys)
        assert np.array_equal(got.rows, rows)
        assert np.array_equal(got.values, values)
        assert got.bytes_read == index.mode(mode).stored_bytes() > 0
        # the shard files are Zarr's: Zarr reads the same arrays back
        import zarr

        group = zarr.open_group(str(Path(store.path) / "fibers" / f"m{mode}"), mode="r")
        assert np.array_equal(group["key"][:], keys) and np.array_equal(group["row"][:], rows)
        assert np.array_equal(group["value"][:], values)


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_fibers_read_through_the_index_equal_the_in_memory_gather(tmp_path, rng, nmodes):
    store, coords, _ = _store(tmp_path, rng, nmodes)
    tfo.build_fiber_index(store, "all", chunk_nnz=128)
    from tensorflow_ooc.execution.stream import BatchBuffers, fill_batch

    items = fill_batch(store, range(store.nchunks), BatchBuffers(store, store.nchunks), delta=False)
    R = int(rng.choice([1, 4, 16]))
    for mode in range(nmodes):
        S = _samples(rng, coords, store.shape, mode, 80, R)
        want = np.zeros((store.shape[mode], R))
        index = FiberIndex.build(items, store.layout, mode)
        sampled_mttkrp_items(items, store.layout, mode, S.coords, S.weighted_rows(), want, 0, index=index)
        assert np.abs(want).sum() > 0
        got = indexed_sampled_partial(str(store.path), S, mode)
        full = np.zeros_like(want)
        got.add_into(full)
        assert np.array_equal(full, want)  # the same sums in the same order
        # the index read only the chunks of the sampled fibers, and says so
        assert got.reads["path"] == "index" and got.reads["nnz_read"] <= store.nnz
        # shares of the keys: every sample in exactly one, the sums those of the whole
        K = 3
        keys = np.asarray(
            (S.coords.astype(np.uint64) * key_strides(store.shape, mode)).sum(1, dtype=np.uint64), dtype=np.uint64
        )
        parts = [share_keys(keys, (k, K)) for k in range(K)]
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(keys.shape[0]))
        total = np.zeros_like(want)
        for k in range(K):
            p = indexed_sampled_partial(str(store.path), S, mode, share=(k, K))
            p.add_into(total)
        np.testing.assert_allclose(total, want, rtol=1e-12, atol=1e-12)


def test_a_round_reads_only_the_sampled_fibers_chunks(tmp_path, rng):
    shape = (200, 300, 400)
    coords, values = random_coo(rng, shape, 60000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape)
    index = tfo.build_fiber_index(store, [1], chunk_nnz=256)
    S = _samples(rng, coords, shape, 1, 20, 4)
    got = indexed_sampled_partial(str(store.path), S, 1)
    assert got.reads["chunks_read"] <= 2 * len(np.unique(S.coords, axis=0))
    mode_index = index.mode(1)
    assert got.reads["chunks_read"] < mode_index.nchunks / 4
    # exactly the stored bytes of the chunks read, a fraction of the index
    keys = (S.coords.astype(np.uint64) * key_strides(shape, 1)).sum(axis=1, dtype=np.uint64)
    held, filter_bytes = mode_index.may_hold(keys)
    chunks = mode_index.chunks_of(keys[held])
    assert got.reads["bytes_read"] == mode_index.chunk_bytes(chunks) + filter_bytes < mode_index.stored_bytes() / 4
    assert got.reads["filter_bytes"] == filter_bytes
    # the filter read its keys' blocks only: one 512-byte chunk (and its CRC32C) a key at most
    assert 0 < filter_bytes <= 516 * len(np.unique(keys))
    # what the memory plan counts for the filters covers that query's read and decoded blocks
    tables = 24 * (mode_index.bloom_crc.shape[0])
    assert tables + 2 * filter_bytes * 512 // 516 <= index.bloom_bytes([1], samples=len(keys))
    # the Bloom filter: every fiber with nonzeros passes, nearly all without are skipped unread
    coords1 = coords.copy()
    coords1[:, 1] = 0
    real = np.unique((coords1.astype(np.uint64) * key_strides(shape, 1)).sum(axis=1, dtype=np.uint64))
    assert mode_index.may_hold(real)[0].all()
    absent = np.setdiff1d(rng.integers(0, 200 * 400, 20000).astype(np.uint64), real)
    assert mode_index.may_hold(absent)[0].mean() < 0.05
    assert got.reads["fibers"] >= 1 and got.reads["nnz"] >= 1


@pytest.mark.parametrize("method", ["sts", "arls-lev", "arls-lev-hybrid"])
def test_sampled_cp_streamed_through_the_index_equals_in_memory(tmp_path, rng, method):
    store, _, _ = _store(tmp_path, rng, int(rng.integers(3, 6)), nnz=4000)
    plain = tfo.convert(store.to_coo(), tmp_path / "plain", shape=store.shape)
    tfo.build_fiber_index(store, "all", chunk_nnz=256)
    # no exact warm-up: the in-memory and streamed exact MTTKRPs differ in rounding, the gathers do not
    kw = dict(method=method, samples=600, seed=int(rng.integers(1 << 30)), max_iters=3, partitions=1, warmup=0)
    mem = tfo.cp_als(plain, 3, execution="in-memory", **kw)
    idx = tfo.cp_als(store, 3, execution="streaming", **kw)
    scan = tfo.cp_als(plain, 3, execution="streaming", **kw)
    assert set(idx.params["sampled_reads"].values()) == {"index"}
    assert set(scan.params["sampled_reads"].values()) == {"scan"}  # a store without an index: unchanged
    for a, b in zip(mem.factors, idx.factors):
        assert np.array_equal(a, b)  # one share, one partition: the same sums in the same order
    for a, b in zip(mem.factors, scan.factors):
        # columns of max-norm 1: an entry near zero differed by 3.7e-12 (1.4e-9 of itself) in CI
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)
    rec = idx.history[-1]
    assert set(rec["reads"]) == {str(m) for m in range(store.nmodes)}
    for r in rec["reads"].values():
        assert r["path"] == "index" and 0 < r["bytes_read"] and r["nnz"] <= r["nnz_read"] <= store.nnz
    assert rec["store_nnz"] == store.nnz and rec["round_seconds"] <= rec["seconds"]


def test_sampled_cp_on_two_process_workers_equals_one(tmp_path, rng, two_workers):
    store, _, _ = _store(tmp_path, rng, 4, nnz=5000)
    tfo.build_fiber_index(store, "all", chunk_nnz=256)
    kw = dict(method="sts", samples=800, seed=int(rng.integers(1 << 30)), max_iters=3, execution="streaming")
    one = tfo.cp_als(store, 4, partitions=1, **kw)
    two = tfo.cp_als(store, 4, client=two_workers, distribution="graph", **kw)
    assert set(two.params["sampled_reads"].values()) == {"index"}
    for a, b in zip(one.factors, two.factors):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


def test_randomized_tensor_train_through_the_index(tmp_path, rng):
    store, _, _ = _store(tmp_path, rng, 4, nnz=4000)
    plain = tfo.convert(store.to_coo(), tmp_path / "plain", shape=store.shape)
    tfo.build_fiber_index(store, "all", chunk_nnz=256)
    kw = dict(method="randomized", samples=500, seed=int(rng.integers(1 << 30)), max_sweeps=2, execution="streaming")
    a = tfo.tt_als(store, 2, **kw)
    b = tfo.tt_als(plain, 2, **kw)
    for x, y in zip(a.cores, b.cores):
        np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-10)


def _meta_path(store):
    return Path(store.path) / "fibers" / "zarr.json"


def test_an_edited_or_foreign_index_is_refused(tmp_path, rng):
    shape = (20, 25, 30)  # 3000 nonzeros: shards of many 128-entry chunks
    coords, values = random_coo(rng, shape, 3000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape)
    tfo.build_fiber_index(store, "all", chunk_nnz=128)
    S = _samples(rng, coords, store.shape, 0, 40, 2)
    # metadata edited: a count changed
    meta_file = _meta_path(store)
    original = meta_file.read_text()
    doc = json.loads(original)
    doc["attributes"]["fiber_index"]["modes"]["0"]["nnz"] += 1
    meta_file.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match="edited"):
        open_fiber_index(tfo.open_store(store.path))
    meta_file.write_text(original)
    # a chunk table edited (its own CRC32C rewritten by Zarr): the tables' checksum sees it
    import zarr

    first = zarr.open_array(str(Path(store.path) / "fibers" / "m1" / "first"), mode="r+")
    first[0] = int(first[0]) + 1
    with pytest.raises(CorruptStoreError, match="tables were edited"):
        open_fiber_index(tfo.open_store(store.path)).mode(1)
    # inner chunks swapped in their shard (its index rewritten with a valid CRC32C): each chunk's
    # CRC32C holds, its position does not
    shard = Path(store.path) / "fibers" / "m2" / "value" / "c" / "0"
    raw = bytearray(shard.read_bytes())
    per = shard_chunks(128)
    n = per * 16 + 4
    index = np.frombuffer(bytes(raw[-n:-4]), dtype="<u8").reshape(per, 2).copy()
    index[[0, 1]] = index[[1, 0]]
    body = index.tobytes()
    raw[-n:] = body + int(crc32c(body)).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptStoreError, match="does not belong at this position"):
        indexed_sampled_partial(str(store.path), S, 2)
    # an index copied from another store of the same shape
    other = tfo.convert(random_coo(rng, shape, 3000), tmp_path / "other", shape=shape)
    shutil.rmtree(Path(other.path) / "fibers", ignore_errors=True)
    shutil.copytree(Path(store.path) / "fibers", Path(other.path) / "fibers")
    with pytest.raises(CorruptStoreError, match="another store"):
        open_fiber_index(tfo.open_store(other.path))
    # the Bloom filter edited: refused when first used
    tfo.build_fiber_index(store, [0], overwrite=True, chunk_nnz=128)
    bloom = zarr.open_array(str(Path(store.path) / "fibers" / "m0" / "bloom"), mode="r+")
    bloom[0] = int(bloom[0]) ^ 1
    with pytest.raises(CorruptStoreError, match="Bloom filter was edited"):
        indexed_sampled_partial(str(store.path), S, 0)


def test_rewrite_keeps_the_index_and_info_reports_it(tmp_path, rng):
    store, _, _ = _store(tmp_path, rng, 3)
    tfo.build_fiber_index(store, [0, 2], chunk_nnz=128)
    new = tfo.rewrite(store, tmp_path / "new", compression="small")
    assert new.fiber_modes() == [0, 2]
    for mode in (0, 2):
        got = new.fibers.mode(mode).read(np.arange(new.fibers.mode(mode).nchunks))
        assert np.array_equal(got.keys, _sorted_by_fiber(new, mode)[0])
    info = new.info()["fiber_index"]
    assert set(info) == {"0", "2"} and all(v["bytes_per_nnz"] > 0 for v in info.values())
    with pytest.raises(FileExistsError, match="already have a fiber index"):
        tfo.build_fiber_index(new, [2])
    assert tfo.build_fiber_index(new, [1, 2], overwrite=True).modes == [0, 1, 2]


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_cli_builds_reports_and_refuses(tmp_path, rng):
    coords, values = random_coo(rng, (20, 30, 40), 3000)
    tns = tmp_path / "x.tns"
    tns.write_text("".join(f"{a + 1} {b + 1} {c + 1} {float(v)!r}\n" for (a, b, c), v in zip(coords, values)))
    r = _cli("convert", str(tns), str(tmp_path / "s"), "--fiber-index", "0,2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _cli("info", str(tmp_path / "s"), cwd=tmp_path)
    assert r.returncode == 0 and "mode 0" in r.stdout and "mode 2" in r.stdout and "mode 1 " not in r.stdout
    r = _cli("fiber-index", str(tmp_path / "s"), "--modes", "1", "--chunk-nnz", "256", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(_cli("info", str(tmp_path / "s"), "--json", cwd=tmp_path).stdout)
    assert sorted(info["fiber_index"]) == ["0", "1", "2"] and info["fiber_index"]["1"]["chunk_nnz"] == 256
    for bad, said in ((["--modes", "1"], "already have a fiber index"), (["--modes", "7"], "not modes")):
        r = _cli("fiber-index", str(tmp_path / "s"), *bad, cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr


def test_estimated_fit_against_the_dense_fit(tmp_path, rng):
    from tensorflow_ooc.decompositions.cp import updates as U
    from tensorflow_ooc.decompositions.cp.cp_steps import model_norm_sq
    from tensorflow_ooc.decompositions.cp.fit_estimate import estimated_fit
    from tensorflow_ooc.execution.nonzero_sample import sample_nonzeros

    store, coords, values = _store(tmp_path, rng, int(rng.integers(3, 6)), nnz=4000)
    R = 3
    state = U.random_factors(store.shape, R, int(rng.integers(1 << 30)), "float64")
    state.weights = rng.random(R) + 0.5
    X = np.zeros(store.shape)
    X[tuple(coords.T)] = values
    M = np.zeros(store.shape)
    for r in range(R):
        t = state.weights[r]
        for n in range(store.nmodes):
            t = np.multiply.outer(t, state.views[n][:, r])
        M += t
    true = 1 - np.linalg.norm(X - M) / np.linalg.norm(X)
    norm_model2 = model_norm_sq(U.summary(state))
    full = sample_nonzeros(str(store.path), store.nnz, 1)  # rate 1: every nonzero, the exact fit
    fit, se = estimated_fit(state, full, store.norm_sq, norm_model2)
    assert full.values.shape[0] == store.nnz and se == 0.0
    assert abs(fit - true) < 1e-9
    # a third of the nonzeros: within a few standard errors, over fresh samples
    z = []
    for seed in range(20):
        part = sample_nonzeros(str(store.path), store.nnz // 3, int(rng.integers(1 << 30)) + seed)
        est, se = estimated_fit(state, part, store.norm_sq, norm_model2)
        assert se > 0
        z.append((est - true) / se)
    assert np.all(np.abs(z) < 5) and abs(np.mean(z)) < 1.5


def test_randomized_records_say_which_fit_they_hold(tmp_path, rng):
    shape = (20, 25, 30)
    store = tfo.convert(random_coo(rng, shape, 4000), tmp_path / "s", shape=shape)
    r = tfo.cp_als(store, 3, method="sts", samples=500, max_iters=5, fit_every=4, tol=0, seed=1, fit_sample=1000)
    sources = [h["fit_source"] for h in r.history]
    assert sources == ["exact", "carried", "carried", "exact", "exact"]  # warm-up, 2 sampled, every 4th, last
    for h in r.history:
        assert ("fit_estimate" in h) == (h["fit_source"] == "carried")
    h = r.history[2]
    assert 0 < h["fit_estimate_se"] < 0.1 and abs(h["fit_estimate"] - r.history[3]["fit"]) < 0.2


def test_gathers_in_bounded_groups_sum_the_same(tmp_path, rng, monkeypatch):
    import tensorflow_ooc.execution.fiber_reads as fr

    store, coords, _ = _store(tmp_path, rng, 3, nnz=3000)
    tfo.build_fiber_index(store, "all", chunk_nnz=64)
    for mode in range(3):
        S = _samples(rng, coords, store.shape, mode, 200, 5)
        whole = indexed_sampled_partial(str(store.path), S, mode)
        monkeypatch.setattr(fr, "GATHER_ENTRIES", 256)  # groups of at most 4 chunks
        grouped = indexed_sampled_partial(str(store.path), S, mode)
        monkeypatch.undo()
        a = np.zeros((store.shape[mode], 5))
        b = np.zeros_like(a)
        a[whole.lo : whole.lo + whole.rows.shape[0]] = whole.rows
        b[grouped.lo : grouped.lo + grouped.rows.shape[0]] = grouped.rows
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        assert grouped.reads["nnz"] == whole.reads["nnz"] and grouped.reads["fibers"] == whole.reads["fibers"]


def test_gather_groups_count_the_chunks_they_need(tmp_path, rng, monkeypatch):
    import tensorflow_ooc.execution.fiber_reads as fr

    shape = (4, 30, 30)  # mode 0: 900 short fibers, ~19 to a 64-entry chunk
    store = tfo.convert(random_coo(rng, shape, 3000), tmp_path / "s", shape=shape, chunk_nnz=512)
    idx = tfo.build_fiber_index(store, [0], chunk_nnz=64).mode(0)
    keys = np.unique(idx.read(np.arange(idx.nchunks)).keys)[:: int(rng.integers(30, 50))]  # chunks between
    monkeypatch.setattr(fr, "GATHER_ENTRIES", 256)  # 4 chunks a group
    groups = fr._key_groups(idx, keys)
    assert np.array_equal(np.unique(np.concatenate([g[2] for g in groups])), idx.chunks_of(keys))
    for lo, hi, chunks in groups:  # each group's chunks are those its own fibers span
        assert np.array_equal(chunks, idx.chunks_of(keys[(keys >= lo) & (keys <= hi)]))
    # each group needs at most 4 chunks and would need more with the next group's first fiber
    for (_, _, chunks), (lo_next, _, _) in zip(groups[:-1], groups[1:]):
        assert chunks.shape[0] <= 4
        assert np.union1d(chunks, idx.chunks_of(np.array([lo_next], np.uint64))).shape[0] > 4


def test_owner_computes_reads_each_workers_draws_through_the_index(tmp_path, rng, two_workers):
    shape = tuple(int(x) for x in rng.integers(30, 80, int(rng.integers(3, 5))))
    coords, values = random_coo(rng, shape, 6000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape, chunk_nnz=512)
    plain = tfo.convert((coords, values), tmp_path / "plain", shape=shape, chunk_nnz=512)
    tfo.build_fiber_index(store, "all", chunk_nnz=64)
    kw = dict(method="sts", samples=300, seed=int(rng.integers(1 << 30)), max_iters=3, execution="streaming")
    owner = tfo.cp_als(store, 4, client=two_workers, distribution="owner", **kw)
    scan = tfo.cp_als(plain, 4, client=two_workers, distribution="owner", **kw)
    assert owner.params["distribution"]["kind"] == "owner-computes"
    assert set(owner.params["sampled_reads"].values()) == {"index"}
    assert set(scan.params["sampled_reads"].values()) == {"scan"}
    # the same draws (the owners' sampler), the fibers read through the index or by a scan
    for a, b in zip(scan.factors, owner.factors):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)
    sampled = [h for h in owner.history if h.get("reads")]
    assert sampled
    for r in sampled[-1]["reads"].values():
        # each worker read the chunks of its share of the draws' fibers, not the store
        assert r["path"] == "index" and 0 < r["nnz"] <= r["nnz_read"] < store.nnz


@pytest.mark.parametrize("compression", ["fast", "small", "none"])
def test_chunks_read_together_equal_what_zarr_reads(tmp_path, rng, compression):
    """The batched read (runs of touching chunks in one read, decoded in native code) gives each
    chunk's entries as Zarr reads the array, Blosc or raw, and the CRC32Cs and bytes recorded at
    the build; a flipped byte is refused by chunk."""
    store, _, _ = _store(tmp_path, rng, 3, nnz=6000, compression=compression)
    tfo.build_fiber_index(store, "all", chunk_nnz=16)
    idx = open_fiber_index(tfo.open_store(store.path))
    for mode in range(3):
        m = idx.mode(mode)
        for k, f in enumerate(m._files):
            # runs of neighbours, lone chunks, shards crossed, the short last chunk
            pick = np.unique(np.concatenate([rng.choice(m.nchunks, m.nchunks // 3), [m.nchunks - 1], np.arange(5)]))
            out = np.zeros(pick.shape[0] * f.chunk_len, dtype=f.dtype)
            crcs, nbytes = f.read_many(pick, out)
            np.testing.assert_array_equal(crcs, m.crc[k, pick])
            assert nbytes == int(m.size[k, pick].sum())
            with quiet_numcodecs():  # the key array's Delta filter
                whole = f.array[...]
            C = f.chunk_len
            for j, c in enumerate(pick.tolist()):
                want = whole[c * C : (c + 1) * C]
                got = out[j * C : j * C + want.shape[0]]
                # the batched read leaves Delta's differences for its caller
                np.testing.assert_array_equal(np.cumsum(got, dtype=np.uint64) if f.delta else got, want)
    # one byte flipped inside a chunk body of mode 1's values
    shard = Path(store.path) / "fibers" / "m1" / "value" / "c" / "0"
    raw = bytearray(shard.read_bytes())
    raw[40] ^= 0xFF
    shard.write_bytes(bytes(raw))
    m = open_fiber_index(tfo.open_store(store.path)).mode(1)
    with pytest.raises(CorruptStoreError, match="chunk 0: CRC32C checksum mismatch"):
        m.read(np.arange(3))


def test_an_index_of_an_earlier_version_is_refused_by_name(tmp_path, rng):
    """A version-1 index (its Bloom filter one array, read whole) is refused with the rebuild
    command, not read with the blocked filter's layout."""
    from tensorflow_ooc.store.metadata import CHECKSUM_KEY, meta_checksum

    store, _, _ = _store(tmp_path, rng, 3)
    tfo.build_fiber_index(store, "all")
    meta_file = _meta_path(store)
    doc = json.loads(meta_file.read_text())
    meta = doc["attributes"]["fiber_index"]
    meta["version"] = 1
    meta[CHECKSUM_KEY] = meta_checksum(meta)
    meta_file.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match=r"version 1 is not supported.*fiber-index --overwrite"):
        open_fiber_index(tfo.open_store(store.path))


def test_a_store_replaced_at_the_same_path_is_read_anew(tmp_path, rng):
    """A store converted again over the same path (overwrite) in one process, then decomposed, is
    read as the new store, not the one this process opened before; an index rebuilt is too."""
    shape = (15, 12, 10)
    first = tfo.convert(random_coo(rng, shape, 900), tmp_path / "s", shape=shape)
    tfo.cp_als(first, 3, max_iters=2, seed=0)
    coords, values = random_coo(rng, shape, 1200)
    second = tfo.convert((coords, values), tmp_path / "s", shape=shape, overwrite=True)
    dense = np.zeros(shape)
    np.add.at(dense, tuple(coords.T), values)
    r = tfo.cp_als(second, 3, max_iters=3, seed=0)
    got = np.einsum("r,ir,jr,kr->ijk", r.weights, *r.factors)
    assert abs((1 - np.linalg.norm(dense - got) / np.linalg.norm(dense)) - r.fit) < 1e-8
    # sampled reads through an index built after the store was opened here
    tfo.build_fiber_index(second, "all")
    r = tfo.cp_als(str(second.path), 3, method="sts", samples=256, max_iters=2, seed=0, execution="streaming")
    assert all(v == "index" for v in r.params["sampled_reads"].values())


def test_chunks_follow_each_modes_mean_fiber_length(tmp_path, rng):
    from tensorflow_ooc.store.fiber_index import auto_chunk_nnz

    # one mean fiber a chunk (a power of two, 128..1024), 1024 where fibers average under 16 entries
    assert [auto_chunk_nnz(n, 1000) for n in (1000, 15_000, 20_000, 175_000, 300_000, 5_000_000)] == [
        1024,
        1024,
        128,
        128,
        256,
        1024,
    ]
    # more than a shard's entries, so the chunk is chosen at a write before the last
    shape = (600, 40, 25)
    coords, values = random_coo(rng, shape, 300_000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape)
    index = tfo.build_fiber_index(store, "all")
    # mode 0: 1,000 fibers of 300; mode 1: 15,000 of 20; mode 2: 24,000 of 12.5
    assert [index.mode(m).chunk_nnz for m in range(3)] == [256, 128, 1024]
    for mode in range(3):
        got = index.mode(mode).read(np.arange(index.mode(mode).nchunks))
        keys, rows, vals = _sorted_by_fiber(store, mode)
        assert np.array_equal(got.keys, keys) and np.array_equal(got.rows, rows) and np.array_equal(got.values, vals)
    # an explicit size is kept
    assert tfo.build_fiber_index(store, [1], chunk_nnz=512, overwrite=True).mode(1).chunk_nnz == 512


def test_a_reader_keeps_few_shard_files_open(tmp_path, rng, monkeypatch):
    from tensorflow_ooc.store import shard_files

    # shards of 64 entries (16 chunks of 4), at most 3 kept open: many rounds over many shards
    monkeypatch.setattr(shard_files, "SHARD_ENTRIES", 64)
    monkeypatch.setattr(shard_files, "MAX_OPEN_SHARDS", 3)
    shape = tuple(int(s) for s in rng.integers(15, 25, 3))
    coords, values = random_coo(rng, shape, 2000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=shape, chunk_nnz=512)
    index = tfo.build_fiber_index(store, [0], chunk_nnz=4)
    mode_index = index.mode(0)
    keys, rows, values = _sorted_by_fiber(store, 0)
    assert mode_index.nchunks == -(-store.nnz // 4) and mode_index.nchunks // 16 > 10
    for _ in range(5):
        chunks = np.unique(rng.integers(0, mode_index.nchunks, 40))
        got = mode_index.read(chunks)
        take = np.concatenate([np.arange(c * 4, min(store.nnz, c * 4 + 4)) for c in chunks])
        assert np.array_equal(got.keys, keys[take]) and np.array_equal(got.values, values[take])
        assert all(len(r._fds) <= 3 for r in mode_index._files)
