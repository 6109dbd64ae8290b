"""Tucker HOOI on a BLCO store, as iterated Dask graph reductions of semi-sparse TTM chains.

Higher-order orthogonal iteration (De Lathauwer, De Moor & Vandewalle 2000; pyttb's and Tensor
Toolbox's ``tucker_als``): for each mode ``n`` in turn, ``Y = X x_{m != n} U_m^T`` (the TTM chain,
:func:`tensorflow_ooc.kernels.ttm.chain.ttm_chain`, semi-sparse: one dense row per non-empty mode-``n``
slice) and ``U_n`` = the ``J_n`` leading left singular vectors of ``Y_(n)``; after the last mode
the core ``G = U_N^T Y_(N)`` and the fit ``1 - sqrt(||X||^2 - ||G||^2) / ||X||`` (the factors
are orthonormal, so ``||X - model||^2 = ||X||^2 - ||G||^2``; the model is never formed).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import time
from contextlib import ExitStack
from typing import Any, Sequence

import numpy as np

from ...errors import DecompositionError
from ...execution import DEVICES
from ...execution.graph import EXECUTION_MODES
from ...execution.inline import is_inline
from ...execution.ttm_graph import TTMGraph
from ...kernels.ttm.select import KERNELS
from ...store import Store, open_store
from ..common.checkpoint_files import disk_full_returned, raise_returned
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_factor_memory, check_seed
from ..common.options import declared
from ..common.run_loop import inline_when_small, run_iterations
from . import tucker_updates as T
from .options import TUCKER_HOOI
from .tucker_checkpoint import read_tucker_checkpoint, write_tucker_checkpoint
from .tucker_result import TuckerResult

log = logging.getLogger(__name__)

INITS = ("random", "nvecs")


def check_ranks(ranks: int | Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """``ranks`` as one positive integer per mode, each at most the mode's length (one integer
    is every mode's rank, as in pyttb); :class:`DecompositionError` naming the mode otherwise."""
    N = len(shape)
    if isinstance(ranks, numbers.Integral) and not isinstance(ranks, bool):
        ranks = [int(ranks)] * N
    try:
        vals = list(ranks)
    except TypeError:
        raise DecompositionError(f"ranks must be an integer or one integer per mode, got {ranks!r}") from None
    if len(vals) != N:
        raise DecompositionError(
            f"ranks {tuple(vals)} give {len(vals)} values for a tensor of order {N} "
            f"(shape {tuple(shape)}): give one rank per mode"
        )
    out = []
    for n, (j, size) in enumerate(zip(vals, shape)):
        if isinstance(j, bool) or not isinstance(j, numbers.Integral):
            raise DecompositionError(f"rank of mode {n} must be an integer, got {j!r}")
        if not 1 <= int(j) <= int(size):
            raise DecompositionError(f"rank of mode {n} is {int(j)}; it must lie in 1..{int(size)} (the mode's length)")
        out.append(int(j))
    return tuple(out)


def check_init(init, shape: Sequence[int], ranks: Sequence[int]) -> str | list[np.ndarray | None]:
    """``init`` is "random", "nvecs", or one (I_n, J_n) finite matrix per mode (the first may be
    None: HOOI computes it before it is used)."""
    if isinstance(init, str):
        if init not in INITS:
            raise DecompositionError(f"init must be one of {INITS} or a list of factor matrices, got {init!r}")
        return init
    try:
        mats = list(init)
    except TypeError:
        raise DecompositionError(f"init must be one of {INITS} or a list of factor matrices, got {init!r}") from None
    N = len(shape)
    if len(mats) != N:
        raise DecompositionError(f"init holds {len(mats)} matrices; the tensor has {N} modes")
    out: list[np.ndarray | None] = []
    for n, a in enumerate(mats):
        if a is None and n == 0:
            out.append(None)
            continue
        arr = np.asarray(a, dtype=np.float64) if a is not None else None
        want = (int(shape[n]), int(ranks[n]))
        if arr is None or arr.shape != want:
            raise DecompositionError(
                f"init factor of mode {n} has shape {None if arr is None else arr.shape}; "
                f"expected {want} (mode length x rank)"
            )
        if not np.isfinite(arr).all():
            raise DecompositionError(f"init factor of mode {n} holds NaN or infinite values")
        out.append(arr)
    return out


@declared(TUCKER_HOOI)
def tucker_hooi(store: Store | str | os.PathLike, ranks: int | Sequence[int], **options: Any) -> TuckerResult:
    """Rank-``(J_1, ..., J_N)`` Tucker decomposition of a sparse tensor store by HOOI.

    Each iteration updates the modes in order: ``Y = X x_{m != n} U_m^T`` by the semi-sparse TTM
    chain (partition tasks on the cluster, partial results merged by a tree reduction), then
    ``U_n`` = the ``J_n`` leading left singular vectors of ``Y_(n)`` (rows of empty slices zero).
    The core comes from the last mode, ``G = U_N^T Y_(N)``, and the fit from
    ``||X||^2 - ||G||^2`` without forming the model. Initialization, update order, fit and
    stopping rule are those of pyttb's ``tucker_als``: the first mode's factor is not
    initialized (the first update computes it), and a run stops when the fit changes by less than
    ``tol`` (its first iteration included, whose change is the fit itself).

    Parameters
    ----------
    store : Store or path
        A BLCO store (see :func:`tensorflow_ooc.convert`).
    {options}

    Returns
    -------
    TuckerResult
        ``core``, orthonormal ``factors``, ``fit``, ``iterations`` and ``history`` (per
        iteration: fit, fit change, seconds, per mode the TTM seconds of the slowest partition
        task (of which ``layout_seconds`` sorting the nonzeros for the TTM kernels: the first
        iteration in memory, every iteration when streaming), the SVD seconds and method, and the
        rest as ``other_seconds``).

    Examples
    --------
    >>> import tensorflow_ooc as tfo
    >>> from tensorflow_ooc import synthetic
    >>> c, v = synthetic.heavy_tailed((30, 40, 50), 5000, seed=0)
    >>> s = tfo.convert((c, v), "memory://doc-tucker")
    >>> r = tfo.tucker_hooi(s, (4, 4, 4), seed=1, max_iters=10)   # doctest: +SKIP
    >>> r.core.shape, r.factors[2].shape                           # doctest: +SKIP
    ((4, 4, 4), (50, 4))
    >>> M = r.to_pyttb()                                           # doctest: +SKIP
    """
    run, o = TUCKER_HOOI.settings(options)
    store = store if isinstance(store, Store) else open_store(store)
    return run_iterations(TuckerIterations(store, ranks, run, o), store, run)


def _check_settings(o: Any, run: Any, shape: tuple[int, ...], ranks: tuple[int, ...]) -> None:
    """Refuse bad settings before anything runs (``o.init`` checked against the shape and ranks)."""
    o.init = check_init(o.init, shape, ranks)
    if isinstance(o.max_iters, bool) or not isinstance(o.max_iters, numbers.Integral) or o.max_iters < 1:
        raise DecompositionError(f"max_iters must be an integer >= 1, got {o.max_iters!r}")
    if not isinstance(o.tol, numbers.Real) or not math.isfinite(o.tol) or o.tol < 0:
        raise DecompositionError(f"tol must be a finite number >= 0, got {o.tol!r}")
    if o.svd not in T.SVD_METHODS:
        raise DecompositionError(f"svd must be one of {T.SVD_METHODS}, got {o.svd!r}")
    if o.kernel is not None and o.kernel not in KERNELS:
        raise DecompositionError(f"kernel must be one of {KERNELS} or None (the selector's choice), got {o.kernel!r}")
    if run.device not in DEVICES:
        raise DecompositionError(f"device must be one of {DEVICES}, got {run.device!r}")
    if run.execution not in EXECUTION_MODES:
        raise DecompositionError(f"execution must be one of {EXECUTION_MODES}, got {run.execution!r}")
    if int(run.checkpoint_every) < 1:
        raise DecompositionError(f"checkpoint_every must be >= 1, got {run.checkpoint_every}")


class TuckerIterations:
    """Tucker HOOI's steps for the run loop (pyttb's ``tucker_als``, iterated Dask reductions)."""

    name, title, claim_error = "tucker_hooi", "Tucker HOOI", DecompositionError

    def __init__(self, store: Store, ranks: int | Sequence[int], run: Any, o: Any) -> None:
        self.store, self.run, self.o = store, run, o
        shape = self.shape = tuple(int(s) for s in store.shape)
        self.ranks = ranks = check_ranks(ranks, shape)
        check_factor_memory(shape, ranks, f"Tucker of {store.path}")
        _check_settings(o, run, shape, ranks)
        run.checkpoint = None if run.checkpoint is None else str(run.checkpoint)
        self.input_fp = fingerprint(store)
        self.state0 = self._resumed() if run.resume else None
        if o.seed is not None and (isinstance(o.seed, bool) or not isinstance(o.seed, numbers.Integral)):
            raise DecompositionError(f"seed must be an integer or None, got {o.seed!r}")
        o.seed = None if o.seed is None else int(o.seed)
        self.base_params = {
            "ranks": list(ranks),
            "max_iters": int(o.max_iters),
            "tol": float(o.tol),
            "seed": o.seed,
            "init": o.init if isinstance(o.init, str) else "given",
            "svd": o.svd,
            "kernel": o.kernel,
        }
        self.normX2 = store.norm_sq
        self.max_iters, self.device = o.max_iters, run.device
        inline_when_small(run, store.nnz, run.device)

    def _resumed(self) -> Any:
        """The checkpoint's state (None: there is none); one of another store or other ranks is refused."""
        state0 = read_tucker_checkpoint(self.run.checkpoint) if self.run.checkpoint else None
        if state0 is not None and (
            state0.input["store_id"] != self.input_fp["store_id"] or tuple(state0.params.get("ranks", ())) != self.ranks
        ):
            raise DecompositionError(
                f"{self.run.checkpoint}: checkpoint is for another store or other ranks "
                f"({state0.params.get('ranks')}); remove it or drop resume"
            )
        return state0

    def start(self, c: Any, cleanup: ExitStack, resume: bool) -> int:
        from tqdm.auto import tqdm

        run, o, shape, ranks = self.run, self.o, self.shape, self.ranks
        self.c = c
        self.graph = graph = TTMGraph(
            c, self.store, execution=run.execution, partitions=run.partitions, kernel=o.kernel, device=run.device
        )
        cleanup.callback(graph.release)
        params = self.params = dict(self.base_params)
        params["device"] = graph.device
        params["execution"] = graph.execution
        params["partitions"] = len(graph.parts)
        params["scheduler"] = "inline" if is_inline(c) else "dask"
        state0 = self.state0 if (resume and run.resume) else (self._resumed() if resume else None)
        # --- initial state: fresh, or from the last checkpoint -----------------------------------
        if state0 is not None:
            # factors scattered, not embedded: Dask warns about (and copies) graphs of tens of MB
            given = c.scatter(list(state0.factors), hash=False)
            self.S = c.submit(T.given_init, shape, ranks, given, state0.core, pure=False)
            start, self.fit, self.history = state0.iteration + 1, state0.fit, list(state0.history)
            svd_entropy = state0.params.get("svd_entropy")
            log.info("resuming from %s after iteration %d (fit %.6f)", run.checkpoint, start, self.fit)
        else:
            if o.init == "random":
                self.S = c.submit(T.random_init, shape, ranks, o.seed, pure=False)
            elif o.init == "nvecs":
                self.S = c.submit(T.nvecs_init, self.store.path, shape, ranks, pure=False)
            else:
                given = [None if a is None else np.asarray(a) for a in o.init]
                self.S = c.submit(T.given_init, shape, ranks, c.scatter(given, hash=False), pure=False)
            start, self.fit, self.history, svd_entropy = 0, 0.0, [], None
        if svd_entropy is None:
            # one entropy per run, kept in checkpoints: a resumed run draws the test vectors the
            # uninterrupted one would have
            svd_entropy = int(np.random.SeedSequence(check_seed(o.seed)).entropy) % 2**63
        params["svd_entropy"] = self.svd_entropy = int(svd_entropy)
        params["resumed_after"] = self.start_at = start
        self.stored = self.store.stored_bytes()
        self.bar = tqdm(
            total=o.max_iters,
            initial=start,
            desc="tucker-hooi",
            unit="it",
            leave=False,
            disable=None if run.progress else True,
        )
        cleanup.callback(self.bar.close)
        return start

    def iterate(self, iteration: int) -> dict:
        """One iteration, submitted at once: per mode the TTM partition tasks, the reduction and one
        update task (one task in all with one partition); the driver reads the small summary."""
        c, graph, N, store = self.c, self.graph, self.store.nmodes, self.store
        t_iter = time.time()
        fit_old = self.fit
        for n in range(N):
            entropy = (self.svd_entropy, iteration, n)
            self.S = graph.mode_update(self.S, n, T.update_factor, n == N - 1, self.o.svd, entropy)
        sm = c.submit(T.summary, self.S, pure=False).result()
        normX = math.sqrt(self.normX2)
        fit = self.fit = 1 - math.sqrt(abs(self.normX2 - sm.core_norm2)) / normX if normX > 0 else 0.0
        seconds = time.time() - t_iter
        ends = [t_iter] + [sm.finished[n] for n in range(N)]
        ttm_s = [sm.timings[n][0] for n in range(N)]
        svd_s = [sm.timings[n][1] for n in range(N)]
        streamed = graph.execution == "streaming"
        record = {
            "iteration": iteration + 1,
            "fit": fit,
            "fit_change": abs(fit - fit_old),
            "seconds": seconds,
            "mode_seconds": [max(0.0, ends[k + 1] - ends[k]) for k in range(N)],
            "ttm_seconds": ttm_s,
            "layout_seconds": [sm.timings[n][2] for n in range(N)],
            "svd_seconds": svd_s,
            "other_seconds": max(0.0, seconds - sum(ttm_s) - sum(svd_s)),
            "svd_methods": [sm.methods[n] for n in range(N)],
            "nonempty_slices": [sm.rows[n] for n in range(N)],
            "nnz_per_s": store.nnz * N / seconds,
            "bytes_read": self.stored * N if streamed else (self.stored if iteration == self.start_at else 0),
        }
        self.history.append(record)
        log.info(
            "iteration %d: fit %.6f (change %.2e), %.3f s (TTM %.3f s, SVD %.3f s)",
            iteration + 1,
            fit,
            record["fit_change"],
            seconds,
            sum(ttm_s),
            sum(svd_s),
            extra={"iteration": iteration + 1},
        )
        self.bar.update(1)
        self.bar.set_postfix(fit=f"{fit:.6f}", dfit=f"{record['fit_change']:.1e}", s_per_it=f"{seconds:.3f}")
        return record

    def converged(self, iteration: int, record: dict) -> bool:
        return record["fit_change"] < self.o.tol  # pyttb's rule, its first iteration included

    def save_checkpoint(self, path: str, iteration: int) -> float:
        t_ck = time.time()
        args = (path, self.S, iteration, self.fit, self.history, self.params, self.input_fp)
        raise_returned(self.c.submit(disk_full_returned, write_tucker_checkpoint, *args, pure=False).result())
        return time.time() - t_ck

    def finish(self) -> TuckerResult:
        c, N = self.c, self.store.nmodes
        core = c.submit(T.core_of, self.S, pure=False).result()
        factors = [c.submit(T.factor_of, self.S, n, pure=False).result() for n in range(N)]
        del self.S
        args = (self.fit, len(self.history), self.history, self.params, self.input_fp)
        return TuckerResult(core, [np.array(f) for f in factors], *args)
