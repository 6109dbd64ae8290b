"""What differs between the methods of a decompose step, one small table entry per method: the
method's arguments, device, warm start, checkpoint, figures and summary line.
:func:`~.decompose_step.run_decompose` does everything else, the same way for every method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..decompositions import CPResult, TTResult, TuckerResult, read_checkpoint
from ..decompositions.tt.tt_checkpoint import read_tt_checkpoint
from ..decompositions.tucker.tucker_checkpoint import read_tucker_checkpoint
from ..errors import DecompositionError, StoreError
from .errors import InputError
from .step_context import StepContext, open_input_store
from .warm_starts import tt_warm_start, tucker_warm_start, warm_start


@dataclass(frozen=True)
class Checkpoints:
    """How a method's checkpoint is read, matched to this step, and described when resumed."""

    read: Callable[[StepContext], Callable[[str], Any]]
    matches: Callable[[Any, Any, Any, tuple], bool]  # (state, m, store, arguments)
    where: Callable[[Any], tuple[str, int]]  # state -> ("iteration 3 (fit ...)", iterations done)


@dataclass(frozen=True)
class DecomposeMethod:
    """One method of the decompose step."""

    function: str  # its API function in tensorflow_ooc.decompositions
    counter: str  # the history's counter ("iteration", "sweep", "epoch")
    total: Callable[[Any], int]  # m -> iterations at most
    arguments: Callable[[Any, Any], tuple]  # (m, store) -> the arguments after the store (ranks checked)
    device: Callable[[StepContext, Any], str]
    warm: Callable[[StepContext, Any, Any, tuple, Any, str], Any]  # the initial model, or None: not used
    metrics: Callable[[Any, Any, Any, tuple], dict]  # (m, result, store, arguments) -> its own figures
    figures: Callable[[Any, Any, float], dict]  # (result, store, wall seconds) -> what every run of it reports
    summary: Callable[[Any, Any, tuple], str]  # (m, result, arguments) -> the step's last log line
    checkpoints: Checkpoints | None = None
    refusals: tuple[type[Exception], ...] = ()  # the method's refusals of the step's settings: input errors
    extra: Callable[[StepContext, Any], dict] = lambda ctx, m: {}  # more keywords of this run


def _same_store(checkpoint_input: dict, store: Any) -> bool:
    return checkpoint_input.get("store_id") == store.meta["store_id"]


def _usable(read: Callable[[str], Any]) -> Callable[[StepContext], Callable[[str], Any]]:
    """``read``, with a checkpoint it cannot read logged as unusable and taken as None (start over)."""

    def for_step(ctx: StepContext) -> Callable[[str], Any]:
        def reader(path: str) -> Any:
            try:
                return read(path)
            except StoreError as exc:
                ctx.log(f"the checkpoint is not usable ({exc}): starting over", level="warning")
                return None

        return reader

    return for_step


def _notes(*parts: str) -> str:
    return "; ".join(filter(None, parts))


def _steady(history: list[dict], resumed_after: int = 0) -> tuple[list[dict], float]:
    """A run's history records of this run, and the mean seconds of its steady ones (the first
    also compiles kernels)."""
    new = history[resumed_after:]
    steady = new[1:] or new
    return new, sum(h["seconds"] for h in steady) / max(1, len(steady))


def _iteration_figures(result: Any, store: Any, wall: float) -> dict:
    """What a run of iterations toward a fit reports: its iterations, their seconds, the input and
    where it ran."""
    new, per_it = _steady(result.history, result.params.get("resumed_after", 0))
    return {
        "fit": result.fit,
        "iterations": len(result.history),
        "iterations_this_run": len(new),
        "seconds_per_iteration": per_it,
        "first_iteration_seconds": new[0]["seconds"] if new else None,
        "nnz": store.nnz,
        "execution": result.params.get("execution"),
        "device": result.params.get("device"),
        "scheduler": result.params.get("scheduler"),
        "nnz_modes_per_second": store.nnz * store.nmodes / max(per_it, 1e-12),
        "wall_seconds": wall,
        "input_store": store.path,
    }


def _epoch_figures(result: Any, store: Any, wall: float) -> dict:
    """What a completion run reports: epochs measured on the test set, no fit."""
    _, per_epoch = _steady(result.history)
    return {
        "test_rmse": result.test_rmse,
        "test_mae": result.test_mae,
        "best_epoch": result.best_epoch,
        "epochs": result.epochs,
        "iterations": result.epochs,
        "first_epoch_train_rmse": result.history[0]["train_rmse"] if result.history else None,
        "seconds_per_epoch": per_epoch,
        "first_iteration_seconds": result.history[0]["seconds"] if result.history else None,
        "nnz": store.nnz,
        "n_train": result.params.get("n_train"),
        "n_test": result.params.get("n_test"),
        "method": "completion",
        "ranks": list(result.ranks),
        "core_rank": result.core_rank,
        "device": result.params.get("device"),
        "scheduler": result.params.get("scheduler"),
        "wall_seconds": wall,
        "input_store": store.path,
    }


# --- CP-ALS -----------------------------------------------------------------------------------------


def _cp_arguments(m: Any, store: Any) -> tuple:
    if store.dense and m.solver != "exact":
        raise InputError(
            f"{store.path} is a dense array: CP-ALS of dense arrays takes method: cp (exact), not {m.method}"
        )
    return (m.rank,)


def _cp_warm(ctx: StepContext, m: Any, store: Any, args: tuple, prev: Any, warm: str) -> Any:
    if not isinstance(prev, CPResult):
        raise InputError(f"init: {warm} is not a CP result (a warm start of method cp needs one)")
    init, notes = warm_start(prev, store.shape, m.rank, m.seed)
    if m.nonnegative and any(bool((a < 0).any()) for a in init):
        # a result of unconstrained CP-ALS: nonnegative CP-ALS starts from |factors|, as TensorLy
        # makes its initial factors feasible
        init = [np.abs(a) for a in init]
        notes = _notes(notes, "negative entries of the warm start made positive (nonnegative)")
    ctx.log(f"warm start from {warm} (fit {prev.fit:.6f} after {prev.iterations} iterations)" + _tail(notes))
    return init


def _cp_metrics(m: Any, result: Any, store: Any, args: tuple) -> dict:
    out = {"rank": m.rank, "method": m.solver}
    if store.dense:
        out["dense"] = True
    if m.nonnegative:
        out.update(nonnegative=True, reg=m.reg)
    return out


CP = DecomposeMethod(
    figures=_iteration_figures,
    function="cp_als",
    counter="iteration",
    total=lambda m: m.max_iters,
    arguments=_cp_arguments,
    # randomized methods run on CPU workers (any worker of a GPU cluster runs them)
    device=lambda ctx, m: m.device or ("cpu" if m.solver != "exact" else ctx.default_device),
    warm=_cp_warm,
    metrics=_cp_metrics,
    summary=lambda m, r, args: f"rank {m.rank}: fit {r.fit:.6f} after {r.iterations} iterations",
    checkpoints=Checkpoints(
        lambda ctx: read_checkpoint,
        # a dense array's identity includes ||X||^2, known only after its scan: cp_als checks it
        lambda st, m, store, args: (store.dense or _same_store(st.input, store)) and st.params.get("rank") == m.rank,
        lambda st: (f"iteration {st.iteration + 1} (fit {st.fit:.6f})", st.iteration + 1),
    ),
)


# --- CP-APR -----------------------------------------------------------------------------------------


def _apr_warm(ctx: StepContext, m: Any, store: Any, args: tuple, prev: Any, warm: str) -> Any:
    from ..decompositions import PoissonResult

    if not isinstance(prev, CPResult):
        raise InputError(
            f"init: {warm} is not a CP result (a warm start of method cp-apr needs one: CP-APR's or CP-ALS's)"
        )
    init, notes = warm_start(prev, store.shape, m.rank, m.seed)
    negative = sum(int(np.count_nonzero(a < 0)) for a in init)
    if negative:
        # a CP-ALS result: its sign flips come in pairs of modes, which |.| undoes exactly
        init = [np.abs(a) for a in init]
        size = sum(a.size for a in init)
        made = f"{negative:,} negative entries of {size:,} made positive (CP-APR needs nonnegative factors)"
        notes = _notes(notes, made)
    figure = (
        f"log-likelihood {prev.loglik:.8e}" if isinstance(prev, PoissonResult) else f"least-squares fit {prev.fit:.6f}"
    )
    ctx.log(f"warm start from {warm} ({figure} after {prev.iterations} iterations)" + _tail(notes))
    return init


def _apr_checkpoint(path: str) -> Any:
    from ..decompositions.apr.cp_apr import CHECKPOINT_FORMAT
    from ..decompositions.common.checkpoint_files import read_npz

    return (read_npz(path, CHECKPOINT_FORMAT, "CP-APR") or (None, None))[1]


def _apr_metrics(m: Any, result: Any, store: Any, args: tuple) -> dict:
    last = result.history[-1] if result.history else {}
    new = result.history[result.params.get("resumed_after", 0) :]
    return {
        "loglik": result.loglik,
        "loglik_change": last.get("loglik_change"),
        "kkt_violation": result.kkt,
        "inner_iterations_this_run": sum(int(h.get("inner_iterations", 0)) for h in new),
        "rank": m.rank,
        "method": "cp-apr",
        "algorithm": m.algorithm,
        "tol": m.tol,
        "device": "cpu",
    }


APR = DecomposeMethod(
    figures=_iteration_figures,
    function="cp_apr",
    counter="iteration",
    total=lambda m: m.max_iters,
    arguments=lambda m, store: (m.rank,),
    device=lambda ctx, m: m.device or "cpu",
    warm=_apr_warm,
    metrics=_apr_metrics,
    summary=lambda m, r, args: (
        f"CP-APR ({m.algorithm}) rank {m.rank}: log-likelihood {r.loglik:.8e}, KKT violation {r.kkt:.3e} after "
        f"{r.iterations} outer iterations (least-squares fit {r.fit:.6f})"
    ),
    checkpoints=Checkpoints(
        _usable(_apr_checkpoint),
        lambda meta, m, store, args: (
            _same_store(meta.get("input", {}), store)
            and (meta.get("params", {}).get("rank"), meta.get("params", {}).get("algorithm")) == (m.rank, m.algorithm)
        ),
        lambda meta: (
            f"outer iteration {int(meta['iteration']) + 1} (log-likelihood "
            f"{(meta.get('history') or [{}])[-1].get('loglik', float('nan')):.8e})",
            int(meta["iteration"]) + 1,
        ),
    ),
)


# --- TT-ALS -----------------------------------------------------------------------------------------


def _tt_ranks(m: Any, store: Any) -> tuple:
    from ..decompositions.tt.tt_steps import check_ranks

    return (check_ranks(m.ranks if isinstance(m.ranks, int) else tuple(m.ranks), store.shape)[1:-1],)


def _tt_warm(ctx: StepContext, m: Any, store: Any, args: tuple, prev: Any, warm: str) -> Any:
    (ranks,) = args
    if not isinstance(prev, TTResult):
        raise InputError(f"init: {warm} is not a tensor-train result (a warm start of method tt needs one)")
    if len(prev.cores) != store.nmodes or tuple(prev.ranks[1:-1]) != ranks:
        # other ranks are another model: the sweeps start at random, and the record says so
        ctx.log(
            f"the previous train at {warm} has ranks {list(prev.ranks[1:-1])}, this step {list(ranks)}: "
            "random initial cores"
        )
        return None
    init, notes = tt_warm_start(prev, tuple(store.shape), m.seed)
    ctx.log(f"warm start from {warm} (fit {prev.fit:.6f} after {prev.sweeps} sweeps)" + _tail(notes))
    return init


def _tt_metrics(m: Any, result: Any, store: Any, args: tuple) -> dict:
    out = {
        "method": "tt",
        "algorithm": m.algorithm,
        "ranks": list(args[0]),
        "fit_from": result.params.get("fit_from"),
        "device": "cpu",
    }
    if m.algorithm == "randomized":
        out.update(samples=m.samples, warmup=result.params.get("warmup"), fit_every=result.params.get("fit_every"))
    return out


TT = DecomposeMethod(
    figures=_iteration_figures,
    function="tt_als",
    counter="sweep",
    total=lambda m: m.max_iters,
    arguments=_tt_ranks,
    device=lambda ctx, m: "cpu",
    warm=_tt_warm,
    metrics=_tt_metrics,
    summary=lambda m, r, args: (
        f"TT-ALS ({m.algorithm}) ranks {'x'.join(map(str, args[0]))}: fit {r.fit:.6f} after {r.sweeps} sweeps"
    ),
    checkpoints=Checkpoints(
        _usable(read_tt_checkpoint),
        lambda st, m, store, args: (
            _same_store(st.input, store)
            and (st.params.get("ranks"), st.params.get("method")) == (list(args[0]), m.algorithm)
        ),
        lambda st: (f"sweep {st.sweep + 1} (fit {st.fit:.6f})", st.sweep + 1),
    ),
    refusals=(DecompositionError,),
)


# --- Tucker HOOI -----------------------------------------------------------------------------------


def _tucker_ranks(m: Any, store: Any) -> tuple:
    from ..decompositions.tucker.tucker_hooi import check_ranks

    return (check_ranks(m.ranks, store.shape),)


def _tucker_warm(ctx: StepContext, m: Any, store: Any, args: tuple, prev: Any, warm: str) -> Any:
    if not isinstance(prev, TuckerResult):
        raise InputError(f"init: {warm} is not a Tucker result (a warm start of method tucker needs one)")
    init, notes = tucker_warm_start(prev, tuple(store.shape), args[0], m.seed)
    ctx.log(f"warm start from {warm} (fit {prev.fit:.6f})" + _tail(notes))
    return init


TUCKER = DecomposeMethod(
    figures=_iteration_figures,
    function="tucker_hooi",
    counter="iteration",
    total=lambda m: m.max_iters,
    arguments=_tucker_ranks,
    device=lambda ctx, m: m.device or ("gpu" if ctx.default_device == "gpu" else "cpu"),
    warm=_tucker_warm,
    metrics=lambda m, r, store, args: {"method": "tucker", "ranks": list(args[0])},
    summary=lambda m, r, args: (
        f"Tucker ranks {'x'.join(map(str, args[0]))}: fit {r.fit:.6f} after {r.iterations} iterations"
    ),
    checkpoints=Checkpoints(
        lambda ctx: read_tucker_checkpoint,
        lambda st, m, store, args: _same_store(st.input, store) and tuple(st.params.get("ranks", ())) == args[0],
        lambda st: (f"iteration {st.iteration + 1} (fit {st.fit:.6f})", st.iteration + 1),
    ),
)


# --- FastTucker completion -------------------------------------------------------------------------


def _completion_warm(ctx: StepContext, m: Any, store: Any, args: tuple, prev: Any, warm: str) -> Any:
    from ..decompositions import FastTuckerResult

    ranks = args[0]
    if not isinstance(prev, FastTuckerResult):
        raise InputError(f"init: {warm} is not a FastTucker result (a warm start of method completion needs one)")
    want = (store.nmodes * (ranks,) if isinstance(ranks, int) else ranks, m.core_rank)
    if (tuple(prev.ranks), prev.core_rank) != want:
        # other ranks are another model: training restarts, and the record says so
        ctx.log(
            f"the previous model at {warm} has ranks {list(prev.ranks)} and core rank {prev.core_rank}, "
            f"this step {list(want[0])} and {m.core_rank}: random initial model"
        )
        return None
    grown = [f"mode {n}: {b - a} new rows" for n, (a, b) in enumerate(zip(prev.shape, store.shape)) if b > a]
    ctx.log(
        f"warm start from {warm} (test RMSE {prev.test_rmse:.6g} at epoch {prev.best_epoch})"
        + (f"; {', '.join(grown)}" if grown else "")
    )
    return prev


def _completion_test(ctx: StepContext, m: Any) -> dict:
    test = open_input_store(ctx.step.inputs["test"]) if "test" in ctx.step.inputs else None
    fraction = m.test_fraction if test is not None or m.test_fraction is not None else 0.1
    return {"test": test, "test_fraction": None if test is not None else fraction}


def _completion_refusals() -> tuple[type[Exception], ...]:
    from ..decompositions import CompletionError

    return (CompletionError,)


COMPLETION = DecomposeMethod(
    function="tucker_sgd",
    counter="epoch",
    total=lambda m: m.epochs,
    arguments=lambda m, store: (m.ranks if isinstance(m.ranks, int) else tuple(m.ranks), m.core_rank),
    device=lambda ctx, m: m.device or ("gpu" if ctx.default_device == "gpu" else "cpu"),
    warm=_completion_warm,
    metrics=lambda m, r, store, args: {},
    figures=_epoch_figures,
    summary=lambda m, r, args: (
        f"FastTucker ranks {'x'.join(map(str, r.ranks))}, core rank {r.core_rank}: test RMSE "
        f"{r.test_rmse:.6g} (MAE {r.test_mae:.6g}) at epoch {r.best_epoch} of {r.epochs}"
    ),
    refusals=_completion_refusals(),
    extra=_completion_test,
)


METHODS = {"cp": CP, "cp-apr": APR, "tt": TT, "tucker": TUCKER, "completion": COMPLETION}


def _tail(notes: str) -> str:
    return f"; {notes}" if notes else ""
