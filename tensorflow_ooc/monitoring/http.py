"""Routes of the monitoring page on the Dask scheduler's own HTTP server (the dashboard's).

- ``/tfooc``: the page (:mod:`.page`);
- ``/tfooc/runs.json``: a page of the runs (summaries, newest first; ``?page=N`` from 1 and
  ``?limit=N`` runs a page, 25 by default), the queue of submitted runs waiting for a worker slot,
  and each worker's memory limit against its runs' memory plan peak;
- ``/tfooc/runs/RUN.json``: one run: steps, CP-ALS iterations, checkpoints, errors.

The handlers are added to the running server's Tornado application (``add_handlers``), so no
server of our own is started and the routes sit beside ``/status`` and ``/metrics``. The page is
also added to the dashboard's navigation bar.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any

from distributed.http.utils import RequestHandler

from ..limits import SLOT_RESOURCE
from .page import PAGE

log = logging.getLogger(__name__)

PAGE_PATH = "/tfooc"
PLUGIN_NAME = "tfooc-monitor"


def _state(scheduler: Any):
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    return None if plugin is None else plugin.state


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float as None (JSON's null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(payload: Any) -> str:
    """Strict JSON, which the browser's ``JSON.parse`` reads: a NaN (a CP-APR run's first
    ``loglik_change``, a step's metric) or an infinity becomes null, never ``NaN``."""
    try:
        return json.dumps(payload, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(payload), default=str, allow_nan=False)


class _Handler(RequestHandler):
    def json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(dumps(payload))


class PageHandler(_Handler):
    """The HTML page."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(PAGE)


async def _off_loop(fn: Any, *args: Any) -> Any:
    """Run ``fn`` in a thread: run records may live on a remote filesystem, and the scheduler's
    event loop must not wait for them."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


DRIVER_PREFIX = "tfooc-run-"  # the key of a submitted run's driver task (workflow.submit.driver_key)


def _plan_peaks(state: Any) -> dict[str, dict]:
    """Per run, its latest worker memory plan (of the step that planned last)."""
    out = {}
    for view in [] if state is None else state.live_views():
        plans = view.get("memory_plans") or {}
        if plans:
            step = view.get("current_step") if view.get("current_step") in plans else next(reversed(plans))
            out[view["run_id"]] = {"step": step, **plans[step]}
    return out


def cluster_view(scheduler: Any, state: Any, rows: list[dict]) -> dict[str, list]:
    """The queue and the workers, read from the scheduler (on its event loop).

    ``queue``: runs whose record says ``queued`` and whose driver task this scheduler holds
    (waiting for a worker with a free ``tfooc-slot``: the scheduler may already have handed it to
    a worker, which holds it until the slot is free), oldest first.
    ``workers``: each worker's memory limit, its slots and those in use, the runs whose drivers
    it runs and those waiting there, and the peak of the running ones' latest memory plan (which
    the plan kept under the usable part of the limit)."""
    tasks = scheduler.tasks
    # a run whose driver waits again after its worker was lost shows "retrying": it queues too
    queued = {str(r["run_id"]) for r in rows if r.get("state") in ("queued", "retrying")}
    queue = []
    for row in sorted(rows, key=lambda r: r.get("created_at") or ""):
        ts = tasks.get(DRIVER_PREFIX + str(row["run_id"]))
        if row["run_id"] in queued and ts is not None:
            queue.append(
                {k: row.get(k) for k in ("run_id", "workflow", "created_at")}
                | {
                    "position": len(queue) + 1,
                    "worker": None if ts.processing_on is None else ts.processing_on.address,
                }
            )
    plans = _plan_peaks(state)
    workers = []
    for ws in scheduler.workers.values():
        drivers = sorted(
            str(ts.key)[len(DRIVER_PREFIX) :] for ts in ws.processing if str(ts.key).startswith(DRIVER_PREFIX)
        )
        runs = [r for r in drivers if r not in queued]
        mine = [plans[r] for r in runs if r in plans]
        top = max(mine, key=lambda p: p.get("peak") or 0, default=None)
        workers.append(
            {
                "address": ws.address,
                "name": str(ws.name),
                "nthreads": ws.nthreads,
                "memory_limit": ws.memory_limit or None,
                "memory": ws.memory.process,
                "slots": (ws.resources or {}).get(SLOT_RESOURCE),
                # the scheduler counts a slot used from when it hands a task over, and the worker
                # holds a task waiting for a slot: the runs whose drivers started are the ones using it
                "slots_used": len(runs),
                "runs": runs,
                "waiting": [r for r in drivers if r in queued],
                "plan_peak": None if top is None else top.get("peak"),
                "plan": None
                if top is None
                else {
                    k: top.get(k) for k in ("step", "execution", "in_place", "peak", "limit", "required_limit", "terms")
                },
            }
        )
    workers.sort(key=lambda w: w["name"])
    return {"queue": queue, "workers": workers}


PAGE_SIZE = 25  # runs a page of the runs table, unless ?limit= says otherwise
MAX_PAGE_SIZE = 500


def _positive_int(text: str, name: str, most: int | None = None) -> int:
    """``?NAME=`` as a whole number from 1 (to ``most``), or a ValueError that says which."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or (most is not None and value > most):
        upto = f" to {most}" if most is not None else ""
        raise ValueError(f"?{name}={text!r}: expected a whole number from 1{upto}")
    return value


def runs_listing(state: Any, page: int, limit: int) -> dict[str, Any]:
    """One page of the runs table, newest first: its rows, and where it is among all the runs
    (``page``, ``limit``, ``total``, ``pages``)."""
    rows = [] if state is None else state.runs(limit, (page - 1) * limit)
    total = 0 if state is None else state.total()
    return {"runs": rows, "page": page, "limit": limit, "total": total, "pages": max(1, -(-total // limit))}


class RunsHandler(_Handler):
    """A page of the running and past runs (``?page=N``, from 1, newest first; ``?limit=N`` runs
    a page), the queue and the workers."""

    async def get(self) -> None:
        state = _state(self.server)
        try:
            page = _positive_int(self.get_argument("page", "1"), "page")
            limit = _positive_int(self.get_argument("limit", str(PAGE_SIZE)), "limit", MAX_PAGE_SIZE)
        except ValueError as exc:
            self.json({"error": str(exc)}, status=400)
            return
        listing = await _off_loop(runs_listing, state, page, limit)
        # the queue holds every queued run this scheduler follows, whichever page is shown
        shown = {r["run_id"] for r in listing["runs"]}
        active = [] if state is None else [r for r in state.active() if r["run_id"] not in shown]
        self.json(
            {
                "scheduler": self.server.address,
                "time": time.time(),
                "storage": [] if state is None else list(state.roots),
                **listing,
                **cluster_view(self.server, state, listing["runs"] + active),
            }
        )


class RunHandler(_Handler):
    """One run, in full."""

    async def get(self, run_id: str) -> None:
        state = _state(self.server)
        view = None if state is None else await _off_loop(state.run, run_id)
        if view is None:
            self.json({"error": f"no run {run_id!r} known to this scheduler"}, status=404)
        else:
            self.json(view)


def routes(scheduler: Any) -> list[tuple[str, type, dict]]:
    kw = {"dask_server": scheduler}
    return [
        (PAGE_PATH + "/?", PageHandler, kw),
        (PAGE_PATH + "/runs.json", RunsHandler, kw),
        (PAGE_PATH + r"/runs/([^/]+)\.json", RunHandler, kw),
    ]


def install_routes(scheduler: Any) -> bool:
    """Add the routes to ``scheduler``'s HTTP server (once); False when it has none."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        log.info("the scheduler has no HTTP server: the tfooc page is not served")
        return False
    if getattr(app, "_tfooc_routes", False):
        return True
    app.add_handlers(r".*$", routes(scheduler))
    app._tfooc_routes = True
    _add_to_navbar(scheduler)
    return True


def _add_to_navbar(scheduler: Any) -> None:
    """A "Tfooc" tab in the Dask dashboard's navigation bar (its pages list is shared by reference
    with the dashboard's templates)."""
    try:
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler)["pages"]
        if "tfooc" not in pages:
            pages.append("tfooc")
    except Exception as exc:  # no bokeh, or a dashboard whose templates differ: the route works anyway
        log.debug("tfooc page not added to the dashboard's navigation: %s", exc)


def page_link(dashboard_link: str | None) -> str | None:
    """The page's URL from a client's ``dashboard_link`` (``http://host:8787/status``)."""
    if not dashboard_link:
        return None
    base = dashboard_link.rsplit("/status", 1)[0] if dashboard_link.endswith("/status") else dashboard_link.rstrip("/")
    return base + PAGE_PATH
