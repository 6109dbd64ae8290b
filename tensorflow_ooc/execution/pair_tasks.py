"""MTTKRPs of a decoded partition's memoized mode pairs (:mod:`~tensorflow_ooc.kernels.mttkrp.mode_pairs`).

A pair ``(a, b)``'s memo ``Z`` holds the sums over the modes other than ``a`` and ``b``: valid while
those factors stay as they were. A CP-ALS sweep of one task (``graph._modes_then``) updates ``a``
then ``b``, so the memo the mode-``a`` pass fills serves mode ``b``; :class:`PairMemo` holds it
for that one step and nothing else. Without a memo (a mode's own task) mode ``b`` fills it first.
The wrap pair ``(N - 1, 0)`` spans two sweep tasks: its memo stays with the pair, with a copy of
the factor rows it was made from, and mode 0 uses it where they are unchanged
(:meth:`~tensorflow_ooc.kernels.mttkrp.mode_pairs.ModePair.memo_holds`), else fills it first.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..kernels import StackedFactors
from ..kernels.mttkrp.dispatch import numba_threads, threads_for
from ..kernels.mttkrp.mode_pairs import ModePair, other_fits, pair_first, pair_other, pair_second
from .output_buffers import zeroed_output
from .partials import Partial


class PairMemo:
    """The memo of the pair whose first mode the sweep's step before filled (one sweep task's own,
    or an owner-computes worker's for one of its partitions: :meth:`forget` at every step that is
    not that pair's second mode). ``served`` counts the second modes it served."""

    def __init__(self) -> None:
        self.pair: ModePair | None = None
        self.Z: np.ndarray | None = None
        self.served = 0

    def forget(self) -> None:
        self.pair = self.Z = None

    def holds(self, pair: ModePair) -> bool:
        return self.pair is pair and self.Z is not None


def pair_partition(
    source: Any, factors: StackedFactors, mode: int, threads: int = 1, memo: PairMemo | None = None
) -> Partial:
    """Mode-``mode`` MTTKRP of a decoded partition through the memoized pair that holds ``mode``.

    Mode ``a`` fills the memo from ``factors`` (kept in ``memo`` where given) and adds its output;
    mode ``b`` reads the memo ``memo`` holds for the pair (filled the step before, from factors
    of the other modes that have not changed since), or the wrap pair's kept memo where the
    other modes' rows are those it was made from, else fills one first.

    Parameters
    ----------
    source : tasks.PartitionData
        With ``mode`` in its ``mode_pairs`` (typed loosely: the tasks module imports this one).
    factors : StackedFactors
        The current factors (mode ``mode``'s rows are not read).
    mode : int
        The target mode.
    threads : int
        Numba threads.
    memo : PairMemo, optional
        The sweep's memo; None: a memo of this call alone.
    """
    t0 = time.perf_counter()
    pair = source.mode_pairs[mode]
    lo, hi = source.part.row_lo[mode], source.part.row_hi[mode]
    out = zeroed_output((hi - lo + 1, factors.rank), factors.dtype)
    F, offs = factors.data, factors.offsets
    with numba_threads(threads_for(threads, pair.nnz)):
        if mode == pair.a:
            Z = _fill(pair, factors, out, lo)
            if memo is not None:
                memo.pair, memo.Z = pair, Z
        else:
            if memo is not None and memo.holds(pair):
                Z = memo.Z
                memo.served += 1
            elif pair.wraps and pair.memo_holds(factors):
                Z = pair.memo(factors.rank, factors.dtype)
            else:
                Z = _fill(pair, factors, None, lo)
            pair_second(pair, F, offs, Z, out, lo)
            if memo is not None:
                memo.forget()
    return Partial(lo, out, time.perf_counter() - t0)


def _fill(pair: ModePair, factors: StackedFactors, out: np.ndarray | None, lo: int) -> np.ndarray:
    """The pair's memo filled from ``factors`` (and mode ``a``'s rows added to ``out`` from row
    ``lo``, where given); the wrap pair's records the factor rows it was made from."""
    Z = pair.memo(factors.rank, factors.dtype)
    pair.forget_memo()
    pair_first(pair, factors.data, factors.offsets, Z, out, lo)
    if pair.wraps:
        pair.keep_memo(factors)
    return Z


def outside_pair(source: Any, factors: StackedFactors, mode: int) -> ModePair | None:
    """The pair whose copy serves ``mode``, a mode of no pair (the one of fewest distinct pairs
    among those :func:`~tensorflow_ooc.kernels.mttkrp.mode_pairs.other_fits` allows), or None."""
    rows = int(source.part.row_hi[mode]) + 1
    pairs = {id(p): p for p in source.mode_pairs.values()}.values()
    fits = [p for p in pairs if other_fits(p, mode, rows, factors.rank, factors.dtype.itemsize)]
    return min(fits, key=lambda p: p.groups) if fits else None


def pair_other_partition(source: Any, pair: ModePair, factors: StackedFactors, mode: int, threads: int = 1) -> Partial:
    """Mode-``mode`` MTTKRP of a decoded partition from ``pair``'s copy (``mode`` in no pair; see
    :func:`~tensorflow_ooc.kernels.mttkrp.mode_pairs.pair_other`): the sweep then streams one copy of
    the nonzeros for every mode, where mode-sorted copies stream one more array a mode."""
    t0 = time.perf_counter()
    lo, hi = source.part.row_lo[mode], source.part.row_hi[mode]
    out = zeroed_output((hi - lo + 1, factors.rank), factors.dtype)
    with numba_threads(threads_for(threads, pair.nnz)):
        pair_other(pair, factors.data, factors.offsets, mode, out, lo)
    return Partial(lo, out, time.perf_counter() - t0)
