"""CP-APR (Poisson CP) as a workflow step: ``generate`` of a planted Poisson model, ``decompose``
with ``method: cp-apr`` (mu and pdnr), ``evaluate`` (the Poisson log-likelihood on the tensor, the
factor match score against the planted model) and ``export``, by real runs of the workflow runner
on a small tensor; spec errors with their line and field; warm start and resume."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, decompose_step, load_spec
from tensorflow_ooc.workflow.fingerprint import step_fingerprint
from tensorflow_ooc.workflow.records import RunStore
from tensorflow_ooc.workflow.runner import execute

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"

APR = """\
name: counts
steps:
  generate:
    kind: generate
    model: planted-poisson
    out: counts.tns
    shape: [30, 40, 50]
    nnz: 5000
    rank: 3
    seed: {seed}
  convert: {{kind: convert, input: counts.tns, out: counts.zarr, shape: [30, 40, 50]}}
  apr:
    kind: decompose
    method: cp-apr
    input: counts.zarr
    out: counts.apr.zarr
    rank: 3
    max_iters: 15
    seed: {seed}
  apr-pdnr:
    kind: decompose
    method: cp-apr
    algorithm: pdnr
    input: counts.zarr
    out: counts.pdnr.zarr
    rank: 3
    max_iters: 6
    seed: {seed}
  evaluate:
    kind: evaluate
    result: counts.apr.zarr
    tensor: counts.zarr
    reference: counts.factors.npz
    out: apr.json
    min_fms: 0.8
  evaluate-pdnr: {{kind: evaluate, result: counts.pdnr.zarr, tensor: counts.zarr, reference: counts.factors.npz}}
  npz: {{kind: export, result: counts.apr.zarr, format: npz, out: out/apr.npz}}
  pyttb: {{kind: export, result: counts.apr.zarr, format: pyttb, out: out/apr.ktensor}}
  tensorly: {{kind: export, result: counts.pdnr.zarr, format: tensorly, out: out/pdnr.pkl}}
  evaluate-npz: {{kind: evaluate, result: out/apr.npz, tensor: counts.zarr, out: npz.json}}
"""


def test_planted_poisson_cp_apr_evaluate_export(tmp_path, rng, capsys):
    storage = tmp_path / "storage"
    storage.mkdir()
    spec = tmp_path / "counts.yaml"
    seed = int(rng.integers(1000))
    spec.write_text(APR.format(seed=seed))
    assert main(["run", str(spec), "--storage", str(storage)]) == 0  # not -q: the summary is read
    summary = capsys.readouterr().out
    runs = RunStore(str(storage))
    rec = runs.list()[0]
    assert {st.state for st in rec.steps.values()} == {"done"}, rec.error
    events = runs.events(rec.run_id)

    # generate: counts of a planted Poisson model, its true model beside the tensor
    gen = rec.steps["generate"].metrics
    assert gen["rank"] == 3 and gen["concentration"] == 0.5 and 4000 < gen["nnz"] < 6000
    truth = np.load(storage / "counts.factors.npz")
    assert truth["weights"].shape == (3,) and np.allclose(truth["factor2"].sum(axis=0), 1)
    store = tfo.open_store(storage / "counts.zarr")
    _, values = store.to_coo()
    assert (values >= 1).all() and (values == np.round(values)).all()

    for step, algorithm, iters in (("apr", "mu", 15), ("apr-pdnr", "pdnr", 6)):
        result = tfo.load_result(storage / f"counts.{'apr' if algorithm == 'mu' else 'pdnr'}.zarr")
        assert isinstance(result, tfo.PoissonResult) and result.params["algorithm"] == algorithm
        assert all((f >= 0).all() for f in result.factors)
        m = rec.steps[step].metrics
        assert m["method"] == "cp-apr" and m["algorithm"] == algorithm and m["rank"] == 3
        assert m["loglik"] == result.loglik and m["kkt_violation"] == result.kkt and m["fit"] == result.fit
        assert m["iterations"] == result.iterations <= iters and m["inner_iterations_this_run"] > 0
        # the record holds every outer iteration once, with its log-likelihood and KKT violation
        its = [e for e in events if e["event"] == "iteration" and e["step"] == step]
        assert [e["iteration"] for e in its] == list(range(1, result.iterations + 1))
        assert [e["loglik"] for e in its] == [h["loglik"] for h in result.history]
        assert all("kkt_violation" in e and e["max_iters"] == iters for e in its)
        assert "loglik" in rec.steps[step].progress
        line = next(ln for ln in summary.splitlines() if ln.strip().startswith(step + " "))
        assert f"log-likelihood {result.loglik:.8e}" in line and f"({algorithm})" in line

    # evaluate: the log-likelihood recomputed by streaming the tensor is CP-APR's own; the
    # planted model is found again
    mu = tfo.load_result(storage / "counts.apr.zarr")
    ev = rec.steps["evaluate"].metrics
    assert ev["model"] == "cp" and ev["poisson"] is True and ev["algorithm"] == "mu"
    assert np.isclose(ev["loglik"], mu.loglik, rtol=1e-10) and ev["loglik_reported"] == mu.loglik
    assert abs(ev["fit"] - mu.fit) < 1e-8 and ev["fms"] >= 0.8 and ev["reference_rank"] == 3
    assert json.loads((storage / "apr.json").read_text())["loglik"] == ev["loglik"]
    assert 0 <= rec.steps["evaluate-pdnr"].metrics["fms"] <= 1
    assert "loglik" in rec.steps["evaluate-pdnr"].metrics and "factor match score" in summary

    # exports: npz with the Poisson figures (read back by evaluate as a Poisson model), pyttb, TensorLy
    z = np.load(storage / "out" / "apr.npz")
    assert np.allclose(z["factor1"], mu.factors[1]) and float(z["loglik"]) == mu.loglik
    assert float(z["kkt"]) == mu.kkt and json.loads(str(z["history"]))[-1]["loglik"] == mu.loglik
    assert np.isclose(rec.steps["evaluate-npz"].metrics["loglik"], mu.loglik, rtol=1e-10)
    assert rec.steps["npz"].metrics["loglik"] == mu.loglik
    import pyttb

    K = pyttb.import_data(str(storage / "out" / "apr.ktensor"))
    assert np.allclose(K.weights, mu.weights) and np.allclose(K.factor_matrices[0], mu.factors[0])
    pdnr = tfo.load_result(storage / "counts.pdnr.zarr")
    cp = pickle.loads((storage / "out" / "pdnr.pkl").read_bytes())
    assert np.allclose(cp.weights, pdnr.weights) and np.allclose(cp.factors[2], pdnr.factors[2])

    # tfooc logs: each outer iteration once, with the Poisson figures
    assert main(["logs", rec.run_id, "--storage", str(storage)]) == 0
    logs = capsys.readouterr().out
    assert logs.count("[apr] iteration 2: log-likelihood ") == 1 and "KKT violation" in logs
    # again: up to date
    assert main(["run", str(spec), "--storage", str(storage), "-q"]) == 3


def test_spec_errors_name_line_and_field(tmp_path, capsys):
    (tmp_path / "t.tns").write_text("1 1 1 1\n2 2 2 3\n")
    base = "steps:\n  c: {kind: convert, input: t.tns, out: t.zarr}\n  d:\n    kind: decompose\n    method: cp-apr\n"
    base += "    input: t.zarr\n    out: r.zarr\n    rank: 2\n"
    # a bad algorithm: exit 2 from tfooc run, nothing started, the field and its line named
    spec = tmp_path / "bad.yaml"
    spec.write_text(base + "    algorithm: newton\n")
    assert main(["run", str(spec), "--storage", str(tmp_path), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{spec}, line 9: steps.d.algorithm: expected 'mu' or 'pdnr', got 'newton'" in err
    assert not (tmp_path / "t.zarr").exists()
    cases = [
        (base + "    algorithm: pdnr\n    kappa: 0.1\n", 10, "steps.d.kappa", "only for algorithm: mu"),
        (base + "    mu0: 0.001\n", 9, "steps.d.mu0", "only for algorithm: pdnr (this step runs algorithm: mu)"),
        (base + "    dtype: float32\n", 9, "steps.d.dtype", "with method: cp-apr; 'dtype' is a key of method: cp"),
        (base + "    tol: -1.0\n", 9, "steps.d.tol", "greater than or equal to 0"),
        (base.replace("cp-apr", "cp") + "    algorithm: mu\n", 9, "steps.d.algorithm", "a key of method: cp-apr"),
        (base.replace("cp-apr", "poisson"), 5, "steps.d.method", "cp, tucker, completion, cp-apr"),
        (
            "steps:\n  g: {kind: generate, model: planted-poisson, out: g.tns, shape: [5, 5], nnz: 9, noise: 0.1}\n",
            2,
            "steps.g.noise",
            "does not apply to model: planted-poisson",
        ),
        (
            "steps:\n  g:\n    kind: generate\n    out: g.tns\n    shape: [5, 5]\n    nnz: 9\n    concentration: 2.0\n",
            7,
            "steps.g.concentration",
            "only for model: planted-poisson",
        ),
    ]
    for text, line, field, message in cases:
        with pytest.raises(SpecError) as info:
            load_spec(text=text, storage=str(tmp_path))
        found = [p for p in info.value.problems if p.field == field]
        assert found and found[0].line == line and message in found[0].message, str(info.value)
    # a CP-APR result is a CP model: pyttb exports it
    export = "  x: {kind: export, result: r.zarr, format: pyttb, out: r.ktensor}\n"
    ok = load_spec(text=base + export, storage=str(tmp_path))
    assert ok.step("d").model.method_name == "cp-apr"


def test_generate_fingerprints_are_unchanged(tmp_path):
    # computed by the release before planted-poisson: generate steps keep their fingerprints
    text = """steps:
  h: {kind: generate, out: h.tns, shape: [30, 40, 50], nnz: 5000}
  p: {kind: generate, model: planted, out: p.tns, shape: [30, 40, 50], nnz: 5000, rank: 3, noise: 0.1}
  q: {kind: generate, model: planted, out: q.zarr, like: uber, rank: 4, factors_out: q.npz, seed: 2}
"""
    wf = load_spec(text=text, storage=str(tmp_path))
    assert {s.name: step_fingerprint(s.kind, s.config(), {}) for s in wf.steps} == {
        "h": "8a100581e16afcaea5a6d93911e3b426bf9a4b066cf5781b7fc012430ad1e1e6",
        "p": "bbd32075bbe220a293d1c852a561e267d5a4add3fd97092031a45f899261ee64",
        "q": "6bb27786b19d6d64fced62a09f0df82a817a418a8a3332ecf800737b26413982",
    }


WARM = """\
steps:
  apr:
    kind: decompose
    method: cp-apr
    input: counts.zarr
    out: counts.apr.zarr
    rank: 3
    init: als.zarr
    max_iters: 8
    tol: 0
    seed: 1
"""


def test_warm_start_from_cp_als_and_resume(tmp_path, rng, monkeypatch):
    storage = tmp_path / "storage"
    storage.mkdir()
    p = synthetic.planted_poisson((20, 25, 30), 3, 2000, seed=int(rng.integers(1000)))
    store = tfo.convert((p.coords, p.values), storage / "counts.zarr", shape=(20, 25, 30))
    # a CP-ALS result's signs: component 0 negated in two modes (the same model), and a few
    # entries truly negative
    factors = [f.copy() for f in p.factors]
    factors[0][:, 0] *= -1
    factors[1][:, 0] *= -1
    factors[2][:3, 1] = -1e-3
    negative = sum(int((f < 0).sum()) for f in factors)
    tfo.CPResult(p.weights, factors, 0.5, 10).save(storage / "als.zarr")

    # the first run stops after outer iteration 3 (as a cancel would), its checkpoint kept
    real = decompose_step._iteration_events

    def interrupted(ctx, total, key="iteration"):
        progress = real(ctx, total, key)

        def stop(record):
            if record["iteration"] == 3:
                ctx.recorder.runs.request_cancel(ctx.recorder.record.run_id, by="test")
            progress(record)

        return stop

    monkeypatch.setattr(decompose_step, "_iteration_events", interrupted)
    first = execute(load_spec(text=WARM, storage=str(storage)))
    assert first.exit_code == 1 and first.record.steps["apr"].state == "cancelled"
    events = RunStore(str(storage)).events(first.run_id)
    warm = [e["message"] for e in events if "warm start from" in (e.get("message") or "")]
    assert warm and "least-squares fit 0.500000 after 10 iterations" in warm[0]
    assert f"{negative} negative entries of 225 made positive (CP-APR needs nonnegative factors)" in warm[0]

    monkeypatch.setattr(decompose_step, "_iteration_events", real)
    second = execute(load_spec(text=WARM, storage=str(storage)))
    assert second.exit_code == 0, second.record.error
    st = second.record.steps["apr"]
    assert st.resumed_from_iteration == 3 and st.metrics["iterations_this_run"] == 5
    assert st.metrics["warm_start"] == str(storage / "als.zarr") and st.metrics["iterations"] == 8
    # the same result as one uninterrupted run from the same start, bit for bit
    init, _ = decompose_step.warm_start(tfo.load_result(storage / "als.zarr"), store.shape, 3, 1)
    whole = tfo.cp_apr(store, 3, init=[np.abs(a) for a in init], max_iters=8, tol=0, seed=1)
    result = tfo.load_result(storage / "counts.apr.zarr")
    assert result.loglik == whole.loglik and all(np.array_equal(a, b) for a, b in zip(result.factors, whole.factors))


def test_nightly_counts_two_nights_warm_started(tmp_path, rng):
    storage = tmp_path / "storage"
    incoming = storage / "counts" / "incoming"
    incoming.mkdir(parents=True)
    wf = load_spec(WORKFLOWS / "nightly-counts.yaml", storage=str(storage))
    assert wf.step("decompose").model.method_name == "cp-apr" and wf.step("decompose").model.init == "previous"
    assert [s.kind for s in wf.steps] == ["convert", "decompose", "evaluate", "export"]
    p = synthetic.planted_poisson((30, 20, 10), 3, 3000, seed=int(rng.integers(1000)))
    late = p.coords[:, 0] >= 25  # users first seen on night 2
    synthetic.write_tns(incoming / "day1.tns", [(p.coords[~late], p.values[~late])])
    cheap = ["steps.decompose.rank=3", "steps.decompose.max_iters=10"]

    def night():
        return execute(load_spec(WORKFLOWS / "nightly-counts.yaml", storage=str(storage), overrides=cheap))

    one = night()
    assert one.exit_code == 0, one.record.error
    assert one.record.steps["decompose"].metrics["warm_start"] is None
    synthetic.write_tns(incoming / "day2.tns", [(p.coords[late], p.values[late])])
    two = night()
    assert two.exit_code == 0, two.record.error
    dec = two.record.steps["decompose"].metrics
    assert dec["warm_start"] == str(storage / "counts" / "apr.zarr")
    events = RunStore(str(storage)).events(two.run_id)
    warm = [e["message"] for e in events if "warm start from" in (e.get("message") or "")]
    assert warm and "log-likelihood" in warm[0] and "mode 0: " in warm[0] and "new rows initialized" in warm[0]
    result = tfo.load_result(storage / "counts" / "apr.zarr")
    assert isinstance(result, tfo.PoissonResult) and result.shape[0] == 30 and result.params["init"] == "given"
    ev = json.loads((storage / "counts" / "evaluation.json").read_text())
    assert ev["poisson"] is True and np.isclose(ev["loglik"], result.loglik, rtol=1e-10)
    z = np.load(storage / "counts" / "published" / "factors.npz")
    assert float(z["loglik"]) == result.loglik and np.allclose(z["factor0"], result.factors[0])
