"""The queue of submitted runs waiting for a worker slot, kept on the scheduler in submission order.

Dask places a task with resource restrictions on any worker that *has* the resource, free or not,
and the worker holds it until the resource is free: a driver restarted after its worker was lost
went to a worker busy with another run while the restarted worker sat free, and a run submitted
later could start first. So a slotted driver (:mod:`.admission`) is submitted restricted to
:data:`QUEUE` (no worker has that name): the scheduler keeps it unrunnable, and
:class:`SlotQueue`, a scheduler plugin, hands each free slot to the earliest submitted waiting
driver, restricting it to that worker. A driver whose worker is lost is restricted to a worker
that is gone: it waits again, and takes the first free slot in submission order.

When a worker running a driver leaves, the plugin writes the run's record back to ``queued`` (shown
``retrying``: :meth:`~.records.RunRecord.display_state`), so the run does not look ``lost`` while
it waits; a driver that fails for good (Dask's ``allowed-failures`` lost workers) ends its record
``failed`` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from ..limits import SLOT_RESOURCE
from .records import EXIT_CODES, RunStore, now_iso

log = logging.getLogger("tensorflow_ooc.workflow")

#: the plugin's name on the scheduler
PLUGIN = "tfooc-slot-queue"

#: the worker a waiting driver is restricted to: none has this name, so it waits on the scheduler
QUEUE = "tfooc-slot-queue"

DRIVER_PREFIX = "tfooc-run-"  # workflow.submit.driver_key

PLACE_EVERY_MS = 1000  # how often waiting drivers are also checked against free slots


def _slots(ws: Any) -> float:
    return float((ws.resources or {}).get(SLOT_RESOURCE) or 0)


class SlotQueue(SchedulerPlugin):
    """Hands free worker slots to waiting drivers, earliest submitted first; records a driver's
    lost worker as ``retrying``. Registered by :func:`~.submit.submit` (once per scheduler)."""

    idempotent = True
    name = PLUGIN

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.storage: dict[str, str] = {}  # driver key -> the run's storage root
        self.placed: dict[str, str] = {}  # driver key -> the worker it was handed to
        self.order: dict[str, int] = {}  # driver key -> its place in submission order
        self._pending = False

    async def start(self, scheduler: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        # besides the events: a worker is added before it runs, and a slot it brings is free
        # only once it does
        self._periodic = PeriodicCallback(self.place, PLACE_EVERY_MS)
        self._periodic.start()

    async def close(self) -> None:
        periodic = getattr(self, "_periodic", None)
        if periodic is not None:
            periodic.stop()

    # --- scheduler events ----------------------------------------------------------------------
    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        key = str(key)
        if not key.startswith(DRIVER_PREFIX):
            return
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.processing_on is not None:
                self.placed[key] = ts.processing_on.address
        elif finish in ("memory", "erred", "forgotten"):
            # kept while the driver is rescheduled: remove_worker comes after its transitions
            self.placed.pop(key, None)
        if finish == "erred":
            why = kwargs.get("exception_text") or "the driver task failed on the cluster"
            self._write(key, "failed", f"the driver could not run: {why}")
        if finish in ("forgotten", "erred", "memory"):
            self.storage.pop(key, None)
            self.order.pop(key, None)
        if start == "processing" or finish == "no-worker":
            self.soon()  # a slot may be free, or a driver waiting

    def add_worker(self, scheduler: Any = None, worker: str | None = None) -> None:
        self.soon()

    def remove_worker(self, scheduler: Any = None, worker: str | None = None, **kwargs: Any) -> None:
        lost = [k for k, w in self.placed.items() if w == worker]
        for key in lost:
            self.placed.pop(key, None)
            ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
            if ts is None or ts.state in ("memory", "erred"):
                continue  # finished there before the worker left
            self._write(
                key,
                "queued",
                f"worker {worker}, which ran the driver, left the cluster at {now_iso()}; the run waits for the "
                "first free slot (in submission order) and resumes there",
            )
        self.soon()

    # --- placing ---------------------------------------------------------------------------------
    def soon(self) -> None:
        """Place waiting drivers once the scheduler's current transitions are done."""
        if self._pending or self.scheduler is None:
            return
        self._pending = True
        try:
            asyncio.get_running_loop().call_soon(self.place)
        except RuntimeError:  # not on the scheduler's loop (a test's direct call)
            self._pending = False

    def place(self) -> list[tuple[str, str]]:
        """Hand each free slot to the earliest submitted waiting driver; the (key, worker) pairs."""
        self._pending = False
        s = self.scheduler
        waiting = []
        busy: dict[str, int] = {}
        if s is None:
            return []
        for key in list(self.storage) + [k for k in self.placed if k not in self.storage]:
            ts = s.tasks.get(key)
            if ts is None:
                continue
            if ts.state == "no-worker" and (ts.resource_restrictions or {}).get(SLOT_RESOURCE):
                waiting.append(ts)
            elif ts.state == "processing" and ts.processing_on is not None:
                busy[ts.processing_on.address] = busy.get(ts.processing_on.address, 0) + 1
        if not waiting:
            return []
        late = len(self.order) + 1  # drivers the plugin was not told of go after those it was
        waiting.sort(key=lambda ts: (self.order.get(str(ts.key), late), ts.priority or (), str(ts.key)))
        free = []
        for ws in s.workers.values():
            n = _slots(ws) - busy.get(ws.address, 0)
            if n >= 1 and ws in s.running:
                free.append([ws, int(n)])
        moves: list[tuple[str, str]] = []
        recommendations: dict[Any, str] = {}
        for ts in waiting:
            free = [f for f in free if f[1] > 0]
            if not free:
                break
            slot = max(free, key=lambda f: (f[1], -f[0].occupancy))  # the emptiest worker
            slot[1] -= 1
            ts.worker_restrictions = {slot[0].address}
            ts.host_restrictions = None  # the queue's name: the worker restriction is the one now
            ts.loose_restrictions = False
            recommendations[ts.key] = "processing"
            moves.append((str(ts.key), slot[0].address))
        if recommendations:
            s.transitions(recommendations, stimulus_id=f"tfooc-slot-queue-{now_iso()}")
            for key, worker in moves:
                log.info("run %s takes the free slot of %s", key[len(DRIVER_PREFIX) :], worker)
        return moves

    # --- records ---------------------------------------------------------------------------------
    def _write(self, key: str, state: str, why: str) -> None:
        """Update the run's record off the scheduler's loop (a storage root may be remote)."""
        storage = self.storage.get(key)
        if storage is None:
            return
        threading.Thread(
            target=_update_record, args=(storage, key[len(DRIVER_PREFIX) :], state, why), daemon=True
        ).start()


def _update_record(storage: str, run_id: str, state: str, why: str) -> None:
    """A running record back to ``queued`` (retrying), or a record not final yet to ``failed``."""
    try:
        runs = RunStore(storage)
        rec = runs.read(run_id)
        if rec.final:
            return
        if state == "queued":
            if rec.state != "running":
                return  # never started: still queued as it was
            rec.state, rec.requeued = "queued", why
        else:
            rec.state, rec.exit_code, rec.finished_at, rec.error = "failed", EXIT_CODES["failed"], now_iso(), why
            for st in rec.steps.values():
                if st.state in ("pending", "running"):
                    st.state = "not run"
        runs.write(rec)
        runs.append_events(
            run_id,
            [
                {
                    "time": now_iso(),
                    "run_id": run_id,
                    "event": "requeued" if state == "queued" else "run-finished",
                    "level": "warning" if state == "queued" else "error",
                    "message": why,
                    "state": rec.display_state(),
                }
            ],
        )
    except Exception as exc:  # the record stays as it was; the driver corrects it when it starts
        log.warning("could not record run %s as %s: %s", run_id, state, exc)


def note_run(dask_scheduler: Any, key: str, storage: str) -> bool:
    """On the scheduler (``client.run_on_scheduler``): the storage root of a driver's run, so the
    plugin can write its record; then place what waits. False when the plugin is not there."""
    plugin = dask_scheduler.plugins.get(PLUGIN)
    if plugin is None:
        return False
    plugin.storage[key] = storage
    plugin.order[key] = max(plugin.order.values(), default=0) + 1
    plugin.soon()
    return True


__all__ = ["PLUGIN", "QUEUE", "SlotQueue", "note_run"]
