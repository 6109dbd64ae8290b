"""Zarr store: round trip, fsspec URLs, atomic writes, validation of corrupt and foreign stores."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import random_coo, sort_rows

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import (
    CorruptStoreError,
    ForeignStoreError,
    IncompleteStoreError,
    StoreError,
    StoreExistsError,
)
from tensorflow_ooc.ingest import BatchSource


def assert_same_tensor(store, coords, values):
    c, v = store.to_coo()
    a, b = sort_rows(coords, values), sort_rows(c, v)
    assert np.array_equal(a[0], b[0])
    assert np.array_equal(a[1], b[1])


@pytest.mark.parametrize("shape", [(30, 40, 50), (183, 24, 1140, 1717), (5, 6, 7, 8, 9, 10), (2**31, 2**31, 2**30, 7)])
def test_round_trip_local(tmp_path, rng, shape):
    coords, values = random_coo(rng, shape, 5000)
    s = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=777, max_block_nnz=500)
    s2 = tfo.open_store(tmp_path / "t.zarr")
    assert s2.shape == shape and s2.nnz == len(values) and s2.nmodes == len(shape)
    assert math.isclose(s2.norm(), float(np.linalg.norm(values)), rel_tol=1e-12)
    assert s2.nchunks == -(-len(values) // 777)
    assert (s2.blocks.count <= 500).all()
    assert_same_tensor(s2, coords, values)
    # chunks: ranges describe their decoded contents; blocks tile the store
    seen = 0
    for ch in s2.iter_chunks():
        c = ch.coords(s2.layout)
        assert np.array_equal(c.min(axis=0), ch.min) and np.array_equal(c.max(axis=0), ch.max)
        seen += len(ch.values)
    assert seen == s2.nnz
    assert sum(len(b.values) for b in s2.iter_blocks()) == s2.nnz
    assert s is not None


def test_memory_url(rng):
    coords, values = random_coo(rng, (20, 30, 40), 1000)
    url = f"memory://tfooc-test-{rng.integers(1 << 30)}"
    tfo.convert((coords, values), url, chunk_nnz=100)
    s = tfo.open_store(url)
    assert s.nnz == 1000 and s.disk_bytes() > 0
    assert_same_tensor(s, coords, values)


def test_float32_values_kept(tmp_path, rng):
    coords, values = random_coo(rng, (10, 20, 30), 500)
    s = tfo.convert((coords, values.astype(np.float32)), tmp_path / "f.zarr")
    assert s.value_dtype == np.float32
    assert_same_tensor(s, coords, values.astype(np.float32))


def test_compression_beats_raw(tmp_path, rng):
    from tensorflow_ooc import synthetic

    coords, _ = synthetic.heavy_tailed((183, 24, 1140, 1717), 200_000, seed=int(rng.integers(1000)))
    values = rng.random(len(coords))
    s = tfo.convert((coords, values), tmp_path / "c.zarr")
    info = s.info()
    assert info["compression_ratio"] <= 0.30, info


def _failing_batches(coords, values, fail_after):
    for i in range(0, len(coords), 100):
        if i >= fail_after:
            raise RuntimeError("simulated crash while reading input")
        yield coords[i : i + 100], values[i : i + 100]


@pytest.mark.parametrize("out_of_core", [False, True])
def test_failure_mid_write_leaves_nothing(tmp_path, rng, out_of_core):
    coords, values = random_coo(rng, (50, 60, 70), 1000)
    src = BatchSource(_failing_batches(coords, values, 600), 3, (50, 60, 70), 1000)
    with pytest.raises(RuntimeError, match="simulated crash"):
        tfo.convert(src, tmp_path / "t.zarr", out_of_core=out_of_core)
    assert os.listdir(tmp_path) == []


def test_failure_in_writer_leaves_nothing(tmp_path, rng, monkeypatch):
    from tensorflow_ooc.store import writer as W

    coords, values = random_coo(rng, (50, 60, 70), 5000)

    def boom(self):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(W.StoreWriter, "commit", lambda self: (self._flush(final=True), boom(self)))
    with pytest.raises(OSError, match="disk full"):
        tfo.convert((coords, values), tmp_path / "t.zarr", chunk_nnz=1000)
    assert os.listdir(tmp_path) == []


def test_existing_store_needs_overwrite(tmp_path, rng):
    coords, values = random_coo(rng, (5, 6, 7), 50)
    tfo.convert((coords, values), tmp_path / "t.zarr")
    with pytest.raises(StoreExistsError, match="overwrite"):
        tfo.convert((coords, values), tmp_path / "t.zarr")
    c2, v2 = random_coo(rng, (5, 6, 7), 60)
    tfo.convert((c2, v2), tmp_path / "t.zarr", overwrite=True)
    assert tfo.open_store(tmp_path / "t.zarr").nnz == 60
    assert sorted(os.listdir(tmp_path)) == ["t.zarr"]


@pytest.fixture
def good_store(tmp_path, rng):
    coords, values = random_coo(rng, (40, 50, 60), 3000)
    tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=1000, max_block_nnz=700)
    return tmp_path / "s.zarr"


def _edit_meta(path: Path, fn):
    meta_file = path / "zarr.json"
    doc = json.loads(meta_file.read_text())
    fn(doc["attributes"]["tensorflow_ooc"])
    meta_file.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (lambda m: m.update(format_version=99), StoreError, "version 99"),
        (lambda m: m.update(complete=False), IncompleteStoreError, "not completely written"),
        (lambda m: m.pop("complete"), IncompleteStoreError, "not completely written"),
        (lambda m: m.update(shape=[40, 50, 6000]), CorruptStoreError, "layout"),
        (lambda m: m.update(nnz=2999), CorruptStoreError, "nchunks|shape"),
        (lambda m: m.update(nblocks=3), CorruptStoreError, "blocks"),
        (lambda m: m.update(chunk_nnz=500), CorruptStoreError, "nchunks|chunks"),
        (lambda m: m.update(max_block_nnz=10), CorruptStoreError, "block table"),
        (lambda m: m.pop("norm_sq"), CorruptStoreError, "norm_sq"),
        (lambda m: m.update(format="coo"), ForeignStoreError, "not a tensorflow_ooc store"),
    ],
)
def test_corrupt_metadata_refused(good_store, edit, error, match):
    _edit_meta(good_store, edit)
    with pytest.raises(error, match=match):
        tfo.open_store(good_store)


def test_missing_array_refused(good_store):
    import shutil

    shutil.rmtree(good_store / "blocks" / "count")
    with pytest.raises(CorruptStoreError, match="blocks/count"):
        tfo.open_store(good_store)


def test_block_table_tampering_refused(good_store):
    g = zarr.open_group(str(good_store), mode="r+")
    start = g["blocks/start"][...]
    start[1] += 1
    g["blocks/start"][...] = start
    with pytest.raises(CorruptStoreError, match="block table"):
        tfo.open_store(good_store)


def test_corrupt_chunk_bytes_detected(good_store):
    chunk = good_store / "alto" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    s = tfo.open_store(good_store)  # metadata is fine
    with pytest.raises(CorruptStoreError, match="alto.*chunk"):
        s.to_coo()


def test_chunk_contents_checked_against_ranges(good_store):
    g = zarr.open_group(str(good_store), mode="r+")
    mx = g["chunks/max"][...]
    mx[0, 0] -= 1
    g["chunks/max"][...] = mx
    s = tfo.open_store(good_store)
    with pytest.raises(CorruptStoreError, match="chunk 0"):
        list(s.iter_chunks())


def test_foreign_and_missing(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        tfo.open_store(tmp_path / "nothing")
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").attrs["hello"] = 1
    with pytest.raises(ForeignStoreError, match="not a tensorflow_ooc store"):
        tfo.open_store(tmp_path / "other.zarr")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file.txt").write_text("hi")
    with pytest.raises(ForeignStoreError):
        tfo.open_store(tmp_path / "dir")
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(ForeignStoreError):
        tfo.open_store(tmp_path / "plain.txt")


def test_partial_directory_never_opens(tmp_path, rng):
    """A writer killed before commit leaves only a hidden staging directory, which is not a store."""
    from tensorflow_ooc.format import BitLayout, alto_words, sort_alto
    from tensorflow_ooc.store import StoreWriter

    coords, values = random_coo(rng, (10, 20, 30), 500)
    layout = BitLayout((10, 20, 30))
    keys, vals = sort_alto(alto_words(coords, layout), values.copy(), layout.total_bits)
    w = StoreWriter(tmp_path / "t.zarr", layout, np.float64, 500, chunk_nnz=100)
    w.append(keys, vals)
    w._flush(final=True)
    assert not (tmp_path / "t.zarr").exists()
    staging = [p for p in tmp_path.iterdir()]
    assert len(staging) == 1 and staging[0].name.startswith(".t.zarr.partial")
    with pytest.raises((IncompleteStoreError, ForeignStoreError)):
        tfo.open_store(staging[0])
    w.abort()
    assert list(tmp_path.iterdir()) == []
