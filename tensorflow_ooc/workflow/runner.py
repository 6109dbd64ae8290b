"""Running a workflow: steps in dependency order, skipped when up to date, resumed after a crash.

:func:`execute` is the driver. It runs in the foreground (``tfooc run``) or as a Dask task on the
cluster (``tfooc submit``, see :mod:`tensorflow_ooc.workflow.submit`), and does the same in both:

1. create the run record (or continue it: a Dask retry of a driver whose worker died is a new
   *attempt* of the same run, and the record says the previous attempt was lost and where);
2. lock every output of the spec (:mod:`~tensorflow_ooc.workflow.lock`): a second run writing the
   same outputs fails at once, before any step;
3. per step: fingerprint the inputs and settings; skip the step when all its outputs carry that
   fingerprint (:mod:`~tensorflow_ooc.workflow.fingerprint`), else run it
   (:mod:`~tensorflow_ooc.workflow.steps`) and record the outputs' fingerprints;
4. the record ends ``done`` (exit 0), ``failed`` (1), ``cancelled`` (1) or ``skipped`` (3: every
   step was up to date, or ran and found nothing new, as an append whose files were all ingested).

A failed or killed run resumes where it stopped: finished steps are up to date and skipped, and
CP-ALS continues from its checkpoint (kept per step fingerprint under ``ROOT/.tfooc/checkpoints``).
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import socket
import subprocess
import threading
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..errors import DiskFullError
from .errors import InputError, LockError, Problem, RunCancelled, SpecError, StepFailed
from .fingerprint import OutputIndex, location_fingerprint, step_fingerprint
from .lock import OutputLocks
from .notifications import notify
from .plan import Workflow
from .records import (
    EXIT_CODES,
    Attempt,
    EventLogHandler,
    Recorder,
    RunRecord,
    RunStore,
    StepRecord,
    host_info,
    new_run_id,
    now_iso,
    parse_iso,
)
from .sandbox import confined, real_location
from .secret_values import masked_logs
from .step_context import StepContext
from .steps import run_step

log = logging.getLogger("tensorflow_ooc.workflow")

EXIT_BAD_SPEC = 2
CLUSTER_CONNECT_TIMEOUT = 5.0  # seconds to reach a scheduler address before the run starts


def _tcp_target(address: str) -> tuple[str, int] | None:
    """(host, port) of a scheduler address reached over TCP (``tcp://``, ``tls://``, ``ws://``,
    ``wss://`` or ``host:port``); None for ``embedded``, ``gpu``, ``inline`` and the others."""
    if address in ("embedded", "gpu", "inline", "auto"):
        return None
    if "://" not in address:
        address = "tcp://" + address
    proto, rest = address.split("://", 1)
    if proto not in ("tcp", "tls", "ws", "wss"):
        return None
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):  # [IPv6]:port
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    try:
        return host, int(port) if port else 8786
    except ValueError:
        return None


def check_cluster(workflow: Workflow, cluster: str | None = None, timeout: float = CLUSTER_CONNECT_TIMEOUT) -> None:
    """Refuse a run whose scheduler address cannot be reached, before anything runs.

    A decompose step of a small tensor runs in the driver and never contacts the cluster, so an
    address nobody answers at would otherwise pass unnoticed. ``cluster`` is the command line's
    override (``--scheduler``), else the spec's ``cluster`` is checked.

    Raises
    ------
    SpecError
        Naming the address and the field (``cluster`` with its line, or ``--scheduler``).
    """
    address = cluster or workflow.spec.cluster
    target = _tcp_target(address)
    if target is None:
        return
    try:
        # a plain TCP connect (the scheduler logs, at INFO, a connection closed before its handshake)
        socket.create_connection(target, timeout=timeout).close()
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        message = (
            f"the Dask scheduler at {address} cannot be reached ({why}; tried {target[0]}:{target[1]} "
            f"for at most {timeout:g} s): start it or fix the address, or use 'embedded' to run in this "
            "process; nothing was started"
        )
        if cluster:
            problem = Problem(None, "--scheduler", message)
        else:
            problem = Problem(workflow.source.line(("cluster",)), "cluster", message)
        raise SpecError(workflow.path, [problem]) from None


@dataclass
class RunOutcome:
    """How a run ended."""

    run_id: str
    state: str
    exit_code: int
    record: RunRecord


class ClusterHandle:
    """The run's Dask client, made on first use: decompose steps of small tensors run inline in
    the driver and never start a cluster.

    ``cluster`` is the spec's (or the command line's) choice: ``embedded`` (an in-process
    LocalCluster, dashboard link logged), ``gpu`` (a LocalCUDACluster when GPUs and dask-cuda are
    there), or a scheduler address. A driver running on a cluster passes its own client.
    """

    def __init__(self, cluster: str, client: Any = None, on_client: Any = None) -> None:
        self.cluster = cluster
        self._client = client
        self._stack = ExitStack()
        self._on_client = on_client

    @property
    def default_device(self) -> str:
        return "gpu" if self.cluster == "gpu" else "auto"

    def client_for(self, device: str) -> Any:
        if self._client is None:
            from ..execution import get_client

            scheduler = self.cluster if "://" in self.cluster else "embedded"
            self._client = self._stack.enter_context(get_client(None, scheduler, device=device))
            if self._on_client is not None:
                self._on_client(self._client)
        return self._client

    @property
    def dashboard(self) -> str | None:
        try:
            return None if self._client is None else self._client.dashboard_link
        except Exception:
            return None

    def close(self) -> None:
        self._stack.close()


def new_record(workflow: Workflow, run_id: str, mode: str, cluster: str, scheduler: str | None = None) -> RunRecord:
    """A fresh record (state ``queued``) for a run of ``workflow``."""
    h = host_info()
    steps = {s.name: StepRecord(kind=s.kind, inputs=s.inputs, outputs=s.outputs) for s in workflow.steps}
    return RunRecord(
        run_id=run_id,
        workflow=workflow.name,
        spec_path=workflow.path,
        spec_sha256=workflow.sha256,
        storage=workflow.root,
        cluster=cluster,
        mode=mode,
        scheduler=scheduler,
        user=h["user"],
        host=h["host"],
        created_at=now_iso(),
        steps=steps,
        run_date=workflow.source.run_date,
    )


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:  # not on a worker
        return None


def _mark_lost(runs: RunStore, run_id: str, reason: str, by: str) -> None:
    """Close the record of a run whose driver died, saying so."""
    try:
        rec = runs.read(run_id)
    except Exception:
        return
    if rec.final:
        return
    rec.state, rec.exit_code, rec.finished_at = "failed", EXIT_CODES["failed"], now_iso()
    rec.error = f"lost: {reason}; run {by} took over its outputs (rerunning the spec resumes the work)"
    for a in rec.attempts:
        if a.ended_at is None:
            a.ended_at, a.outcome = now_iso(), "lost: the driver stopped without finishing"
    for st in rec.steps.values():
        if st.state == "running":
            st.state, st.error = "failed", "interrupted: the driver stopped during this step"
    runs.write(rec)


def execute(
    workflow: Workflow,
    *,
    run_id: str | None = None,
    client: Any = None,
    mode: str = "foreground",
    cluster: str | None = None,
    force: bool = False,
) -> RunOutcome:
    """Run ``workflow`` (see the module docstring).

    Parameters
    ----------
    workflow : Workflow
        From :func:`tensorflow_ooc.workflow.load_spec`.
    run_id : str, optional
        Continue this run's record (a submitted run, or a retried driver); default a new id.
    client : distributed.Client, optional
        The cluster to run step graphs on (a submitted driver passes its worker's client).
    mode : "foreground" or "submitted"
    cluster : str, optional
        Override of the spec's ``cluster`` (``embedded``, ``gpu`` or a scheduler address).
    force : bool
        Run every step even when its outputs are up to date.

    Returns
    -------
    RunOutcome
    """
    if client is None:
        check_cluster(workflow, cluster)  # an unreachable scheduler: a SpecError, nothing started
    cluster = cluster or workflow.spec.cluster
    runs = RunStore(workflow.root)
    index = OutputIndex(workflow.root)
    if run_id is not None and runs.exists(run_id):
        record = runs.read(run_id)
        if record.final:  # a driver re-run after it had finished (a worker died late): nothing to do
            return RunOutcome(run_id, record.state, record.exit_code or 0, record)
        for s in workflow.steps:
            record.steps.setdefault(s.name, StepRecord(kind=s.kind, inputs=s.inputs, outputs=s.outputs))
    else:
        record = new_record(workflow, run_id or new_run_id(workflow.name), mode, cluster)
        # as it runs (${VAR}, --set resolved), secret variables kept as ${NAME}
        runs.write_spec(record.run_id, workflow.source.record_text)
    rec = Recorder(runs, record, client, workflow.source.mask)
    with masked_logs(rec.mask):
        return _execute(workflow, runs, index, record, rec, client, mode, cluster, force)


def _execute(
    workflow: Workflow,
    runs: RunStore,
    index: OutputIndex,
    record: RunRecord,
    rec: Recorder,
    client: Any,
    mode: str,
    cluster: str,
    force: bool,
) -> RunOutcome:
    """:func:`execute` once the record is there, with the run's secret values masked in the logs."""
    run_id = record.run_id
    h = host_info()
    number = len(record.attempts) + 1
    lost = record.attempts[-1] if record.attempts and record.attempts[-1].ended_at is None else None
    if lost is not None:
        where = f" on worker {lost.worker}" if lost.worker else ""
        lost.ended_at = now_iso()
        lost.outcome = (
            f"lost during step {record.current_step!r}: the driver (pid {lost.pid} on {lost.host}{where}) "
            f"stopped without finishing; attempt {number} resumes"
        )
        for st in record.steps.values():
            if st.state == "running":
                st.state, st.error = "pending", f"interrupted in attempt {lost.attempt} (the driver stopped)"
    record.attempts.append(
        Attempt(attempt=number, host=h["host"], pid=h["pid"], worker=_worker_address(), started_at=now_iso())
    )
    # started again: no longer waiting; set with the attempt, since the webhook's record of its
    # delivery (and the heartbeat) may save the record before the run-started event below
    record.requeued, record.state = None, "running"
    if lost is not None:
        rec.event("attempt-lost", lost.outcome or "", level="warning")
        notify(workflow.spec.webhooks, rec, "on_retry", retry="driver", lost_attempt=lost.attempt, reason=lost.outcome)
    if runs.cancel_requested(run_id):
        rec.update(
            state="cancelled",
            exit_code=EXIT_CODES["cancelled"],
            finished_at=now_iso(),
            error="cancelled before it started",
        )
        rec.event("run-finished", f"run {run_id} cancelled before it started", state="cancelled")
        return RunOutcome(run_id, "cancelled", EXIT_CODES["cancelled"], record)
    record.started_at = record.started_at or now_iso()
    record.cluster = cluster
    rec.save()
    rec.event(
        "run-started",
        f"run {run_id}: {workflow.name} ({len(workflow.steps)} steps) under {workflow.root}"
        + (f", attempt {number}" if number > 1 else ""),
        attempt=number,
        mode=mode,
        cluster=cluster,
    )

    def on_client(c: Any) -> None:
        rec.client = c
        rec.update(dashboard=getattr(c, "dashboard_link", None))
        rec.event("cluster", f"Dask cluster {cluster}: dashboard {getattr(c, 'dashboard_link', None)}")

    handle = ClusterHandle(cluster, client, on_client)
    if client is not None:
        try:
            record.dashboard = client.dashboard_link
        except Exception:
            pass
    locks = OutputLocks(workflow.root, runs)
    outputs = workflow.outputs()
    capture = EventLogHandler(rec, threading.get_ident())
    lib_log = logging.getLogger("tensorflow_ooc")
    state, error = "done", None
    ran = 0
    try:
        taken = locks.acquire(outputs, run_id)
    except LockError as exc:
        rec.update(state="failed", exit_code=EXIT_CODES["failed"], finished_at=now_iso(), error=str(exc))
        for st in record.steps.values():
            if st.state in ("pending", "running"):
                st.state = "not run"
        rec.save()
        rec.event("run-finished", f"run {run_id} not started: {exc}", level="error", state="failed")
        run_on_failure(workflow, record, rec, None, str(exc))
        notify(workflow.spec.webhooks, rec, "on_failure", step=None)
        return RunOutcome(run_id, "failed", EXIT_CODES["failed"], record)
    for holder, why in dict(taken).items():  # one entry per run, not per output
        _mark_lost(runs, holder, why, run_id)
        record.took_over.append(holder)
        rec.event(
            "lock-taken-over",
            f"took over the outputs of run {holder} ({why}); its finished steps are "
            "skipped and CP-ALS resumes from its checkpoint",
            level="warning",
            previous_run=holder,
        )
    lib_log.addHandler(capture)
    rec.start_heartbeat()
    current = None
    try:
        for st in workflow.steps:
            current = st.name
            rec.check_cancel()
            srec = record.steps[st.name]
            capture.step = st.name
            missing = [f"{role} {where}" for role, where in st.inputs.items() if location_fingerprint(where) is None]
            if missing:
                raise InputError(f"step {st.name!r}: missing input: {', '.join(missing)}")
            fps = {role: location_fingerprint(where) for role, where in st.inputs.items()}
            fp = step_fingerprint(st.kind, st.config(), fps)
            stale = [why for why in (index.why_stale(o, fp) for o in st.outputs.values()) if why]
            if not stale and not force:
                rec.step(
                    st.name,
                    save=False,
                    state="skipped",
                    fingerprint=fp,
                    attempt=number,
                    error=None,
                    message="up to date (outputs exist with matching input fingerprints)",
                )
                rec.update(current_step=None)
                rec.event("step-skipped", f"{st.name}: up to date", step=st.name)
                continue
            t0 = time.time()
            rec.step(
                st.name,
                save=False,
                state="running",
                started_at=now_iso(),
                finished_at=None,
                seconds=None,
                fingerprint=fp,
                attempt=number,
                error=None,
                message="; ".join(sorted(set(stale))) or "forced",
            )
            rec.update(current_step=st.name)
            rec.event(
                "step-started",
                f"{st.name}: running {st.kind} (" + ("; ".join(sorted(set(stale))) or "forced") + ")",
                step=st.name,
                kind=st.kind,
            )
            # the spec was checked when loaded; a symbolic link made since must not lead out either
            for role, where in st.outputs.items():
                if not confined(where, workflow.allowed):
                    raise InputError(
                        f"step {st.name!r}: output {role} {where} now resolves to "
                        f"{real_location(where)}, outside the storage root {workflow.root} and the "
                        "allowed paths: refused"
                    )
            ctx = StepContext(workflow, st, fp, rec, handle.client_for, handle.default_device)
            metrics = run_with_retries(ctx, rec)
            for o in st.outputs.values():
                index.write(o, fp, st.name, run_id)
            # a step that looked and found nothing new (an append whose files were all ingested
            # before) changed no output: it counts as skipped, so such a run ends skipped (exit 3)
            nothing_new = bool(metrics.pop("nothing_new", False))
            ran += 0 if nothing_new else 1
            seconds = time.time() - t0
            merged = {**srec.metrics, **metrics}
            rec.step(
                st.name,
                save=False,
                state="skipped" if nothing_new else "done",
                finished_at=now_iso(),
                seconds=round(seconds, 3),
                metrics=merged,
                message="nothing new (every input was processed before)" if nothing_new else None,
            )
            rec.update(current_step=None)
            rec.event(
                "step-finished",
                f"{st.name}: " + ("nothing new" if nothing_new else "done") + f" in {seconds:.1f} s",
                step=st.name,
                seconds=seconds,
                metrics=merged,
            )
        current = None
        state = "done" if ran else "skipped"
    except RunCancelled as exc:
        state, error = "cancelled", str(exc)
        rec.event(
            "cancelled", f"cancelled during step {current!r}" if current else "cancelled", step=current, level="warning"
        )
    except KeyboardInterrupt:
        state, error = "cancelled", "interrupted (Ctrl-C)"
        raise
    except SpecError as exc:
        state, error = "failed", str(exc)
        rec.event("error", str(exc), step=current, level="error")
    except Exception as exc:
        state, error = "failed", f"{type(exc).__name__}: {exc}"
        rec.event(
            "error",
            f"{current}: {error}" if current else error,
            step=current,
            level="error",
            traceback=traceback.format_exc(),
        )
    finally:
        lib_log.removeHandler(capture)
        rec.stop_heartbeat()
        try:
            handle.close()
        except Exception as exc:  # a cluster that fails to close must not hide the outcome
            log.debug("closing the cluster: %s", exc)
        locks.release(outputs, run_id)
        if current is not None:
            srec = record.steps[current]
            started = parse_iso(srec.started_at)
            rec.step(
                current,
                save=False,
                state="cancelled" if state == "cancelled" else "failed",
                error=error,
                finished_at=now_iso(),
                seconds=round(time.time() - started, 3) if started else None,
            )
        for srec in record.steps.values():
            if srec.state in ("pending", "running"):
                srec.state = "not run"
        code = EXIT_CODES[state]
        record.attempts[-1].ended_at = now_iso()
        record.attempts[-1].outcome = state
        try:
            rec.update(state=state, exit_code=code, finished_at=now_iso(), current_step=None, error=error)
        except DiskFullError as exc:  # still full: the outcome is reported, the record keeps its last state
            log.warning("could not record the run's outcome: %s", exc)
        rec.event(
            "run-finished",
            f"run {run_id} {state}" + (f": {error}" if error else ""),
            state=state,
            exit_code=code,
            level="error" if state == "failed" else "info",
        )
        if state == "failed":  # after the record is final, so the command can read it
            run_on_failure(workflow, record, rec, current, error)
            notify(workflow.spec.webhooks, rec, "on_failure", step=current)
        elif state in ("done", "skipped"):
            notify(workflow.spec.webhooks, rec, "on_success")
    return RunOutcome(run_id, state, EXIT_CODES[state], record)


# --- retries and the failure hook ---------------------------------------------------------------------

#: failures that another try cannot mend: a cancel, a lock held by another run, a failed check,
#: and bad input (every input error of the package is a ValueError: a spec, a .tns line, a store,
#: ranks...); others (an OSError, a full disk, a lost worker) may pass and are tried again
NOT_RETRIED = (RunCancelled, SpecError, InputError, StepFailed, LockError, ValueError)
#: OS errors that stay whatever the wait: a file where a folder must be (or the reverse), a name
#: too long, a read-only file system, no permission
PERMANENT_OS_ERRORS = (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
PERMANENT_ERRNOS = (errno.ENAMETOOLONG, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR)


def is_permanent(exc: BaseException) -> bool:
    """Whether another try of a step cannot mend ``exc`` (:data:`NOT_RETRIED`, or an OS error
    about the paths themselves)."""
    if isinstance(exc, NOT_RETRIED) or isinstance(exc, PERMANENT_OS_ERRORS):
        return True
    return isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNOS


MAX_RETRY_WAIT = 3600.0  # seconds: the doubling of retry_delay stops here
#: set to 1 in a worker's environment to let submitted runs' on_failure commands run there
ALLOW_ON_FAILURE_ENV = "TFOOC_ALLOW_ON_FAILURE"
ON_FAILURE_TIMEOUT = 300.0  # seconds an on_failure command may run (``$TFOOC_ON_FAILURE_TIMEOUT_S``)


def run_with_retries(ctx: StepContext, rec: Recorder) -> dict:
    """Run a step; with ``retries: N`` a failure other than :data:`NOT_RETRIED` is tried again,
    up to N more times, after ``retry_delay`` seconds, doubled for each further retry. Each try
    is in the step's record (``tries``) and each retry is a ``step-retry`` event; a cancel
    requested while waiting ends the wait. Returns the step's metrics; the last failure is raised."""
    name, model = ctx.step.name, ctx.step.model
    retries, delay = model.retries, model.retry_delay
    if not retries:
        return run_step(ctx)
    tries: list[dict] = []
    for number in range(1, retries + 2):
        t0 = time.time()
        entry: dict[str, Any] = {"try": number, "started_at": now_iso()}
        tries.append(entry)
        rec.step(name, tries=tries)
        try:
            metrics = run_step(ctx)
        except BaseException as exc:
            entry.update(
                finished_at=now_iso(), seconds=round(time.time() - t0, 3), error=f"{type(exc).__name__}: {exc}"
            )
            last = number == retries + 1
            if is_permanent(exc) or not isinstance(exc, Exception) or last:
                if isinstance(exc, Exception) and not is_permanent(exc):
                    entry["error"] += f" (try {number} of {retries + 1}: no retries left)"
                elif isinstance(exc, OSError) and not isinstance(exc, NOT_RETRIED):
                    entry["error"] += " (not retried: another try would fail the same way)"
                rec.step(name, tries=tries)
                raise
            wait = min(delay * 2 ** (number - 1), MAX_RETRY_WAIT)
            entry["retry_in"] = wait
            rec.step(name, tries=tries)
            rec.event(
                "step-retry",
                f"{name}: try {number} of {retries + 1} failed ({entry['error']}); retrying in {wait:g} s",
                step=name,
                level="warning",
                attempt=number,
                retry_in=wait,
                error=entry["error"],
                traceback=traceback.format_exc(),
            )
            notify(
                ctx.workflow.spec.webhooks,
                rec,
                "on_retry",
                retry="step",
                step=name,
                attempt_of_step=number,
                tries=retries + 1,
                retry_in=wait,
                error=entry["error"],
            )
            end = time.monotonic() + wait
            while time.monotonic() < end:  # a cancel ends the wait
                rec.check_cancel()
                time.sleep(min(0.2, max(0.0, end - time.monotonic())))
            rec.check_cancel()
            continue
        entry.update(finished_at=now_iso(), seconds=round(time.time() - t0, 3), error=None)
        rec.step(name, save=False, tries=tries)
        return metrics
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def run_on_failure(workflow: Workflow, record: RunRecord, rec: Recorder, step: str | None, error: str | None) -> None:
    """Run the spec's ``on_failure`` command for a failed run (after its record is final).

    Its environment is the driver's plus ``TFOOC_RUN_ID``, ``TFOOC_ERROR``, ``TFOOC_STEP`` (the
    step that failed, empty when none had started), ``TFOOC_WORKFLOW``, ``TFOOC_STORAGE``,
    ``TFOOC_SPEC`` and ``TFOOC_EXIT_CODE``; it runs in the storage root when that is a local
    folder. Its outcome (exit status, seconds, the end of its output) goes into the record
    (``on_failure``) and an ``on-failure`` event; its own failure (an exit status other than 0,
    a missing program, more than ``$TFOOC_ON_FAILURE_TIMEOUT_S`` seconds, default 300) is
    logged as a warning and never changes the run's outcome.
    """
    command = workflow.spec.on_failure
    if not command:
        return
    shown = command if isinstance(command, str) else shlex.join(command)
    if record.mode == "submitted" and os.environ.get(ALLOW_ON_FAILURE_ENV) != "1":
        # a submitted spec's command would run on a worker with the worker's permissions: only
        # where the operator allows it, as the path sandbox lets them allow folders
        why = (
            f"not run: a submitted run's on_failure runs on a worker, which allows commands only "
            f"with {ALLOW_ON_FAILURE_ENV}=1 in the workers' environment"
        )
        log.warning("on_failure %r %s", shown, why)
        try:
            rec.update(on_failure={"command": shown, "skipped": why})
            rec.event("on-failure", message=f"on_failure {shown!r} {why}", level="warning")
        except Exception as exc:  # the record's storage failing too: the log line stays
            log.warning("on_failure %r: could not record the skip (%s)", shown, exc)
        return
    env = {
        **os.environ,
        "TFOOC_RUN_ID": record.run_id,
        "TFOOC_ERROR": rec.mask.text(error or ""),
        "TFOOC_RUN_DATE": record.run_date or "",
        "TFOOC_STEP": step or "",
        "TFOOC_WORKFLOW": workflow.name,
        "TFOOC_STORAGE": workflow.root,
        "TFOOC_SPEC": workflow.path,
        "TFOOC_EXIT_CODE": str(record.exit_code if record.exit_code is not None else EXIT_CODES["failed"]),
    }
    cwd = workflow.root if os.path.isdir(workflow.root) else None
    timeout = float(os.environ.get("TFOOC_ON_FAILURE_TIMEOUT_S", ON_FAILURE_TIMEOUT))
    t0 = time.time()
    outcome: dict[str, Any] = {"command": shown}
    try:
        done = subprocess.run(
            command,
            shell=isinstance(command, str),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
        outcome["exit_code"] = done.returncode
        tail = (done.stdout + done.stderr).decode(errors="replace").strip()[-2000:]
        if tail:
            outcome["output"] = tail
        if done.returncode != 0:
            outcome["error"] = f"exited with status {done.returncode}"
    except subprocess.TimeoutExpired:
        outcome["error"] = f"still running after {timeout:g} s: stopped"
    except OSError as exc:
        outcome["error"] = f"could not start: {exc}"
    outcome["seconds"] = round(time.time() - t0, 3)
    failed = "error" in outcome
    try:
        rec.update(on_failure=outcome)
        rec.event(
            "on-failure",
            f"on_failure {shown!r}: "
            + (f"failed ({outcome['error']}); the run's outcome stands" if failed else "done"),
            level="warning" if failed else "info",
            **{k: v for k, v in outcome.items() if k != "command"},
        )
    except Exception as exc:  # the record cannot be written: the hook's outcome is still logged
        log.warning("on_failure %r: %s (could not record it: %s)", shown, outcome.get("error", "done"), exc)


def spec_failure(runs: RunStore, record: RunRecord, exc: SpecError) -> RunOutcome:
    """Close a (submitted) record whose spec no longer validates where the driver runs."""
    record.state, record.exit_code, record.finished_at, record.error = "failed", EXIT_BAD_SPEC, now_iso(), str(exc)
    for st in record.steps.values():
        st.state = "not run"
    runs.write(record)
    runs.append_events(
        record.run_id,
        [
            {
                "time": now_iso(),
                "t": time.time(),
                "run_id": record.run_id,
                "event": "run-finished",
                "level": "error",
                "message": str(exc),
                "state": "failed",
                "exit_code": EXIT_BAD_SPEC,
            }
        ],
    )
    return RunOutcome(record.run_id, "failed", EXIT_BAD_SPEC, record)
