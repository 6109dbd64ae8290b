"""benchmarks/bench_peers.py: its generated tensors (shapes ALTO can read, files written once and
reused) and the CP-ALS target's table (every ratio above the bar reported as a miss)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tensorflow_ooc as tfo

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_peers_under_test", BENCH / "bench_peers.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_generated_shapes_are_other_supports_alto_reads(bench):
    from peers.alto import index_bits

    orders = set()
    for name, (shape, nnz, skew) in bench.GENERATED.items():
        assert name in bench.SUITE
        # ALTO's build takes up to 5 modes and 64 index bits
        assert 3 <= len(shape) <= 5 and index_bits(shape) <= 64, name
        assert len(skew) == len(shape) and min(skew) >= 1
        assert 1_000_000 <= nnz <= 5_000_000
        orders.add(len(shape))
        assert bench.tensor_spec(name) == (shape, nnz, skew)
    presets = {len(bench.tensor_spec(p)[0]) for p in bench.PRESET_SUITE}
    assert {4, 5} <= orders and orders | presets >= {3, 4, 5}
    assert max(max(s) for _, _, s in bench.GENERATED.values()) >= 4  # a very skewed one


def test_generated_tensor_written_once_as_tns_and_stores(bench, tmp_path, monkeypatch):
    rng = np.random.default_rng()
    shape = tuple(int(x) for x in rng.integers(20, 60, size=4))
    nnz = int(rng.integers(2_000, 4_000))
    monkeypatch.setitem(bench.GENERATED, "tiny", (shape, nnz, (2.0, 1.5, 1.0, 1.2)))
    seed = int(rng.integers(0, 1000))
    tns, store_path, coords, values, got_shape = bench.tensor_files("tiny", tmp_path, seed)
    assert got_shape == shape and coords.shape == (nnz, 4)
    table = pd.read_csv(tns, sep=r"\s+", header=None)
    np.testing.assert_array_equal(table.iloc[:, :4].to_numpy(), coords + 1)  # 1-based, as ALTO reads
    np.testing.assert_allclose(table.iloc[:, 4].to_numpy(), values, rtol=1e-12)
    for path in (store_path, bench.raw_path(store_path)):
        store = tfo.open_store(path)
        assert store.nnz == nnz and tuple(store.shape) == shape
    written = tns.stat().st_mtime_ns
    again = bench.tensor_files("tiny", tmp_path, seed)
    assert again[0] == tns and tns.stat().st_mtime_ns == written  # reused, not rewritten


def test_target_table_reports_every_miss(bench, capsys):
    rng = np.random.default_rng()
    rows = []
    for name in ("nips", "gen-o5"):
        for rank in bench.DEFAULT_RANKS:
            ours, alto = rng.uniform(0.01, 0.1), rng.uniform(0.01, 0.1)
            rows.append({"tensor": name, "rank": rank, "shape": [3, 4, 5], "nnz": 60, "ratios": {}})
            rows[-1]["ratios"]["cp_als_vs_alto"] = ours / alto
    rows.append({"tensor": "uber", "rank": 8, "shape": [3, 4, 5], "nnz": 60, "ratios": {"cp_als_vs_alto": None}})
    bar = 0.8
    got = bench.target_table({"rows": rows}, bar)
    want = {(r["tensor"], r["rank"]) for r in rows if (r["ratios"]["cp_als_vs_alto"] or 0) > bar}
    assert {(m["tensor"], m["rank"]) for m in got["misses"]} == want
    assert got["rows"] == len(rows) - 1 and got["met"] == (not want)
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.count("!") for line in lines if line.startswith(("nips", "gen-o5", "uber"))) == len(want)
    assert bench.target_table({"rows": rows[-1:]}, bar)["met"] is None  # no ALTO time: not "met"
