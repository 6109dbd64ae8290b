"""Per-step retries with backoff and the on_failure command, by real runs of the workflow runner:
a step whose output folder is a full disk (a small tmpfs) fails with "no space left" until space is
freed, and is tried again; a path through a regular file is refused by validate, and when such a
file appears after it, the step fails at once: it is not retried."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.records import RunStore
from tensorflow_ooc.workflow.runner import execute

SPEC = """\
name: flaky
{hook}steps:
  generate:
    kind: generate
    out: shared/t.tns
    shape: [6, 7, 8]
    nnz: 50
    retries: {retries}
    retry_delay: {delay}
  evaluate-later:
    kind: convert
    input: shared/t.tns
    out: t.zarr
"""


def _spec(tmp_path, retries=0, delay=0.05, hook=""):
    storage = tmp_path / "storage"
    storage.mkdir(exist_ok=True)
    path = tmp_path / "flaky.yaml"
    path.write_text(SPEC.format(retries=retries, delay=delay, hook=hook))
    return path, storage


def _free_after_first_retry(storage, ballast):
    """Remove the ballast filling the output's disk once the runner has recorded a retry (what an
    operator freeing space does between tries)."""

    def watch():
        deadline = time.time() + 60
        while time.time() < deadline:
            for events in (storage / ".tfooc" / "runs").glob("*/events.jsonl"):
                if '"step-retry"' in events.read_text():
                    ballast.unlink()
                    return
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_transient_failure_is_retried_with_backoff(tmp_path, full_share):
    path, storage = _spec(tmp_path, retries=4, delay=0.3)
    watcher = _free_after_first_retry(storage, full_share)
    out = execute(load_spec(path, storage=str(storage)))
    watcher.join(timeout=5)
    assert out.exit_code == 0, out.record.error
    step = out.record.steps["generate"]
    assert step.state == "done" and (storage / "shared" / "t.tns").exists()
    tries = step.tries
    assert len(tries) >= 2 and tries[-1]["error"] is None
    assert "no space left" in tries[0]["error"] and tries[0]["retry_in"] == 0.3
    # backoff: each retry waits twice as long as the one before
    assert [t["retry_in"] for t in tries[:-1]] == [0.3 * 2**k for k in range(len(tries) - 1)]
    events = RunStore(str(storage)).events(out.run_id)
    retries = [e for e in events if e["event"] == "step-retry"]
    assert len(retries) == len(tries) - 1 and retries[0]["step"] == "generate" and retries[0]["attempt"] == 1
    assert "retrying in 0.3 s" in retries[0]["message"] and "traceback" in retries[0]
    # the record on disk shows the tries too
    record = json.loads((storage / ".tfooc" / "runs" / out.run_id / "record.json").read_text())
    assert len(record["steps"]["generate"]["tries"]) == len(tries)
    # retries and their delay are not settings of the result: changing them reruns nothing
    path.write_text(path.read_text().replace("retries: 4", "retries: 1"))
    assert execute(load_spec(path, storage=str(storage))).exit_code == 3


def test_retries_run_out_and_the_failure_hook_gets_run_id_and_error(tmp_path, full_share):
    hook = (
        'on_failure: \'printf "%s|%s|%s|%s" "$TFOOC_RUN_ID" "$TFOOC_STEP" "$TFOOC_EXIT_CODE" '
        '"$TFOOC_ERROR" > hook.txt\'\n'
    )
    path, storage = _spec(tmp_path, retries=2, delay=0.01, hook=hook)
    assert main(["run", str(path), "--storage", str(storage), "-q"]) == 1
    rec = RunStore(str(storage)).list()[0]
    tries = rec.steps["generate"].tries
    assert rec.state == "failed" and len(tries) == 3 and all("no space left" in t["error"] for t in tries)
    assert "no retries left" in tries[-1]["error"] and "retry_in" not in tries[-1]
    assert rec.steps["evaluate-later"].state == "not run"
    # the command ran in the storage root once the record was final, with the run in its environment
    run_id, step, code, error = (storage / "hook.txt").read_text().split("|", 3)
    assert (run_id, step, code) == (rec.run_id, "generate", "1") and error == rec.error
    assert "no space left" in error
    assert rec.on_failure["exit_code"] == 0 and rec.on_failure["command"].startswith("printf")
    events = RunStore(str(storage)).events(rec.run_id)
    assert [e["event"] for e in events][-2:] == ["run-finished", "on-failure"]


BAD_INPUT = """\
name: bad-input
on_failure: [{python}, -c, {script}]
steps:
  convert: {{kind: convert, input: bad.tns, out: t.zarr, retries: 3, retry_delay: 0.01}}
"""


def test_a_failing_hook_is_logged_not_fatal_and_bad_input_is_not_retried(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / "bad.tns").write_text("1 2 3 1.0\n1 2 x 2.0\n")  # a parse error: another try cannot mend it
    script = "import os, sys; open('hook.txt', 'w').write(os.environ['TFOOC_RUN_ID']); sys.exit(7)"
    text = BAD_INPUT.format(python=json.dumps(sys.executable), script=json.dumps(script))
    out = execute(load_spec(text=text, storage=str(storage)))
    assert out.exit_code == 1 and out.record.steps["convert"].state == "failed"
    tries = out.record.steps["convert"].tries
    assert len(tries) == 1 and "ParseError" in tries[0]["error"] and "retry_in" not in tries[0]
    assert not [e for e in RunStore(str(storage)).events(out.run_id) if e["event"] == "step-retry"]
    # the hook ran and failed: logged as a warning, the run's outcome stands
    assert (storage / "hook.txt").read_text() == out.run_id
    assert out.record.on_failure["exit_code"] == 7 and "exited with status 7" in out.record.on_failure["error"]
    assert out.record.state == "failed" and "ParseError" in out.record.error
    last = RunStore(str(storage)).events(out.run_id)[-1]
    assert (
        last["event"] == "on-failure" and last["level"] == "warning" and "the run's outcome stands" in last["message"]
    )
    # a program that cannot start is logged too
    again = execute(
        load_spec(text=text.replace(json.dumps(sys.executable), "/nonexistent/notify"), storage=str(storage))
    )
    assert again.exit_code == 1 and "could not start" in again.record.on_failure["error"]


@pytest.mark.parametrize(
    "text, field, message",
    [
        ("on_failure: ''\n", "on_failure", "expected a command"),
        ("on_failure: []\n", "on_failure", "expected a command"),
    ],
)
def test_bad_hook_and_retries_are_spec_errors(tmp_path, text, field, message):
    path, storage = _spec(tmp_path, hook=text)
    with pytest.raises(SpecError) as info:
        load_spec(path, storage=str(storage))
    p = info.value.problems[0]
    assert p.field == field and p.line == 2 and message in p.message
    path, storage = _spec(tmp_path, retries=-1)
    with pytest.raises(SpecError) as info:
        load_spec(path, storage=str(storage))
    p = info.value.problems[0]
    assert p.field == "steps.generate.retries" and p.line == 8 and "greater than or equal to 0" in p.message


@pytest.mark.parametrize("allowed", [False, True])
def test_a_submitted_runs_hook_runs_only_where_the_operator_allows(tmp_path, monkeypatch, allowed):
    """A submitted run's driver is a worker: its on_failure command runs there only with
    TFOOC_ALLOW_ON_FAILURE=1 in the worker's environment, else it is skipped, logged and recorded."""
    hook = "on_failure: 'echo ran > hook.txt'\n"
    path, storage = _spec(tmp_path, retries=0, hook=hook)
    monkeypatch.chdir(storage)
    if allowed:
        monkeypatch.setenv("TFOOC_ALLOW_ON_FAILURE", "1")
    else:
        monkeypatch.delenv("TFOOC_ALLOW_ON_FAILURE", raising=False)
    workflow = load_spec(str(path), storage=str(storage))
    (storage / "shared").write_text("a file where the output's folder goes, made after the spec was checked")
    outcome = execute(workflow, mode="submitted")
    rec = RunStore(str(storage)).list()[0]
    assert rec.state == "failed" and rec.mode == "submitted" and outcome is not None
    assert (storage / "hook.txt").exists() == allowed
    if allowed:
        assert rec.on_failure["exit_code"] == 0
    else:
        assert "TFOOC_ALLOW_ON_FAILURE=1" in rec.on_failure["skipped"]
        events = RunStore(str(storage)).events(rec.run_id)
        assert events[-1]["event"] == "on-failure" and events[-1]["level"] == "warning"


def test_an_output_through_a_file_is_refused_by_validate_and_never_retried(tmp_path, rng):
    """validate names the file in the way; a file made after the check fails the step at once
    (FileExistsError, NotADirectoryError are not transient: every try would fail the same)."""
    delay = float(rng.uniform(0.05, 0.2))
    path, storage = _spec(tmp_path, retries=int(rng.integers(2, 5)), delay=delay)
    (storage / "shared").write_text("a regular file, not a folder")
    with pytest.raises(SpecError) as info:
        load_spec(path, storage=str(storage))
    (p,) = [p for p in info.value.problems if p.field == "steps.generate.out"]
    assert p.line == 5 and f"goes through {storage / 'shared'}, which is a file, not a folder" in p.message
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", "validate", str(path), "--storage", str(storage)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "which is a file, not a folder" in r.stderr
    # the file appears after the check: one try, no retry
    (storage / "shared").unlink()
    workflow = load_spec(path, storage=str(storage))
    (storage / "shared").write_text("made after the check")
    t0 = time.time()
    out = execute(workflow)
    assert out.exit_code == 1 and time.time() - t0 < 30
    tries = out.record.steps["generate"].tries
    assert len(tries) == 1 and "retry_in" not in tries[0], tries
    assert "FileExistsError" in tries[0]["error"] or "NotADirectoryError" in tries[0]["error"]
    assert "not retried: another try would fail the same way" in tries[0]["error"]
    assert not [e for e in RunStore(str(storage)).events(out.run_id) if e["event"] == "step-retry"]
