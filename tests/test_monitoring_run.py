"""The monitoring page and metrics during a real run.

A real scheduler started the documented way (``dask scheduler --preload tensorflow_ooc.monitoring
--tfooc-storage ROOT``) and a real worker, both separate processes; ``tfooc submit`` sends a
workflow whose CP-ALS runs until it is cancelled. Headless Chromium loads ``/tfooc`` while the run
goes: a screenshot, and the plotted points checked against the run's events. ``/metrics`` is
scraped with prometheus_client's parser. Then ``tfooc cancel`` and the page and metrics say so.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from dask_processes import dask_processes, until
from headless_browser import CHROMIUM, HEADLESS_FLAGS

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow.records import RunStore

SPEC = """\
name: monitored
steps:
  generate: {kind: generate, out: t.zarr, shape: [200, 150, 180], nnz: 200000, model: planted, rank: 6,
             noise: 0.1, seed: 3}
  decompose: {kind: decompose, input: t.zarr, out: t.cp.zarr, rank: 6, max_iters: 100000, tol: 0, seed: 1,
              scheduler: cluster, execution: streaming}
"""
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (Debian: apt-get install chromium); the browser checks of /tfooc need it",
)
SCREENSHOT = os.environ.get("TFOOC_SCREENSHOT")  # also keep the screenshot here (a path), if set


def _until(predicate, timeout=120.0, what="condition", every=0.2):
    return until(predicate, timeout, what, every)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200, url
        return r.read().decode()


def _chromium(*args: str, timeout: float = 90) -> str:
    cmd = [CHROMIUM, *HEADLESS_FLAGS, "--virtual-time-budget=4000", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


class _Elements(HTMLParser):
    """Every start tag of a document, with its attributes (SVG children included)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def having(self, cls: str) -> list[dict]:
        return [a for _, a in self.elements if cls in (a.get("class") or "").split()]


def _dom(url: str) -> _Elements:
    p = _Elements()
    p.feed(_chromium("--dump-dom", url))
    return p


def _iteration_events(root: str, run_id: str) -> dict[int, dict]:
    return {e["iteration"]: e for e in RunStore(root).events(run_id) if e["event"] == "iteration"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Scheduler (with the preload) and worker processes, and a submitted run that keeps iterating."""
    tmp = tmp_path_factory.mktemp("monitoring")
    root = str(tmp / "storage")
    env = {"TFOOC_HEARTBEAT_S": "0.5", "NUMBA_NUM_THREADS": "1"}
    # two workers: owner-computes, so the page and /metrics show the bytes sent between workers
    with dask_processes(tmp, root, workers=2, env=env) as cluster:
        spec = tmp / "monitored.yaml"
        spec.write_text(SPEC)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["submit", str(spec), "--scheduler", cluster["address"], "--storage", root]) == 0
        run_id = out.getvalue().strip()
        yield {
            "base": cluster["base"],
            "address": cluster["address"],
            "root": root,
            "run_id": run_id,
            "log": err.getvalue(),
            "tmp": tmp,
        }
        rec = RunStore(root).read(run_id)
        if not rec.final:
            main(["cancel", run_id, "--storage", root, "--wait", "--timeout", "60"])


def _progress(served) -> int:
    """CP-ALS iterations done so far (from the events: the record's progress is saved with the
    next heartbeat); fails once the run has ended."""
    rec = RunStore(served["root"]).read(served["run_id"])
    assert rec.state in ("queued", "running"), (rec.state, rec.error)
    return max(_iteration_events(served["root"], served["run_id"]), default=0)


def test_submit_log_links_the_page(served):
    assert f"{served['base']}/tfooc" in served["log"]
    # these workers declare no tfooc-slot: the run goes as before, and submit says why it is not queued
    assert "no worker of this cluster declares the tfooc-slot resource" in served["log"]
    assert "--resources tfooc-slot=1" in served["log"]
    page = _get(served["base"] + "/tfooc")
    assert "<title>tfooc runs</title>" in page
    status = _get(served["base"] + "/status")  # the Dask dashboard, with bokeh, and our tab in its navbar
    assert "Dask needs bokeh" not in status and 'href="tfooc"' in status


@needs_chromium
def test_page_during_run_in_chromium(served):
    _until(lambda: _progress(served) >= 3, 180, "three CP-ALS iterations")
    url = f"{served['base']}/tfooc?run={served['run_id']}"
    shot = served["tmp"] / "tfooc-page-running.png"
    _chromium("--window-size=1400,1400", f"--screenshot={shot}", url)
    assert shot.stat().st_size > 20_000
    print(f"screenshot of /tfooc during the run: {shot}")
    if SCREENSHOT:
        Path(SCREENSHOT).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)

    dom = _dom(url)
    body = next(a for t, a in dom.elements if t == "body")
    assert body["data-state"] == "ready"
    run = next(a for t, a in dom.elements if a.get("id") == "run")
    assert run["data-run-id"] == served["run_id"] and run["data-state"] == "running"
    rows = dom.having("run-row")
    assert [r["data-run-id"] for r in rows] == [served["run_id"]] and rows[0]["data-state"] == "running"
    block = next(a for a in dom.having("step-plots") if a["data-step"] == "decompose")
    n = int(block["data-iterations"])
    fit_points = dom.having("pt-fit")
    assert n >= 3 and len(fit_points) == n  # one point per iteration done
    assert [int(p["data-iteration"]) for p in fit_points] == list(range(1, n + 1))
    assert len(dom.having("pt-nnz-per-s")) == n and len(dom.having("pt-bytes-read")) == n
    assert len(dom.having("bar-mode")) == 3 * n  # seconds of each of the 3 modes, per iteration
    # the plotted values are the run's: its iteration events (written before they reach the page)
    events = _iteration_events(served["root"], served["run_id"])
    for p in fit_points:
        assert float(p["data-value"]) == pytest.approx(events[int(p["data-iteration"])]["fit"], rel=1e-12)
    cum = 0
    for p in dom.having("pt-bytes-read"):
        cum += events[int(p["data-iteration"])]["bytes_read"]
        assert float(p["data-value"]) == cum > 0  # streaming: every chunk read per mode
    sent = dom.having("pt-bytes-sent")  # owner-computes on the 2 workers
    assert len(sent) == n
    for p in sent:
        ev = events[int(p["data-iteration"])]
        assert float(p["data-value"]) == ev["bytes_sent"] >= ev["bytes_lower_bound"] > 0 and ev["workers"] == 2
    # the first iteration (compilation included) is drawn apart from the steady ones
    assert {int(a["data-iteration"]) for a in dom.having("bar-first")} == {1}
    # the workers, each with its memory limit; the one running the driver with its plan's peak
    workers = dom.having("worker-row")
    assert len(workers) == 2 and all(int(w["data-memory-limit"]) == 2 << 30 for w in workers)
    peaks = [int(w["data-plan-peak"]) for w in workers if w["data-plan-peak"]]
    assert len(peaks) == 1 and 0 < peaks[0] < 0.7 * (2 << 30)
    assert _progress(served) >= n  # the run was still going


def test_metrics_during_run(served):
    from prometheus_client.parser import text_string_to_metric_families

    _until(lambda: _progress(served) >= 2, 180, "two CP-ALS iterations")
    fams = {f.name: f for f in text_string_to_metric_families(_get(served["base"] + "/metrics"))}
    run = served["run_id"]

    def samples(family, name=None, **labels):
        return [
            s
            for s in fams[family].samples
            if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    assert "dask_scheduler_workers" in fams  # Dask's own metrics, same endpoint
    assert fams["tfooc_iterations"].type == "counter"
    (it,) = samples("tfooc_iterations", "tfooc_iterations_total", run_id=run, step="decompose")
    assert it.value >= 2
    (fit,) = samples("tfooc_fit", run_id=run, step="decompose")
    assert 0 < fit.value <= 1
    mttkrp = samples("tfooc_mttkrp_seconds", run_id=run, step="decompose")
    assert sorted(s.labels["mode"] for s in mttkrp) == ["0", "1", "2"] and all(s.value > 0 for s in mttkrp)
    (read,) = samples("tfooc_bytes_read", "tfooc_bytes_read_total", run_id=run, step="decompose")
    assert read.value > 0
    (sent,) = samples("tfooc_bytes_sent", "tfooc_bytes_sent_total", run_id=run, step="decompose")
    (bound,) = samples("tfooc_bytes_lower_bound", "tfooc_bytes_lower_bound_total", run_id=run, step="decompose")
    assert sent.value >= bound.value > 0
    exch = samples("tfooc_exchange_seconds", run_id=run, step="decompose")
    assert sorted(s.labels["mode"] for s in exch) == ["0", "1", "2"]
    (running,) = samples("tfooc_runs", state="running")
    assert running.value == 1


def test_cancel_shows_on_page_and_metrics(served):
    from prometheus_client.parser import text_string_to_metric_families

    _until(lambda: _progress(served) >= 2, 180, "two CP-ALS iterations")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["cancel", served["run_id"], "--storage", served["root"], "--wait", "--timeout", "60"]) == 0
    rec = RunStore(served["root"]).read(served["run_id"])
    assert rec.state == "cancelled"
    done = max(_iteration_events(served["root"], served["run_id"]))
    assert rec.steps["decompose"].progress["iteration"] == done
    runs = json.loads(_get(served["base"] + "/tfooc/runs.json"))["runs"]
    assert [(r["run_id"], r["state"]) for r in runs] == [(served["run_id"], "cancelled")]
    view = json.loads(_get(f"{served['base']}/tfooc/runs/{served['run_id']}.json"))
    assert len(view["iterations"]["decompose"]) == done and view["checkpoints"]
    fams = {f.name: f for f in text_string_to_metric_families(_get(served["base"] + "/metrics"))}
    states = {s.labels["state"]: s.value for s in fams["tfooc_runs"].samples}
    assert states["cancelled"] == 1 and states["running"] == 0
    if CHROMIUM:
        dom = _dom(f"{served['base']}/tfooc?run={served['run_id']}")
        run = next(a for t, a in dom.elements if a.get("id") == "run")
        assert run["data-state"] == "cancelled"
        assert len(dom.having("pt-fit")) == done
        assert dom.having("checkpoint")
        # the errors column gives the cancelled run's error (its first line; all of it on hover)
        (cell,) = dom.having("error-line")
        assert cell["title"] == rec.error and "cancelled" in rec.error


def test_resumed_run_counts_its_own_iterations(served):
    """Submitted again after the cancel, the spec resumes from the checkpoint as a new run: its
    iteration counter counts what it did (from its first), and never the iteration index."""
    from prometheus_client.parser import text_string_to_metric_families

    root = served["root"]
    if not RunStore(root).read(served["run_id"]).final:
        # the test before cancels it, but work stealing may have run that test in another pytest
        # process (each has its own served run): run two iterations and cancel here
        _until(lambda: _progress(served) >= 2, 180, "two CP-ALS iterations")
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["cancel", served["run_id"], "--storage", root, "--wait", "--timeout", "60"]) == 0
    assert RunStore(root).read(served["run_id"]).final
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()) as out:
        assert (
            main(["submit", str(served["tmp"] / "monitored.yaml"), "--scheduler", served["address"], "--storage", root])
            == 0
        )
    run_id = out.getvalue().strip()
    try:
        _until(lambda: len(_iteration_events(root, run_id)) >= 2, 180, "the resumed run's iterations")
        before = len(_iteration_events(root, run_id))
        fams = {f.name: f for f in text_string_to_metric_families(_get(served["base"] + "/metrics"))}
        after = len(_iteration_events(root, run_id))
        (count,) = [s for s in fams["tfooc_iterations"].samples if s.labels.get("run_id") == run_id]
        (index,) = [s for s in fams["tfooc_iteration"].samples if s.labels.get("run_id") == run_id]
        resumed = RunStore(root).read(run_id).steps["decompose"].resumed_from_iteration
        assert resumed and resumed >= 2
        assert before <= count.value <= after
        assert index.value == resumed + count.value  # the index went on from the checkpoint
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            main(["cancel", run_id, "--storage", root, "--wait", "--timeout", "60"])
