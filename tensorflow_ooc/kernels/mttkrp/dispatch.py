"""``mttkrp``: matricized tensor times Khatri-Rao product on BLCO data, any mode, one copy."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import numba as nb
import numpy as np

from ...format import BitLayout, BLCOTensor
from ...store import Chunk, Store
from ..factors import StackedFactors, aligned_empty, aligned_zeros
from .column_groups import column_block, column_groups
from .cpu import (
    PREFETCH_MIN_BYTES,
    kernel_for,
    merge_private,
    merge_private_serial,
    merge_thread_buffers,
    merge_thread_buffers_serial,
)
from .mode_order import copies_fit, mode_sorted
from .owned import run_owned
from .packed import pack_items, packed_pays, run_packed
from .plan import DEFAULT_MAX_PRIVATE_BYTES, ConflictPlan, WorkItems, balanced_bounds, plan_conflicts, work_items

MERGE_TILE = 256
SCRATCH_KEEP_BYTES = 64 << 20
# atomic items' nonzeros from which row-owned tiles replace atomic adds (see owned)
OWNED_MIN_NNZ = 1 << 16
# per-thread whole outputs (ThreadOutputs) for outputs of at least this many rows, where a call
# has at least THREAD_OUTPUT_NNZ_PER_ROW nonzeros per row of the extra outputs (their zeroing
# and merging then cost less than the row-owned tiles' bucketing and lost locality); decoded
# in-memory items take them at any length (docs/KERNELS.md, "Mode-sorted copies")
THREAD_OUTPUT_MIN_ROWS = 1 << 18
THREAD_OUTPUT_NNZ_PER_ROW = 2.0

_SCRATCH = threading.local()


def private_scratch(rows: int, rank: int, dtype: Any) -> np.ndarray:
    """An uninitialized (rows, rank) buffer for private accumulators (the kernels zero what they
    use). Buffers up to ``SCRATCH_KEEP_BYTES`` are kept per thread and reused: streaming calls the
    kernels once per batch, and fresh allocations of that size are page-faulted in every time."""
    nbytes = rows * rank * np.dtype(dtype).itemsize
    if nbytes > SCRATCH_KEEP_BYTES:
        return aligned_empty((rows, rank), dtype)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _SCRATCH.buf = aligned_empty(max(nbytes, 1 << 20), np.uint8)
    return buf[:nbytes].view(dtype).reshape(rows, rank)


# entries (dense) or nonzeros (sparse) per kernel thread below which a pass runs on fewer
# threads: a parallel region's start and barrier cost more than a smaller share, and on a loaded
# machine a descheduled thread makes every region wait milliseconds (a 64^3 store, R16, 2 threads
# under load: 22 ms a mode against 0.36 ms on one thread)
PARALLEL_MIN_ENTRIES = 1 << 15


def threads_for(threads: int | None, entries: int) -> int | None:
    """The kernel threads of a pass over ``entries`` entries or nonzeros: ``threads`` (None: the
    caller's setting), fewer where a thread's share would hold under ``PARALLEL_MIN_ENTRIES``."""
    if threads is None:
        return None
    return max(1, min(int(threads), int(entries) // PARALLEL_MIN_ENTRIES))


@contextmanager
def numba_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    old = nb.get_num_threads()
    nb.set_num_threads(max(1, min(int(threads), nb.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        nb.set_num_threads(old)


class ThreadOutputs:
    """Whole per-thread outputs for the items without private accumulators (ALTO's per-thread
    output for long modes): thread ``g`` of a call adds a contiguous, nonzero-balanced share of
    those items, in ALTO order, into ``out`` (``g = 0``) or its own zeroed copy, with plain
    stores. Unlike row-owned tiles (:mod:`.owned`) nothing is bucketed, and every mode's
    rows keep the ALTO order's locality. Kept across the batches of one pass (allocated at the
    first use); :meth:`merge` adds the copies into ``out`` once at the end. Sums depend on the
    thread count, as atomic adds' do.

    ``scratch``, an array of ``out``'s shape the caller may overwrite (CP-ALS with in-place
    updates lends the target mode's own factor rows, which the MTTKRP does not read and the
    update then overwrites), serves as the second thread's copy, so two threads need no memory
    beyond ``out``."""

    def __init__(self, out: np.ndarray, threads: int, scratch: np.ndarray | None = None) -> None:
        self.out = out
        self.threads = max(1, int(threads))
        self.scratch = scratch
        self.first: np.ndarray | None = None
        self.bufs: np.ndarray | None = None

    @staticmethod
    def extra_copies(threads: int, scratch: bool = False) -> int:
        """Copies to allocate for ``threads`` threads (the first is lent with ``scratch``)."""
        return max(0, int(threads) - 1 - (1 if scratch else 0))

    @staticmethod
    def pays(
        out: np.ndarray, nnz: int, threads: int, max_bytes: int, scratch: bool = False, resident: bool = False
    ) -> bool:
        """Whether a pass of ``nnz`` nonzeros into ``out`` should use them: a long output, the
        allocated copies within ``max_bytes``, and enough nonzeros per copied row. One thread
        always: its output is ``out`` itself, so nothing is copied, zeroed or merged, and plain
        adds into it beat both private accumulators and row-owned tiles (Amazon-shaped, 43 M
        nonzeros streamed, R16, one thread: 2.4-2.7 s a mode against 3.5-4.6 s).

        ``resident``: the pass is one call over decoded in-memory items, which take them at any
        output length (see :data:`THREAD_OUTPUT_MIN_ROWS`)."""
        copies = max(0, int(threads) - 1)
        if copies == 0:
            return True
        return (
            (resident or out.shape[0] >= THREAD_OUTPUT_MIN_ROWS)
            and ThreadOutputs.extra_copies(threads, scratch) * out.nbytes <= max_bytes
            and nnz >= THREAD_OUTPUT_NNZ_PER_ROW * copies * out.shape[0]
        )

    @classmethod
    def for_pass(
        cls,
        out: np.ndarray,
        nnz: int,
        max_bytes: int,
        force: bool = False,
        scratch: np.ndarray | None = None,
        resident: bool = False,
    ) -> "ThreadOutputs | None":
        """Per-thread outputs for a pass of ``nnz`` nonzeros into ``out`` on this call's numba
        threads where they pay (:meth:`pays`; ``resident``: over decoded in-memory items) or are
        asked for (``force``), else None."""
        threads = nb.get_num_threads()
        if force or cls.pays(out, nnz, threads, max_bytes, scratch=scratch is not None, resident=resident):
            return cls(out, threads, scratch)
        return None

    @classmethod
    def for_sorted(
        cls, out: np.ndarray, items: WorkItems, mode: int, max_bytes: int, scratch: np.ndarray | None = None
    ) -> "ThreadOutputs | None":
        """Per-thread outputs for mode-sorted ``items`` (:mod:`.mode_order`) where they move fewer
        bytes than the items' private accumulators would: each thread's runs then add straight into
        its own whole output, zeroed and merged once, instead of every item zeroing and merging
        its interval. Nips-shaped (3.1 M nonzeros, items spanning 10-13 MiB of private rows per
        mode), R16, 2 threads: 18.4 -> 15.9 ms for all modes; uber 14.4 -> 14.2, chicago 19.1 ->
        18.7. None where the copies would exceed ``max_bytes`` or move more."""
        threads = nb.get_num_threads()
        if threads == 1:
            return cls(out, 1)  # the output itself: nothing to zero or merge (see pays)
        rows = np.maximum(items.hi[:, mode] - items.lo[:, mode] + 1, 0)
        private = int(rows.sum()) * out.shape[1] * out.itemsize
        if threads * out.nbytes < private and cls.extra_copies(threads, scratch is not None) * out.nbytes <= max_bytes:
            return cls(out, threads, scratch)
        return None

    @classmethod
    def for_items(
        cls,
        out: np.ndarray,
        items: WorkItems | None,
        mode: int,
        nnz: int,
        max_bytes: int,
        force: bool = False,
        scratch: np.ndarray | None = None,
    ) -> "ThreadOutputs | None":
        """:meth:`for_sorted` where ``items`` are sorted by ``mode``, else :meth:`for_pass` for a pass
        of ``nnz`` nonzeros (``items`` None: the pass's items are not known yet, e.g. streamed;
        else the decoded in-memory items, a ``resident`` pass)."""
        if items is not None and items.sorted_mode == mode:
            return cls.for_sorted(out, items, mode, max_bytes, scratch=scratch)
        return cls.for_pass(out, nnz, max_bytes, force=force, scratch=scratch, resident=items is not None)

    def buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """``(first, rest)``: the second thread's copy and the others' (zeroed at first use)."""
        if self.bufs is None:
            shape, dtype = self.out.shape, self.out.dtype
            if self.threads < 2:
                self.first = np.zeros((0, shape[1]), dtype)
            elif self.scratch is not None:
                self.first = self.scratch
                self.first[...] = 0
            else:
                self.first = aligned_zeros(shape, dtype)
            self.bufs = aligned_zeros((max(0, self.threads - 2),) + shape, dtype)
        return self.first, self.bufs

    def merge(self) -> None:
        if self.bufs is not None and self.threads > 1:
            serial = threads_for(nb.get_num_threads(), self.out.size * (self.bufs.shape[0] + 1)) == 1
            (merge_thread_buffers_serial if serial else merge_thread_buffers)(self.out, self.first, self.bufs)
        self.first = self.bufs = None


def tensor_items(tensor: BLCOTensor, mode: int | None = None) -> WorkItems:
    """Work items of an in-memory BLCO tensor, computed once and kept on the tensor; with
    ``mode``, its mode-sorted copy where that pays and fits the free memory
    (:mod:`~tensorflow_ooc.kernels.mttkrp.mode_order`), made on first use and kept too."""
    b = tensor.blocks
    whole = tensor.derived(
        "work_items", lambda: work_items(tensor.index, tensor.values, b.start, b.start + b.count, b.base, tensor.layout)
    )
    if mode is None:
        return whole
    layout = tensor.layout
    copy = tensor.derived(
        ("mode_items", mode),
        lambda: mode_sorted(whole, layout, mode) if copies_fit(whole, layout.nmodes) else None,
    )
    return copy if copy is not None else whole


def chunk_items(chunk: Chunk, layout: BitLayout) -> WorkItems:
    seg = chunk.segments
    return work_items(chunk.index, chunk.values, seg[:, 1], seg[:, 2], chunk.bases, layout)


def check_factors(factors: Sequence[np.ndarray] | StackedFactors, shape: Sequence[int], mode: int) -> StackedFactors:
    """Validate factor matrices before the unchecked kernels see them; stack a list."""
    N = len(shape)
    if not 0 <= mode < N:
        raise ValueError(f"mode {mode} is out of range for a {N}-mode tensor")
    if isinstance(factors, StackedFactors):
        stacked = factors
        rows = stacked.shape
    else:
        if len(factors) != N:
            raise ValueError(f"expected {N} factor matrices, got {len(factors)}")
        ranks = {np.shape(f)[1] if np.ndim(f) == 2 else None for f in factors}
        if len(ranks) != 1 or None in ranks:
            raise ValueError(
                f"factor matrices must be 2-D with one common rank, got shapes {[np.shape(f) for f in factors]}"
            )
        rows = tuple(np.shape(f)[0] for f in factors)
        stacked = None
    if len(rows) != N:
        raise ValueError(f"expected {N} factor matrices, got {len(rows)}")
    for m in range(N):
        if rows[m] < shape[m]:
            raise ValueError(f"factor {m} has {rows[m]} rows but mode {m} has length {shape[m]}")
    if stacked is None:
        dtype = np.result_type(*[np.asarray(f).dtype for f in factors])
        stacked = StackedFactors.from_list(factors, dtype if dtype in (np.float32, np.float64) else np.float64)
    if stacked.dtype not in (np.float32, np.float64):
        raise ValueError(f"factor matrices must be float32 or float64, got {stacked.dtype}")
    return stacked


def run_items(
    items: WorkItems,
    layout: BitLayout,
    factors: StackedFactors,
    mode: int,
    out: np.ndarray,
    conflict: str = "auto",
    max_private_bytes: int = DEFAULT_MAX_PRIVATE_BYTES,
    out_lo: int = 0,
    thread_outputs: ThreadOutputs | None = None,
    poisson_eps: float | None = None,
) -> ConflictPlan:
    """Add the MTTKRP of ``items`` into ``out``, which holds target rows ``out_lo ..``
    (all rows the items touch must be inside); returns the conflict plan used. With
    ``thread_outputs`` (for ``out``; ``conflict`` "auto" or "threads") the items without a private
    accumulator go to per-thread outputs instead of row-owned tiles or atomic adds; the caller
    merges them after its last call.

    ``poisson_eps``: CP-APR's Phi instead, each value divided by ``max(model value, eps)`` with
    the target mode's rows of ``factors`` as the model's (see :mod:`.cpu`); the caller keeps
    ranks run in column groups on the two-pass form (the model value needs every column)."""
    R = out.shape[1]
    poisson = poisson_eps is not None
    if poisson and column_groups(R, factors.data.nbytes) is not None:
        raise ValueError("the fused Phi kernels take no column groups; reweight the values first")
    if column_groups(R, factors.data.nbytes) is not None:
        # a pass of one batch: its groups' blocks and outputs made, used and merged here
        one = MttkrpPass(factors, out, thread_outputs)
        plan = one.run(items, layout, mode, conflict, max_private_bytes, out_lo)
        one.finish()
        return plan
    own_outputs = conflict == "threads" and thread_outputs is None
    if own_outputs:
        thread_outputs = ThreadOutputs(out, nb.get_num_threads())
    # with per-thread outputs every item adds there: private accumulators over an item's interval
    # of a long mode cost more to zero and merge than the item's nonzeros (docs/KERNELS.md)
    threads_plan = conflict == "threads" or (conflict == "auto" and thread_outputs is not None)
    plan = plan_conflicts(
        items, mode, R, out.dtype.itemsize, "threads" if threads_plan else conflict, max_private_bytes
    )
    if items.nitems == 0:
        return plan
    priv_buf = private_scratch(max(1, int(plan.size.sum())), R, out.dtype)
    k = kernel_for(layout.nmodes, R, items.delta, factors.data.nbytes > PREFETCH_MIN_BYTES, poisson)
    direct, runs, runs_atomic, threads_k, runs_threads, table_threads = (
        k.direct, k.runs, k.runs_atomic, k.threads, k.runs_threads, k.table_threads
    )  # fmt: skip
    eps = (float(poisson_eps),) if poisson else ()
    mask = items.masks(layout)
    common = (
        items.index,
        items.values,
        items.start,
        items.end,
        items.base,
        items.prev,
        items.lo,
        layout.field_shift,
        mask,
        factors.data,
        factors.offsets,
        mode,
        R,
    )
    todo_direct = np.flatnonzero(~plan.runs)
    shared = ~plan.private
    # items without a private accumulator: row-owned tiles instead of atomic adds, unless atomics
    # are asked for or too few nonzeros need them to pay for bucketing
    threaded = threads_plan and bool(shared.any())
    # (row-owned tiles have no Phi form: Poisson passes take atomics or per-thread outputs)
    owned = (
        not threaded
        and not poisson
        and (
            conflict == "owned"
            or (conflict == "auto" and int((items.end - items.start)[shared].sum()) >= OWNED_MIN_NNZ)
        )
    )
    todo_runs = np.flatnonzero(plan.runs & plan.private)
    todo_atomic = np.flatnonzero(plan.runs & ~plan.private) if not (owned or threaded) else todo_runs[:0]
    if todo_direct.size:
        direct(*common, todo_direct, plan.offset, plan.size, priv_buf, *eps)
    if todo_runs.size:
        runs(*common, todo_runs, plan.offset, plan.size, priv_buf, *eps)
    if todo_atomic.size:
        runs_atomic(*common, todo_atomic, out.reshape(-1), out_lo, *eps)
    if owned and shared.any():
        run_owned(items, layout, factors, mode, out, out_lo, np.flatnonzero(shared))
    if threaded:
        todo = np.flatnonzero(shared)
        first, bufs = thread_outputs.buffers()
        T = thread_outputs.threads
        if table_threads is not None and items.sorted_mode == mode and items.runs is not None and shared.all():
            # the copy's run table: the target row of each run read once (see _table_source)
            ptr, rows, run_item = items.runs
            cuts = np.searchsorted(ptr[1:], ptr[0] + (ptr[-1] - ptr[0]) * np.arange(1, T) / T, side="right")
            bounds = np.concatenate([[0], cuts, [rows.shape[0]]]).astype(np.int64)
            table_threads(
                ptr,
                rows,
                run_item,
                items.index,
                items.values,
                items.base,
                layout.field_shift,
                mask,
                factors.data,
                factors.offsets,
                mode,
                R,
                bounds,
                out,
                first,
                bufs,
                out_lo,
            )
        else:
            bounds = balanced_bounds((items.end - items.start)[todo], T)
            # mode-sorted items sum each target row's run in registers first
            (runs_threads if items.sorted_mode == mode else threads_k)(
                *common, todo, bounds, out, first, bufs, out_lo, *eps
            )
        if own_outputs:
            thread_outputs.merge()
    if plan.private.any():
        serial = threads_for(nb.get_num_threads(), int(plan.size.sum()) * R) == 1
        (merge_private_serial if serial else merge_private)(
            out, out_lo, plan.private, plan.offset, items.lo, items.hi, mode, priv_buf, MERGE_TILE
        )
    return plan


class MttkrpPass:
    """One pass of a mode's MTTKRP into ``out`` over batches of work items: :func:`run_items` per
    batch, with what the batches share set up once.

    For a rank run as padded column groups (:mod:`.column_groups`), the factor blocks are copied
    and each group's output (with per-thread copies of its own where the pass has
    ``thread_outputs``) allocated at the first batch and kept to the end, where :meth:`finish`
    adds them into ``out``: called per batch, :func:`run_items` copied, zeroed and added them
    again for every batch of a streamed pass. Otherwise :meth:`finish` merges ``thread_outputs``.
    """

    def __init__(
        self,
        factors: StackedFactors,
        out: np.ndarray,
        thread_outputs: ThreadOutputs | None = None,
        poisson_eps: float | None = None,
    ) -> None:
        self.factors = factors
        self.out = out
        self.shared = thread_outputs
        self.groups = column_groups(out.shape[1], factors.data.nbytes)
        # CP-APR's Phi (see run_items), fused where one pass sees every column: no groups, or one
        # padded group (its zero columns add nothing to the model value); None where the rank
        # runs in several groups (the caller reweights the values first)
        self.poisson_eps = poisson_eps if self.groups is None or len(self.groups) == 1 else None
        self._blocks: list[tuple[int, int, StackedFactors, np.ndarray, ThreadOutputs | None]] | None = None

    def run(
        self,
        items: WorkItems,
        layout: BitLayout,
        mode: int,
        conflict: str = "auto",
        max_private_bytes: int = DEFAULT_MAX_PRIVATE_BYTES,
        out_lo: int = 0,
    ) -> ConflictPlan:
        """Add the MTTKRP of one batch (see :func:`run_items`); returns its (first group's) plan."""
        if self.groups is None:
            return run_items(
                items,
                layout,
                self.factors,
                mode,
                self.out,
                conflict,
                max_private_bytes,
                out_lo,
                self.shared,
                self.poisson_eps,
            )
        if self._blocks is None:
            self._blocks = []
            for first, real, width in self.groups:
                part = aligned_zeros((self.out.shape[0], width), self.out.dtype)
                shared = None if self.shared is None else ThreadOutputs(part, self.shared.threads)
                self._blocks.append((first, real, column_block(self.factors, first, real, width), part, shared))
        plans = [
            run_items(items, layout, block, mode, part, conflict, max_private_bytes, out_lo, shared, self.poisson_eps)
            for _, _, block, part, shared in self._blocks
        ]
        return plans[0]

    def finish(self) -> None:
        """Merge what the pass kept apart into ``out`` (once, after the last batch)."""
        if self.groups is None:
            if self.shared is not None:
                self.shared.merge()
            return
        for first, real, _, part, shared in self._blocks or ():
            if shared is not None:
                shared.merge()
            self.out[:, first : first + real] += part[:, :real]


def mttkrp(
    tensor: Store | BLCOTensor | Iterable[Chunk | WorkItems],
    factors: Sequence[np.ndarray],
    mode: int,
    *,
    out: np.ndarray | None = None,
    threads: int | None = None,
    conflict: str = "auto",
    max_private_bytes: int = DEFAULT_MAX_PRIVATE_BYTES,
    stats: dict | None = None,
    layout: BitLayout | None = None,
) -> np.ndarray:
    """Mode-``mode`` MTTKRP: ``M[i_n, :] = sum over nonzeros x * prod_{m != n} A_m[i_m, :]``.

    Parameters
    ----------
    tensor : Store, BLCOTensor, or iterable of store Chunks or WorkItems batches
        A store is read chunk by chunk through Zarr (``tensorflow_ooc.mttkrp`` streams it through
        the fast chunk reader instead); an in-memory tensor keeps its work items between calls.
    factors : StackedFactors, or sequence of (I_m, R) arrays, one per mode (the target's is not read)
        float64 or float32; the output has their dtype. A list is stacked (copied) per call.
    mode : int
        Target mode.
    out : ndarray (I_mode, R), optional
        Overwritten with the result.
    threads : int, optional
        Numba threads for this call (default: the numba setting).
    conflict : {"auto", "private", "atomic", "owned", "threads"}
        Conflict resolution; "auto" follows the heuristic in :mod:`tensorflow_ooc.kernels.mttkrp.plan`
        and gives long outputs per-thread copies (:class:`ThreadOutputs`) where they fit
        ``max_private_bytes`` and pay; "owned": row-owned tiles; "threads": per-thread copies.
    max_private_bytes : int
        Bound on the private accumulators' memory.
    stats : dict, optional
        Filled with the plan summary: items, private/atomic items and private bytes.
    layout : BitLayout, optional
        Needed only for an iterable of chunks.

    Returns
    -------
    ndarray (I_mode, R)

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> t = tfo.encode_coo(np.array([[0, 1, 2], [1, 1, 0]]), np.array([2.0, 3.0]), (2, 2, 3))
    >>> A = [np.ones((2, 4)), np.ones((2, 4)), np.ones((3, 4))]
    >>> tfo.mttkrp(t, A, 0)[:, 0]
    array([2., 3.])
    """
    if isinstance(tensor, Store):
        layout, shape, chunks = tensor.layout, tensor.shape, tensor.iter_chunks()
    elif isinstance(tensor, BLCOTensor):
        layout, shape, chunks = tensor.layout, tensor.shape, None
    else:
        if layout is None:
            raise ValueError("pass layout= with an iterable of chunks")
        shape, chunks = layout.shape, iter(tensor)
    A = check_factors(factors, shape, mode)
    R = A.rank
    if out is None:
        out = aligned_zeros((shape[mode], R), A.dtype)
    else:
        if out.shape != (shape[mode], R) or out.dtype != A.dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"out must be a C-contiguous {A.dtype} array of shape {(shape[mode], R)}, got {out.dtype} {out.shape}"
            )
        out[...] = 0
    summary = {"items": 0, "private_items": 0, "atomic_items": 0, "run_items": 0, "private_bytes": 0}
    with numba_threads(threads):
        # an in-memory tensor: its mode-sorted items where kept (runs kernels)
        whole = tensor_items(tensor, mode if conflict == "auto" else None) if chunks is None else None
        shared = None
        if conflict in ("auto", "threads"):
            shared = ThreadOutputs.for_items(
                out, whole, mode, int(getattr(tensor, "nnz", 0)), max_private_bytes, force=conflict == "threads"
            )
        parts = (
            [whole] if chunks is None else (c if isinstance(c, WorkItems) else chunk_items(c, layout) for c in chunks)
        )
        run = MttkrpPass(A, out, shared)
        if (
            chunks is None
            and conflict == "auto"
            and shared is not None
            and whole.sorted_mode != mode
            and run.groups is None
            and packed_pays(A, R)
        ):
            # the ALTO-ordered items' 32-bit form, made once and kept on the tensor (packed.py)
            packed = tensor.derived("packed_items", lambda: pack_items(tensor_items(tensor), layout))
            first, bufs = shared.buffers()
            run_packed(packed, A, mode, out, 0, shared.threads, first, bufs)
            summary.update(plan_conflicts(whole, mode, R, out.dtype.itemsize, "threads").summary())
            parts = []
        for items in parts:
            plan = run.run(items, layout, mode, conflict, max_private_bytes).summary()
            for k in ("items", "private_items", "atomic_items", "run_items"):
                summary[k] += plan[k]
            summary["private_bytes"] = max(summary["private_bytes"], plan["private_bytes"])
        run.finish()
    if stats is not None:
        stats.update(summary, mode=mode, strategy=conflict)
    return out


def compile_kernels(
    nmodes: int = 3, ranks: Sequence[int] = (8, 16, 32, 64, 7), dtypes: Sequence[Any] = (np.float64,)
) -> float:
    """Compile (or load from the on-disk cache) the kernels for ``nmodes``; returns the seconds spent.

    Benchmarks call this first so JIT time is reported apart from kernel timings.
    """
    from ...format import encode_coo

    t0 = time.perf_counter()
    shape = (3,) * nmodes
    t = encode_coo(np.array([[1] * nmodes, [2] * nmodes]), np.array([1.0, 2.0]), shape)
    for dtype in dtypes:
        for R in ranks:
            A = [np.ones((3, R), dtype=dtype) for _ in range(nmodes)]
            for conflict in ("private", "atomic", "threads"):
                mttkrp(t, A, 0, conflict=conflict)
            # the runs kernels, as mode-sorted items use them: private rows, atomics, per-thread outputs
            F = StackedFactors.from_list(A)
            items = mode_sorted(tensor_items(t), t.layout, 0, run_min=0)
            for conflict in ("private", "atomic"):
                run_items(items, t.layout, F, 0, np.zeros((3, R), dtype), conflict=conflict)
            out = np.zeros((3, R), dtype)
            run_items(items, t.layout, F, 0, out, thread_outputs=ThreadOutputs(out, nb.get_num_threads()))
    return time.perf_counter() - t0
