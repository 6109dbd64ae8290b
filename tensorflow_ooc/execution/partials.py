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
    partition task that went into it (the MTTKRP time the history reports).

    A *sparse* partial (a sampled MTTKRP whose fibers hit few rows) has ``index``: the sorted,
    distinct row numbers its ``rows`` hold (``lo`` is then 0); every other row is zero."""

    lo: int
    rows: np.ndarray
    seconds: float = 0.0
    # a sampled MTTKRP's reads: nonzeros matched and read, bytes read, chunks, which path
    reads: dict | None = None
    index: np.ndarray | None = None

    def add_into(self, out: np.ndarray, base: int = 0) -> None:
        """Add these rows into ``out``, whose first row is row ``base`` of the mode."""
        if self.index is None:
            out[self.lo - base : self.lo - base + self.rows.shape[0]] += self.rows
        elif self.index.shape[0]:
            out[self.index - base] += self.rows  # distinct rows: one add each, as the dense form's

    @property
    def row_span(self) -> tuple[int, int]:
        """The first row and one past the last row these rows may hold ((lo, lo) when none)."""
        if self.index is None:
            return self.lo, self.lo + self.rows.shape[0]
        if not self.index.shape[0]:
            return 0, 0
        return int(self.index[0]), int(self.index[-1]) + 1


#: a sampled MTTKRP is kept sparse (its hit rows only) when it hits at most 1 / SPARSE_ROWS of the
#: mode's rows: the update then solves, normalizes and sums the Gram over those rows alone
SPARSE_ROWS = 4

#: owner-computes STS-CP: a sketched update's rows (those not zero) that an owner sends every
#: worker at most, so each holds the whole factor's rows that are not zero and draws that mode
#: without asking the owners (``spread`` in ``owner_computes.WorkerState.all_gather``); beyond,
#: only the rows each worker touches travel
SPREAD_ROWS = 1 << 16


def sparse_sum(parts: list[Partial]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of sparse partials as (sorted distinct rows, their rows), each row added in the
    partials' order onto zero, as the dense sum adds them."""
    index = np.unique(np.concatenate([p.index for p in parts])) if parts else np.zeros(0, np.int64)
    R = parts[0].rows.shape[1]
    out = np.zeros((index.shape[0], R), dtype=parts[0].rows.dtype)
    for p in parts:
        if p.index.shape[0]:
            out[np.searchsorted(index, p.index)] += p.rows
    return index, out


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
