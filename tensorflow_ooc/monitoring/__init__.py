"""Monitoring on Dask's own machinery: a page on the dashboard, Prometheus metrics, structured logs.

- :mod:`.plugin`: the scheduler plugin (``/tfooc`` page, ``tfooc_*`` metrics on ``/metrics``,
  fed by the ``"tfooc"`` event topic) and :func:`attach`, which tfooc's clients call;
- :mod:`.state`: run views from run events and records;
- :mod:`.http`, :mod:`.page`: the routes and the page;
- :mod:`.metrics`: the Prometheus collector;
- :mod:`.logs`: JSON log lines and log lines that do not break progress bars;
- :mod:`.tls`: Dask TLS settings from the command line.

On a scheduler you start yourself::

    dask scheduler --preload tensorflow_ooc.monitoring --tfooc-storage /data

(``--tfooc-storage`` may be repeated, and defaults to ``$TFOOC_STORAGE``): this module's
:func:`dask_setup` is Dask's preload hook.
"""

from __future__ import annotations

from typing import Any

import click

from .http import PAGE_PATH, page_link
from .plugin import MonitorPlugin, attach


@click.command(name="tfooc-monitoring")
@click.option(
    "--tfooc-storage",
    multiple=True,
    metavar="ROOT",
    help="storage root whose run records the tfooc page lists (repeatable; default $TFOOC_STORAGE)",
)
def dask_setup(dask_server: Any, tfooc_storage: tuple[str, ...] = ()) -> None:
    """Dask preload hook: ``dask scheduler --preload tensorflow_ooc.monitoring``.

    Adds :class:`MonitorPlugin` to the scheduler, which starts it with the scheduler. On a worker
    or nanny (``dask worker --preload ...``) it does nothing: the page lives on the scheduler.
    """
    from distributed import Scheduler

    if isinstance(dask_server, Scheduler):
        dask_server.add_plugin(MonitorPlugin(list(tfooc_storage)), idempotent=True)


__all__ = ["PAGE_PATH", "MonitorPlugin", "attach", "dask_setup", "page_link"]
