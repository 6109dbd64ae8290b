"""Nightly ingestion by content: a touched, renamed or copied file that was ingested before is never
appended again; a file whose content changed under an ingested name is an error naming it, unless
``on_changed`` says to append it or rebuild the version. Real files, real versioned stores; the
stores' nonzeros are checked against sums computed here from the files."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.runner import execute

SPEC = """\
name: nightly
steps:
  ingest:
    kind: convert
    input: incoming/
    out: tensor
    append: true
    duplicates: sum{extra}
"""


def _tns(path: Path, coords: np.ndarray, values: np.ndarray) -> None:
    lines = [" ".join(str(int(i) + 1) for i in c) + f" {v:.6f}" for c, v in zip(coords, values)]
    path.write_text("\n".join(lines) + "\n")


def _read(path: Path) -> dict:
    out: dict = {}
    for line in path.read_text().splitlines():
        *idx, v = line.split()
        key = tuple(int(i) - 1 for i in idx)
        out[key] = out.get(key, 0.0) + float(v)
    return out


def _sum(*parts: dict) -> dict:
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _random_file(rng, path: Path, shape=(12, 10, 8), nnz=150) -> dict:
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    values = np.round(rng.uniform(0.5, 2.0, nnz), 6)
    _tns(path, coords, values)
    return _read(path)


def _versions(storage: Path) -> list[dict]:
    return json.loads((storage / "tensor" / "versions.json").read_text())["versions"]


def _latest(storage: Path) -> dict:
    store = tfo.open_store(storage / "tensor" / _versions(storage)[-1]["path"])
    c, v = store.to_coo()
    return {tuple(int(i) for i in row): float(x) for row, x in zip(c, v)}


def _assert_same(got: dict, want: dict) -> None:
    want = {k: v for k, v in want.items() if v != 0}
    assert set(got) == set(want), (len(got), len(want))
    keys = sorted(want)
    np.testing.assert_allclose([got[k] for k in keys], [want[k] for k in keys], rtol=1e-12)


@pytest.fixture
def nightly(tmp_path):
    storage = tmp_path / "storage"
    (storage / "incoming").mkdir(parents=True)

    def setup(extra: str = "") -> Path:
        spec = tmp_path / "nightly.yaml"
        spec.write_text(SPEC.format(extra=extra))
        return spec

    return storage, setup


def _run(spec: Path, storage: Path) -> int:
    return main(["run", str(spec), "--storage", str(storage)])


def _later(path: Path) -> None:
    st = os.stat(path)
    os.utime(path, (st.st_atime + 3600, st.st_mtime + 3600))


def test_touch_rename_and_copies_are_not_appended_again(nightly, rng, capsys):
    storage, setup = nightly
    spec = setup()
    inc = storage / "incoming"
    day1 = _random_file(rng, inc / "day1.tns")
    assert _run(spec, storage) == 0
    assert len(_versions(storage)) == 1
    rec = _versions(storage)[0]["files"][0]
    assert rec["sha256"] and rec["version"] == 1 and rec["size"] == (inc / "day1.tns").stat().st_size
    # touch: same content, newer time -> the ingest looks, finds nothing new: run skipped (exit 3)
    _later(inc / "day1.tns")
    capsys.readouterr()
    assert _run(spec, storage) == 3
    assert "nothing new" in capsys.readouterr().out
    assert len(_versions(storage)) == 1
    _assert_same(_latest(storage), day1)
    # rename: the same content under another name is not new either
    (inc / "day1.tns").rename(inc / "day1-renamed.tns")
    assert _run(spec, storage) == 3
    assert len(_versions(storage)) == 1
    # a new file and a copy of it in the same batch: appended once
    day2 = _random_file(rng, inc / "day2.tns")
    shutil.copy(inc / "day2.tns", inc / "day2-copy.tns")
    assert _run(spec, storage) == 0
    v = _versions(storage)
    assert len(v) == 2 and len(v[-1]["new_files"]) == 1  # the first by name: day2-copy.tns
    _assert_same(_latest(storage), _sum(day1, day2))


def test_touch_in_the_shipped_nightly_flow_publishes_nothing(tmp_path, rng):
    # the shipped spec, as the issue ran it: ingest -> decompose -> evaluate -> publish
    storage = tmp_path / "storage"
    inc = storage / "nightly" / "incoming"
    inc.mkdir(parents=True)
    spec = Path(__file__).resolve().parent.parent / "workflows" / "nightly.yaml"
    text = spec.read_text().replace("rank: 16", "rank: 2").replace("max_iters: 50", "max_iters: 3")
    mine = tmp_path / "nightly.yaml"
    mine.write_text(text)
    day1 = _random_file(rng, inc / "day1.tns")
    one = execute(load_spec(mine, storage=str(storage)))
    assert one.exit_code == 0, one.record.error
    published = (storage / "nightly" / "published" / "factors.npz").stat().st_mtime_ns
    _later(inc / "day1.tns")
    two = execute(load_spec(mine, storage=str(storage)))
    assert two.exit_code == 3, two.record.error
    assert two.record.steps["ingest"].state == "skipped" and two.record.steps["ingest"].metrics["new_files"] == 0
    assert {n: s.state for n, s in two.record.steps.items()} == {
        "ingest": "skipped",
        "decompose": "skipped",
        "evaluate": "skipped",
        "publish": "skipped",
    }
    assert (storage / "nightly" / "published" / "factors.npz").stat().st_mtime_ns == published
    versions = json.loads((storage / "nightly" / "tensor" / "versions.json").read_text())["versions"]
    assert len(versions) == 1
    store = tfo.open_store(storage / "nightly" / "tensor" / versions[0]["path"])
    assert np.isclose(store.to_coo()[1].sum(), sum(day1.values()))


def test_edited_file_is_an_error_naming_it(nightly, rng, capsys):
    storage, setup = nightly
    spec = setup()
    inc = storage / "incoming"
    day1 = _random_file(rng, inc / "day1.tns")
    assert _run(spec, storage) == 0
    _random_file(rng, inc / "day1.tns")  # new content under the ingested name
    _random_file(rng, inc / "day2.tns")  # and a genuinely new file in the same batch
    capsys.readouterr()
    code = _run(spec, storage)
    err = capsys.readouterr().err
    assert code == 1
    assert str(inc / "day1.tns") in err and "changed since they were ingested" in err and "on_changed" in err
    assert "day2.tns" not in err.split("changed since")[1].split("on_changed")[0]
    # nothing was appended: the store is still version 1 with day 1's values
    assert len(_versions(storage)) == 1
    _assert_same(_latest(storage), day1)
    # and the error stays until the operator decides
    assert _run(spec, storage) == 1


@pytest.mark.parametrize("policy", ["append", "replace-version"])
def test_on_changed_policies(nightly, rng, policy):
    storage, setup = nightly
    spec = setup(f"\n    on_changed: {policy}")
    inc = storage / "incoming"
    day1 = _random_file(rng, inc / "day1.tns")
    assert _run(spec, storage) == 0
    day2 = _random_file(rng, inc / "day2.tns")
    assert _run(spec, storage) == 0
    # day 1 is corrected: a longer mode 0 too (the tensor grows)
    day1_new = _random_file(rng, inc / "day1.tns", shape=(15, 10, 8), nnz=120)
    # the rename of day 2 must not matter: its content is found under any name
    (inc / "day2.tns").rename(inc / "day2-renamed.tns")
    assert _run(spec, storage) == 0
    v = _versions(storage)
    assert len(v) == 3
    if policy == "append":
        _assert_same(_latest(storage), _sum(day1, day2, day1_new))
        assert v[-1]["new_files"] == [str(inc / "day1.tns")]
    else:
        _assert_same(_latest(storage), _sum(day1_new, day2))
        assert v[-1]["replaced_files"] == [str(inc / "day1.tns")]
    assert tfo.open_store(storage / "tensor" / v[-1]["path"]).shape[0] >= 15
    # the changed file's new content is recorded: running again finds nothing new
    assert _run(spec, storage) == 3
    assert len(_versions(storage)) == 3


def test_replace_version_needs_every_ingested_file(nightly, rng, capsys):
    storage, setup = nightly
    spec = setup("\n    on_changed: replace-version")
    inc = storage / "incoming"
    day1 = _random_file(rng, inc / "day1.tns")
    _random_file(rng, inc / "day2.tns")
    assert _run(spec, storage) == 0
    before = _latest(storage)
    (inc / "day2.tns").unlink()
    _random_file(rng, inc / "day1.tns")
    capsys.readouterr()
    assert _run(spec, storage) == 1
    err = capsys.readouterr().err
    assert "replace-version" in err and str(inc / "day2.tns") in err and "no longer in" in err
    assert len(_versions(storage)) == 1 and _latest(storage) == before
    assert set(before) >= set(day1)


def test_store_from_before_content_hashes(nightly, rng, capsys):
    storage, setup = nightly
    spec = setup()
    inc = storage / "incoming"
    day1 = _random_file(rng, inc / "day1.tns")
    assert _run(spec, storage) == 0
    # a versions.json as the previous release wrote it: location, size and time only
    path = storage / "tensor" / "versions.json"
    legacy = json.loads(path.read_text())
    for v in legacy["versions"]:
        v["files"] = [{k: f[k] for k in ("location", "size", "time")} for f in v["files"]]
    path.write_text(json.dumps(legacy, indent=1))
    saved = path.read_text()
    # a recorded file whose time changed cannot be told apart from an edit: an error, not a doubling
    st = os.stat(inc / "day1.tns")
    _later(inc / "day1.tns")
    assert _run(spec, storage) == 1
    assert "recorded before content hashes" in capsys.readouterr().err
    assert len(_versions(storage)) == 1
    # as recorded (same size and time): recognized, and its hash is kept from now on
    os.utime(inc / "day1.tns", ns=(st.st_atime_ns, st.st_mtime_ns))
    path.write_text(saved)
    assert _run(spec, storage) in (0, 3)
    v = _versions(storage)
    assert len(v) == 1 and v[0]["files"][0]["sha256"]
    _later(inc / "day1.tns")
    assert _run(spec, storage) == 3
    assert len(_versions(storage)) == 1
    _assert_same(_latest(storage), day1)


@pytest.mark.parametrize(
    "extra, field, message",
    [
        ("\n    on_changed: sometimes", "steps.ingest.on_changed", "expected 'error', 'replace-version' or 'append'"),
    ],
)
def test_on_changed_is_validated(nightly, extra, field, message):
    storage, setup = nightly
    spec = setup(extra)
    with pytest.raises(SpecError) as info:
        load_spec(spec, storage=str(storage))
    p = info.value.problems[0]
    assert p.field == field and message in p.message and p.line == 9, str(info.value)
    spec.write_text(
        spec.read_text().replace("on_changed: sometimes", "on_changed: append").replace("append: true", "append: false")
    )
    with pytest.raises(SpecError, match="'on_changed' is only for append: true"):
        load_spec(spec, storage=str(storage))


def test_appended_versions_keep_the_fiber_index(nightly, rng):
    storage, setup = nightly
    spec = setup("\n    fiber_index: [0, 2]")
    first = _random_file(rng, storage / "incoming" / "a.tns")
    assert _run(spec, storage) == 0
    store = tfo.open_store(storage / "tensor" / _versions(storage)[-1]["path"])
    assert store.fiber_modes() == [0, 2]
    second = _random_file(rng, storage / "incoming" / "b.tns")
    assert _run(setup(), storage) == 0  # the spec no longer names the modes: the index is kept
    store = tfo.open_store(storage / "tensor" / _versions(storage)[-1]["path"])
    assert len(_versions(storage)) == 2 and store.fiber_modes() == [0, 2]
    _assert_same(_latest(storage), _sum(first, second))
    coords, values = store.to_coo()
    got = store.fibers.mode(2).read(np.arange(store.fibers.mode(2).nchunks))
    assert got.keys.shape[0] == store.nnz and np.isclose(np.sort(got.values).sum(), np.sort(values).sum())


def test_appended_versions_keep_the_mode_copies(nightly, rng):
    storage, setup = nightly
    spec = setup()
    first = _random_file(rng, storage / "incoming" / "a.tns")
    assert _run(spec, storage) == 0
    old = tfo.build_mode_copies(storage / "tensor" / _versions(storage)[-1]["path"], [0, 2])
    assert old.copy_modes() == [0, 2]
    second = _random_file(rng, storage / "incoming" / "b.tns")
    assert _run(spec, storage) == 0
    store = tfo.open_store(storage / "tensor" / _versions(storage)[-1]["path"])
    # written again for the new version's chunks (bound to it, not to the old version)
    assert len(_versions(storage)) == 2 and store.copy_modes() == [0, 2]
    assert store.mode_copies.meta["store_id"] == store.meta["store_id"] != old.meta["store_id"]
    want = _sum(first, second)
    factors = [rng.standard_normal((s, 3)) for s in store.shape]
    for m in (0, 2):
        ref = np.zeros((store.shape[m], 3))
        for k, v in want.items():
            ref[k[m]] += v * np.prod([factors[n][k[n]] for n in range(3) if n != m], axis=0)
        np.testing.assert_allclose(tfo.mttkrp(store, factors, m), ref, rtol=1e-10, atol=1e-12)
