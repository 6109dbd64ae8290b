"""Worker memory plan for CP-ALS: what one worker holds at its peak, and the execution that fits.

Before anything runs, the plan adds up the bytes the busiest worker holds at once:

============== ==================================================================================
``baseline``   the worker process as it is now (interpreter, numba, Dask), measured
``kernels``    the compiled kernels once loaded (LLVM code and numba's caches)
``factors``    the model state: all factor matrices, stacked (sum of mode lengths x R)
``state_copy`` a second state while a mode update writes a new one (copying updates only)
``outputs``    one MTTKRP output (longest mode x R) per task running at once on the worker
``reduction``  the sum of several partials, when a mode has more than one partition
``update``     the update's working set: the solved rows, then the normalized rows (copying
               updates); a block of rows at a time (in-place updates)
``grams``      the R x R matrices: one Gram per mode, their Hadamard product, its inverse
``private``    the kernels' private accumulators per task running at once: their bound, or less
               where a kernel call has too few nonzeros to use it (a private work item spans at
               most ``PRIVATE_REUSE`` rows per nonzero)
``data``       decoded partitions kept in memory, or the streaming batch buffers
``mode_copies`` in-memory partitions' mode-sorted copies, one per mode (the runs kernel sums
               each target row's nonzeros in registers; :mod:`~tensorflow_ooc.kernels.mttkrp.mode_order`)
``mode_pairs`` memoized mode pairs (a two-level dimension tree) beyond the mode-sorted copies
               they replace: each pair's copy sorted by the pair, its table and memo rows, at
               most :data:`~tensorflow_ooc.kernels.mttkrp.mode_pairs.PAIR_GROUPS_MAX` pairs a
               nonzero (:mod:`~tensorflow_ooc.kernels.mttkrp.mode_pairs`)
``buckets``    the row-owned tiles' buckets (16 bytes a nonzero and its value, a bounded group at
               a time)
``column_groups`` ranks run as padded column groups: the factors' padded copy and one output per
               group, per task (:mod:`~tensorflow_ooc.kernels.mttkrp.column_groups`)
``transfer``   a state arriving from another worker while the previous one is still held
``sampling``   randomized CP-ALS: the STS-CP segment trees (at most one factor's size each; not
               for CP-ARLS-LEV), two sample sets (multi-indices and weighted Khatri-Rao rows), for
               in-memory partitions the per-mode fiber indexes (16-24 bytes a nonzero and mode), and
               streamed through a store's fiber index the round's reads beyond what an exact
               pass's buffers take (they are never live together) and the index's Bloom filters
============== ==================================================================================

and chooses, from fastest to leanest, the first execution whose peak stays under the usable
part of the worker's limit: below Dask's ``distributed.worker.memory.spill`` threshold (0.7 by
default), past which the worker pickles stored results to disk, our gigabyte model state first,
and the pickling's own copy then pushes it past ``terminate``; and below ``pause`` (0.8):

1. in-memory partitions, copying updates (a lost worker's work is recomputed by Dask);
2. in-memory, in-place updates (the new factor rows overwrite the old; a lost worker resumes
   from the checkpoint instead);
3. streaming, copying updates;
4. streaming, in-place updates;
5. streaming, in-place, lean: small batches and a small private bound (more atomic adds).

In-memory executions (exact CP-ALS) are first tried with mode-sorted copies of the partitions,
then without: the copies are speed, bought with one more copy of the nonzeros per mode. A graph
of one partition (its sweep one task, so a memo lives from one mode to the next), or an
owner-computes run (each worker sweeps its partitions in its one task), at orders 3-5 first tries
them with memoized mode pairs where pairs pay (chosen when the partition loads).

With more than one kernel thread, each of 1-4 is first tried with a private bound that holds a
per-thread copy of the longest mode's output (the kernels then give long modes per-thread
outputs, :class:`~tensorflow_ooc.kernels.mttkrp.dispatch.ThreadOutputs`, instead of row-owned tiles).
In-place executions on one worker running one task at a time lend the target mode's factor
rows as one copy (the MTTKRP does not read them and the update overwrites them), so with two
kernel threads per-thread outputs cost them nothing beyond the default bound.

A worker of several Dask threads runs one partition task per thread, each with its own output of
the target mode and a reduction of their partials: at 4.8 M rows and rank 16 that is 589 MiB a
task and 589 MiB for the sum. So on one worker, after each execution's plans with a task per
Dask thread come the same with one partition task at a time on all the worker's cores
(``single_task``: one partition, whose output is the whole sum) before the next execution's:
exact CP-ALS and STS-CP at 500 M nonzeros on a 2-thread worker fit 4 GB as on one thread.
The lean streaming plans come last, a task per thread before one task.

Below the floor (the leanest peak) it refuses with :class:`MemoryPlanError`, which gives the
figures and the smallest worker limit that works.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import dask

from ..errors import TfoocError
from ..kernels.mttkrp.column_groups import column_group_bytes
from ..kernels.mttkrp.dispatch import ThreadOutputs
from ..kernels.mttkrp.mode_order import RUN_TABLE_BYTES_PER_NNZ
from ..kernels.mttkrp.mode_pairs import pair_bytes
from ..kernels.mttkrp.owned import GROUP_NNZ as OWNED_GROUP_NNZ
from ..kernels.mttkrp.plan import DEFAULT_MAX_PRIVATE_BYTES, PRIVATE_REUSE
from ..kernels.sampling.fiber_gather import fiber_index_bytes
from ..kernels.sampling.krp_sampler import tree_nbytes
from ..kernels.update.column_scale import STAT_BLOCK_ROWS
from .partials import SPARSE_ROWS, SPREAD_ROWS
from .stream import BATCH_NNZ

LEAN_BATCH_NNZ = 1 << 18
LEAN_PRIVATE_BYTES = 16 << 20
KERNEL_CODE_BYTES = 96 << 20  # measured: a fresh worker grew 74 MiB running its first CP-ALS
ESTIMATE_MARGIN = 1.10  # allocator fragmentation and small temporaries the terms leave out
DEFAULT_USABLE = 0.70


class MemoryPlanError(TfoocError, MemoryError):
    """No execution fits the worker memory limit; ``required_limit`` is the smallest that does."""

    def __init__(self, message: str, required_limit: int, plan: "MemoryPlan") -> None:
        super().__init__(message)
        self.required_limit = required_limit
        self.plan = plan


@dataclass
class MemoryPlan:
    """One candidate execution and its peak memory on the busiest worker (bytes)."""

    execution: str  # "in-memory" or "streaming"
    in_place: bool  # mode updates overwrite the factor rows
    batch_nnz: int
    max_private_bytes: int
    terms: dict[str, int] = field(default_factory=dict)
    limit: int | None = None  # the worker's memory limit (None: unlimited)
    usable_fraction: float = DEFAULT_USABLE
    mode_copies: bool = False  # in-memory partitions keep mode-sorted copies
    mode_pairs: bool = False  # ... and memoized mode pairs where they pay (kernels/mttkrp/mode_pairs.py)
    # streaming: the modes streamed from the store's mode-sorted copies (execution/sorted_stream.py)
    streamed_copies: tuple[int, ...] = ()
    # one partition task at a time, on all the worker's cores, instead of a task per Dask thread
    single_task: bool = False
    kernel_threads: int = 1  # numba threads a partition task runs on

    @property
    def peak(self) -> int:
        """Estimated peak bytes of the worker, margin included."""
        return int(sum(self.terms.values()) * ESTIMATE_MARGIN)

    @property
    def required_limit(self) -> int:
        """The smallest worker memory limit under which this plan's peak stays usable."""
        return int(math.ceil(self.peak / self.usable_fraction))

    @property
    def fits(self) -> bool:
        return self.limit is None or self.peak <= self.usable_fraction * self.limit

    @property
    def name(self) -> str:
        lean = self.batch_nnz == LEAN_BATCH_NNZ and self.max_private_bytes == LEAN_PRIVATE_BYTES
        roomy = self.max_private_bytes > DEFAULT_MAX_PRIVATE_BYTES
        return (
            f"{self.execution}, {'in-place' if self.in_place else 'copying'} updates"
            + (", lean" if lean else "")
            + (", per-thread outputs" if roomy else "")
            + (", mode-sorted copies" if self.mode_copies else "")
            + (", memoized mode pairs" if self.mode_pairs else "")
            + (f", one task at a time on {self.kernel_threads} kernel threads" if self.single_task else "")
            + (
                f", modes {', '.join(map(str, self.streamed_copies))} from the store's mode-sorted copies"
                if self.execution == "streaming" and self.streamed_copies
                else ""
            )
        )

    def describe(self) -> str:
        terms = ", ".join(f"{k} {_mib(v)}" for k, v in self.terms.items() if v)
        lim = "unlimited" if self.limit is None else _mib(self.limit)
        return (
            f"{self.name}: peak {_mib(self.peak)} ({terms}; x{ESTIMATE_MARGIN:.2f} margin) "
            f"of worker limit {lim} (usable {self.usable_fraction:.0%})"
        )

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "execution": self.execution,
            "in_place": self.in_place,
            "mode_copies": self.mode_copies,
            "mode_pairs": self.mode_pairs,
            "streamed_copies": list(self.streamed_copies) if self.execution == "streaming" else [],
            "batch_nnz": self.batch_nnz,
            "max_private_bytes": self.max_private_bytes,
            "single_task": self.single_task,
            "kernel_threads": self.kernel_threads,
            "terms": dict(self.terms),
            "peak": self.peak,
            "limit": self.limit,
            "required_limit": self.required_limit,
        }


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def usable_fraction() -> float:
    """The fraction of a worker's limit our peak may reach: the lowest of Dask's spill, pause and
    terminate thresholds that are set (spilling pickles the model state, a second copy of it; a
    paused worker runs no tasks, and ours would not free memory by waiting)."""
    fractions = [
        float(v)
        for key in ("spill", "pause", "terminate")
        if (v := dask.config.get(f"distributed.worker.memory.{key}", None))
    ]
    return min(fractions, default=0.95)


# fastest first: in memory before streamed, a second factor copy before in-place updates
_ORDER = {("in-memory", False): 0, ("in-memory", True): 1, ("streaming", False): 2, ("streaming", True): 3}


# what in-memory partitions keep beside their items, fastest first
_KEPT_ORDER = {"pairs": 0, "copies": 1, None: 2}
_KEPT_OF = {(True, True): "pairs", (True, False): "copies", (False, False): None}


def plan_order(plan: MemoryPlan) -> tuple:
    """The sort key of :func:`choose`'s candidates, fastest first: by execution and update (see
    ``_ORDER``); the lean plans last; a task per Dask thread before one task at a time; what
    in-memory partitions keep; larger batches and private bounds first."""
    lean = plan.batch_nnz == LEAN_BATCH_NNZ and plan.max_private_bytes == LEAN_PRIVATE_BYTES
    return (
        _ORDER[(plan.execution, plan.in_place)],
        lean,
        plan.single_task,
        _KEPT_ORDER[_KEPT_OF[(plan.mode_copies, plan.mode_pairs)]],
        -plan.batch_nnz,
        -plan.max_private_bytes,
    )


def _output_terms(
    out_rows: int, tasks: int, partitions_per_mode: int, split_every: int, workers: int
) -> tuple[int, int]:
    """The bytes of an exact MTTKRP's partial outputs and of their reduction, for a mode of
    ``out_rows`` bytes of rows (see :func:`_state_terms`)."""
    if partitions_per_mode <= 1:
        return tasks * out_rows, 0
    if workers > 1:
        return tasks * out_rows + -(-out_rows // workers), out_rows
    return max(tasks, min(partitions_per_mode, split_every)) * out_rows, out_rows


def _state_terms(
    shape: tuple[int, ...],
    rank: int,
    itemsize: int,
    tasks: int,
    partitions_per_mode: int,
    split_every: int,
    baseline: int,
    in_place: bool,
    workers: int = 1,
) -> dict[str, int]:
    """The terms sparse and dense plans share: the worker's baseline and kernels, the model state
    (and its copy unless updates are in place), the MTTKRP outputs and their reduction, and the
    update's working set. One worker sums its partials in a tree (up to ``split_every`` at once
    and their sum); several reduce-scatter them (``MTTKRPGraph.reduce_scatter``): a worker holds
    its own tasks' partials and its slice's sum, and the update's worker all slices, one output."""
    S = sum(shape) * rank * itemsize
    out_rows = max(shape) * rank * itemsize
    outputs, reduction = _output_terms(out_rows, tasks, partitions_per_mode, split_every, workers)
    return {
        "baseline": int(baseline),
        "kernels": KERNEL_CODE_BYTES,
        "factors": S,
        "state_copy": 0 if in_place else S,
        "outputs": outputs,
        "reduction": reduction,
        # in place: one GEMM into the factor's own rows and per-block column statistics
        "update": (-(-max(shape) // STAT_BLOCK_ROWS) * rank * 8) if in_place else 2 * out_rows,
        # R x R float64 matrices: one Gram per mode, their Hadamard product V, its inverse and the
        # Cholesky factor. Small at usual ranks, but they grow as R^2: rank 100000 asked 74.5 GiB
        # for the Grams alone and failed in NumPy instead of here
        "grams": (len(shape) + 3) * rank * rank * 8,
    }


def candidates(
    *,
    shape: tuple[int, ...],
    rank: int,
    itemsize: int,
    worker_nnz: int,
    chunk_nnz: int,
    tasks: int,
    partitions_per_mode: int,
    workers: int,
    baseline: int,
    limit: int | None,
    value_itemsize: int = 8,
    execution: str = "auto",
    split_every: int = 4,
    samples: int = 0,
    kernel_threads: int = 1,
    lend_target: bool = False,
    owner: bool = False,
    owner_rows: tuple[Sequence[int], Sequence[int]] | None = None,
    trees: bool = True,
    index_reads: int = 0,
    index_filters: int = 0,
    memo_pairs: bool = False,
    single_task: bool = False,
) -> list[MemoryPlan]:
    """Every execution :func:`choose` may take, fastest first, each with its peak terms.

    Parameters
    ----------
    shape, rank, itemsize : the tensor's mode lengths, the CP rank, and the factors' bytes per entry.
    worker_nnz : nonzeros of the partitions placed on the busiest worker (in-memory execution).
    chunk_nnz : the store's nonzeros per chunk (the streaming reader's scratch).
    tasks : partition tasks the worker runs at once (its Dask threads, at most its partitions).
    partitions_per_mode : partition tasks per mode in the whole graph (> 1: partials are summed;
        the update holds up to ``split_every`` of them and their sum).
    workers : workers running partition tasks (> 1: states travel between workers).
    baseline : the worker's resident bytes before the run.
    limit : the worker's memory limit in bytes (None or 0: unlimited).
    execution : "auto", "in-memory" or "streaming": the executions to consider.
    samples : Khatri-Rao rows drawn per mode by randomized CP-ALS (0: exact CP-ALS).
    trees : the sampler keeps STS-CP's segment trees (CP-ARLS-LEV does not).
    index_reads : bytes a sampled round's fiber-index reads hold at most (0: no index).
    index_filters : bytes the fiber index's Bloom filters hold: their tables, kept once read, and
        one query's blocks.
    kernel_threads : numba threads per task: with more than one, each execution is first tried
        with a private bound that holds per-thread copies of the longest mode's output
        (:class:`~tensorflow_ooc.kernels.mttkrp.dispatch.ThreadOutputs`, faster than row-owned tiles on
        long modes), then with the default bound.
    lend_target : one worker running one task at a time: in-place executions lend the target
        mode's factor rows as one of those copies, so they need one copy fewer.
    owner : owner-computes (:mod:`.owner_computes`): the worker's one task a mode updates its
        rows in place; it holds its local MTTKRP, the rows it owns summed with the others'
        partials, the rows it sends and receives (each at most one output), no state copy and
        no whole factors in transit. STS-CP adds the copies of owned rows its trees are built
        from (about 1/W of the factors), and every worker's copy of the rows of the last
        sketched update of each mode, with its tree (up to W x ``SPREAD_ROWS`` rows a mode).
    memo_pairs : the caller's sweeps run as one task (exact CP-ALS): with one partition per mode
        (or owner-computes, whose worker sweeps its partitions in one task) at orders 3-5,
        in-memory executions are first tried with memoized mode pairs.
    owner_rows : owner-computes: per mode, the most rows one worker's nonzeros touch and about
        how many of them other workers touch too (:func:`~.partitions.owner_rows`). A worker's
        factor pages hold only the rows it touches and its MTTKRP output spans them; the shared
        rows are what it receives and sends (default: every row, a 1/W share shared).
    single_task : the plans run one partition task at a time with ``kernel_threads`` threads
        (the caller passes ``tasks=1``, one partition and all the worker's cores); they are marked
        so (``MemoryPlan.single_task``), which :func:`plan_order` puts after a task per thread.
    """
    S = sum(shape) * rank * itemsize
    modes = ["in-memory", "streaming"] if execution == "auto" else [execution]
    out_bytes = max(shape) * rank * itemsize

    def bounds(in_place: bool) -> list[int]:
        copy_bytes = ThreadOutputs.extra_copies(kernel_threads, scratch=in_place and lend_target) * out_bytes
        return (
            [copy_bytes, DEFAULT_MAX_PRIVATE_BYTES]
            if copy_bytes > DEFAULT_MAX_PRIVATE_BYTES
            else [DEFAULT_MAX_PRIVATE_BYTES]
        )

    # mode-sorted copies: in-memory exact CP-ALS only (randomized CP reads the ALTO-ordered items);
    # memoized pairs beside them: a sweep of one task (one partition, or an owner-computes
    # worker's partitions, all swept by its one task an iteration), orders 3-5
    pairs = memo_pairs and not samples and (owner or partitions_per_mode == 1) and 3 <= len(shape) <= 5
    copies = (["pairs"] if pairs else []) + (["copies", None] if not samples else [None])
    options = [
        (m, ip, BATCH_NNZ, b, mc)
        for ip in (False, True)
        for m in modes
        for b in bounds(ip)
        for mc in (copies if m == "in-memory" else [None])
    ]
    if "streaming" in modes:
        options.append(("streaming", True, LEAN_BATCH_NNZ, LEAN_PRIVATE_BYTES, None))
    plans = []
    if owner:
        options = [o for o in options if o[1]]  # owners update their rows in place
    for mode, in_place, batch_nnz, bound, kept in options:
        mode_copies = kept is not None
        private = bound
        if mode == "in-memory":
            data = worker_nnz * (8 + value_itemsize) + (worker_nnz // 65536 + 1) * (5 * len(shape) + 2) * 8
        else:
            # a batch is whole chunks; two batch buffers (read-ahead) and one chunk of scratch per task
            per_batch = max(1, batch_nnz // max(chunk_nnz, 1)) * chunk_nnz
            data = tasks * (2 * per_batch * (8 + value_itemsize) + chunk_nnz * 8)
        call_nnz = worker_nnz if mode == "in-memory" else min(worker_nnz, per_batch)
        # per-thread outputs are kept over a pass's batches: the whole bound, whatever the batch
        roomy = bound > DEFAULT_MAX_PRIVATE_BYTES
        private = private if roomy else min(private, call_nnz * PRIVATE_REUSE * rank * itemsize)
        # one kernel thread adds straight into its output: no private rows, no row-owned buckets
        single = kernel_threads <= 1
        terms = {
            **_state_terms(shape, rank, itemsize, tasks, partitions_per_mode, split_every, baseline, in_place, workers),
            "private": 0 if single else tasks * private,
            "data": int(data),
            # each copy's index, values and run table (at most RUN_TABLE_BYTES_PER_NNZ); a mode
            # that makes no copy leaves room for the items' packed form (4 bytes a nonzero, packed.py)
            "mode_copies": int(worker_nnz * (8 + value_itemsize + RUN_TABLE_BYTES_PER_NNZ) * len(shape))
            if mode_copies
            else 0,
            # each pair that may be memoized: its copy and memo beyond the two mode copies it replaces,
            # and the wrap pair's copy of the factor rows its memo was made from (at most all of them)
            "mode_pairs": len(shape)
            // 2
            * max(
                0,
                pair_bytes(worker_nnz, len(shape), rank, itemsize, value_itemsize)
                - 2 * int(worker_nnz * (8 + value_itemsize + RUN_TABLE_BYTES_PER_NNZ)),
            )
            + sum(shape) * rank * itemsize
            if kept == "pairs"
            else 0,
            # each bucketed nonzero's index and item (8 bytes each) and its value
            "buckets": 0 if single else tasks * (16 + value_itemsize) * min(OWNED_GROUP_NNZ, call_nnz),
            "transfer": S if workers > 1 and not owner else 0,
            "sampling": 0
            if not samples
            else (sum(tree_nbytes(n, rank) for n in shape) if trees else 0)
            + 2 * samples * (len(shape) + rank + 1) * 8
            + (
                sum(fiber_index_bytes(shape, m, worker_nnz, value_itemsize) for m in range(len(shape)))
                if mode == "in-memory"
                else 0
            )
            + (-(-S // workers) if owner else 0)
            # every worker's copy of the rows of sketched updates (their tree at most as large)
            + (2 * sum(min(n, workers * SPREAD_ROWS) for n in shape) * rank * 8 if owner and trees else 0),
        }
        if samples and index_reads and mode == "streaming":
            # a round's fiber-index reads are not live while an exact pass (the fit's) holds its
            # batch buffers and private rows: only what they exceed adds to the peak
            terms["sampling"] += max(0, index_reads - terms["data"] - terms["private"] - terms["buckets"])
            # the Bloom filters' tables are read in the first sampled round and kept, beside one
            # query's blocks (see FiberIndex.bloom_bytes). From then on an exact
            # MTTKRP runs for the last mode only (the fit), and a gather's output holds at most one
            # mode's rows (and a quarter more for its hit rows): the outputs of the exact warm-up's
            # longest mode, counted above, are free for them then
            last = sum(_output_terms(shape[-1] * rank * itemsize, tasks, partitions_per_mode, split_every, workers))
            sampled = max(last, out_bytes * (SPARSE_ROWS + 1) // SPARSE_ROWS)
            free = 0 if owner else max(0, terms["outputs"] + terms["reduction"] - sampled)
            terms["sampling"] += max(0, int(index_filters) - free)
        # ranks run as padded column groups copy the factors (and keep an output per group)
        terms["column_groups"] = tasks * column_group_bytes(S, max(shape), rank, itemsize)
        if owner:
            # a worker receives at most the rows it shares from each other worker, and sends
            # copies of the rows it touches but does not own
            # (the solve writes A over the summed partial rows, so it needs no array of its own)
            row = rank * itemsize
            touched, shared = owner_rows if owner_rows is not None else (shape, [-(-s // workers) for s in shape])
            terms.update(
                factors=sum(touched) * row,
                outputs=max(touched) * row,
                reduction=(workers - 1) * max(shared) * row,
                update=max(shared) * row,
                column_groups=tasks * column_group_bytes(sum(touched) * row, max(touched), rank, itemsize),
            )
        plans.append(
            MemoryPlan(
                mode,
                in_place,
                batch_nnz,
                bound,
                terms,
                limit or None,
                usable_fraction(),
                mode_copies,
                kept == "pairs",
                single_task=single_task,
                kernel_threads=max(1, int(kernel_threads)),
            )
        )
    plans.sort(key=plan_order)
    return plans


def choose(plans: list[MemoryPlan], what: str = "the CP-ALS worker") -> MemoryPlan:
    """The first plan that fits; :class:`MemoryPlanError` with the figures if none does."""
    for p in plans:
        if p.fits:
            return p
    floor = min(plans, key=lambda p: p.peak)
    raise MemoryPlanError(
        f"{what} needs more memory than its limit allows: the leanest execution ({floor.describe()}) "
        f"needs a worker memory limit of at least {_mib(floor.required_limit)} "
        f"({floor.required_limit / 1e9:.2f} GB); give the workers more memory (e.g. "
        f"LocalCluster(memory_limit='{math.ceil(floor.required_limit / 1e8) / 10:.1f}GB')), use fewer threads per "
        f"worker, or a lower rank",
        floor.required_limit,
        floor,
    )


def dense_candidates(
    *,
    shape: tuple[int, ...],
    rank: int,
    itemsize: int,
    worker_bytes: int,
    chunk_bytes: int,
    chunk_shape: tuple[int, ...],
    tasks: int,
    kernel_threads: int,
    partitions_per_mode: int,
    workers: int,
    baseline: int,
    limit: int | None,
    execution: str = "auto",
    split_every: int = 4,
) -> list[MemoryPlan]:
    """:func:`candidates` for a dense array, whose partitions are whole stored chunks.

    The terms are those of the sparse plan, except ``data``: in memory, the worker's chunks cast to
    the factors' dtype (``worker_bytes``); streamed, per task two chunks in the factors' dtype (the
    one computed on and the one read ahead) and the stored chunk being decoded (``chunk_bytes``
    each: the largest chunk in the factors' dtype). ``private`` is the dense kernel's working set
    per task: the factor rows a chunk touches, stacked (sum of ``chunk_shape`` x R), and a chunk's
    rows of the target mode by R per kernel thread. A dense plan has no batches or buckets to make
    leaner; its floor is one chunk in flight per task.
    """
    S = sum(shape) * rank * itemsize
    modes = ["in-memory", "streaming"] if execution == "auto" else [execution]
    plans = []
    for in_place in (False, True):
        for mode in modes:
            data = worker_bytes if mode == "in-memory" else tasks * 3 * chunk_bytes
            terms = {
                **_state_terms(
                    shape, rank, itemsize, tasks, partitions_per_mode, split_every, baseline, in_place, workers
                ),
                "private": tasks * (kernel_threads * max(chunk_shape) + sum(chunk_shape)) * rank * itemsize,
                "data": int(data),
                "transfer": S if workers > 1 else 0,
            }
            plans.append(MemoryPlan(mode, in_place, 0, 0, terms, limit or None, usable_fraction()))
    plans.sort(key=lambda p: _ORDER[(p.execution, p.in_place)])
    return plans
