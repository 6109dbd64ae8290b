"""Work items and the conflict-resolution plan for CPU MTTKRP (orchestration, no arithmetic).

Work items are fixed-size runs of the ALTO order cut at block boundaries. Their size does not
depend on the thread count, so the private-accumulator path gives bit-identical results for any
number of threads.

Heuristic (per target mode and item, ``conflict="auto"``): an item uses a private accumulator
over its row interval when the interval has at most ``PRIVATE_REUSE`` rows per nonzero of the
item (zeroing and merging the interval then costs less than one atomic update per segment);
otherwise it uses atomic adds. If the private buffers of all items together would exceed
``max_private_bytes``, items with the longest intervals are switched to atomics until they fit,
so the overhead never grows with threads x mode length beyond the bound.

Register accumulation of runs (consecutive nonzeros with one target row) is always used with
atomics; a private item uses it when its average run in the target mode is at least
``RUN_LENGTH_MIN`` nonzeros, since for shorter runs the extra local vector costs more than the
L1-resident private row it would spare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...format import BitLayout
from .cpu import item_profile

ITEM_NNZ = 1 << 16
PRIVATE_REUSE = 4
RUN_LENGTH_MIN = 2.0
DEFAULT_MAX_PRIVATE_BYTES = 256 << 20
STRATEGIES = ("auto", "private", "atomic", "owned", "threads")


@dataclass
class WorkItems:
    """Contiguous nonzero ranges, each inside one block, with their per-mode index intervals."""

    index: np.ndarray  # uint64 (nnz,)
    values: np.ndarray  # (nnz,)
    start: np.ndarray  # int64 (K,)
    end: np.ndarray  # int64 (K,)
    base: np.ndarray  # int64 (K, N)
    lo: np.ndarray  # int64 (K, N)
    hi: np.ndarray  # int64 (K, N)
    changes: np.ndarray  # int64 (K, N) target-row changes along the item, per mode
    prev: np.ndarray | None = None  # uint64 (K,) with ``delta``: ALTO word before each item
    delta: bool = False  # ``index`` holds Delta differences of low ALTO words (streamed chunks)
    sorted_mode: int = -1  # each item's nonzeros are sorted by this mode's index (-1: ALTO order)
    # mode-sorted items: (ptr (runs + 1,), rows (runs,), run_item (runs,)), int64, the runs of one
    # target row inside an item: nonzeros ptr[r] .. ptr[r + 1] of item run_item[r] hit row rows[r]
    # (kernels/mttkrp/mode_order.py; None where no table was made)
    runs: tuple | None = None

    def __post_init__(self) -> None:
        if self.prev is None:
            self.prev = np.zeros(self.start.shape[0], dtype=np.uint64)

    @property
    def nitems(self) -> int:
        return int(self.start.shape[0])

    @property
    def nnz(self) -> np.ndarray:
        return self.end - self.start

    def masks(self, layout: BitLayout) -> np.ndarray:
        """Each mode's mask as the kernels take it: the ``pext`` mask of its bits in the ALTO
        word for Delta items, its field mask in the re-encoded index otherwise."""
        return layout.pext_masks if self.delta else layout.field_mask

    def kernel_args(self, layout: BitLayout) -> tuple:
        """The arguments every item kernel takes first: ``index, values, start, end, base, prev``,
        then the layout's field shifts and :meth:`masks`."""
        return (
            self.index,
            self.values,
            self.start,
            self.end,
            self.base,
            self.prev,
            layout.field_shift,
            self.masks(layout),
        )


def balanced_bounds(sizes: np.ndarray, threads: int) -> np.ndarray:
    """Bounds of ``threads`` contiguous shares of ``len(sizes)`` pieces (items, pieces, runs)
    holding about equal totals of ``sizes``: share ``g`` is ``bounds[g] .. bounds[g + 1]``."""
    n = sizes.shape[0]
    cum = np.cumsum(sizes)
    T = max(1, int(threads))
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, T) / T, side="right") if n else np.zeros(T - 1, np.int64)
    return np.concatenate([[0], np.minimum(cuts, n), [n]]).astype(np.int64)


def thread_shares(items: WorkItems, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Items split into ``threads`` contiguous shares of about equal nonzeros, for kernels that
    give each numba thread its own output copy: share ``g`` is ``todo[bounds[g]:bounds[g + 1]]``."""
    todo = np.arange(items.nitems, dtype=np.int64)
    cum = np.cumsum(items.end - items.start)
    total = int(cum[-1]) if cum.size else 0
    cuts = np.searchsorted(cum, [total * g // threads for g in range(1, threads)], side="left")
    bounds = np.concatenate([[0], np.minimum(cuts + 1, todo.size), [todo.size]]).astype(np.int64)
    return bounds, todo


def items_starting_in(items: WorkItems, lo: int, hi: int) -> WorkItems:
    """The items of ``items`` whose first nonzero lies in positions ``[lo, hi)``, with their index
    and values copied out (positions renumbered from 0), so the rest can be freed."""
    keep = (items.start >= lo) & (items.start < hi)
    start, end = items.start[keep], items.end[keep]
    a = int(start[0]) if start.shape[0] else 0
    b = int(end[-1]) if end.shape[0] else 0
    return WorkItems(
        np.array(items.index[a:b]),
        np.array(items.values[a:b]),
        start - a,
        end - a,
        items.base[keep],
        items.lo[keep],
        items.hi[keep],
        items.changes[keep],
        items.prev[keep],
        items.delta,
        items.sorted_mode,
    )


def work_items(
    index: np.ndarray,
    values: np.ndarray,
    seg_start: np.ndarray,
    seg_end: np.ndarray,
    seg_base: np.ndarray,
    layout: BitLayout,
    item_nnz: int = ITEM_NNZ,
) -> WorkItems:
    """Cut block segments ``[seg_start, seg_end)`` (positions in ``index``) into work items."""
    starts, ends, bases = [], [], []
    for s, e, b in zip(seg_start.tolist(), seg_end.tolist(), seg_base):
        n = e - s
        if n <= 0:
            continue
        pieces = max(1, -(-n // item_nnz))
        cuts = s + (np.arange(pieces + 1) * n) // pieces
        starts.append(cuts[:-1])
        ends.append(cuts[1:])
        bases.append(np.repeat(np.asarray(b, dtype=np.int64)[None, :], pieces, axis=0))
    N = layout.nmodes
    start = np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64)
    end = np.concatenate(ends).astype(np.int64) if ends else np.zeros(0, np.int64)
    base = np.concatenate(bases) if bases else np.zeros((0, N), np.int64)
    lo = np.empty((start.shape[0], N), dtype=np.int64)
    hi = np.empty((start.shape[0], N), dtype=np.int64)
    changes = np.empty((start.shape[0], N), dtype=np.int64)
    item_profile(index, start, end, base, layout.field_shift, layout.field_mask, lo, hi, changes)
    return WorkItems(index, values, start, end, base, lo, hi, changes)


@dataclass
class ConflictPlan:
    """How each work item resolves conflicts for one target mode.

    Attributes
    ----------
    private : bool (K,)    item accumulates privately (else atomics)
    runs : bool (K,)       item sums runs of one target row before writing
    offset, size : int64 (K,)   first row and row count in the private buffer (rows of R)
    private_bytes : int    memory of all private accumulators
    """

    mode: int
    rank: int
    strategy: str
    private: np.ndarray
    runs: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    private_bytes: int

    def summary(self) -> dict:
        return {
            "mode": self.mode,
            "strategy": self.strategy,
            "items": int(self.private.shape[0]),
            "private_items": int(self.private.sum()),
            "atomic_items": int((~self.private).sum()),
            "run_items": int(self.runs.sum()),
            "private_bytes": int(self.private_bytes),
        }


def plan_conflicts(
    items: WorkItems,
    mode: int,
    rank: int,
    itemsize: int,
    strategy: str = "auto",
    max_private_bytes: int = DEFAULT_MAX_PRIVATE_BYTES,
) -> ConflictPlan:
    """Choose private accumulation or atomics per item (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"conflict must be one of {STRATEGIES}, got {strategy!r}")
    rows = np.maximum(items.hi[:, mode] - items.lo[:, mode] + 1, 0)
    cost = rows * rank * itemsize
    if strategy in ("atomic", "owned", "threads"):
        private = np.zeros(items.nitems, dtype=bool)
    elif strategy == "private":
        private = np.ones(items.nitems, dtype=bool)
        if cost.sum() > max_private_bytes:
            raise MemoryError(
                f"private accumulators for mode {mode} need {cost.sum() / 2**20:.1f} MiB, over the "
                f"{max_private_bytes / 2**20:.1f} MiB bound; use conflict='auto' or 'atomic', or raise "
                "max_private_bytes"
            )
    else:
        private = rows <= PRIVATE_REUSE * items.nnz
        total = int(cost[private].sum())
        if total > max_private_bytes:
            for k in np.argsort(-np.where(private, rows, -1), kind="stable"):
                if total <= max_private_bytes or not private[k]:
                    break
                private[k] = False
                total -= int(cost[k])
    runs = (items.nnz >= RUN_LENGTH_MIN * np.maximum(items.changes[:, mode], 1)) | ~private
    size = np.where(private, rows, 0).astype(np.int64)
    offset = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
    return ConflictPlan(mode, rank, strategy, private, runs, offset, size, int(size.sum()) * rank * itemsize)
