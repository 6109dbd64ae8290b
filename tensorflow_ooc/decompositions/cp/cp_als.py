"""CP-ALS on a BLCO store, as iterated Dask graph reductions (seed 001 chapter 2, Algorithm 1).

The loop below is Algorithm 1; each of its pieces (the per-mode steps, exact and randomized, the
fit, the history record, the convergence test, the checkpoint) is a small function in
:mod:`~tensorflow_ooc.decompositions.cp.cp_steps`.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from functools import partial
from typing import Any

import numpy as np
from distributed import Client

from ...errors import DecompositionError
from ...execution import get_client
from ...execution.cluster import scheduler_workers
from ...execution.inline import INLINE_MAX_NNZ
from ...execution.owner_computes import TeamLost
from ...store import Store
from ...store.dense import DenseArray
from ..common.cp_result import CPResult, arrange
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_model, check_tensor_norm
from ..common.mttkrp_input import open_graph, open_input
from ..common.options import declared
from ..common.result_store import claim_run
from ..common.run_control import FIT_EVERY_ITERATION_NNZ, chunk_bytes, converged, run_entropy
from . import updates as U
from .cp_owner import (
    OWNER_METHODS,
    owner_checkpoint,
    owner_factors,
    owner_iteration,
    owner_summary,
    start_owner_computes,
    use_owner_computes,
)
from .cp_steps import (
    check_arguments,
    check_nonnegative_init,
    exact_step,
    final_factors,
    initial_state,
    iteration_record,
    model_fit,
    model_norm_sq,
    randomized_step,
    save_checkpoint,
)
from .options import CP_ALS
from .randomized import with_trees
from .updates import HALS_SWEEPS

log = logging.getLogger(__name__)


__all__ = ["cp_als", "open_input", "FIT_EVERY_ITERATION_NNZ", "HALS_SWEEPS"]


@declared(CP_ALS)
def cp_als(store: Store | DenseArray | str | os.PathLike | np.ndarray, rank: int, **options: Any) -> CPResult:
    """Rank-``rank`` CP decomposition of a sparse store or a dense array by alternating least squares.

    Each iteration solves, mode by mode, ``A_n = argmin || A_n (odot_{m != n} A_m)^T - X_(n) ||``.
    ``method="exact"`` solves it through the full MTTKRP (Algorithm 1 of seed 001); the randomized
    methods solve a sketch of it (seed 000, chapter 3): ``samples`` rows of the Khatri-Rao product
    drawn by their exact leverage scores (``"sts"``, STS-CP: a segment tree per factor, O(R^2 log I)
    per draw), or by the product of the factors' leverage scores (``"arls-lev"``, CP-ARLS-LEV;
    ``"arls-lev-hybrid"`` also takes every row of probability >= 1/samples deterministically). The
    sampled right-hand side needs only the nonzeros of the sampled fibers.

    ``nonnegative=True`` constrains every factor to be >= 0: each mode update is then HALS
    (hierarchical ALS, as TensorLy's ``non_negative_parafac_hals``) on the same normal equations,
    ``HALS_SWEEPS`` (5) sweeps over the columns, each column the exact minimizer with the others
    fixed: ``a_r <- max(0, (M[:, r] - A V[:, r] + V[r, r] a_r) / (V[r, r] + reg))``, with M the
    MTTKRP and V the Hadamard product of the other modes' Grams, warm-started from the current
    model (:mod:`~tensorflow_ooc.kernels.update.hals`).

    Parameters
    ----------
    store : Store, path, or dense array
        A BLCO store (see :func:`tensorflow_ooc.convert`), or a dense tensor of order 3 to 6: a
        Zarr array (path or fsspec URL, or a ``zarr.Array``), a Dask array or a NumPy array. A
        dense array is read a stored chunk at a time (Dask blocks; slabs of a NumPy array): each
        partition task runs the dense MTTKRP kernel (:mod:`tensorflow_ooc.kernels.dense.cpu`)
        on whole chunks, so a Zarr array larger than the workers' memory is streamed. Its values
        are checked (NaN, Inf) in the pass that computes ||X||^2, before the first iteration.
        Dense inputs take ``method="exact"`` only.
    rank : int
        Number of components R.
    {options}

    Returns
    -------
    CPResult

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> from tensorflow_ooc import synthetic
    >>> p = synthetic.planted_cp((20, 30, 40), 3, 3000, seed=0)
    >>> s = tfo.convert((p.coords, p.values), "memory://doc-cp")
    >>> r = tfo.cp_als(s, 3, seed=1, max_iters=30)   # doctest: +SKIP
    >>> r.fit > 0.9                                   # doctest: +SKIP
    True
    >>> r = tfo.cp_als(s, 3, seed=1, method="sts", samples=4096)   # doctest: +SKIP
    >>> X = synthetic.planted_dense((20, 30, 40), 3, seed=0).tensor   # a dense NumPy array
    >>> tfo.cp_als(X, 3, seed=1, max_iters=50).fit > 0.99              # doctest: +SKIP
    True
    >>> r = tfo.cp_als(s, 3, seed=1, nonnegative=True)                # doctest: +SKIP
    >>> all((f >= 0).all() for f in r.factors)                         # doctest: +SKIP
    True
    """
    run, o = CP_ALS.settings(options)
    store = open_input(store)
    o.fit_every = check_arguments(
        store,
        rank,
        o.max_iters,
        o.tol,
        o.dtype,
        o.method,
        o.samples,
        run.device,
        o.fit_every,
        o.nonnegative,
        o.reg,
        run.distribution,
    )
    o.nonnegative, o.reg = bool(o.nonnegative), float(o.reg)
    if o.nonnegative:
        run.distribution = "graph"  # the HALS update runs in the per-mode update tasks
        if not isinstance(o.init, str):
            check_nonnegative_init(o.init)
    randomized = o.method != "exact"
    params = {
        "rank": int(rank),
        "max_iters": int(o.max_iters),
        "tol": float(o.tol),
        "seed": o.seed,
        "dtype": o.dtype,
        "init": o.init if isinstance(o.init, str) else "given",
        "method": o.method,
        "nonnegative": o.nonnegative,
        "reg": o.reg,
    }
    if randomized:
        params.update(samples=int(o.samples), fit_every=o.fit_every)
    run.checkpoint = None if run.checkpoint is None else str(run.checkpoint)

    if run.client is None and run.scheduler is None and run.device != "gpu" and store.nnz <= INLINE_MAX_NNZ:
        run.scheduler = "inline"  # Dask's per-task cost would outweigh the kernels (see execution/inline.py)
    if randomized:
        run.device = "cpu"
    claim = claim_run(store, run.out, run.checkpoint, run.overwrite, f"cp_als of {store.path}")
    with claim, get_client(run.client, run.scheduler, device=run.device) as c:
        # a worker lost by an owner-computes run: again on the workers left, from the checkpoint
        # when there is one, else from the first iteration (the same initial factors, the same result)
        for attempt in range(MAX_RESTARTS + 1):
            try:
                lam, factors, fit, history, params, input_fp = _attempt(c, store, rank, run, o, dict(params))
                break
            except TeamLost as exc:
                if attempt == MAX_RESTARTS:
                    raise DecompositionError(f"CP-ALS lost a worker {attempt + 1} times; giving up ({exc})") from exc
                log.warning(
                    "%s; restarting %s on %d worker(s)",
                    exc,
                    f"from checkpoint {run.checkpoint}" if run.checkpoint else "from the first iteration",
                    len(scheduler_workers(c)),
                )
                run.resume = bool(run.checkpoint) or run.resume
    result = CPResult(lam, factors, fit, len(history), history, params, input_fp)
    if run.out is not None:
        result.save(run.out, overwrite=run.overwrite)
        log.info("result written to %s", run.out)
    return result


MAX_RESTARTS = 3


def _attempt(c: Client, store: Any, rank: int, run: Any, o: Any, params: dict) -> tuple:
    """One run of Algorithm 1 on client ``c`` (fresh, or from the checkpoint when ``run.resume``):
    the arranged weights and factors, the fit, the history, the parameters and the input's
    fingerprint. Raises :class:`TeamLost` when an owner-computes worker is lost."""
    N, shape = store.nmodes, store.shape
    dense, randomized = isinstance(store, DenseArray), o.method != "exact"
    with ExitStack() as cleanup:
        # --- the graph, ||X||, and the initial state: fresh, or from the last checkpoint -------------
        graph = open_graph(
            c,
            store,
            params,
            execution=run.execution,
            partitions=run.partitions,
            device=run.device,
            device_options=run.device_options,
            rank=rank,
            dtype=o.dtype,
            samples=int(o.samples) if randomized else 0,
            load=run.distribution == "graph" or o.method not in OWNER_METHODS or dense,
        )
        owner = use_owner_computes(c, graph, dense, o.method, run.distribution)
        if not owner:
            graph.require_plan()
        else:
            graph.plan_owner_computes()
            params["execution"] = graph.execution
            params["in_place_updates"] = True
            if graph.memory_plan is not None:
                params["memory_plan"] = graph.memory_plan.as_dict()
        if graph.execution == "in-memory" and graph.data is None and not owner:
            graph.load()
        input_fp = fingerprint(store)
        normX2 = float(store.meta["norm_sq"])
        check_tensor_norm(store.path, normX2)
        F, start, fit, history, weights, sample_entropy = initial_state(
            c,
            run.checkpoint if run.resume else None,
            input_fp,
            o.init,
            shape,
            rank,
            o.seed,
            o.dtype,
            on_workers=owner,
            same={"nonnegative": o.nonnegative, "reg": o.reg},
        )
        engine = start_owner_computes(c, graph, F, N) if owner else None
        if owner:
            cleanup.callback(engine.release)  # a run stopped by its callback leaves nothing on the workers
            params["distribution"] = {"kind": "owner-computes", "workers": len(engine.addresses)}
        on_cluster = graph.placement  # update tasks run where the MTTKRP partials are made
        if graph.device == "gpu" and not owner:
            F = c.submit(U.on_device, F, pure=False, **on_cluster)
        params["resumed_after"] = start
        if randomized:
            params["sample_entropy"] = run_entropy(sample_entropy, o.seed)
            if o.method == "sts" and not owner:
                F = c.submit(with_trees, F, pure=False, **on_cluster)
            step = partial(randomized_step, c, graph, N, o.method, o.samples, params["sample_entropy"])
        else:
            step = partial(exact_step, graph, N, nonneg=U.NonNegative(o.reg) if o.nonnegative else None)
        evaluated = [h["fit"] for h in history if h.get("fit_evaluated", True)]
        empty_seen: dict[int, int] = {}
        # bytes read from the store per iteration (for monitoring): a streaming pass reads every
        # compressed chunk once per mode; in memory, the partitions were read once, before the first
        # iteration of this run, and are counted there
        stored = store.stored_bytes() if dense else chunk_bytes(store)
        streamed = graph.execution == "streaming"

        # --- Algorithm 1 -----------------------------------------------------------------------------
        # F is the future of the model state (factors, Grams, weights). A whole iteration is
        # submitted at once: each mode is its MTTKRP graph and one update task (Hadamard product of
        # Grams, Cholesky solve, normalization), one task in all when there is one partition, so
        # modes follow each other on the cluster with no round trip to the driver; the driver reads
        # the small summary once per iteration.
        for iteration in range(start, o.max_iters):
            t_iter = time.time()
            fit_old = fit
            evaluate = not randomized or (iteration + 1) % o.fit_every == 0 or iteration + 1 == o.max_iters
            exchange = None
            if owner:
                try:
                    # the next iteration goes ahead unless this one ends the run or writes a
                    # checkpoint (whose rows must be this iteration's)
                    due = run.checkpoint and (iteration + 1) % run.checkpoint_every == 0
                    # randomized runs stop by the driver's test on the evaluated fits: never ahead
                    last = due or iteration + 1 >= o.max_iters or randomized
                    ahead = None if last else (iteration + 1, False, normX2, o.tol)
                    sketch = (int(o.samples), params["sample_entropy"], evaluate) if randomized else None
                    sm, exchange = owner_summary(
                        engine.iterate(owner_iteration, (iteration, iteration == 0, normX2, o.tol, sketch), ahead),
                        engine.plan.mode_lower_bound_bytes(rank, np.dtype(o.dtype).itemsize),
                    )
                except TeamLost as exc:
                    engine.release()
                    graph.release()
                    raise exc
            else:
                for n in range(N):
                    F = step(F, n, iteration, evaluate)
                sm = c.submit(U.summary, F, pure=False).result()
            weights = sm.weights
            norm_model2 = model_norm_sq(sm)
            if evaluate:
                fit = model_fit(sm, normX2, norm_model2)
                evaluated.append(fit)
            # a NaN fit or an all-zero model stops the run here, naming the cause, never exit 0
            check_model(iteration + 1, fit, weights, norm_model2, normX2)
            record = iteration_record(
                iteration,
                t_iter,
                sm,
                fit,
                fit_old,
                evaluate,
                store.nnz,
                stored * N if streamed else (stored if iteration == start else 0),
                randomized,
                o.samples,
                empty_seen,
            )
            if exchange is not None:
                record.update(exchange)
            history.append(record)
            log.info(
                "iteration %d: fit %.6f (change %.2e), %.3f s",
                iteration + 1,
                fit,
                record["fit_change"],
                record["seconds"],
                extra={"iteration": iteration + 1},
            )  # a field of its own in JSON logs
            done = converged(randomized, o.tol, iteration, fit, fit_old, evaluate, evaluated)
            if run.checkpoint and (done or (iteration + 1) % run.checkpoint_every == 0 or iteration + 1 == o.max_iters):
                if owner:
                    record["checkpoint_seconds"] = owner_checkpoint(
                        engine, run.checkpoint, shape, rank, o.dtype, weights, iteration, fit, history, params, input_fp
                    )
                else:
                    record["checkpoint_seconds"] = save_checkpoint(
                        c, run.checkpoint, F, weights, iteration, fit, history, params, input_fp
                    )
            # after the write, so a callback that stops the run (cancel) finds this iteration saved
            if run.callback is not None:
                run.callback(record)
            if done:
                break
        if owner:
            final = owner_factors(engine, shape, rank, o.dtype)
            engine.release()
        else:
            final = final_factors(c, F, N)
        del F
        graph.release()

    lam, factors = arrange(weights, [np.array(v) for v in final])
    return lam, factors, fit, history, params, input_fp
