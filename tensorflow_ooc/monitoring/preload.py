"""Dask's preload hook for the tfooc page: ``dask scheduler --preload tensorflow_ooc.monitoring``
(Dask reads ``dask_setup`` from the package, which loads it from here)."""

from __future__ import annotations

from typing import Any

import click

from .plugin import MonitorPlugin


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
