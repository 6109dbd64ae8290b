"""Every decomposition is a workflow step: decompose with method cp | tucker | completion | tt (and
dense Zarr arrays for CP), predict steps, evaluate and export of each result kind, the nightly
completion pipeline (two nights, the second warm-started), and tensor trains warm-started and
resumed, all by real runs of the workflow runner on small tensors."""

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.fingerprint import step_fingerprint
from tensorflow_ooc.workflow.records import RunStore
from tensorflow_ooc.workflow.runner import execute

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"

METHODS = """\
name: methods
steps:
  convert: {{kind: convert, input: t.tns, out: t.zarr}}
  tucker:
    kind: decompose
    method: tucker
    input: t.zarr
    out: t.tucker.zarr
    ranks: [{j}, {j}, 2]
    max_iters: 4
    tol: 0
    seed: {seed}
  complete:
    kind: decompose
    method: completion
    input: t.zarr
    out: t.ft.zarr
    ranks: {j}
    core_rank: {j}
    epochs: 3
    patience: 10
    threads: 1
    seed: {seed}
  eval-tucker: {{kind: evaluate, result: t.tucker.zarr, tensor: t.zarr, out: tucker.json}}
  eval-complete: {{kind: evaluate, result: t.ft.zarr, tensor: t.zarr, out: ft.json, max_rmse: 1.0e+6}}
  npz-tucker: {{kind: export, result: t.tucker.zarr, format: npz, out: out/tucker.npz}}
  tensorly-tucker: {{kind: export, result: t.tucker.zarr, format: tensorly, out: out/tucker.pkl}}
  npz-complete: {{kind: export, result: t.ft.zarr, format: npz, out: out/ft.npz}}
  tensorly-complete: {{kind: export, result: t.ft.zarr, format: tensorly, out: out/ft.pkl}}
  predict: {{kind: predict, result: t.ft.zarr, coords: queries.tns, out: out/predictions.tns}}
  predict-store: {{kind: predict, result: t.tucker.zarr, coords: t.zarr, out: out/tucker-predictions.npz}}
"""


def _read_tns(path, nmodes):
    rows = [line.split() for line in Path(path).read_text().splitlines() if line and not line.startswith("#")]
    coords = np.array([[int(x) for x in r[:nmodes]] for r in rows]) - 1
    return coords, np.array([float(r[nmodes]) for r in rows])


def test_tucker_and_completion_steps(tmp_path, rng, capsys):
    storage = tmp_path / "storage"
    storage.mkdir()
    shape = tuple(int(rng.integers(12, 20)) for _ in range(3))
    p = synthetic.planted_fasttucker(shape, 3, 3, 1500, noise=0.05, seed=int(rng.integers(1 << 30)))
    synthetic.write_tns(storage / "t.tns", [(p.coords, p.values)])
    # queries: coordinates only (no value column), some of them never observed
    queries = np.stack([rng.integers(0, s, 40) for s in shape], axis=1)
    (storage / "queries.tns").write_text("".join(" ".join(str(i + 1) for i in q) + "\n" for q in queries))
    spec = tmp_path / "methods.yaml"
    spec.write_text(METHODS.format(j=3, seed=int(rng.integers(1000))))
    assert main(["run", str(spec), "--storage", str(storage), "-q"]) == 0
    runs = RunStore(str(storage))
    rec = runs.list()[0]
    assert {st.state for st in rec.steps.values()} == {"done"}, rec.error
    events = runs.events(rec.run_id)

    # Tucker: a TuckerResult with the step's ranks; every iteration recorded once
    tucker = tfo.load_result(storage / "t.tucker.zarr")
    assert isinstance(tucker, tfo.TuckerResult) and tucker.ranks == (3, 3, 2)
    m = rec.steps["tucker"].metrics
    assert m["method"] == "tucker" and m["iterations"] == tucker.iterations == 4 and m["fit"] == tucker.fit
    its = [e for e in events if e["event"] == "iteration" and e["step"] == "tucker"]
    assert [e["iteration"] for e in its] == [1, 2, 3, 4] and all("svd_seconds" in e for e in its)
    # completion: a FastTuckerResult; every epoch recorded once, with its test RMSE
    ft = tfo.load_result(storage / "t.ft.zarr")
    assert isinstance(ft, tfo.FastTuckerResult) and ft.ranks == (3, 3, 3) and ft.core_rank == 3
    m = rec.steps["complete"].metrics
    assert m["method"] == "completion" and m["epochs"] == ft.epochs == 3 and m["test_rmse"] == ft.test_rmse
    epochs = [e for e in events if e["event"] == "iteration" and e["step"] == "complete"]
    assert [e["iteration"] for e in epochs] == [1, 2, 3] and all(e["max_iters"] == 3 for e in epochs)
    assert [e["test_rmse"] for e in epochs] == [h["test_rmse"] for h in ft.history]

    # tfooc logs shows each iteration and epoch once, with the figures of its kind
    capsys.readouterr()
    assert main(["logs", rec.run_id, "--storage", str(storage)]) == 0
    logs = capsys.readouterr().out
    assert logs.count("[tucker] iteration 2: fit ") == 1
    assert logs.count("[complete] epoch 2: test RMSE ") == 1 and "fit nan" not in logs

    # evaluate: the Tucker fit recomputed by streaming the store agrees with HOOI's own; the
    # completion model's RMSE on the stored entries is its predictions' RMSE
    ev = rec.steps["eval-tucker"].metrics
    assert ev["model"] == "tucker" and abs(ev["fit"] - tucker.fit) < 1e-8 and ev["ranks"] == [3, 3, 2]
    store = tfo.open_store(storage / "t.zarr")
    c, v = store.to_coo()
    ev = rec.steps["eval-complete"].metrics
    assert ev["model"] == "fasttucker" and "fit" not in ev and ev["entries"] == len(v)
    assert np.isclose(ev["rmse"], np.sqrt(np.mean((ft.predict(c) - v) ** 2)), rtol=1e-10)
    assert json.loads((storage / "ft.json").read_text())["rmse"] == ev["rmse"]

    # exports hold each kind's arrays
    z = np.load(storage / "out" / "tucker.npz")
    assert np.allclose(z["core"], tucker.core) and np.allclose(z["factor2"], tucker.factors[2])
    tt = pickle.loads((storage / "out" / "tucker.pkl").read_bytes())
    assert np.allclose(tt.core, tucker.core)
    z = np.load(storage / "out" / "ft.npz")
    assert np.allclose(z["core_factor1"], ft.core_factors[1]) and float(z["test_rmse"]) == ft.test_rmse
    tt = pickle.loads((storage / "out" / "ft.pkl").read_bytes())
    assert np.allclose(tt.core, ft.core())

    # predictions: every query, in order, with the model's value
    pc, pv = _read_tns(storage / "out" / "predictions.tns", 3)
    assert np.array_equal(pc, queries) and np.allclose(pv, ft.predict(queries), rtol=1e-12, atol=1e-14)
    assert rec.steps["predict"].metrics["predictions"] == len(queries)
    z = np.load(storage / "out" / "tucker-predictions.npz")
    assert np.allclose(
        z["values"],
        np.einsum("abc,ia,ib,ic->i", tucker.core, *(f[z["coords"][:, n]] for n, f in enumerate(tucker.factors))),
    )
    assert z["coords"].shape[0] == store.nnz

    # again: up to date
    assert main(["run", str(spec), "--storage", str(storage), "-q"]) == 3


def test_decompose_method_errors_name_line_and_field(tmp_path):
    (tmp_path / "t.tns").write_text("1 1 1 1.0\n2 2 2 2.0\n")
    base = "steps:\n  convert: {kind: convert, input: t.tns, out: t.zarr}\n  d:\n    kind: decompose\n"
    cases = [
        (
            "    method: tucker\n    input: t.zarr\n    out: r.zarr\n    rank: 2\n",
            8,
            "steps.d.rank",
            "with method: tucker; 'rank' is a key of method: cp",
        ),
        ("    input: t.zarr\n    out: r.zarr\n    ranks: 2\n", 7, "steps.d.ranks", "method: tucker or completion"),
        (
            "    input: t.zarr\n    out: r.zarr\n    method: parafac\n    rank: 2\n",
            7,
            "steps.d.method",
            "cp, tucker, completion",
        ),
        (
            "    method: completion\n    input: t.zarr\n    out: r.zarr\n    ranks: 2\n    core_rank: 2\n"
            "    test: t.zarr\n    test_fraction: 0.2\n",
            3,
            "steps.d",
            "'test' (a test store) or 'test_fraction', not both",
        ),
    ]
    for body, line, field, message in cases:
        with pytest.raises(SpecError) as info:
            load_spec(text=base + body, storage=str(tmp_path))
        found = [p for p in info.value.problems if p.field == field]
        assert found and found[0].line == line and message in found[0].message, str(info.value)
    # pyttb writes CP models only: a Tucker result made in the spec is refused before anything runs
    text = base + "    method: tucker\n    input: t.zarr\n    out: r.zarr\n    ranks: 2\n"
    text += "  x: {kind: export, result: r.zarr, format: pyttb, out: r.ktensor}\n"
    with pytest.raises(SpecError) as info:
        load_spec(text=text, storage=str(tmp_path))
    assert info.value.problems[0].field == "steps.x.format" and info.value.problems[0].line == 9
    assert "makes a tucker result" in info.value.problems[0].message


def test_existing_step_fingerprints_are_unchanged(tmp_path):
    # what the previous release computed for these steps: an upgrade must not rerun up-to-date steps
    (tmp_path / "t.tns").write_text("1 1 1 1.0\n2 2 2 2.0\n")
    text = """steps:
  c: {kind: convert, input: t.tns, out: t.zarr}
  d: {kind: decompose, input: t.zarr, out: r.zarr, rank: 2}
  s: {kind: decompose, input: t.zarr, out: s.zarr, rank: 3, method: sts, init: previous}
  e: {kind: evaluate, result: r.zarr, tensor: t.zarr, min_fit: 0.1}
  x: {kind: export, result: r.zarr, format: npz, out: r.npz}
"""
    wf = load_spec(text=text, storage=str(tmp_path))
    got = {s.name: step_fingerprint(s.kind, s.config(), {}) for s in wf.steps}
    assert got == {
        "c": "93129ebc4d9fd3d85985b3ed84a9f8127703fd6728115b5011e362040f41bc0f",
        "d": "f5f81661e4b0dc95c609b2d0fead3e69c835ab30d35ff71af2d774c9b6fbafc8",
        "s": "afc55f15357905acfa232e5c8afb7c4b9a8803fd9bd47a583793553ef16b82ae",
        "e": "43a4dffb75e3e2ef998e99df6c453198a6a3fb53ce4bbcd9702cdfa933769fb0",
        "x": "979df5f366c12f8cc74da4f8a84878a06f87e487daaf77de418f85c0349052f1",
    }
    # method: cp is CP-ALS's exact solver, the same step as before methods existed
    same = load_spec(text=text.replace("rank: 2}", "rank: 2, method: cp}"), storage=str(tmp_path))
    assert step_fingerprint("decompose", same.step("d").config(), {}) == got["d"]


DENSE = """\
steps:
  cp: {kind: decompose, input: dense.zarr, out: dense.cp.zarr, rank: 2, max_iters: 40, tol: 1.0e-9, seed: 1}
  evaluate: {kind: evaluate, result: dense.cp.zarr, tensor: dense.zarr, out: dense.json}
"""


def test_dense_zarr_array_input(tmp_path, rng):
    storage = tmp_path / "storage"
    storage.mkdir()
    shape = tuple(int(rng.integers(6, 12)) for _ in range(3))
    synthetic.write_planted_dense(storage / "dense.zarr", shape, 2, noise=0.01, seed=int(rng.integers(1000)))
    one = execute(load_spec(text=DENSE, storage=str(storage)))
    assert one.exit_code == 0, one.record.error
    dec, ev = one.record.steps["cp"].metrics, one.record.steps["evaluate"].metrics
    assert dec["dense"] is True and dec["nnz"] == int(np.prod(shape)) and 0 < dec["fit"] <= 1
    # the evaluation forms the model chunk by chunk: its fit is CP-ALS's own
    assert abs(ev["fit"] - dec["fit"]) < 1e-8 and ev["entries"] == int(np.prod(shape))
    assert execute(load_spec(text=DENSE, storage=str(storage))).exit_code == 3
    # the same array rewritten with other values (same metadata): the steps run again
    synthetic.write_planted_dense(
        storage / "dense.zarr", shape, 2, noise=0.01, seed=int(rng.integers(1000, 2000)), overwrite=True
    )
    again = execute(load_spec(text=DENSE, storage=str(storage)))
    assert again.exit_code == 0 and again.record.steps["cp"].state == "done"
    # Tucker takes sparse stores only: the step fails naming the array and what takes it
    tucker = DENSE.replace("rank: 2,", "method: tucker, ranks: 2,").replace("out: dense.cp.zarr", "out: t.zarr")
    failed = execute(load_spec(text=tucker.replace("result: dense.cp.zarr", "result: t.zarr"), storage=str(storage)))
    assert (
        failed.exit_code == 1
        and "is a dense Zarr array; method tucker takes a sparse BLCO store" in failed.record.error
    )


def _night(storage, overrides):
    return execute(load_spec(WORKFLOWS / "nightly-completion.yaml", storage=str(storage), overrides=overrides))


def test_nightly_completion_two_nights_warm_started(tmp_path, rng):
    storage = tmp_path / "storage"
    incoming = storage / "recommender" / "incoming"
    incoming.mkdir(parents=True)
    shape = (40, 30, 6)
    p = synthetic.planted_fasttucker(shape, 3, 3, 3000, noise=0.05, seed=int(rng.integers(1 << 30)))
    # new users arrive on night 2 (the last rows of mode 0)
    late = p.coords[:, 0] >= 34
    synthetic.write_tns(incoming / "day1.tns", [(p.coords[~late], p.values[~late])])
    # the queries name users of night 1 (a query outside the model's shape fails the step)
    known = p.coords[~late].max(axis=0) + 1
    queries = np.stack([rng.integers(0, s, 25) for s in known], axis=1)
    synthetic.write_tns(storage / "recommender" / "queries.tns", [(queries, np.zeros(len(queries)))])
    cheap = ["steps.train.ranks=3", "steps.train.core_rank=3", "steps.train.epochs=4", "steps.train.threads=1"]
    one = _night(storage, cheap)
    assert one.exit_code == 0, one.record.error
    t1 = one.record.steps["train"].metrics
    assert t1["warm_start"] is None and t1["epochs"] == 4
    first_night = tfo.load_result(storage / "recommender" / "model.zarr")
    assert _night(storage, cheap).exit_code == 3  # nothing new: skipped, nothing published again

    synthetic.write_tns(incoming / "day2.tns", [(p.coords[late], p.values[late])])
    two = _night(storage, cheap)
    assert two.exit_code == 0, two.record.error
    assert {st.state for st in two.record.steps.values()} == {"done"}
    t2 = two.record.steps["train"].metrics
    assert t2["warm_start"] == str(storage / "recommender" / "model.zarr")
    events = RunStore(str(storage)).events(two.run_id)
    assert any("warm start from" in e["message"] and "mode 0: 6 new rows" in e["message"] for e in events)
    # trained further from last night's model: its first epoch starts where night 1 ended, far
    # below a random start's first epoch
    assert t2["first_epoch_train_rmse"] < 0.8 * t1["first_epoch_train_rmse"]
    second_night = tfo.load_result(storage / "recommender" / "model.zarr")
    assert second_night.shape[0] == 40 > first_night.shape[0] and second_night.params["init"] == "given"
    # the night's outputs: predictions for every query, the model, its evaluation
    pc, pv = _read_tns(storage / "recommender" / "published" / "predictions.tns", 3)
    assert np.array_equal(pc, queries) and np.allclose(pv, second_night.predict(queries), rtol=1e-12, atol=1e-14)
    z = np.load(storage / "recommender" / "published" / "model.npz")
    assert np.allclose(z["factor0"], second_night.factors[0])
    ev = json.loads((storage / "recommender" / "evaluation.json").read_text())
    assert ev["model"] == "fasttucker" and ev["entries"] == len(p.values)


def test_shipped_completion_spec_validates(tmp_path):
    (tmp_path / "recommender" / "incoming").mkdir(parents=True)
    (tmp_path / "recommender" / "queries.tns").write_text("1 1 1\n")
    wf = load_spec(WORKFLOWS / "nightly-completion.yaml", storage=str(tmp_path))
    train = wf.step("train").model
    assert train.method_name == "completion" and train.init == "previous" and train.core_rank == 8
    assert [s.kind for s in wf.steps] == ["convert", "decompose", "evaluate", "predict", "export"]
    shutil.rmtree(tmp_path / "recommender")


def test_schema_has_every_method():
    from tensorflow_ooc.workflow.plan import spec_schema

    defs = spec_schema()["$defs"]
    assert {"ranks", "max_iters", "tol", "init", "svd"} <= set(defs["TuckerDecomposeStep"]["properties"])
    completion = set(defs["CompletionDecomposeStep"]["properties"])
    assert {"ranks", "core_rank", "test", "test_fraction", "epochs", "lr_factors", "lr_core", "init"} <= completion
    assert defs["TuckerDecomposeStep"]["properties"]["method"]["const"] == "tucker"
    assert {"cp", "exact", "sts"} <= set(defs["DecomposeStep"]["properties"]["method"]["enum"])
    assert {"result", "coords", "out"} <= set(defs["PredictStep"]["required"])
    assert "max_rmse" in defs["EvaluateStep"]["properties"]
    tt = defs["TTDecomposeStep"]["properties"]
    assert {"ranks", "algorithm", "samples", "fit_every", "max_iters", "tol", "init", "checkpoint_every"} <= set(tt)
    assert tt["method"]["const"] == "tt" and tt["algorithm"]["anyOf"][0]["enum"] == ["exact", "randomized"]


def test_tucker_sgd_warm_start_api(tmp_path, rng):
    from tensorflow_ooc.decompositions import CompletionError

    p = synthetic.planted_fasttucker((20, 15, 10), 3, 3, 1500, noise=0.05, seed=int(rng.integers(1 << 30)))
    store = tfo.convert((p.coords, p.values), str(tmp_path / "s.zarr"), shape=p.shape)
    first = tfo.tucker_sgd(store, 3, 3, test_fraction=0.1, epochs=4, threads=1, progress=False, seed=1)
    again = tfo.tucker_sgd(store, 3, 3, test_fraction=0.1, epochs=1, threads=1, progress=False, seed=1, init=first)
    # it starts from the previous model: its first epoch is at least as good as where that one ended
    assert again.params["init"] == "given" and first.params["init"] == "random"
    assert again.history[0]["train_rmse"] < 0.8 * first.history[0]["train_rmse"]
    with pytest.raises(CompletionError, match="ranks"):
        tfo.tucker_sgd(store, 2, 3, epochs=1, progress=False, init=first)
    keep = p.coords[:, 0] < 10
    smaller = tfo.convert((p.coords[keep], p.values[keep]), str(tmp_path / "t.zarr"), shape=(10, 15, 10))
    with pytest.raises(CompletionError, match="cannot shrink"):
        tfo.tucker_sgd(smaller, 3, 3, epochs=1, progress=False, init=first)


TT = """\
name: trains
steps:
  generate: {{kind: generate, out: t.tns, shape: [12, 10, 8], nnz: 600, seed: {seed}}}
  convert: {{kind: convert, input: t.tns, out: t.zarr, shape: [12, 10, 8]}}
  tt:
    kind: decompose
    method: tt
    input: t.zarr
    out: t.tt.zarr
    ranks: [3, 2]
    max_iters: 4
    tol: 0
    seed: {seed}
  tt-randomized:
    kind: decompose
    method: tt
    algorithm: randomized
    samples: 300
    fit_every: 2
    input: t.zarr
    out: t.rtt.zarr
    ranks: 2
    max_iters: 3
    seed: {seed}
  evaluate: {{kind: evaluate, result: t.tt.zarr, tensor: t.zarr, out: tt.json, min_fit: 0.0}}
  evaluate-randomized: {{kind: evaluate, result: t.rtt.zarr}}
  npz: {{kind: export, result: t.tt.zarr, format: npz, out: out/tt.npz}}
  tensorly: {{kind: export, result: t.tt.zarr, format: tensorly, out: out/tt.pkl}}
  zarr: {{kind: export, result: t.rtt.zarr, format: zarr, out: out/rtt.zarr}}
  evaluate-npz: {{kind: evaluate, result: out/tt.npz, tensor: t.zarr, out: npz.json}}
  predict: {{kind: predict, result: t.tt.zarr, coords: t.zarr, out: out/tt-predictions.npz}}
"""


def test_tensor_train_steps(tmp_path, rng, capsys):
    storage = tmp_path / "storage"
    storage.mkdir()
    spec = tmp_path / "trains.yaml"
    spec.write_text(TT.format(seed=int(rng.integers(1000))))
    assert main(["run", str(spec), "--storage", str(storage)]) == 0  # not -q: the summary is read
    summary = capsys.readouterr().out
    runs = RunStore(str(storage))
    rec = runs.list()[0]
    assert {st.state for st in rec.steps.values()} == {"done"}, rec.error
    events = runs.events(rec.run_id)

    # decompose: a TTResult with the step's ranks; the record holds its fit and every sweep once
    tt = tfo.load_result(storage / "t.tt.zarr")
    assert isinstance(tt, tfo.TTResult) and tt.ranks == (1, 3, 2, 1) and tt.params["method"] == "exact"
    m = rec.steps["tt"].metrics
    assert m["method"] == "tt" and m["algorithm"] == "exact" and m["ranks"] == [3, 2]
    assert m["fit"] == tt.fit and m["iterations"] == tt.sweeps == 4 and m["iterations_this_run"] == 4
    its = [e for e in events if e["event"] == "iteration" and e["step"] == "tt"]
    assert [e["iteration"] for e in its] == [1, 2, 3, 4] and all(e["max_iters"] == 4 for e in its)
    assert [e["fit"] for e in its] == [h["fit"] for h in tt.history]
    line = next(ln for ln in summary.splitlines() if ln.strip().startswith("tt "))
    assert f"fit {tt.fit:.6f} after 4 sweeps" in line
    rtt = tfo.load_result(storage / "t.rtt.zarr")
    m = rec.steps["tt-randomized"].metrics
    assert isinstance(rtt, tfo.TTResult) and rtt.ranks == (1, 2, 2, 1) and rtt.params["method"] == "randomized"
    assert (
        m["algorithm"] == "randomized"
        and m["samples"] == 300
        and m["fit_every"] == 2
        and m["warmup"] == 1
        and m["fit"] == rtt.fit
    )

    # evaluate: the fit recomputed against the store is TT-ALS's own (and the dense one)
    store = tfo.open_store(storage / "t.zarr")
    c, v = store.to_coo()
    X = np.zeros(store.shape)
    X[tuple(c.T)] = v
    T = tt.to_dense()
    ev = rec.steps["evaluate"].metrics
    assert ev["model"] == "tt" and ev["ranks"] == [3, 2] and ev["fit_reported"] == tt.fit
    assert abs(ev["fit"] - tt.fit) < 1e-8 and np.isclose(ev["fit"], 1 - np.linalg.norm(X - T) / np.linalg.norm(X))
    assert np.isclose(ev["rmse"], np.sqrt(np.mean((T[tuple(c.T)] - v) ** 2)), rtol=1e-10)
    assert json.loads((storage / "tt.json").read_text())["fit"] == ev["fit"]
    assert rec.steps["evaluate-randomized"].metrics["fit"] == rtt.fit  # without a tensor: the reported fit
    assert np.isclose(rec.steps["evaluate-npz"].metrics["fit"], ev["fit"], rtol=1e-12)

    # exports: npz (read back by TTResult.load), a pickled TensorLy TTTensor, a result store
    back = tfo.TTResult.load(storage / "out" / "tt.npz")
    assert back.fit == tt.fit and back.sweeps == 4 and back.params == tt.params
    assert all(np.array_equal(a, b) for a, b in zip(back.cores, tt.cores))
    assert rec.steps["npz"].metrics["ranks"] == [3, 2] and rec.steps["npz"].metrics["model"] == "tt"
    tl = pickle.loads((storage / "out" / "tt.pkl").read_bytes())
    assert all(np.array_equal(a, b) for a, b in zip(tl.factors, tt.cores))
    assert tfo.load_result(storage / "out" / "rtt.zarr").fit == rtt.fit
    z = np.load(storage / "out" / "tt-predictions.npz")
    assert np.allclose(z["values"], T[tuple(z["coords"].T)], rtol=1e-12, atol=1e-14)

    # again: up to date
    assert main(["run", str(spec), "--storage", str(storage), "-q"]) == 3


def test_tensor_train_spec_errors_name_line_and_field(tmp_path, capsys):
    (tmp_path / "t.tns").write_text("1 1 1 1.0\n2 2 2 2.0\n")
    base = "steps:\n  c: {kind: convert, input: t.tns, out: t.zarr}\n  d:\n    kind: decompose\n    method: tt\n"
    base += "    input: t.zarr\n    out: r.zarr\n"
    # ranks: 0 from tfooc run: exit 2, nothing started, the file, line and field named
    spec = tmp_path / "bad.yaml"
    spec.write_text(base + "    ranks: 0\n")
    assert main(["run", str(spec), "--storage", str(tmp_path), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{spec}, line 8: steps.d.ranks: every TT rank must be >= 1, got 0" in err
    assert not (tmp_path / "t.zarr").exists()
    cases = [
        (base + "    ranks: 2\n    sweeps: 3\n", 9, "steps.d.sweeps", "unknown key (expected one of:"),
        (base + "    ranks: 2\n    algorithm: sketched\n", 9, "steps.d.algorithm", "'exact' or 'randomized'"),
        (base + "    ranks: 2\n    samples: 100\n", 9, "steps.d.samples", "only for algorithm: randomized"),
        (base + "    ranks: 2\n    fit_every: 2\n", 9, "steps.d.fit_every", "only for algorithm: randomized"),
        (base + "    rank: 2\n", 8, "steps.d.rank", "with method: tt; 'rank' is a key of method: cp or cp-apr"),
        (base + "    ranks: [2, 0]\n", 8, "steps.d.ranks", "ranks[1] is 0; every TT rank must be >= 1"),
        (base + "    ranks: [2, x]\n", 8, "steps.d.ranks", "expected integers, got 'x' at ranks[1]"),
        (base + "    ranks: 2\n    tol: -1.0\n", 9, "steps.d.tol", "greater than or equal to 0"),
        (base + "    ranks: 2\n    max_iters: 0\n", 9, "steps.d.max_iters", "greater than or equal to 1"),
        (base + "", 3, "steps.d.ranks", "missing (required)"),
        (base.replace("tt", "train") + "    ranks: 2\n", 5, "steps.d.method", "cp, tucker, completion, cp-apr, tt"),
        (
            base.replace("method: tt", "algorithm: randomized") + "    rank: 2\n",
            5,
            "steps.d.algorithm",
            "with method: cp; 'algorithm' is a key of method: cp-apr or tt",
        ),
    ]
    for text, line, field, message in cases:
        with pytest.raises(SpecError) as info:
            load_spec(text=text, storage=str(tmp_path))
        found = [p for p in info.value.problems if p.field == field]
        assert found and found[0].line == line and message in found[0].message, str(info.value)
    ok = load_spec(text=base + "    ranks: [2, 1]\n    algorithm: randomized\n    samples: 64\n", storage=str(tmp_path))
    assert ok.step("d").model.method_name == "tt" and ok.step("d").model.ranks == [2, 1]
    # pyttb writes CP models only: a train made in the spec is refused before anything runs
    export = "  x: {kind: export, result: r.zarr, format: pyttb, out: r.ktensor}\n"
    with pytest.raises(SpecError) as info:
        load_spec(text=base + "    ranks: 2\n" + export, storage=str(tmp_path))
    assert info.value.problems[0].field == "steps.x.format" and "makes a tt result" in info.value.problems[0].message
    # ranks the tensor's shape cannot hold: the step fails naming them, nothing written
    spec.write_text(base + "    ranks: 5\n")
    assert main(["run", str(spec), "--storage", str(tmp_path), "-q"]) == 1
    rec = RunStore(str(tmp_path)).list()[0]
    assert "ranks: ranks[0] is 5" in rec.steps["d"].error and not (tmp_path / "r.zarr").exists()


TT_WARM = """\
steps:
  tt:
    kind: decompose
    method: tt
    input: grown.zarr
    out: grown.tt.zarr
    ranks: [3, 2]
    init: first.tt.zarr
    max_iters: 5
    tol: 0
    seed: 1
"""


def test_tensor_train_warm_start_and_resume(tmp_path, rng, monkeypatch):
    from tensorflow_ooc.workflow import decompose_step

    storage = tmp_path / "storage"
    storage.mkdir()
    shape = (12, 10, 8)
    coords, values = synthetic.heavy_tailed(shape, 700, seed=int(rng.integers(1000)))
    first = coords[:, 0] < 10  # mode 0 grows by two slices
    tfo.convert((coords[first], values[first]), storage / "first.zarr", shape=(10, 10, 8))
    store = tfo.convert((coords, values), storage / "grown.zarr", shape=shape)
    tfo.tt_als(storage / "first.zarr", [3, 2], max_sweeps=3, seed=2, out=storage / "first.tt.zarr")
    prev = tfo.load_result(storage / "first.tt.zarr")

    # the first run stops after sweep 2 (as a cancel would), its checkpoint kept
    real = decompose_step._iteration_events

    def interrupted(ctx, total, key="iteration"):
        progress = real(ctx, total, key)

        def stop(record):
            if record[key] == 2:
                ctx.recorder.runs.request_cancel(ctx.recorder.record.run_id, by="test")
            progress(record)

        return stop

    monkeypatch.setattr(decompose_step, "_iteration_events", interrupted)
    one = execute(load_spec(text=TT_WARM, storage=str(storage)))
    assert one.exit_code == 1 and one.record.steps["tt"].state == "cancelled"
    events = RunStore(str(storage)).events(one.run_id)
    warm = [e["message"] for e in events if "warm start from" in (e.get("message") or "")]
    assert warm and f"(fit {prev.fit:.6f} after 3 sweeps); mode 0: 2 new slices initialized" in warm[0]

    monkeypatch.setattr(decompose_step, "_iteration_events", real)
    two = execute(load_spec(text=TT_WARM, storage=str(storage)))
    assert two.exit_code == 0, two.record.error
    st = two.record.steps["tt"]
    assert st.resumed_from_iteration == 2 and st.metrics["iterations_this_run"] == 3
    assert st.metrics["warm_start"] == str(storage / "first.tt.zarr") and st.metrics["iterations"] == 5
    assert not list((storage / ".tfooc" / "checkpoints").glob("tt-*"))  # served, removed
    # the same result as one uninterrupted run from the same start, bit for bit
    init, _ = decompose_step.tt_warm_start(prev, shape, 1)
    whole = tfo.tt_als(store, [3, 2], init=init, max_sweeps=5, tol=0, seed=1)
    result = tfo.load_result(storage / "grown.tt.zarr")
    assert result.fit == whole.fit and all(np.array_equal(a, b) for a, b in zip(result.cores, whole.cores))
    assert result.params["init"] == "given"

    # a previous train of other ranks is not used: the step says so and starts at random
    other = TT_WARM.replace("ranks: [3, 2]", "ranks: 2").replace("out: grown.tt.zarr", "out: two.tt.zarr")
    three = execute(load_spec(text=other, storage=str(storage)))
    assert three.exit_code == 0 and three.record.steps["tt"].metrics["warm_start"] is None
    events = RunStore(str(storage)).events(three.run_id)
    assert any("has ranks [3, 2], this step [2, 2]: random initial cores" in (e.get("message") or "") for e in events)


def test_shipped_tt_example_runs(tmp_path):
    small = [
        "steps.generate.shape=[12, 10, 8, 6]",
        "steps.generate.nnz=800",
        "steps.generate.rank=2",
        "steps.tt.ranks=2",
        "steps.tt-randomized.ranks=2",
        "steps.tt-randomized.samples=200",
        "steps.evaluate.min_fit=0.0",
    ]
    wf = load_spec(WORKFLOWS / "tt-example.yaml", storage=str(tmp_path), overrides=small)
    assert [wf.step(n).model.method_name for n in ("tt", "tt-randomized")] == ["tt", "tt"]
    assert [s.kind for s in wf.steps] == [
        "generate",
        "convert",
        "decompose",
        "decompose",
        "evaluate",
        "export",
        "export",
    ]
    done = execute(wf)
    assert done.exit_code == 0, done.record.error
    published = tfo.TTResult.load(tmp_path / "tt" / "published" / "train.npz")
    assert published.ranks == (1, 2, 2, 2, 1) and published.fit == tfo.load_result(tmp_path / "tt" / "train.zarr").fit
