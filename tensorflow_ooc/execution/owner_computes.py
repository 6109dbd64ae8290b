"""Owner-computes execution: each worker owns fixed partitions and the factor rows it updates.

The layout (SPLATT's MPI code; seed 000, chapter 4):

- **Partitions** are pinned: worker ``w`` of ``W`` keeps a contiguous, nonzero-balanced run of the
  store's partitions (decoded in its memory, or streamed from the store every mode).
- **Rows.** For each mode, every row some nonzero touches is owned by the worker with the most
  nonzeros in it (ties to the lower rank), so most rows are owned where they are used. A worker
  holds the factor rows its nonzeros touch, up to date, and the rows it owns.
- **A mode** (:class:`WorkerState`): the local MTTKRP of the worker's partitions; its rows go to
  their owners (a *sparse reduce-scatter*: to owner ``k`` only the rows ``k`` owns that this worker
  touches); each owner sums them and solves its rows; the R x R Gram terms and column statistics
  are all-reduced, and each owner sends every other worker the updated rows it touches (a
  *sparse all-gather*), never whole factors.

Per mode and iteration a worker sends, to each other worker, exactly the rows they share, twice
(partials one way, updated rows back). The lower bound of this distribution is that count times
R times the item size, each way (:attr:`OwnerPlan.lower_bound_bytes`); the history reports the
bytes sent beside it.

The driver side (:class:`OwnerComputes`) plans the ownership once from each worker's row counts,
then submits one task per worker and iteration, which runs every mode, exchanging rows worker to
worker (:mod:`.exchange`), and returns one small summary. The update math itself is the caller's
(the decompositions layer passes its iteration function down, as it passes its mode update to the
task graphs).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from distributed import Client, wait

from ..format import delinearize
from ..kernels import StackedFactors
from ..kernels.mttkrp.dispatch import numba_threads
from ..kernels.update.column_scale import nonzero_rows, scale_columns
from .cluster import scheduler_workers
from .exchange import ExchangeAborted, ExchangePlugin, Team, abort_run, task_released
from .fiber_reads import indexed_sampled_partial
from .pair_tasks import PairMemo, pair_partition
from .partials import Partial
from .partitions import Partition, contiguous_runs, split_nonzeros
from .stream import BatchBuffers, fill_batch
from .tasks import PartitionData, cached_store, combine, load_partition, mttkrp_partition, sampled_partition

log = logging.getLogger(__name__)


class TeamLost(RuntimeError):
    """A worker of an owner-computes run left the cluster (its partitions and rows with it)."""


# ---------------------------------------------------------------- worker side ---------------------


@dataclass
class ModePlan:
    """One mode's rows, from one worker's side: the rows it owns (sorted), and per other rank ``k``
    the rows it touches that ``k`` owns (``send[k]``: its partial rows go there, updated rows come
    back) and the rows it owns that ``k`` touches (``recv[k]``: positions in ``owned``)."""

    owned: np.ndarray
    send: dict[int, np.ndarray]
    recv_pos: dict[int, np.ndarray]
    # sampled rounds read through the fiber index: every touched row of the mode (sorted) and its
    # owner's rank, so the rows a gather hits go to their owners, whoever touches them
    directory: tuple[np.ndarray, np.ndarray] | None = None
    # the rows this worker touches (sorted; the owned rows among them), per other rank ``k`` the
    # rows both touch, and whether the mode is exchanged in one message round: every worker that
    # touches a row gets every other's partial of it and solves it itself
    # (:meth:`WorkerState.exchange_partials`), instead of the partials going to the owner and the
    # solved row back (two rounds)
    touched: np.ndarray | None = None
    shared: dict[int, np.ndarray] = field(default_factory=dict)
    one_round: bool = False
    # one round, and every worker touches every row (vast-shaped tensors' length-2 mode): each
    # then solves the whole mode and takes its terms itself, with no all-reduce
    whole: bool = False

    @property
    def span(self) -> tuple[int, int] | None:
        """``(first, last + 1)`` when the owned rows are one contiguous range (a mode whose top
        index bits the ALTO order splits between the workers), else None: then they are read and
        written as slices, not gathered and scattered."""
        return _range_of(self.owned)

    @property
    def touched_span(self) -> tuple[int, int] | None:
        """``(first, last + 1)`` when the touched rows are one contiguous range, else None."""
        return _range_of(self.touched)


def _range_of(rows: np.ndarray | None) -> tuple[int, int] | None:
    if rows is not None and rows.shape[0] and int(rows[-1]) - int(rows[0]) + 1 == rows.shape[0]:
        return int(rows[0]), int(rows[-1]) + 1
    return None


@dataclass
class WorkerState:
    """What a worker keeps for one owner-computes run, and the steps of a mode it offers the
    iteration function: :meth:`local_mttkrp`, :meth:`reduce_scatter`, :meth:`all_gather`."""

    team: Team
    sources: list  # PartitionData (in memory) or (path, Partition) (streamed)
    factors: StackedFactors  # every row this worker's nonzeros touch is current; others unused
    grams: list[np.ndarray]
    plans: list[ModePlan]
    threads: int
    batch_nnz: int
    max_private_bytes: int
    device: str = "cpu"  # where the local MTTKRP runs ("gpu": this worker's GPU)
    device_options: Any = None
    path: str = ""  # the store
    index_modes: frozenset = frozenset()  # modes whose sampled rounds read the store's fiber index
    weights: np.ndarray = field(default_factory=lambda: np.ones(0))
    sampler: Any = None  # randomized CP-ALS: the worker's part of the distributed sampler
    model: Any = None  # the decomposition's own state here (CP-APR: weights, Phi masks, rows no nonzero touches)
    # sparse rows: per (mode, rank), the positions in ``plans[mode].send[rank]`` of the received
    # rows that are not zero, and per (mode, -1) those of the owned rows (the others are zero)
    live: dict = field(default_factory=dict)
    # per source, the memo of its memoized mode pair whose first mode the sweep ran last
    # (:mod:`.pair_tasks`): a CP-ALS iteration updates mode a, then a + 1, on this one task
    memos: list = field(default_factory=list)
    # the run's tasks on this worker in submission order: ``done`` counts those finished, ``last``
    # is the latest iteration's summary, ``turn`` wakes the next one
    done: int = 0
    last: Any = None
    used: float = field(default_factory=time.monotonic)  # when a task of the run last ended here
    turn: threading.Condition = field(default_factory=threading.Condition)

    def wait_turn(self, seq: int) -> None:
        """Block until the run's tasks before number ``seq`` on this worker are done (a task
        submitted ahead waits here, on the worker, instead of for a scheduler round trip)."""
        box = self.team._box()
        with self.turn:
            while self.done < seq:
                if self.team.run in box.aborted:
                    raise ExchangeAborted(f"run {self.team.run} was aborted")
                if task_released():  # the driver is gone: the task before may never come
                    raise ExchangeAborted(f"run {self.team.run}: its driver released this task")
                self.turn.wait(0.2)

    def end_turn(self) -> None:
        with self.turn:
            self.used = time.monotonic()
            self.done += 1
            self.turn.notify_all()

    @property
    def nmodes(self) -> int:
        return len(self.factors.shape)

    def local_mttkrp(
        self, mode: int, poisson_eps: float | None = None, in_turn: bool = False, memo_scale: np.ndarray | None = None
    ) -> Partial:
        """The mode-``mode`` MTTKRP rows of this worker's partitions (one partial over the rows
        they touch); with ``poisson_eps``, CP-APR's Phi instead (the kernels' Poisson form: each
        value over ``max(model value, poisson_eps)``, the mode's rows of the factors holding the
        model's, see :func:`~.tasks.mttkrp_partition`).

        ``in_turn``: the caller runs the modes in turn, each after the update of the one before
        (a CP-ALS sweep): a partition's memoized pair ``(a, a + 1)`` keeps the memo mode ``a``
        filled for mode ``a + 1``, whose MTTKRP is then a pass over the memo (:mod:`.pair_tasks`).
        Without it each pair mode fills a memo of its own.

        ``memo_scale`` (R,): the column scaling applied, since the step before filled the memo, to
        a factor the memo was summed from (a normalization one mode late,
        :meth:`exchange_partials`); the rows served from such a memo are scaled by it."""
        if len(self.memos) != len(self.sources):
            self.memos = [PairMemo() for _ in self.sources]
        parts = []
        for src, memo in zip(self.sources, self.memos):
            if in_turn and poisson_eps is None and mode in getattr(src, "mode_pairs", {}):
                pair = src.mode_pairs[mode]
                stale = memo_scale is not None and mode == pair.b and memo.holds(pair)
                parts.append(pair_partition(src, self.factors, mode, self.threads, memo))
                if stale:
                    scale_columns(parts[-1].rows, memo_scale)
                continue
            memo.forget()  # any other step may change the factors the memo was summed from
            parts.append(
                mttkrp_partition(
                    src,
                    self.factors,
                    mode,
                    self.threads,
                    batch_nnz=self.batch_nnz,
                    max_private_bytes=self.max_private_bytes,
                    device=self.device,
                    device_options=self.device_options,
                    poisson_eps=poisson_eps,
                )
            )
        if not parts:
            return Partial(0, np.zeros((0, self.factors.rank), dtype=self.factors.dtype))
        return parts[0] if len(parts) == 1 else combine(*parts)

    def local_sampled_mttkrp(self, mode: int, samples: Any) -> Partial:
        """The mode-``mode`` *sampled* MTTKRP rows of this worker's partitions for randomized
        CP-ALS: the nonzeros of the fibers of ``samples`` (a
        :class:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet`) that lie in them."""
        parts = [sampled_partition(src, samples, mode, self.threads, self.batch_nnz) for src in self.sources]
        if not parts:
            return Partial(0, np.zeros((0, self.factors.rank), dtype=samples.rows.dtype))
        return parts[0] if len(parts) == 1 else combine(*parts)

    def index_sampled_mttkrp(self, mode: int, samples: Any) -> Partial:
        """The mode-``mode`` *sampled* MTTKRP of this worker's share of the sample keys (one range
        of keys a rank, so each fiber is read once), through the store's fiber index: its rows
        may be any rows of the mode, which :meth:`scatter_to_owners` sends to their owners."""
        return indexed_sampled_partial(self.path, samples, mode, self.threads, (self.team.rank, self.team.size))

    def scatter_to_owners(self, mode: int, partial: Partial, tag: Any) -> SparseRows:
        """Send each owner the rows of ``partial`` that are not zero and that it owns, with their
        row numbers (the rows of an index gather are not those this worker's partitions touch);
        return the rows this worker owns, summed over every worker's partial in rank order, as
        :class:`SparseRows` over the owned rows (a dense ``len(owned) x R`` result and the scan
        for its rows not zero cost 40-70 ms a mode at 2.4 M owned rows where ~100 were hit)."""
        plan = self.plans[mode]
        if plan.directory is None:
            raise RuntimeError(f"owner-computes: mode {mode} has no row directory for index reads")
        if partial.index is not None:
            ids, rows = partial.index, partial.rows
        else:
            live = nonzero_rows(partial.rows)
            ids, rows = live + partial.lo, partial.rows[live]
        known, owners = plan.directory
        at = np.searchsorted(known, ids)
        if ids.shape[0] and (at.max() >= known.shape[0] or not np.array_equal(known[at], ids)):
            raise RuntimeError(f"owner-computes: mode {mode}: a fiber index gather hit rows no partition holds")
        W, me = self.team.size, self.team.rank
        share = [[ids[sel], rows[sel]] for sel in (owners[at] == k for k in range(W))]
        self.team.send_many(tag, {k: share[k] for k in range(W) if k != me})
        got = [share[me] if k == me else self.team.receive(tag, k) for k in range(W)]
        positions = [np.searchsorted(plan.owned, np.asarray(g[0])) for g in got]
        values = [np.asarray(g[1], dtype=self.factors.dtype).reshape(-1, rows.shape[1]) for g in got]
        return owner_sums(positions, values, int(plan.owned.shape[0]))

    def sum_everywhere(self, mode: int, partial: Partial, tag: Any, limit: int) -> SparseRows | None:
        """Every worker's rows of ``partial`` that are not zero, summed in rank order, on every
        worker alike, as :class:`SparseRows` over all of the mode's rows (``hit`` are row numbers):
        each worker sends them all to every other one (one message round, no owners), where each
        has at most ``limit`` of them; None where some worker had more (it sent only that: the
        caller then sends the rows to their owners)."""
        if partial.index is not None:
            ids, rows = partial.index, partial.rows
        else:
            live = nonzero_rows(partial.rows)
            ids, rows = live + partial.lo, partial.rows[live]
        W, me, R = self.team.size, self.team.rank, self.factors.rank
        mine = [ids, rows] if ids.shape[0] <= limit else None
        self.team.send_many(tag, {k: mine for k in range(W) if k != me})
        got = [mine if k == me else self.team.receive(tag, k) for k in range(W)]
        if any(g is None for g in got):
            return None
        positions = [np.asarray(g[0], dtype=np.int64) for g in got]
        values = [np.asarray(g[1], dtype=self.factors.dtype).reshape(-1, R) for g in got]
        return owner_sums(positions, values, int(self.factors.shape[mode]))

    def set_rows_everywhere(self, mode: int, ids: np.ndarray, rows: np.ndarray, scale: np.ndarray) -> None:
        """Write the mode's new rows that are not zero, ``rows`` (numbered ``ids``, sorted; every
        worker has all of them, :meth:`sum_everywhere`) times ``scale``, where this worker holds
        them (the rows it owns or touches); the rows that were not zero before are zeroed. Keeps
        the record :meth:`set_rows` keeps of the rows not zero."""
        plan, view = self.plans[mode], self.factors.views[mode]
        before = self.live.get((mode, -1))
        if before is None and plan.span is not None:
            view[plan.span[0] : plan.span[1]] = 0
        else:
            view[plan.owned if before is None else plan.owned[before]] = 0
        for k, theirs in plan.send.items():
            before = self.live.get((mode, k))
            view[theirs if before is None else theirs[before]] = 0
        for k, held in [(-1, plan.owned)] + list(plan.send.items()):
            at = np.minimum(np.searchsorted(held, ids), max(held.shape[0] - 1, 0))
            found = np.flatnonzero(held[at] == ids) if held.shape[0] else at[:0]
            view[ids[found]] = rows[found] * scale
            self.live[(mode, k)] = at[found]
        self.factors_written()

    def reduce_scatter(self, mode: int, partial: Partial, tag: Any, sparse: bool = False) -> np.ndarray:
        """Send each owner the rows of ``partial`` it owns; return the rows this worker owns,
        summed over every worker's partial in rank order (``len(owned) x R``). With ``sparse``
        only the rows that are not zero travel, with their positions (a sampled MTTKRP's rows are
        zero but where a sampled fiber holds a nonzero: STS-CP at 86 M sent 1.18 GB an iteration
        of mostly zero rows)."""
        plan = self.plans[mode]
        rows = partial.rows
        # the sends are copies (fancy indexing): they leave while this worker goes on
        if sparse:  # one pass finds the rows that are not zero; only those are copied
            live = rows.any(axis=1)
            self.team.send_many(tag, {k: _pack_live(rows, ids - partial.lo, live) for k, ids in plan.send.items()})
        else:
            self.team.send_many(tag, {k: rows[ids - partial.lo] for k, ids in plan.send.items()})
        span = plan.span
        if span is not None:
            # owned rows in one range: summed where the partial holds them (a view; the partial
            # is this mode's own buffer), the other workers' rows added in rank order: no gather
            # and scatter of the owned rows (docs/EXECUTION.md, "Measurements")
            out = rows[span[0] - partial.lo : span[1] - partial.lo]
            for k in range(self.team.size):
                if k in plan.recv_pos:
                    _add(out, plan.recv_pos[k], self.team.receive(tag, k))
            return out
        out = np.zeros((plan.owned.shape[0], self.factors.rank), dtype=self.factors.dtype)
        for k in range(self.team.size):
            if k == self.team.rank:
                if plan.owned.shape[0]:
                    out += rows[plan.owned - partial.lo]
            elif k in plan.recv_pos:
                _add(out, plan.recv_pos[k], self.team.receive(tag, k))
        return out

    def all_reduce(self, small: np.ndarray, tag: Any) -> np.ndarray:
        """Send every other worker ``small`` (a few terms); return every rank's, stacked in rank
        order (each worker sums or maxes them in the same order: the same result on every one)."""
        small = np.asarray(small)
        self.team.send_many(tag, {k: small for k in range(self.team.size) if k != self.team.rank})
        return np.stack(
            [small if k == self.team.rank else np.asarray(self.team.receive(tag, k)) for k in range(self.team.size)]
        )

    def all_gather(
        self, mode: int, rows: np.ndarray | SparseRows, small: np.ndarray, tag: Any, spread: int = 0
    ) -> tuple[np.ndarray, dict, dict]:
        """Send every other worker ``small`` (this worker's R x R-sized terms) and the rows of
        ``rows`` (this worker's owned rows, or those of them that are not zero) it touches (sparse
        rows travel sparse: the positions of those not zero, and those rows); return every rank's
        ``small`` (stacked in rank order), the rows received, per rank, and (``spread``) the rows
        each rank sent beyond those: nothing is written yet, the caller scales them first
        (:meth:`set_rows`).

        ``spread`` (sparse ``rows`` of at most ``spread`` rows, 0 for none): every other worker also
        gets this worker's other rows that are not zero, as (row numbers, rows), so every worker
        can hold the whole updated factor's rows that are not zero (STS-CP then draws that mode
        without asking the owners). The third result maps each other rank to what it sent beyond
        the rows this worker touches ((row numbers, rows), or None where that rank had too many
        rows to spread); empty without ``spread``."""
        plan = self.plans[mode]
        payloads = {}
        sparse = isinstance(rows, SparseRows)
        asked = sparse and spread > 0
        if sparse:  # the rows not listed are zero
            live = np.zeros(rows.n, dtype=bool)
            live[rows.hit] = True
            slot = np.zeros(rows.n, dtype=np.int64)
            slot[rows.hit] = np.arange(rows.hit.shape[0])
            spread = asked and rows.hit.shape[0] <= spread
        for k in range(self.team.size):
            if k != self.team.rank:
                pos = plan.recv_pos.get(k)
                if pos is None:
                    pos = np.zeros(0, dtype=np.int64)
                if sparse:
                    nz = np.flatnonzero(live[pos])
                    payloads[k] = [small, [nz, rows.rows[slot[pos[nz]]]]]
                    if spread:  # the hit rows ``k`` does not touch
                        rest = np.ones(rows.hit.shape[0], dtype=bool)
                        rest[slot[pos[nz]]] = False
                        payloads[k].append([plan.owned[rows.hit[rest]], rows.rows[rest]])
                    else:
                        payloads[k].append(None)
                else:
                    payloads[k] = [small, rows[pos]]
        self.team.send_many(tag, payloads)
        smalls, received, others = [], {}, {}
        for k in range(self.team.size):
            if k == self.team.rank:
                smalls.append(small)
            else:
                got = self.team.receive(tag, k)
                smalls.append(np.asarray(got[0]))
                if k in plan.send:
                    received[k] = got[1]
                if asked:
                    others[k] = got[2]
        return np.stack(smalls), received, others

    def exchange_partials(
        self, mode: int, partial: Partial, small: np.ndarray, tag: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """A mode's one message round (:attr:`ModePlan.one_round`): send every other worker
        ``small`` (a few terms, or none) and the rows of ``partial`` both touch; add the rows
        received into ``partial``'s own buffer, in rank order after this worker's own. Returns
        every rank's ``small`` (stacked in rank order) and that buffer, whose rows this worker
        touches are now the mode's MTTKRP summed over every worker (other rows unchanged)."""
        plan, rows = self.plans[mode], partial.rows
        if partial.index is not None:
            raise ValueError("exchange_partials takes a dense partial (rows lo .. lo + len(rows) - 1)")
        small = np.asarray(small)
        me, W = self.team.rank, self.team.size
        empty = np.zeros((0, rows.shape[1]), dtype=rows.dtype)
        # the sends are copies (fancy indexing): they leave while the rows are summed in place
        self.team.send_many(
            tag,
            {k: [small, rows[plan.shared[k] - partial.lo] if k in plan.shared else empty] for k in range(W) if k != me},
        )
        smalls = []
        for k in range(W):
            if k == me:
                smalls.append(small)
                continue
            s, got = self.team.receive(tag, k)
            smalls.append(np.asarray(s))
            if k in plan.shared:
                rows[plan.shared[k] - partial.lo] += np.asarray(got)
        return np.stack(smalls), rows

    def scale_touched(self, mode: int, scale: np.ndarray) -> None:
        """Scale the rows of mode ``mode`` this worker touches (its columns, times ``scale``)."""
        plan, view = self.plans[mode], self.factors.views[mode]
        span = plan.touched_span
        if span is not None:
            scale_columns(view[span[0] : span[1]], scale)
        elif plan.touched is not None and plan.touched.shape[0]:
            view[plan.touched] = view[plan.touched] * scale
        self.factors_written()

    def factors_written(self) -> None:
        """Say that factor rows were written here (the GPU kernels' copy is uploaded again)."""
        if self.device == "gpu":
            from .device_stream import forget_device_factors

            forget_device_factors(self.factors)

    def set_rows(self, mode: int, owned_rows: np.ndarray | SparseRows, received: dict, scale: np.ndarray) -> None:
        """Write this worker's updated rows and the received ones, each times ``scale``."""
        plan, view = self.plans[mode], self.factors.views[mode]
        span = plan.span
        if isinstance(owned_rows, SparseRows):  # the rows not listed are zero
            mine = view[span[0] : span[1]] if span is not None else None
            before = self.live.get((mode, -1))
            if mine is not None:
                mine[slice(None) if before is None else before] = 0
                mine[owned_rows.hit] = owned_rows.rows * scale
            else:
                view[plan.owned if before is None else plan.owned[before]] = 0
                view[plan.owned[owned_rows.hit]] = owned_rows.rows * scale
            self.live[(mode, -1)] = owned_rows.hit
        elif span is not None:
            np.multiply(owned_rows, scale, out=view[span[0] : span[1]])
        elif plan.owned.shape[0]:
            view[plan.owned] = owned_rows * scale
        for k, r in received.items():
            if isinstance(r, (list, tuple)):  # sparse: the rows not listed are zero
                pos, rr = np.asarray(r[0]), np.asarray(r[1])
                # zeroed: the rows that were not zero before (all of them the first time), not
                # every row shared with ``k`` (writing 1.8 M rows of zeros took 12 % of an STS-CP
                # iteration at 86 M)
                before = self.live.get((mode, k))
                view[plan.send[k] if before is None else plan.send[k][before]] = 0
                view[plan.send[k][pos]] = rr * scale
                self.live[(mode, k)] = pos
            else:
                view[plan.send[k]] = np.asarray(r) * scale
        self.factors_written()

    def owned_rows(self, mode: int) -> tuple[np.ndarray, np.ndarray]:
        plan = self.plans[mode]
        return plan.owned, self.factors.views[mode][plan.owned]


@dataclass
class SparseRows:
    """Rows of which only ``hit`` (positions, sorted) are not zero: ``rows`` (len(hit), R) of ``n``."""

    hit: np.ndarray
    rows: np.ndarray
    n: int


#: received rows past this share of the owned rows are summed in a dense buffer (cheaper than
#: sorting them: a planted tensor's sampled fibers hit most rows)
DENSE_SUM_SHARE = 0.25


def owner_sums(positions: Sequence[np.ndarray], values: Sequence[np.ndarray], n: int) -> SparseRows:
    """The rows each rank sent (``positions`` among ``n`` owned rows, each rank's distinct, and
    their ``values``), summed in rank order; the rows whose sum is not zero, as
    :class:`SparseRows`. Sums are those of adding each rank's rows into a zero buffer in turn."""
    R = values[0].shape[1] if values else 0
    dtype = values[0].dtype if values else np.float64
    pos = np.concatenate([np.asarray(p, dtype=np.int64) for p in positions]) if positions else np.zeros(0, np.int64)
    if pos.shape[0] >= DENSE_SUM_SHARE * n:
        out = np.zeros((n, R), dtype=dtype)
        for p, v in zip(positions, values):
            out[p] += v  # a rank's positions are distinct: one add each
        hit = np.flatnonzero(out.any(axis=1))
        return SparseRows(hit, out[hit], n)
    vals = np.concatenate(values) if values else np.zeros((0, R), dtype)
    order = np.argsort(pos, kind="stable")  # rank order kept among equal positions
    pos, vals = pos[order], vals[order]
    starts = np.flatnonzero(np.concatenate([[True], pos[1:] != pos[:-1]])) if pos.shape[0] else pos
    sums = np.add.reduceat(vals, starts, axis=0) if pos.shape[0] else vals
    live = sums.any(axis=1)
    return SparseRows(pos[starts][live], sums[live], n)


def _pack_live(rows: np.ndarray, at: np.ndarray, live: np.ndarray) -> list[np.ndarray]:
    """The rows ``rows[at]`` to send sparse: the positions in ``at`` of those not zero (``live``,
    a flag per row of ``rows``) and those rows."""
    nz = np.flatnonzero(live[at])
    return [nz, rows[at[nz]]]


def _add(out: np.ndarray, positions: np.ndarray, got: Any) -> None:
    """Add received rows (all, or sparse: positions and rows) into ``out`` at ``positions``."""
    if isinstance(got, (list, tuple)):
        out[positions[np.asarray(got[0])]] += np.asarray(got[1])
    else:
        out[positions] += got


_RUNS: dict[tuple[str, str], WorkerState] = {}
_RUNS_LOCK = threading.Lock()


def _state(run: str, dask_worker=None) -> WorkerState:
    from distributed import get_worker

    addr = (dask_worker or get_worker()).address
    with _RUNS_LOCK:
        st = _RUNS.get((addr, run))
    if st is None:
        raise TeamLost(f"owner-computes run {run}: worker {addr} holds no state for it (restarted?)")
    return st


def _row_counts(sources: list, store, nmodes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per mode, the rows the partitions in ``sources`` touch and how many nonzeros each holds
    (decoded partitions item by item, streamed ones chunk by chunk)."""
    lo = [min((s_part(s).row_lo[n] for s in sources), default=0) for n in range(nmodes)]
    hi = [max((s_part(s).row_hi[n] for s in sources), default=-1) for n in range(nmodes)]
    counts = [np.zeros(max(0, hi[n] - lo[n] + 1), dtype=np.int64) for n in range(nmodes)]

    def add(it) -> None:  # the coordinates of decoded items, item by item
        for k in range(it.nitems):
            co = delinearize(it.index[it.start[k] : it.end[k]], it.base[k], store.layout)
            for n in range(nmodes):
                counts[n] += np.bincount(co[:, n] - lo[n], minlength=counts[n].shape[0])

    for src in sources:
        if isinstance(src, PartitionData):
            add(src.items)
        else:  # the items the streamed (or device-resident) partition's tasks will see, decoded
            part, bufs = s_part(src), BatchBuffers(store, 1)
            for c in range(part.chunk_lo, part.chunk_hi):
                add(part.own_items(fill_batch(store, range(c, c + 1), bufs, delta=False), c, store.chunk_nnz))
    out = []
    for n in range(nmodes):
        ids = np.flatnonzero(counts[n])
        out.append((ids + lo[n], counts[n][ids]))
    return out


def s_part(source) -> Partition:
    return source[1] if isinstance(source, tuple) else source.part


_PENDING: dict[tuple[str, str], list] = {}


def _load(
    run: str,
    path: str,
    parts: list[Partition],
    in_memory: bool,
    mode_copies: bool,
    threads: int,
    device: str = "cpu",
    device_options: Any = None,
    mode_pairs: bool = False,
    dask_worker=None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Run on a worker: load its partitions (in memory) or note them (streamed), and return its
    per-mode row counts (:func:`_row_counts`) for the ownership plan. ``mode_pairs`` (with
    ``mode_copies``): the partitions keep memoized mode pairs where they pay."""
    from distributed import get_worker

    worker = dask_worker or get_worker()
    _sweep_idle(worker.address)
    store = cached_store(path)
    with numba_threads(threads):
        sources = [
            load_partition(path, p, device, device_options, mode_copies and device == "cpu", threads, mode_pairs)
            if in_memory
            else (path, p)
            for p in parts
        ]
    with _RUNS_LOCK:
        _PENDING[(worker.address, run)] = sources
    return _row_counts(sources, store, store.nmodes)


def _setup(
    run: str,
    rank: int,
    addresses: list[str],
    plans: list[ModePlan],
    init: Callable[..., StackedFactors],
    init_args: tuple,
    threads: int,
    batch_nnz: int,
    max_private_bytes: int,
    device: str = "cpu",
    device_options: Any = None,
    path: str = "",
    index_modes: Sequence[int] = (),
    dask_worker=None,
) -> None:
    """Run on a worker: make the initial factors (``init(*init_args)``, the same on every worker)
    and their Grams, and keep the run's state beside the loaded partitions."""
    from distributed import get_worker

    worker = dask_worker or get_worker()
    with _RUNS_LOCK:
        sources = _PENDING.pop((worker.address, run))
    full = init(*init_args)
    grams = [v.T @ v for v in full.views]  # of every row, as one worker's run starts
    factors = _touched_only(full, plans)
    del full
    st = WorkerState(
        Team(run, rank, addresses),
        sources,
        factors,
        grams,
        plans,
        threads,
        batch_nnz,
        max_private_bytes,
        device,
        device_options,
        path,
        frozenset(index_modes),
    )
    st.weights = np.ones(factors.rank)
    with _RUNS_LOCK:
        _RUNS[(worker.address, run)] = st


def _touched_only(full: StackedFactors, plans: list[ModePlan]) -> StackedFactors:
    """The factors with only the rows this worker touches or owns written, in a fresh array whose
    other pages the OS never maps: no kernel reads them, so they cost no memory (a worker holding
    half of an Amazon-shaped tensor's longest mode keeps about half of its 4.8 M rows)."""
    out = StackedFactors(full.shape, full.rank, full.dtype)
    for n, plan in enumerate(plans):
        rows = np.union1d(plan.owned, np.concatenate(list(plan.send.values()))) if plan.send else plan.owned
        if rows.shape[0] and int(rows[-1]) - int(rows[0]) + 1 == rows.shape[0]:  # one range
            out.views[n][int(rows[0]) : int(rows[-1]) + 1] = full.views[n][int(rows[0]) : int(rows[-1]) + 1]
        elif rows.shape[0]:
            out.views[n][rows] = full.views[n][rows]
    return out


def _iterate(run: str, step: Callable, batch: list[tuple], seq: int) -> list[dict]:
    """Run on a worker: the run's task number ``seq`` here, the iterations ``batch`` in turn, each
    ``step(state, previous, *args)`` (every mode, exchanging rows with the other workers),
    ``previous`` being this worker's summary of the iteration before (None for the first); returns
    their small summaries. Tasks run in their order whatever the worker's thread count."""
    st = _state(run)
    st.wait_turn(seq)
    try:
        out = []
        for args in batch:
            st.team.bytes_sent = 0
            st.team.wait_seconds = st.team.send_seconds = 0.0
            st.team.rounds = 0
            # every numba call of the step (the update's column statistics too) on this worker's
            # cores only: a parallel region wider than the cores waits for a thread another
            # worker's kernel holds
            with numba_threads(st.threads):
                st.last = step(st, st.last, *args)
            # the last mode's sends are confirmed by the next iteration (its receives, or the
            # flush of a call): waiting here for their delivery replies held the next iteration
            # for a message round trip
            st.team.settle()
            out.append(st.last)
        return out
    except ExchangeAborted:
        # the run cannot go on (a peer is gone, or the driver aborted it): its partitions and rows
        # are freed here, whether or not a driver is left to release them
        _drop(run)
        raise
    finally:
        st.end_turn()


def _call(run: str, fn: Callable, args: tuple, seq: int) -> Any:
    """Run on a worker, as the run's task number ``seq`` there: ``fn(state, *args)``."""
    st = _state(run)
    st.wait_turn(seq)
    try:
        st.team.flush()  # every row the iterations before sent was delivered (or the failure raised)
        with numba_threads(st.threads):
            return fn(st, *args)
    finally:
        st.end_turn()


# a run none of whose tasks ended here for this long lost its driver (killed between iterations,
# with no wait left to notice): its partitions and rows are freed when another run starts here
IDLE_RUN_S = 900.0


def _sweep_idle(address: str) -> None:
    now = time.monotonic()
    with _RUNS_LOCK:
        for key in [k for k, st in _RUNS.items() if k[0] == address and now - st.used > IDLE_RUN_S]:
            log.warning("dropping owner-computes run %s on %s: idle for %.0f s", key[1], address, now - _RUNS[key].used)
            del _RUNS[key]


def _drop(run: str) -> None:
    from distributed import get_worker

    with _RUNS_LOCK:
        _RUNS.pop((get_worker().address, run), None)


def _release(run: str, dask_worker=None) -> None:
    from .exchange import forget_run

    with _RUNS_LOCK:
        _RUNS.pop((dask_worker.address, run), None)
        _PENDING.pop((dask_worker.address, run), None)
    forget_run(run, dask_worker=dask_worker)


# ---------------------------------------------------------------- driver side ---------------------


@dataclass
class OwnerPlan:
    """The ownership of every mode's rows (driver side), and what it costs to keep."""

    touched: list[list[np.ndarray]]  # [worker][mode] rows touched
    owned: list[list[np.ndarray]]  # [worker][mode] rows owned
    shared_rows: list[int]  # per mode: sum over workers of rows touched but owned elsewhere
    one_round: list[bool] = field(default_factory=list)  # per mode: exchanged in one message round

    def mode_lower_bound_bytes(self, rank: int, itemsize: int) -> list[int]:
        """Per mode, the bytes one iteration must move under this distribution, both ways: each
        row a worker touches but does not own, once as a partial to its owner and once updated
        back."""
        return [2 * shared * rank * itemsize for shared in self.shared_rows]

    def lower_bound_bytes(self, rank: int, itemsize: int) -> int:
        """:meth:`mode_lower_bound_bytes` summed over the modes."""
        return sum(self.mode_lower_bound_bytes(rank, itemsize))


def plan_ownership(
    counts: list[list[tuple[np.ndarray, np.ndarray]]], directory_modes: Sequence[int] = ()
) -> tuple[OwnerPlan, list[list[ModePlan]]]:
    """Owners of every touched row (most nonzeros, ties to the lower rank), from each worker's
    per-mode (rows, counts); and each worker's :class:`ModePlan` per mode (for the modes in
    ``directory_modes``, with every row's owner)."""
    W, N = len(counts), len(counts[0])
    touched = [[counts[w][n][0] for n in range(N)] for w in range(W)]
    owned: list[list[np.ndarray]] = [[None] * N for _ in range(W)]
    owner_of_touched: list[list[np.ndarray]] = [[None] * N for _ in range(W)]
    shared = []
    one_round: list[bool] = []
    whole: list[bool] = []
    directory: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for n in range(N):
        ids = np.concatenate([counts[w][n][0] for w in range(W)])
        cnt = np.concatenate([counts[w][n][1] for w in range(W)])
        rk = np.concatenate([np.full(counts[w][n][0].shape[0], w, dtype=np.int64) for w in range(W)])
        order = np.lexsort((rk, -cnt, ids))  # by row, then most nonzeros first, then lower rank
        ids_s, rk_s = ids[order], rk[order]
        first = np.ones(ids_s.shape[0], dtype=bool)
        first[1:] = ids_s[1:] != ids_s[:-1]
        rows, owners = ids_s[first], rk_s[first]
        touchers = np.diff(np.append(np.flatnonzero(first), ids_s.shape[0]))  # per row, the workers touching it
        one_round.append(_one_round_pays(touchers))
        whole.append(one_round[-1] and bool((touchers == W).all()))
        if n in directory_modes:
            directory[n] = (rows, owners.astype(np.int16))
        for w in range(W):
            owned[w][n] = rows[owners == w]
            owner_of_touched[w][n] = owners[np.searchsorted(rows, touched[w][n])]
        shared.append(sum(int((owner_of_touched[w][n] != w).sum()) for w in range(W)))
    plans = []
    for w in range(W):
        mode_plans = []
        for n in range(N):
            send = {
                k: touched[w][n][owner_of_touched[w][n] == k]
                for k in range(W)
                if k != w and (owner_of_touched[w][n] == k).any()
            }
            recv_pos = {}
            for k in range(W):
                if k == w:
                    continue
                theirs = touched[k][n][owner_of_touched[k][n] == w]
                if theirs.shape[0]:
                    recv_pos[k] = np.searchsorted(owned[w][n], theirs)
            both = {}
            if one_round[n]:
                for k in range(W):
                    common = np.intersect1d(touched[w][n], touched[k][n], assume_unique=True) if k != w else None
                    if common is not None and common.shape[0]:
                        both[k] = common
            mode_plans.append(
                ModePlan(owned[w][n], send, recv_pos, directory.get(n), touched[w][n], both, one_round[n], whole[n])
            )
        plans.append(mode_plans)
    return OwnerPlan(touched, owned, shared, one_round), plans


#: a mode goes in one message round where that sends at most this share more rows than the
#: owner's two rounds (a row ``t`` workers touch: ``t (t - 1)`` partials against ``2 (t - 1)``
#: rows; equal where no row has more than 2 workers, so always on 2 workers), or at most
#: ``ONE_ROUND_EXTRA_ROWS`` more (the length-2 mode of vast-shaped tensors on many workers)
ONE_ROUND_SHARE = 1.25
ONE_ROUND_EXTRA_ROWS = 1024


def _one_round_pays(touchers: np.ndarray) -> bool:
    """Whether a mode whose rows ``touchers`` workers touch each goes in one message round."""
    t = touchers.astype(np.int64)
    one, owner = int((t * (t - 1)).sum()), int((2 * (t - 1)).sum())
    return one <= ONE_ROUND_SHARE * owner or one - owner <= ONE_ROUND_EXTRA_ROWS


def exchange_record(summaries: list[dict], lower: list[int]) -> dict:
    """An iteration's exchange, for the history: the bytes the workers sent per mode (their
    summaries' ``bytes_sent``) beside ``lower``, the distribution's lower bound per mode, and the
    slowest worker's exchange seconds per mode."""
    N = len(lower)
    sent = [int(sum(s["bytes_sent"][n] for s in summaries)) for n in range(N)]
    return {
        "workers": len(summaries),
        "bytes_sent": int(sum(sent)),
        "bytes_lower_bound": int(sum(lower)),
        "mode_bytes_sent": sent,
        "mode_bytes_lower_bound": lower,
        "exchange_seconds": [max(s["exchange_seconds"][n] for s in summaries) for n in range(N)],
        # message rounds an iteration (each a send to every other worker and a receive from each)
        "rounds": max(s.get("rounds", 0) for s in summaries),
    }


class OwnerComputes:
    """An owner-computes run on the workers of ``client``, CPU or GPU (see the module docstring).

    Parameters
    ----------
    client : distributed.Client
    path : str
        Store path or URL.
    parts : list of Partition
        The store's partitions (nonzero-balanced), shared out to the workers in contiguous runs.
    in_memory : bool
        Keep the partitions decoded in worker memory (else stream them every mode).
    mode_copies, mode_pairs : bool
        In memory, also keep mode-sorted copies, and memoized mode pairs where they pay (the
        memory plan's choice; a sweep's pair memo lives on the worker's one task).
    init, init_args : callable and its arguments (futures among them are resolved)
        Makes the initial factors (run on every worker; must give the same on each, in a new
        array: workers of one process must not share it).
    workers : list of str, optional
        The workers to use (default: every worker of the cluster, sorted by address).
    """

    def __init__(
        self,
        client: Client,
        path: str,
        parts: list[Partition],
        *,
        in_memory: bool,
        init: Callable[..., StackedFactors],
        init_args: tuple,
        nmodes: int,
        threads: dict[str, int],
        batch_nnz: int,
        max_private_bytes: int,
        mode_copies: bool = False,
        mode_pairs: bool = False,
        workers: list[str] | None = None,
        device: str = "cpu",
        device_options: Any = None,
        index_modes: Sequence[int] = (),
    ) -> None:
        self.client = client
        self.run = f"tfooc-owner-{uuid.uuid4().hex[:12]}"
        self._ahead: list | None = None  # the next iteration's futures, submitted ahead
        self._last: list | None = None  # the latest iteration submitted, per worker
        self._seq = 0  # tasks of the run submitted to each worker, in order
        addresses = sorted(workers or scheduler_workers(client))
        addresses = addresses[: max(1, min(len(addresses), cached_store(path).nnz))]
        self.addresses = addresses
        W = len(addresses)
        # CPU workers: as many partitions as planned (in memory, one decoded partition stays small;
        # streamed, one per worker, whose one task a mode streams it with all the worker's cores),
        # a multiple of the workers, cut at work items rather than chunks (see split_nonzeros).
        # GPU workers read whole chunks (device-resident batches, device streaming): they keep the
        # planned chunk partitions, one per GPU (AMPED's nonzero-balanced split across GPUs)
        if device == "cpu":
            parts = split_nonzeros(cached_store(path), W * (-(-len(parts) // W) if in_memory else 1))
        self.assigned = contiguous_runs(parts, W)
        client.register_plugin(ExchangePlugin())
        t0 = time.perf_counter()
        counts = self._check(
            [
                client.submit(
                    _load,
                    self.run,
                    path,
                    self.assigned[k],
                    in_memory,
                    mode_copies,
                    threads[a],
                    device,
                    device_options,
                    mode_pairs and mode_copies and device == "cpu",
                    workers=[a],
                    allow_other_workers=False,
                    pure=False,
                )
                for k, a in enumerate(addresses)
            ]
        )
        self.index_modes = sorted(int(m) for m in index_modes)
        self._init = (init, init_args)  # the rows no worker holds, of a mode no update has written
        self.plan, plans = plan_ownership(counts, self.index_modes)
        futures = []
        for k, a in enumerate(addresses):
            [plan_k] = client.scatter([plans[k]], workers=[a], hash=False)
            futures.append(
                client.submit(
                    _setup,
                    self.run,
                    k,
                    addresses,
                    plan_k,
                    init,
                    init_args,
                    threads[a],
                    batch_nnz,
                    max_private_bytes,
                    device,
                    device_options,
                    path,
                    self.index_modes,
                    workers=[a],
                    allow_other_workers=False,
                    pure=False,
                )
            )
        self._check(futures)
        self.setup_seconds = time.perf_counter() - t0
        log.info(
            "owner-computes: %d workers, %s nonzeros each; rows shared per mode %s, one round %s (set up in %.2f s)",
            W,
            [sum(p.nnz for p in a) for a in self.assigned],
            self.plan.shared_rows,
            self.plan.one_round,
            self.setup_seconds,
        )

    def iterate(self, step: Callable, args: tuple, ahead: tuple | None = None) -> list[dict]:
        """One iteration: ``step(state, previous, *args)`` on every worker at once; their summaries,
        in rank order. With ``ahead``, the next iteration (``step`` with those arguments) is
        submitted before this one is waited for, so it starts as soon as this one ends, without a
        round trip to the driver; ``step`` then sees this iteration's summary as ``previous``
        and returns at once when it says to stop. Raises :class:`TeamLost` when a worker of the
        run left the cluster."""
        return [s[0] for s in self.iterate_many(step, [args], [ahead] if ahead is not None else None)]

    def iterate_many(self, step: Callable, batch: list[tuple], ahead: list[tuple] | None = None) -> list[list[dict]]:
        """Iterations ``batch`` (their arguments, in turn) as one task a worker, as :meth:`iterate`
        runs one: per worker (rank order) their summaries. One task per worker and batch, not per
        iteration: each task cost the driver and scheduler 10 ms of CPU and each worker 5 ms, on
        the cores the kernels use (docs/EXECUTION.md, "Iteration batches")."""
        futures = self._ahead if self._ahead is not None else self._submit(step, batch)
        self._ahead = self._submit(step, ahead) if ahead else None
        return self._check(futures)

    def _submit(self, step: Callable, args: tuple) -> list:
        # no dependency on the iteration before: a task submitted ahead reaches its worker at once
        # and starts there as soon as that one ends (WorkerState.wait_turn); depending on its
        # future took a scheduler round trip between iterations
        seq, self._seq = self._seq, self._seq + 1
        self._last = [
            self.client.submit(_iterate, self.run, step, args, seq, workers=[a], allow_other_workers=False, pure=False)
            for a in self.addresses
        ]
        return self._last

    def _check(self, futures: list) -> list:
        """Wait for ``futures`` while every worker of the run is still there."""
        while True:
            try:
                wait(futures, timeout=0.5, return_when="ALL_COMPLETED")
                break
            except TimeoutError:
                pass
            present = set(scheduler_workers(self.client))
            lost = [a for a in self.addresses if a not in present]
            if lost:
                self._abort(futures)
                raise TeamLost(f"owner-computes run {self.run}: worker(s) {', '.join(lost)} left the cluster")
        errors = [f for f in futures if f.status == "error"]
        if errors:
            exc = errors[0].exception()
            self._abort(futures)
            if isinstance(exc, (ExchangeAborted, TeamLost)):
                raise TeamLost(str(exc)) from exc
            raise exc
        return self.client.gather(futures)

    def _abort(self, futures: list) -> list[str]:
        """Wake the run's waits on the workers still there and cancel ``futures``; returns those
        workers."""
        present = [a for a in self.addresses if a in set(scheduler_workers(self.client))]
        if present:
            self.client.run(abort_run, self.run, workers=present)
        if futures:
            self.client.cancel(futures)
        return present

    def factor(self, mode: int, shape: Sequence[int], rank: int, dtype, initial: bool = False) -> np.ndarray:
        """Mode ``mode``'s factor matrix, gathered from its owners. Rows no nonzero touches are 0,
        as any update leaves them (their MTTKRP rows are 0); with ``initial`` (a mode no update
        has written yet: randomized rounds whose sampled fibers held no nonzero keep it) they are
        the initial factors' rows, which the run's Grams and fit include and no worker holds."""
        if initial:
            init, args = self._init
            out = np.array(init(*self.client.gather(list(args))).views[mode], dtype=dtype)
        else:
            out = np.zeros((shape[mode], rank), dtype=dtype)
        seq, self._seq = self._seq, self._seq + 1
        got = self._check(
            [
                self.client.submit(
                    _call,
                    self.run,
                    WorkerState.owned_rows,
                    (mode,),
                    seq,
                    workers=[a],
                    allow_other_workers=False,
                    pure=False,
                )
                for a in self.addresses
            ]
        )
        for ids, rows in got:
            out[ids] = rows
        return out

    def each(self, fn: Callable, *args) -> list:
        """``fn(state, *args)`` on every worker, in the run's task order (after the iterations
        submitted before it, the one submitted ahead too), without exchanges; the results in rank
        order (futures among ``args`` are resolved)."""
        seq, self._seq = self._seq, self._seq + 1
        return self._check(
            [
                self.client.submit(_call, self.run, fn, args, seq, workers=[a], allow_other_workers=False, pure=False)
                for a in self.addresses
            ]
        )

    def release(self) -> None:
        """Drop the run's state on its workers; an iteration still going (submitted ahead) is
        woken by an abort and cancelled."""
        try:
            futures = (self._ahead or []) + (self._last or [])
            self._ahead = self._last = None
            present = self._abort(futures)
            if present:
                self.client.run(_release, self.run, workers=present)
        except Exception as exc:  # a cluster closing under us keeps nothing anyway
            log.debug("could not release owner-computes state: %s", exc)
