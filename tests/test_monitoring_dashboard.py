"""The Dask dashboard of the embedded cluster renders (bokeh is a core dependency) and carries the
tfooc page, whose link the log gives; a past run is listed from its record."""

from __future__ import annotations

import json
import logging
import urllib.request

from tensorflow_ooc.execution import get_client
from tensorflow_ooc.monitoring import PAGE_PATH
from tensorflow_ooc.monitoring.state import RunsState


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def test_embedded_dashboard_status_and_tfooc_page(caplog):
    caplog.set_level(logging.INFO, logger="tensorflow_ooc")
    with get_client(None, "embedded", dashboard_address="127.0.0.1:0", device="cpu") as client:
        scheduler = client.cluster.scheduler
        base = f"http://127.0.0.1:{scheduler.http_server.port}"
        status, html = _get(base + "/status")
        assert status == 200
        assert "Dask needs bokeh" not in html and "bokeh" in html.lower()
        assert 'href="tfooc"' in html  # our tab in the dashboard's navigation bar
        status, page = _get(base + PAGE_PATH)
        assert status == 200 and "<title>tfooc runs</title>" in page
        # the run's events reach the page through the scheduler's "tfooc" topic
        client.log_event("tfooc", {"run_id": "r-1", "event": "run-started", "time": "2026-01-01T00:00:00.000Z"})
        client.log_event(
            "tfooc",
            {
                "run_id": "r-1",
                "event": "iteration",
                "step": "decompose",
                "iteration": 1,
                "fit": 0.5,
                "fit_change": 0.5,
                "mode_seconds": [0.1, 0.2],
                "mttkrp_seconds": [0.05, 0.1],
                "bytes_read": 1000,
                "checkpoint_seconds": 0.01,
            },
        )
        runs = json.loads(_get(base + PAGE_PATH + "/runs.json")[1])["runs"]
        assert [(r["run_id"], r["state"], r["iterations"], r["fit"]) for r in runs] == [("r-1", "running", 1, 0.5)]
        view = json.loads(_get(base + PAGE_PATH + "/runs/r-1.json")[1])
        assert view["iterations"]["decompose"][0]["bytes_read"] == 1000 and view["checkpoints"][0]["iteration"] == 1
    # the log names the page (the link the CLI prints)
    assert any(
        "tfooc monitoring page:" in r.getMessage() and r.getMessage().split()[3].endswith("/tfooc")
        for r in caplog.records
    )


def test_past_runs_listed_from_records(tmp_path):
    """A run recorded under a storage root appears with its state, iterations and fit, from
    record.json and events.jsonl, without any live event."""
    from tensorflow_ooc.workflow.records import RunRecord, RunStore, StepRecord

    runs = RunStore(str(tmp_path))
    rec = RunRecord(
        run_id="past-1",
        workflow="w",
        spec_path="w.yaml",
        spec_sha256="0",
        storage=str(tmp_path),
        cluster="embedded",
        mode="foreground",
        user="u",
        host="h",
        created_at="2026-01-01T00:00:00.000Z",
        state="failed",
        error="boom",
        steps={"decompose": StepRecord(kind="decompose", state="failed", progress={"iteration": 2, "fit": 0.2})},
    )
    runs.write(rec)
    runs.append_events(
        "past-1",
        [
            {
                "run_id": "past-1",
                "event": "iteration",
                "step": "decompose",
                "iteration": i,
                "fit": 0.1 * i,
                "time": "2026-01-01T00:00:01.000Z",
            }
            for i in (1, 2)
        ]
        + [
            {
                "run_id": "past-1",
                "event": "error",
                "step": "decompose",
                "level": "error",
                "message": "decompose: boom",
                "traceback": "Traceback ...",
                "time": "2026-01-01T00:00:02.000Z",
            }
        ],
    )
    state = RunsState([str(tmp_path)])
    (row,) = state.runs()
    assert (row["run_id"], row["state"], row["iterations"], row["fit"], row["error"]) == (
        "past-1",
        "failed",
        2,
        0.2,
        "boom",
    )
    view = state.run("past-1")
    assert [it["fit"] for it in view["iterations"]["decompose"]] == [0.1, 0.2]
    assert view["errors"][0]["traceback"] == "Traceback ..." and view["steps"]["decompose"]["state"] == "failed"
    assert state.counts()["failed"] == 1
