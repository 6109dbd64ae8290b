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
:func:`dask_setup` (in :mod:`.preload`) is Dask's preload hook.

The names here load their modules on first use (PEP 562): the command line reads :mod:`.logs`
and :mod:`.tls` on every start, and must not import the scheduler plugin (Dask, bokeh) for it.
Dask finds ``dask_setup`` with ``getattr``, which loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import lazy_names

if TYPE_CHECKING:  # for type checkers, editors and the import contract
    from .http import PAGE_PATH, page_link
    from .plugin import MonitorPlugin, attach
    from .preload import dask_setup

_LAZY = {
    "PAGE_PATH": ".http",
    "page_link": ".http",
    "MonitorPlugin": ".plugin",
    "attach": ".plugin",
    "dask_setup": ".preload",
}

__all__ = ["PAGE_PATH", "MonitorPlugin", "attach", "dask_setup", "page_link"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
