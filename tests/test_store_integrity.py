"""Chunks bound to their positions: moved, swapped, copied or missing chunks are refused.

Each chunk carries a valid CRC32C of its own bytes, so these damages pass the per-chunk check; the
store records every chunk's checksum per position when it is written, and readers compare."""

import json
import shutil

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import CorruptStoreError

SHAPE = (30, 40, 50)


@pytest.fixture(params=["fast", "fast-counts", "none"])
def store_path(tmp_path, rng, request):
    """A store of compressed chunks (with random float values, which the default profile stores
    raw and streaming maps, or with counts, compressed too), or of raw ones (compression "none",
    which streaming maps)."""
    coords, values = random_coo(rng, SHAPE, 1000)
    if request.param == "fast-counts":
        values = rng.integers(1, 5, values.shape[0]).astype(np.float64)
    tfo.convert(
        (coords, values), tmp_path / "a.zarr", shape=SHAPE, chunk_nnz=200, compression=request.param.split("-")[0]
    )
    return tmp_path / "a.zarr"


def chunk(path, name, c):
    return path / name / "c" / str(c)


def swap(path, name, a, b):
    pa, pb = chunk(path, name, a), chunk(path, name, b)
    tmp = pa.with_suffix(".swap")
    pa.rename(tmp)
    pb.rename(pa)
    tmp.rename(pb)


@pytest.mark.parametrize("name", ["alto", "values"])
def test_swapped_chunks_refused(store_path, name):
    swap(store_path, name, 0, 1)
    with pytest.raises(CorruptStoreError, match=f"chunk 0 of '{name}' does not belong at this position"):
        tfo.open_store(store_path)


@pytest.mark.parametrize("name", ["alto", "values"])
def test_chunk_copied_over_another_refused(store_path, name):
    shutil.copyfile(chunk(store_path, name, 1), chunk(store_path, name, 3))
    with pytest.raises(CorruptStoreError, match=f"chunk 3 of '{name}' does not belong"):
        tfo.open_store(store_path)


@pytest.mark.parametrize("name", ["alto", "values"])
def test_missing_chunk_refused(store_path, name):
    chunk(store_path, name, 2).unlink()
    with pytest.raises(CorruptStoreError, match=f"chunk 2 of '{name}' is missing"):
        tfo.open_store(store_path)


def test_chunk_from_another_store_of_the_same_shape_refused(store_path, tmp_path, rng):
    coords, values = random_coo(rng, SHAPE, 1000)
    tfo.convert((coords, values), tmp_path / "b.zarr", shape=SHAPE, chunk_nnz=200)
    shutil.copyfile(chunk(tmp_path / "b.zarr", "values", 1), chunk(store_path, "values", 1))
    with pytest.raises(CorruptStoreError, match="chunk 1 of 'values' does not belong"):
        tfo.open_store(store_path)


def test_damage_after_open_is_refused_on_every_read_path(store_path, rng):
    """A store opened intact and damaged afterwards: streaming, chunk reads and MTTKRP refuse it."""
    from tensorflow_ooc.execution.stream import release_buffers, stream_batches

    s = tfo.open_store(store_path)
    swap(store_path, "values", 1, 2)
    release_buffers()
    with pytest.raises(CorruptStoreError, match="chunk 1 of 'values'"):
        list(stream_batches(s, 0, s.nchunks))
    with pytest.raises(CorruptStoreError, match="chunk 1 of 'values'"):
        s.read_chunk(1)
    factors = [rng.random((n, 3)) for n in SHAPE]
    with pytest.raises(CorruptStoreError, match="chunk 1 of 'values'"):
        tfo.mttkrp(s, factors, 0)


def test_url_store_checks_positions_when_reading(rng):
    coords, values = random_coo(rng, SHAPE, 600)
    import fsspec

    tfo.convert((coords, values), "memory://integrity-url", shape=SHAPE, chunk_nnz=200)
    fsspec.filesystem("memory").rm("/integrity-url/values/c/1")
    s = tfo.open_store("memory://integrity-url")  # URL stores are checked per chunk read
    with pytest.raises(CorruptStoreError, match="chunk 1 of 'values' is missing"):
        s.to_coo()


def test_absent_chunks_and_stores_without_the_table_still_open(tmp_path):
    # a single nonzero at the origin: its index chunk is all zeros, which Zarr does not store
    s = tfo.convert((np.zeros((1, 3), dtype=np.int64), np.array([2.0])), tmp_path / "z.zarr", shape=(4, 5, 6))
    assert s.chunk_checksums["alto"][0] == -1
    c, v = tfo.open_store(tmp_path / "z.zarr").to_coo()
    assert c.tolist() == [[0, 0, 0]] and v.tolist() == [2.0]
    # stores written before the table open and read as before (no position check to make); they
    # predate the metadata checksums too. Without that, a current store whose tables were
    # deleted is refused: its arrays no longer match its checksum
    shutil.rmtree(tmp_path / "z.zarr" / "chunks" / "crc_alto")
    shutil.rmtree(tmp_path / "z.zarr" / "chunks" / "crc_values")
    with pytest.raises(CorruptStoreError, match="arrays"):
        tfo.open_store(tmp_path / "z.zarr")
    meta_file = tmp_path / "z.zarr" / "zarr.json"
    doc = json.loads(meta_file.read_text())
    for key in ("checksum", "arrays_checksum"):
        del doc["attributes"]["tensorflow_ooc"][key]
    meta_file.write_text(json.dumps(doc))
    old = tfo.open_store(tmp_path / "z.zarr")
    assert old.chunk_checksums is None and old.to_coo()[1].tolist() == [2.0]


@pytest.mark.parametrize("name", ["alto", "values"])
def test_raw_chunk_damaged_in_place_refused_mapped_or_read(tmp_path, rng, name):
    """Compression "none": streaming maps the raw chunks once they are profiled, with the same
    results as in memory; a flipped byte inside a raw chunk then fails its CRC32C."""
    from tensorflow_ooc.execution.stream import _mapped_items, release_buffers

    coords, values = random_coo(rng, SHAPE, 1000)
    s = tfo.convert((coords, values), tmp_path / "r.zarr", shape=SHAPE, chunk_nnz=200, compression="none")
    assert s.mappable and not tfo.convert((coords, values), tmp_path / "f.zarr", shape=SHAPE).mappable
    factors = [rng.random((n, 3)) for n in SHAPE]
    t = tfo.encode_coo(coords, values, SHAPE)
    for _ in range(2):  # the first pass reads and profiles every chunk, the second maps them
        for m in range(3):
            np.testing.assert_allclose(tfo.mttkrp(s, factors, m), tfo.mttkrp(t, factors, m), rtol=1e-12, atol=1e-12)
    assert all(_mapped_items(s, c) is not None for c in range(s.nchunks))
    # the mappings are kept between passes, and a kept one is dropped when its file changes
    assert all(files._kept == s.nchunks for files in s._chunk_files)
    with open(chunk(tmp_path / "r.zarr", name, 2), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x40]))
    release_buffers()
    with pytest.raises(CorruptStoreError, match="chunk 2: CRC32C checksum mismatch"):
        tfo.mttkrp(s, factors, 0)
