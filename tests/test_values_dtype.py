"""Float32 values as a store option: half the value bytes, results in the factors' dtype."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo


def _counts(rng, shape, nnz):
    coords, _ = random_coo(rng, shape, nnz)
    return coords, rng.poisson(3.0, coords.shape[0]).astype(np.float64) + 1.0


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_float32_store_streams_and_decodes_like_its_rounded_values(tmp_path, rng, nmodes):
    shape = (3,) * nmodes
    while np.prod(shape) < 600:  # a store of a few dozen nonzeros is mostly metadata: no byte ratio to see
        shape = tuple(int(s) for s in rng.integers(3, 12 if nmodes < 6 else 7, nmodes))
    coords, _ = random_coo(rng, shape, 900)
    values = rng.standard_normal(coords.shape[0])  # not exact in float32: rounding is what is stored
    rounded = values.astype(np.float32).astype(np.float64)
    s32 = tfo.convert((coords, values), tmp_path / "f32.zarr", chunk_nnz=128, values_dtype="float32")
    s64 = tfo.convert((coords, values), tmp_path / "f64.zarr", chunk_nnz=128)
    assert s32.value_dtype == np.float32 and s64.value_dtype == np.float64
    info32, info64 = s32.info(), s64.info()
    assert info32["value_dtype"] == "float32"
    assert info32["values_bytes_per_nnz"] < 0.75 * info64["values_bytes_per_nnz"]
    assert abs(s32.norm() - np.linalg.norm(rounded)) <= 1e-12 * np.linalg.norm(rounded)
    got_coords, got_values = s32.to_coo()
    assert got_values.dtype == np.float32
    rank = int(rng.integers(2, 20))
    factors = [rng.standard_normal((n, rank)) for n in shape]
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, rounded, factors, mode)
        got = tfo.mttkrp(s32, factors, mode)  # streamed
        assert got.dtype == np.float64 and rel_err(got, ref) < 1e-12
        decoded = tfo.encode_coo(got_coords, got_values, shape)  # in memory
        assert rel_err(tfo.mttkrp(decoded, factors, mode), ref) < 1e-12


def test_cp_als_on_float32_counts_equals_float64(tmp_path, rng):
    """Counts are exact in float32: the stores hold the same tensor, CP-ALS gives one result, in
    memory and streamed."""
    shape = (40, 30, 20, 9)
    coords, values = _counts(rng, shape, 6000)
    s32 = tfo.convert((coords, values), tmp_path / "c32.zarr", chunk_nnz=1024, values_dtype="float32")
    s64 = tfo.convert((coords, values), tmp_path / "c64.zarr", chunk_nnz=1024)
    seed = int(rng.integers(1 << 30))
    ref = tfo.cp_als(s64, 5, seed=seed, max_iters=8, tol=0)
    for execution in ("in-memory", "streaming"):
        got = tfo.cp_als(s32, 5, seed=seed, max_iters=8, tol=0, execution=execution)
        assert abs(got.fit - ref.fit) < 1e-10
        for a, b in zip(got.factors, ref.factors):
            assert a.dtype == np.float64
            np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def test_value_beyond_float32_is_refused_with_its_coordinates(tmp_path, rng):
    coords = np.array([[0, 1, 2], [3, 2, 1], [4, 4, 4]])
    values = np.array([1.0, 5e38, 2.0])
    with pytest.raises(tfo.ValueRangeError, match=r"\(3, 2, 1\) overflows float32"):
        tfo.convert((coords, values), tmp_path / "big.zarr", values_dtype="float32")
    assert not (tmp_path / "big.zarr").exists()
    with pytest.raises(ValueError, match="values_dtype"):
        tfo.convert((coords, values), tmp_path / "bad.zarr", values_dtype="int8")


@pytest.mark.parametrize("tiny", [1e-40, 1e-46, -3e-39])
def test_value_that_float32_turns_subnormal_or_zero_is_refused(tmp_path, tiny):
    """Before: stored silently as a float32 subnormal or as 0 (the square check is in float64)."""
    coords = np.array([[0, 1, 2], [3, 2, 1], [4, 4, 4]])
    values = np.array([1.0, tiny, 2.0])
    with pytest.raises(tfo.ValueRangeError, match=r"values\[1\].* is too small for float32"):
        tfo.convert((coords, values), tmp_path / "tiny.zarr", values_dtype="float32")
    assert not (tmp_path / "tiny.zarr").exists()
    tns = tmp_path / "tiny.tns"
    tns.write_text(f"1 2 3 1.0\n4 3 2 {tiny!r}\n5 5 5 2.0\n")
    with pytest.raises(tfo.ValueRangeError, match=r"tiny.tns.* is too small for float32"):
        tfo.convert(str(tns), tmp_path / "tiny.zarr", values_dtype="float32")
    assert not (tmp_path / "tiny.zarr").exists()
    ok = tfo.convert((coords, np.array([1.0, 1.2e-38, 0.0])), tmp_path / "ok.zarr", values_dtype="float32")
    assert ok.nnz == 3  # float32's smallest normal, and an explicit 0, are kept


def _tfooc(*args):
    return subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", *map(str, args)], capture_output=True, text=True, timeout=600
    )


def test_cli_values_dtype(tmp_path, rng):
    tns = tmp_path / "c.tns"
    coords, values = _counts(rng, (20, 30, 40), 3000)
    np.savetxt(tns, np.column_stack([coords + 1, values]), fmt="%d")
    r = _tfooc("convert", tns, tmp_path / "c.zarr", "--values-dtype", "float32")
    assert r.returncode == 0, r.stderr
    info = json.loads(_tfooc("info", tmp_path / "c.zarr", "--json").stdout)
    assert info["value_dtype"] == "float32" and info["index_bytes_per_nnz"] > 0
    assert "values float32" in _tfooc("info", tmp_path / "c.zarr").stdout
    r = _tfooc("cpd", tmp_path / "c.zarr", "--rank", "3", "--max-iters", "3", "-q")
    assert r.returncode == 0, r.stderr
    big = tmp_path / "big.tns"
    big.write_text("1 1 1 2\n2 3 1 1e39\n")
    r = _tfooc("convert", big, tmp_path / "big.zarr", "--values-dtype", "float32")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "(1, 2, 0)" in r.stderr and "float32" in r.stderr
    r = _tfooc("generate", tmp_path / "g.zarr", "--shape", "20,20,20", "--nnz", "500", "--values-dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert json.loads(_tfooc("info", tmp_path / "g.zarr", "--json").stdout)["value_dtype"] == "float32"
