"""Routes of the monitoring page on the Dask scheduler's own HTTP server (the dashboard's).

- ``/tfooc``: the page (:mod:`.page`);
- ``/tfooc/runs.json``: running and past runs (summaries);
- ``/tfooc/runs/RUN.json``: one run: steps, CP-ALS iterations, checkpoints, errors.

The handlers are added to the running server's Tornado application (``add_handlers``), so no
server of our own is started and the routes sit beside ``/status`` and ``/metrics``. The page is
also added to the dashboard's navigation bar.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from distributed.http.utils import RequestHandler

from .page import PAGE

log = logging.getLogger(__name__)

PAGE_PATH = "/tfooc"
PLUGIN_NAME = "tfooc-monitor"


def _state(scheduler: Any):
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    return None if plugin is None else plugin.state


class _Handler(RequestHandler):
    def json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(payload, default=str))


class PageHandler(_Handler):
    """The HTML page."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(PAGE)


async def _off_loop(fn: Any, *args: Any) -> Any:
    """Run ``fn`` in a thread: run records may live on a remote filesystem, and the scheduler's
    event loop must not wait for them."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class RunsHandler(_Handler):
    """Running and past runs."""

    async def get(self) -> None:
        state = _state(self.server)
        limit = int(self.get_argument("limit", "50"))
        self.json(
            {
                "scheduler": self.server.address,
                "time": time.time(),
                "storage": [] if state is None else list(state.roots),
                "runs": [] if state is None else await _off_loop(state.runs, limit),
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
