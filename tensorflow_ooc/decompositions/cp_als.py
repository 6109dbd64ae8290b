"""CP-ALS on a BLCO store, as iterated Dask graph reductions (seed 001 chapter 2, Algorithm 1)."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Callable, Sequence

import numpy as np
from distributed import Client

from ..errors import DecompositionError, DenseArrayError
from ..execution import DeviceOptions, MTTKRPGraph, get_client
from ..execution.dense_graph import DenseMTTKRPGraph
from ..execution.inline import INLINE_MAX_NNZ, is_inline
from ..store import Store, open_store, paths
from ..store.dense import DenseArray, is_dense_array, open_dense
from . import updates as U
from .checkpoint import disk_full_returned, raise_returned, read_checkpoint, write_checkpoint
from .model_checks import check_count, check_model, check_tensor_norm, check_tolerance
from .randomized import check_method, draw_samples, with_trees
from .result import CPResult, arrange, fingerprint

log = logging.getLogger(__name__)

# randomized methods evaluate the fit (one exact MTTKRP) every iteration up to this size by default
FIT_EVERY_ITERATION_NNZ = 1 << 24


def cp_als(store: Store | DenseArray | str | os.PathLike | np.ndarray, rank: int, *, client: Client | None = None,
           max_iters: int = 50, tol: float = 1e-5, init: str | Sequence[np.ndarray] = "random", seed: int | None = None,
           dtype: str = "float64", checkpoint: str | os.PathLike | None = None, resume: bool = False,
           callback: Callable[[dict], None] | None = None, execution: str = "auto", checkpoint_every: int = 1,
           scheduler: str | None = None, partitions: int | None = None, out: str | os.PathLike | None = None,
           overwrite: bool = False, device: str = "auto", device_options: DeviceOptions | None = None,
           method: str = "exact", samples: int = 65536, fit_every: int | None = None) -> CPResult:
    """Rank-``rank`` CP decomposition of a sparse store or a dense array by alternating least squares.

    Each iteration solves, mode by mode, ``A_n = argmin || A_n (odot_{m != n} A_m)^T - X_(n) ||``.
    ``method="exact"`` solves it through the full MTTKRP (Algorithm 1 of seed 001); the randomized
    methods solve a sketch of it (seed 000, chapter 3): ``samples`` rows of the Khatri-Rao product
    drawn by their exact leverage scores (``"sts"``, STS-CP: a segment tree per factor, O(R^2 log I)
    per draw), or by the product of the factors' leverage scores (``"arls-lev"``, CP-ARLS-LEV;
    ``"arls-lev-hybrid"`` also takes every row of probability >= 1/samples deterministically). The
    sampled right-hand side needs only the nonzeros of the sampled fibers.

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
    """
    store = open_input(store)
    dense = isinstance(store, DenseArray)
    check_count("rank", rank)
    check_count("max_iters", max_iters)
    check_tolerance(tol)
    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    check_method(method, samples)
    randomized = method != "exact"
    if dense and randomized:
        raise DenseArrayError(f"{store.path}: method={method!r} samples fibers of a sparse store; a dense "
                              f"array takes method='exact'")
    if randomized and device == "gpu":
        raise ValueError(f"method={method!r} runs on CPU workers; use device='cpu' or 'auto'")
    if fit_every is not None and int(fit_every) < 1:
        raise ValueError(f"fit_every must be >= 1, got {fit_every}")
    fit_every = int(fit_every) if fit_every is not None else (1 if store.nnz <= FIT_EVERY_ITERATION_NNZ else 5)
    N, shape = store.nmodes, store.shape
    params = {"rank": int(rank), "max_iters": int(max_iters), "tol": float(tol), "seed": seed, "dtype": dtype,
              "init": init if isinstance(init, str) else "given", "method": method}
    if randomized:
        params.update(samples=int(samples), fit_every=fit_every)
    checkpoint = None if checkpoint is None else str(checkpoint)

    if client is None and scheduler is None and device != "gpu" and store.nnz <= INLINE_MAX_NNZ:
        scheduler = "inline"      # Dask's per-task cost would outweigh the kernels (see execution/inline.py)
    if randomized:
        device = "cpu"
    with get_client(client, scheduler, device=device) as c:
        graph_of = DenseMTTKRPGraph if dense else MTTKRPGraph
        graph = graph_of(c, store if dense else store.path, execution=execution, partitions=partitions,
                         device=device, device_options=device_options, rank=rank, dtype=dtype,
                         samples=int(samples) if randomized else 0)
        params["execution"] = graph.execution
        params["in_place_updates"] = graph.in_place
        if graph.memory_plan is not None:
            params["memory_plan"] = graph.memory_plan.as_dict()
        params["device"] = graph.device
        params["scheduler"] = "inline" if is_inline(c) else "dask"
        on_cluster = graph.placement     # update tasks run where the MTTKRP partials are made
        if dense:
            # ||X||^2 and the NaN/Inf check in one pass over the chunks, before anything is written
            store.set_norm_sq(graph.scan())
            params["input_kind"] = f"dense {store.kind} array"
        input_fp = fingerprint(store)
        normX2 = float(store.meta["norm_sq"])
        check_tensor_norm(store.path, normX2)
        normX = math.sqrt(normX2)
        # --- initial state: fresh, or from the last checkpoint ---------------------------------------
        state = read_checkpoint(checkpoint) if (resume and checkpoint) else None
        if state is not None:
            if state.input["store_id"] != input_fp["store_id"] or state.params.get("rank") != rank:
                raise ValueError(f"{checkpoint}: checkpoint is for another store or rank; remove it or drop resume")
            # scattered, not embedded in the graph: Dask warns about (and copies) graphs of
            # tens of MB, which a long factor's rows make
            F = c.submit(U.stack, c.scatter(state.factors, hash=False), dtype, state.weights, pure=False)
            start, fit, history, weights = state.iteration + 1, state.fit, list(state.history), state.weights
            sample_entropy = state.params.get("sample_entropy")
            log.info("resuming from %s after iteration %d (fit %.6f)", checkpoint, state.iteration + 1, fit)
        else:
            if isinstance(init, str):
                if init != "random":
                    raise ValueError(f"init must be 'random' or a list of factor matrices, got {init!r}")
                F = c.submit(U.random_factors, shape, rank, seed, dtype, pure=False)
            else:
                if len(init) != N or any(np.shape(a) != (shape[n], rank) for n, a in enumerate(init)):
                    raise ValueError(f"init must hold {N} matrices of shapes {[(s, rank) for s in shape]}")
                bad = [n for n, a in enumerate(init) if not np.isfinite(np.asarray(a, dtype=np.float64)).all()]
                if bad:
                    raise DecompositionError(f"init: factor matrix {bad[0]} holds NaN or infinite entries")
                F = c.submit(U.stack, c.scatter([np.asarray(a) for a in init], hash=False), dtype, pure=False)
            start, fit, history, weights = 0, 0.0, [], np.ones(rank)
            sample_entropy = None
        if graph.device == "gpu":
            F = c.submit(U.on_device, F, pure=False, **on_cluster)
        params["resumed_after"] = start
        if randomized:
            # one entropy per run, kept in checkpoints: a resumed run draws what the first would have
            if sample_entropy is None:
                sample_entropy = int(np.random.SeedSequence(seed).entropy) % 2**63   # seed None: fresh entropy
            params["sample_entropy"] = int(sample_entropy)
            if method == "sts":
                F = c.submit(with_trees, F, pure=False, **on_cluster)
        evaluated = [h["fit"] for h in history if h.get("fit_evaluated", True)]
        empty_seen: dict[int, int] = {}
        # bytes read from the store per iteration (for monitoring): a streaming pass reads every
        # compressed chunk once per mode; in memory, the partitions were read once, before the first
        # iteration of this run, and are counted there
        chunk_bytes = store.stored_bytes() if dense else _chunk_bytes(store)
        streamed = graph.execution == "streaming"

        # --- Algorithm 1 -----------------------------------------------------------------------------
        # F is the future of the model state (factors, Grams, weights). A whole iteration is
        # submitted at once: each mode is its MTTKRP graph and one update task (Hadamard product of
        # Grams, Cholesky solve, normalization), one task in all when there is one partition, so
        # modes follow each other on the cluster with no round trip to the driver; the driver reads
        # the small summary once per iteration.
        iteration = start - 1
        for iteration in range(start, max_iters):
            t_iter = time.time()
            fit_old = fit
            evaluate = not randomized or (iteration + 1) % fit_every == 0 or iteration + 1 == max_iters
            for n in range(N):
                if not randomized:
                    # MTTKRP graph, then the update (fused into one task when there is one partition)
                    F = graph.mode_update(F, n, U.update_mode, iteration == 0, n == N - 1, graph.in_place)
                    continue
                # draw beside the state, gather the sampled fibers, solve the sketched problem; the
                # last mode of an evaluated iteration also runs the exact MTTKRP for the fit
                S = c.submit(draw_samples, F, n, method, samples, (params["sample_entropy"], iteration, n),
                             pure=False, **on_cluster)
                F = graph.sampled_mode_update(F, S, n, U.update_mode, evaluate and n == N - 1, iteration == 0,
                                              n == N - 1, graph.in_place)
            sm = c.submit(U.summary, F, pure=False).result()
            weights = sm.weights
            # per-mode seconds from the update tasks' finish times (worker clocks)
            ends = [t_iter] + [sm.finished[n] for n in range(N)]
            mode_seconds = [max(0.0, ends[k + 1] - ends[k]) for k in range(N)]
            # fit without forming the model: ||X - M||^2 = ||X||^2 + ||M||^2 - 2 <X, M>
            H = np.ones((rank, rank))
            for g in sm.grams:
                H *= g
            norm_model2 = float(weights @ H @ weights)
            if evaluate:
                iprod = float((sm.inner * weights).sum())
                fit = 1 - math.sqrt(abs(normX2 + norm_model2 - 2 * iprod)) / normX if normX > 0 else 0.0
                evaluated.append(fit)
            # a NaN fit or an all-zero model stops the run here, naming the cause, never exit 0
            check_model(iteration + 1, fit, weights, norm_model2, normX2)
            seconds = time.time() - t_iter
            mttkrp_s = [sm.timings[n][0] for n in range(N)]
            update_s = [sm.timings[n][1] for n in range(N)]
            sampling_s = [sm.sampling.get(n, 0.0) for n in range(N)]      # all 0 for exact CP-ALS
            record = {"iteration": iteration + 1, "fit": fit, "fit_change": abs(fit - fit_old) if evaluate else 0.0,
                      "fit_evaluated": evaluate, "seconds": seconds,
                      "mode_seconds": mode_seconds, "mttkrp_seconds": mttkrp_s, "update_seconds": update_s,
                      "other_seconds": max(0.0, seconds - sum(mttkrp_s) - sum(update_s) - sum(sampling_s)
                                           - sm.fit_seconds),
                      "nnz_per_s": store.nnz * N / seconds,
                      "bytes_read": chunk_bytes * N if streamed else (chunk_bytes if iteration == start else 0)}
            if randomized:
                # mttkrp_seconds are the sampled MTTKRPs; fit_seconds the exact one of the fit
                record["sampling_seconds"] = sampling_s
                record["fit_seconds"] = sm.fit_seconds     # 0 unless this iteration evaluated the fit
                kept = [n for n in range(N) if sm.empty_sketches.get(n, 0) > empty_seen.get(n, 0)]
                empty_seen = dict(sm.empty_sketches)
                if kept:
                    record["kept_modes"] = kept
                    log.warning("iteration %d: no sampled fiber of mode(s) %s held a nonzero, so those factors "
                                "were kept; the tensor is too sparse for %d samples (raise samples)",
                                iteration + 1, kept, samples)
            history.append(record)
            log.info("iteration %d: fit %.6f (change %.2e), %.3f s", iteration + 1, fit, record["fit_change"], seconds,
                     extra={"iteration": iteration + 1})     # a field of its own in JSON logs
            if randomized:
                # sketched solves make the fit noisy: stop when the best of the last 3 evaluations
                # does not beat the best before them by tol (seed 000, section 3.6.9)
                done = tol > 0 and evaluate and len(evaluated) > 3 and max(evaluated[-3:]) - max(evaluated[:-3]) < tol
            else:
                done = iteration > 0 and abs(fit - fit_old) < tol
            if checkpoint and (done or (iteration + 1) % checkpoint_every == 0 or iteration + 1 == max_iters):
                t_ck = time.time()
                raise_returned(c.submit(disk_full_returned, write_checkpoint, checkpoint,
                                        c.submit(U.on_host, F, pure=False), weights, iteration, fit, history, params,
                                        input_fp, pure=False).result())
                # after the write, so a callback that stops the run (cancel) finds this iteration saved
                record["checkpoint_seconds"] = time.time() - t_ck
            if callback is not None:
                callback(record)
            if done:
                break
        # mode by mode: sending the whole state at once would need a second copy of it on the worker
        host = c.submit(U.on_host, F, pure=False)
        final = [c.submit(U.factor_rows, host, n, pure=False).result() for n in range(N)]
        del host, F
        graph.release()

    lam, factors = arrange(weights, [np.array(v) for v in final])
    result = CPResult(lam, factors, fit, len(history), history, params, input_fp)
    if out is not None:
        result.save(out, overwrite=overwrite)
        log.info("result written to %s", out)
    return result


def open_input(x: Store | DenseArray | str | os.PathLike | np.ndarray) -> Store | DenseArray:
    """The CP-ALS input: a BLCO store, or a dense array (a Zarr array path, URL or ``zarr.Array``,
    a Dask array, a NumPy array) as a :class:`~tensorflow_ooc.store.dense.DenseArray`."""
    if isinstance(x, (Store, DenseArray)):
        return x
    if isinstance(x, (str, os.PathLike)):
        return open_dense(x) if is_dense_array(x) else open_store(x)
    return open_dense(x)


def _chunk_bytes(store: Store) -> int:
    """Compressed bytes of the store's chunk data (its index and value arrays)."""
    base = str(store.path).rstrip("/")
    return sum(paths.disk_bytes(f"{base}/{name}") for name in ("alto", "values"))
