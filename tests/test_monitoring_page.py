"""The /tfooc page in headless Chromium, measured: its log axes, its width in a 1400 px window, a
queued run, the runs table's pages, and a run that succeeded after a lost attempt.

The runs are real run records and events under a storage root that a real Dask scheduler's
monitoring plugin reads; Chromium is driven over the DevTools protocol (tests/headless_browser.py),
so that the checks read the layout (element widths, what overflows) and click, where
``--dump-dom`` gives the document alone.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from headless_browser import CHROMIUM, HeadlessPage

from tensorflow_ooc.workflow.records import Attempt, RunRecord, RunStore, StepRecord

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (Debian: apt-get install chromium); the browser checks of /tfooc need it",
)
WIDTH = 1400
NOW = datetime.now(UTC)


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _record(root: str, run_id: str, created: datetime, state: str, **fields) -> RunRecord:
    rec = RunRecord(
        run_id=run_id,
        workflow=fields.pop("workflow", "nightly"),
        spec_path="w.yaml",
        spec_sha256="0",
        storage=root,
        cluster="tcp://scheduler:8786",
        mode="submitted",
        user="u",
        host="h",
        created_at=_iso(created),
        state=state,
        **fields,
    )
    RunStore(root).write(rec)
    return rec


def _event(run_id: str, event: str, t: datetime, **fields) -> dict:
    return {"run_id": run_id, "event": event, "time": _iso(t), "level": "info", **fields}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A scheduler with its dashboard and the monitoring plugin reading a storage root of runs:
    a batch of past nightly runs (a random count, random times), a run whose fit change ends in
    [0.011, 0.045], runs with long ids and a long error, a queued run and a requeued one, and runs
    that went on after a lost attempt."""
    from distributed import Client, LocalCluster

    from tensorflow_ooc.monitoring import attach

    rng = np.random.default_rng()
    root = str(tmp_path_factory.mktemp("page") / "storage")
    runs = RunStore(root)
    created: dict[str, datetime] = {}

    # past nightly runs: more than two pages, at random times over the last year; more than a page
    # of 10 reads by the seconds in new_run_id's ids (their ids have none: each is read)
    n_past = int(rng.integers(90, 130))
    for i, days in enumerate(rng.permutation(rng.choice(np.arange(2, 365), n_past, replace=False))):
        run_id = f"nightly-{i:03d}"
        created[run_id] = NOW - timedelta(days=int(days), seconds=int(rng.integers(0, 3600)))
        _record(root, run_id, created[run_id], "done", started_at=_iso(created[run_id]))

    # a CP-ALS run whose |fit change| falls from ~1e-8 .. 1e-5 to a top in [0.011, 0.045]
    t = NOW - timedelta(hours=1)
    top = float(rng.uniform(0.011, 0.045))
    low = 10 ** float(rng.uniform(-8, -5))
    changes = sorted(np.geomspace(low, top, 7).tolist(), reverse=True)
    fits = np.cumsum(changes)
    _record(root, "axes", t, "done", started_at=_iso(t))
    runs.append_events(
        "axes",
        [
            _event("axes", "iteration", t, step="decompose", iteration=i + 1, fit=float(f), fit_change=c, seconds=0.1)
            for i, (f, c) in enumerate(zip(fits, changes))
        ],
    )
    # a CP-APR run: its KKT violation on a log axis, also topped in [0.011, 0.045]
    kkts = sorted(np.geomspace(10 ** float(rng.uniform(-7, -4)), float(rng.uniform(0.011, 0.045)), 6), reverse=True)
    _record(root, "axes-apr", t, "done", started_at=_iso(t))
    runs.append_events(
        "axes-apr",
        [
            _event(
                "axes-apr",
                "iteration",
                t,
                step="decompose",
                iteration=i + 1,
                loglik=-1e5 + 10 * i,
                loglik_change=10.0,
                kkt_violation=float(k),
                fit=0.3,
                seconds=0.2,
            )
            for i, k in enumerate(kkts)
        ],
    )

    # long ids and names, and a failed run whose error is long and has more lines
    long_name = "nightly-interactions-" + "".join(rng.choice(list("abcdefghij"), 19))
    long_ids = [f"{long_name}-2026{int(rng.integers(10**9, 10**10))}-{k:04x}" for k in range(3)]
    error = (
        "StepFailed: decompose: "
        + " ".join(f"word{int(w)}" for w in rng.integers(0, 10**6, int(rng.integers(40, 60))))
        + "\n  Traceback line two\n  line three"
    )
    for k, run_id in enumerate(long_ids):
        tt = NOW - timedelta(minutes=30 + k)
        _record(
            root,
            run_id,
            tt,
            "failed" if k == 0 else "done",
            workflow=long_name,
            started_at=_iso(tt),
            finished_at=_iso(tt + timedelta(seconds=5)),
            error=error if k == 0 else None,
        )

    # queued: one never started, one requeued after its driver's first attempt started
    _record(root, "queued-new", NOW - timedelta(minutes=5), "queued")
    _record(root, "queued-again", NOW - timedelta(minutes=6), "queued", started_at=_iso(NOW - timedelta(minutes=6)))

    # a run whose first attempt was lost with its worker and whose second succeeded, and one whose
    # second attempt failed on its own
    lost_msg = "lost during step 'decompose': the driver (pid 41 on w1) stopped without finishing; attempt 2 resumes"
    for k, (run_id, final, own_error) in enumerate(
        (("recovered", "done", None), ("lost-then-failed", "failed", "ValueError: own"))
    ):
        t0 = NOW - timedelta(minutes=20 + k)
        _record(
            root,
            run_id,
            t0,
            final,
            started_at=_iso(t0),
            finished_at=_iso(t0 + timedelta(minutes=3)),
            error=own_error,
            attempts=[
                Attempt(attempt=1, host="w1", pid=41, started_at=_iso(t0), ended_at=_iso(t0), outcome=lost_msg),
                Attempt(attempt=2, host="w2", pid=42, started_at=_iso(t0), ended_at=_iso(t0), outcome=final),
            ],
            steps={"decompose": StepRecord(kind="decompose", state="done" if final == "done" else "failed")},
        )
        evs = [
            _event(run_id, "run-started", t0, attempt=1),
            _event(run_id, "iteration", t0, step="decompose", iteration=1, fit=0.2, fit_change=0.2),
            _event(run_id, "log", t0, step="decompose", level="error", message="worker w1 lost: connection closed"),
            _event(run_id, "attempt-lost", t0, level="warning", message=lost_msg),
            _event(run_id, "run-started", t0, attempt=2),
            _event(run_id, "iteration", t0, step="decompose", iteration=2, fit=0.4, fit_change=0.2),
        ]
        if own_error:
            evs.append(_event(run_id, "error", t0, step="decompose", level="error", message=f"decompose: {own_error}"))
        evs.append(
            _event(
                run_id,
                "run-finished",
                t0,
                state=final,
                level="error" if own_error else "info",
                message=f"run {run_id} {final}" + (f": {own_error}" if own_error else ""),
            )
        )
        runs.append_events(run_id, evs)

    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        assert attach(client, root)
        yield {
            "base": f"http://127.0.0.1:{cluster.scheduler.http_server.port}/tfooc",
            "root": root,
            "all": sorted(RunStore(root).list(), key=lambda r: (r.created_at, r.run_id), reverse=True),
            "top": top,
            "long_ids": long_ids,
            "error": error,
        }


def _json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("headless Chromium not installed (Debian: apt-get install chromium)")
    with HeadlessPage(WIDTH, 1000) as page:
        yield page


@needs_chromium
def test_log_axes_never_label_zero_or_negative(site, browser):
    """Fit changes (CP-ALS) and KKT violations (CP-APR) that reach a few hundredths: every label of
    their log axes is a positive number, rising from the bottom; fixed decimals wrote "0.0"."""
    for run_id, cls in (("axes", "pt-fit-change"), ("axes-apr", "pt-kkt")):
        browser.open(f"{site['base']}?run={run_id}")
        labels = browser.evaluate(f"[...document.querySelectorAll('.plot-{cls} text.ylab')].map(t => t.textContent)")
        assert len(labels) == 3, labels
        values = [float(v) for v in labels]
        assert all(v > 0 and math.isfinite(v) for v in values), (run_id, labels)
        assert values[0] < values[1] < values[2], (run_id, labels)
    # the CP-ALS axis's top: the largest change, to two significant digits
    browser.open(f"{site['base']}?run=axes")
    top = browser.evaluate("[...document.querySelectorAll('.plot-pt-fit-change text.ylab')].pop().textContent")
    assert float(top) == pytest.approx(site["top"], rel=0.06)


@needs_chromium
def test_runs_table_fits_a_1400px_window(site, browser):
    """Long run ids, long workflow names and a long error: the page is no wider than the window, the
    errors column is on screen and wide, the error's first line is cut there with all of it on
    hover, and a click unfolds it, still inside the window."""
    first = site["long_ids"][0]
    browser.open(f"{site['base']}?run={first}")
    m = browser.evaluate(
        """(() => {
          const table = document.getElementById("runs-table");
          const th = [...table.querySelectorAll("th")].pop();
          const cell = document.querySelector('tr[data-run-id="%s"] td.error-line');
          return {page: document.documentElement.scrollWidth, inner: innerWidth,
                  table: table.getBoundingClientRect().right, th: th.textContent,
                  errLeft: th.getBoundingClientRect().left, errRight: th.getBoundingClientRect().right,
                  title: cell.title, text: cell.textContent, cut: cell.scrollWidth > cell.clientWidth,
                  height: cell.getBoundingClientRect().height};
        })()"""
        % first
    )
    assert m["inner"] == WIDTH and m["page"] <= WIDTH, m
    assert m["th"] == "errors" and m["table"] <= WIDTH and m["errRight"] <= WIDTH, m
    assert m["errRight"] - m["errLeft"] >= 250, m  # the errors column is not squeezed away
    assert m["title"] == site["error"] and m["text"] == site["error"].split("\n")[0] and m["cut"], m
    opened = browser.evaluate(
        """(() => {
          const cell = document.querySelector('tr[data-run-id="%s"] td.error-line');
          cell.click();
          return {text: cell.textContent, height: cell.getBoundingClientRect().height,
                  page: document.documentElement.scrollWidth};
        })()"""
        % first
    )
    assert opened["text"] == site["error"] and opened["height"] > 3 * m["height"], opened
    assert opened["page"] <= WIDTH, opened
    # unfolded it stays, through the next polls
    time.sleep(1.5)
    assert (
        browser.evaluate(f"document.querySelector('tr[data-run-id=\"{first}\"] td.error-line').textContent")
        == (site["error"])
    )
    # the run's own view of it: its step table and errors box inside the window too
    assert browser.evaluate("document.documentElement.scrollWidth") <= WIDTH


@needs_chromium
def test_queued_run_shows_no_start_time(site, browser):
    """A queued run, never started or requeued after a first attempt started: its row says queued
    and gives no start time or duration; its view says since when it waits."""
    for run_id in ("queued-new", "queued-again"):
        browser.open(f"{site['base']}?run={run_id}&limit=200")
        row = browser.evaluate(
            f"""(() => {{
              const tr = document.querySelector('tr[data-run-id="{run_id}"]');
              const cells = [...tr.querySelectorAll("td")].map(td => td.textContent.trim());
              return {{state: tr.querySelector(".state").textContent, started: cells[6], duration: cells[7],
                      head: (document.getElementById("run-start")
                             || document.querySelector("#run .meta")).textContent}};
            }})()"""
        )
        assert row["state"] == "queued" and row["started"] == "" and row["duration"] == "", (run_id, row)
        assert row["head"].startswith("queued since ") and "not started" in row["head"], (run_id, row)


@needs_chromium
def test_runs_table_pages_newest_first(site, browser):
    """More runs than two pages: the JSON API and the page give 25 a page, newest first, with the
    total; the page's buttons go to older and newer pages; bad ?page= and ?limit= are refused."""
    order = [r.run_id for r in site["all"]]
    total, pages = len(order), math.ceil(len(order) / 25)
    status, data = _json(site["base"] + "/runs.json")
    assert status == 200 and [r["run_id"] for r in data["runs"]] == order[:25], data["runs"][:3]
    assert (data["page"], data["limit"], data["total"], data["pages"]) == (1, 25, total, pages)
    status, data = _json(site["base"] + "/runs.json?page=3&limit=10")
    assert [r["run_id"] for r in data["runs"]] == order[20:30] and data["pages"] == math.ceil(total / 10)
    assert _json(site["base"] + f"/runs.json?page={pages + 1}")[1]["runs"] == []
    for bad, name in (("page=0", "page"), ("page=two", "page"), ("limit=0", "limit"), ("limit=100000", "limit")):
        status, data = _json(site["base"] + "/runs.json?" + bad)
        assert status == 400 and f"?{name}=" in data["error"], (bad, data)

    rows = "[...document.querySelectorAll('#runs-table tr.run-row')].map(tr => tr.dataset.runId)"
    browser.open(site["base"])
    browser.wait_for(
        f"JSON.stringify({rows}) === {json.dumps(json.dumps(order[:25], separators=(',', ':')))}",
        what="the first page drawn",
    )
    assert browser.evaluate(rows) == order[:25]
    assert browser.evaluate("document.querySelector('#runs-pages button.newer').disabled") is True
    for page in range(2, pages + 1):
        browser.evaluate("document.querySelector('#runs-pages button.older').click()")
        browser.wait_for(f"document.getElementById('runs-pages').dataset.page === '{page}'")
        assert browser.evaluate(rows) == order[(page - 1) * 25 : page * 25], page
        assert browser.evaluate("new URLSearchParams(location.search).get('page')") == str(page)
    assert browser.evaluate("document.querySelector('#runs-pages button.older').disabled") is True
    assert browser.evaluate("document.getElementById('runs-pages').dataset.total") == str(total)
    browser.evaluate("document.querySelector('#runs-pages button.newer').click()")
    browser.wait_for(f"document.getElementById('runs-pages').dataset.page === '{pages - 1}'")
    # a page's address opens that page (its rows are drawn once runs.json answers)
    browser.open(f"{site['base']}?page=2&limit=10")
    want = json.dumps(order[10:20], separators=(",", ":"))
    browser.wait_for(f"JSON.stringify({rows}) === {json.dumps(want)}", what="page 2 of 10 runs drawn")
    assert browser.evaluate(rows) == order[10:20]


@needs_chromium
def test_earlier_attempts_are_a_note_when_the_run_succeeded(site, browser):
    """A run whose first attempt was lost with its worker and whose second succeeded: no red errors
    box and no error in its row, the lost attempt in a grey "earlier attempts" note; a run whose
    second attempt failed has its own error in red and the lost attempt apart."""
    status, view = _json(site["base"] + "/runs/recovered.json")
    assert status == 200 and view["errors"] == [] and view["attempt"] == 2
    assert [e["attempt"] for e in view["earlier_attempts"]] == [1, 1]
    assert "lost during step" in view["earlier_attempts"][-1]["message"]

    browser.open(f"{site['base']}?run=recovered&limit=200")
    m = browser.evaluate(
        """(() => {
          const note = document.getElementById("earlier-attempts");
          const row = document.querySelector('tr[data-run-id="recovered"]');
          return {red: document.querySelectorAll("#run .errors").length, note: note && note.textContent,
                  bg: note && getComputedStyle(note).backgroundColor,
                  rowError: row.querySelectorAll("td.error-line").length,
                  rowNote: row.querySelector("td.earlier") && row.querySelector("td.earlier").textContent};
        })()"""
    )
    assert m["red"] == 0 and m["rowError"] == 0, m
    assert "earlier attempts" in m["note"] and "lost during step 'decompose'" in m["note"], m
    r, g, b = (int(v) for v in m["bg"][m["bg"].index("(") + 1 : -1].split(",")[:3])
    assert max(r, g, b) - min(r, g, b) < 12, m  # grey, not the errors box's red
    assert "earlier attempts" in m["rowNote"], m

    browser.open(f"{site['base']}?run=lost-then-failed&limit=200")
    m = browser.evaluate(
        """(() => ({red: document.querySelector("#run .errors").textContent,
                    note: document.getElementById("earlier-attempts").textContent}))()"""
    )
    assert "ValueError: own" in m["red"] and "lost during step" not in m["red"], m
    assert "lost during step" in m["note"], m
