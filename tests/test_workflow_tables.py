"""A nightly pipeline of tables: five nights of Parquet files appended to a versioned store, whose
label dictionaries keep every old key's index (new keys get the next ones, growing modes are
reported), CP warm-starting each night; the last version equals one conversion of the
concatenated table, so a run of the same seed gives the same labelled factors; the factors are
exported to Parquet with their keys and predicted at keys (unknown ones skipped)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.workflow import load_spec
from tensorflow_ooc.workflow.runner import execute

SPEC = """\
name: nightly-tables
steps:
  ingest:
    kind: convert
    input: incoming/
    out: tensor
    append: true
    duplicates: sum
    modes: [user, item, day]
    value: count
    bucket: {day: day}
  decompose:
    kind: decompose
    input: tensor
    out: cp.zarr
    rank: 3
    init: previous
    max_iters: 4
    seed: 3
  export:
    kind: export
    result: cp.zarr
    format: parquet
    out: published/factors
  predict:
    kind: predict
    result: cp.zarr
    coords: wanted.csv
    out: published/predictions.parquet
    unknown: skip
"""


def _night(rng, k: int, users: int) -> pd.DataFrame:
    n = 150
    return pd.DataFrame(
        {
            "user": [f"u{int(i)}" for i in rng.integers(0, users, n)],  # more users each night
            "item": rng.choice(["apple", "pear", "fig", "kiwi", "plum", f"new-{k}"], n),
            "day": pd.Timestamp("2026-04-01") + pd.Timedelta(days=k) + pd.to_timedelta(rng.integers(0, 86_399, n), "s"),
            "count": rng.integers(1, 4, n),
        }
    )


def _versions(storage: Path) -> list[dict]:
    return json.loads((storage / "tensor" / "versions.json").read_text())["versions"]


def _coo(store) -> dict:
    c, v = store.to_coo()
    return {tuple(map(int, r)): float(x) for r, x in zip(c, v)}


def test_five_nights_keep_old_indices_warm_start_and_equal_one_conversion(tmp_path, rng):
    storage = tmp_path / "storage"
    (storage / "incoming").mkdir(parents=True)
    spec = tmp_path / "nightly.yaml"
    spec.write_text(SPEC)
    nights = [_night(rng, k, users=8 + 6 * k) for k in range(5)]
    wanted = pd.DataFrame({"user": ["u1", "u2", "nobody"], "item": ["pear", "fig", "fig"],
                           "day": ["2026-04-01", "2026-04-01", "2026-04-02"]})  # fmt: skip
    wanted.to_csv(storage / "wanted.csv", index=False)
    previous = None
    for k, night in enumerate(nights):
        night.to_parquet(storage / "incoming" / f"night{k}.parquet")
        outcome = execute(load_spec(spec, storage=str(storage)))
        assert outcome.exit_code == 0, outcome.record.error
        steps = outcome.record.steps
        store = tfo.open_store(storage / "tensor" / _versions(storage)[-1]["path"])
        seen = pd.concat(nights[: k + 1], ignore_index=True)
        assert store.labels.keys("user").to_pylist() == list(pd.unique(seen["user"]))
        if previous is not None:
            for m in range(3):  # every old key keeps its index
                assert store.labels.keys(m).to_pylist()[: previous.shape[m]] == previous.labels.keys(m).to_pylist()
            grown = steps["ingest"].metrics["grown"]
            assert grown["day"] == {"from": k, "to": k + 1, "new_keys": 1}
            new_users = store.shape[0] - previous.shape[0]
            assert grown.get("user", {"new_keys": 0})["new_keys"] == new_users
            assert steps["decompose"].metrics["warm_start"] is not None  # warm-started from last night
        previous = store
    # the last version is the whole table converted at once: same keys, same nonzeros
    whole = tfo.convert(
        pd.concat(nights, ignore_index=True), tmp_path / "whole.zarr",
        modes=["user", "item", "day"], value="count", bucket={"day": "day"}, duplicates="sum",
    )  # fmt: skip
    assert whole.shape == store.shape
    assert all(whole.labels.keys(m).to_pylist() == store.labels.keys(m).to_pylist() for m in range(3))
    assert _coo(whole) == pytest.approx(_coo(store))
    # and a run of the same seed gives the same labelled factors
    a = tfo.cp_als(store, rank=3, seed=11, max_iters=10, tol=0)
    b = tfo.cp_als(whole, rank=3, seed=11, max_iters=10, tol=0)
    for name in ("user", "item", "day"):
        pd.testing.assert_frame_equal(a.factor_frame(name), b.factor_frame(name), rtol=1e-9)
    # the published factors carry the keys; predictions at keys skip the unknown one
    result = tfo.load_result(storage / "cp.zarr")
    users = pd.read_parquet(storage / "published" / "factors" / "user.parquet")
    assert list(users["user"]) == store.labels.keys("user").to_pylist()
    np.testing.assert_allclose(users[["c0", "c1", "c2"]].to_numpy(), result.factors[0])
    got = pd.read_parquet(storage / "published" / "predictions.parquet")
    assert list(got["user"]) == ["u1", "u2"]
    want = result.predict({c: wanted[c][:2] for c in ("user", "item")} | {"day": pd.to_datetime(wanted["day"][:2])})
    np.testing.assert_allclose(got["prediction"], want["prediction"])


def test_the_shipped_nightly_tables_flow_runs_two_nights(tmp_path, rng):
    storage = tmp_path / "storage"
    inc = storage / "events" / "incoming"
    inc.mkdir(parents=True)
    spec = Path(__file__).resolve().parent.parent / "workflows" / "nightly-tables.yaml"
    mine = tmp_path / "nightly-tables.yaml"
    mine.write_text(spec.read_text().replace("rank: 16", "rank: 2").replace("max_iters: 50", "max_iters: 3"))
    pd.DataFrame({"user": ["u1", "zz"], "item": ["fig", "fig"], "ts": ["2026-04-01", "2026-04-01"]}).to_csv(
        storage / "events" / "wanted.csv", index=False
    )
    for k in range(2):
        _night(rng, k, users=10 + 5 * k).rename(columns={"day": "ts"}).to_csv(inc / f"night{k}.csv", index=False)
        outcome = execute(load_spec(mine, storage=str(storage)))
        assert outcome.exit_code == 0, outcome.record.error
    assert outcome.record.steps["ingest"].metrics["grown"]["ts"] == {"from": 1, "to": 2, "new_keys": 1}
    factors = pd.read_parquet(storage / "events" / "published" / "factors" / "ts.parquet")
    assert [str(t)[:10] for t in factors["ts"]] == ["2026-04-01", "2026-04-02"]
    scores = pd.read_parquet(storage / "events" / "published" / "scores.parquet")
    assert list(scores["user"]) == ["u1"] and outcome.record.steps["score"].metrics["skipped"] == 1  # zz: unknown
