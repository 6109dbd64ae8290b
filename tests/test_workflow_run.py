"""Workflows in the foreground: run -> done, again -> skipped (exit 3), changes rerun only what they
touch, a failed run resumes from its last finished step, exports, nightly appends with a warm
start, and an fsspec URL as the storage root."""

import io
import json
import pickle
import uuid

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import load_spec
from tensorflow_ooc.workflow.records import RunStore
from tensorflow_ooc.workflow.runner import execute

SPEC = """\
name: small
steps:
  generate:
    kind: generate
    out: t.tns
    shape: [{shape}]
    nnz: {nnz}
    model: planted
    rank: {rank}
    noise: 0.05
    seed: {seed}
  convert:
    kind: convert
    input: t.tns
    out: t.zarr
  decompose:
    kind: decompose
    input: t.zarr
    out: t.cp.zarr
    rank: {rank}
    max_iters: 30
    seed: {seed}
  evaluate:
    kind: evaluate
    result: t.cp.zarr
    tensor: t.zarr
    reference: t.factors.npz
    out: t.evaluation.json{extra}
  npz: {{kind: export, result: t.cp.zarr, format: npz, out: out/t.npz}}
  pyttb: {{kind: export, result: t.cp.zarr, format: pyttb, out: out/t.ktensor}}
  tensorly: {{kind: export, result: t.cp.zarr, format: tensorly, out: out/t.pkl}}
  zarr: {{kind: export, result: t.cp.zarr, format: zarr, out: out/t.zarr}}
"""


def _write(tmp_path, rng, rank=None, extra=""):
    params = {
        "shape": ", ".join(str(int(rng.integers(15, 40))) for _ in range(3)),
        "nnz": int(rng.integers(2000, 5000)),
        "rank": rank or int(rng.integers(2, 5)),
        "seed": int(rng.integers(1 << 30)),
        "extra": extra,
    }
    path = tmp_path / "small.yaml"
    path.write_text(SPEC.format(**params))
    return path, params


def _states(rec):
    return {name: st.state for name, st in rec.steps.items()}


def test_run_done_then_skipped_then_only_changes_rerun(tmp_path, rng, capsys):
    path, params = _write(tmp_path, rng)
    storage = tmp_path / "storage"
    assert main(["run", str(path), "--storage", str(storage)]) == 0  # not -q: the summary is read
    out = capsys.readouterr().out
    runs = RunStore(str(storage))
    first = runs.list()[0]
    assert first.state == "done" and first.exit_code == 0 and set(_states(first).values()) == {"done"}
    assert f"run {first.run_id}: done" in out and "factor match score" in out
    dec, ev = first.steps["decompose"].metrics, first.steps["evaluate"].metrics
    # the evaluation recomputes the fit by streaming the store: it must agree with CP-ALS's own
    assert abs(ev["fit"] - dec["fit"]) < 1e-8 and 0 < dec["fit"] <= 1
    assert 0 <= ev["fms"] <= ev["congruence"] <= 1 + 1e-12
    assert json.loads((storage / "t.evaluation.json").read_text())["fms"] == ev["fms"]
    # exports hold the result
    result = tfo.load_result(storage / "t.cp.zarr")
    z = np.load(storage / "out" / "t.npz")
    assert np.allclose(z["weights"], result.weights) and np.allclose(z["factor1"], result.factors[1])
    import pyttb

    k = pyttb.import_data(str(storage / "out" / "t.ktensor"))
    assert np.allclose(k.weights, result.weights, rtol=1e-6)
    cp = pickle.loads((storage / "out" / "t.pkl").read_bytes())
    assert np.allclose(cp.factors[2], result.factors[2])
    assert np.allclose(tfo.load_result(storage / "out" / "t.zarr").factors[0], result.factors[0])
    events = runs.events(first.run_id)
    its = [e for e in events if e["event"] == "iteration"]
    assert [e["iteration"] for e in its] == list(range(1, dec["iterations"] + 1))
    assert events[0]["event"] == "run-started" and events[-1]["event"] == "run-finished"

    # again: everything up to date
    assert main(["run", str(path), "--storage", str(storage), "-q"]) == 3
    second = runs.list()[0]
    assert second.run_id != first.run_id and second.state == "skipped" and second.exit_code == 3
    assert set(_states(second).values()) == {"skipped"}

    # a new rank reruns the decomposition and what reads it, not the generator or the converter
    path.write_text(
        path.read_text().replace(f"rank: {params['rank']}\n    max_iters", f"rank: {params['rank'] + 1}\n    max_iters")
    )
    assert main(["run", str(path), "--storage", str(storage), "-q"]) == 0
    third = runs.list()[0]
    assert _states(third) == {
        "generate": "skipped",
        "convert": "skipped",
        "decompose": "done",
        "evaluate": "done",
        "npz": "done",
        "pyttb": "done",
        "tensorly": "done",
        "zarr": "done",
    }
    assert tfo.load_result(storage / "t.cp.zarr").rank == params["rank"] + 1

    # an output replaced behind the workflow's back is rewritten; --force reruns everything
    (storage / "out" / "t.pkl").write_bytes(b"not a model")
    assert main(["run", str(path), "--storage", str(storage), "-q"]) == 0
    assert [n for n, s in _states(runs.list()[0]).items() if s == "done"] == ["tensorly"]
    assert main(["run", str(path), "--storage", str(storage), "-q", "--force"]) == 0
    assert set(_states(runs.list()[0]).values()) == {"done"}


def test_failed_run_resumes_from_its_last_finished_step(tmp_path, rng, capsys):
    path, _ = _write(tmp_path, rng, extra="\n    min_fit: 1.5")
    storage = tmp_path / "storage"
    assert main(["run", str(path), "--storage", str(storage), "-q"]) == 1
    err = capsys.readouterr().err
    runs = RunStore(str(storage))
    failed = runs.list()[0]
    assert failed.state == "failed" and failed.exit_code == 1 and "min_fit 1.5" in failed.error
    assert _states(failed)["evaluate"] == "failed" and _states(failed)["npz"] == "not run"
    assert "fit" in failed.steps["evaluate"].metrics  # the failing numbers are kept
    assert f"tfooc logs {failed.run_id}" in err and not (storage / "t.evaluation.json").exists()
    assert any(e["event"] == "error" and "StepFailed" in e["message"] for e in runs.events(failed.run_id))
    path.write_text(path.read_text().replace("\n    min_fit: 1.5", "\n    min_fit: 0.0"))
    assert main(["run", str(path), "--storage", str(storage)]) == 0  # not -q: the summary is read
    resumed = runs.list()[0]
    assert _states(resumed)["generate"] == _states(resumed)["convert"] == _states(resumed)["decompose"] == "skipped"
    assert _states(resumed)["evaluate"] == "done" and _states(resumed)["zarr"] == "done"
    assert main(["status", resumed.run_id[:-2], "--storage", str(storage)]) == 0
    assert "evaluate   done" in capsys.readouterr().out


NIGHTLY = """\
name: nightly
steps:
  ingest: {{kind: convert, input: incoming/, out: tensor, append: true, duplicates: sum, keep_versions: 2}}
  decompose: {{kind: decompose, input: tensor, out: cp.zarr, rank: {rank}, init: previous, max_iters: 40,
              seed: {seed}}}
  evaluate: {{kind: evaluate, result: cp.zarr, tensor: tensor, out: evaluation.json}}
"""


def test_nightly_appends_versions_and_warm_starts_with_grown_rows(tmp_path, rng):
    storage = tmp_path / "storage"
    incoming = storage / "incoming"
    incoming.mkdir(parents=True)
    shape = tuple(int(rng.integers(20, 40)) for _ in range(3))
    rank = int(rng.integers(2, 4))
    p = synthetic.planted_cp(shape, rank, 3000, noise=0.02, seed=int(rng.integers(1 << 30)))
    # the last three non-empty slices of mode 0 arrive on day 2 (heavy tails can leave the very
    # last slices empty, which would make day 2 an empty file)
    grow = p.coords[:, 0] >= np.unique(p.coords[:, 0])[-3]
    synthetic.write_tns(incoming / "day1.tns", [(p.coords[~grow], np.round(p.values[~grow], 6))])
    path = tmp_path / "nightly.yaml"
    path.write_text(NIGHTLY.format(rank=rank, seed=int(rng.integers(1000))))
    wf = load_spec(path, storage=str(storage))
    one = execute(wf)
    assert one.exit_code == 0 and one.record.steps["ingest"].metrics["version"] == 1
    assert one.record.steps["decompose"].metrics["warm_start"] is None  # no previous result yet
    assert execute(load_spec(path, storage=str(storage))).exit_code == 3  # nothing new: skipped
    synthetic.write_tns(incoming / "day2.tns", [(p.coords[grow], np.round(p.values[grow], 6))])
    two = execute(load_spec(path, storage=str(storage)))
    assert two.exit_code == 0, two.record.error
    ing, dec = two.record.steps["ingest"].metrics, two.record.steps["decompose"].metrics
    assert ing["version"] == 2 and ing["new_files"] == 1 and ing["nnz"] == len(p.values)
    versions = json.loads((storage / "tensor" / "versions.json").read_text())["versions"]
    v2 = tfo.open_store(storage / "tensor" / versions[-1]["path"])
    assert v2.shape[0] > tfo.open_store(storage / "tensor" / versions[0]["path"]).shape[0]
    assert dec["warm_start"] == str(storage / "cp.zarr") and dec["input_store"] == v2.path
    events = RunStore(str(storage)).events(two.run_id)
    assert any("new rows initialized" in e["message"] for e in events)
    c, v = v2.to_coo()
    assert c.shape[0] == len(p.values) and np.isclose(np.abs(v).sum(), np.abs(np.round(p.values, 6)).sum())


def test_fsspec_url_storage_root(rng):
    root = f"memory://tfooc-test-{uuid.uuid4().hex[:8]}"
    text = SPEC.format(shape="12, 13, 14", nnz=600, rank=2, seed=int(rng.integers(1000)), extra="")
    text = "\n".join(line for line in text.splitlines() if "pyttb" not in line and "tensorly" not in line)
    one = execute(load_spec(text=text, storage=root))
    assert one.exit_code == 0, one.record.error
    runs = RunStore(root)
    assert runs.read(one.run_id).state == "done" and runs.events(one.run_id)
    assert execute(load_spec(text=text, storage=root)).exit_code == 3
    import fsspec

    fs = fsspec.filesystem("memory")
    z = np.load(io.BytesIO(fs.cat(root.split("://")[1] + "/out/t.npz")))
    assert z["weights"].shape == (2,)


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_verbose_after_the_subcommand(tmp_path, capsys, where):
    args = ["generate", str(tmp_path / "g.zarr"), "--shape", "5,6,7", "--nnz", "50"]
    assert main((["-q"] + args) if where == "before" else (args + ["-q"])) == 0
    assert "generating" not in capsys.readouterr().err
