"""Specs as users of Airflow or Prefect expect them: ``--set dotted.path=VALUE`` overrides,
``${VAR}`` / ``${VAR:-default}`` from the environment, ``tfooc validate`` (exit 0, or 2 with the
messages ``run`` prints) and ``tfooc schema`` (the JSON Schema of the pydantic models). Real
subprocesses, real spec files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.records import RunStore

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"

SPEC = """\
name: tuned
steps:
  generate:
    kind: generate
    out: ${TFOOC_TEST_PREFIX:-t}.zarr
    shape: [12, 10, 9]
    nnz: ${TFOOC_TEST_NNZ}
    model: planted
    rank: 2
    seed: 3
  decompose:
    kind: decompose
    input: ${TFOOC_TEST_PREFIX:-t}.zarr
    out: t.cp.zarr
    rank: 2
    max_iters: 3
    tol: 0
    seed: 1
"""


def tfooc(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def spec(tmp_path, monkeypatch) -> Path:
    for var in ("TFOOC_TEST_PREFIX", "TFOOC_TEST_NNZ"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "tuned.yaml"
    path.write_text(SPEC)
    return path


def test_set_and_environment_variables_reach_the_run(tmp_path, spec, monkeypatch, capsys):
    storage = tmp_path / "storage"
    monkeypatch.setenv("TFOOC_TEST_NNZ", "300")  # a plain value is typed as YAML types it: an int
    args = ["run", str(spec), "--storage", str(storage), "--set", "steps.decompose.rank=3"]
    assert main([*args, "--set", "steps.decompose.max_iters=4", "-q"]) == 0
    assert capsys.readouterr().out == ""  # quiet: no summary
    (run_id,) = [r.run_id for r in RunStore(str(storage)).list()]
    rec = RunStore(str(storage)).read(run_id)
    assert rec.steps["decompose"].metrics["iterations"] == 4  # max_iters from --set
    assert rec.steps["generate"].metrics["nnz"] <= 300 and (storage / "t.zarr").is_dir()  # the default prefix
    assert tfo.load_result(storage / "t.cp.zarr").rank == 3  # rank from --set
    # the run record keeps the spec as it ran, not as the file says
    ran = yaml.safe_load(RunStore(str(storage)).read_spec(run_id))
    assert ran["steps"]["decompose"]["rank"] == 3 and ran["steps"]["generate"]["nnz"] == 300
    assert ran["steps"]["generate"]["out"] == "t.zarr"


def test_resolved_text_is_what_a_submitted_driver_reads(spec):
    env_spec = spec.read_text().replace("${TFOOC_TEST_NNZ}", "${TFOOC_TEST_NNZ:-250}") + "  # $${LITERAL}\n"
    spec.write_text(env_spec.replace("    seed: 3\n", "    seed: 3\n    description: cost $${HOME}\n"))
    wf = load_spec(spec, storage=str(spec.parent / "s"), overrides=["steps.decompose.rank=5"])
    assert wf.step("generate").model.nnz == 250 and wf.step("decompose").model.rank == 5
    assert wf.step("generate").model.description == "cost ${HOME}"  # $${ is a literal ${
    # the driver on a worker reads the resolved text without interpolating it again
    again = load_spec(spec, text=wf.source.effective_text, storage=str(spec.parent / "s"), interpolate=False)
    assert again.step("decompose").model.rank == 5 and again.step("generate").model.nnz == 250
    assert again.step("generate").model.description == "cost ${HOME}"
    assert again.sha256 == wf.sha256  # the record's spec hash is the spec as it ran


def test_bad_overrides_and_unset_variables_are_clear_errors(tmp_path, spec):
    storage = tmp_path / "s"
    r = tfooc("run", spec, "--storage", storage)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # the variable, the spec file and its line, and how to give a default
    assert f"{spec}, line 7: steps.generate.nnz: environment variable TFOOC_TEST_NNZ is not set" in r.stderr
    assert "${TFOOC_TEST_NNZ:-DEFAULT}" in r.stderr and not storage.exists()  # nothing started
    env = {"TFOOC_TEST_NNZ": "300"}
    for setting, expected in (
        (
            "steps.decompse.rank=32",
            "--set steps.decompse.rank=32: steps has no 'decompse' (its steps: generate, decompose)",
        ),
        ("steps.decompose.rank", "--set steps.decompose.rank: expected KEY=VALUE"),
        (
            "steps.decompose.rank.x=1",
            "--set steps.decompose.rank.x=1: steps.decompose.rank is a value (2), not a mapping",
        ),
        ("steps.decompose.rnk=3", "steps.decompose.rnk: unknown key"),
        ("steps.decompose.rank=three", "steps.decompose.rank: expected a valid integer, got 'three' (from --set"),
        ("steps.generate.shape.7=3", "steps.generate.shape is a list of 3: '7' is not an index in it"),
    ):
        r = tfooc("run", spec, "--storage", storage, "--set", setting, env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert expected in r.stderr, (setting, r.stderr)
    assert not storage.exists()


def test_validate_exits_0_or_2_with_the_messages_run_gives(tmp_path, spec):
    storage = tmp_path / "s"
    env = {"TFOOC_TEST_NNZ": "300"}
    r = tfooc("validate", spec, "--storage", storage, "--set", "steps.decompose.rank=4", env=env)
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout and "generate, decompose" in r.stdout and not storage.exists()
    for bad in (
        ["--set", "steps.decompose.rank=0"],  # the models' own checks
        ["--set", "steps.decompose.input=missing.zarr"],  # the workflow as a whole: an input nobody writes
        ["--set", "cluster=tcp://127.0.0.1:9"],  # a scheduler nobody answers at
    ):
        checked = tfooc("validate", spec, "--storage", storage, *bad, env=env)
        ran = tfooc("run", spec, "--storage", storage, *bad, env=env)
        assert checked.returncode == ran.returncode == 2, (bad, checked.stderr, ran.stderr)
        assert checked.stderr == ran.stderr and checked.stderr.startswith("tfooc: error: "), bad
        assert "Traceback" not in checked.stderr
    assert not (storage / "t.zarr").exists()
    r = tfooc("validate", tmp_path / "nope.yaml")
    assert r.returncode == 2 and "no such spec file" in r.stderr


def test_schema_is_the_json_schema_of_the_models(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    r = tfooc("schema")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    kinds = {json.dumps(d["properties"]["kind"]) for d in schema["$defs"].values() if "kind" in d.get("properties", {})}
    assert len(kinds) == 6 and "rank" in schema["$defs"]["DecomposeStep"]["properties"]
    validator = jsonschema.Draft202012Validator(schema)
    for shipped in sorted(WORKFLOWS.glob("*.yaml")):  # every shipped spec fits the schema
        assert not list(validator.iter_errors(yaml.safe_load(shipped.read_text()))), shipped
    fine = yaml.safe_load(SPEC.replace("${TFOOC_TEST_NNZ}", "300"))
    assert not list(validator.iter_errors(fine))
    wrong = yaml.safe_load(SPEC.replace("${TFOOC_TEST_NNZ}", "three hundred"))
    # a wrong type does not, and the error is at the field (each step is checked as its kind)
    assert [e.json_path for e in validator.iter_errors(wrong)] == ["$.steps.generate.nnz"]
    with pytest.raises(SpecError):  # as tfooc itself says
        load_spec(text=yaml.safe_dump(wrong), storage=str(tmp_path), interpolate=False)
