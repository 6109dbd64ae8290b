"""Ingest: .tns / .tns.gz parsing, every in-memory source, out-of-core conversion, bad input."""

import gzip
import os

import numpy as np
import pytest
from conftest import random_coo, sort_rows

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.errors import (
    DuplicateError,
    EmptyTensorError,
    IndexRangeError,
    NonFiniteValueError,
    ParseError,
    ShapeError,
)


def write_lines(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines).encode()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def tns_text(coords, values, one_based=True, sep=" "):
    off = 1 if one_based else 0
    return [sep.join(str(int(i) + off) for i in c) + sep + repr(float(v)) for c, v in zip(coords, values)]


def assert_store_equals(store, coords, values):
    c, v = store.to_coo()
    a, b = sort_rows(coords, values), sort_rows(c, v)
    assert np.array_equal(a[0], b[0])
    assert np.array_equal(a[1], b[1])


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_tns_round_trip_exact_values(tmp_path, rng, gz, nmodes):
    shape = tuple(int(s) for s in rng.integers(2, 60, nmodes))
    coords, values = random_coo(rng, shape, 3000)
    values = values * 10.0 ** rng.integers(-30, 30, len(values))  # exercise the slow float path too
    values[::7] = np.round(values[::7], 3)  # and the fast one
    lines = ["# a FROSTT-style header", ""] + tns_text(coords, values)
    path = write_lines(tmp_path / ("t.tns.gz" if gz else "t.tns"), lines, gz)
    s = tfo.convert(path, tmp_path / "t.zarr", shape=shape)
    assert s.shape == shape
    assert_store_equals(s, coords, values)


def test_tns_formatting_variants(tmp_path):
    lines = [
        "# comment",
        "   ",
        "1\t2   3 1.5",
        "  2 1 1 -2e-3  # trailing comment",
        "3 3 3 +4.",
        "1 1 2 .5\r",
        "2 2 2 1E2",
        "3 1 2 -0.0",
    ]
    path = write_lines(tmp_path / "t.tns", lines)
    s = tfo.convert(path, tmp_path / "t.zarr")
    assert s.shape == (3, 3, 3)
    got = dict(zip(map(tuple, s.to_coo()[0].tolist()), s.to_coo()[1].tolist()))
    assert got == {(0, 1, 2): 1.5, (1, 0, 0): -2e-3, (2, 2, 2): 4.0, (0, 0, 1): 0.5, (1, 1, 1): 100.0, (2, 0, 1): -0.0}


def test_zero_based_and_shape_inference(tmp_path, rng):
    coords, values = random_coo(rng, (7, 8, 9), 200)
    path = write_lines(tmp_path / "z.tns", tns_text(coords, values, one_based=False))
    s = tfo.convert(path, tmp_path / "z.zarr", one_based=False)
    assert s.shape == tuple(int(m) + 1 for m in coords.max(axis=0))
    assert_store_equals(s, coords, values)


@pytest.mark.parametrize("out_of_core", [False, True])
@pytest.mark.parametrize("gz", [False, True])
def test_a_generated_files_header_shape_keeps_trailing_empty_slices(tmp_path, rng, out_of_core, gz):
    """A .tns carries no shape, so it is inferred from the largest indices; the header this
    package's generators write names the shape, and the inferred shape grows to it (a planted
    uber-shaped model converted to 183 x 24 x 1138 x 1711 before). It never shrinks the shape, and
    only the generators' header is read, with the file's mode count."""
    shape = tuple(int(x) for x in rng.integers(20, 60, 4))
    coords, values = random_coo(rng, tuple(s - 3 for s in shape), 3000)  # the last 3 slices empty
    head = [f"# tensorflow_ooc synthetic planted tensor, shape {','.join(map(str, shape))}, seed 0"]
    path = write_lines(tmp_path / ("h.tns.gz" if gz else "h.tns"), head + tns_text(coords, values), gz=gz)
    kw = {"out_of_core": True, "sort_nnz": 700} if out_of_core else {}
    s = tfo.convert(path, tmp_path / "h.zarr", **kw)
    assert s.shape == shape
    assert_store_equals(s, coords, values)
    inferred = tuple(int(m) + 1 for m in coords.max(axis=0))
    # an index beyond the header's shape wins (the header is a comment); a given shape is the shape
    small = ",".join(str(x - 10) for x in shape)
    path = write_lines(
        tmp_path / "small.tns", [f"# tensorflow_ooc synthetic planted tensor, shape {small}"] + tns_text(coords, values)
    )
    assert tfo.convert(path, tmp_path / "s.zarr", **kw).shape == tuple(max(a, b - 10) for a, b in zip(inferred, shape))
    given = tuple(x + 5 for x in shape)
    assert tfo.convert(path, tmp_path / "g.zarr", shape=given, **kw).shape == given
    # other comments, a wrong mode count and a header after the data are not read as shapes
    for k, first in enumerate(
        [
            f"# shape {','.join(map(str, shape))}",
            f"# tensorflow_ooc synthetic planted tensor, shape {','.join(map(str, shape[:3]))}, seed 0",
        ]
    ):
        path = write_lines(tmp_path / f"o{k}.tns", [first] + tns_text(coords, values))
        assert tfo.convert(path, tmp_path / f"o{k}.zarr", **kw).shape == inferred
    path = write_lines(tmp_path / "late.tns", tns_text(coords, values) + head)
    assert tfo.convert(path, tmp_path / "late.zarr", **kw).shape == inferred


def test_parallel_pieces_match_serial(tmp_path, rng):
    coords, values = random_coo(rng, (300, 200, 100, 50), 20_000)
    path = write_lines(tmp_path / "p.tns", tns_text(coords, values))
    from tensorflow_ooc.ingest import TextSource

    src = TextSource(path, piece_bytes=4096, workers=2)
    pieces = list(src.pieces(None))
    assert len(pieces) > 50
    c = np.concatenate([p.coords for p in pieces])
    v = np.concatenate([p.values for p in pieces])
    assert np.array_equal(c, coords) and np.array_equal(v, values)  # file order preserved


# --- every in-memory source ----------------------------------------------------------------------


def test_sources_sparse_scipy_pyttb(tmp_path, rng):
    import pyttb
    import scipy.sparse
    import sparse

    coords, values = random_coo(rng, (9, 10, 11, 12), 500)
    sp = sparse.COO(coords.T, values, shape=(9, 10, 11, 12))
    assert_store_equals(tfo.convert(sp, tmp_path / "a.zarr"), coords, values)
    assert tfo.open_store(tmp_path / "a.zarr").shape == (9, 10, 11, 12)

    pt = pyttb.sptensor(coords, values.reshape(-1, 1), (9, 10, 11, 12))
    assert_store_equals(tfo.convert(pt, tmp_path / "b.zarr"), coords, values)

    m = scipy.sparse.random(40, 30, density=0.1, format="csr", random_state=int(rng.integers(1000)))
    s = tfo.convert(m, tmp_path / "c.zarr")
    coo = m.tocoo()
    assert s.shape == (40, 30)
    assert_store_equals(s, np.stack([coo.row, coo.col], 1).astype(np.int64), coo.data)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ((np.array([[0, -1, 2]]), np.array([1.0])), IndexRangeError, r"coords\[0, 1\] = -1 is negative"),
        ((np.array([[0, 1, 2], [0, 1, 9]]), np.array([1.0, 2.0])), IndexRangeError, r"coords\[1, 2\] = 9 is beyond"),
        ((np.array([[0, 1, 2]]), np.array([np.nan])), NonFiniteValueError, r"values\[0\]"),
        ((np.array([[0, 1, 2]]), np.array([1.0, 2.0])), ShapeError, "one entry per row"),
        ((np.array([0, 1, 2]), np.array([1.0])), ShapeError, "2-D"),
        ((np.zeros((0, 3), np.int64), np.zeros(0)), EmptyTensorError, "no nonzeros"),
        ((np.array([[0.5, 1, 2]]), np.array([1.0])), ShapeError, "integers"),
    ],
)
def test_bad_arrays(tmp_path, bad, error, match):
    with pytest.raises(error, match=match):
        tfo.convert(bad, tmp_path / "x.zarr", shape=(3, 3, 3))
    assert not os.listdir(tmp_path)


# --- bad text input: one test each, each names file and line, none leaves a store -------------------


def _bad(tmp_path, lines, error, match, gz=False, **kw):
    path = write_lines(tmp_path / ("bad.tns.gz" if gz else "bad.tns"), lines, gz)
    with pytest.raises(error, match=match) as info:
        tfo.convert(path, tmp_path / "out.zarr", **kw)
    assert sorted(os.listdir(tmp_path)) == [path.name]
    return info.value


def test_wrong_column_count(tmp_path):
    e = _bad(
        tmp_path, ["1 1 1 1.0", "# c", "2 2 2 2.0", "3 3 3.0"], ParseError, r"bad\.tns, line 4: expected 4 columns"
    )
    assert e.line == 4 and e.path.endswith("bad.tns")
    _bad(tmp_path, ["1 1 1 1.0", "2 2 2 2 2.0"], ParseError, r"line 2: expected 4 columns .* found 5")
    _bad(tmp_path, ["1 1 1 1.0", "2 2 2"], ParseError, r"line 2: expected 4 columns .* found 3")


def test_non_numeric_token(tmp_path):
    _bad(tmp_path, ["1 1 1 1.0", "2 x 2 2.0"], ParseError, r"line 2: column 2: token 'x' is not an integer index")
    _bad(tmp_path, ["1 1 1 1.0", "2 2 2 abc"], ParseError, r"line 2: column 4: token 'abc' is not a number")
    _bad(tmp_path, ["1 1 1 1.0.0"], ParseError, r"line 1: column 4")


def test_zero_index_in_one_based(tmp_path):
    _bad(tmp_path, ["1 1 1 1.0", "1 0 1 2.0"], IndexRangeError, r"line 2: column 2: index 0 is out of range \(1-based")


def test_negative_index(tmp_path):
    _bad(tmp_path, ["1 1 1 1.0", "1 1 -3 2.0"], IndexRangeError, r"line 2: column 3: index -3 is out of range")
    _bad(tmp_path, ["0 0 -1 2.0"], IndexRangeError, r"line 1: column 3", one_based=False)


@pytest.mark.parametrize("token", ["nan", "NaN", "inf", "-Infinity", "1e999"])
def test_nan_inf(tmp_path, token):
    _bad(
        tmp_path,
        ["1 1 1 1.0", "2 2 2 3.0", f"1 2 1 {token}"],
        NonFiniteValueError,
        rf"line 3: column 4: value '{token}' is not finite",
    )


def test_empty_file(tmp_path):
    _bad(tmp_path, [], EmptyTensorError, "empty")
    _bad(tmp_path, ["# only a comment", ""], EmptyTensorError, "no nonzeros")


def test_index_beyond_given_shape(tmp_path):
    _bad(
        tmp_path,
        ["1 1 1 1.0", "4 1 1 2.0"],
        IndexRangeError,
        r"line 2: column 1: index 4 is beyond the given shape",
        shape=(3, 3, 3),
    )
    _bad(tmp_path, ["1 1 1 1.0"], ShapeError, "4 modes but the file's lines have 3", shape=(3, 3, 3, 3))


def test_truncated_gz(tmp_path, rng):
    coords, values = random_coo(rng, (50, 50, 50), 5000)
    full = tmp_path / "full.tns.gz"
    write_lines(full, tns_text(coords, values), gz=True)
    data = full.read_bytes()
    full.unlink()
    cut = tmp_path / "bad.tns.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ParseError, match=r"bad\.tns\.gz: gzip stream is truncated"):
        tfo.convert(cut, tmp_path / "out.zarr")
    assert sorted(os.listdir(tmp_path)) == ["bad.tns.gz"]


def test_error_line_numbers_across_pieces(tmp_path, rng):
    coords, values = random_coo(rng, (90, 90, 90), 20_000)
    lines = tns_text(coords, values)
    lines[15_321] = "1 2 three 4.0"
    path = write_lines(tmp_path / "big.tns", lines)
    from tensorflow_ooc.ingest import TextSource

    with pytest.raises(ParseError, match=r"line 15322: column 3: token 'three'"):
        list(TextSource(path, piece_bytes=8192).batches(None))


def test_duplicates_in_text(tmp_path):
    lines = ["1 2 3 1.0", "2 2 2 5.0", "1 2 3 2.5"]
    _bad(tmp_path, lines, DuplicateError, r"bad\.tns: duplicate coordinate \(1, 2, 3\) \(1-based\)")
    path = write_lines(tmp_path / "d.tns", lines)
    s = tfo.convert(path, tmp_path / "sum.zarr", duplicates="sum")
    assert dict(zip(map(tuple, s.to_coo()[0].tolist()), s.to_coo()[1].tolist())) == {(0, 1, 2): 3.5, (1, 1, 1): 5.0}
    s = tfo.convert(path, tmp_path / "last.zarr", duplicates="last")
    assert dict(zip(map(tuple, s.to_coo()[0].tolist()), s.to_coo()[1].tolist())) == {(0, 1, 2): 2.5, (1, 1, 1): 5.0}


# --- out of core -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(183, 24, 1140, 1717), (2**31, 2**31, 2**30, 7), (5, 3000, 7)])
def test_out_of_core_matches_in_memory(tmp_path, rng, shape):
    coords, _ = synthetic.heavy_tailed(shape, 30_000, skew=2.5, seed=int(rng.integers(1 << 30)))
    values = rng.standard_normal(len(coords))
    path = tmp_path / "in.tns"
    path.write_bytes(synthetic.format_tns(coords, values))
    ref = tfo.convert(path, tmp_path / "mem.zarr", shape=shape, chunk_nnz=1000, max_block_nnz=3000)
    # tiny sort capacity: many buckets, skewed ones split again on lower bits
    ooc = tfo.convert(
        path, tmp_path / "ooc.zarr", shape=shape, chunk_nnz=1000, max_block_nnz=3000, out_of_core=True, sort_nnz=700
    )
    a, b = ref.to_coo(), ooc.to_coo()
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])  # identical, in ALTO order
    assert np.array_equal(ref.blocks.start, ooc.blocks.start) and np.array_equal(ref.blocks.base, ooc.blocks.base)
    assert sorted(os.listdir(tmp_path)) == ["in.tns", "mem.zarr", "ooc.zarr"]  # buckets cleaned up


def test_out_of_core_shape_inference_and_duplicates(tmp_path, rng):
    coords, values = random_coo(rng, (40, 50, 60), 5000)
    dup = np.concatenate([coords, coords[:100]])
    vals = np.concatenate([values, values[:100]])
    path = write_lines(tmp_path / "d.tns", tns_text(dup, vals))
    with pytest.raises(DuplicateError):
        tfo.convert(path, tmp_path / "x.zarr", out_of_core=True, sort_nnz=500)
    assert not (tmp_path / "x.zarr").exists()
    s = tfo.convert(path, tmp_path / "y.zarr", out_of_core=True, sort_nnz=500, duplicates="sum")
    expect = values.copy()
    expect[:100] *= 2
    assert s.shape == tuple(int(m) + 1 for m in coords.max(axis=0))
    assert_store_equals(s, coords, expect)


def test_out_of_core_all_identical_coordinates(tmp_path):
    lines = ["3 4 5 1.0"] * 3000 + ["1 1 1 2.0"]
    path = write_lines(tmp_path / "same.tns", lines)
    s = tfo.convert(path, tmp_path / "s.zarr", out_of_core=True, sort_nnz=100, duplicates="sum")
    got = dict(zip(map(tuple, s.to_coo()[0].tolist()), s.to_coo()[1].tolist()))
    assert got == {(2, 3, 4): 3000.0, (0, 0, 0): 2.0}


def test_memory_limit_too_small(tmp_path):
    with pytest.raises(ValueError, match="memory_limit"):
        tfo.convert((np.array([[0, 0]]), np.array([1.0])), tmp_path / "m.zarr", memory_limit=10 << 20)
