"""Secret variables never reach what a run writes or says: a run on a real Dask cluster (scheduler
with the monitoring preload and a worker, as processes) with a token in the environment, a password
set with --set, a variable the spec marks secret and one matched by the operator's
--secret-pattern; every file the run wrote (record, events, spec copy, outputs' index), the JSON
log lines, stdout, the scheduler's and worker's logs, the page's JSON and /metrics are searched
for each value. The record keeps the spec with ${NAME} for the secrets; the values did reach the
run (the webhook was called at the URL holding the token)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dask_processes import dask_processes, get
from webhook_server import webhook_server

from tensorflow_ooc.workflow import load_spec
from tensorflow_ooc.workflow.records import RunStore

REPO = Path(__file__).resolve().parent.parent

SPEC = """\
name: secretive
secrets: [NOTE]
on_failure: 'test -n "${{DB_PASSWORD}}"'
webhooks:
  on_success: "http://127.0.0.1:${{HOOK_PORT}}/ok/${{SLACK_TOKEN}}"
  on_failure: "http://127.0.0.1:${{HOOK_PORT}}/failed/${{SLACK_TOKEN}}"
steps:
  generate:
    kind: generate
    out: t.zarr
    shape: [20, 15, 10]
    nnz: 400
    model: planted
    rank: 2
    seed: {seed}
    description: "${{NOTE}} and ${{API_TOKEN}}"
  decompose:
    kind: decompose
    input: t.zarr
    out: t.cp.zarr
    rank: 2
    max_iters: 3
    scheduler: cluster
    description: "pin ${{BANK_PIN}}"
  {extra}
"""

FAILING = """convert:
    kind: convert
    input: "in-${BANK_PIN}.tns"
    out: c.zarr
"""


def _tfooc(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", "--log-format", "json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def _files(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in Path(root).rglob("*") if p.is_file()}


def _leaks(values: dict[str, str], texts: dict[str, bytes | str]) -> list[str]:
    out = []
    for name, value in values.items():
        for where, text in texts.items():
            if (value.encode() if isinstance(text, bytes) else value) in text:
                out.append(f"{name} in {where}")
    return out


def test_secret_values_are_never_written_said_or_served(tmp_path, rng):
    storage = tmp_path / "storage"
    storage.mkdir()
    values = {
        "SLACK_TOKEN": "xoxb-" + secrets.token_hex(12),  # a default pattern: *TOKEN*
        "DB_PASSWORD": "pw-" + secrets.token_hex(10),  # *PASSWORD*
        "API_TOKEN": "api-" + secrets.token_hex(10),  # given with --set
        "NOTE": "note-" + secrets.token_hex(10),  # the spec's secrets: list
        "BANK_PIN": "pin" + secrets.token_hex(6),  # the operator's --secret-pattern '*PIN*'
    }
    seed = int(rng.integers(1 << 30))
    with webhook_server() as hooks, dask_processes(tmp_path, str(storage), env={"TFOOC_HEARTBEAT_S": "0.5"}) as dask:
        env = {k: v for k, v in values.items() if k != "API_TOKEN"} | {"HOOK_PORT": str(hooks["port"])}
        spec = tmp_path / "secretive.yaml"
        spec.write_text(SPEC.format(seed=seed, extra=""))
        common = ["--storage", str(storage), "--scheduler", dask["address"], "--secret-pattern", "*PIN*"]
        done = _tfooc("run", str(spec), *common, "--set", f"API_TOKEN={values['API_TOKEN']}", env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        # a second run that fails with a secret in its error (a bad line in a file whose name holds one)
        (storage / f"in-{values['BANK_PIN']}.tns").write_text("1 2 3 1.0\n1 x 3 2.0\n")
        spec.write_text(SPEC.format(seed=seed, extra=FAILING))
        failed = _tfooc("run", str(spec), *common, "--set", f"API_TOKEN={values['API_TOKEN']}", env=env)
        assert failed.returncode == 1, failed.stderr[-3000:]
        runs = RunStore(str(storage)).list()
        assert {r.state for r in runs} == {"done", "failed"}
        served = {
            "/metrics": get(dask["base"] + "/metrics"),
            "/tfooc/runs.json": get(dask["base"] + "/tfooc/runs.json"),
        }
        for r in runs:
            served[f"/tfooc/runs/{r.run_id}.json"] = get(dask["base"] + f"/tfooc/runs/{r.run_id}.json")
        assert all(r.run_id in served["/tfooc/runs.json"] for r in runs)  # the page knows both runs
        assert "tfooc_" in served["/metrics"]
    # the values reached the run: each webhook was called at the URL with the token in it
    paths = [p["path"] for p in hooks["posts"]]
    assert sorted(paths) == sorted([f"/ok/{values['SLACK_TOKEN']}", f"/failed/{values['SLACK_TOKEN']}"]), paths
    bad = next(r for r in runs if r.state == "failed")
    assert "ParseError" in bad.error and "in-***.tns" in bad.error  # the error, its secret masked
    assert bad.on_failure["exit_code"] == 0  # the hook saw the password (test -n), the record does not
    # nothing the run wrote, logged, sent or served holds a secret value
    texts: dict[str, bytes | str] = _files(storage) | {
        k: v.read_bytes() for k, v in dask["logs"].items()
    }  # records, events, spec copies, output index, locks
    texts.update(
        {"stdout 1": done.stdout, "stderr 1": done.stderr, "stdout 2": failed.stdout, "stderr 2": failed.stderr}
    )
    texts.update({f"webhook {p['path'].split('/')[1]}": p["raw"] for p in hooks["posts"]})
    texts.update(served)
    names = {k for k in texts if "/in-" not in k}  # the user's own input file is named with the pin
    assert not _leaks(values, {k: texts[k] for k in names})
    assert any(".tfooc/runs" in k and k.endswith("events.jsonl") for k in texts)
    # the record keeps the spec as written for the secrets: ${NAME}, never the value
    kept = yaml.safe_load(RunStore(str(storage)).read_spec(runs[0].run_id))
    assert kept["webhooks"]["on_success"] == f"http://127.0.0.1:{hooks['port']}/ok/${{SLACK_TOKEN}}"
    assert kept["on_failure"] == 'test -n "${DB_PASSWORD}"'
    assert kept["steps"]["generate"]["description"] == "${NOTE} and ${API_TOKEN}"
    assert kept["steps"]["decompose"]["description"] == "pin ${BANK_PIN}"
    for p in hooks["posts"]:
        body = p["json"]
        assert body["run_id"] in {r.run_id for r in runs} and body["event"] in ("on_success", "on_failure")


def test_secret_marks_patterns_and_the_resolved_text(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_TOKEN", "t0k3n-value")
    monkeypatch.setenv("PLAIN", "seen")
    monkeypatch.setenv("TFOOC_SECRET_PATTERNS", "*PLAINLY*")
    text = (
        "name: s\nsteps:\n  g: {kind: generate, out: t.tns, shape: [3, 4, 5], nnz: 9,"
        " description: '${MY_TOKEN}/${PLAIN}'}\n"
    )
    wf = load_spec(text=text, storage=str(tmp_path))
    assert wf.step("g").model.description == "t0k3n-value/seen"  # the run gets the value
    assert wf.source.secret_values == ("t0k3n-value",)
    assert "${MY_TOKEN}/seen" in wf.source.record_text and "t0k3n-value" not in wf.source.record_text
    assert "t0k3n-value" not in wf.sha256  # the hash is of the recorded text
    # a driver given the resolved text and the values masks them too
    again = load_spec(
        text=wf.source.effective_text, storage=str(tmp_path), interpolate=False, secret_values=["t0k3n-value"]
    )
    assert "t0k3n-value" not in again.source.record_text and again.source.mask.text("x t0k3n-value") == "x ***"
    # a bad secrets: entry is an error at its line
    from tensorflow_ooc.workflow import SpecError

    with pytest.raises(SpecError) as info:
        load_spec(text="secrets: [not a name]\n" + text.split("\n", 1)[1], storage=str(tmp_path))
    assert info.value.problems[0].field == "secrets" and info.value.problems[0].line == 1
