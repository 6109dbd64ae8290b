"""Webhook notifications, against a real HTTP server on 127.0.0.1: ``on_success``, ``on_failure``
and ``on_retry`` each POST one JSON object; a webhook that fails (an HTTP error, nobody listening)
is logged and recorded and never changes the run's outcome; the run date variable reaches the
payload, the outputs and the record."""

from __future__ import annotations

import datetime
import json
import socket

import pytest
from webhook_server import webhook_server

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.records import RunStore
from tensorflow_ooc.workflow.runner import execute

SPEC = """\
name: nightly-{tag}
webhooks:
{hooks}
steps:
  generate:
    kind: generate
    out: "shared/day-${{RUN_DATE}}.tns"
    shape: [6, 7, 8]
    nnz: {nnz}
    retries: {retries}
    retry_delay: 0.05
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens there once closed


def _spec(tmp_path, hooks: dict, rng, retries=0) -> str:
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in hooks.items())
    return SPEC.format(tag=rng.integers(1000), hooks=lines, nnz=int(rng.integers(20, 60)), retries=retries)


def test_success_posts_one_json_object_and_failing_hooks_are_not_fatal(tmp_path, rng):
    storage = tmp_path / "storage"
    with webhook_server() as server:
        server["status"]["/broken"] = 500
        hooks = {
            "on_success": [server["url"] + "/done", server["url"] + "/broken", f"http://127.0.0.1:{_closed_port()}/x"],
            "on_failure": server["url"] + "/failed",
        }
        date = f"20{rng.integers(20, 40)}-0{rng.integers(1, 10)}-1{rng.integers(0, 10)}"
        wf = load_spec(text=_spec(tmp_path, hooks, rng), storage=str(storage), overrides=[f"RUN_DATE={date}"])
        out = execute(wf)
    assert out.state == "done" and out.exit_code == 0  # the broken and unreachable hooks change nothing
    assert (storage / "shared" / f"day-{date}.tns").exists() and out.record.run_date == date
    by_path = {p["path"]: p for p in server["posts"]}
    assert set(by_path) == {"/done", "/broken"}
    body = by_path["/done"]["json"]
    assert by_path["/done"]["headers"]["Content-Type"] == "application/json"
    assert body["event"] == "on_success" and body["run_id"] == out.run_id and body["state"] == "done"
    assert body["run_date"] == date and body["steps"] == {"generate": "done"} and body["exit_code"] == 0
    notes = RunStore(str(storage)).read(out.run_id).notifications
    assert [n.get("status") for n in notes] == [200, None, None]
    assert "HTTP 500" in notes[1]["error"] and "Connection refused" in notes[2]["error"]
    warned = [
        e for e in RunStore(str(storage)).events(out.run_id) if e["event"] == "webhook" and e["level"] == "warning"
    ]
    assert len(warned) == 2 and all("the run's outcome stands" in e["message"] for e in warned)


def test_failure_and_retry_hooks(tmp_path, rng, full_share):
    storage = tmp_path / "storage"
    with webhook_server() as server:
        hooks = {
            "on_failure": server["url"] + "/failed",
            "on_retry": server["url"] + "/retry",
            "on_success": server["url"] + "/ok",
        }
        out = execute(load_spec(text=_spec(tmp_path, hooks, rng, retries=2), storage=str(storage)))
    assert out.state == "failed"  # the disk stays full: every try fails
    paths = [p["path"] for p in server["posts"]]
    assert paths == ["/retry", "/retry", "/failed"], paths
    retry = server["posts"][0]["json"]
    assert retry["event"] == "on_retry" and retry["retry"] == "step" and retry["step"] == "generate"
    assert retry["attempt_of_step"] == 1 and retry["tries"] == 3 and "no space left" in retry["error"]
    failed = server["posts"][-1]["json"]
    assert failed["state"] == "failed" and failed["step"] == "generate" and "no space left" in failed["error"]
    assert failed["run_date"] == datetime.date.today().isoformat()  # the default: today


def test_run_date_from_the_flag_the_set_option_or_today(tmp_path, rng, capsys):
    storage = tmp_path / "storage"
    spec = tmp_path / "nightly.yaml"
    spec.write_text(
        SPEC.format(tag=1, hooks="  on_success: http://127.0.0.1:9/never", nnz=30, retries=0).replace(
            "webhooks:\n  on_success: http://127.0.0.1:9/never\n", ""
        )
    )
    day = datetime.date(2026, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 300)))
    assert main(["-q", "run", str(spec), "--storage", str(storage), "--run-date", day.isoformat()]) == 0
    assert (storage / "shared" / f"day-{day}.tns").exists()
    other = day + datetime.timedelta(days=1)
    assert main(["-q", "run", str(spec), "--storage", str(storage), "--set", f"RUN_DATE={other}"]) == 0
    assert (storage / "shared" / f"day-{other}.tns").exists()
    assert main(["-q", "run", str(spec), "--storage", str(storage)]) == 0
    assert (storage / "shared" / f"day-{datetime.date.today()}.tns").exists()
    assert {r.run_date for r in RunStore(str(storage)).list()} == {str(day), str(other), str(datetime.date.today())}
    capsys.readouterr()
    assert main(["run", str(spec), "--storage", str(storage), "--run-date", "2026-13-40"]) == 2
    err = capsys.readouterr().err
    assert "--run-date: expected a date as YYYY-MM-DD" in err and "Traceback" not in err
    assert main(["validate", str(spec), "--storage", str(storage), "--set", "RUN_DATE=yesterday"]) == 2
    assert "--set RUN_DATE: expected a date as YYYY-MM-DD" in capsys.readouterr().err


def test_bad_webhook_urls_are_spec_errors(tmp_path):
    text = "steps:\n  g: {kind: generate, out: t.tns, shape: [3, 4, 5], nnz: 9}\nwebhooks:\n  on_success: ftp://x/y\n"
    with pytest.raises(SpecError) as info:
        load_spec(text=text, storage=str(tmp_path))
    p = info.value.problems[0]
    assert p.field == "webhooks.on_success" and p.line == 4 and "http:// or https:// URL" in p.message
