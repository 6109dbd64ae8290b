"""What the monitoring page and the metrics show: runs as views built from run events.

A view is built by replaying a run's events (the dictionaries the workflow recorder writes to
``events.jsonl`` and sends to the Dask scheduler under topic ``"tfooc"``; format in
``workflows/README.md``), then corrected by the run's ``record.json`` when the storage root can be
read (the record is the authority on the state: a driver that stopped heartbeating shows ``lost``).

:class:`RunsState` keeps the views of the runs whose events reached this scheduler, and lists the
past runs recorded under the storage roots it knows. Nothing here talks to Dask: the scheduler
plugin (:mod:`.plugin`) feeds it, the HTTP handlers (:mod:`.http`) and the Prometheus collector
(:mod:`.metrics`) read it.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

log = logging.getLogger(__name__)

# per-iteration fields of an ``iteration`` event that the page plots
ITERATION_FIELDS = (
    "iteration",
    "fit",
    "fit_change",
    # a CP-APR (Poisson) run's outer iteration: its log-likelihood, the change, the KKT violation
    # (the page plots these instead of the fit; its ``fit`` is the least-squares one, for comparison)
    "loglik",
    "loglik_change",
    "kkt_violation",
    "inner_iterations",
    "seconds",
    "mode_seconds",
    "mttkrp_seconds",
    "update_seconds",
    "other_seconds",
    "nnz_per_s",
    "bytes_read",
    # owner-computes runs on several workers: bytes sent between workers and their lower bound
    "workers",
    "bytes_sent",
    "bytes_lower_bound",
    "exchange_seconds",
    "checkpoint_seconds",
    "max_iters",
    "t",
)
# what the per-run counters add up over iteration events: iterations, then summed fields
COUNTERS = ("iterations", "bytes_read", "bytes_sent", "bytes_lower_bound")
RUN_STATES = ("queued", "retrying", "running", "done", "failed", "cancelled", "skipped", "lost")
MAX_LIVE_RUNS = 200  # views kept in memory per scheduler (oldest finished ones dropped first)
MAX_ERRORS = 50
MAX_CHECKPOINTS = 50


def new_view(run_id: str) -> dict[str, Any]:
    """An empty run view."""
    return {
        "run_id": run_id,
        "workflow": None,
        "storage": None,
        "state": "queued",
        "mode": None,
        "cluster": None,
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "current_step": None,
        "error": None,
        "exit_code": None,
        "dashboard": None,
        "steps": {},
        "iterations": {},
        "checkpoints": [],
        "checkpoint_count": {},
        # per step, what the run did in all (every attempt): Prometheus counters, which never go
        # back when a retried driver repeats the iterations after its checkpoint
        "counters": {},
        "memory_plans": {},  # per step, the latest worker memory plan (its figures)
        "errors": [],
        # the driver's attempt the events belong to (a restarted driver after a lost worker is
        # attempt 2, ...); errors carry theirs, so that a run that finally succeeded shows the
        # earlier attempts' errors as a note, not as its own
        "attempt": 1,
        "last_event": None,
        "events": 0,
        "source": "events",
    }


def apply_event(view: dict[str, Any], ev: dict[str, Any]) -> None:
    """Fold one run event into ``view`` (in place)."""
    kind = ev.get("event")
    step = ev.get("step")
    view["events"] += 1
    view["last_event"] = ev.get("time") or view["last_event"]
    if ev.get("storage") and not view["storage"]:
        view["storage"] = ev["storage"]
    if kind == "log" and step and isinstance(ev.get("memory_plan"), dict):
        view["memory_plans"][step] = ev["memory_plan"]
    if kind == "submitted":
        view["created_at"] = view["created_at"] or ev.get("time")
    elif kind == "run-started":
        view["attempt"] = ev.get("attempt") or view["attempt"]
        view["state"] = "running"
        view["started_at"] = view["started_at"] or ev.get("time")
        view["finished_at"] = None
        view["mode"] = ev.get("mode", view["mode"])
        view["cluster"] = ev.get("cluster", view["cluster"])
    elif kind == "cluster":
        msg = ev.get("message") or ""
        if "dashboard " in msg:
            view["dashboard"] = msg.rsplit("dashboard ", 1)[-1]
    elif kind == "step-started" and step:
        st = view["steps"].setdefault(step, {"kind": ev.get("kind"), "state": "pending"})
        st.update(kind=ev.get("kind", st.get("kind")), state="running", started_at=ev.get("time"), seconds=None)
        view["current_step"] = step
        view["state"] = "running"
    elif kind == "step-skipped" and step:
        view["steps"].setdefault(step, {"kind": None}).update(state="skipped")
    elif kind == "step-finished" and step:
        st = view["steps"].setdefault(step, {"kind": None})
        st.update(state="done", seconds=ev.get("seconds"), finished_at=ev.get("time"), metrics=ev.get("metrics") or {})
        view["current_step"] = None
    elif kind == "iteration" and step:
        it = {k: ev[k] for k in ITERATION_FIELDS if k in ev}
        it.setdefault("time", ev.get("time"))
        its = view["iterations"].setdefault(step, [])
        # a retried driver repeats the iterations after its checkpoint: the latest wins
        while its and its[-1].get("iteration", 0) >= it.get("iteration", 0):
            its.pop()
        its.append(it)
        done = view["counters"].setdefault(step, dict.fromkeys(COUNTERS, 0))
        done["iterations"] += 1
        for name in COUNTERS[1:]:
            done[name] += ev.get(name) or 0
        view["steps"].setdefault(step, {"kind": "decompose", "state": "running"})
        if ev.get("checkpoint_seconds") is not None:
            view["checkpoints"].append(
                {
                    "step": step,
                    "iteration": it.get("iteration"),
                    "time": ev.get("time"),
                    "seconds": ev["checkpoint_seconds"],
                }
            )
            del view["checkpoints"][:-MAX_CHECKPOINTS]  # the latest; all are counted
            view["checkpoint_count"][step] = view["checkpoint_count"].get(step, 0) + 1
    elif kind in ("error", "attempt-lost") or (kind == "log" and ev.get("level") == "error"):
        view["errors"].append(
            {
                "time": ev.get("time"),
                "step": step,
                "message": ev.get("message"),
                "traceback": ev.get("traceback"),
                "level": ev.get("level"),
                "attempt": view["attempt"],
            }
        )
        del view["errors"][:-MAX_ERRORS]
        if kind == "error" and step:
            view["steps"].setdefault(step, {"kind": None}).update(state="failed", error=ev.get("message"))
    elif kind == "cancelled":
        view["state"] = "cancelled"
    elif kind == "run-finished":
        view["state"] = ev.get("state") or view["state"]
        view["exit_code"] = ev.get("exit_code")
        view["finished_at"] = ev.get("time")
        view["current_step"] = None
        if ev.get("level") == "error" and ev.get("state") == "failed":
            view["error"] = ev.get("message")
        elif ev.get("state") == "cancelled" and ": " in (ev.get("message") or ""):
            view["error"] = ev["message"].split(": ", 1)[1]  # "run ID cancelled: why"


def view_from_events(run_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    view = new_view(run_id)
    for ev in events:
        apply_event(view, ev)
    return view


def split_attempts(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with its errors split by attempt (a copy; the live view keeps them all).

    ``errors``: those of the run's latest attempt, its own; ``earlier_attempts``: those of the
    attempts before it (a driver lost with its worker, then restarted), which a run that finally
    succeeded shows as a note rather than as its error."""
    latest = view.get("attempt") or 1
    errors = view.get("errors") or []
    return view | {
        "errors": [e for e in errors if (e.get("attempt") or latest) >= latest],
        "earlier_attempts": [e for e in errors if (e.get("attempt") or latest) < latest],
    }


def merge_record(view: dict[str, Any], record: Any) -> dict[str, Any]:
    """Take the run's state, times, steps and error from its record (a ``RunRecord``)."""
    view.update(
        workflow=record.workflow,
        storage=record.storage,
        state=record.display_state(),
        mode=record.mode,
        cluster=record.cluster,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        current_step=record.current_step,
        error=record.error,
        exit_code=record.exit_code,
        dashboard=record.dashboard or view.get("dashboard"),
        attempt=max(view.get("attempt") or 1, len(record.attempts)),
        source="record",
    )
    for name, st in record.steps.items():
        mine = view["steps"].setdefault(name, {})
        mine.update(
            kind=st.kind,
            state=st.state,
            seconds=st.seconds,
            started_at=st.started_at,
            finished_at=st.finished_at,
            metrics=st.metrics,
            error=st.error,
            message=st.message,
            progress=st.progress,
            outputs=st.outputs,
        )
    return view


def summary(view: dict[str, Any]) -> dict[str, Any]:
    """One row of the runs table: the view without its per-iteration series. A CP-APR run's row
    also has ``loglik`` (its log-likelihood; ``fit`` is then the least-squares fit)."""
    fit = loglik = None
    iterations = 0
    split = split_attempts(view)
    for its in view["iterations"].values():
        if its:
            fit, loglik, iterations = its[-1].get("fit"), its[-1].get("loglik"), its[-1].get("iteration", len(its))
    for st in view["steps"].values():
        m = st.get("metrics") or {}
        if st.get("kind") == "decompose" and m.get("fit") is not None and not iterations:
            fit, loglik, iterations = m["fit"], m.get("loglik"), m.get("iterations", 0)
        p = st.get("progress") or {}
        if p.get("iteration") and p["iteration"] > iterations:
            fit, loglik, iterations = p.get("fit"), p.get("loglik"), p["iteration"]
    row = {
        k: view.get(k)
        for k in (
            "run_id",
            "workflow",
            "storage",
            "state",
            "mode",
            "cluster",
            "created_at",
            "started_at",
            "finished_at",
            "current_step",
            "error",
            "exit_code",
        )
    } | {
        "fit": fit,
        "iterations": iterations,
        "attempts": view.get("attempt") or 1,
        "errors": len(split["errors"]),
        "earlier_attempt_errors": len(split["earlier_attempts"]),
        "steps": {n: st.get("state") for n, st in view["steps"].items()},
    }
    if loglik is not None:  # a CP-APR run
        row["loglik"] = loglik
    return row


class RunsState:
    """Run views of one scheduler (thread safe): live ones from events, past ones from records.

    Parameters
    ----------
    storage : list of str
        Storage roots whose run records are listed (more are learnt from events, which carry
        their run's root).
    """

    def __init__(self, storage: list[str] | None = None) -> None:
        self.roots: list[str] = []
        self.live: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._counts: tuple[float, dict[str, int]] | None = None
        self._lock = threading.RLock()
        for root in storage or []:
            self.add_root(root)

    def add_root(self, root: str | None) -> None:
        if not root:
            return
        from ..workflow import locations as loc

        root = loc.normalize(root)
        with self._lock:
            if root not in self.roots:
                self.roots.append(root)

    # --- live events -------------------------------------------------------------------------------
    def apply(self, ev: dict[str, Any]) -> None:
        """Fold one event (a ``tfooc`` topic message) into its run's view."""
        run_id = ev.get("run_id") if isinstance(ev, dict) else None
        if not run_id:
            return
        with self._lock:
            view = self.live.get(run_id)
            if view is None:
                view = self.live[run_id] = new_view(run_id)
                self._evict()
            apply_event(view, ev)
            if ev.get("event") in ("submitted", "run-started", "cancelled", "run-finished"):
                self._counts = None  # a run changed state: count again at the next scrape
            if ev.get("storage"):
                self.add_root(ev["storage"])

    def _evict(self) -> None:
        while len(self.live) > MAX_LIVE_RUNS:
            done = next((k for k, v in self.live.items() if v["state"] not in ("queued", "retrying", "running")), None)
            self.live.pop(done if done is not None else next(iter(self.live)))

    # --- reading -----------------------------------------------------------------------------------
    def _records(self, limit: int) -> list[Any]:
        from ..workflow.records import RunStore

        out = []
        for root in list(self.roots):
            try:
                out.extend(RunStore(root).list(limit=limit))
            except Exception as exc:  # a root the scheduler cannot read: live events still show
                log.debug("cannot list runs under %s: %s", root, exc)
        return out

    def runs(self, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """Summaries of runs, newest first (by submission time): ``limit`` of them after the
        ``offset`` newest (a page of the runs table)."""
        rows: dict[str, dict[str, Any]] = {}
        for rec in self._records(offset + limit):
            rows[rec.run_id] = summary(merge_record(new_view(rec.run_id), rec))
        with self._lock:
            live = [(k, summary(v)) for k, v in self.live.items()]
        for run_id, row in live:
            if run_id in rows:
                # the record has the state; live events may be ahead on iterations
                if row["iterations"] > (rows[run_id]["iterations"] or 0):
                    rows[run_id].update(fit=row["fit"], iterations=row["iterations"])
                    if "loglik" in row:
                        rows[run_id]["loglik"] = row["loglik"]
            else:
                rows[run_id] = row
        order = sorted(
            rows.values(), key=lambda r: (r.get("created_at") or r.get("started_at") or "", r["run_id"]), reverse=True
        )
        return order[offset : offset + limit]

    def total(self) -> int:
        """How many runs there are: those recorded under the storage roots, and the live ones
        without a record there (names of folders only: no record is read)."""
        from ..workflow import locations as loc
        from ..workflow.records import RunStore

        ids: set[str] = set()
        for root in list(self.roots):
            try:
                ids.update(loc.listdir(RunStore(root).dir))
            except Exception as exc:  # a root the scheduler cannot read, as in _records
                log.debug("cannot list runs under %s: %s", root, exc)
        with self._lock:
            ids.update(self.live)
        return len(ids)

    def active(self) -> list[dict[str, Any]]:
        """Summaries of the runs this scheduler follows that are queued or running (for the queue,
        whichever page of the runs table is shown)."""
        with self._lock:
            return [summary(v) for v in self.live.values() if v["state"] in ("queued", "running", "retrying")]

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The full view of one run: from its events file and record when its storage root can be
        read here, else from the events this scheduler received."""
        from ..workflow.records import RunStore

        with self._lock:  # a copy: events keep arriving on the scheduler's loop meanwhile
            live = copy.deepcopy(self.live.get(run_id))
        roots = ([live["storage"]] if live and live.get("storage") else []) + list(self.roots)
        for root in roots:
            try:
                runs = RunStore(root)
                if not runs.exists(run_id):
                    continue
                view = view_from_events(run_id, runs.events(run_id))
                view = merge_record(view, runs.read(run_id))
                view["storage"] = root
                if live and sum(map(len, live["iterations"].values())) > sum(map(len, view["iterations"].values())):
                    view["iterations"] = live["iterations"]
                return split_attempts(view)
            except Exception as exc:  # unreadable here: fall back to the live view
                log.debug("cannot read run %s under %s: %s", run_id, root, exc)
        return None if live is None else split_attempts(live)

    def counts(self, max_age: float = 2.0) -> dict[str, int]:
        """Runs per state (``tfooc_runs{state=...}``); the records are read at most every
        ``max_age`` seconds (scrapes run on the scheduler's event loop)."""
        cached = self._counts
        if cached is not None and time.monotonic() - cached[0] < max_age:
            return dict(cached[1])
        out = dict.fromkeys(RUN_STATES, 0)
        for row in self.runs(limit=1000):
            out[row["state"]] = out.get(row["state"], 0) + 1
        self._counts = (time.monotonic(), out)
        return dict(out)

    def live_views(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(list(self.live.values()))
