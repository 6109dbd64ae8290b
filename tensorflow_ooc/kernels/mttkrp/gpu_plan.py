"""Launch plans for the GPU kernels (host side, no arithmetic on nonzeros).

- :func:`device_tiles` cuts a batch's work items into thread-block tiles. A tile never crosses a
  format block, so it carries one base (the block map of seed 001 section 4.2, kept at thread-block
  boundaries): any number of small blocks run in one launch.
- :func:`choose_conflict` is the adaptation heuristic of section 5.3: hierarchical resolution when
  the target mode is shorter than the number of SMs (atomics on few rows contend), else
  register-based.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import WorkItems

CONFLICT_CHOICES = ("auto", "hierarchical", "register")
DEFAULT_COPIES = 8  # global output copies for hierarchical resolution (one per GPC on an H100)


@dataclass
class TileTable:
    """Thread-block tiles of a batch.

    start, end : int64 (T,)      nonzero range of each tile
    item : int64 (T,)            work item each tile belongs to
    base : int64 (T, N)          block base coordinates of each tile
    lo : int64 (T, N)            smallest index per mode in the tile's work item (stash window)
    item_first_tile : int64 (K + 1,)   tiles of item k are ``item_first_tile[k] .. [k + 1]``
    """

    start: np.ndarray
    end: np.ndarray
    item: np.ndarray
    base: np.ndarray
    lo: np.ndarray
    item_first_tile: np.ndarray

    @property
    def ntiles(self) -> int:
        return int(self.start.shape[0])


def device_tiles(items: WorkItems, tile_nnz: int) -> TileTable:
    """Tiles of at most ``tile_nnz`` nonzeros, each inside one work item (and so one block)."""
    n = items.end - items.start
    pieces = np.where(n > 0, -(-n // tile_nnz), 0).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(pieces)]).astype(np.int64)
    T = int(first[-1])
    item = np.repeat(np.arange(items.nitems, dtype=np.int64), pieces)
    within = np.arange(T, dtype=np.int64) - first[:-1][item]
    start = items.start[item] + within * tile_nnz
    end = np.minimum(start + tile_nnz, items.end[item])
    N = items.base.shape[1]
    base = np.ascontiguousarray(items.base[item], dtype=np.int64) if T else np.zeros((0, N), np.int64)
    lo = np.ascontiguousarray(items.lo[item], dtype=np.int64) if T else np.zeros((0, N), np.int64)
    return TileTable(start.astype(np.int64), end.astype(np.int64), item, base, lo, first)


def choose_conflict(rows: int, sm_count: int, conflict: str = "auto", threshold: int | None = None) -> str:
    """``hierarchical`` when the target has fewer rows than ``threshold`` (default: the SM count),
    else ``register``; an explicit ``conflict`` wins."""
    if conflict not in CONFLICT_CHOICES:
        raise ValueError(f"conflict must be one of {CONFLICT_CHOICES}, got {conflict!r}")
    if conflict != "auto":
        return conflict
    limit = sm_count if threshold is None else int(threshold)
    return "hierarchical" if rows < limit else "register"


def copies_for(rows: int, rank: int, itemsize: int, budget_bytes: int, copies: int = DEFAULT_COPIES) -> int:
    """Global copies for hierarchical resolution: ``copies``, fewer if they would pass the budget."""
    one = max(1, rows * rank * itemsize)
    return int(max(1, min(copies, budget_bytes // one)))
