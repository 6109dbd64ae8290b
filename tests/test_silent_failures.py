"""Issue 28: bad values, edited stores and bad numbers are refused with a clear error, never exit 0
with a wrong answer. Each test fails on the code before the fix (named in its docstring)."""

import contextlib
import io
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import random_coo
from test_cli import tfooc as tfooc_process

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import CorruptStoreError, DecompositionError, StoreExistsError, ValueRangeError


def tfooc(*args):
    """The CLI in this process (``main``, as the ``tfooc`` script runs it; its imports are paid
    once): these tests make about 50 calls, which as processes took minutes of CI. The process
    boundary itself is tested by ``test_the_process_exits_with_one_line``."""
    from tensorflow_ooc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse: usage errors
            code = exc.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_the_process_exits_with_one_line(tmp_path):
    """As a subprocess: a bad value and a bad number each give exit 2 and one line, no traceback."""
    tns = tmp_path / "x.tns"
    tns.write_text("1 1 1 1.5\n2 2 2 1e200\n")
    clear_error(tfooc_process("convert", tns, tmp_path / "x.zarr"), str(tns), "line 2", "1e200")
    clear_error(tfooc_process("cpd", tmp_path / "x.zarr", "--rank", "2", "--tol", "nan"), "--tol")


def clear_error(r, *needles):
    """Exit 2, one ``tfooc: error:`` line naming every needle, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tfooc: error:")]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def store(tmp_path, rng):
    coords, values = random_coo(rng, (15, 20, 25), 1500)
    return tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=512)


def _edit_meta(path, fn):
    f = path / "zarr.json"
    doc = json.loads(f.read_text())
    fn(doc["attributes"]["tensorflow_ooc"])
    f.write_text(json.dumps(doc))


# --- store metadata --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(norm_sq=m["norm_sq"] * 2),
        lambda m: m.update(norm_sq=m["norm_sq"] * (1 + 1e-12)),
        lambda m: m.update(created_by="someone else"),
        lambda m: m.update(store_id="0" * 32),
        lambda m: m.update(checksum="sha256:" + "0" * 64),
    ],
)
def test_edited_metadata_is_refused(store, edit):
    """Before: a doubled norm_sq opened as valid and gave a wrong fit with exit 0."""
    path = store.path
    _edit_meta(Path(path), edit)
    with pytest.raises(CorruptStoreError, match="checksum"):
        tfo.open_store(path)
    r = tfooc("info", path)
    clear_error(r, "checksum", str(path))
    r = tfooc("cpd", path, "--rank", "2", "--max-iters", "2")
    clear_error(r, "checksum")


def test_store_without_checksum_has_its_norm_rederived(store):
    """A store written before the checksum: norm_sq is compared with the values' squares."""
    path = Path(store.path)
    norm_sq = store.meta["norm_sq"]
    _edit_meta(path, lambda m: m.pop("checksum"))
    assert math.isclose(tfo.open_store(path).norm() ** 2, norm_sq, rel_tol=1e-12)  # a legacy store opens
    _edit_meta(path, lambda m: m.update(norm_sq=norm_sq * 2))
    with pytest.raises(CorruptStoreError, match="norm_sq"):
        tfo.open_store(path)
    _edit_meta(path, lambda m: m.update(norm_sq=float("inf")))
    with pytest.raises(CorruptStoreError):
        tfo.open_store(path)


# --- values float64 cannot square ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, what",
    [
        ("1e200", "too large"),
        ("1e300", "too large"),
        ("-2e154", "too large"),
        ("1e-310", "subnormal"),
        ("4.9e-324", "subnormal"),
    ],
)
def test_values_whose_squares_float64_cannot_hold(tmp_path, value, what):
    """Before: 1e200 gave norm_sq Infinity (invalid JSON) and fit nan with exit 0; 1e-310 gave
    norm_sq 0 and an all-zero model with exit 0."""
    tns = tmp_path / "x.tns"
    tns.write_text("# a comment\n1 1 1 1.5\n\n2 3 1 -0.25\n2 2 2 " + value + "\n3 1 2 2.0\n")
    r = tfooc("convert", tns, tmp_path / "x.zarr")
    clear_error(r, str(tns), "line 5", value, what)
    assert not (tmp_path / "x.zarr").exists()
    with pytest.raises(ValueRangeError, match=what):
        tfo.convert((np.array([[0, 0, 0], [1, 1, 1]]), np.array([1.0, float(value)])), tmp_path / "y.zarr")


def test_sum_of_squares_overflow_is_refused(tmp_path):
    """Each square is finite, their sum is not."""
    coords = np.arange(30).reshape(10, 3)
    with pytest.raises(ValueRangeError, match="overflows"):
        tfo.convert((coords, np.full(10, 1.2e154)), tmp_path / "o.zarr")
    assert not (tmp_path / "o.zarr").exists()


def test_large_but_representable_values_still_decompose(tmp_path, rng):
    """1e150 and 1e-150 are fine: the fit is the same as for the data scaled to 1."""
    coords, values = random_coo(rng, (10, 12, 14), 600)
    # scaled by 1e-150, a value below 1.5e-4 would square to a subnormal number: refused at ingest
    values = np.where(np.abs(values) < 1e-3, np.copysign(1e-3, values), values)
    fits = []
    for scale in (1.0, 1e150, 1e-150):
        s = tfo.convert((coords, values * scale), tmp_path / f"v{len(fits)}.zarr")
        fits.append(tfo.cp_als(s, 2, seed=3, max_iters=5, tol=0).fit)
    assert all(math.isfinite(f) for f in fits)
    assert np.allclose(fits, fits[0], rtol=1e-6)


def test_nan_fit_or_all_zero_model_stops_the_run(store):
    """Before: a NaN fit and an all-zero model were returned (and written) with exit 0."""
    shape = store.shape
    nan_init = [np.full((s, 2), np.nan) for s in shape]
    with pytest.raises(DecompositionError, match="init: factor matrix 0 holds NaN"):
        tfo.cp_als(store, 2, init=nan_init, max_iters=3)
    huge_init = [np.full((s, 2), 1e120) for s in shape]  # Grams overflow: 1e240 * rows * 1e240
    with pytest.raises(DecompositionError, match="not finite|NaN"):
        tfo.cp_als(store, 2, init=huge_init, max_iters=3)
    zero_init = [np.zeros((s, 2)) for s in shape]
    with pytest.raises(DecompositionError, match="all zero"):
        tfo.cp_als(store, 2, init=zero_init, max_iters=3)


def test_all_zero_tensor_is_refused(tmp_path):
    s = tfo.convert((np.array([[0, 0, 0], [1, 2, 3]]), np.array([0.0, 0.0])), tmp_path / "z.zarr")
    with pytest.raises(DecompositionError, match="nothing to fit"):
        tfo.cp_als(s, 1, max_iters=2)
    clear_error(tfooc("cpd", s.path, "--rank", "1"), "nothing to fit")


# --- numbers at parse time -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needle",
    [
        (["cpd", "S", "--rank", "2", "--tol", "nan"], "--tol"),
        (["cpd", "S", "--rank", "2", "--tol", "inf"], "--tol"),
        (["cpd", "S", "--rank", "2", "--tol", "-1"], "--tol"),
        (["cpd", "S", "--rank", "2", "--tol", "1e309"], "--tol"),
        (["cpd", "S", "--rank", "2.5"], "--rank"),
        (["cpd", "S", "--rank", "nan"], "--rank"),
        (["cpd", "S", "--rank", "2", "--max-iters", "1e309"], "--max-iters"),
        (["cpd", "S", "--rank", "2", "--samples", "0"], "--samples"),
        (["tucker", "S", "--ranks", "2", "--tol", "nan"], "--tol"),
        (["complete", "S", "--ranks", "2", "--core-rank", "2", "--lr-core", "nan"], "--lr-core"),
        (["complete", "S", "--ranks", "2", "--core-rank", "2", "--test-fraction", "1.5"], "--test-fraction"),
    ],
)
def test_numbers_are_checked_at_parse_time(store, args, needle):
    r = tfooc(*[store.path if a == "S" else a for a in args])
    clear_error(r, needle)


def test_api_refuses_bad_numbers(store):
    for kw in ({"tol": float("nan")}, {"tol": -1.0}, {"tol": float("inf")}, {"max_iters": 0}, {"max_iters": 2.5}):
        with pytest.raises(DecompositionError):
            tfo.cp_als(store, 2, **kw)
    with pytest.raises(DecompositionError, match="rank"):
        tfo.cp_als(store, 0)


def test_huge_rank_is_judged_by_the_memory_plan(store):
    """Before: rank 100000 failed allocating 74.5 GiB of Grams in NumPy, with a traceback."""
    r = tfooc("cpd", store.path, "--rank", "100000", "--max-iters", "1")
    line = clear_error(r, "grams", "worker memory limit of at least")
    assert "GB" in line


def test_spec_refuses_non_finite_tol(tmp_path, store):
    for tol in (".nan", ".inf", "-1.0"):
        spec = tmp_path / "w.yaml"
        spec.write_text(
            f"name: w\nsteps:\n  d:\n    kind: decompose\n    input: {store.path}\n"
            f"    out: r.zarr\n    rank: 2\n    tol: {tol}\n"
        )
        r = tfooc("run", spec, "--storage", tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "tol" in r.stderr and "line 8" in r.stderr, r.stderr


# --- refuse early ----------------------------------------------------------------------------------


def test_convert_onto_an_existing_store_refuses_before_reading(tmp_path, store):
    """Before: the whole input was parsed first (12.8 s for 193 MB), then a parse or duplicate
    error was reported instead of the existing store. Here the input is malformed: refusing
    before reading means the error names the store, not the input's line."""
    bad = tmp_path / "bad.tns"
    bad.write_text("1 1 1 1.0\n1 1 oops 2.0\n")
    with pytest.raises(StoreExistsError):
        tfo.convert(bad, store.path)
    r = tfooc("convert", bad, store.path)
    clear_error(r, "already holds a tensor store", "--overwrite")
    assert tfo.open_store(store.path).nnz == store.nnz


def test_resume_without_checkpoint_and_unfinished_checkpoint(tmp_path, store):
    """Before: --resume without a checkpoint started afresh silently; a rerun without --resume
    after a crash silently replaced the crashed run's checkpoint."""
    out = tmp_path / "r.zarr"
    clear_error(tfooc("cpd", store.path, "--rank", "2", "--out", out, "--resume"), "no checkpoint", "--resume")
    assert not out.exists()
    r = tfooc("-q", "cpd", store.path, "--rank", "2", "--max-iters", "3", "--tol", "0", "--seed", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(out)  # as if the run died before writing its result
    ck = tmp_path / "r.zarr.checkpoint.npz"
    before = ck.read_bytes()
    clear_error(tfooc("cpd", store.path, "--rank", "2", "--out", out), "did not finish", "--resume", str(ck))
    assert ck.read_bytes() == before
    # --resume with nothing left to do: no nonsense throughput
    r = tfooc("-q", "cpd", store.path, "--rank", "2", "--max-iters", "3", "--tol", "0", "--out", out, "--resume")
    assert r.returncode == 0, r.stderr
    assert "no iterations" in r.stdout and "nonzero-modes/s" not in r.stdout, r.stdout
    r = tfooc("-q", "cpd", store.path, "--rank", "2", "--max-iters", "3", "--tol", "0", "--out", out, "--overwrite")
    assert r.returncode == 0 and "3 iterations in this run" in r.stdout, r.stderr


# --- index limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [2**60, 2**62, 2**63 - 2])
def test_indices_up_to_the_real_limit_are_read(tmp_path, index):
    """Before: indices of 2^60 .. 2^63-1 were refused as not fitting in 64 bits."""
    tns = tmp_path / "i.tns"
    tns.write_text(f"1 1 1 1.0\n2 {index} 3 2.0\n")
    s = tfo.convert(tns, tmp_path / "i.zarr")
    assert s.shape == (2, index, 3) and s.nnz == 2
    c, v = s.to_coo()
    assert sorted(map(tuple, c.tolist())) == [(0, 0, 0), (1, index - 1, 2)]


@pytest.mark.parametrize("index", [str(2**63), str(2**64), "99999999999999999999999"])
def test_index_beyond_the_limit_names_it(tmp_path, index):
    tns = tmp_path / "i.tns"
    tns.write_text(f"1 1 1 1.0\n2 {index} 3 2.0\n")
    line = clear_error(tfooc("convert", tns, tmp_path / "i.zarr"), "line 2", "at most 2^63 - 1")
    assert "64 bits" not in line


# --- found by benchmarks/bench_hostile.py ------------------------------------------------------------


def test_chunk_replaced_by_a_directory(tmp_path, rng):
    """Before: IsADirectoryError traceback from tfooc info and cpd."""
    coords, values = random_coo(rng, (15, 20, 25), 1500)
    s = tfo.convert((coords, values), tmp_path / "d.zarr", chunk_nnz=512)
    chunk = Path(s.path) / "values" / "c" / "2"
    chunk.unlink()
    chunk.mkdir()
    with pytest.raises(CorruptStoreError, match="chunk 2"):
        tfo.open_store(s.path)
    clear_error(tfooc("info", s.path), "chunk 2")


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("nul", "name: w\nsteps:\n  a: {kind: generate, out: x.tns, shape: [4, 4, 4], nnz: 10}\x00\n", "YAML"),
        ("control", "name: w\x08\nsteps: {}\n", "YAML"),
        (
            "bomb",
            "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
            "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
            "name: w\nsteps: {}\n",
            "aliases expand",
        ),
        ("deep", "name: w\nsteps: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("root-itself", "name: w\nsteps:\n  g: {kind: generate, out: ., shape: [4, 4, 4], nnz: 10}\n", "storage root"),
    ],
)
def test_hostile_specs_are_refused(tmp_path, name, text, needle):
    """Before: ReaderError, MemoryError and RecursionError tracebacks; an output of '.' (the
    storage root itself) was accepted."""
    spec = tmp_path / "w.yaml"
    spec.write_bytes(text.encode())
    (tmp_path / "root").mkdir()
    r = tfooc("run", spec, "--storage", tmp_path / "root")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert needle in r.stderr, r.stderr


def test_edited_array_codecs_are_refused(store):
    """Before: alto's delta filter removed from its zarr.json, and tfooc info still accepted it.
    Format version 2's index has no filter: its checksum codec goes instead (any codec edit)."""
    f = Path(store.path) / "alto" / "zarr.json"
    doc = json.loads(f.read_text())
    codecs = [c for c in doc["codecs"] if "delta" not in c["name"]]
    if len(codecs) == len(doc["codecs"]):
        codecs = [c for c in codecs if c["name"] != "crc32c"]
    assert len(codecs) < len(doc["codecs"])
    doc["codecs"] = codecs
    f.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match="Zarr metadata of its arrays"):
        tfo.open_store(store.path)
    clear_error(tfooc("info", store.path), "codecs")
