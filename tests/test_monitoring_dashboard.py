"""The Dask dashboard of the embedded cluster renders (bokeh is a core dependency) and carries the
tfooc page, whose link the log gives; a past run is listed from its record."""

from __future__ import annotations

import json
import logging
import math
import urllib.request
from html.parser import HTMLParser

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_monitoring_run import _chromium, needs_chromium

from tensorflow_ooc.execution import get_client
from tensorflow_ooc.monitoring import PAGE_PATH
from tensorflow_ooc.monitoring.state import RunsState


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def _strict_json(text: str):
    """JSON as the browser's JSON.parse reads it: no NaN or Infinity."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON the page parses"))


# a CP-APR run's outer iterations as its decompose step sends them (cp_apr history records; the
# first one's loglik_change is NaN): no fit_change, no per-mode seconds
POISSON_ITERATIONS = [
    {"iteration": 1, "loglik": -1.5e5, "loglik_change": math.nan, "kkt_violation": 0.5, "fit": 0.25, "seconds": 2.0},
    {"iteration": 2, "loglik": -1.2e5, "loglik_change": 3e4, "kkt_violation": 1e-2, "fit": 0.3, "seconds": 0.2},
    {"iteration": 3, "loglik": -1.19e5, "loglik_change": 1e3, "kkt_violation": 0.0, "fit": 0.31, "seconds": 0.2},
]


def _poisson_event(run_id: str, it: dict) -> dict:
    extra = {"inner_iterations": 10, "violations": 0, "zeros": 2, "pass_seconds": 0.1, "nnz": 1000, "max_iters": 50}
    return {"run_id": run_id, "event": "iteration", "step": "decompose", **it, **extra}


def test_embedded_dashboard_status_and_tfooc_page(caplog):
    caplog.set_level(logging.INFO, logger="tensorflow_ooc")
    with get_client(None, "embedded", dashboard_address="127.0.0.1:0", device="cpu") as client:
        scheduler = client.cluster.scheduler
        # its workers take submitted runs without any setup: each has one tfooc-slot
        assert [w.resources for w in scheduler.workers.values()] == [{"tfooc-slot": 1}]
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
        # a driver retried after a lost worker repeats iteration 2 from the checkpoint after 1:
        # the plot keeps the latest, the counters never go back (Prometheus would read a reset)
        for it in (2, 2):
            client.log_event(
                "tfooc", {"run_id": "r-1", "event": "iteration", "step": "decompose", "iteration": it, "bytes_read": 10}
            )
        view = json.loads(_get(base + PAGE_PATH + "/runs/r-1.json")[1])
        assert [it["iteration"] for it in view["iterations"]["decompose"]] == [1, 2]
        # a CP-APR (Poisson) run: its log-likelihood and KKT violation, not a fit change
        client.log_event("tfooc", {"run_id": "r-apr", "event": "run-started", "time": "2026-01-01T00:00:01.000Z"})
        for it in POISSON_ITERATIONS:
            client.log_event("tfooc", _poisson_event("r-apr", it))
        rows = {r["run_id"]: r for r in _strict_json(_get(base + PAGE_PATH + "/runs.json")[1])["runs"]}
        assert (rows["r-apr"]["loglik"], rows["r-apr"]["fit"], rows["r-apr"]["iterations"]) == (-1.19e5, 0.31, 3)
        assert "loglik" not in rows["r-1"]  # a CP-ALS run's row as before
        # what the page draws from: the three series, the first change (NaN) as null, strict JSON
        its = _strict_json(_get(base + PAGE_PATH + "/runs/r-apr.json")[1])["iterations"]["decompose"]
        assert [it["loglik"] for it in its] == [-1.5e5, -1.2e5, -1.19e5]
        assert [it["loglik_change"] for it in its] == [None, 3e4, 1e3]
        assert [it["kkt_violation"] for it in its] == [0.5, 1e-2, 0.0]
        assert [it["inner_iterations"] for it in its] == [10, 10, 10] and not any("fit_change" in it for it in its)
        # the page plots those for a step with a log-likelihood, labelled as such (drawn by
        # test_page_scales_axes_to_the_data_in_chromium's page script; its plot classes and captions)
        for text in ('"log-likelihood (Poisson)"', "`KKT violation (log scale;", '"pt-loglik"', '"pt-kkt"'):
            assert text in page
        metrics = _get(base + "/metrics")[1]
        assert 'tfooc_iterations_total{run_id="r-1",step="decompose"} 3.0' in metrics
        assert 'tfooc_iteration{run_id="r-1",step="decompose"} 2.0' in metrics
        assert 'tfooc_bytes_read_total{run_id="r-1",step="decompose"} 1020.0' in metrics
        samples = {
            (f.name, s.labels["run_id"]): s.value
            for f in text_string_to_metric_families(metrics)
            if f.name.startswith("tfooc_")
            for s in f.samples
            if s.labels.get("step") == "decompose"
        }
        assert samples[("tfooc_loglik", "r-apr")] == -1.19e5 and samples[("tfooc_kkt_violation", "r-apr")] == 0.0
        assert samples[("tfooc_fit", "r-apr")] == 0.31 and samples[("tfooc_iteration", "r-apr")] == 3
        assert ("tfooc_fit_change", "r-apr") not in samples
        # the CP-ALS run (its latest iteration with no fit): no Poisson gauges
        assert samples[("tfooc_iteration", "r-1")] == 2
        assert not {("tfooc_loglik", "r-1"), ("tfooc_kkt_violation", "r-1")} & samples.keys()
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
    # a finished CP-APR run: its row has its log-likelihood (and the least-squares fit), from the
    # record's metrics and its events
    runs.write(
        RunRecord(
            run_id="past-apr",
            workflow="w",
            spec_path="w.yaml",
            spec_sha256="0",
            storage=str(tmp_path),
            cluster="embedded",
            mode="foreground",
            user="u",
            host="h",
            created_at="2025-12-31T00:00:00.000Z",
            state="done",
            steps={
                "decompose": StepRecord(
                    kind="decompose",
                    state="done",
                    metrics={"loglik": -1.19e5, "kkt_violation": 0.0, "fit": 0.31, "iterations": 3},
                    progress=POISSON_ITERATIONS[-1],
                )
            },
        )
    )
    runs.append_events("past-apr", [_poisson_event("past-apr", it) for it in POISSON_ITERATIONS])
    state = RunsState([str(tmp_path)])
    row, apr = state.runs()
    assert (apr["run_id"], apr["loglik"], apr["fit"], apr["iterations"]) == ("past-apr", -1.19e5, 0.31, 3)
    assert "loglik" not in row
    apr_its = state.run("past-apr")["iterations"]["decompose"]
    assert [(it["loglik"], it["kkt_violation"]) for it in apr_its] == [
        (it["loglik"], it["kkt_violation"]) for it in POISSON_ITERATIONS
    ]
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
    assert state.counts()["failed"] == 1 and state.counts()["done"] == 1


class _Texts(HTMLParser):
    """Start tags with their attributes and the text right after them (SVG labels, table cells)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), []))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), []))

    def handle_data(self, data):
        if self.elements:
            self.elements[-1][2].append(data)

    def having(self, cls: str) -> list[tuple[dict, str]]:
        return [(a, "".join(t)) for _, a, t in self.elements if cls in (a.get("class") or "").split()]


def _fit_noise(i: int) -> float:
    return 0.948020 + (1e-15 if i % 2 else -1e-15)  # a converged fit: rounding noise only


@needs_chromium
def test_page_scales_axes_to_the_data_in_chromium():
    """A converged run (its first iteration 8.4 s of compilation, then 0.1 s ones; its fit flat
    but for 1e-15 noise), a failed and a cancelled run, drawn by headless Chromium: the steady
    bars use the plot's height and the first is drawn apart, the fit axis's labels differ and its
    line is flat, fit changes below the floor sit on it, and the errors column gives each
    error's first line."""
    its = [
        {"iteration": 1, "fit": 0.5, "fit_change": 0.5, "seconds": 8.4, "mode_seconds": [3.0, 3.0, 2.4]},
        {"iteration": 2, "fit": 0.9, "fit_change": 0.4, "seconds": 0.1, "mode_seconds": [0.03, 0.04, 0.03]},
    ] + [
        {
            "iteration": i,
            "fit": _fit_noise(i),
            "fit_change": [0.048020, 1e-9, 2e-15, -1e-15, 0.0, 1e-16][i - 3],
            "seconds": 0.1 + 0.01 * i,
            "mode_seconds": [0.03 + 0.01 * i, 0.04, 0.03],
        }
        for i in range(3, 9)
    ]
    with get_client(None, "embedded", dashboard_address="127.0.0.1:0", device="cpu") as client:
        base = f"http://127.0.0.1:{client.cluster.scheduler.http_server.port}"
        for run_id in ("conv", "bad", "stopped"):
            client.log_event("tfooc", {"run_id": run_id, "event": "run-started", "time": "2026-01-01T00:00:00.000Z"})
        for it in its:
            client.log_event("tfooc", {"run_id": "conv", "event": "iteration", "step": "decompose", **it})
        client.log_event(
            "tfooc",
            {
                "run_id": "bad",
                "event": "run-finished",
                "state": "failed",
                "level": "error",
                "message": "run bad failed: ValueError: boom\n  more detail on a second line",
            },
        )
        client.log_event(
            "tfooc",
            {
                "run_id": "stopped",
                "event": "run-finished",
                "state": "cancelled",
                "level": "info",
                "message": "run stopped cancelled: run stopped was cancelled (tfooc cancel)",
            },
        )
        dom = _Texts()
        dom.feed(_chromium("--window-size=1400,1400", "--dump-dom", f"{base}{PAGE_PATH}?run=conv"))

    # seconds per mode: the first iteration drawn apart, the others scaled to the plot (140 px)
    heights: dict[int, float] = {}
    for a, _ in dom.having("bar-mode"):
        heights[int(a["data-iteration"])] = heights.get(int(a["data-iteration"]), 0.0) + float(a["height"])
    first = dom.having("bar-first")
    assert {int(a["data-iteration"]) for a, _ in first} == {1} and len(first) == 3
    assert max(h for i, h in heights.items() if i > 1) == pytest.approx(140, abs=1)
    assert heights[1] <= 141
    ((label_attrs, label),) = dom.having("first-iteration")
    assert "iteration 1: 8.40 s, includes compilation" in label
    # the fit axis: three different labels, and the converged points on one line
    labels = [t for _, t in dom.having("ylab")]
    fit_labels = labels[:3]
    assert len(set(fit_labels)) == 3, fit_labels
    converged = [float(a["cy"]) for a, _ in dom.having("pt-fit") if int(a["data-iteration"]) >= 3]
    assert len(converged) == 6 and max(converged) - min(converged) < 0.5
    # fit change on a log axis with a floor: |change| < 1e-12 drawn on it, the axis starts there
    floored = dom.having("floored")
    assert sorted(int(a["data-iteration"]) for a, _ in floored) == [5, 6, 7, 8]
    assert len({a["cy"] for a, _ in floored}) == 1
    assert labels[3] == "1.0e-12" and len(set(labels[3:6])) == 3
    # axes from 0 (bytes read, none here) stay at 0 and above: no "-1 B" label
    assert not [t for t in labels if t.strip().startswith("-")], labels
    # the errors column: each error's first line
    errors = {a.get("title", ""): t.strip() for a, t in dom.having("error-line")}
    assert set(errors.values()) == {"run bad failed: ValueError: boom", "run stopped was cancelled (tfooc cancel)"}
    # the cluster section: the embedded worker and its memory limit (no run holds it: no plan)
    rows = [a for _, a, _ in dom.elements if "worker-row" in (a.get("class") or "").split()]
    assert len(rows) == 1 and int(rows[0]["data-memory-limit"]) > 0
    assert dom.having("meta") and any(a.get("id") == "queue-empty" for _, a, _ in dom.elements)
