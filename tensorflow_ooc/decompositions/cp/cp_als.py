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
from typing import Any

import numpy as np

from ...errors import StoreError
from ...execution.nonzero_sample import sample_nonzeros
from ...store import Store
from ...store.dense import DenseArray
from ..common.cp_result import CPResult, arrange
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_model, check_tensor_norm
from ..common.mttkrp_input import open_graph, open_input, plan_graph
from ..common.options import declared
from ..common.run_control import FIT_EVERY_ITERATION_NNZ, converged, run_entropy
from ..common.run_loop import inline_when_small, run_iterations
from .cp_owner import OWNER_METHODS, use_owner_computes
from .cp_steps import (
    check_arguments,
    check_nonnegative_init,
    initial_state,
    iteration_record,
    model_fit,
    model_norm_sq,
    sampled_reads_plan,
)
from .fit_estimate import estimated_fit
from .iteration import GraphModes, OwnerModes
from .options import CP_ALS
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
    return run_iterations(CPIterations(store, rank, run, o), store, run)


class CPIterations:
    """CP-ALS's steps for the run loop: Algorithm 1's iterations, each by :class:`~.iteration.GraphModes`
    or :class:`~.iteration.OwnerModes`."""

    name, title, claim_error = "cp_als", "CP-ALS", StoreError

    def __init__(self, store: Any, rank: int, run: Any, o: Any) -> None:
        o.fit_every = check_arguments(store, rank, run, o)
        o.nonnegative, o.reg = bool(o.nonnegative), float(o.reg)
        if o.nonnegative:
            run.distribution = "graph"  # the HALS update runs in the per-mode update tasks
            if not isinstance(o.init, str):
                check_nonnegative_init(o.init)
        self.store, self.rank, self.run, self.o = store, rank, run, o
        self.randomized = o.method != "exact"
        self.base_params = {
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
        if self.randomized:
            self.base_params.update(samples=int(o.samples), fit_every=o.fit_every)
        run.checkpoint = None if run.checkpoint is None else str(run.checkpoint)
        inline_when_small(run, store.nnz, run.device)
        if self.randomized:
            run.device = "cpu"
        self.max_iters, self.device = o.max_iters, run.device

    def start(self, c: Any, cleanup: ExitStack, resume: bool) -> int:
        """The graph, ||X|| and the initial state: fresh, or from the last checkpoint."""
        run, o, store, rank = self.run, self.o, self.store, self.rank
        params = self.params = dict(self.base_params)
        graph = open_graph(
            c,
            store,
            params,
            run,
            rank=rank,
            dtype=o.dtype,
            samples=int(o.samples) if self.randomized else 0,
            sampler=o.method,
            load=run.distribution == "graph" or o.method not in OWNER_METHODS or store.dense,
            keep_target=o.nonnegative,  # HALS starts from the mode's old rows
            memo_pairs=not self.randomized,
        )
        cleanup.callback(graph.release)
        owner = use_owner_computes(c, graph, store.dense, o.method, run.distribution)
        plan_graph(graph, params, owner, in_place=True)
        self.input_fp = fingerprint(store)
        self.normX2 = store.norm_sq
        check_tensor_norm(store.path, self.normX2)
        F, start, self.fit, self.history, self.weights, sample_entropy = initial_state(
            c,
            run.checkpoint if resume else None,
            self.input_fp,
            o.init,
            store.shape,
            rank,
            o.seed,
            o.dtype,
            on_workers=owner,
            same={"nonnegative": o.nonnegative, "reg": o.reg},
        )
        params["resumed_after"] = self.start_at = start
        if self.randomized:
            params["sample_entropy"] = run_entropy(sample_entropy, o.seed)
        if owner:
            self.modes = OwnerModes(c, graph, F, self, cleanup)
            params["distribution"] = {"kind": "owner-computes", "workers": len(self.modes.engine.addresses)}
        else:
            self.modes = GraphModes(c, graph, F, self)
        if self.randomized:
            params["sampled_reads"] = sampled_reads_plan(graph, store)
        self.fit_sample = None  # randomized runs: the nonzeros their estimated fits evaluate the model at
        if self.randomized and o.fit_sample and isinstance(self.modes, GraphModes) and not store.dense:
            seed = params["sample_entropy"]
            self.fit_sample = c.submit(
                sample_nonzeros, store.path, int(o.fit_sample), seed, pure=False, **graph.placement
            )
        self.c, self.placement = c, graph.placement
        self.evaluated = [h["fit"] for h in self.history if h.get("fit_evaluated", True)]
        self.empty_seen: dict[int, int] = {}
        # bytes read from the store per iteration (for monitoring): a streaming pass reads every
        # compressed chunk once per mode; in memory, the partitions were read once, before the first
        # iteration of this run, and are counted there
        self.stored, self.streamed = store.stored_bytes(), graph.execution == "streaming"
        return start

    def iterate(self, iteration: int) -> dict:
        o, store = self.o, self.store
        t_iter = time.time()
        self.fit_old = fit_old = self.fit
        warmup = self.randomized and iteration < o.warmup  # an exact iteration: its fit costs nothing more
        self.evaluate = evaluate = (
            not self.randomized or warmup or (iteration + 1) % o.fit_every == 0 or iteration + 1 == o.max_iters
        )
        sm, exchange = self.modes.iterate(iteration, evaluate)
        self.weights = sm.weights
        norm_model2 = model_norm_sq(sm)
        if evaluate:
            self.fit = model_fit(sm, self.normX2, norm_model2)
            self.evaluated.append(self.fit)
        # a NaN fit or an all-zero model stops the run here, naming the cause, never exit 0
        check_model(iteration + 1, self.fit, self.weights, norm_model2, self.normX2)
        N, stored = store.nmodes, self.stored
        read = stored * N if self.streamed else (stored if iteration == self.start_at else 0)
        if self.randomized and self.streamed and not warmup:  # the sampled reads, and the fit's exact pass
            read = sum(r.get("bytes_read", 0) for r in sm.reads.values()) + (stored if evaluate else 0)
        # a sweep run ahead began on the worker before this call: its iteration is timed there,
        # from the end of the sweep before to the end of its own (GraphModes.worker_span)
        t_iter, ended = getattr(self.modes, "worker_span", None) or (t_iter, None)
        record = iteration_record(
            iteration,
            t_iter,
            sm,
            self.fit,
            fit_old,
            evaluate,
            store.nnz,
            read,
            self.randomized,
            o.samples,
            self.empty_seen,
            ended,
        )
        if warmup:
            record["warmup"] = True
        if self.randomized:
            # which fit the record holds: evaluated exactly (a full pass), or the last one carried
            record["fit_source"] = "exact" if evaluate else "carried"
            if self.fit_sample is not None and not evaluate:
                est = self.c.submit(
                    estimated_fit, self.modes.F, self.fit_sample, self.normX2, norm_model2, pure=False, **self.placement
                )
                record["fit_estimate"], record["fit_estimate_se"] = est.result()
        if exchange is not None:
            record.update(exchange)
        self.history.append(record)
        if "fit_estimate" in record:  # a sampled round between exact fits
            log.info(
                "iteration %d: fit %.6f (carried), estimated %.6f +- %.1e, %.3f s",
                iteration + 1,
                self.fit,
                record["fit_estimate"],
                record["fit_estimate_se"],
                record["seconds"],
                extra={"iteration": iteration + 1},
            )
            return record
        log.info(
            "iteration %d: fit %.6f (change %.2e), %.3f s",
            iteration + 1,
            self.fit,
            record["fit_change"],
            record["seconds"],
            extra={"iteration": iteration + 1},
        )  # a field of its own in JSON logs
        return record

    def converged(self, iteration: int, record: dict) -> bool:
        return converged(self.randomized, self.o.tol, iteration, self.fit, self.fit_old, self.evaluate, self.evaluated)

    def save_checkpoint(self, path: str, iteration: int) -> float:
        return self.modes.checkpoint(path, self.weights, iteration, self.fit, self.history, self.params, self.input_fp)

    def finish(self) -> CPResult:
        lam, factors = arrange(self.weights, [np.array(v) for v in self.modes.final()])
        return CPResult(lam, factors, self.fit, len(self.history), self.history, self.params, self.input_fp)
