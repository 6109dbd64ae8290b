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
from typing import Any, Sequence

import numpy as np

from ...errors import DecompositionError
from ...execution import DEVICES, get_client
from ...execution.graph import EXECUTION_MODES
from ...execution.inline import INLINE_MAX_NNZ, is_inline
from ...execution.ttm_graph import TTMGraph
from ...kernels.ttm.select import KERNELS
from ...store import Store, open_store, paths
from ..common.checkpoint_files import disk_full_returned, raise_returned
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_factor_memory, check_seed
from ..common.options import declared
from ..common.result_store import claim_run
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
    ranks : int or sequence of int
        Core size ``J_n`` per mode (one integer: every mode), ``1 <= J_n <= I_n``.
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
    N, shape = store.nmodes, tuple(int(s) for s in store.shape)
    ranks = check_ranks(ranks, shape)
    check_factor_memory(shape, ranks, f"Tucker of {store.path}")
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
    run.checkpoint = None if run.checkpoint is None else str(run.checkpoint)
    input_fp = fingerprint(store)
    state0 = read_tucker_checkpoint(run.checkpoint) if (run.resume and run.checkpoint) else None
    if state0 is not None and (
        state0.input["store_id"] != input_fp["store_id"] or tuple(state0.params.get("ranks", ())) != ranks
    ):
        raise DecompositionError(
            f"{run.checkpoint}: checkpoint is for another store or other ranks "
            f"({state0.params.get('ranks')}); remove it or drop resume"
        )
    if o.seed is not None and (isinstance(o.seed, bool) or not isinstance(o.seed, numbers.Integral)):
        raise DecompositionError(f"seed must be an integer or None, got {o.seed!r}")
    o.seed = None if o.seed is None else int(o.seed)
    params = {
        "ranks": list(ranks),
        "max_iters": int(o.max_iters),
        "tol": float(o.tol),
        "seed": o.seed,
        "init": o.init if isinstance(o.init, str) else "given",
        "svd": o.svd,
        "kernel": o.kernel,
    }
    normX2 = float(store.meta["norm_sq"])
    normX = math.sqrt(normX2)

    if run.client is None and run.scheduler is None and run.device != "gpu" and store.nnz <= INLINE_MAX_NNZ:
        run.scheduler = "inline"  # Dask's per-task cost would outweigh the kernels (see execution/inline.py)
    from tqdm.auto import tqdm

    claim = claim_run(
        store, run.out, run.checkpoint, run.overwrite, f"tucker_hooi of {store.path}", error=DecompositionError
    )
    with claim, get_client(run.client, run.scheduler, device=run.device) as c:
        graph = TTMGraph(
            c, store.path, execution=run.execution, partitions=run.partitions, kernel=o.kernel, device=run.device
        )
        params["device"] = graph.device
        params["execution"] = graph.execution
        params["partitions"] = len(graph.parts)
        params["scheduler"] = "inline" if is_inline(c) else "dask"
        # --- initial state: fresh, or from the last checkpoint -----------------------------------
        if state0 is not None:
            # factors scattered, not embedded: Dask warns about (and copies) graphs of tens of MB
            S = c.submit(
                T.given_init, shape, ranks, c.scatter(list(state0.factors), hash=False), state0.core, pure=False
            )
            start, fit, history = state0.iteration + 1, state0.fit, list(state0.history)
            svd_entropy = state0.params.get("svd_entropy")
            log.info("resuming from %s after iteration %d (fit %.6f)", run.checkpoint, start, fit)
        else:
            if o.init == "random":
                S = c.submit(T.random_init, shape, ranks, o.seed, pure=False)
            elif o.init == "nvecs":
                S = c.submit(T.nvecs_init, store.path, shape, ranks, pure=False)
            else:
                given = [None if a is None else np.asarray(a) for a in o.init]
                S = c.submit(T.given_init, shape, ranks, c.scatter(given, hash=False), pure=False)
            start, fit, history, svd_entropy = 0, 0.0, [], None
        if svd_entropy is None:
            # one entropy per run, kept in checkpoints: a resumed run draws the test vectors the
            # uninterrupted one would have
            svd_entropy = int(np.random.SeedSequence(check_seed(o.seed)).entropy) % 2**63
        params["svd_entropy"] = int(svd_entropy)
        params["resumed_after"] = start
        chunk_bytes = sum(paths.disk_bytes(f"{str(store.path).rstrip('/')}/{name}") for name in ("alto", "values"))
        streamed = graph.execution == "streaming"
        bar = tqdm(
            total=o.max_iters,
            initial=start,
            desc="tucker-hooi",
            unit="it",
            leave=False,
            disable=None if run.progress else True,
        )

        # A whole iteration is submitted at once: per mode the TTM partition tasks, the reduction
        # and one update task (one task in all when there is one partition), so the modes follow
        # each other on the cluster; the driver reads the small summary once per iteration.
        try:
            for iteration in range(start, o.max_iters):
                t_iter = time.time()
                fit_old = fit
                for n in range(N):
                    S = graph.mode_update(S, n, T.update_factor, n == N - 1, o.svd, (svd_entropy, iteration, n))
                sm = c.submit(T.summary, S, pure=False).result()
                fit = 1 - math.sqrt(abs(normX2 - sm.core_norm2)) / normX if normX > 0 else 0.0
                seconds = time.time() - t_iter
                ends = [t_iter] + [sm.finished[n] for n in range(N)]
                ttm_s = [sm.timings[n][0] for n in range(N)]
                svd_s = [sm.timings[n][1] for n in range(N)]
                layout_s = [sm.timings[n][2] for n in range(N)]
                record = {
                    "iteration": iteration + 1,
                    "fit": fit,
                    "fit_change": abs(fit - fit_old),
                    "seconds": seconds,
                    "mode_seconds": [max(0.0, ends[k + 1] - ends[k]) for k in range(N)],
                    "ttm_seconds": ttm_s,
                    "layout_seconds": layout_s,
                    "svd_seconds": svd_s,
                    "other_seconds": max(0.0, seconds - sum(ttm_s) - sum(svd_s)),
                    "svd_methods": [sm.methods[n] for n in range(N)],
                    "nonempty_slices": [sm.rows[n] for n in range(N)],
                    "nnz_per_s": store.nnz * N / seconds,
                    "bytes_read": chunk_bytes * N if streamed else (chunk_bytes if iteration == start else 0),
                }
                history.append(record)
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
                done = record["fit_change"] < o.tol  # pyttb's rule, its first iteration included
                if run.checkpoint and (
                    done or (iteration + 1) % run.checkpoint_every == 0 or iteration + 1 == o.max_iters
                ):
                    t_ck = time.time()
                    raise_returned(
                        c.submit(
                            disk_full_returned,
                            write_tucker_checkpoint,
                            run.checkpoint,
                            S,
                            iteration,
                            fit,
                            history,
                            params,
                            input_fp,
                            pure=False,
                        ).result()
                    )
                    record["checkpoint_seconds"] = time.time() - t_ck
                bar.update(1)
                bar.set_postfix(fit=f"{fit:.6f}", dfit=f"{record['fit_change']:.1e}", s_per_it=f"{seconds:.3f}")
                if run.callback is not None:
                    run.callback(record)
                if done:
                    break
        finally:
            bar.close()
        core = c.submit(T.core_of, S, pure=False).result()
        factors = [c.submit(T.factor_of, S, n, pure=False).result() for n in range(N)]
        del S
        graph.release()

    result = TuckerResult(core, [np.array(f) for f in factors], fit, len(history), history, params, input_fp)
    if run.out is not None:
        result.save(run.out, overwrite=run.overwrite)
        log.info("result written to %s", run.out)
    return result
