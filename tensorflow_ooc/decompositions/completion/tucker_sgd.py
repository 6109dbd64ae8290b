"""FastTuckerPlus tensor completion on a BLCO store (seed 003, Algorithm 3).

The FastTucker model approximates an entry by ``xhat = sum_r prod_n (A^(n) B^(n))[i_n, r]``:
factors ``A^(n)`` (I_n x J_n) and a Tucker core that is the Kruskal tensor of the core factors
``B^(n)`` (J_n x R). FastTuckerPlus trains it by two alternating non-convex SGD passes per epoch:

1. factor pass: batches Psi of ``batch`` entries drawn uniformly (a seeded permutation of the
   training entries per epoch); every factor row of a batch moves at once, from one shared
   ``C_Psi^(n) = A_Psi^(n) B^(n)`` (the matrixized rule 14), learning rate ``lr_factors`` and
   regularization ``reg_factors``;
2. core pass: the core gradient accumulated over all training entries, then one step of every
   ``B^(n)`` (Algorithm 5), learning rate ``lr_core``, regularization ``reg_core``.

Both passes run as partition tasks of the store (:mod:`tensorflow_ooc.execution.completion`) on
Dask, or in this process for small stores, with tree reductions of the row moves and of the core
gradients. After every epoch the test RMSE and MAE are measured on held-out entries.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import ExitStack
from typing import Any, Sequence

import numpy as np

from ...execution import completion as T
from ...execution import component_revival as R
from ...execution.cluster import resolve_device, worker_resources
from ...execution.graph import DEFAULT_SPLIT_EVERY, tree_reduce
from ...execution.inline import is_inline
from ...execution.partitions import plan_partitions
from ...store import Store, open_store
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_factor_memory, check_seed
from ..common.options import declared
from ..common.run_loop import inline_when_small, run_iterations
from .fasttucker_result import CompletionError, FastTuckerResult
from .options import TUCKER_SGD

log = logging.getLogger(__name__)

MAX_PARTITION_NNZ = 1 << 24
MAX_BACKOFFS = 6  # halvings of the learning rates after diverged epochs before giving up


def _check_rate(name: str, value: float, positive: bool) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise CompletionError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        raise CompletionError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return v


def _check_ranks(ranks: int | Sequence[int], core_rank: int, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
    N = len(shape)
    if np.ndim(ranks) == 0:
        ranks = [ranks] * N
    ranks = list(ranks)
    if len(ranks) != N:
        raise CompletionError(f"ranks: {len(ranks)} given for the {N} modes of {where}")
    out = []
    for n, (j, L) in enumerate(zip(ranks, shape)):
        if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or j < 1:
            raise CompletionError(f"ranks: the rank of mode {n} must be an integer >= 1, got {j!r}")
        if j > L:
            raise CompletionError(f"ranks: the rank {j} of mode {n} exceeds its length {L} in {where}")
        out.append(int(j))
    if isinstance(core_rank, bool) or not isinstance(core_rank, (int, np.integer)) or core_rank < 1:
        raise CompletionError(f"core_rank must be an integer >= 1, got {core_rank!r}")
    return tuple(out)


def initial_state(
    shape: tuple[int, ...], ranks: tuple[int, ...], core_rank: int, mean_square: float, seed: int | None
) -> T.FastTuckerState:
    """Seeded random model whose predictions have about the data's mean square: factor entries
    N(0, 1/J_n), core factor entries N(0, s^2) with ``R s^(2N) = mean_square``."""
    N = len(shape)
    J = max(ranks)
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]]).astype(np.int64)
    A = np.zeros((int(sum(shape)), J))
    B = np.zeros((N, J, core_rank))
    s = (max(mean_square, 1e-12) / core_rank) ** (1.0 / (2 * N))
    for n, (L, j) in enumerate(zip(shape, ranks)):
        A[offsets[n] : offsets[n] + L, :j] = rng.standard_normal((L, j)) / math.sqrt(j)
        B[n, :j, :] = s * rng.standard_normal((j, core_rank))
    return T.FastTuckerState(A, B, offsets, tuple(shape), tuple(ranks))


def warm_state(
    factors: Sequence[np.ndarray],
    core_factors: Sequence[np.ndarray],
    shape: tuple[int, ...],
    ranks: tuple[int, ...],
    core_rank: int,
    scale: float,
    seed: int | None,
) -> T.FastTuckerState:
    """The training state of a previous model (``factors`` A_n, ``core_factors`` B_n at the data's
    scale) for a store of ``shape`` whose values are scaled by ``scale`` for training.

    A mode that grew keeps its old rows; its new rows are drawn N(0, s_j^2), s_j the spread of
    column j's old rows, so they take part in the first batches at the scale of the rest (zero rows
    would get zero gradients through the other modes' rows of their entries' products).
    """
    N = len(shape)
    J = max(ranks)
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]]).astype(np.int64)
    A = np.zeros((int(sum(shape)), J))
    B = np.zeros((N, J, core_rank))
    for n, (L, j, F, C) in enumerate(zip(shape, ranks, factors, core_factors)):
        F, C = np.asarray(F, dtype=np.float64), np.asarray(C, dtype=np.float64)
        old = F.shape[0]
        A[offsets[n] : offsets[n] + old, :j] = F
        if L > old:
            spread = F.std(axis=0) if old > 1 else np.full(j, 1 / math.sqrt(j))
            spread = np.where(spread > 0, spread, 1 / math.sqrt(j))
            A[offsets[n] + old : offsets[n] + L, :j] = rng.standard_normal((L - old, j)) * spread
        B[n, :j, :] = C
    B[0] *= scale  # the model predicts the training values, which are scaled
    return T.FastTuckerState(A, B, offsets, tuple(shape), tuple(ranks))


@declared(TUCKER_SGD)
def tucker_sgd(
    store: Store | str | os.PathLike, ranks: int | Sequence[int], core_rank: int, **options: Any
) -> FastTuckerResult:
    """FastTucker tensor completion of a sparse store by FastTuckerPlus (seed 003, Algorithm 3).

    Fits ``x[i_1..i_N] ~ sum_r prod_n (A^(n) B^(n))[i_n, r]`` to the observed entries: factors
    ``A^(n)`` (I_n x J_n), core factors ``B^(n)`` (J_n x R). Each epoch runs the factor pass (all
    rows of a batch of ``batch`` uniformly drawn entries updated at once from one shared
    ``C^(n) = A^(n) B^(n)``) and then the core pass (one step along the core gradient accumulated
    over all training entries), then measures the test RMSE and MAE. The model of the epoch with
    the lowest test RMSE is returned.

    Parameters
    ----------
    store : Store or path
        Training entries (a BLCO store; see :func:`tensorflow_ooc.convert`).
    {options}

    Returns
    -------
    FastTuckerResult

    Examples
    --------
    >>> import tensorflow_ooc as tfo
    >>> from tensorflow_ooc import synthetic
    >>> p = synthetic.planted_fasttucker((60, 50, 40), 4, 4, 30000, noise=0.05, seed=0)
    >>> s = tfo.convert((p.coords, p.values), "memory://doc-fasttucker", shape=p.shape)
    >>> r = tfo.tucker_sgd(s, 4, 4, test_fraction=0.1, epochs=20, seed=1, progress=False)   # doctest: +SKIP
    >>> r.test_rmse < 3 * p.noise_std                                                        # doctest: +SKIP
    True
    """
    run, o = TUCKER_SGD.settings(options)
    store = store if isinstance(store, Store) else open_store(store)
    return run_iterations(CompletionEpochs(store, ranks, core_rank, run, o), store, run)


def _load_entries(
    c: Any,
    store: Store,
    test_store: Store | None,
    n_parts: int,
    offsets: np.ndarray,
    test_fraction: float,
    split_seed: int,
    scale: float,
) -> tuple[list, list, int, int, list]:
    """The training and test entries loaded on the workers, by partition (a seeded ``test_fraction``
    of the store held out, or ``test_store``'s entries, checked disjoint from the store's): their
    futures, the counts of each, and the store's partitions."""
    parts = plan_partitions(store, n_parts, MAX_PARTITION_NNZ)
    args = (offsets, test_fraction, split_seed, False, scale)
    sources = [c.submit(T.load_observed, store.path, p, *args, pure=False) for p in parts]
    test_sources = list(sources)
    if test_store is not None:
        test_parts = plan_partitions(test_store, n_parts, MAX_PARTITION_NNZ)
        args = (offsets, 0.0, 0, True, scale)
        test_sources = [c.submit(T.load_observed, test_store.path, p, *args, pure=False) for p in test_parts]
        _check_disjoint(c, store, test_store, sources, test_sources, tuple(int(x) for x in store.shape))
    counts = [c.submit(_train_test_counts, s, pure=False).result() for s in sources]
    n_train = sum(a for a, _ in counts)
    n_test = sum(b for _, b in counts) if test_store is None else test_store.nnz
    if n_train == 0:
        raise CompletionError(f"{store.path}: no training entries left after holding out the test set")
    if n_test == 0:
        log.warning("no test entries: the test RMSE is not measured and early stopping is off")
    return sources, test_sources, n_train, n_test, parts


class CompletionEpochs:
    """FastTuckerPlus's steps for the run loop: an iteration is one accepted epoch (factor pass,
    core pass, test errors); the model of the lowest test RMSE is the result. No checkpoint."""

    name, title, claim_error = "tucker_sgd", "FastTuckerPlus", CompletionError

    def __init__(self, store: Store, ranks: int | Sequence[int], core_rank: int, run: Any, o: Any) -> None:
        self.store, self.run, self.o = store, run, o
        self.shape = tuple(int(x) for x in store.shape)
        self.ranks, self.test_store = _check_options(store, ranks, core_rank, self.shape, run, o)
        self.core_rank, self.normalized = int(core_rank), o.step == "normalized"
        self.claim_inputs = {"test": getattr(self.test_store, "path", None)}
        self.split_seed = int(np.random.SeedSequence(o.seed).entropy if o.seed is None else check_seed(o.seed))
        self.base_params = _params(o, self.ranks, self.core_rank, self.test_store, self.split_seed)
        self.input_fp = fingerprint(store)
        self.max_iters, self.device = int(o.epochs), run.device
        inline_when_small(run, store.nnz, run.device)

    def start(self, c: Any, cleanup: ExitStack, resume: bool) -> int:
        from tqdm.auto import tqdm

        run, o, store, test_store, shape, ranks = self.run, self.o, self.store, self.test_store, self.shape, self.ranks
        self.c = c
        self.dev = dev = "cpu" if run.device == "cpu" else resolve_device(c, run.device)[0]
        res = worker_resources(c) if not is_inline(c) else None
        dask_threads = sum(r["dask_threads"] for r in res.values()) if res else 1
        if o.threads is None and res:
            o.threads = min(r["numba_threads"] for r in res.values())
        n_parts = run.partitions or dask_threads
        self.offsets = offsets = np.concatenate([[0], np.cumsum(shape)[:-1]]).astype(np.int64)
        # values scaled to unit mean square, so the learning rates mean the same for any data scale
        mean_square = store.norm_sq / store.nnz
        self.scale = scale = 1.0 / math.sqrt(mean_square) if mean_square > 0 else 1.0
        entries = _load_entries(c, store, test_store, n_parts, offsets, o.test_fraction or 0.0, self.split_seed, scale)
        self.sources, self.test_sources, n_train, n_test, parts = entries
        if isinstance(o.init, FastTuckerResult):
            warm = (o.init.factors, o.init.core_factors, shape, ranks, self.core_rank, scale, o.seed)
            self.state = c.submit(warm_state, *warm, pure=False)
        else:
            self.state = c.submit(initial_state, shape, ranks, self.core_rank, 1.0, o.seed, pure=False)
        self.params = dict(self.base_params)
        self.params.update(
            n_train=int(n_train),
            n_test=int(n_test),
            value_scale=scale,
            partitions=len(parts),
            device=dev,
            scheduler="inline" if is_inline(c) else "dask",
            threads=o.threads,
        )
        log.info(
            "FastTuckerPlus: %d training and %d test entries, %d partitions on %s", n_train, n_test, len(parts), dev
        )
        self.bar = tqdm(total=self.max_iters, desc="fasttucker+", unit="epoch", leave=False, disable=not run.progress)
        cleanup.callback(self.bar.close)
        self.history: list[dict] = []
        self.best, self.stale, self.backoff, self.last_train = (math.inf, 0, None), 0, 1.0, math.inf
        # values are scaled to unit mean square, so a zero model's error is about 1
        self.last_check = 1.0
        if test_store is not None and test_store.nnz:
            self.last_check = max(1.0, scale * math.sqrt(test_store.norm_sq / test_store.nnz))
        return 0

    def iterate(self, epoch: int) -> dict:
        """One accepted epoch: a diverged one is redone from its start at half the rates."""
        o, scale = self.o, self.scale
        while True:
            t0 = time.perf_counter()
            rate = self.backoff / (1.0 + o.lr_decay * epoch)
            before = self.state
            self.state, record, err, check_rmse = _epoch(self, epoch, rate, t0)
            train = record["train_rmse"]
            # the training error predates the core step, so the final model is checked too: an
            # overshooting core step accepted unchecked leaves later epochs diverging at any rate
            if math.isfinite(train) and math.isfinite(check_rmse):
                if train <= 4 * self.last_train and check_rmse <= 4 * self.last_check:
                    break
            # SGD on this non-convex model blows up when a step overshoots: redo the epoch at half the rates
            if self.backoff < 2.0**-MAX_BACKOFFS:
                raise CompletionError(
                    f"epoch {epoch + 1}: the model diverged even at 2^-{MAX_BACKOFFS} of the learning rates; "
                    f"lower lr_factors ({o.lr_factors}) or lr_core ({o.lr_core})"
                )
            self.backoff /= 2
            self.state = before
            diverged = (
                "epoch %d diverged (training RMSE %.3g, its final model's %.3g): redone at %g x the learning rates"
            )
            log.warning(diverged, epoch + 1, train, check_rmse / scale, self.backoff)
        record["rate_factor"] = rate
        self.last_train = min(self.last_train, record["train_rmse"])
        self.last_check = check_rmse  # the previous epoch's, not the best: test error may drift up as it overfits
        self.measured, self.tested = self.state, bool(err.n)
        if epoch < int(o.revive_epochs):
            args = (self.shape, self.offsets, self.split_seed + epoch, bool(o.rebalance), DEFAULT_SPLIT_EVERY)
            self.state = _revive_lost_component(self.c, self.sources, self.state, record, *args)
        self.history.append(record)
        rmse, mae = record["test_rmse"], record["test_mae"]
        log.debug("epoch %d: test RMSE %.6g, MAE %.6g, %.3f s", epoch + 1, rmse, mae, record["seconds"])
        self.bar.update(1)
        self.bar.set_postfix(test_rmse=f"{rmse:.5g}", test_mae=f"{mae:.5g}", s=f"{record['seconds']:.2f}")
        return record

    def converged(self, epoch: int, record: dict) -> bool:
        """Keeps the model of the lowest test RMSE (without test entries: the last); stops after
        ``patience`` epochs without a better one."""
        if not self.tested:
            self.best = (math.inf, epoch + 1, self.measured)
            return False
        if record["test_rmse"] < self.best[0] * (1 - 1e-6):
            self.best, self.stale = (record["test_rmse"], epoch + 1, self.measured), 0
            return False
        self.stale += 1
        if self.o.patience is not None and self.stale >= self.o.patience:
            log.info("early stop after epoch %d: no better test RMSE for %d epochs", epoch + 1, self.o.patience)
            return True
        return False

    def save_checkpoint(self, path: str, iteration: int) -> float:
        raise NotImplementedError("tucker_sgd writes no checkpoint (its run control has none)")

    def finish(self) -> FastTuckerResult:
        _, best_epoch, model = self.best
        final = (model if model is not None else self.state).result()
        final_epoch = best_epoch if model is not None else len(self.history)
        self.sources = self.test_sources = self.state = self.best = self.measured = None  # futures go before the client
        N, history = self.store.nmodes, self.history
        kept = history[final_epoch - 1]
        core_factors = [np.array(final.core_factor(n)) for n in range(N)]
        core_factors[0] /= self.scale  # back to the data's scale
        factors = [np.array(final.factor(n)) for n in range(N)]
        args = (kept["test_rmse"], kept["test_mae"], len(history), final_epoch, history, self.params, self.input_fp)
        return FastTuckerResult(factors, core_factors, *args)


def _check_options(
    store: Store, ranks: int | Sequence[int], core_rank: int, shape: tuple[int, ...], run: Any, o: Any
) -> tuple[tuple[int, ...], Store | None]:
    """The checked ranks and the opened test store (None: a fraction of the input is held out);
    fills in the defaults of ``o`` that depend on ``step``. :class:`CompletionError` otherwise."""
    N = len(shape)
    ranks = _check_ranks(ranks, core_rank, shape, store.path)
    check_factor_memory(shape, ranks, f"tensor completion of {store.path}")
    if isinstance(o.epochs, bool) or not isinstance(o.epochs, (int, np.integer)) or o.epochs < 1:
        raise CompletionError(f"epochs must be an integer >= 1, got {o.epochs!r}")
    if isinstance(o.batch, bool) or not isinstance(o.batch, (int, np.integer)) or o.batch < 1:
        raise CompletionError(f"batch must be an integer >= 1, got {o.batch!r}")
    if o.step not in ("normalized", "plain"):
        raise CompletionError(f"step must be 'normalized' or 'plain', got {o.step!r}")
    normalized = o.step == "normalized"
    if o.lr_factors is None:
        o.lr_factors = 0.3 if normalized else 0.01
    o.lr_factors = _check_rate("lr_factors", o.lr_factors, True)
    if normalized and o.lr_factors >= 2:
        raise CompletionError(
            f"lr_factors of normalized steps is the fraction of a sample's error each step "
            f"removes and must be in (0, 2), got {o.lr_factors}"
        )
    o.lr_core = _check_rate("lr_core", o.lr_core, True)
    if o.lr_decay is None:
        o.lr_decay = 0.05 if normalized else 0.0
    o.lr_decay = _check_rate("lr_decay", o.lr_decay, False)
    o.reg_factors = _check_rate("reg_factors", o.reg_factors, False)
    o.reg_core = _check_rate("reg_core", o.reg_core, False)
    if o.patience is not None and (isinstance(o.patience, bool) or int(o.patience) != o.patience or o.patience < 1):
        raise CompletionError(f"patience must be an integer >= 1 or None, got {o.patience!r}")
    if isinstance(o.revive_epochs, bool) or not isinstance(o.revive_epochs, (int, np.integer)) or o.revive_epochs < 0:
        raise CompletionError(f"revive_epochs must be an integer >= 0, got {o.revive_epochs!r}")
    if run.device not in ("cpu", "gpu", "auto"):
        raise CompletionError(f"device must be 'cpu', 'gpu' or 'auto', got {run.device!r}")
    if o.test is not None and o.test_fraction is not None:
        raise CompletionError("give either test (a test store) or test_fraction, not both")
    if o.test_fraction is not None:
        o.test_fraction = _check_rate("test_fraction", o.test_fraction, True)
        if o.test_fraction >= 1:
            raise CompletionError(f"test_fraction must be in (0, 1), got {o.test_fraction}")
    if isinstance(o.init, FastTuckerResult):
        if tuple(o.init.ranks) != ranks or o.init.core_rank != int(core_rank):
            raise CompletionError(
                f"init: the previous model has ranks {tuple(o.init.ranks)} and core rank {o.init.core_rank}, "
                f"this run {ranks} and {int(core_rank)}; start from init='random'"
            )
        shrunk = [n for n, (a, b) in enumerate(zip(o.init.shape, shape)) if a > b]
        if len(o.init.shape) != N or shrunk:
            raise CompletionError(
                f"init: the previous model's shape {tuple(o.init.shape)} does not fit the store's {shape} "
                "(a warm start keeps every row; a mode cannot shrink)"
            )
    elif o.init != "random":
        raise CompletionError(f"init must be 'random' or a FastTuckerResult, got {o.init!r}")
    test_store = None
    if o.test is not None:
        test_store = o.test if isinstance(o.test, Store) else open_store(o.test)
        if test_store.nmodes != N:
            raise CompletionError(f"test set {test_store.path} has {test_store.nmodes} modes, the training store {N}")
        if test_store.nnz == 0:
            raise CompletionError(f"test set {test_store.path} has no entries")
        maxs = test_store.chunk_ranges[1].max(axis=0)
        for n in range(N):
            if int(maxs[n]) >= shape[n]:
                raise CompletionError(
                    f"test set {test_store.path}: index {int(maxs[n])} of mode {n} lies outside "
                    f"the training shape {shape} (0-based indices 0..{shape[n] - 1})"
                )
    if store.nnz == 0:
        raise CompletionError(f"{store.path} has no entries")
    if test_store is not None and test_store.meta.get("store_id") == store.meta.get("store_id"):
        raise CompletionError(f"the test set {test_store.path} is the training store itself")
    return ranks, test_store


def _params(o: Any, ranks: tuple[int, ...], core_rank: int, test_store: Store | None, split_seed: int) -> dict:
    """The run's settings, as the result records them."""
    return {
        "ranks": list(ranks),
        "core_rank": core_rank,
        "epochs": int(o.epochs),
        "batch": int(o.batch),
        "lr_factors": o.lr_factors,
        "lr_core": o.lr_core,
        "lr_decay": o.lr_decay,
        "reg_factors": o.reg_factors,
        "reg_core": o.reg_core,
        "step": o.step,
        "rebalance": bool(o.rebalance),
        "revive_epochs": int(o.revive_epochs),
        "seed": o.seed,
        "patience": o.patience,
        "test": None if test_store is None else str(test_store.path),
        "test_fraction": o.test_fraction,
        "algorithm": "FastTuckerPlus",
        "init": "given" if isinstance(o.init, FastTuckerResult) else "random",
        "split_seed": split_seed,  # seed None: the drawn one, to reproduce the split and batches
    }


def _check_disjoint(c: Any, store: Store, test_store: Store, sources: list, test_sources: list, shape: tuple) -> None:
    """A test store that shares entries with the training store is refused."""
    keys = [c.submit(_test_keys, s, shape, pure=False) for s in test_sources]
    test_keys = np.unique(np.concatenate([k.result() for k in keys]))
    overlap = sum(c.submit(T.count_overlap, s, test_keys, shape, pure=False).result() for s in sources)
    if overlap:
        raise CompletionError(
            f"the test set {test_store.path} overlaps the training store {store.path}: {overlap} entries are in both"
        )


def _revive_lost_component(
    c,
    sources: list,
    state,
    record: dict,
    shape: tuple[int, ...],
    offsets: np.ndarray,
    seed: int,
    rebalance: bool,
    split: int,
):
    """``state``, or where it has lost a component, the state with that component refitted to
    the training residual (noted in ``record["revived"]``; the time, check included, is added to
    the epoch's ``seconds`` and kept as ``revive_seconds``)."""
    t0 = time.perf_counter()
    lost = R.weakest_lost_component(c.submit(R.component_strengths, state, pure=False).result())
    new = state
    if lost is not None:
        new, gain = R.revive_component(c, sources, state, lost, shape, offsets, seed, rebalance, split)
        kept = new is not state
        record["revived"] = {"component": lost, "gain": gain, "kept": kept}
        log.info(
            "epoch %d: component %d was lost; its rank-1 refit to the residual takes %.1f %% of the residual's "
            "squared sum away (%s)",
            record["epoch"],
            lost,
            100 * gain,
            "kept" if kept else "below the bar, not kept",
        )
    record["revive_seconds"] = time.perf_counter() - t0
    record["seconds"] += record["revive_seconds"]
    return new


def _test_keys(data: T.ObservedPartition, shape: tuple[int, ...]) -> np.ndarray:
    return T.entry_keys(data.test_coords, shape)


def _train_test_counts(data: T.ObservedPartition) -> tuple[int, int]:
    return int(data.coords.shape[0]), int(data.test_coords.shape[0])


def _epoch(m: CompletionEpochs, epoch: int, rate: float, t0: float) -> tuple[Any, dict, Any, float]:
    """One epoch from ``m``'s model (its run's client, entries and settings): the factor pass, the
    core pass and the errors of the new model. The new model, its record, its test errors and the
    RMSE of its check (the test entries, else a training sample)."""
    c, o, sources, dev, split, scale = m.c, m.o, m.sources, m.dev, DEFAULT_SPLIT_EVERY, m.scale
    state = m.state
    step = (m.split_seed, epoch, int(o.batch), o.lr_factors * rate, o.reg_factors, o.threads, dev)
    moves = [c.submit(T.factor_pass_partition, s, state, *step, m.normalized, pure=False) for s in sources]
    state = c.submit(T.apply_moves, state, *tree_reduce(c, moves, T.combine_moves, split, last=True), pure=False)
    grads = [c.submit(T.core_gradient_partition, s, state, o.threads, dev, pure=False) for s in sources]
    grad = tree_reduce(c, grads, T.combine_gradients, split, last=True)
    state = c.submit(T.apply_core, state, o.lr_core * rate, o.reg_core, *grad, rebalance=bool(o.rebalance), pure=False)
    t_test = time.perf_counter()
    errs = [c.submit(T.test_errors_partition, s, state, o.threads, pure=False) for s in m.test_sources]
    err = c.submit(T.combine_errors, *tree_reduce(c, errs, T.combine_errors, split, last=True), pure=False).result()
    check = err
    if not err.n:
        checks = [c.submit(T.sample_errors_partition, s, state, o.threads, pure=False) for s in sources]
        checks = tree_reduce(c, checks, T.combine_errors, split, last=True)
        check = c.submit(T.combine_errors, *checks, pure=False).result()
    check_rmse = math.sqrt(check.sse / check.n) if check.n else 0.0
    info = c.submit(T.state_info, state, pure=False).result()
    now = time.perf_counter()
    record = {
        "epoch": epoch + 1,
        "test_rmse": math.sqrt(err.sse / err.n) / scale if err.n else float("nan"),
        "test_mae": err.sae / err.n / scale if err.n else float("nan"),
        "train_rmse": math.sqrt(info["train_sse"] / max(info["train_n"], 1)) / scale,
        "factor_seconds": info["factor_seconds"],
        "core_seconds": info["core_seconds"],
        "test_seconds": now - t_test,
        "seconds": now - t0,
    }
    return state, record, err, check_rmse
