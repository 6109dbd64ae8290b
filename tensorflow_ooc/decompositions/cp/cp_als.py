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
from contextvars import ContextVar
from functools import partial
from typing import Callable, Sequence

import numpy as np
from distributed import Client

from ...errors import DecompositionError
from ...execution import DeviceOptions, get_client
from ...execution.cluster import scheduler_workers
from ...execution.inline import INLINE_MAX_NNZ
from ...execution.owner_computes import TeamLost
from ...store import Store
from ...store.dense import DenseArray
from ..common.cp_result import CPResult, arrange
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_model, check_tensor_norm
from ..common.mttkrp_input import open_graph, open_input
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
from .randomized import with_trees
from .updates import HALS_SWEEPS

log = logging.getLogger(__name__)


__all__ = ["cp_als", "open_input", "FIT_EVERY_ITERATION_NNZ", "HALS_SWEEPS"]


def cp_als(
    store: Store | DenseArray | str | os.PathLike | np.ndarray,
    rank: int,
    *,
    client: Client | None = None,
    max_iters: int = 50,
    tol: float = 1e-5,
    init: str | Sequence[np.ndarray] = "random",
    seed: int | None = None,
    dtype: str = "float64",
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    callback: Callable[[dict], None] | None = None,
    execution: str = "auto",
    checkpoint_every: int = 1,
    scheduler: str | None = None,
    partitions: int | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    device: str = "auto",
    device_options: DeviceOptions | None = None,
    method: str = "exact",
    samples: int = 65536,
    fit_every: int | None = None,
    distribution: str = "auto",
    nonnegative: bool = False,
    reg: float = 0.0,
) -> CPResult:
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
    client : distributed.Client, optional
        Cluster to run on. Default: an embedded in-process LocalCluster (dashboard link logged),
        or the scheduler at ``scheduler``; tensors of at most ``INLINE_MAX_NNZ`` (2^24) nonzeros run
        the same task functions directly in this process, without Dask, whose per-task cost would
        dominate their iterations (``scheduler="embedded"`` keeps the LocalCluster and dashboard).
    scheduler : str, optional
        Address of a Dask scheduler, or "embedded" or "inline" to choose the local execution.
    max_iters, tol : stop after ``max_iters`` iterations or when the fit changes by less than ``tol``.
    init : "random" or sequence of (I_n, R) arrays
        Initial factors; "random" draws uniform [0, 1) factors from ``seed``.
    dtype : "float64" or "float32"
    checkpoint : path, optional
        Checkpoint file, written atomically every ``checkpoint_every`` iterations.
    resume : bool
        Continue from ``checkpoint`` if it exists (same store and rank required).
    callback : callable, optional
        Called with each iteration's history record.
    execution : {"auto", "streaming", "in-memory"}
        See :class:`tensorflow_ooc.execution.MTTKRPGraph`.
    out : path, optional
        Also write the result to this Zarr result store.
    device : {"auto", "cpu", "gpu"}
        Where MTTKRP runs: "gpu" on the cluster's GPU workers (streaming batches over CUDA streams
        when the tensor does not fit the device), "cpu" on CPU workers, "auto" on GPUs when the
        cluster has them. On GPU workers with CuPy the mode updates run on the device too.
    device_options : DeviceOptions, optional
        GPU kernel and streaming settings (conflict resolution, streams, device memory limit).
    method : {"exact", "sts", "arls-lev", "arls-lev-hybrid"}
        How each least-squares problem is solved (above). Randomized methods run on CPU workers.
    samples : int
        Khatri-Rao rows drawn per mode and iteration by the randomized methods (J; default 2^16).
    fit_every : int, optional
        Randomized methods: evaluate the fit (exactly, by the inner-product identity, which costs
        one full MTTKRP) every this many iterations and at the last; default every iteration up to
        2^24 nonzeros, else every 5th. They stop when the best fit of the last 3 evaluations
        improves on the best before by less than ``tol``. The exact method evaluates it every
        iteration at no extra cost.
    distribution : {"auto", "owner", "graph"}
        How exact CP-ALS and STS-CP spread over several workers. "owner" (the default, "auto", on
        a cluster of several workers, CPU or one per GPU): owner-computes, each worker keeps its
        partitions and the factor rows it owns, one task per worker and iteration, rows sent
        worker to worker only where they are shared (:mod:`~tensorflow_ooc.decompositions.cp.cp_owner`);
        STS-CP draws across the workers, each owner walking its own rows' tree
        (:mod:`~tensorflow_ooc.decompositions.cp.cp_owner_sampling`). The history adds the bytes
        sent per iteration beside their lower bound. A worker lost mid-run restarts the run on
        the workers left, from ``checkpoint`` when there is one. "graph": per-mode task graphs
        with a reduce-scatter of the partials (what one worker, dense arrays and CP-ARLS-LEV
        always use). Nonnegative runs always use "graph" ("owner" is refused).
    nonnegative : bool
        Nonnegative CP-ALS by HALS (above), of a sparse store or a dense array, with
        ``method="exact"`` (the randomized methods are refused). A given ``init`` must be
        nonnegative; random initial factors are. The fit is the same exact ``1 - ||X - M|| / ||X||``.
    reg : float
        L2 (ridge) regularization of nonnegative runs (>= 0, default 0): each mode's subproblem
        becomes ``min_{A >= 0} 1/2 ||X_(n) - A KR^T||^2 + reg/2 ||A||^2`` (KR the Khatri-Rao product
        of the other modes' factors, normalized; the weights are carried by the updated mode), which
        shrinks the model; ``reg`` is added to V's diagonal. TensorLy's ``ridge_coefficient`` is
        ``reg / 2``. ``reg > 0`` without ``nonnegative=True`` is refused.

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
    arguments = dict(locals())  # to restart the run on the workers left after one is lost
    store = open_input(store)
    fit_every = check_arguments(
        store, rank, max_iters, tol, dtype, method, samples, device, fit_every, nonnegative, reg, distribution
    )
    nonnegative, reg = bool(nonnegative), float(reg)
    if nonnegative:
        distribution = "graph"  # the HALS update runs in the per-mode update tasks
        if not isinstance(init, str):
            check_nonnegative_init(init)
    dense, randomized = isinstance(store, DenseArray), method != "exact"
    N, shape = store.nmodes, store.shape
    params = {
        "rank": int(rank),
        "max_iters": int(max_iters),
        "tol": float(tol),
        "seed": seed,
        "dtype": dtype,
        "init": init if isinstance(init, str) else "given",
        "method": method,
        "nonnegative": nonnegative,
        "reg": reg,
    }
    if randomized:
        params.update(samples=int(samples), fit_every=fit_every)
    checkpoint = None if checkpoint is None else str(checkpoint)

    if client is None and scheduler is None and device != "gpu" and store.nnz <= INLINE_MAX_NNZ:
        scheduler = "inline"  # Dask's per-task cost would outweigh the kernels (see execution/inline.py)
    if randomized:
        device = "cpu"
    claim = claim_run(store, out, checkpoint, overwrite, f"cp_als of {store.path}")
    with claim, get_client(client, scheduler, device=device) as c, ExitStack() as cleanup:
        # --- the graph, ||X||, and the initial state: fresh, or from the last checkpoint -------------
        graph = open_graph(
            c,
            store,
            params,
            execution=execution,
            partitions=partitions,
            device=device,
            device_options=device_options,
            rank=rank,
            dtype=dtype,
            samples=int(samples) if randomized else 0,
            load=distribution == "graph" or method not in OWNER_METHODS or dense,
        )
        owner = use_owner_computes(c, graph, dense, method, distribution)
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
            checkpoint if resume else None,
            input_fp,
            init,
            shape,
            rank,
            seed,
            dtype,
            on_workers=owner,
            same={"nonnegative": nonnegative, "reg": reg},
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
            params["sample_entropy"] = run_entropy(sample_entropy, seed)
            if method == "sts" and not owner:
                F = c.submit(with_trees, F, pure=False, **on_cluster)
            step = partial(randomized_step, c, graph, N, method, samples, params["sample_entropy"])
        else:
            step = partial(exact_step, graph, N, nonneg=U.NonNegative(reg) if nonnegative else None)
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
        for iteration in range(start, max_iters):
            t_iter = time.time()
            fit_old = fit
            evaluate = not randomized or (iteration + 1) % fit_every == 0 or iteration + 1 == max_iters
            exchange = None
            if owner:
                try:
                    # the next iteration goes ahead unless this one ends the run or writes a
                    # checkpoint (whose rows must be this iteration's)
                    due = checkpoint and (iteration + 1) % checkpoint_every == 0
                    # randomized runs stop by the driver's test on the evaluated fits: never ahead
                    last = due or iteration + 1 >= max_iters or randomized
                    ahead = None if last else (iteration + 1, False, normX2, tol)
                    sketch = (int(samples), params["sample_entropy"], evaluate) if randomized else None
                    sm, exchange = owner_summary(
                        engine.iterate(owner_iteration, (iteration, iteration == 0, normX2, tol, sketch), ahead),
                        engine.plan.mode_lower_bound_bytes(rank, np.dtype(dtype).itemsize),
                    )
                except TeamLost as exc:
                    engine.release()
                    graph.release()
                    return _restart(arguments, c, checkpoint, exc)
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
                samples,
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
            done = converged(randomized, tol, iteration, fit, fit_old, evaluate, evaluated)
            if checkpoint and (done or (iteration + 1) % checkpoint_every == 0 or iteration + 1 == max_iters):
                if owner:
                    record["checkpoint_seconds"] = owner_checkpoint(
                        engine, checkpoint, shape, rank, dtype, weights, iteration, fit, history, params, input_fp
                    )
                else:
                    record["checkpoint_seconds"] = save_checkpoint(
                        c, checkpoint, F, weights, iteration, fit, history, params, input_fp
                    )
            # after the write, so a callback that stops the run (cancel) finds this iteration saved
            if callback is not None:
                callback(record)
            if done:
                break
        if owner:
            final = owner_factors(engine, shape, rank, dtype)
            engine.release()
        else:
            final = final_factors(c, F, N)
        del F
        graph.release()

    lam, factors = arrange(weights, [np.array(v) for v in final])
    result = CPResult(lam, factors, fit, len(history), history, params, input_fp)
    if out is not None:
        result.save(out, overwrite=overwrite)
        log.info("result written to %s", out)
    return result


MAX_RESTARTS = 3


_RESTARTS: ContextVar[int] = ContextVar("cp_als_restarts", default=0)


def _restart(arguments: dict, client: Client, checkpoint: str | None, exc: Exception) -> CPResult:
    """Run again after a worker of an owner-computes run was lost: on the workers left (and any
    that came back), from ``checkpoint`` when there is one, else from the first iteration (the
    same initial factors: the result is the one the uninterrupted run gives)."""
    attempts = _RESTARTS.get() + 1
    if attempts > MAX_RESTARTS:
        raise DecompositionError(f"CP-ALS lost a worker {attempts} times; giving up ({exc})") from exc
    log.warning(
        "%s; restarting %s on %d worker(s)",
        exc,
        f"from checkpoint {checkpoint}" if checkpoint else "from the first iteration",
        len(scheduler_workers(client)),
    )
    arguments.update(client=client, resume=bool(checkpoint) or arguments["resume"])
    token = _RESTARTS.set(attempts)
    try:
        return cp_als(**arguments)
    finally:
        _RESTARTS.reset(token)
