"""Partition tasks of FastTuckerPlus tensor completion (run on Dask workers or in this process).

The unit of work is the store's partition (:func:`.partitions.plan_partitions`), decoded once into
worker memory with its held-out entries split off (:func:`load_observed`). Per epoch:

- factor pass: each partition runs its share of the epoch's batches on its own copy of the
  factors and returns the moves of the rows it touched (:class:`RowMoves`); the moves of all
  partitions are summed by a tree reduction (:func:`combine_moves`) and every row takes the mean
  of the moves of the partitions that touched it. A row seen by one partition gets exactly its
  sequential SGD result; a row several partitions move in parallel (from the same start, as the
  seed's warps do without synchronization) gets their average, which keeps the step size of the
  row independent of the number of partitions.
- core pass: each partition accumulates the core gradient over its entries; the partial
  gradients are summed by a tree reduction (:func:`combine_gradients`) and the core takes one
  step (the seed's Algorithm 5).
- test error: each partition's held-out entries (or the user's test set) give squared and
  absolute error sums, summed the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..kernels.completion import fasttucker_cpu as K
from ..kernels.mttkrp.dispatch import numba_threads
from .partitions import Partition
from .tasks import cached_store


@dataclass
class FastTuckerState:
    """The model: stacked factors ``A`` (sum I_n, J) and core factors ``B`` (N, J, R).

    Mode ``n``'s factor is ``A[offsets[n]:offsets[n] + shape[n], :ranks[n]]``; the columns past
    ``ranks[n]`` and the rows of ``B[n]`` past ``ranks[n]`` are zero and stay zero.
    """

    A: np.ndarray
    B: np.ndarray
    offsets: np.ndarray
    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    info: dict = field(default_factory=dict)  # the last passes' timings and error sums

    def factor(self, n: int) -> np.ndarray:
        o = int(self.offsets[n])
        return self.A[o : o + self.shape[n], : self.ranks[n]]

    def core_factor(self, n: int) -> np.ndarray:
        return self.B[n, : self.ranks[n], :]


@dataclass
class ObservedPartition:
    """A partition's observed entries in worker memory: training entries (coordinates, values,
    the stacked rows they touch) and its held-out test entries."""

    id: int
    coords: np.ndarray  # (n, N) int64
    values: np.ndarray  # (n,) float64
    rows: np.ndarray  # sorted unique stacked rows the training entries touch
    test_coords: np.ndarray
    test_values: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.coords, self.values, self.rows, self.test_coords, self.test_values)))


@dataclass
class RowMoves:
    """Summed moves of stacked factor rows ``rows`` and how many partitions moved each."""

    rows: np.ndarray
    moves: np.ndarray
    count: np.ndarray
    sse: float = 0.0
    n: int = 0
    seconds: float = 0.0


@dataclass
class CoreGradient:
    """Summed core gradient ``-sum e a^T d`` (N, J, R), squared errors and entries behind it."""

    grad: np.ndarray
    sse: float
    n: int
    seconds: float = 0.0


@dataclass
class ErrorSums:
    """Squared and absolute error sums over ``n`` test entries."""

    sse: float = 0.0
    sae: float = 0.0
    n: int = 0
    extra: dict = field(default_factory=dict)


def _stacked_rows(coords: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    if coords.shape[0] == 0:
        return np.zeros(0, np.int64)
    return np.unique((coords + offsets[None, :]).ravel())


def _seed64(seed: int) -> np.uint64:
    return np.uint64(int(seed) % 2**64)


def load_observed(
    path: str,
    part: Partition,
    offsets: np.ndarray,
    test_fraction: float = 0.0,
    split_seed: int = 0,
    all_test: bool = False,
    scale: float = 1.0,
) -> ObservedPartition:
    """Decode a partition's chunks into coordinates and values and split off its test entries:
    those the seeded coordinate hash (:func:`~tensorflow_ooc.kernels.completion.fasttucker_cpu.held_out_mask`)
    puts in the test set with probability ``test_fraction``, or all of them with ``all_test``.
    Values are multiplied by ``scale``."""
    store = cached_store(path)
    chunks = [store.read_chunk(c) for c in range(part.chunk_lo, part.chunk_hi)]
    N = store.nmodes
    coords = np.concatenate([ch.coords(store.layout) for ch in chunks]) if chunks else np.zeros((0, N), np.int64)
    values = np.concatenate([ch.values for ch in chunks]).astype(np.float64) * scale if chunks else np.zeros(0)
    coords = np.ascontiguousarray(coords, np.int64)
    if all_test:
        test = np.ones(coords.shape[0], bool)
    elif test_fraction > 0:
        test = K.held_out_mask(coords, _seed64(split_seed), float(test_fraction))
    else:
        test = np.zeros(coords.shape[0], bool)
    train = ~test
    tc, tv = np.ascontiguousarray(coords[train]), np.ascontiguousarray(values[train])
    return ObservedPartition(
        part.id,
        tc,
        tv,
        _stacked_rows(tc, offsets),
        np.ascontiguousarray(coords[test]),
        np.ascontiguousarray(values[test]),
    )


def epoch_order(n: int, seed: int, epoch: int, part_id: int) -> np.ndarray:
    """The epoch's seeded permutation of a partition's ``n`` training entries (its batches)."""
    rng = np.random.default_rng([int(seed) % 2**63, int(epoch), int(part_id) + 1])
    return rng.permutation(n).astype(np.int64)


def factor_pass_partition(
    data: ObservedPartition,
    state: FastTuckerState,
    seed: int,
    epoch: int,
    batch: int,
    lr: float,
    reg: float,
    threads: int | None = None,
    device: str = "cpu",
    normalized: bool = False,
) -> RowMoves:
    """A partition's share of the epoch's factor pass, from ``state`` (not modified): the moves of
    the rows it touched. ``threads``: numba threads (1 makes the pass reproducible);
    ``normalized``: normalized steps (:func:`~tensorflow_ooc.kernels.completion.fasttucker_cpu.factor_pass`)."""
    t0 = time.perf_counter()
    n = data.coords.shape[0]
    if n == 0:
        return RowMoves(data.rows, np.zeros((0, state.A.shape[1])), np.zeros(0, np.int64))
    order = epoch_order(n, seed, epoch, data.id)
    if device == "gpu":
        from ..kernels.completion.fasttucker_gpu import factor_pass_gpu

        A = factor_pass_gpu(
            data.coords, data.values, order, state.offsets, state.A, state.B, lr, reg, normalized=normalized
        )
        sse = float("nan")
    else:
        A = state.A.copy()
        with numba_threads(threads):
            import numba

            sse = float(
                K.factor_pass(
                    data.coords,
                    data.values,
                    order,
                    state.offsets,
                    A,
                    state.B,
                    int(batch),
                    float(lr),
                    float(reg),
                    numba.get_num_threads(),
                    bool(normalized),
                )
            )
    moves = A[data.rows] - state.A[data.rows]
    return RowMoves(data.rows, moves, np.ones(data.rows.shape[0], np.int64), sse, n, time.perf_counter() - t0)


def combine_moves(*parts: RowMoves) -> RowMoves:
    """Sum row moves (and partition counts) of several partitions."""
    rows = np.concatenate([p.rows for p in parts])
    J = max(p.moves.shape[1] for p in parts)
    uniq, inv = np.unique(rows, return_inverse=True)
    moves = np.zeros((uniq.shape[0], J))
    np.add.at(moves, inv, np.concatenate([p.moves for p in parts]))
    count = np.bincount(inv, weights=np.concatenate([p.count for p in parts]), minlength=uniq.shape[0])
    return RowMoves(
        uniq,
        moves,
        count.astype(np.int64),
        sum(p.sse for p in parts),
        sum(p.n for p in parts),
        max(p.seconds for p in parts),
    )


def apply_moves(state: FastTuckerState, *parts: RowMoves) -> FastTuckerState:
    """A new state whose rows moved by the mean move of the partitions that touched them."""
    t0 = time.perf_counter()
    total = combine_moves(*parts) if len(parts) > 1 else parts[0]
    A = state.A.copy()
    if total.rows.shape[0]:
        A[total.rows] += total.moves / np.maximum(total.count, 1)[:, None]
    info = {"factor_seconds": total.seconds + time.perf_counter() - t0, "factor_sse": total.sse, "factor_n": total.n}
    return FastTuckerState(A, state.B, state.offsets, state.shape, state.ranks, info)


def core_gradient_partition(
    data: ObservedPartition, state: FastTuckerState, threads: int | None = None, device: str = "cpu"
) -> CoreGradient:
    """The core gradient accumulated over a partition's training entries."""
    t0 = time.perf_counter()
    if data.coords.shape[0] == 0:
        return CoreGradient(np.zeros_like(state.B), 0.0, 0)
    if device == "gpu":
        from ..kernels.completion.fasttucker_gpu import core_gradient_gpu

        grad = core_gradient_gpu(data.coords, data.values, state.offsets, state.A, state.B)
        pred = K.predict_entries(data.coords, state.offsets, state.A, state.B)
        sse = float(((data.values - pred) ** 2).sum())
    else:
        with numba_threads(threads):
            import numba

            grad, sse = K.core_gradient(
                data.coords, data.values, state.offsets, state.A, state.B, numba.get_num_threads()
            )
    return CoreGradient(grad, float(sse), int(data.coords.shape[0]), time.perf_counter() - t0)


def combine_gradients(*parts: CoreGradient) -> CoreGradient:
    """Sum partial core gradients (in the given order, so sums are reproducible)."""
    grad = parts[0].grad.copy()
    for p in parts[1:]:
        grad += p.grad
    return CoreGradient(grad, sum(p.sse for p in parts), sum(p.n for p in parts), max(p.seconds for p in parts))


def apply_core(
    state: FastTuckerState, lr: float, reg: float, *parts: CoreGradient, rebalance: bool = False
) -> FastTuckerState:
    """One core step, the seed's Algorithm 5 line 31: ``B -= lr (grad / |Omega| + reg B)``; then,
    with ``rebalance``, the model's gauge reset by :func:`rebalance_gauge` (same predictions)."""
    t0 = time.perf_counter()
    total = combine_gradients(*parts) if len(parts) > 1 else parts[0]
    B = state.B - lr * (total.grad / max(total.n, 1) + reg * state.B)
    for n, J in enumerate(state.ranks):
        B[n, J:, :] = 0.0
    A = state.A
    if rebalance:
        A, B = rebalance_gauge(A, B, state.offsets, state.shape, state.ranks)
    info = dict(state.info, core_seconds=total.seconds + time.perf_counter() - t0, train_sse=total.sse, train_n=total.n)
    return FastTuckerState(A, B, state.offsets, state.shape, state.ranks, info)


def rebalance_gauge(
    A: np.ndarray, B: np.ndarray, offsets: np.ndarray, shape: tuple[int, ...], ranks: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The same model in its best-conditioned gauge: new ``(A, B)`` with every ``A^(n) B^(n)``
    unchanged up to rounding, except for a per-column scaling that leaves the Kruskal core's
    products (and so every prediction) unchanged.

    The FastTucker model only depends on ``C^(n) = A^(n) B^(n)`` and on the products over modes of
    their columns, so ``A^(n) M``, ``M^-1 B^(n)`` and column scalings whose product over modes is
    one give the same predictions. SGD is not invariant to that gauge: a badly conditioned
    ``B^(n)`` or one mode's columns much larger than another's slow the factor steps down to a
    crawl (plateaus several times the noise level for tens of epochs on planted models). So:

    1. column ``r`` of every ``C^(n)`` is scaled to the geometric mean over modes of their RMS;
    2. with ``B^(n) diag(alpha^(n)) = U S V^T`` (thin SVD), ``A^(n) <- A^(n) U S`` and
       ``B^(n) <- V^T``: orthonormal core-factor rows, so a factor step moves ``C^(n)`` as a step
       on ``C^(n)`` itself would. Rows past ``min(J_n, R)`` become zero; they never change a
       prediction (``C^(n)`` has rank at most ``min(J_n, R)``).
    """
    A_new, B_new = A.copy(), np.zeros_like(B)
    N, R = len(shape), B.shape[2]
    rms = np.empty((N, R))
    for n in range(N):
        o, L, J = int(offsets[n]), int(shape[n]), int(ranks[n])
        C = A[o : o + L, :J] @ B[n, :J]
        rms[n] = np.sqrt(np.einsum("ir,ir->r", C, C) / L)
    live = (rms > 1e-150).all(axis=0)  # a column zero in some mode predicts nothing: left as is
    target = np.exp(np.log(np.where(live, rms, 1.0)).mean(axis=0))
    for n in range(N):
        o, L, J = int(offsets[n]), int(shape[n]), int(ranks[n])
        alpha = np.where(live, target / np.where(live, rms[n], 1.0), 1.0)
        U, S, Vt = np.linalg.svd(B[n, :J] * alpha, full_matrices=False)
        k = S.shape[0]
        A_new[o : o + L, :J] = 0.0
        A_new[o : o + L, :k] = A[o : o + L, :J] @ (U * S)
        B_new[n, :k, :] = Vt
    return A_new, B_new


def state_info(state: FastTuckerState) -> dict:
    """The small summary the driver reads every epoch."""
    return dict(state.info)


def test_errors_partition(data: ObservedPartition, state: FastTuckerState, threads: int | None = None) -> ErrorSums:
    """Squared and absolute error sums of the model on a partition's test entries."""
    return _error_sums(data.test_coords, data.test_values, state, threads)


def _error_sums(coords: np.ndarray, values: np.ndarray, state: FastTuckerState, threads: int | None) -> ErrorSums:
    """Squared and absolute error sums of the model at ``coords`` against ``values``."""
    if coords.shape[0] == 0:
        return ErrorSums()
    with numba_threads(threads):
        pred = K.predict_entries(np.ascontiguousarray(coords), state.offsets, state.A, state.B)
    err = values - pred
    return ErrorSums(float((err * err).sum()), float(np.abs(err).sum()), int(err.shape[0]))


CHECK_SAMPLE = 1 << 16  # training entries per partition that check an epoch's model when none are held out


def sample_errors_partition(data: ObservedPartition, state: FastTuckerState, threads: int | None = None) -> ErrorSums:
    """Squared and absolute error sums of the model on at most :data:`CHECK_SAMPLE` of a
    partition's training entries (evenly strided): the check that an epoch's final model has not
    diverged when no test entries are held out. A few thousand entries show a model whose error
    grew several-fold as surely as all of them, at a bounded cost per epoch."""
    n = data.coords.shape[0]
    pick = slice(None) if n <= CHECK_SAMPLE else np.linspace(0, n - 1, CHECK_SAMPLE).astype(np.int64)
    return _error_sums(data.coords[pick], data.values[pick], state, threads)


def combine_errors(*parts: ErrorSums) -> ErrorSums:
    return ErrorSums(sum(p.sse for p in parts), sum(p.sae for p in parts), sum(p.n for p in parts))


def count_overlap(data: ObservedPartition, test_keys: np.ndarray, shape: tuple[int, ...]) -> int:
    """How many of a partition's training entries are also in the sorted test ``test_keys``
    (:func:`entry_keys`)."""
    if data.coords.shape[0] == 0 or test_keys.shape[0] == 0:
        return 0
    return int(np.isin(entry_keys(data.coords, shape), test_keys, assume_unique=False).sum())


def entry_keys(coords: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """One integer per coordinate: the row-major linear index when the shape's product fits in
    int64, else a 64-bit hash of the coordinates (then two different entries share a key with
    probability about 2^-64 per pair)."""
    if float(np.prod([float(s) for s in shape])) < 2.0**62:
        return np.ravel_multi_index(tuple(coords.T), shape).astype(np.int64)
    return K.coordinate_hashes(coords)
