"""The scheduler plugin behind the monitoring page and metrics, and how it gets onto a scheduler.

:class:`MonitorPlugin` is a Dask ``SchedulerPlugin``. On ``start`` it adds the ``/tfooc`` routes to
the scheduler's HTTP server (:mod:`.http`) and its collector to the Prometheus registry that the
scheduler's ``/metrics`` serves (:mod:`.metrics`), and replays the events already logged under
topic ``"tfooc"``; then Dask calls its ``log_event`` hook for every new event, which the workflow
recorder sends with ``Client.log_event`` (:mod:`tensorflow_ooc.workflow.records`).

It gets onto a scheduler in one of two ways:

- :func:`attach` registers it through a client (``Client.register_plugin``, idempotent): the
  embedded cluster and every client that tfooc connects to a scheduler do this, so the page is
  there whenever a tfooc run uses Dask. The scheduler must be able to import tensorflow_ooc.
- ``dask scheduler --preload tensorflow_ooc.monitoring [--tfooc-storage ROOT]`` installs it when the
  scheduler starts (see :func:`tensorflow_ooc.monitoring.dask_setup`): the page then also lists
  the past runs under ROOT before any run has connected.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from . import metrics
from .http import PLUGIN_NAME, install_routes, page_link
from .state import RunsState

log = logging.getLogger(__name__)

TOPIC = "tfooc"


def default_roots() -> list[str]:
    """``$TFOOC_STORAGE`` when set: the storage root a scheduler's environment names."""
    root = os.environ.get("TFOOC_STORAGE")
    return [root] if root else []


class MonitorPlugin(SchedulerPlugin):
    """Keeps the runs of this scheduler (events of topic ``"tfooc"``) for the page and metrics.

    Parameters
    ----------
    storage : list of str, optional
        Storage roots whose past runs are listed (with the scheduler's ``$TFOOC_STORAGE``); more
        are learnt from the events of runs, which carry their root.
    """

    name = PLUGIN_NAME
    idempotent = True  # a second client registering it keeps the running one and its state

    def __init__(self, storage: list[str] | None = None) -> None:
        self.storage = list(storage or [])
        self.state: RunsState | None = None
        self.scheduler: Any = None

    def __getstate__(self) -> dict:
        # sent to the scheduler by Client.register_plugin before it starts: only the settings
        return {"storage": self.storage}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state.get("storage"))

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        if self.state is None:
            self.state = RunsState(self.storage + default_roots())
        for _, msg in scheduler.get_events(TOPIC):  # runs that began before this plugin
            self.state.apply(msg)
        install_routes(scheduler)
        metrics.register(self)

    async def close(self) -> None:
        metrics.unregister(self)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TOPIC and self.state is not None and isinstance(msg, dict):
            self.state.apply(msg)


def _add_roots(dask_scheduler: Any, roots: list[str]) -> bool:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or plugin.state is None:
        return False
    for root in roots:
        plugin.state.add_root(root)
    return True


def attach(client: Any, storage: str | list[str] | None = None) -> str | None:
    """Install the monitoring plugin on ``client``'s scheduler; returns the page's URL.

    Idempotent (a plugin already there, from a preload or an earlier client, is kept) and never
    raises: monitoring must not stop a run. The page link is logged, as the dashboard's is.
    """
    if not hasattr(client, "register_plugin"):  # the inline client: no scheduler, no page
        return None
    roots = [storage] if isinstance(storage, str) else list(storage or [])
    try:
        client.register_plugin(MonitorPlugin(roots))
        if roots:
            client.run_on_scheduler(_add_roots, roots=roots)
    except Exception as exc:
        log.warning(
            "monitoring page not installed on the scheduler (%s: %s); start the scheduler with "
            "--preload tensorflow_ooc.monitoring where tensorflow_ooc is installed",
            type(exc).__name__,
            exc,
        )
        return None
    link = page_link(getattr(client, "dashboard_link", None))
    if link:
        log.info("tfooc monitoring page: %s  (Prometheus metrics: %s)", link, link.rsplit("/tfooc", 1)[0] + "/metrics")
    return link
