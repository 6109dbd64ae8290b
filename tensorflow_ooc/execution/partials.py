"""What partition tasks hand up, and the host/device helpers both execution and the
decompositions use: a mode's MTTKRP rows (:class:`Partial`), the thread count of the worker a task
runs on, and a NumPy copy of a NumPy or device array. They live here, below both, so neither layer
imports the other's modules for them (the update imported ``Partial`` from the tasks, and the dense
tasks ``to_host`` from the update: a cycle across the layers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Partial:
    """Rows ``lo .. lo + len(rows) - 1`` of a mode's MTTKRP, and the seconds of the slowest
    partition task that went into it (the MTTKRP time the history reports)."""

    lo: int
    rows: np.ndarray
    seconds: float = 0.0
    # a sampled MTTKRP's reads: nonzeros matched and read, bytes read, chunks, which path
    reads: dict | None = None


def merged_reads(*reads: dict | None) -> dict | None:
    """The reads of several partials as one: counts summed, paths joined."""
    got = [r for r in reads if r]
    if not got:
        return None
    out: dict = {}
    for r in got:
        for k, v in r.items():
            if k == "path":
                paths = set(str(out.get("path", "")).split("+")) - {""}
                out["path"] = "+".join(sorted(paths | {v}))
            else:
                out[k] = out.get(k, 0) + v
    return out


def worker_threads() -> int:
    """Tasks this process may run at once: the Dask worker's thread count (1 outside a worker)."""
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy (or view) of a NumPy or device (CuPy) array."""
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
