"""Run records: one folder per run under ``ROOT/.tfooc/runs/RUN_ID/``, written through fsspec.

- ``record.json``: the run (:class:`RunRecord`), rewritten atomically on every change;
- ``events.jsonl``: one JSON object per line (run and step transitions, CP-ALS iterations, log
  lines, errors with tracebacks), appended as they happen;
- ``spec.yaml``: the spec text the run was started with;
- ``cancel``: present when ``tfooc cancel`` asked the run to stop.

The files outlive the process and the cluster that ran the run, so ``tfooc status`` and
``tfooc logs`` read them after a scheduler restart, for a local storage root and an fsspec URL
alike. A running run refreshes ``heartbeat_at`` every few seconds: a ``running`` record whose
heartbeat is older than ``stale_after()`` belongs to a driver that died (shown as ``lost``).
The format is documented in ``workflows/README.md`` for monitoring pages.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from . import locations as loc
from .errors import RunNotFound
from .secret_values import Mask

log = logging.getLogger("tensorflow_ooc.workflow")

RECORD_VERSION = 1
RUN_STATES = ("queued", "running", "done", "failed", "cancelled", "skipped")
FINAL_STATES = ("done", "failed", "cancelled", "skipped")
STEP_STATES = ("pending", "running", "done", "skipped", "failed", "cancelled", "not run")
EXIT_CODES = {"done": 0, "failed": 1, "cancelled": 1, "skipped": 3}
DASK_TOPIC = "tfooc"


def now_iso() -> str:
    """UTC time with milliseconds, ISO 8601 (``2026-01-31T04:05:06.789Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str | None) -> float | None:
    """Epoch seconds of a time written by :func:`now_iso` (None stays None)."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def heartbeat_seconds() -> float:
    """How often a running driver refreshes its record (``$TFOOC_HEARTBEAT_S``, default 5)."""
    return float(os.environ.get("TFOOC_HEARTBEAT_S", "5"))


def stale_after() -> float:
    """Seconds without a heartbeat after which a running record counts as lost
    (``$TFOOC_STALE_AFTER_S``, default 60)."""
    return float(os.environ.get("TFOOC_STALE_AFTER_S", "60"))


class StepRecord(BaseModel):
    """One step of a run."""

    model_config = ConfigDict(extra="allow")
    kind: str
    state: Literal[STEP_STATES] = "pending"  # type: ignore[valid-type]
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float | None = None
    fingerprint: str | None = None
    inputs: dict[str, str] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)
    message: str | None = None  # why skipped, what was done
    error: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)  # fit, iterations, fms, nnz, ...
    progress: dict[str, Any] = Field(default_factory=dict)  # the latest CP-ALS iteration
    attempt: int | None = None
    # each try of a step with retries in this attempt: try, started_at, finished_at, seconds, error, retry_in
    tries: list[dict[str, Any]] = Field(default_factory=list)


class Attempt(BaseModel):
    """One execution of the driver (a Dask retry after a lost worker is a new attempt)."""

    model_config = ConfigDict(extra="allow")
    attempt: int
    host: str
    pid: int
    worker: str | None = None
    started_at: str
    ended_at: str | None = None
    outcome: str | None = None


class RunRecord(BaseModel):
    """A workflow run, as stored in ``record.json``."""

    model_config = ConfigDict(extra="allow")  # monitoring may add fields; old readers keep working
    format: Literal["tfooc-run"] = "tfooc-run"
    version: int = RECORD_VERSION
    run_id: str
    workflow: str
    spec_path: str
    spec_sha256: str
    storage: str
    cluster: str
    mode: Literal["foreground", "submitted"]
    scheduler: str | None = None
    dashboard: str | None = None
    user: str
    host: str
    created_at: str
    state: Literal[RUN_STATES] = "queued"  # type: ignore[valid-type]
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    heartbeat_at: str | None = None
    current_step: str | None = None
    steps: dict[str, StepRecord] = Field(default_factory=dict)
    attempts: list[Attempt] = Field(default_factory=list)
    error: str | None = None
    cancel_requested_at: str | None = None
    took_over: list[str] = Field(default_factory=list)
    run_date: str | None = None  # ${RUN_DATE}: the night the run is for
    # why a submitted run that had started waits again (its worker was lost): shown ``retrying``
    requeued: str | None = None
    # each webhook told of the run: event, url (secrets masked), status or error, seconds
    notifications: list[dict[str, Any]] = Field(default_factory=list)

    def display_state(self, now: float | None = None) -> str:
        """The state, with ``lost`` for a running record whose driver stopped heartbeating, and
        ``retrying`` for a queued one whose driver had started before (its worker was lost)."""
        if self.state == "queued" and (self.attempts or self.requeued):
            return "retrying"
        if self.state == "running":
            beat = parse_iso(self.heartbeat_at)
            if beat is not None and (now or time.time()) - beat > stale_after():
                return "lost"
        return self.state

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


# the second of an id made by new_run_id: NAME-YYYYmmdd-HHMMSS-xxxx
_ID_SECOND = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")


def new_run_id(workflow: str) -> str:
    """``NAME-YYYYmmdd-HHMMSS-xxxx``: sortable by time, unique by the random tail."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", workflow)[:40] or "run"
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def whoami() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (containers)
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


class RunStore:
    """The run records under a storage root."""

    def __init__(self, root: str) -> None:
        self.root = loc.normalize(root)
        self.dir = loc.join(self.root, ".tfooc/runs")

    def run_dir(self, run_id: str) -> str:
        return loc.join(self.dir, run_id)

    def _file(self, run_id: str, name: str) -> str:
        return loc.join(self.run_dir(run_id), name)

    def exists(self, run_id: str) -> bool:
        return loc.exists(self._file(run_id, "record.json"))

    def write(self, record: RunRecord, mask: Mask | None = None) -> None:
        """Write ``record`` (atomically), its strings through ``mask`` (no secret value on disk)."""
        if mask:
            text = json.dumps(mask.apply(record.model_dump(mode="json")), indent=1)
        else:
            text = record.model_dump_json(indent=1)
        loc.write_text(self._file(record.run_id, "record.json"), text)

    def write_spec(self, run_id: str, text: str) -> None:
        loc.write_text(self._file(run_id, "spec.yaml"), text)

    def read_spec(self, run_id: str) -> str:
        return loc.read_text(self._file(run_id, "spec.yaml"))

    def resolve(self, run_id: str) -> str:
        """A full run id from an id or a unique prefix of one."""
        if self.exists(run_id):
            return run_id
        ids = [i for i in loc.listdir(self.dir) if i.startswith(run_id)]
        if len(ids) == 1:
            return ids[0]
        if not ids:
            recent = loc.listdir(self.dir)[-3:]
            hint = f" (recent: {', '.join(recent)})" if recent else " (no runs recorded there yet)"
            raise RunNotFound(f"no run {run_id!r} under {self.root}{hint}")
        raise RunNotFound(f"{run_id!r} matches {len(ids)} runs under {self.root}: {', '.join(ids[:5])}")

    def read(self, run_id: str) -> RunRecord:
        run_id = self.resolve(run_id)
        return RunRecord.model_validate_json(loc.read_text(self._file(run_id, "record.json")))

    def list(self, limit: int | None = None) -> list[RunRecord]:
        """Records, newest first: by creation time, then by id, so that runs created in the same
        millisecond keep one order and every page of a listing is a slice of the same list.

        With ``limit`` only the newest are read: ids of :func:`new_run_id` carry their second, so
        the newest of those are read with a margin (ids resolve seconds only); an id of any other
        form (a run id given to ``execute``) is always read, its time being in its record only."""
        ids = loc.listdir(self.dir)
        if limit is not None:
            timed = sorted(((m.group(1), i) for i in ids if (m := _ID_SECOND.search(i))), reverse=True)
            ids = [i for _, i in timed[: limit * 4 + 16]] + [i for i in ids if not _ID_SECOND.search(i)]
        out = []
        for run_id in ids:
            try:
                out.append(self.read(run_id))
            except Exception:  # a record being created right now, or foreign files
                continue
        out.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return out if limit is None else out[:limit]

    def append_events(self, run_id: str, events: list[dict], mask: Mask | None = None) -> None:
        if mask:
            events = [mask.apply(e) for e in events]
        loc.append_text(self._file(run_id, "events.jsonl"), "".join(json.dumps(e, default=str) + "\n" for e in events))

    def events(self, run_id: str) -> list[dict]:
        path = self._file(self.resolve(run_id), "events.jsonl")
        if not loc.exists(path):
            return []
        out = []
        for line in loc.read_text(path).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being appended while we read
                continue
        return out

    def request_cancel(self, run_id: str, by: str) -> None:
        loc.write_text(self._file(run_id, "cancel"), json.dumps({"requested_at": now_iso(), "by": by}))

    def cancel_requested(self, run_id: str) -> bool:
        return loc.exists(self._file(run_id, "cancel"))


class Recorder:
    """Keeps one run's record and events up to date while the run goes (thread safe).

    Every event goes to ``events.jsonl``, to the ``tensorflow_ooc.workflow`` logger, and, when the
    run has a Dask client, to the scheduler's event log under topic ``"tfooc"``
    (``Client.log_event``), where a dashboard page or ``Client.subscribe_topic`` can follow it.
    """

    def __init__(self, runs: RunStore, record: RunRecord, client: Any = None, mask: Mask | None = None) -> None:
        self.runs = runs
        self.record = record
        self.client = client
        self.mask = mask or Mask()  # the run's secret values: masked in every file and event
        self.cancel_event = threading.Event()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # --- record --------------------------------------------------------------------------------
    def save(self) -> None:
        with self._lock:
            self.record.heartbeat_at = now_iso()
            self.runs.write(self.record, self.mask)

    def update(self, **fields: Any) -> None:
        with self._lock:
            for k, v in fields.items():
                setattr(self.record, k, v)
            self.save()

    def step(self, name: str, save: bool = True, **fields: Any) -> StepRecord:
        with self._lock:
            st = self.record.steps[name]
            for k, v in fields.items():
                setattr(st, k, v)
            if save:
                self.save()
            return st

    # --- events --------------------------------------------------------------------------------
    def event(
        self,
        event_type: str,
        message: str = "",
        *,
        step: str | None = None,
        level: str = "info",
        echo: bool = True,
        **fields: Any,
    ) -> dict:
        ev = {
            "time": now_iso(),
            "t": round(time.time(), 3),
            "run_id": self.record.run_id,
            "event": event_type,
            "step": step,
            "level": level,
            "message": message,
            **fields,
        }
        ev = self.mask.apply(ev)
        try:
            self.runs.append_events(self.record.run_id, [ev])
        except Exception as exc:  # the run goes on; the record still has the state
            log.warning("could not append to the run's events: %s", exc)
        if self.client is not None and hasattr(self.client, "log_event"):
            try:
                # with the storage root, where the monitoring page finds the run's record
                self.client.log_event(DASK_TOPIC, {**ev, "storage": self.record.storage})
            except Exception:  # a closing or inline client: events stay in the file
                pass
        if echo and message:
            log.log(
                logging.ERROR if level == "error" else logging.WARNING if level == "warning" else logging.INFO,
                "%s%s",
                f"[{step}] " if step else "",
                ev["message"],
            )
        return ev

    # --- heartbeat and cancellation -----------------------------------------------------------
    def check_cancel(self) -> None:
        """Raise :class:`RunCancelled` when ``tfooc cancel`` asked this run to stop."""
        from .errors import RunCancelled

        if self.cancel_event.is_set() or self.runs.cancel_requested(self.record.run_id):
            self.cancel_event.set()
            with self._lock:
                self.record.cancel_requested_at = self.record.cancel_requested_at or now_iso()
            raise RunCancelled(f"run {self.record.run_id} was cancelled (tfooc cancel)")

    def start_heartbeat(self, interval: float | None = None) -> None:
        interval = heartbeat_seconds() if interval is None else interval

        def beat() -> None:
            while not self._stop.wait(interval):
                try:
                    if self.runs.cancel_requested(self.record.run_id):
                        self.cancel_event.set()
                    self.save()
                except Exception as exc:  # keep beating; a flaky store must not end the run
                    log.debug("heartbeat failed: %s", exc)

        self._beat = threading.Thread(target=beat, name=f"tfooc-heartbeat-{self.record.run_id}", daemon=True)
        self._beat.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=10)


#: attributes of library log records copied into their ``log`` events
LOG_FIELDS = ("memory_plan",)


class EventLogHandler(logging.Handler):
    """Copies the library's log lines emitted by the driver thread into the run's events, so
    ``tfooc logs`` shows what CP-ALS and the converter said (memory plan, dashboard link, ...)."""

    def __init__(self, recorder: Recorder, thread_id: int) -> None:
        super().__init__(logging.INFO)
        self.recorder = recorder
        self.thread_id = thread_id
        self.step: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread_id or record.name.startswith("tensorflow_ooc.workflow"):
            return
        if getattr(record, "iteration", None) is not None and record.levelno < logging.WARNING:
            # a decomposition's per-iteration line: the step records the iteration itself, as an
            # ``iteration`` event with every figure; copying the line too showed each one twice
            return
        # structured figures a line carries (the worker memory plan's, for the monitoring page)
        extra = {k: getattr(record, k) for k in LOG_FIELDS if getattr(record, k, None) is not None}
        try:
            self.recorder.event(
                "log",
                record.getMessage(),
                step=self.step,
                level=record.levelname.lower(),
                echo=False,
                logger=record.name,
                **extra,
            )
        except Exception:
            pass


def host_info() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "user": whoami()}
