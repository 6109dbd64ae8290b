"""Generation and conversion at scale: the parallel generator, sorted-run conversion, temporary
disk, stale temporaries of killed runs, and stores with more than 64 index bits."""

import json
import logging
import os
import subprocess
import sys
import threading
import time

import numba as nb
import numpy as np
import pytest
import zarr

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic, tempdirs
from tensorflow_ooc.cli import main
from tensorflow_ooc.errors import DuplicateError, IngestError
from tensorflow_ooc.format import BitLayout, alto_words, coords_from_words
from tensorflow_ooc.format.bits import _pdep_portable, pdep
from tensorflow_ooc.format.merge import merge_runs
from tensorflow_ooc.format.radix_sort import sort_keys
from tensorflow_ooc.ingest import AltoRunSource, BatchSource
from tensorflow_ooc.store import paths

AMAZON = synthetic.PRESETS["amazon"][0]


def lexsorted(keys):
    """Columns of multi-word keys in ascending order (stable), by NumPy."""
    return keys[:, np.lexsort(keys)]


def random_keys(rng, n, total_bits):
    nwords = max(1, -(-total_bits // 64))
    keys = np.zeros((nwords, n), dtype=np.uint64)
    for w in range(nwords):
        bits = min(64, total_bits - 64 * w)
        keys[w] = rng.integers(0, 2**bits - 1, n, dtype=np.uint64, endpoint=True)
    return keys


def with_threads(n, fn):
    old = nb.get_num_threads()
    nb.set_num_threads(n)
    try:
        return fn()
    finally:
        nb.set_num_threads(old)


# --- building blocks ----------------------------------------------------------------------------


@pytest.mark.parametrize("total_bits", [5, 35, 64, 65, 80, 130])
def test_sort_keys_matches_lexsort(rng, total_bits):
    for n in (0, 1, 31, 1000, 200_000):
        keys = random_keys(rng, n, total_bits)
        if n > 10:
            keys[:, n // 2 : n // 2 + 5] = keys[:, :5]  # repeats
        assert np.array_equal(sort_keys(keys.copy(), total_bits), lexsorted(keys))


def test_pdep_matches_portable(rng):
    x = rng.integers(0, 2**63, 1000, dtype=np.uint64)
    m = rng.integers(0, 2**63, 1000, dtype=np.uint64) | np.uint64(1 << 63)

    @nb.njit
    def both(x, m):
        a = np.empty_like(x)
        b = np.empty_like(x)
        for i in range(x.shape[0]):
            a[i] = pdep(x[i], m[i])
            b[i] = _pdep_portable(x[i], m[i])
        return a, b

    a, b = both(x, m)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("nwords", [1, 2, 3])
def test_merge_runs_is_a_stable_merge(rng, nwords):
    n = 60_000
    keys = np.zeros((nwords, n), dtype=np.uint64)
    keys[0] = rng.integers(0, 5000, n)  # many repeats across runs
    if nwords > 1:
        keys[1:] = rng.integers(0, 3, (nwords - 1, n))
    bounds = np.unique(np.concatenate([[0, n], rng.integers(0, n, int(rng.integers(2, 40)))]))
    for r in range(len(bounds) - 1):
        s, e = bounds[r], bounds[r + 1]
        keys[:, s:e] = lexsorted(keys[:, s:e])
    values = np.arange(n, dtype=np.float64)  # the position: shows the order of equal keys
    order = np.lexsort(keys)  # stable: equal keys keep run order
    for threads in (1, 2):
        k, v = with_threads(threads, lambda: merge_runs(keys, bounds, values))
        assert np.array_equal(k, keys[:, order]) and np.array_equal(v, values[order])
    k, v = merge_runs(keys, bounds)
    assert v is None and np.array_equal(k, keys[:, order])
    with pytest.raises(ValueError, match="rise from 0"):
        merge_runs(keys, np.array([0, n + 1]))


# --- the generator ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [AMAZON, (50, 40, 30), (183, 24, 1140, 1717), (2**40, 3, 2**40)])
def test_generator_same_tensor_whatever_the_thread_count(rng, shape):
    seed = int(rng.integers(1 << 30))
    nnz = 30_000

    def run():
        g = synthetic.HeavyTailedGenerator(shape, nnz, seed=seed, batch_nnz=7000)
        parts = list(g.runs())
        return np.concatenate([k for k, _ in parts], axis=1), np.concatenate([v for _, v in parts]), parts

    k1, v1, _ = with_threads(1, run)
    k2, v2, parts = with_threads(2, run)
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    layout = BitLayout(shape)
    coords = coords_from_words(k2, layout)
    assert coords.shape == (nnz, len(shape))
    assert len(np.unique(coords, axis=0)) == nnz  # distinct across batches
    assert (coords >= 0).all() and (coords < np.array(shape)).all()
    for k, _ in parts:  # each batch a sorted run
        assert np.array_equal(k, lexsorted(k))
    assert np.array_equal(alto_words(coords, layout), k2)
    assert (v2 > 0).all() and (v2 <= 1).all()
    other = synthetic.HeavyTailedGenerator(shape, nnz, seed=seed + 1, batch_nnz=7000)
    assert not np.array_equal(np.concatenate([k for k, _ in other.runs()], axis=1), k2)


def test_values_are_a_function_of_the_cell(rng):
    g = synthetic.HeavyTailedGenerator(AMAZON, 5000, seed=int(rng.integers(1 << 30)), values="count")
    keys, vals = next(g.runs())
    perm = rng.permutation(keys.shape[1])
    assert np.array_equal(g.values_of(keys[:, perm]), vals[perm])
    assert (vals >= 1).all() and np.array_equal(vals, np.round(vals))
    normal = synthetic.HeavyTailedGenerator(AMAZON, 20_000, seed=1, values="normal")
    v = np.concatenate([v for _, v in normal.runs()])
    assert abs(v.mean()) < 0.05 and 0.95 < v.std() < 1.05


# --- conversion of sorted runs -------------------------------------------------------------------


def _generated(shape, nnz, seed, batch_nnz=4000):
    g = synthetic.HeavyTailedGenerator(shape, nnz, seed=seed, batch_nnz=batch_nnz)
    coords, values = synthetic.heavy_tailed(shape, nnz, seed=seed)  # same tensor through coordinates
    return g, coords, values


@pytest.mark.parametrize("out_of_core", [False, True])
def test_runs_convert_like_coordinates(tmp_path, rng, out_of_core):
    shape, nnz = (183, 24, 1140, 1717), 20_000
    seed = int(rng.integers(1 << 30))
    g = synthetic.HeavyTailedGenerator(shape, nnz, seed=seed, batch_nnz=3000)
    src = AltoRunSource(g.runs(with_values=False), shape, nnz, values_of=g.values_of)
    # sort_nnz 2500: several buckets, and buckets above the capacity split again (runs stay runs)
    s = tfo.convert(src, tmp_path / "runs.zarr", out_of_core=out_of_core, sort_nnz=2500, chunk_nnz=4096)
    parts = list(synthetic.iter_heavy_tailed(shape, nnz, seed=seed, batch_nnz=3000))
    ref = tfo.convert(BatchSource(iter(parts), 4, shape, nnz), tmp_path / "ref.zarr", chunk_nnz=4096)
    c, v = s.to_coo()
    rc, rv = ref.to_coo()
    assert np.array_equal(c, rc) and np.array_equal(v, rv)
    assert s.nnz == nnz and s.info()["blocks"] == ref.info()["blocks"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporaries left


def test_runs_with_values_and_duplicates_across_runs(tmp_path):
    layout = BitLayout((10, 10, 10))
    c1 = np.array([[0, 0, 1], [2, 3, 4], [9, 9, 9]])
    c2 = np.array([[2, 3, 4], [5, 5, 5]])
    runs = [(lexsorted(alto_words(c, layout)), None) for c in (c1, c2)]
    # values follow the sorted keys: give them through coordinates of the sorted words
    runs = [(k, coords_from_words(k, layout).sum(axis=1).astype(float)) for k, _ in runs]
    for ooc in (False, True):
        with pytest.raises(DuplicateError, match=r"\(2, 3, 4\)"):
            tfo.convert(AltoRunSource(iter(runs), layout.shape, 5), tmp_path / f"e{ooc}.zarr", out_of_core=ooc)
        s = tfo.convert(
            AltoRunSource(iter(runs), layout.shape, 5),
            tmp_path / f"s{ooc}.zarr",
            duplicates="sum",
            out_of_core=ooc,
            sort_nnz=1024,
        )
        c, v = s.to_coo()
        assert s.nnz == 4 and dict(zip(map(tuple, c.tolist()), v.tolist()))[(2, 3, 4)] == 18.0


def test_bad_runs_are_refused(tmp_path):
    layout = BitLayout((10, 10, 10))
    keys = alto_words(np.array([[1, 1, 1], [0, 0, 0]]), layout)  # descending
    with pytest.raises(IngestError, match="not ascending"):
        tfo.convert(AltoRunSource(iter([(keys, np.ones(2))]), layout.shape, 2), tmp_path / "a.zarr")
    with pytest.raises(IngestError, match="needs values_of"):
        tfo.convert(AltoRunSource(iter([(keys[:, ::-1].copy(), None)]), layout.shape, 2), tmp_path / "b.zarr")
    with pytest.raises(tfo.ShapeError, match="uint64 ALTO words"):
        tfo.convert(AltoRunSource(iter([(keys.astype(np.int64), np.ones(2))]), layout.shape, 2), tmp_path / "c.zarr")
    assert not os.path.exists(tmp_path / "a.zarr")


# --- temporary disk ----------------------------------------------------------------------------


class DirPeak:
    """Polls the bytes of temporary entries (bucket folders, staging stores) under a folder."""

    def __init__(self, folder):
        self.folder = str(folder)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = 0
            for name in os.listdir(self.folder):
                if name.startswith(".tfooc-buckets-"):
                    for root, _, files in os.walk(os.path.join(self.folder, name)):
                        for f in files:
                            try:
                                total += os.path.getsize(os.path.join(root, f))
                            except OSError:
                                pass
            self.peak = max(self.peak, total)
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_generate_out_of_core_temp_disk_below_store(tmp_path, caplog):
    out = tmp_path / "amazon.zarr"
    caplog.set_level(logging.INFO, logger="tensorflow_ooc")
    g = synthetic.HeavyTailedGenerator(AMAZON, 300_000, seed=3, batch_nnz=50_000)
    src = AltoRunSource(g.runs(with_values=False), AMAZON, g.nnz, values_of=g.values_of, name="synthetic generator")
    with DirPeak(tmp_path) as peak:
        store = tfo.convert(src, out, out_of_core=True, sort_nnz=40_000)
    assert store.nnz == 300_000
    line = next(r.getMessage() for r in caplog.records if "bytes per nonzero" in r.getMessage())
    spilled = float(line.split(" bytes per nonzero")[0].rsplit(" ", 1)[1])
    assert spilled < 1.5 * store.info()["bytes_per_nnz"]
    assert 0 < peak.peak <= 1.5 * paths.disk_bytes(out)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]
    print(
        f"spilled {spilled:.2f} B/nnz, peak {peak.peak / store.nnz:.2f} B/nnz, "
        f"store {store.info()['bytes_per_nnz']:.2f}"
    )


def test_text_convert_out_of_core_temp_disk(tmp_path):
    shape = (2000, 3000, 4000)
    tns = tmp_path / "t.tns"
    synthetic.write_tns(tns, synthetic.iter_heavy_tailed(shape, 100_000, seed=5))
    with DirPeak(tmp_path) as peak:
        s = tfo.convert(tns, tmp_path / "t.zarr", shape=shape, out_of_core=True, sort_nnz=20_000)
    assert s.nnz == 100_000
    assert 0 < peak.peak <= 1.5 * paths.disk_bytes(tmp_path / "t.zarr")


# --- more than 64 index bits ------------------------------------------------------------------


def test_amazon_shape_store_needs_block_keys_and_mttkrp_matches_numpy(tmp_path, rng):
    """Amazon's shape needs 65 index bits: generate -> store (out of core) -> MTTKRP every mode,
    checked against NumPy on the coordinates."""
    out = tmp_path / "amazon.zarr"
    seed = int(rng.integers(1 << 30))
    assert main(["-q", "generate", str(out), "--like", "amazon", "--nnz", "4000", "--seed", str(seed)]) == 0
    store = tfo.open_store(out)
    assert store.shape == AMAZON and store.nnz == 4000
    assert store.layout.total_bits == 65 and store.layout.nwords == 2
    coords, values = store.to_coo()
    ref_coords, ref_values = synthetic.heavy_tailed(AMAZON, 4000, seed=seed)
    o1, o2 = np.lexsort(coords.T), np.lexsort(ref_coords.T)
    assert np.array_equal(coords[o1], ref_coords[o2]) and np.array_equal(values[o1], ref_values[o2])
    # a bucketed copy of the same tensor agrees chunk for chunk
    ooc = tfo.convert(
        store.to_coo(), tmp_path / "ooc.zarr", shape=AMAZON, out_of_core=True, sort_nnz=1024, chunk_nnz=512
    )
    assert ooc.info()["blocks"] >= 2
    rank = 3
    factors = [rng.random((L, rank)) for L in AMAZON]
    for mode in range(3):
        expected = np.zeros((AMAZON[mode], rank))
        prod = values[:, None] * np.prod([factors[m][coords[:, m]] for m in range(3) if m != mode], axis=0)
        np.add.at(expected, coords[:, mode], prod)
        rows = np.unique(coords[:, mode])
        for s in (store, ooc):
            got = tfo.mttkrp(s, factors, mode)
            assert np.allclose(got[rows], expected[rows], rtol=1e-12, atol=0)
            assert not got[np.setdiff1d(np.arange(0, AMAZON[mode], 997), rows)].any()
        del expected


# --- direct chunk writes --------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["fast", "small", "none"])
@pytest.mark.parametrize("values", ["uniform", "count"])
def test_direct_chunk_writes_are_the_bytes_zarr_writes(tmp_path, rng, compression, values, monkeypatch):
    from tensorflow_ooc.store import writer

    coords, vals = synthetic.heavy_tailed((183, 24, 1140, 1717), 10_000, seed=int(rng.integers(1 << 30)), values=values)
    a = tfo.convert((coords, vals), tmp_path / "direct.zarr", chunk_nnz=2048, compression=compression)
    monkeypatch.setattr(writer.DirectChunkWriter, "for_array", classmethod(lambda cls, arr: None))
    b = tfo.convert((coords, vals), tmp_path / "zarr.zarr", chunk_nnz=2048, compression=compression)
    for name in ("alto", "values"):
        files = sorted(os.listdir(tmp_path / "zarr.zarr" / name / "c"))
        assert len(files) == 5 and files == sorted(os.listdir(tmp_path / "direct.zarr" / name / "c"))
        for f in files:
            assert (tmp_path / "direct.zarr" / name / "c" / f).read_bytes() == (
                tmp_path / "zarr.zarr" / name / "c" / f
            ).read_bytes()
    assert np.array_equal(zarr.open_group(a.path)["chunks/crc_alto"][:], zarr.open_group(b.path)["chunks/crc_alto"][:])


# --- stale temporaries of killed runs ------------------------------------------------------------


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def live_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p.pid
    p.kill()
    p.wait()


def fake_bucket_dir(parent, pid, host=None, nbytes=10_000):
    host = host or tempdirs.host_tag()
    d = parent / f".tfooc-buckets-{host}-{pid}-abcd1234"
    d.mkdir()
    (d / "b00000.bin").write_bytes(os.urandom(nbytes))
    started = time.time() - 5 if pid != os.getpid() else None
    (d / tempdirs.OWNER_FILE).write_text(json.dumps({"pid": pid, "host": host, "process_started": started}))
    return d


def test_stale_bucket_folder_of_a_dead_run_is_removed_on_the_next_run(tmp_path, caplog, live_pid):
    dead = fake_bucket_dir(tmp_path, dead_pid())
    caplog.set_level(logging.INFO, logger="tensorflow_ooc")
    # a live owner started before its folder: an active conversion, kept
    live = tmp_path / f".tfooc-buckets-{tempdirs.host_tag()}-{live_pid}-beef0001"
    live.mkdir()
    (live / tempdirs.OWNER_FILE).write_text(
        json.dumps({"pid": live_pid, "host": tempdirs.host_tag(), "process_started": time.time() + 60})
    )
    elsewhere = fake_bucket_dir(tmp_path, 4242, host="otherhost")
    assert main(["-q", "generate", str(tmp_path / "t.zarr"), "--shape", "30,40,50", "--nnz", "500"]) == 0
    assert not dead.exists()
    assert live.exists() and elsewhere.exists()
    assert f"removed stale temporary bucket folder {dead}" in caplog.text and "is no longer running" in caplog.text
    assert f"kept temporary bucket folder {live}" in caplog.text and f"pid {live_pid} is still running" in caplog.text
    assert "on host otherhost" in caplog.text


def test_stale_entries_classified(tmp_path, live_pid):
    dead = dead_pid()
    host = tempdirs.host_tag()
    entries = {
        "dead_tns": tmp_path / f"x.tns.partial-{host}-{dead}",
        "live_tns": tmp_path / f"y.tns.partial-{host}-{live_pid}",
        "legacy_tns": tmp_path / f"z.tns.partial-{dead}",
        "dead_store": tmp_path / f".s.zarr.partial-{host}-{dead}-0123456789ab",
        "legacy_store": tmp_path / ".old.zarr.partial-0123456789ab",
        "fresh_legacy_store": tmp_path / ".new.zarr.partial-ba9876543210",
        "trash": tmp_path / ".s.zarr.old-0123456789ab",
        "unrelated": tmp_path / "notes.partial-12",
        "reused_pid": tmp_path / f"w.tns.partial-{host}-{live_pid}-ab",
    }
    for name, p in entries.items():
        if "store" in name or name == "trash":
            p.mkdir()
            (p / "zarr.json").write_text("{}")
        else:
            p.write_bytes(b"1 1 1 1.0\n")
    old = time.time() - 2 * tempdirs.LEGACY_STALE_SECONDS
    for name in ("legacy_store", "trash"):
        for f in (entries[name] / "zarr.json", entries[name]):
            os.utime(f, (old, old))
    # written before its pid's process started: the pid was reused, the owner is gone
    os.utime(entries["reused_pid"], (old, old))
    os.utime(entries["live_tns"], (time.time() + 3600, time.time() + 3600))
    found = {os.path.basename(e.path): e for e in tempdirs.clean_stale(tmp_path)}
    gone = {name for name, p in entries.items() if not p.exists()}
    assert gone == {"dead_tns", "legacy_tns", "dead_store", "legacy_store", "trash", "reused_pid"}
    assert found[entries["live_tns"].name].action == "kept"
    assert found[entries["fresh_legacy_store"].name].action == "kept"
    assert entries["unrelated"].name not in found


def test_write_tns_partial_name_and_cleanup(tmp_path):
    stale = tmp_path / f"a.tns.partial-{tempdirs.host_tag()}-{dead_pid()}"
    stale.write_bytes(b"junk")
    seen = []

    def batches():
        seen.extend(p for p in os.listdir(tmp_path) if ".partial-" in p)
        yield np.array([[0, 0]]), np.array([1.0])

    synthetic.write_tns(tmp_path / "b.tns", batches())
    assert not stale.exists()
    assert seen == [f"b.tns.partial-{tempdirs.owner_suffix()}"]


def test_killed_generate_leaves_folder_that_next_run_removes(tmp_path):
    """A real run killed mid-way (SIGKILL) leaves its bucket folder; the next one removes it."""
    out = tmp_path / "g.zarr"
    code = (
        "import sys; from tensorflow_ooc.cli import main; "
        f"sys.exit(main(['-q', 'generate', {str(out)!r}, '--like', 'amazon', '--nnz', '2e7', "
        "'--memory-limit', '700MB']))"
    )
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "NUMBA_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            buckets = [n for n in os.listdir(tmp_path) if n.startswith(".tfooc-buckets-")]
            if buckets and any(f.endswith(".bin") for f in os.listdir(tmp_path / buckets[0])):
                break
            assert p.poll() is None, "the run ended before it spilled anything"
            time.sleep(0.05)
        else:
            pytest.fail("no bucket folder appeared")
    finally:
        p.kill()
        p.wait()
    left = tmp_path / buckets[0]
    assert left.exists() and str(p.pid) in left.name
    assert main(["-q", "generate", str(out), "--shape", "30,40,50", "--nnz", "100"]) == 0
    assert not left.exists()


def test_generated_store_is_the_same_with_one_or_two_threads(tmp_path):
    """End to end, in fresh processes: the chunks of an out-of-core generated store are
    byte-identical whatever NUMBA_NUM_THREADS is."""
    for threads in (1, 2):
        code = (
            "import sys; from tensorflow_ooc.cli import main; "
            f"sys.exit(main(['-q', 'generate', {str(tmp_path / f't{threads}.zarr')!r}, '--like', 'amazon', "
            "'--nnz', '200000', '--seed', '11', '--out-of-core']))"
        )
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "NUMBA_NUM_THREADS": str(threads)})
    for name in ("alto", "values"):
        files = sorted(os.listdir(tmp_path / "t1.zarr" / name / "c"))
        assert files and files == sorted(os.listdir(tmp_path / "t2.zarr" / name / "c"))
        for f in files:
            assert (tmp_path / "t1.zarr" / name / "c" / f).read_bytes() == (
                tmp_path / "t2.zarr" / name / "c" / f
            ).read_bytes()
