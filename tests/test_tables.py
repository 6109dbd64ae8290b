"""Tables in, labelled factors out: Parquet and CSV files written by pandas and PyArrow (string,
integer, date and categorical keys) convert to stores whose label dictionaries are kept in the store
and bound by checksum; nulls and bad rows are refused naming the file, row and column; appends keep
old keys' indices; CP's factors come back keyed by the labels, equal to those of a NumPy reference
with the same key mapping (pandas' order of first appearance)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.errors import CorruptStoreError, IngestError, StoreError

MODES = ["user", "item", "day", "kind"]


def _events(rng, n: int, users: int = 30, items: int = 12, days: int = 5, start: str = "2026-03-01") -> pd.DataFrame:
    """An event log: string users, integer items, timestamps (bucketed by day), a categorical."""
    user_names = np.array([f"user-{rng.integers(1_000_000):06d}-{i}" for i in range(users)])
    return pd.DataFrame(
        {
            "user": user_names[rng.integers(0, users, n)],
            "item": rng.integers(10_000, 10_000 + 7 * items, n) // 7 * 7,
            "day": pd.Timestamp(start) + pd.to_timedelta(rng.integers(0, days * 86_400, n), unit="s"),
            "kind": pd.Categorical(rng.choice(["view", "cart", "buy"], n), categories=["buy", "cart", "view"]),
            "count": rng.integers(1, 6, n).astype(np.int64),
        }
    )


def _reference(frame: pd.DataFrame, value: str | None = "count") -> tuple[list, np.ndarray, np.ndarray]:
    """Keys numbered as pandas numbers them in order of first appearance, and the summed dense tensor."""
    cols = [frame["user"], frame["item"], frame["day"].dt.floor("D"), frame["kind"].astype(str)]
    keys, codes = [], []
    for c in cols:
        code, uniq = pd.factorize(c, sort=False)
        keys.append(list(uniq))
        codes.append(code)
    coords = np.stack(codes, axis=1)
    dense = np.zeros([len(k) for k in keys])
    vals = frame[value].to_numpy(float) if value else np.ones(len(frame))
    np.add.at(dense, tuple(coords.T), vals)
    return keys, coords, dense


def _dense(store) -> np.ndarray:
    c, v = store.to_coo()
    out = np.zeros(store.shape)
    out[tuple(c.T)] = v
    return out


def _convert(src, out, **kw):
    args = dict(modes=MODES, value="count", bucket={"day": "day"}, duplicates="sum", overwrite=True)
    args.update(kw)
    return tfo.convert(src, out, **args)


def _labels(store, m) -> list:
    return store.labels.keys(m).to_pylist()


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_table_converts_to_the_numpy_reference_with_its_labels(tmp_path, rng, kind):
    frame = _events(rng, 600)
    if kind == "parquet":
        path = tmp_path / "events.parquet"
        frame.to_parquet(path)  # pandas: the categorical as a dictionary column, timestamps
    else:
        path = tmp_path / "events.csv"
        frame.to_csv(path, index=False)
    store = _convert(path, tmp_path / "s.zarr")
    keys, _, dense = _reference(frame)
    assert store.shape == dense.shape
    np.testing.assert_allclose(_dense(store), dense)
    got = [_labels(store, m) for m in range(4)]
    assert got[0] == keys[0] and got[1] == keys[1] and got[3] == keys[3]
    assert [pd.Timestamp(d) for d in got[2]] == list(keys[2])
    # reopened: the dictionaries are in the store, described by info
    info = tfo.open_store(tmp_path / "s.zarr").info()["labels"]
    assert [d["name"] for d in info] == MODES and [d["count"] for d in info] == list(dense.shape)
    assert info[0]["key_type"] == "string" and info[1]["key_type"] == "int64"
    assert info[2]["key_type"].startswith("timestamp") and info[3]["key_type"] == "string"


def test_rows_without_a_value_count_one_and_folders_are_read_in_name_order(tmp_path, rng):
    a, b = _events(rng, 200), _events(rng, 150)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pandas(b), tmp_path / "in" / "part-1.parquet")
    pq.write_table(pa.Table.from_pandas(a), tmp_path / "in" / "part-0.parquet")
    store = _convert(tmp_path / "in", tmp_path / "s.zarr", value=None)
    keys, _, dense = _reference(pd.concat([a, b], ignore_index=True), value=None)
    np.testing.assert_allclose(_dense(store), dense)
    assert _labels(store, 0) == keys[0]
    # a glob of the same files gives the same store
    again = _convert(str(tmp_path / "in" / "*.parquet"), tmp_path / "g.zarr", value=None)
    np.testing.assert_allclose(_dense(again), dense)


def test_dataframes_and_arrow_tables_convert_as_files_do(tmp_path, rng):
    frame = _events(rng, 300)
    keys, _, dense = _reference(frame)
    for i, src in enumerate([frame, pa.Table.from_pandas(frame)]):
        store = _convert(src, tmp_path / f"s{i}.zarr")
        np.testing.assert_allclose(_dense(store), dense)
        assert _labels(store, 0) == keys[0]
    dd = pytest.importorskip("dask.dataframe")
    store = _convert(dd.from_pandas(frame, npartitions=3), tmp_path / "dask.zarr")
    np.testing.assert_allclose(_dense(store), dense)


def test_out_of_core_gives_the_same_store(tmp_path, rng):
    frame = _events(rng, 2000, users=300, items=80, days=9)
    frame.to_parquet(tmp_path / "e.parquet", row_group_size=170)
    one = _convert(tmp_path / "e.parquet", tmp_path / "mem.zarr")
    two = _convert(tmp_path / "e.parquet", tmp_path / "ooc.zarr", out_of_core=True, sort_nnz=256)
    np.testing.assert_array_equal(_dense(one), _dense(two))
    assert all(_labels(one, m) == _labels(two, m) for m in range(4))


# --- bad input: file, row, column -------------------------------------------------------------------


def test_null_keys_and_values_are_refused_naming_file_row_and_column(tmp_path, rng):
    frame = _events(rng, 50)
    r = int(rng.integers(3, 50))
    bad = frame.copy()
    bad["user"] = bad["user"].astype(object)
    bad.loc[r, "user"] = None
    path = tmp_path / "nullkey.parquet"
    bad.to_parquet(path, row_group_size=16)
    with pytest.raises(IngestError) as e:
        _convert(path, tmp_path / "a.zarr")
    assert str(path) in str(e.value) and f"row {r + 1}," in str(e.value) and "'user'" in str(e.value)
    assert not (tmp_path / "a.zarr").exists()
    # a null value in a CSV: row and line (the header is line 1)
    csv = tmp_path / "nullvalue.csv"
    bad = frame.copy().astype({"count": float})
    bad.loc[r, "count"] = np.nan
    bad.to_csv(csv, index=False)
    with pytest.raises(IngestError) as e:
        _convert(csv, tmp_path / "b.zarr")
    assert f"line {r + 2}" in str(e.value) and f"row {r + 1}," in str(e.value) and "'count'" in str(e.value)
    # an infinite value in Parquet
    bad = frame.copy().astype({"count": float})
    bad.loc[r, "count"] = np.inf
    bad.to_parquet(tmp_path / "inf.parquet")
    with pytest.raises(IngestError, match=rf"inf.parquet: row {r + 1}, column 'count': value inf"):
        _convert(tmp_path / "inf.parquet", tmp_path / "c.zarr")


def test_bad_csv_rows_are_refused_naming_line_and_column(tmp_path, rng):
    frame = _events(rng, 40)
    r = int(rng.integers(2, 40))
    lines = frame.to_csv(index=False).splitlines()
    words = lines[r + 1].split(",")
    words[-1] = "many"  # not a number in the value column
    text = lines[: r + 1] + [",".join(words)] + lines[r + 2 :]
    (tmp_path / "word.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(IngestError) as e:
        _convert(tmp_path / "word.csv", tmp_path / "a.zarr")
    msg = str(e.value)
    assert "word.csv" in msg and f"line {r + 2}" in msg and "'count'" in msg and "many" in msg
    # a line with a field missing
    text = lines[: r + 1] + [",".join(lines[r + 1].split(",")[:-1])] + lines[r + 2 :]
    (tmp_path / "short.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(IngestError, match=rf"short.csv, line {r + 2}: .*Expected 5 columns, got 4"):
        _convert(tmp_path / "short.csv", tmp_path / "b.zarr")


def test_columns_that_cannot_be_keys_or_values_are_refused(tmp_path, rng):
    frame = _events(rng, 30)
    frame.to_parquet(tmp_path / "e.parquet")
    with pytest.raises(IngestError, match=r"e.parquet: no column 'nope'; the columns are"):
        _convert(tmp_path / "e.parquet", tmp_path / "a.zarr", modes=["user", "nope"], bucket=None)
    with pytest.raises(IngestError, match=r"column 'count' holds numbers with a fraction|'count' holds int"):
        tfo.convert(frame.astype({"count": float}), tmp_path / "b.zarr", modes=["user", "count"])
    with pytest.raises(IngestError, match=r"value column 'user' holds (large_)?string, not numbers"):
        tfo.convert(frame, tmp_path / "c.zarr", modes=["item"], value="user")
    with pytest.raises(IngestError, match=r"'user' holds string, not dates or times"):
        tfo.convert(frame, tmp_path / "d.zarr", modes=["user"], bucket={"user": "day"})
    with pytest.raises(ValueError, match=r"modes="):
        tfo.convert(frame, tmp_path / "e.zarr")
    with pytest.raises(ValueError, match=r"e.parquet is a table: name its key columns"):
        tfo.convert(tmp_path / "e.parquet", tmp_path / "f.zarr")


def test_cli_converts_tables_and_refuses_bad_ones_with_exit_2(tmp_path, rng, capsys):
    frame = _events(rng, 100)
    frame.to_csv(tmp_path / "e.csv", index=False)
    args = ["convert", str(tmp_path / "e.csv"), str(tmp_path / "s.zarr"), "--modes", ",".join(MODES)]
    assert main([*args, "--value", "count", "--bucket", "day=day", "--duplicates", "sum"]) == 0
    out = capsys.readouterr().out
    assert "mode 0 'user'" in out and "bytes a key" in out
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert "labels" in out and "user" in out and "timestamp" in out
    # the next night, appended: the growing modes are reported
    night = _events(rng, 60)
    night.to_csv(tmp_path / "night.csv", index=False)
    args2 = ["convert", str(tmp_path / "night.csv"), str(tmp_path / "s2.zarr"), "--modes", ",".join(MODES)]
    opts = ["--value", "count", "--bucket", "day=day", "--duplicates", "sum", "--append-to", str(tmp_path / "s.zarr")]
    assert main([*args2, *opts]) == 0
    out = capsys.readouterr().out
    grown = tfo.open_store(tmp_path / "s2.zarr").shape[0] - tfo.open_store(tmp_path / "s.zarr").shape[0]
    assert grown > 0 and "mode 0 'user' grew: " in out and f"(+{grown:,})" in out
    # a null key: exit 2, the file, row and column, no traceback
    frame.loc[7, "item"] = None
    frame.to_csv(tmp_path / "bad.csv", index=False)
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", "convert", str(tmp_path / "bad.csv"), str(tmp_path / "b.zarr"),
         "--modes", "user,item", "--duplicates", "sum"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "bad.csv" in r.stderr and "row 8," in r.stderr and "'item'" in r.stderr and "Traceback" not in r.stderr


# --- the dictionaries in the store ----------------------------------------------------------------------


def test_label_files_are_bound_to_the_store(tmp_path, rng):
    frame = _events(rng, 100)
    store = _convert(frame, tmp_path / "s.zarr")
    assert store.labels.modes[0].bytes / store.labels.modes[0].count <= 40
    other = _convert(_events(rng, 100), tmp_path / "o.zarr")
    # a dictionary copied from another store: refused when read
    f = tmp_path / "s.zarr" / "labels" / "mode0.parquet"
    f.write_bytes((tmp_path / "o.zarr" / "labels" / "mode0.parquet").read_bytes())
    with pytest.raises(CorruptStoreError, match=r"label dictionary of mode 0 \('user'\).*checksum differs"):
        tfo.open_store(tmp_path / "s.zarr").labels.keys("user")
    # its recorded count edited in the metadata: the metadata checksum refuses the store
    meta_file = tmp_path / "o.zarr" / "zarr.json"
    meta = json.loads(meta_file.read_text())
    meta["attributes"]["tensorflow_ooc"]["labels"]["modes"][1]["count"] += 1
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(StoreError):
        tfo.open_store(tmp_path / "o.zarr")
    assert other.labels is not None


def test_appends_keep_old_indices_and_equal_one_conversion_of_the_whole_table(tmp_path, rng):
    nights = [_events(rng, 120, users=20 + 5 * k, start=f"2026-03-0{k + 1}", days=1) for k in range(4)]
    prev = None
    for k, night in enumerate(nights):
        night.to_parquet(tmp_path / f"night{k}.parquet")
        store = _convert(tmp_path / f"night{k}.parquet", tmp_path / f"v{k}.zarr", append_to=prev)
        if prev is not None:
            old = tfo.open_store(prev)
            for m in range(4):
                assert _labels(store, m)[: old.shape[m]] == _labels(old, m)  # never renumbered
                assert store.shape[m] >= old.shape[m]
        prev = tmp_path / f"v{k}.zarr"
    whole = _convert(pd.concat(nights, ignore_index=True), tmp_path / "whole.zarr")
    assert store.shape == whole.shape and store.shape[2] == 4  # a day a night
    assert all(_labels(store, m) == _labels(whole, m) for m in range(4))
    np.testing.assert_allclose(_dense(store), _dense(whole))
    # appending to a store of coordinates is refused
    plain = tfo.convert((np.array([[0, 1, 0, 0]]), np.array([1.0])), tmp_path / "plain.zarr")
    with pytest.raises(IngestError, match="no label dictionaries"):
        _convert(tmp_path / "night0.parquet", tmp_path / "x.zarr", append_to=plain.path)


# --- labelled results -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    rng = np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))
    tmp = tmp_path_factory.mktemp("labelled")
    frame = _events(rng, 800, users=40, items=15, days=6)
    frame.to_parquet(tmp / "e.parquet")
    store = _convert(tmp / "e.parquet", tmp / "s.zarr")
    result = tfo.cp_als(store, rank=3, seed=7, max_iters=15, tol=0)
    return tmp, frame, store, result


def test_factor_frames_equal_the_numpy_reference_with_the_same_mapping(labelled):
    tmp, frame, store, result = labelled
    keys, coords, dense = _reference(frame)
    # the reference: the dense NumPy tensor of the keys numbered by pandas, CP-ALS of the same seed
    ref = tfo.cp_als(tfo.open_dense(dense), rank=3, seed=7, max_iters=15, tol=0)
    for m, name in enumerate(MODES):
        got = result.factor_frame(name)
        assert got.index.name == name and list(got.columns) == ["c0", "c1", "c2"]
        want_index = [pd.Timestamp(k) for k in keys[m]] if name == "day" else list(keys[m])
        assert [pd.Timestamp(k) if name == "day" else k for k in got.index] == want_index
        np.testing.assert_allclose(got.to_numpy(), ref.factors[m], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result.weights, ref.weights, rtol=1e-9)
    assert result.fit == pytest.approx(ref.fit, rel=1e-9)


def test_top_keys_predict_and_parquet_export(labelled, tmp_path):
    tmp, frame, store, result = labelled
    top = result.top_keys("user", k=3)
    ff = result.factor_frame("user")
    for r in range(3):
        rows = top[top.component == r]
        assert list(rows["user"]) == list(ff[f"c{r}"].sort_values(ascending=False).index[:3])
    # predict at keys: the model's entries at those coordinates
    sample = frame.sample(5, random_state=1)
    keys = {"user": sample["user"], "item": sample["item"], "day": sample["day"].dt.floor("D"),
            "kind": sample["kind"].astype(str)}  # fmt: skip
    got = result.predict(keys)
    full = result.full()
    idx = [[ff.index.get_loc(u) for u in keys["user"]],
           [list(result.factor_frame("item").index).index(i) for i in keys["item"]],
           [list(result.factor_frame("day").index).index(d) for d in keys["day"]],
           [list(result.factor_frame("kind").index).index(k) for k in keys["kind"]]]  # fmt: skip
    np.testing.assert_allclose(got["prediction"], full[tuple(np.array(idx))])
    unknown = dict(keys, user=list(keys["user"][:-1]) + ["nobody"])
    with pytest.raises(KeyError, match=r"mode 'user': 1 key\(s\) the model does not know: 'nobody'"):
        result.predict(unknown)
    skipped = result.predict(unknown, unknown="skip")
    assert len(skipped) == 4 and "nobody" not in set(skipped["user"])
    # exported with the keys; a saved result finds its labels again
    files = result.to_parquet(tmp_path / "export")
    back = pd.read_parquet(tmp_path / "export" / "user.parquet")
    assert list(back["user"]) == list(ff.index) and np.allclose(back[["c0", "c1", "c2"]], ff)
    assert len(files) == 5
    result.save(tmp_path / "r.zarr")
    np.testing.assert_array_equal(tfo.load_result(tmp_path / "r.zarr").factor_frame("item"), result.factor_frame(1))


def test_labels_from_a_later_version_serve_and_others_are_refused(labelled, rng):
    tmp, frame, store, result = labelled
    later = _convert(_events(rng, 50, users=4), tmp / "later.zarr", append_to=store.path)
    assert later.shape[0] > store.shape[0]
    np.testing.assert_array_equal(result.factor_frame("user", labels=later).index, result.factor_frame("user").index)
    other = _convert(_events(rng, 900, users=45), tmp / "other.zarr")
    with pytest.raises(StoreError, match="not those the result was computed with"):
        result.factor_frame("user", labels=other)
    plain = tfo.cp_als(tfo.convert((np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0])), tmp / "p.zarr"), rank=1)
    with pytest.raises(StoreError, match="no label dictionaries"):
        plain.factor_frame(0)


def test_dictionaries_stay_small_for_many_keys(tmp_path, rng):
    n = 200_000
    users = np.array([f"user{i:07d}" for i in rng.permutation(n)])
    frame = pd.DataFrame({"user": users, "item": rng.integers(0, 10**9, n), "count": np.ones(n)})
    store = tfo.convert(frame, tmp_path / "s.zarr", modes=["user", "item"], value="count")
    for d in store.labels.describe():
        assert d["bytes_per_key"] <= 40, d
    assert store.labels.keys("user").to_pylist() == list(users)


def test_a_table_in_object_storage_converts(tmp_path, rng):
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    import fsspec
    from s3_server import s3_server

    a, b = _events(rng, 80), _events(rng, 60)
    with s3_server() as bucket:
        fs = fsspec.filesystem("s3")
        for name, part in (("part-0.parquet", a), ("part-1.parquet", b)):
            with fs.open(f"{bucket}/events/{name}", "wb") as f:
                part.to_parquet(f)
        # a folder in object storage into a store in object storage
        store = _convert(f"{bucket}/events/", f"{bucket}/events.zarr")
        keys, _, dense = _reference(pd.concat([a, b], ignore_index=True))
        np.testing.assert_allclose(_dense(store), dense)
        again = tfo.open_store(f"{bucket}/events.zarr")
        assert again.labels.keys("user").to_pylist() == keys[0]


def test_key_dictionary_numbers_like_pandas_factorize(rng):
    from tensorflow_ooc.ingest.key_dictionary import KeyDictionary

    # long keys sharing their first 16 bytes, empty and one-byte keys, in batches that grow the table
    pool = [f"a-long-common-prefix-{i}" for i in range(3000)] + ["", "x", "é", "a-long-common-prefix-"]
    batches = [list(rng.choice(pool, int(rng.integers(1, 4000)))) for _ in range(5)]
    d = KeyDictionary("k")
    got = np.concatenate([d.index(pa.array(b)) for b in batches])
    codes, uniq = pd.factorize(pd.Series(sum(batches, [])), sort=False)
    np.testing.assert_array_equal(got, codes)
    assert d.finished().to_pylist() == list(uniq)
    # integers and dates, and a dictionary (categorical) column, continue the same way
    ints = KeyDictionary("i")
    vals = rng.integers(-(2**62), 2**62, 50)[rng.integers(0, 50, 3000)]
    np.testing.assert_array_equal(ints.index(pa.array(vals)), pd.factorize(vals)[0])
    cat = pd.Categorical(rng.choice(["b", "a", "c"], 40), categories=["c", "b", "a"])
    cats = KeyDictionary("c")
    np.testing.assert_array_equal(cats.index(pa.array(cat)), pd.factorize(np.asarray(cat))[0])


def test_tucker_and_completion_results_carry_the_labels(labelled, rng):
    tmp, frame, store, _ = labelled
    keys, coords, dense = _reference(frame)
    tucker = tfo.tucker_hooi(store, [3, 2, 2, 2], seed=3, max_iters=5)
    full = np.einsum("abcd,ia,jb,kc,ld->ijkl", tucker.core, *tucker.factors)
    for m, name in enumerate(MODES):
        ff = tucker.factor_frame(name)
        assert ff.shape == (dense.shape[m], tucker.ranks[m]) and ff.index.name == name
        np.testing.assert_array_equal(ff.to_numpy(), tucker.factors[m])
    sample = frame.sample(6, random_state=int(rng.integers(1 << 30)))
    at = {"user": sample["user"], "item": sample["item"], "day": sample["day"].dt.floor("D"),
          "kind": sample["kind"].astype(str)}  # fmt: skip
    idx = tuple(np.array([list(tucker.factor_frame(n).index).index(k) for k in at[n]]) for n in MODES)
    np.testing.assert_allclose(tucker.predict(at)["prediction"], full[idx], rtol=1e-12, atol=1e-14)
    assert len(tucker.top_keys("item", k=2)) == 2 * tucker.ranks[1]
    fast = tfo.tucker_sgd(store, 2, core_rank=2, epochs=2, seed=1)
    got = fast.predict(at)
    np.testing.assert_allclose(got["prediction"], fast.predict(np.stack(idx, axis=1)), rtol=0, atol=0)
    assert fast.factor_frame("user").shape == (dense.shape[0], 2)
    with pytest.raises(KeyError, match="does not know"):
        fast.predict(dict(at, user=["nobody"] * len(sample)))
