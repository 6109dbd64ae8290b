"""Format version 2's index encodings (delta32 with patches, delta64) and version-1 stores.

Version-1 stores here were written by the version-1 code (tests/data/make_v1_stores.py at
c150c2a), with the coordinates they hold beside them: they are read, streamed and rewritten.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import CorruptStoreError
from tensorflow_ooc.execution.stream import BatchBuffers, fill_batch, release_buffers

DATA = Path(__file__).parent / "data"
V1 = ["v1_fast_4d", "v1_none_5d_blocks"]


def _reference_mttkrp(coords, values, factors, mode):
    """Independent MTTKRP: one Khatri-Rao row per nonzero, added into its output row (NumPy)."""
    R = factors[0].shape[1]
    rows = values[:, None] * np.ones((values.shape[0], R))
    for m, A in enumerate(factors):
        if m != mode:
            rows *= A[coords[:, m]]
    out = np.zeros((factors[mode].shape[0], R))
    np.add.at(out, coords[:, mode], rows)
    return out


def _check_mttkrp(store, coords, values, rng, rank=16):
    factors = [rng.standard_normal((s, rank)) for s in store.shape]
    for mode in range(store.nmodes):
        got = tfo.mttkrp(store, factors, mode)
        want = _reference_mttkrp(coords, values, factors, mode)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


def _sorted(coords, values):
    order = np.lexsort(coords.T[::-1])
    return coords[order], values[order]


@pytest.mark.parametrize("name", V1)
def test_version_1_store_opens_streams_and_rewrites(tmp_path, rng, name):
    ref = np.load(DATA / f"{name}.npz")
    coords, values = ref["coords"], ref["values"]
    old = tfo.open_store(DATA / f"{name}.zarr")
    assert old.meta["format_version"] == 1 and old.index_encoding == "delta64"
    got_c, got_v = _sorted(*old.to_coo())
    want_c, want_v = _sorted(coords, values)
    np.testing.assert_array_equal(got_c, want_c)
    np.testing.assert_array_equal(got_v, want_v)
    release_buffers()
    _check_mttkrp(old, coords, values, rng)

    new = tfo.rewrite(old, tmp_path / "new.zarr")
    assert new.meta["format_version"] == 2
    assert new.meta["source"]["rewritten_from"]["format_version"] == 1
    assert new.meta["compression"] == old.meta["compression"] and new.chunk_nnz == old.chunk_nnz
    # the 5-mode store is hypersparse (73 bits): its gaps stay 64-bit
    assert new.index_encoding == ("delta32" if name == "v1_fast_4d" else "delta64")
    np.testing.assert_array_equal(_sorted(*new.to_coo())[0], want_c)
    np.testing.assert_array_equal(_sorted(*new.to_coo())[1], want_v)
    assert new.norm() == pytest.approx(old.norm(), rel=1e-14)
    release_buffers()
    _check_mttkrp(new, coords, values, rng)


def test_rewrite_from_the_command_line(tmp_path):
    src = tmp_path / "old.zarr"
    shutil.copytree(DATA / "v1_fast_4d.zarr", src)
    cli = [sys.executable, "-m", "tensorflow_ooc.cli"]
    out = tmp_path / "new.zarr"
    r = subprocess.run(
        [*cli, "convert", "--rewrite", str(src), str(out), "--compression", "small"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "format v2, index delta32, small" in r.stdout
    s = tfo.open_store(out)
    assert s.meta["compression"] == "small" and s.nnz == 3000
    info = subprocess.run([*cli, "info", str(out)], capture_output=True, text=True)
    assert "stored delta32" in info.stdout
    # onto itself, or onto an existing store without --overwrite: an error, no traceback
    for target in (src, out):
        r = subprocess.run([*cli, "convert", "--rewrite", str(src), str(target)], capture_output=True, text=True)
        assert r.returncode != 0 and "Traceback" not in r.stderr and str(target) in r.stderr
    assert tfo.open_store(src).meta["format_version"] == 1  # the source untouched


@pytest.mark.parametrize("nmodes", [3, 6])
@pytest.mark.parametrize("compression", ["fast", "none"])
def test_delta32_patches_inside_blocks(tmp_path, rng, nmodes, compression):
    """Hypersparse data forced into delta32: most gaps are patches, many inside a block and a
    chunk; every patch starts a work item, and streamed MTTKRP (the kernels sum differences
    along items) equals the NumPy reference in every mode."""
    shape = tuple(int(x) for x in rng.integers(1 << 14, 1 << 17, nmodes))
    coords, values = random_coo(rng, shape, 3000)
    s = tfo.convert(
        (coords, values), tmp_path / "s.zarr", chunk_nnz=1024, compression=compression, index_encoding="delta32"
    )
    assert s.index_encoding == "delta32" and np.dtype(s.root["alto"].dtype) == np.uint32
    pos, _ = s.patches
    assert pos.size > s.nchunks + 100  # gaps of 2^32 and more, not only the chunk starts
    release_buffers()
    items = fill_batch(s, range(s.nchunks), BatchBuffers(s, s.nchunks, index_dtype=np.uint32), delta=True)
    assert items.index.dtype == np.uint32
    assert np.isin(pos, items.start).all()  # no item spans a patch
    _check_mttkrp(s, coords, values, rng)
    got_c, got_v = _sorted(*s.to_coo())
    np.testing.assert_array_equal(got_c, _sorted(coords, values)[0])
    # the GPU path's widened staging decodes to the same words
    wide = fill_batch(s, range(s.nchunks), BatchBuffers(s, s.nchunks), delta=True)
    assert wide.index.dtype == np.uint64
    np.testing.assert_array_equal(wide.index, items.index)
    np.testing.assert_array_equal(wide.prev, items.prev)


def test_encoding_is_chosen_from_the_data(tmp_path, rng):
    dense_ish, _ = random_coo(rng, (60, 70, 80, 90), 4000)
    a = tfo.convert((dense_ish, np.ones(len(dense_ish))), tmp_path / "a.zarr", chunk_nnz=1000)
    assert a.index_encoding == "delta32" and a.patches[0].tolist() == [0, 1000, 2000, 3000]
    hyper, _ = random_coo(rng, (1 << 30, 1 << 30, 1 << 30), 4000)
    b = tfo.convert((hyper, np.ones(len(hyper))), tmp_path / "b.zarr", chunk_nnz=1000)
    assert b.index_encoding == "delta64" and "patches/position" not in b.root
    with pytest.raises(ValueError, match="index_encoding"):
        tfo.convert((hyper, np.ones(len(hyper))), tmp_path / "c.zarr", index_encoding="delta16")


def _edit_patches(path, edit):
    """Rewrite the patch table in place (its own CRC32C stays valid)."""
    g = zarr.open_group(str(path), mode="r+")
    pos, word = g["patches/position"][...], g["patches/word"][...]
    pos, word = edit(pos, word)
    for name, arr in (("patches/position", pos), ("patches/word", word)):
        if g[name].shape != arr.shape:
            g[name].resize(arr.shape)
        g[name][...] = arr


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda p, w: (p, w + np.uint64(1)), id="words-changed"),
        pytest.param(lambda p, w: (p[1:], w[1:]), id="chunk-start-dropped"),
        pytest.param(lambda p, w: (p[::-1].copy(), w[::-1].copy()), id="out-of-order"),
    ],
)
def test_a_changed_patch_table_is_refused(tmp_path, rng, edit):
    coords, values = random_coo(rng, (60, 70, 80, 90), 3000)
    tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=1000)
    _edit_patches(tmp_path / "s.zarr", edit)
    with pytest.raises(CorruptStoreError, match="patch table"):
        tfo.open_store(tmp_path / "s.zarr")


def test_a_changed_patch_checksum_is_refused(tmp_path, rng):
    coords, values = random_coo(rng, (60, 70, 80), 2000)
    tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=1000)
    meta_file = tmp_path / "s.zarr" / "zarr.json"
    doc = json.loads(meta_file.read_text())
    doc["attributes"]["tensorflow_ooc"]["patches_checksum"] = "sha256:" + "0" * 64
    meta_file.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError):
        tfo.open_store(tmp_path / "s.zarr")
