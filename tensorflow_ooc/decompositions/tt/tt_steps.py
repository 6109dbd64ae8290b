"""The pieces of exact TT-ALS (seed 000, section 5.2), each a small function that
:func:`~tensorflow_ooc.decompositions.tt.tt_als.tt_als` calls in order: rank and init checks, the
initial cores (random, then right-orthonormal), the sweep order, the core update that a Dask
worker runs on the partitions' right-hand sides, and the summary the driver reads per sweep.

The canonical form the updates keep (Proposition 5.2.1): when core ``j`` is updated, the cores
left of it are left-orthonormal (``core_k`` reshaped ``(R_{k-1} I_k, R_k)`` has orthonormal
columns) and those right of it right-orthonormal (reshaped ``(R_{k-1}, I_k R_k)``, orthonormal
rows). The least-squares problem of Proposition 5.2.2 then has an orthonormal design matrix, its
solution is the contraction ``Y_j`` (:mod:`~tensorflow_ooc.kernels.tt.cpu`), and the error of the
updated train is ``||X||^2 - ||Y_j||^2``. After the update a QR moves the orthogonality on: the
core keeps ``Q`` and its neighbour in the sweep's direction absorbs ``R``.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.linalg import lapack as _lapack

from ...blas_threads import one_blas_thread
from ...errors import DecompositionError, format_bytes
from ...execution.concurrent_gather import gather_partitions
from ...execution.partials import Partial
from ...execution.tasks import PartitionData
from ...kernels.sampling.krp_sampler import SampleSet
from ...kernels.sampling.tt_sampler import CoreTree
from ...kernels.tt.cores import TTCores
from ..common.model_checks import check_memory, check_seed
from .tt_randomized import draw_core, prepare_walks, sketched_gram_pinv, sketched_slices

INITS = ("random",)

# a core's QR below this many entries runs on one BLAS thread: a tall, thin QR gains little from
# more, and spinning BLAS threads take the cores from the numba passes (docs/EXECUTION.md)
ONE_BLAS_THREAD_ENTRIES = 1 << 22
# Cholesky QR (twice) for matrices of at least this many rows a column, while the first factor's
# condition number stays below the bound (its orthogonality is then to rounding, as Householder's)
CHOLESKY_QR_ROWS = 16
CHOLESKY_QR_MAX_COND = 1e6


class TTState(TTCores):
    """The tensor train between core updates, with what the sweep's updates report: ``norm_sq``
    (``||Y_j||^2`` of the last update) and per update ``(mode, contraction seconds of the slowest
    partition task, update seconds, finish time, draw seconds)`` (draws: 0 for an exact update).

    ``trees``: randomized TT-ALS's sampler trees by ``(core, side)``
    (:func:`~tensorflow_ooc.decompositions.tt.tt_randomized.draw_core` fills it), handed on by
    :meth:`copy` and dropped for a core :meth:`set_core` or :meth:`set_slices` writes: an update changes two cores, and
    rebuilding every other core's tree took 2-22 ms an update at R = 4-12 on nell2-shaped cores. A
    cache: not pickled (a state moved to another worker rebuilds its trees there)."""

    def __init__(self, shape: Sequence[int], ranks: Sequence[int], data: np.ndarray | None = None) -> None:
        super().__init__(shape, ranks, data)
        self.norm_sq = 0.0
        self.steps: list[tuple[int, float, float, float, float]] = []
        self.trees: dict[tuple[int, str], CoreTree] = {}

    def set_slices(self, k: int, slices: np.ndarray) -> None:
        super().set_slices(k, slices)
        for key in [key for key in self.trees if key[0] == k]:
            del self.trees[key]

    def copy(self) -> "TTState":
        out = TTState(self.shape, self.ranks, self.data.copy())
        out.norm_sq, out.steps, out.trees = self.norm_sq, list(self.steps), dict(self.trees)
        return out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "trees": {}}


@dataclass
class SweepSummary:
    """What the driver reads after a sweep."""

    norm_sq: float  # ||Y_j||^2 of the sweep's last update: ||X||^2 minus the squared error
    steps: list[tuple[int, float, float, float, float]] = field(default_factory=list)


# --- checks --------------------------------------------------------------------------------------


def check_ranks(ranks: int | Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """The full rank vector ``(R_0, R_1, ..., R_{N-1}, R_N)`` with ``R_0 = R_N = 1``, from one
    integer (every inner rank) or ``N - 1`` integers; :class:`DecompositionError` (a ValueError)
    naming the rank and the reason otherwise.

    ``ranks[k]`` links cores ``k`` and ``k + 1`` (0-based). It can be at most the smaller side
    of the unfolding ``X_(<=k)`` (``prod I_0..I_k`` rows, ``prod I_{k+1}..I_{N-1}`` columns), and
    the canonical form needs ``R_{k+1} <= R_k I_k`` and ``R_k <= I_k R_{k+1}`` for every core
    (else its QR cannot keep the rank)."""
    shape = [int(s) for s in shape]
    N = len(shape)
    if N < 2:
        raise DecompositionError(f"a tensor train needs a tensor of order >= 2, got shape {tuple(shape)}")
    if isinstance(ranks, numbers.Integral) and not isinstance(ranks, bool):
        ranks = [int(ranks)] * (N - 1)
    try:
        if isinstance(ranks, (str, bytes)):
            raise TypeError
        inner = list(ranks)
    except TypeError:
        raise DecompositionError(f"ranks must be an integer or {N - 1} integers, got {ranks!r}") from None
    if len(inner) != N - 1:
        raise DecompositionError(
            f"ranks {tuple(inner)} give {len(inner)} values; a tensor train of order {N} (shape {tuple(shape)}) "
            f"has {N - 1} inner ranks (R_0 = R_N = 1 are implied)"
        )
    for k, r in enumerate(inner):
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            raise DecompositionError(f"ranks[{k}] must be an integer, got {r!r}")
        if int(r) < 1:
            raise DecompositionError(f"ranks[{k}] is {int(r)}; every TT rank must be >= 1")
        rows, cols = math.prod(shape[: k + 1]), math.prod(shape[k + 1 :])
        if int(r) > min(rows, cols):
            raise DecompositionError(
                f"ranks[{k}] is {int(r)} (between cores {k} and {k + 1}); it can be at most {min(rows, cols)}, the "
                f"smaller side of the unfolding X_(<={k}) ({rows} rows = {_product(0, k)}, {cols} columns = "
                f"{_product(k + 1, N - 1)})"
            )
    full = [1] + [int(r) for r in inner] + [1]
    for k in range(N):
        if full[k + 1] > full[k] * shape[k]:
            raise DecompositionError(
                f"ranks[{k}] is {full[k + 1]} (between cores {k} and {k + 1}); it can be at most "
                f"R_{k} * I_{k} = {full[k]} * {shape[k]} = {full[k] * shape[k]}, or core {k} cannot be "
                f"left-orthonormal: lower it or raise the ranks before it"
            )
        if full[k] > shape[k] * full[k + 1]:
            raise DecompositionError(
                f"ranks[{k - 1}] is {full[k]} (between cores {k - 1} and {k}); it can be at most "
                f"I_{k} * R_{k + 1} = {shape[k]} * {full[k + 1]} = {shape[k] * full[k + 1]}, or core {k} cannot be "
                f"right-orthonormal: lower it or raise the ranks after it"
            )
    check_core_memory(shape, full)
    return tuple(full)


def check_core_memory(shape: Sequence[int], ranks: Sequence[int]) -> None:
    """Refuse cores that this machine's memory cannot hold, before any is allocated (NumPy's
    "array is too big" or "Unable to allocate" otherwise, naming no mode): core ``k`` holds
    ``R_{k-1} * I_k * R_k`` float64 values, a slice for every index of mode ``k``, and the initial
    cores are drawn here, on the client, all in one piece."""
    sizes = [int(ranks[k]) * int(shape[k]) * int(ranks[k + 1]) * 8 for k in range(len(shape))]
    check_memory(
        sizes,
        lambda k, total, memory: (
            f"the tensor train's core {k} would need {sizes[k]:,} bytes ({format_bytes(sizes[k])}): mode {k} has "
            f"length {int(shape[k]):,}, and the core holds R_{k} * I_{k} * R_{k + 1} = {int(ranks[k])} * "
            f"{int(shape[k]):,} * {int(ranks[k + 1])} float64 values (all cores: {total:,} bytes), more than this "
            f"machine's {memory:,} bytes of memory ({format_bytes(memory)}); TT-ALS keeps a slice for every index "
            f"of every mode: re-index a mode to the indices it uses, or lower the ranks"
        ),
    )


def _product(lo: int, hi: int) -> str:
    """The name of the product of the mode lengths ``I_lo .. I_hi``."""
    return f"I_{lo}" if lo == hi else f"I_{lo}*...*I_{hi}"


def check_init(init: str | Sequence[np.ndarray], shape: Sequence[int], ranks: Sequence[int]) -> str | list[np.ndarray]:
    """``init`` is "random" or ``N`` finite cores of shapes ``(R_{k-1}, I_k, R_k)`` (``ranks`` the
    full rank vector), returned as float64 copies."""
    if isinstance(init, str):
        if init not in INITS:
            raise DecompositionError(f"init must be one of {INITS} or a list of cores, got {init!r}")
        return init
    try:
        cores = [np.array(c, dtype=np.float64) for c in init]
    except (TypeError, ValueError):
        raise DecompositionError(f"init must be one of {INITS} or a list of cores, got {init!r}") from None
    if len(cores) != len(shape):
        raise DecompositionError(f"init holds {len(cores)} cores; the tensor has {len(shape)} modes")
    for k, c in enumerate(cores):
        want = (int(ranks[k]), int(shape[k]), int(ranks[k + 1]))
        if c.shape != want:
            raise DecompositionError(f"init core {k} has shape {c.shape}; expected {want} (R_{k}, I_{k}, R_{k + 1})")
        if not np.isfinite(c).all():
            raise DecompositionError(f"init core {k} holds NaN or infinite values")
    return cores


# --- the canonical form --------------------------------------------------------------------------


def qr_positive(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced QR of a tall matrix with ``diag(R) >= 0``: unique for a full-rank ``a``, so the
    cores do not change sign with the LAPACK build.

    A matrix of at least :data:`CHOLESKY_QR_ROWS` rows a column is factored by Cholesky QR twice
    (:func:`_cholesky_qr2`) where its first factor's condition number is below
    :data:`CHOLESKY_QR_MAX_COND`, else (and for any other shape) by Householder QR, LAPACK's
    ``dgeqrf`` and ``dorgqr`` called directly: the algorithm of ``np.linalg.qr``, whose reduced
    form took 9.8 ms against 1.7 ms for a (73472, 8) float64 matrix (a nell2-shaped middle core at
    rank 8), one BLAS thread. Both give the one QR with a positive diagonal, to rounding."""
    m, n = a.shape
    if m >= CHOLESKY_QR_ROWS * n and n > 0:
        got = _cholesky_qr2(np.asarray(a, dtype=np.float64))
        if got is not None:
            return got
    if m < n or m == 0 or n == 0:
        q, r = np.linalg.qr(a)
    else:
        h, tau, _, info = _lapack.dgeqrf(np.asarray(a, dtype=np.float64))
        if info != 0:
            raise np.linalg.LinAlgError(f"dgeqrf failed (info {info}) on a {m} x {n} matrix")
        r = np.triu(h[:n])
        q, _, info = _lapack.dorgqr(h, tau, overwrite_a=True)
        if info != 0:
            raise np.linalg.LinAlgError(f"dorgqr failed (info {info}) on a {m} x {n} matrix")
    s = np.where(np.diag(r) < 0, -1.0, 1.0)
    return q * s, r * s[:, None]


def _cholesky_qr2(a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Cholesky QR twice: ``R1 = chol(a^T a)``, ``Q1 = a R1^-1``, then the same of ``Q1``, ``R = R2 R1``
    (Yamamoto et al. 2015: orthogonal to rounding while ``cond(a)`` is well below ``1/sqrt(eps)``).
    None where the Gram is not positive definite or ``cond(R1)`` reaches :data:`CHOLESKY_QR_MAX_COND`
    (the caller then runs Householder QR). Two products over ``a`` and two Grams: it reads a C-order
    matrix as it is, where ``dgeqrf`` wants it in Fortran order (a copy) and ``dorgqr`` passes over
    it once per column: 2.6 ms against 4.5 ms for a (73472, 8) matrix, one BLAS thread."""
    try:
        r1 = np.linalg.cholesky(a.T @ a).T
    except np.linalg.LinAlgError:
        return None
    if not (np.all(np.isfinite(r1)) and np.linalg.cond(r1) < CHOLESKY_QR_MAX_COND):
        return None
    q = a @ np.linalg.inv(r1)
    try:
        r2 = np.linalg.cholesky(q.T @ q).T
    except np.linalg.LinAlgError:
        return None
    return q @ np.linalg.inv(r2), r2 @ r1


def left_orthonormalize(cores: list[np.ndarray], k: int) -> None:
    """Core ``k`` becomes left-orthonormal (``Q`` of its ``(R_{k-1} I_k, R_k)`` unfolding); core
    ``k + 1`` absorbs ``R``. The train's tensor is unchanged."""
    a, i, b = cores[k].shape
    q, r = qr_positive(cores[k].reshape(a * i, b))
    cores[k] = q.reshape(a, i, b)
    # a matrix product: einsum's loop took 2 ms for an 8 x 8 factor and a (8, 9184, 8) core
    nxt = cores[k + 1]
    cores[k + 1] = (r @ nxt.reshape(nxt.shape[0], -1)).reshape(r.shape[0], *nxt.shape[1:])


def right_orthonormalize(cores: list[np.ndarray], k: int) -> None:
    """Core ``k`` becomes right-orthonormal (``Q^T`` of the QR of its ``(R_{k-1}, I_k R_k)``
    unfolding's transpose); core ``k - 1`` absorbs ``R^T``. The train's tensor is unchanged."""
    a, i, b = cores[k].shape
    q, r = qr_positive(cores[k].reshape(a, i * b).T)
    cores[k] = q.T.reshape(a, i, b)
    prev = cores[k - 1]
    cores[k - 1] = (prev.reshape(-1, prev.shape[2]) @ r.T).reshape(*prev.shape[:2], r.shape[0])


def left_orthonormal_slices(core: np.ndarray, nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`left_orthonormalize` on slice-major cores: ``core`` ``(I_k, R_{k-1}, R_k)`` and the next
    one ``nxt`` ``(I_{k+1}, R_k, R_{k+1})``; the new slices of both. The QR is of the slices stacked,
    ``(I_k R_{k-1}, R_k)``: the unfolding's rows in another order, so the same ``R`` and ``Q``'s rows
    in that order, read without the unfolding's copy."""
    I, Ra, Rb = core.shape
    q, r = qr_positive(core.reshape(I * Ra, Rb))
    if nxt.shape[2] == 1:  # one column a slice: one product (numpy's stacked products pay per slice)
        return q.reshape(I, Ra, Rb), (nxt.reshape(nxt.shape[0], Rb) @ r.T).reshape(nxt.shape[0], r.shape[0], 1)
    return q.reshape(I, Ra, Rb), np.matmul(r, nxt)


def right_orthonormal_slices(prev: np.ndarray, core: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`right_orthonormalize` on slice-major cores: the previous one ``prev``
    ``(I_{k-1}, R_{k-2}, R_{k-1})`` and ``core`` ``(I_k, R_{k-1}, R_k)``; the new slices of both."""
    I, Ra, Rb = core.shape
    q, r = qr_positive(core.transpose(0, 2, 1).reshape(I * Rb, Ra))  # rows (i, b) of the unfolding's transpose
    return (prev.reshape(-1, Ra) @ r.T).reshape(*prev.shape[:2], r.shape[0]), q.reshape(I, Rb, Ra).transpose(0, 2, 1)


def initial_cores(
    init: str | list[np.ndarray], shape: Sequence[int], ranks: Sequence[int], seed: int | None
) -> list[np.ndarray]:
    """The cores before the first sweep: "random" draws them standard normal from
    ``np.random.default_rng(seed)``, core 0 first, each of shape ``(R_{k-1}, I_k, R_k)`` (or
    ``init``'s); then, from the last core to core 1, each is made right-orthonormal and its left
    neighbour absorbs the rest, so core 0 carries the train's norm."""
    if isinstance(init, str):
        rng = np.random.default_rng(check_seed(seed))
        cores = [rng.standard_normal((int(ranks[k]), int(shape[k]), int(ranks[k + 1]))) for k in range(len(shape))]
    else:
        cores = [np.array(c, dtype=np.float64) for c in init]
    for k in range(len(cores) - 1, 0, -1):
        right_orthonormalize(cores, k)
    return cores


def sweep_order(nmodes: int) -> list[tuple[int, str]]:
    """The core updates of one sweep: left to right (cores 0 .. N-2, each then made
    left-orthonormal), then right to left (cores N-1 .. 1, each then made right-orthonormal)."""
    return [(j, "right") for j in range(nmodes - 1)] + [(j, "left") for j in range(nmodes - 1, 0, -1)]


# --- tasks on the workers ------------------------------------------------------------------------


def start_state(shape: Sequence[int], ranks: Sequence[int], cores: Sequence[np.ndarray]) -> TTState:
    """The state holding ``cores``."""
    s = TTState(shape, ranks)
    for k, c in enumerate(cores):
        s.set_core(k, c)
    return s


def begin_sweep(s: TTState) -> TTState:
    """Clear the previous sweep's step records."""
    s.steps = []
    return s


def update_core(
    s: TTState,
    parts: Sequence[Partial],
    mode: int,
    direction: str,
    sketch: SampleSet | None = None,
    inplace: bool = False,
    gram_pinv: np.ndarray | None = None,
) -> TTState:
    """Proposition 5.2.2 for core ``mode``: sum the partitions' rows of ``Y_mode`` (the least-squares
    solution, the other cores being orthonormal), record ``||Y||^2``, then move the orthogonality on
    in the sweep's ``direction`` ("right": the core keeps ``Q`` and core ``mode + 1`` absorbs ``R``;
    "left": the core keeps the rows of ``Q^T`` and core ``mode - 1`` absorbs ``R^T``). Returns a new
    state (the input's futures stay valid), or ``s`` itself, updated, with ``inplace`` (a state no
    future holds: a copy of every core cost 1.2-1.8 ms an update, nell2-shaped at rank 8).
    ``gram_pinv``: the sketch's :func:`~.tt_randomized.sketched_gram_pinv` where it was formed."""
    t0 = time.perf_counter()
    parts = [parts] if isinstance(parts, Partial) else list(parts)
    Ra, I, Rb = int(s.ranks[mode]), s.shape[mode], int(s.ranks[mode + 1])
    slices = np.zeros((I, Ra * Rb))  # row i: Y[:, i, :], as the partitions hand it up
    for p in parts:
        p.add_into(slices)
    with one_blas_thread(slices.size < ONE_BLAS_THREAD_ENTRIES):
        if sketch is not None:
            # randomized TT-ALS: the parts are the sketched right-hand side; solve the sketched normal
            # equations (their Gram is I in expectation, the design being orthonormal), on one
            # BLAS thread as for the QR
            slices = sketched_slices(sketch, slices, gram_pinv)
        out = s if inplace else s.copy()
        out.norm_sq = float(np.dot(slices.ravel(), slices.ravel()))
        # the cores as the state keeps them, slice-major (I, R_{k-1}, R_k): no transposing copies
        new = {mode: slices.reshape(I, Ra, Rb)}
        if direction == "right" and mode + 1 < s.nmodes:
            new[mode], new[mode + 1] = left_orthonormal_slices(new[mode], s.slices[mode + 1])
        elif direction == "left" and mode > 0:
            new[mode - 1], new[mode] = right_orthonormal_slices(s.slices[mode - 1], new[mode])
    for k, c in new.items():
        out.set_slices(k, c)
    draw = 0.0 if sketch is None else float(getattr(sketch, "seconds", 0.0))  # drawn in a task before this one
    out.steps.append((mode, max(float(p.seconds) for p in parts), time.perf_counter() - t0, time.time(), draw))
    return out


def sketched_update(
    s: TTState,
    datas: Sequence[PartitionData],
    mode: int,
    direction: str,
    samples: int,
    seed: Sequence[int],
    threads: int,
    gather_threads: int | None,
    inplace: bool = False,
    next_mode: int | None = None,
) -> TTState:
    """Randomized TT-ALS's update of core ``mode`` in one task, where the worker holding the state
    holds every decoded partition: the draws (:func:`~.tt_randomized.draw_core`), the gathers of
    all partitions at once (:func:`~tensorflow_ooc.execution.concurrent_gather.gather_partitions`)
    and :func:`update_core` (``inplace`` passed on), the same values as the three kinds of task
    they replace (a sweep of an order-3 tensor in two partitions submitted 16 tasks for its
    updates, now 4). ``next_mode``: the core the next update draws for, if known."""
    sketch = draw_core(s, mode, samples, seed)
    changed = {mode, mode + 1} if direction == "right" else {mode - 1, mode}

    def beside() -> np.ndarray:
        # what depends on the draws or on cores this update leaves alone, while the partitions are
        # gathered (its seconds inside theirs; where it outlasts them, the sweep's other seconds):
        # the sketched Gram, and the walks' trees of the next update's draws
        if next_mode is not None:
            prepare_walks(s, next_mode, changed)
        return sketched_gram_pinv(sketch)

    parts, gram_pinv = gather_partitions(datas, sketch, mode, threads, gather_threads, beside=beside)
    return update_core(s, parts, mode, direction, sketch, inplace, gram_pinv)


def sketched_updates(
    s: TTState,
    datas: Sequence[PartitionData],
    steps: Sequence[tuple[int, str, Sequence[int]]],
    samples: int,
    threads: int,
    gather_threads: int | None,
    begin: bool = False,
) -> TTState:
    """:func:`sketched_update` for each ``(mode, direction, seed)`` of ``steps`` in turn, in one
    task (after :func:`begin_sweep` where ``begin``): the same cores as a task an update. Each
    task cost the embedded cluster's scheduling a few milliseconds, and the updates of one sweep
    follow one another anyway (each draws from the cores the one before left)."""
    s = s.copy()  # the input is a future's; the updates then change the copy in place
    if begin:
        s = begin_sweep(s)
    # the update after the last of these: the next one of the sweep, or the next sweep's first
    nexts = [m for m, _, _ in steps[1:]] + [sweep_order(s.nmodes)[0][0]]
    for (mode, direction, seed), nxt in zip(steps, nexts):
        s = sketched_update(s, datas, mode, direction, samples, seed, threads, gather_threads, True, nxt)
    return s


def summary(s: TTState) -> SweepSummary:
    return SweepSummary(float(s.norm_sq), list(s.steps))


def cores_of(s: TTState) -> list[np.ndarray]:
    """The cores, ``(R_{k-1}, I_k, R_k)`` C arrays (copies)."""
    return s.cores()


def sweep_fit(norm_x_sq: float, norm_y_sq: float) -> float:
    """fit = 1 - ||X - T|| / ||X||, with ``||X - T||^2 = ||X||^2 - ||Y_j||^2`` (orthonormal chains)."""
    return 1 - math.sqrt(max(norm_x_sq - norm_y_sq, 0.0)) / math.sqrt(norm_x_sq)


def residual_fit(norm_x_sq: float, residual_sq: float) -> float:
    """fit = 1 - ||X - T|| / ||X||, the squared error summed at the nonzeros (every cell stored)."""
    return 1 - math.sqrt(max(residual_sq, 0.0)) / math.sqrt(norm_x_sq)
