"""The decompose step: CP-ALS, CP-APR, TT-ALS, Tucker HOOI and FastTucker completion runs of a
store, with warm starts from a previous result, per-iteration progress events, and resume
from the step's checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..decompositions import CPResult, TTResult, TuckerResult, cp_als, load_result, read_checkpoint
from ..decompositions.common.checkpoint_files import read_npz
from ..decompositions.common.option_values import api_keywords
from ..errors import DecompositionError, StoreError, TfoocError
from ..execution.inline import INLINE_MAX_NNZ
from ..store.dense import DenseArray, is_dense_array, open_dense
from . import locations as loc
from .errors import InputError
from .step_context import StepContext, open_input_store, resolve_store
from .step_models import (
    CompletionDecomposeStep,
    DecomposeStep,
    PoissonDecomposeStep,
    TTDecomposeStep,
    TuckerDecomposeStep,
)


def warm_start(
    previous: CPResult | Any, shape: tuple[int, ...], rank: int, seed: int | None
) -> tuple[list[np.ndarray], str]:
    """Initial factors from a previous result for a tensor of ``shape``.

    The weights are spread evenly over the modes (each factor scaled by ``w ** (1/N)``), which
    keeps the columns balanced as CP-ALS expects. A mode that grew keeps its old rows and gets its
    new rows drawn uniformly at the mean magnitude of each column's old rows (zero rows would leave
    the new slices out of the first updates of the other modes). Extra components (a larger rank)
    are drawn the same way; a smaller rank keeps the heaviest components.
    """
    w = np.asarray(previous.weights, dtype=np.float64)
    F = [np.asarray(f, dtype=np.float64) for f in previous.factors]
    N = len(shape)
    if len(F) != N:
        raise InputError(f"the previous result has {len(F)} modes, the tensor {N}")
    order = np.argsort(-np.abs(w), kind="stable")[:rank]
    w, F = w[order], [f[:, order] for f in F]
    scale = np.abs(w) ** (1.0 / N)
    rng = np.random.default_rng(seed)
    out, notes = [], []
    for n, (f, rows) in enumerate(zip(F, shape)):
        if f.shape[0] > rows:
            raise InputError(
                f"mode {n} shrank from {f.shape[0]} to {rows} rows since the previous result: "
                "a warm start cannot drop rows; use init: random"
            )
        a = f * scale
        mag = np.abs(a).mean(axis=0) if a.shape[0] else np.ones(a.shape[1])
        mag = np.where(mag > 0, mag, 1.0)
        if a.shape[1] < rank:
            extra = rng.uniform(0, 1, (a.shape[0], rank - a.shape[1])) * mag.mean()
            a = np.concatenate([a, extra], axis=1)
            mag = np.concatenate([mag, np.full(rank - mag.shape[0], mag.mean())])
        if rows > a.shape[0]:
            notes.append(f"mode {n}: {rows - a.shape[0]} new rows initialized")
            a = np.concatenate([a, rng.uniform(0, 1, (rows - a.shape[0], rank)) * mag], axis=0)
        out.append(np.ascontiguousarray(a))
    if len(order) < rank:
        notes.append(f"{rank - len(order)} new components")
    return out, "; ".join(notes)


def _open_decompose_input(ctx: StepContext, method: str) -> Any:
    """The decompose step's input: a BLCO store (a versioned folder: its latest version) or, for
    CP, a dense Zarr array."""
    location = resolve_store(ctx.step.inputs["input"])
    if is_dense_array(location):
        if method != "cp":
            raise InputError(
                f"{location} is a dense Zarr array; method {method} takes a sparse BLCO store (CP-ALS, "
                "method: cp, takes dense arrays)"
            )
        try:
            return open_dense(location)
        except TfoocError as exc:
            raise InputError(str(exc)) from None
    return open_input_store(location)


def _iteration_events(ctx: StepContext, total: int, key: str = "iteration") -> Callable[[dict], None]:
    """A decomposition's callback: each iteration (a completion run's epoch) becomes the step's
    ``progress`` and one ``iteration`` event (so ``tfooc logs`` and the page show it once), and a
    requested cancel stops the run between iterations."""

    def progress(record: dict) -> None:
        number = record[key]
        figures = (
            "fit",
            "fit_change",
            "loglik",
            "loglik_change",
            "kkt_violation",
            "seconds",
            "test_rmse",
            "test_mae",
            "train_rmse",
        )
        rec = {"iteration": number, **{k: record[k] for k in figures if k in record}}
        ctx.recorder.step(ctx.step.name, save=False, progress=rec)
        ctx.recorder.event(
            "iteration",
            "",
            step=ctx.step.name,
            echo=False,
            **{k: v for k, v in record.items() if k not in ("iteration", key)},
            iteration=number,
            max_iters=total,
        )
        ctx.check_cancel()

    return progress


def _warm_result(ctx: StepContext, m: Any) -> tuple[Any, str | None]:
    """The previous result a warm start reads (None where there is none yet), and its location."""
    warm = m.warm_start_location()
    if warm is None:
        return None, None
    warm = loc.normalize(warm, base=ctx.workflow.root)
    if loc.exists(warm):
        try:
            return load_result(warm), warm
        except StoreError as exc:
            raise InputError(f"init: {exc}") from None
    if m.init == "previous":
        ctx.log(f"no previous result at {warm} yet: random initial model")
        return None, warm
    raise InputError(f"init: {warm} does not exist")


def _steady(history: list[dict], resumed_after: int = 0) -> tuple[list[dict], float]:
    new = history[resumed_after:]
    steady = new[1:] or new
    return new, sum(h["seconds"] for h in steady) / max(1, len(steady))


def _keywords(m: Any, **this_run: Any) -> dict[str, Any]:
    """A method's API keywords: the step's settings of its declared options, then this run's own
    (client, checkpoint, warm start, ...)."""
    return {**api_keywords(m._declared_options, m.declared_values()), **this_run}


def run_decompose(ctx: StepContext) -> dict:
    """A decompose step: CP-ALS, Tucker HOOI, FastTucker completion, CP-APR or TT-ALS, by its ``method``."""
    method = ctx.step.model.method_name  # type: ignore[attr-defined]
    runners = {"cp": _run_cp, "tucker": _run_tucker, "completion": _run_completion, "cp-apr": _run_apr, "tt": _run_tt}
    return runners[method](ctx)


def _scheduler(ctx: StepContext, m: Any, nnz: int, device: str) -> tuple[Any, str | None]:
    """(client, scheduler) for a decomposition: in the driver where Dask's per-task cost would
    dominate (see execution/inline.py), else on the run's cluster."""
    if m.scheduler == "inline" or (m.scheduler == "auto" and nnz <= INLINE_MAX_NNZ and device != "gpu"):
        return None, "inline"
    return ctx.client_for(device), None


def _step_checkpoint(
    ctx: StepContext, read: Callable[[str], Any], matches: Callable[[Any], bool], where: Callable[[Any], tuple]
) -> tuple[str, bool]:
    """The decompose step's checkpoint path and whether the run resumes from it.

    The checkpoint belongs to this step's fingerprint, so a resume never mixes settings or inputs;
    one of another store or other settings (``matches`` False) or unusable (``read`` gives None)
    is removed. ``where(state)`` gives the log's "after ..." text and the iterations done."""
    checkpoint = ctx.state_dir("checkpoints", f"{ctx.step.name}-{ctx.fingerprint[:16]}.npz")
    if not loc.exists(checkpoint):
        return checkpoint, False
    state = read(checkpoint)
    if state is not None and matches(state):
        text, done = where(state)
        ctx.log(f"resuming from the checkpoint after {text}", resumed_after=done)
        ctx.recorder.step(ctx.step.name, resumed_from_iteration=done)
        return checkpoint, True
    loc.remove(checkpoint)
    return checkpoint, False


def _usable(ctx: StepContext, read: Callable[[str], Any]) -> Callable[[str], Any]:
    """``read``, with a checkpoint it cannot read logged as unusable and taken as None (start over)."""

    def reader(path: str) -> Any:
        try:
            return read(path)
        except StoreError as exc:
            ctx.log(f"the checkpoint is not usable ({exc}): starting over", level="warning")
            return None

    return reader


def _same_store(checkpoint_input: dict, store: Any) -> bool:
    return checkpoint_input.get("store_id") == store.meta["store_id"]


def _run_cp(ctx: StepContext) -> dict:
    m: DecomposeStep = ctx.step.model  # type: ignore[assignment]

    store = _open_decompose_input(ctx, "cp")
    dense = isinstance(store, DenseArray)
    if dense and m.solver != "exact":
        raise InputError(
            f"{store.path} is a dense array: CP-ALS of dense arrays takes method: cp (exact), not {m.method}"
        )
    out = ctx.step.outputs["out"]
    # randomized methods run on CPU workers (any worker of a GPU cluster runs them)
    device = m.device or ("cpu" if m.solver != "exact" else ctx.default_device)
    # init: random, a warm start from the previous result at 'previous' (default out), or a result
    init: Any = "random"
    prev, warm = _warm_result(ctx, m)
    if prev is not None:
        if not isinstance(prev, CPResult):
            raise InputError(f"init: {warm} is not a CP result (a warm start of method cp needs one)")
        init, notes = warm_start(prev, store.shape, m.rank, m.seed)
        if m.nonnegative and any(bool((a < 0).any()) for a in init):
            # a result of unconstrained CP-ALS: nonnegative CP-ALS starts from |factors|, as
            # TensorLy makes its initial factors feasible
            init = [np.abs(a) for a in init]
            notes = "; ".join(filter(None, [notes, "negative entries of the warm start made positive (nonnegative)"]))
        ctx.log(
            f"warm start from {warm} (fit {prev.fit:.6f} after {prev.iterations} iterations)"
            + (f"; {notes}" if notes else "")
        )
    checkpoint, resume = _step_checkpoint(
        ctx,
        read_checkpoint,
        # a dense array's identity includes ||X||^2, known only after its scan: cp_als checks it
        lambda st: (dense or _same_store(st.input, store)) and st.params.get("rank") == m.rank,
        lambda st: (f"iteration {st.iteration + 1} (fit {st.fit:.6f})", st.iteration + 1),
    )
    client, scheduler = _scheduler(ctx, m, store.nnz, device)
    t0 = time.perf_counter()
    result = cp_als(
        store,
        m.rank,
        **_keywords(
            m,
            client=client,
            scheduler=scheduler,
            init=init,
            checkpoint=checkpoint,
            resume=resume,
            callback=_iteration_events(ctx, m.max_iters),
            out=out,
            overwrite=True,
            device=device,
        ),
    )
    wall = time.perf_counter() - t0
    loc.remove(checkpoint)  # the result is published: the checkpoint has served
    new, per_it = _steady(result.history, result.params.get("resumed_after", 0))
    metrics = {
        "fit": result.fit,
        "iterations": result.iterations,
        "iterations_this_run": len(new),
        "seconds_per_iteration": per_it,
        "first_iteration_seconds": new[0]["seconds"] if new else None,
        "nnz": store.nnz,
        "rank": m.rank,
        "method": m.solver,
        "execution": result.params.get("execution"),
        "device": result.params.get("device"),
        "scheduler": result.params.get("scheduler"),
        "nnz_modes_per_second": store.nnz * store.nmodes / max(per_it, 1e-12),
        "wall_seconds": wall,
        "input_store": store.path,
        "warm_start": warm if not isinstance(init, str) else None,
    }
    if dense:
        metrics["dense"] = True
    if m.nonnegative:
        metrics.update(nonnegative=True, reg=m.reg)
    ctx.log(
        f"rank {m.rank}: fit {result.fit:.6f} after {result.iterations} iterations, {per_it:.3f} s per "
        f"iteration steady state -> {out}"
    )
    return metrics


def _run_apr(ctx: StepContext) -> dict:
    """CP-APR (Poisson CP) of a store of counts: :func:`tensorflow_ooc.cp_apr` with the step's options."""
    from ..decompositions import PoissonResult, cp_apr
    from ..decompositions.apr.cp_apr import CHECKPOINT_FORMAT

    m: PoissonDecomposeStep = ctx.step.model  # type: ignore[assignment]
    store = _open_decompose_input(ctx, "cp-apr")
    out = ctx.step.outputs["out"]
    init: Any = "random"
    prev, warm = _warm_result(ctx, m)
    if prev is not None:
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
            notes = "; ".join(
                filter(
                    None,
                    [
                        notes,
                        f"{negative:,} negative entries of {size:,} made positive (CP-APR needs nonnegative factors)",
                    ],
                )
            )
        if isinstance(prev, PoissonResult):
            figure = f"log-likelihood {prev.loglik:.8e}"
        else:
            figure = f"least-squares fit {prev.fit:.6f}"
        ctx.log(
            f"warm start from {warm} ({figure} after {prev.iterations} iterations)" + (f"; {notes}" if notes else "")
        )
    checkpoint, resume = _step_checkpoint(
        ctx,
        _usable(ctx, lambda path: (read_npz(path, CHECKPOINT_FORMAT, "CP-APR") or (None, None))[1]),
        lambda meta: (
            _same_store(meta.get("input", {}), store)
            and (meta.get("params", {}).get("rank"), meta.get("params", {}).get("algorithm")) == (m.rank, m.algorithm)
        ),
        lambda meta: (
            f"outer iteration {int(meta['iteration']) + 1} (log-likelihood "
            f"{(meta.get('history') or [{}])[-1].get('loglik', float('nan')):.8e})",
            int(meta["iteration"]) + 1,
        ),
    )
    device = m.device or "cpu"
    client, scheduler = _scheduler(ctx, m, store.nnz, device)
    t0 = time.perf_counter()
    result = cp_apr(
        store,
        m.rank,
        **_keywords(
            m,
            client=client,
            scheduler=scheduler,
            init=init,
            checkpoint=checkpoint,
            resume=resume,
            callback=_iteration_events(ctx, m.max_iters),
            out=out,
            overwrite=True,
            device=device,
        ),
    )
    wall = time.perf_counter() - t0
    loc.remove(checkpoint)  # the result is published: the checkpoint has served
    new, per_it = _steady(result.history, result.params.get("resumed_after", 0))
    last = result.history[-1] if result.history else {}
    metrics = {
        "loglik": result.loglik,
        "loglik_change": last.get("loglik_change"),
        "kkt_violation": result.kkt,
        "fit": result.fit,
        "iterations": result.iterations,
        "iterations_this_run": len(new),
        "inner_iterations_this_run": sum(int(h.get("inner_iterations", 0)) for h in new),
        "seconds_per_iteration": per_it,
        "first_iteration_seconds": new[0]["seconds"] if new else None,
        "nnz": store.nnz,
        "rank": m.rank,
        "method": "cp-apr",
        "algorithm": m.algorithm,
        "tol": m.tol,
        "execution": result.params.get("execution"),
        "device": "cpu",
        "scheduler": result.params.get("scheduler"),
        "nnz_modes_per_second": store.nnz * store.nmodes / max(per_it, 1e-12),
        "wall_seconds": wall,
        "input_store": store.path,
        "warm_start": warm if prev is not None else None,
    }
    ctx.log(
        f"CP-APR ({m.algorithm}) rank {m.rank}: log-likelihood {result.loglik:.8e}, KKT violation "
        f"{result.kkt:.3e} after {result.iterations} outer iterations (least-squares fit {result.fit:.6f}), "
        f"{per_it:.3f} s per iteration steady state -> {out}"
    )
    return metrics


def tt_warm_start(previous: TTResult, shape: tuple[int, ...], seed: int | None) -> tuple[list[np.ndarray], str]:
    """Initial cores from a previous tensor train (of the same ranks) for a tensor of ``shape``.

    A mode that grew keeps its core's old slices and gets new slices ``core[:, i, :]`` drawn
    N(0, s^2) at the spread of the old ones (TT-ALS makes the cores orthonormal before its first
    sweep and recomputes each core from the others when it updates it). A mode that shrank is an
    error.
    """
    if len(previous.cores) != len(shape):
        raise InputError(f"the previous result has {len(previous.cores)} cores, the tensor {len(shape)} modes")
    rng = np.random.default_rng(seed)
    cores, notes = [], []
    for n, (core, rows) in enumerate(zip(previous.cores, shape)):
        c = np.asarray(core, dtype=np.float64)
        old = c.shape[1]
        if rows < old:
            raise InputError(f"mode {n} shrank from {old} to {rows} rows since the previous result")
        if rows > old:
            spread = float(np.sqrt(np.mean(c * c))) or 1.0
            extra = rng.standard_normal((c.shape[0], rows - old, c.shape[2])) * spread
            c = np.concatenate([c, extra], axis=1)
            notes.append(f"mode {n}: {rows - old} new slices initialized")
        cores.append(np.ascontiguousarray(c))
    return cores, "; ".join(notes)


def _run_tt(ctx: StepContext) -> dict:
    """Tensor-train ALS of a store: :func:`tensorflow_ooc.tt_als` with the step's options."""
    from ..decompositions import tt_als
    from ..decompositions.tt.tt_checkpoint import read_tt_checkpoint
    from ..decompositions.tt.tt_steps import check_ranks

    m: TTDecomposeStep = ctx.step.model  # type: ignore[assignment]
    store = _open_decompose_input(ctx, "tt")
    out = ctx.step.outputs["out"]
    try:
        ranks = check_ranks(m.ranks if isinstance(m.ranks, int) else tuple(m.ranks), store.shape)[1:-1]
    except DecompositionError as exc:
        raise InputError(f"step {ctx.step.name!r}: ranks: {exc}") from None
    init: Any = "random"
    prev, warm = _warm_result(ctx, m)
    if prev is not None:
        if not isinstance(prev, TTResult):
            raise InputError(f"init: {warm} is not a tensor-train result (a warm start of method tt needs one)")
        if len(prev.cores) != store.nmodes or tuple(prev.ranks[1:-1]) != ranks:
            # other ranks are another model: the sweeps start at random, and the record says so
            ctx.log(
                f"the previous train at {warm} has ranks {list(prev.ranks[1:-1])}, this step "
                f"{list(ranks)}: random initial cores"
            )
            prev = None
        else:
            init, notes = tt_warm_start(prev, tuple(store.shape), m.seed)
            ctx.log(
                f"warm start from {warm} (fit {prev.fit:.6f} after {prev.sweeps} sweeps)"
                + (f"; {notes}" if notes else "")
            )
    checkpoint, resume = _step_checkpoint(
        ctx,
        _usable(ctx, read_tt_checkpoint),
        lambda st: (
            _same_store(st.input, store)
            and (st.params.get("ranks"), st.params.get("method")) == (list(ranks), m.algorithm)
        ),
        lambda st: (f"sweep {st.sweep + 1} (fit {st.fit:.6f})", st.sweep + 1),
    )
    client, scheduler = _scheduler(ctx, m, store.nnz, "cpu")
    randomized = m.algorithm == "randomized"
    t0 = time.perf_counter()
    try:
        result = tt_als(
            store,
            ranks,
            **_keywords(
                m,
                client=client,
                scheduler=scheduler,
                init=init,
                checkpoint=checkpoint,
                resume=resume,
                callback=_iteration_events(ctx, m.max_iters, key="sweep"),
                out=out,
                overwrite=True,
            ),
        )
    except DecompositionError as exc:
        raise InputError(f"step {ctx.step.name!r}: {exc}") from None
    wall = time.perf_counter() - t0
    loc.remove(checkpoint)  # the result is published: the checkpoint has served
    new, per_it = _steady(result.history, result.params.get("resumed_after", 0))
    metrics = {
        "fit": result.fit,
        "iterations": result.sweeps,
        "iterations_this_run": len(new),
        "seconds_per_iteration": per_it,
        "first_iteration_seconds": new[0]["seconds"] if new else None,
        "nnz": store.nnz,
        "method": "tt",
        "algorithm": m.algorithm,
        "ranks": list(ranks),
        "fit_from": result.params.get("fit_from"),
        "execution": result.params.get("execution"),
        "device": "cpu",
        "scheduler": result.params.get("scheduler"),
        "nnz_modes_per_second": store.nnz * store.nmodes / max(per_it, 1e-12),
        "wall_seconds": wall,
        "input_store": store.path,
        "warm_start": warm if prev is not None else None,
    }
    if randomized:
        metrics.update(samples=m.samples, fit_every=result.params.get("fit_every"))
    ctx.log(
        f"TT-ALS ({m.algorithm}) ranks {'x'.join(map(str, ranks))}: fit {result.fit:.6f} after {result.sweeps} "
        f"sweeps, {per_it:.3f} s per sweep steady state -> {out}"
    )
    return metrics


def tucker_warm_start(
    previous: TuckerResult, shape: tuple[int, ...], ranks: tuple[int, ...], seed: int | None
) -> tuple[list[np.ndarray], str]:
    """Initial Tucker factors from a previous Tucker result for a tensor of ``shape``.

    A mode that grew keeps its old rows and gets new rows drawn N(0, s^2) at the spread of its old
    rows (HOOI's first SVDs orthonormalize them); a larger rank gets random columns, a smaller one
    keeps the leading ones (the largest singular values come first).
    """
    if len(previous.factors) != len(shape):
        raise InputError(f"the previous result has {len(previous.factors)} modes, the tensor {len(shape)}")
    rng = np.random.default_rng(seed)
    out, notes = [], []
    for n, (U, rows, j) in enumerate(zip(previous.factors, shape, ranks)):
        U = np.asarray(U, dtype=np.float64)
        if U.shape[0] > rows:
            raise InputError(
                f"mode {n} shrank from {U.shape[0]} to {rows} rows since the previous result: "
                "a warm start cannot drop rows; use init: random"
            )
        spread = float(U.std()) or 1.0 / math.sqrt(max(rows, 1))
        U = U[:, :j]
        if U.shape[1] < j:
            U = np.concatenate([U, rng.standard_normal((U.shape[0], j - U.shape[1])) * spread], axis=1)
            notes.append(f"mode {n}: {j - previous.factors[n].shape[1]} new columns")
        if rows > U.shape[0]:
            notes.append(f"mode {n}: {rows - U.shape[0]} new rows initialized")
            U = np.concatenate([U, rng.standard_normal((rows - U.shape[0], j)) * spread], axis=0)
        out.append(np.ascontiguousarray(U))
    return out, "; ".join(notes)


def _run_tucker(ctx: StepContext) -> dict:
    from ..decompositions import tucker_hooi
    from ..decompositions.tucker.tucker_checkpoint import read_tucker_checkpoint
    from ..decompositions.tucker.tucker_hooi import check_ranks

    m: TuckerDecomposeStep = ctx.step.model  # type: ignore[assignment]
    store = _open_decompose_input(ctx, "tucker")
    out = ctx.step.outputs["out"]
    try:
        ranks = check_ranks(m.ranks, store.shape)
    except DecompositionError as exc:
        raise InputError(f"step {ctx.step.name!r}: ranks: {exc}") from None
    device = m.device or ("gpu" if ctx.default_device == "gpu" else "cpu")
    init: Any = m.init if m.init in ("random", "nvecs") else "random"
    prev, warm = _warm_result(ctx, m)
    if prev is not None:
        if not isinstance(prev, TuckerResult):
            raise InputError(f"init: {warm} is not a Tucker result (a warm start of method tucker needs one)")
        init, notes = tucker_warm_start(prev, tuple(store.shape), ranks, m.seed)
        ctx.log(f"warm start from {warm} (fit {prev.fit:.6f})" + (f"; {notes}" if notes else ""))
    checkpoint, resume = _step_checkpoint(
        ctx,
        read_tucker_checkpoint,
        lambda st: _same_store(st.input, store) and tuple(st.params.get("ranks", ())) == ranks,
        lambda st: (f"iteration {st.iteration + 1} (fit {st.fit:.6f})", st.iteration + 1),
    )
    client, scheduler = _scheduler(ctx, m, store.nnz, device)
    t0 = time.perf_counter()
    result = tucker_hooi(
        store,
        ranks,
        **_keywords(
            m,
            client=client,
            scheduler=scheduler,
            init=init,
            checkpoint=checkpoint,
            resume=resume,
            callback=_iteration_events(ctx, m.max_iters),
            out=out,
            overwrite=True,
            device=device,
            progress=False,
        ),
    )
    wall = time.perf_counter() - t0
    loc.remove(checkpoint)
    new, per_it = _steady(result.history, result.params.get("resumed_after", 0))
    metrics = {
        "fit": result.fit,
        "iterations": result.iterations,
        "iterations_this_run": len(new),
        "seconds_per_iteration": per_it,
        "first_iteration_seconds": new[0]["seconds"] if new else None,
        "nnz": store.nnz,
        "method": "tucker",
        "ranks": list(ranks),
        "execution": result.params.get("execution"),
        "device": result.params.get("device"),
        "scheduler": result.params.get("scheduler"),
        "nnz_modes_per_second": store.nnz * store.nmodes / max(per_it, 1e-12),
        "wall_seconds": wall,
        "input_store": store.path,
        "warm_start": warm if prev is not None else None,
    }
    ctx.log(
        f"Tucker ranks {'x'.join(map(str, ranks))}: fit {result.fit:.6f} after {result.iterations} iterations, "
        f"{per_it:.3f} s per iteration steady state -> {out}"
    )
    return metrics


def _run_completion(ctx: StepContext) -> dict:
    from ..decompositions import CompletionError, FastTuckerResult, tucker_sgd

    m: CompletionDecomposeStep = ctx.step.model  # type: ignore[assignment]
    store = _open_decompose_input(ctx, "completion")
    out = ctx.step.outputs["out"]
    test = open_input_store(ctx.step.inputs["test"]) if "test" in ctx.step.inputs else None
    device = m.device or ("gpu" if ctx.default_device == "gpu" else "cpu")
    ranks = m.ranks if isinstance(m.ranks, int) else tuple(m.ranks)
    init: Any = "random"
    prev, warm = _warm_result(ctx, m)
    if prev is not None:
        if not isinstance(prev, FastTuckerResult):
            raise InputError(f"init: {warm} is not a FastTucker result (a warm start of method completion needs one)")
        want = (store.nmodes * (ranks,) if isinstance(ranks, int) else ranks, m.core_rank)
        if (tuple(prev.ranks), prev.core_rank) != want:
            # other ranks are another model: training restarts, and the record says so
            ctx.log(
                f"the previous model at {warm} has ranks {list(prev.ranks)} and core rank {prev.core_rank}, "
                f"this step {list(want[0])} and {m.core_rank}: random initial model"
            )
            prev = None
        else:
            init = prev
            grown = [f"mode {n}: {b - a} new rows" for n, (a, b) in enumerate(zip(prev.shape, store.shape)) if b > a]
            ctx.log(
                f"warm start from {warm} (test RMSE {prev.test_rmse:.6g} at epoch {prev.best_epoch})"
                + (f"; {', '.join(grown)}" if grown else "")
            )
    client, scheduler = _scheduler(ctx, m, store.nnz, device)
    fraction = m.test_fraction if test is not None or m.test_fraction is not None else 0.1
    t0 = time.perf_counter()
    try:
        result = tucker_sgd(
            store,
            ranks,
            m.core_rank,
            **_keywords(
                m,
                test=test,
                test_fraction=None if test is not None else fraction,
                client=client,
                scheduler=scheduler,
                progress=False,
                out=out,
                overwrite=True,
                device=device,
                callback=_iteration_events(ctx, m.epochs, key="epoch"),
                init=init,
            ),
        )
    except CompletionError as exc:
        raise InputError(f"step {ctx.step.name!r}: {exc}") from None
    wall = time.perf_counter() - t0
    _, per_epoch = _steady(result.history)
    metrics = {
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
        "warm_start": warm if prev is not None else None,
    }
    ctx.log(
        f"FastTucker ranks {'x'.join(map(str, result.ranks))}, core rank {result.core_rank}: test RMSE "
        f"{result.test_rmse:.6g} (MAE {result.test_mae:.6g}) at epoch {result.best_epoch} of {result.epochs} -> {out}"
    )
    return metrics
