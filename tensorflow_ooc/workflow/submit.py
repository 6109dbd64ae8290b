"""Submitting runs to a Dask cluster, and following, waiting for and cancelling runs.

``tfooc submit SPEC --scheduler ADDR`` validates the spec where it is typed (a bad spec starts
nothing, exit 2), writes the run record (``queued``), and submits the driver
(:func:`driver_task`) as one Dask task under the key ``tfooc-run-RUN_ID`` with
``fire_and_forget``: the scheduler keeps it wanted after the submitting client has gone, so the
command returns the run id at once and the run continues on the cluster.

The driver task ``secede``\\s from the worker's thread pool (it mostly waits for the step graphs it
submits through ``get_client()``) and ``rejoin``\\s at the end. If its worker dies, the scheduler
runs the task again elsewhere: the new attempt finds the record, says the previous attempt was
lost, skips the finished steps and resumes CP-ALS from its checkpoint.

A run with a decompose step asks for a worker slot (the ``tfooc-slot`` resource, see
:mod:`.admission`), so that runs queue for workers rather than share one's memory; a run whose
decomposition no worker's memory limit can hold is refused before anything is submitted.

Cancellation is cooperative: ``tfooc cancel`` leaves a ``cancel`` file in the run's folder, which
the driver checks before each step and after every CP-ALS iteration; a run still queued is also
removed from the scheduler.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .errors import RunNotFound, SpecError
from .plan import Workflow, load_spec
from .records import EXIT_CODES, RunRecord, RunStore, host_info, new_run_id, now_iso

if TYPE_CHECKING:
    from .runner import RunOutcome

# the runner (every step's stage: numba, Dask, Zarr) and the cluster module are imported by the
# functions that run or submit: tfooc status --wait and tfooc cancel use this module and start
# in a fraction of a second without them

log = logging.getLogger("tensorflow_ooc.workflow")


def driver_key(run_id: str) -> str:
    """The Dask key of a run's driver task."""
    return f"tfooc-run-{run_id}"


def driver_task(
    spec_text: str,
    spec_path: str,
    storage: str,
    run_id: str,
    force: bool = False,
    allow_paths: list[str] | None = None,
    secret_values: list[str] | None = None,
) -> int:
    """The workflow driver, as a Dask task. Returns the run's exit code.

    ``spec_text``: the spec as resolved where it was submitted (``${VAR}`` references and
    ``--set`` overrides applied), read here without interpolating it again.

    ``allow_paths``: what the operator allowed where the run was submitted (the worker's own
    environment and config file are not consulted then).

    ``secret_values``: the values of the spec's secret variables, which ``spec_text`` holds: the
    driver masks them in everything it writes and logs."""
    from distributed import get_client, rejoin, secede

    lib = logging.getLogger("tensorflow_ooc")
    if lib.level == logging.NOTSET:
        lib.setLevel(logging.INFO)  # the run's events keep the library's INFO lines
    secede()  # waiting on step graphs must not hold one of the worker's threads
    try:
        client = get_client()
        try:
            # the text was resolved where the run was submitted (${VAR}, --set): the worker's
            # environment must not change it
            workflow = load_spec(
                spec_path,
                text=spec_text,
                storage=storage,
                allow_paths=allow_paths,
                operator_config=allow_paths is None,
                interpolate=False,
                secret_values=secret_values or (),
            )
        except SpecError as exc:  # an input that existed at submission is gone, for example
            runs = RunStore(storage)
            from .runner import spec_failure

            return spec_failure(runs, runs.read(run_id), exc).exit_code
        from .runner import execute

        outcome = execute(
            workflow, run_id=run_id, client=client, mode="submitted", cluster=client.scheduler.address, force=force
        )
        return outcome.exit_code
    finally:
        rejoin()


def _has_task(dask_scheduler: Any, key: str) -> bool:
    return key in dask_scheduler.tasks


def submit(workflow: Workflow, scheduler: str, *, force: bool = False, timeout: float = 30.0) -> str:
    """Submit ``workflow`` to the Dask scheduler at ``scheduler``; returns the run id at once.

    Parameters
    ----------
    workflow : Workflow
        A validated spec (:func:`~tensorflow_ooc.workflow.load_spec`).
    scheduler : str
        Scheduler address (``tcp://host:8786``, ``tls://...`` with Dask's security config).
    force : bool
        Run every step even when up to date.
    timeout : float
        Seconds to wait for the connection and for the scheduler to hold the driver task.

    Returns
    -------
    str
        The run id.

    Raises
    ------
    SpecError
        A decompose step whose input exists needs more memory than the largest worker limit
        allows (:func:`~tensorflow_ooc.workflow.admission.check_fits`); nothing was submitted.
    """
    from distributed import Client, fire_and_forget

    from ..execution.cluster import ON_CLIENT
    from ..limits import SLOT_RESOURCE
    from .runner import new_record

    client = Client(scheduler, timeout=f"{int(timeout)}s")
    try:
        from .admission import admission, check_fits

        # before anything is written: a decomposition no worker can hold is refused here
        placement = admission(client, workflow)
        check_fits(workflow, placement.workers)
        if placement.warning:
            log.warning("%s", placement.warning)
        runs = RunStore(workflow.root)
        run_id = new_run_id(workflow.name)
        record = new_record(workflow, run_id, "submitted", scheduler, scheduler=scheduler)
        record.dashboard = client.dashboard_link
        for hook in ON_CLIENT:  # the tfooc page and metrics on its dashboard (execution.cluster)
            hook(client, storage=workflow.root)
        runs.write_spec(run_id, workflow.source.record_text)  # secret variables kept as ${NAME}
        runs.write(record, workflow.source.mask)
        queue: dict = {}
        if placement.submit_kwargs:
            # slotted: the driver waits on the scheduler, and the slot queue hands it the first free
            # slot in submission order (:mod:`.slot_queue`)
            from .slot_queue import PLUGIN, QUEUE, SlotQueue, note_run

            client.register_plugin(SlotQueue(), name=PLUGIN)
            client.run_on_scheduler(note_run, key=driver_key(run_id), storage=workflow.root)
            queue = {"workers": [QUEUE], "allow_other_workers": False}
        fut = client.submit(
            driver_task,
            workflow.source.effective_text,
            workflow.path,
            workflow.root,
            run_id,
            force,
            list(workflow.operator_allowed),
            list(workflow.source.secret_values),
            key=driver_key(run_id),
            pure=False,
            **placement.submit_kwargs,  # a tfooc-slot: the run waits, queued, for a free worker
            **queue,
        )
        fire_and_forget(fut)
        # the submission travels on the client's batched stream: make sure the scheduler has it
        # before this client (and possibly the whole process) goes away
        deadline = time.time() + timeout
        while not client.run_on_scheduler(_has_task, key=driver_key(run_id)):
            if time.time() > deadline:
                raise TimeoutError(f"the scheduler at {scheduler} did not take the driver task in {timeout:.0f} s")
            time.sleep(0.05)
        runs.append_events(
            run_id,
            [
                {
                    "time": now_iso(),
                    "t": time.time(),
                    "run_id": run_id,
                    "event": "submitted",
                    "level": "info",
                    "message": f"submitted to {scheduler} by {host_info()['user']}@{host_info()['host']}"
                    + (
                        f"; queued until a worker has a free {SLOT_RESOURCE}"
                        if placement.submit_kwargs
                        else "; no worker declares slots: not queued"
                        if placement.warning
                        else ""
                    ),
                    "scheduler": scheduler,
                    "resources": placement.submit_kwargs.get("resources"),
                }
            ],
        )
    finally:
        client.close()
    return run_id


def run_foreground(workflow: Workflow, *, cluster: str | None = None, force: bool = False) -> RunOutcome:
    """``tfooc run``: the driver in this process (the embedded cluster unless ``cluster`` says)."""
    from .runner import execute

    return execute(workflow, cluster=cluster, force=force)


def cancel(storage: str, run_id: str, timeout: float = 10.0) -> RunRecord:
    """Ask a run to stop; returns its record (already final, or as it is now)."""
    runs = RunStore(storage)
    run_id = runs.resolve(run_id)
    record = runs.read(run_id)
    if record.final:
        return record
    h = host_info()
    runs.request_cancel(run_id, by=f"{h['user']}@{h['host']}")
    if record.state == "queued" and record.scheduler:
        # not started yet: take it off the scheduler too, so it never starts
        try:
            from distributed import Client, Future

            with Client(record.scheduler, timeout=f"{int(timeout)}s") as client:
                Future(driver_key(run_id), client).cancel()
        except Exception as exc:  # scheduler gone: the cancel file stops the run when it starts
            log.info(
                "could not reach %s to drop the queued driver task (%s); the run stops when it starts",
                record.scheduler,
                exc,
            )
        record = runs.read(run_id)
        if record.state == "queued":
            record.state, record.exit_code = "cancelled", EXIT_CODES["cancelled"]
            record.finished_at, record.error = now_iso(), "cancelled before it started"
            record.cancel_requested_at = now_iso()
            for st in record.steps.values():
                st.state = "not run"
            runs.write(record)
    # a running record is only written by its driver, which sees the cancel file within a
    # heartbeat or a CP-ALS iteration and records the cancellation itself
    return runs.read(run_id)


def wait(storage: str, run_id: str, timeout: float | None = None, poll: float = 0.5) -> RunRecord:
    """Wait until a run is final (or lost); returns its record."""
    runs = RunStore(storage)
    run_id = runs.resolve(run_id)
    deadline = None if timeout is None else time.time() + timeout
    while True:
        record = runs.read(run_id)
        if record.final or record.display_state() == "lost":
            return record
        if deadline is not None and time.time() > deadline:
            raise TimeoutError(f"run {run_id} is still {record.state} after {timeout:.0f} s")
        time.sleep(poll)


__all__ = ["RunNotFound", "cancel", "driver_key", "driver_task", "run_foreground", "submit", "wait"]
