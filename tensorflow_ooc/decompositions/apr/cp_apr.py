"""CP-APR: nonnegative CP of count data by Poisson maximum likelihood (alternating Poisson
regression), on a BLCO store, as iterated Dask passes over the nonzeros.

The loop below is pyttb's ``cp_apr`` (Chi & Kolda 2012 for ``"mu"``, Hansen, Plantenga & Kolda
2015 for ``"pdnr"``); its steps are small functions in
:mod:`~tensorflow_ooc.decompositions.apr.apr_steps` and its passes partition tasks in
:mod:`~tensorflow_ooc.execution.apr_tasks`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import ExitStack
from typing import Any, Sequence

import numpy as np

from ...errors import DecompositionError, StoreError
from ...execution.apr_tasks import add_sums, candidates_partition, loglik_partition, newton_partition, phi_partition
from ...execution.inline import is_inline
from ...kernels.apr.cpu import hessian_width
from ...store import Store
from ..common.checkpoint_files import disk_full_returned, raise_returned, read_npz, write_npz_atomic
from ..common.fingerprint import fingerprint
from ..common.model_checks import check_count, check_seed, check_tolerance
from ..common.mttkrp_input import open_graph, open_input, plan_graph
from ..common.options import declared
from ..common.run_loop import ends_or_checkpoints, inline_when_small, run_iterations
from . import apr_steps as S
from .apr_owner import AprConfig, owner_outer, owner_state, start_apr_owner, use_apr_owner
from .count_checks import check_counts
from .inline_mu import InlineMU, inline_mu_bytes, inline_mu_fits
from .options import CP_APR
from .result import PoissonResult

__all__ = ["cp_apr", "ALGORITHMS"]

log = logging.getLogger(__name__)

ALGORITHMS = ("mu", "pdnr")
CHECKPOINT_FORMAT = "cp-apr"
# PDN-R keeps, per row of the block being solved, its Newton terms (R + R(R+1)/2 + 2 values) on
# every partition task and thread; the rows of a long mode are taken in blocks within this budget
NEWTON_BLOCK_BYTES = 256 << 20


@declared(CP_APR)
def cp_apr(store: Store | str | os.PathLike, rank: int, **options: Any) -> PoissonResult:
    """Rank-``rank`` Poisson CP (CP-APR) of a count tensor: nonnegative factors that maximize the
    Poisson log-likelihood ``sum_i x_i log m_i - m_i`` of the model ``m = [[lambda; A_1, ..., A_N]]``.

    Each outer iteration updates the modes in turn; mode ``n`` solves its subproblem (the other
    factors fixed) by up to ``max_inner_iters`` inner iterations:

    - ``algorithm="mu"`` (Chi & Kolda 2012): ``B <- B * Phi`` with ``B = A_n diag(lambda)`` and
      ``Phi = (X_(n) ./ max(B Pi^T, eps_div_zero)) Pi``, ``Pi`` the Khatri-Rao product of the other
      factors, until ``max |min(B, 1 - Phi)| < tol`` (the KKT conditions). ``Phi`` is computed
      from the nonzeros on the fly: a model-value pass gives each nonzero ``x / max(m, eps)``, and
      the MTTKRP kernels sum it. Entries stuck at zero with ``Phi > 0`` are moved off zero by
      ``kappa`` when below ``kappa_tol``.
    - ``algorithm="pdnr"`` (Hansen, Plantenga & Kolda 2015): each row of ``B`` is a convex problem
      solved by a projected damped Newton method with an Armijo line search (damping ``mu0``,
      active-set tolerance ``eps_active``; ``inexact``: rows stop at ``max(tol, kkt / 100)``
      and take 2 inner iterations in the first outer iteration). The rows advance together: two
      passes over the nonzeros per inner iteration (see :mod:`.apr_steps`).

    The run stops when an outer iteration changes nothing (every mode's KKT violation below
    ``tol``), or after ``max_iters``. The log-likelihood, the KKT violation and the least-squares
    fit are recorded per outer iteration.

    Parameters
    ----------
    store : Store or path
        A BLCO store of nonnegative counts (a negative value is refused, naming it; non-integer
        values are warned about once).
    {options}

    Returns
    -------
    PoissonResult
        ``weights`` and ``factors`` (columns of unit 1-norm, components sorted by weight),
        ``loglik``, ``kkt``, ``fit`` (least squares) and the history.

    Examples
    --------
    >>> import tensorflow_ooc as tfo
    >>> from tensorflow_ooc import synthetic
    >>> p = synthetic.planted_poisson((30, 40, 50), 3, 5000, seed=0)
    >>> s = tfo.convert((p.coords, p.values), "memory://doc-apr")
    >>> r = tfo.cp_apr(s, 3, seed=1, max_iters=50)        # doctest: +SKIP
    >>> r.loglik < 0 and min(f.min() for f in r.factors) >= 0   # doctest: +SKIP
    True
    """
    run, o = CP_APR.settings(options)
    store = open_input(store)
    return run_iterations(APRIterations(store, rank, run, o), store, run)


def _check_settings(store: Any, rank: int, run: Any, o: Any) -> None:
    """Refuse bad settings and inputs before anything runs (``o.eps_div_zero`` set to its default)."""
    if store.dense:
        raise DecompositionError(f"{store.path}: cp_apr takes a sparse store of counts, not a dense array")
    if o.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {o.algorithm!r}")
    check_count("rank", rank)
    check_count("max_iters", o.max_iters)
    check_count("max_inner_iters", o.max_inner_iters)
    check_count("checkpoint_every", run.checkpoint_every)
    check_tolerance(o.tol)
    for name, value in (("kappa", o.kappa), ("kappa_tol", o.kappa_tol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if run.device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {run.device!r}")
    if run.device == "gpu" and o.algorithm != "mu":
        raise ValueError("algorithm='pdnr' runs on CPU workers; use device='cpu' (or algorithm='mu' on GPUs)")
    if not (o.mu0 > 0 and o.eps_active >= 0):
        raise ValueError(f"mu0 must be > 0 and eps_active >= 0, got {o.mu0!r} and {o.eps_active!r}")
    total = check_counts(store)
    if o.eps_div_zero is None:
        o.eps_div_zero = default_eps_div_zero(store.shape, total)
    elif not (isinstance(o.eps_div_zero, (int, float)) and math.isfinite(o.eps_div_zero) and o.eps_div_zero >= 0):
        raise ValueError(f"eps_div_zero must be a finite number >= 0, got {o.eps_div_zero!r}")


class APRIterations:
    """CP-APR's steps for the run loop: an outer iteration per iteration, its inner iterations on
    per-mode task graphs (:class:`GraphOuter`) or owner-computes on the workers (:class:`OwnerOuter`)."""

    name, title, claim_error = "cp_apr", "CP-APR", StoreError

    def __init__(self, store: Any, rank: int, run: Any, o: Any) -> None:
        _check_settings(store, rank, run, o)
        self.store, self.rank, self.run, self.o = store, int(rank), run, o
        self.base_params = {
            "model": "poisson",
            "algorithm": o.algorithm,
            "rank": int(rank),
            "max_iters": int(o.max_iters),
            "max_inner_iters": int(o.max_inner_iters),
            "tol": float(o.tol),
            "seed": o.seed,
            "init": o.init if isinstance(o.init, str) else "given",
            "kappa": float(o.kappa),
            "kappa_tol": float(o.kappa_tol),
            "eps_div_zero": float(o.eps_div_zero),
        }
        if o.algorithm == "pdnr":
            self.base_params.update(eps_active=float(o.eps_active), mu0=float(o.mu0), inexact=bool(o.inexact))
        run.checkpoint = None if run.checkpoint is None else str(run.checkpoint)
        self.input_fp = fingerprint(store)
        self.normX2 = store.norm_sq
        self.max_iters, self.device = o.max_iters, run.device
        inline_when_small(run, store.nnz, "cpu" if run.device == "cpu" else "gpu")
        if run.device == "gpu":
            # the GPU streams Phi from the store; the CPU passes (log-likelihood) stream the same chunks
            run.execution = "streaming"

    def start(self, c: Any, cleanup: ExitStack, resume: bool) -> int:
        run, o, store, rank = self.run, self.o, self.store, self.rank
        params = self.params = dict(self.base_params)
        # tensors held in memory under the inline scheduler: MU's inner loops in one or two kernel
        # calls per mode
        keeps = inline_mu_bytes(store.nnz, tuple(store.shape), rank, o.max_inner_iters, os.cpu_count() or 1)
        small = is_inline(c) and o.algorithm == "mu" and run.device == "cpu" and inline_mu_fits(keeps, rank)
        graph = open_graph(
            c,
            store,
            params,
            run,
            rank=rank,
            dtype="float64",
            samples=0,
            load=run.distribution == "graph" and not small,
        )
        cleanup.callback(graph.release)
        owner = use_apr_owner(c, graph, run.distribution, graph.device)
        small = small and graph.execution == "in-memory"
        if not small:
            plan_graph(graph, params, owner, in_place=False)
        checkpoint = run.checkpoint if resume else None
        start, self.history, self.row_tol, state0 = _initial(
            checkpoint, self.input_fp, params, o.init, store.shape, rank, o.seed, o.tol
        )
        params["resumed_after"] = start
        if small:
            params["inner_loop"] = "inline"
            self.outer = InlineOuter(store, state0, rank, o, graph.numba_threads)
            cleanup.callback(self.outer.mu.close)
            self.loglik = self.history[-1]["loglik"] if self.history else float("nan")
            return start
        F = c.scatter(state0, hash=False)
        del state0
        if owner:
            self.outer = OwnerOuter(c, graph, F, store.shape, rank, self.row_tol, o, run, cleanup)
            params["distribution"] = {"kind": "owner-computes", "workers": len(self.outer.engine.addresses)}
        else:
            self.outer = GraphOuter(c, graph, F, store.shape, rank, o, run)
        self.loglik = self.history[-1]["loglik"] if self.history else float("nan")
        return start

    def iterate(self, iteration: int) -> dict:
        o = self.o
        t_iter = time.time()
        sm, exchange = self.outer.run(iteration, self.row_tol)
        old, self.loglik = self.loglik, sm.loglik
        safeguards = S.safeguard_record(sm.safeguards)
        if not math.isfinite(self.loglik):
            raise DecompositionError(_non_finite(iteration, self.loglik, o.algorithm, safeguards))
        normX2 = self.normX2
        fit = 1 - math.sqrt(max(normX2 + sm.norm_model_sq - 2 * sm.inner_product, 0.0)) / math.sqrt(normX2)
        record = {
            "iteration": iteration + 1,
            "loglik": self.loglik,
            "loglik_change": self.loglik - old if math.isfinite(old) else float("nan"),
            "kkt_violation": sm.kkt,
            "fit": fit,
            "inner_iterations": sm.inner_iters,
            "violations": sm.violations,
            "zeros": sm.zeros,
            "seconds": time.time() - t_iter,
            "pass_seconds": sm.seconds,
            "nnz": self.store.nnz,
        }
        if exchange is not None:
            record.update(exchange)
        if safeguards:
            record["safeguards"] = safeguards
            log.warning(
                "CP-APR outer iteration %d: nonzeros with model value 0 (where pyttb's log-likelihood is -inf): "
                "%s rows stepped to a finite objective, %s nonzeros left out of their row's problem, %s rows "
                "kept, %s rows lifted off zero (per mode)",
                iteration + 1,
                *safeguards.values(),
            )
        self.history.append(record)
        log.info(
            "iteration %d: log-likelihood %.8e, KKT violation %.2e, %d inner, %.3f s",
            iteration + 1,
            self.loglik,
            sm.kkt,
            sm.inner_iters,
            record["seconds"],
            extra={"iteration": iteration + 1},
        )
        if o.algorithm == "pdnr" and o.inexact:
            self.row_tol = max(o.tol, sm.kkt / 100.0)
        self.converges = sm.converged
        return record

    def converged(self, iteration: int, record: dict) -> bool:
        o = self.o
        return self.converges and (o.algorithm == "mu" or not o.inexact or self.row_tol <= o.tol)

    def save_checkpoint(self, path: str, iteration: int) -> float:
        t_ck = time.time()
        self.outer.checkpoint(path, iteration, self.history, self.params, self.input_fp, self.row_tol)
        return time.time() - t_ck

    def finish(self) -> PoissonResult:
        final, weights = self.outer.final()
        kkt = self.history[-1]["kkt_violation"] if self.history else float("nan")
        fit = self.history[-1]["fit"] if self.history else float("nan")
        args = (self.loglik, kkt, fit, len(self.history), self.history, self.params, self.input_fp)
        return PoissonResult.arranged(weights, final, *args)


class GraphOuter:
    """Outer iterations as per-mode task graphs: each inner iteration a pass over the partitions and
    one update task beside the model state (what one worker, the inline scheduler and GPUs use)."""

    def __init__(self, c: Any, graph: Any, F: Any, shape: Sequence[int], rank: int, o: Any, run: Any) -> None:
        self.c, self.graph, self.F, self.shape, self.rank, self.o, self.control = c, graph, F, shape, rank, o, run

    def run(self, iteration: int, row_tol: float) -> tuple[Any, None]:
        c, graph, o = self.c, self.graph, self.o
        threads, bn, mpb = graph.numba_threads, graph.batch_nnz, graph.max_private_bytes
        F = c.submit(S.begin_outer, self.F, pure=False, **graph.placement)
        for n in range(len(self.shape)):
            if o.algorithm == "mu":
                F = c.submit(S.mu_begin_mode, F, n, iteration, o.kappa, o.kappa_tol, pure=False, **graph.placement)
                for _ in range(o.max_inner_iters):
                    phi = (n, threads, bn, o.eps_div_zero, mpb, graph.device, self.control.device_options)
                    F = graph.pass_update(phi_partition, phi, S.mu_inner, F, n, float(o.tol))
            else:
                inner_max = 2 if (o.inexact and iteration == 0) else o.max_inner_iters
                for b, (lo, hi) in enumerate(_row_blocks(self.shape[n], self.rank, threads)):
                    F = c.submit(S.pdnr_begin_block, F, n, lo, hi, o.mu0, b == 0, pure=False, **graph.placement)
                    for i in range(inner_max):
                        newton = (n, threads, bn, o.eps_div_zero)
                        args = (n, i, inner_max, row_tol, o.eps_active)
                        F = graph.pass_update(newton_partition, newton, S.pdnr_direction, F, *args)
                        F = graph.pass_update(candidates_partition, (n, threads, bn), S.pdnr_step, F, n, i, inner_max)
                    F = c.submit(S.pdnr_end_block, F, pure=False, **graph.placement)
            F = c.submit(S.end_mode, F, n, pure=False, **graph.placement)
        self.F = F
        parts = graph.partition_pass(loglik_partition, F, threads, bn, reduce=add_sums)
        return c.submit(S.summary, F, parts, pure=False, **graph.placement).result(), None

    def checkpoint(self, *args: Any) -> None:
        raise_returned(self.c.submit(disk_full_returned, _write_checkpoint, self.F, *args, pure=False).result())

    def final(self) -> tuple[list[np.ndarray], np.ndarray]:
        out = self.c.submit(_factors_and_weights, self.F, pure=False).result()
        del self.F
        return out


class InlineOuter:
    """Outer iterations of the multiplicative updates in this process, the model state a local
    object, each mode's inner iterations one kernel call (:mod:`.inline_mu`; small tensors)."""

    def __init__(self, store: Any, state: S.APRState, rank: int, o: Any, threads: int) -> None:
        self.state, self.o = state, o
        self.mu = InlineMU(store, rank, o.max_inner_iters, threads)

    def run(self, iteration: int, row_tol: float) -> tuple[Any, None]:
        return self.mu.outer(self.state, iteration, self.o), None

    def checkpoint(self, *args: Any) -> None:
        raise_returned(disk_full_returned(_write_checkpoint, self.state, *args))

    def final(self) -> tuple[list[np.ndarray], np.ndarray]:
        return _factors_and_weights(self.state)


class OwnerOuter:
    """Outer iterations owner-computes: each worker keeps its partitions and the factor rows it owns,
    one task per worker and outer iteration, rows sent only where shared (:mod:`.apr_owner`)."""

    def __init__(
        self,
        c: Any,
        graph: Any,
        F: Any,
        shape: Sequence[int],
        rank: int,
        row_tol: float,
        o: Any,
        run: Any,
        cleanup: ExitStack,
    ) -> None:
        self.engine = start_apr_owner(c, graph, F, shape, row_tol)
        cleanup.callback(self.engine.release)  # a run stopped by its callback leaves nothing on the workers
        self.shape, self.rank, self.control, self.o = shape, rank, run, o
        blocks = [_row_blocks(I, rank, graph.numba_threads) for I in shape]
        args = (o.max_inner_iters, float(o.tol), o.kappa, o.kappa_tol, o.eps_div_zero, o.eps_active, o.mu0, o.inexact)
        self.cfg = AprConfig(o.algorithm, *args, blocks)

    def run(self, iteration: int, row_tol: float) -> tuple[Any, dict]:
        # the next outer iteration goes ahead unless this one ends the run or writes a checkpoint
        # (whose rows must be this iteration's)
        ahead = not ends_or_checkpoints(self.control, iteration, self.o.max_iters)
        return owner_outer(self.engine, iteration, self.cfg, ahead)

    def checkpoint(self, *args: Any) -> None:
        # written from the driver, the rows gathered from their owners
        raise_returned(disk_full_returned(_write_checkpoint, owner_state(self.engine, self.shape, self.rank), *args))

    def final(self) -> tuple[list[np.ndarray], np.ndarray]:
        state = owner_state(self.engine, self.shape, self.rank)
        self.engine.release()
        return S.factors_of(state), state.weights


def _non_finite(iteration: int, loglik: float, algorithm: str, safeguards: dict) -> str:
    """The error of an outer iteration whose log-likelihood is not finite, naming what made it so."""
    head = f"CP-APR outer iteration {iteration + 1}: the log-likelihood is {loglik}"
    if math.isnan(loglik):
        return f"{head}: the factors hold NaN or infinite entries (values beyond float64's range)"
    if algorithm == "pdnr" and safeguards:
        left = sum(safeguards["unreachable_nonzeros"])
        return (
            f"{head}: nonzeros still have model value 0 after every mode was updated (in this outer "
            f"iteration {left} nonzero-mode pairs had no component positive on all the other modes, so no "
            "row update could reach them); an initial model that is positive at every nonzero (init='random') avoids it"
        )
    return (
        f"{head}: a nonzero's model value reached 0 (every component is 0 at one of its factor rows); "
        "an initial model that is positive at every nonzero (init='random') avoids it"
    )


PYTTB_EPS_DIV_ZERO = 1e-10


def default_eps_div_zero(shape: Sequence[int], total: float) -> float:
    """pyttb's 1e-10, or 1e-3 of the mean model value over all cells (the counts' ``total`` over
    the cells of ``shape``) where that is smaller (see :func:`cp_apr`'s ``eps_div_zero``)."""
    cells = math.prod(float(i) for i in shape)
    mean = total / cells if cells else 0.0
    return min(PYTTB_EPS_DIV_ZERO, 1e-3 * mean) if mean > 0 else PYTTB_EPS_DIV_ZERO


def _row_blocks(rows: int, rank: int, threads: int) -> list[tuple[int, int]]:
    """PDN-R: the mode's rows in blocks whose Newton terms fit :data:`NEWTON_BLOCK_BYTES`."""
    per_row = hessian_width(rank) * 8 * (max(1, threads) + 3)
    size = max(1, NEWTON_BLOCK_BYTES // per_row)
    return [(lo, min(rows, lo + size)) for lo in range(0, rows, size)]


def _initial(checkpoint, input_fp, params, init, shape, rank, seed, tol):
    """The start: from ``checkpoint`` when it exists (same store, rank, algorithm), else fresh
    factors (uniform [0, 1) from ``seed``, or ``init``'s, checked nonnegative and finite)."""
    seed = check_seed(seed)
    got = read_npz(checkpoint, CHECKPOINT_FORMAT, "CP-APR") if checkpoint else None
    if got is not None:
        arrays, meta = got
        if (
            meta["input"]["store_id"] != input_fp["store_id"]
            or meta["params"]["rank"] != params["rank"]
            or meta["params"]["algorithm"] != params["algorithm"]
        ):
            raise ValueError(
                f"{checkpoint}: checkpoint is for another store, rank or algorithm; remove it or drop resume"
            )
        s = S.APRState(shape, rank, np.float64, np.ascontiguousarray(arrays["factors"]))
        s.weights = arrays["weights"]
        s.phi_positive = [arrays.get(f"phi_positive{n}") for n in range(len(shape))]
        log.info("resuming from %s after outer iteration %d", checkpoint, meta["iteration"] + 1)
        return meta["iteration"] + 1, list(meta["history"]), float(meta["row_tol"]), s
    if isinstance(init, str):
        if init != "random":
            raise ValueError(f"init must be 'random' or a list of factor matrices, got {init!r}")
        rng = np.random.default_rng(seed)
        factors = [rng.random((I, rank)) for I in shape]
    else:
        if len(init) != len(shape) or any(np.shape(a) != (shape[n], rank) for n, a in enumerate(init)):
            raise ValueError(f"init must hold {len(shape)} matrices of shapes {[(s, rank) for s in shape]}")
        factors = [np.array(a, dtype=np.float64) for a in init]
        for n, a in enumerate(factors):
            if not np.isfinite(a).all():
                raise DecompositionError(f"init: factor matrix {n} holds NaN or infinite entries")
            if (a < 0).any():
                raise DecompositionError(
                    f"init: factor matrix {n} has a negative entry; CP-APR needs nonnegative factors"
                )
    if params["algorithm"] == "pdnr":
        for a in factors:  # pyttb: a row of zeros gets a tiny first entry, before the columns are normalized
            a[a.sum(axis=1) == 0, 0] = 1e-8
    return 0, [], float(tol), S.start_state(factors, None, "float64")


def _factors_and_weights(state: S.APRState) -> tuple[list[np.ndarray], np.ndarray]:
    """The factor matrices and weights (copies; a run resumed after its last iteration has no
    summary of its own)."""
    return S.factors_of(state), np.array(state.weights)


def _write_checkpoint(state, path, iteration, history, params, input_fp, row_tol) -> str:
    """Runs on a worker (the state lives there), or owner-computes on the driver."""
    arrays = {"factors": state.data, "weights": state.weights}
    arrays.update({f"phi_positive{n}": p for n, p in enumerate(state.phi_positive) if p is not None})
    meta = {
        "format": CHECKPOINT_FORMAT,
        "version": 1,
        "iteration": iteration,
        "history": history,
        "params": params,
        "input": input_fp,
        "row_tol": row_tol,
    }
    return write_npz_atomic(path, arrays, meta)
