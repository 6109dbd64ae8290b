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
from typing import Callable, Sequence

import numpy as np
from distributed import Client

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
from ..common.result_store import claim_run
from . import tucker_updates as T
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


def tucker_hooi(
    store: Store | str | os.PathLike,
    ranks: int | Sequence[int],
    *,
    client: Client | None = None,
    max_iters: int = 50,
    tol: float = 1e-4,
    init: str | Sequence[np.ndarray | None] = "random",
    seed: int | None = None,
    svd: str = "auto",
    kernel: str | None = None,
    device: str = "cpu",
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    checkpoint_every: int = 1,
    callback: Callable[[dict], None] | None = None,
    execution: str = "auto",
    scheduler: str | None = None,
    partitions: int | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> TuckerResult:
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
    client : distributed.Client, optional
        Cluster to run on. Default: tensors of at most 2^24 nonzeros run the same task functions
        in this process (:mod:`tensorflow_ooc.execution.inline`), larger ones on an embedded
        LocalCluster (dashboard link logged), or on the scheduler at ``scheduler``.
    scheduler : str, optional
        Address of a Dask scheduler, or "embedded" or "inline" to choose the local execution.
    max_iters, tol : stop after ``max_iters`` iterations or when the fit changes by less than ``tol``.
    init : "random", "nvecs" or a sequence of (I_n, J_n) arrays
        As pyttb: "random" draws uniform [0, 1) factors (seeded by ``seed``) for every mode but
        the first; "nvecs" takes the ``J_n`` leading eigenvectors of ``X_(n) X_(n)^T`` (it reads
        the store's nonzeros into one process, as pyttb holds them; use "random" for stores
        larger than memory). Given factors: the first may be None.
    seed : int, optional
        Seed of the random initial factors and of the randomized SVD's test vectors.
    svd : {"auto", "gram", "randomized"}
        How the leading singular vectors are found (:mod:`.tucker_updates`): "auto" takes the
        Gram matrix's eigendecomposition when the smaller side of the ``F x P`` block (``F``
        non-empty slices, ``P = prod_{m != n} J_m``) is at most 2048, else a randomized range
        finder with two power iterations.
    kernel : {"coo", "csr", "fiber"}, optional
        TTM kernel (default: the kernel selector's choice per mode; see ``ttm_chain``).
    device : {"cpu", "gpu", "auto"}
        Where the partition tasks run: "gpu" on the cluster's GPU workers, the sparse TTM that
        starts each chain on the device (the ``csr`` kernel needs CuPy there); "auto" on GPUs
        when the cluster has them. The SVDs run on the workers' CPUs. Default "cpu".
    checkpoint : path, optional
        Checkpoint file (the factors), written atomically every ``checkpoint_every`` iterations.
    resume : bool
        Continue from ``checkpoint`` if it exists (same store and ranks required).
    callback : callable, optional
        Called with each iteration's history record.
    execution : {"auto", "streaming", "in-memory"}
        Stream each partition's chunks on every pass, or decode them once and keep them on the
        workers (``auto``: in memory when that takes at most half of the workers' memory).
    partitions : int, optional
        Partition tasks per mode (default one per Dask thread).
    out : path, optional
        Also write the result to this Zarr result store (:func:`load_tucker` reads it back).
    overwrite : bool
        Replace an existing result at ``out`` (without it, an existing ``out`` is refused before
        anything runs).
    progress : bool
        Show a progress bar (tqdm, on terminals only) with the fit and seconds per iteration.

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
    store = store if isinstance(store, Store) else open_store(store)
    N, shape = store.nmodes, tuple(int(s) for s in store.shape)
    ranks = check_ranks(ranks, shape)
    check_factor_memory(shape, ranks, f"Tucker of {store.path}")
    init = check_init(init, shape, ranks)
    if isinstance(max_iters, bool) or not isinstance(max_iters, numbers.Integral) or max_iters < 1:
        raise DecompositionError(f"max_iters must be an integer >= 1, got {max_iters!r}")
    if not isinstance(tol, numbers.Real) or not math.isfinite(tol) or tol < 0:
        raise DecompositionError(f"tol must be a finite number >= 0, got {tol!r}")
    if svd not in T.SVD_METHODS:
        raise DecompositionError(f"svd must be one of {T.SVD_METHODS}, got {svd!r}")
    if kernel is not None and kernel not in KERNELS:
        raise DecompositionError(f"kernel must be one of {KERNELS} or None (the selector's choice), got {kernel!r}")
    if device not in DEVICES:
        raise DecompositionError(f"device must be one of {DEVICES}, got {device!r}")
    if execution not in EXECUTION_MODES:
        raise DecompositionError(f"execution must be one of {EXECUTION_MODES}, got {execution!r}")
    if int(checkpoint_every) < 1:
        raise DecompositionError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    checkpoint = None if checkpoint is None else str(checkpoint)
    input_fp = fingerprint(store)
    state0 = read_tucker_checkpoint(checkpoint) if (resume and checkpoint) else None
    if state0 is not None and (
        state0.input["store_id"] != input_fp["store_id"] or tuple(state0.params.get("ranks", ())) != ranks
    ):
        raise DecompositionError(
            f"{checkpoint}: checkpoint is for another store or other ranks "
            f"({state0.params.get('ranks')}); remove it or drop resume"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise DecompositionError(f"seed must be an integer or None, got {seed!r}")
    seed = None if seed is None else int(seed)
    params = {
        "ranks": list(ranks),
        "max_iters": int(max_iters),
        "tol": float(tol),
        "seed": seed,
        "init": init if isinstance(init, str) else "given",
        "svd": svd,
        "kernel": kernel,
    }
    normX2 = float(store.meta["norm_sq"])
    normX = math.sqrt(normX2)

    if client is None and scheduler is None and device != "gpu" and store.nnz <= INLINE_MAX_NNZ:
        scheduler = "inline"  # Dask's per-task cost would outweigh the kernels (see execution/inline.py)
    from tqdm.auto import tqdm

    claim = claim_run(store, out, checkpoint, overwrite, f"tucker_hooi of {store.path}", error=DecompositionError)
    with claim, get_client(client, scheduler, device=device) as c:
        graph = TTMGraph(c, store.path, execution=execution, partitions=partitions, kernel=kernel, device=device)
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
            log.info("resuming from %s after iteration %d (fit %.6f)", checkpoint, start, fit)
        else:
            if init == "random":
                S = c.submit(T.random_init, shape, ranks, seed, pure=False)
            elif init == "nvecs":
                S = c.submit(T.nvecs_init, store.path, shape, ranks, pure=False)
            else:
                given = [None if a is None else np.asarray(a) for a in init]
                S = c.submit(T.given_init, shape, ranks, c.scatter(given, hash=False), pure=False)
            start, fit, history, svd_entropy = 0, 0.0, [], None
        if svd_entropy is None:
            # one entropy per run, kept in checkpoints: a resumed run draws the test vectors the
            # uninterrupted one would have
            svd_entropy = int(np.random.SeedSequence(check_seed(seed)).entropy) % 2**63
        params["svd_entropy"] = int(svd_entropy)
        params["resumed_after"] = start
        chunk_bytes = sum(paths.disk_bytes(f"{str(store.path).rstrip('/')}/{name}") for name in ("alto", "values"))
        streamed = graph.execution == "streaming"
        bar = tqdm(
            total=max_iters,
            initial=start,
            desc="tucker-hooi",
            unit="it",
            leave=False,
            disable=None if progress else True,
        )

        # A whole iteration is submitted at once: per mode the TTM partition tasks, the reduction
        # and one update task (one task in all when there is one partition), so the modes follow
        # each other on the cluster; the driver reads the small summary once per iteration.
        try:
            for iteration in range(start, max_iters):
                t_iter = time.time()
                fit_old = fit
                for n in range(N):
                    S = graph.mode_update(S, n, T.update_factor, n == N - 1, svd, (svd_entropy, iteration, n))
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
                done = record["fit_change"] < tol  # pyttb's rule, its first iteration included
                if checkpoint and (done or (iteration + 1) % checkpoint_every == 0 or iteration + 1 == max_iters):
                    t_ck = time.time()
                    raise_returned(
                        c.submit(
                            disk_full_returned,
                            write_tucker_checkpoint,
                            checkpoint,
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
                if callback is not None:
                    callback(record)
                if done:
                    break
        finally:
            bar.close()
        core = c.submit(T.core_of, S, pure=False).result()
        factors = [c.submit(T.factor_of, S, n, pure=False).result() for n in range(N)]
        del S
        graph.release()

    result = TuckerResult(core, [np.array(f) for f in factors], fit, len(history), history, params, input_fp)
    if out is not None:
        result.save(out, overwrite=overwrite)
        log.info("result written to %s", out)
    return result
