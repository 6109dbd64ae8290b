"""The decompose step: CP-ALS, CP-APR, TT-ALS, Tucker HOOI and FastTucker completion runs of a
store, by one runner (:func:`run_decompose`) and a small table entry per method
(:mod:`.decompose_methods`): warm starts from a previous result, per-iteration progress events,
and resume from the step's checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import decompositions
from ..decompositions import load_result
from ..decompositions.common.option_values import api_keywords
from ..errors import DecompositionError, StoreError, TfoocError
from ..execution.inline import INLINE_MAX_NNZ
from ..store.dense import is_dense_array, open_dense
from . import locations as loc
from .decompose_methods import METHODS
from .errors import InputError
from .step_context import StepContext, open_input_store, resolve_store
from .warm_starts import tt_warm_start, tucker_warm_start, warm_start

__all__ = ["run_decompose", "warm_start", "tt_warm_start", "tucker_warm_start"]


def run_decompose(ctx: StepContext) -> dict:
    """A decompose step: its method's function on the step's input with the step's settings, from
    a warm start or the step's checkpoint; the step's figures."""
    m = ctx.step.model
    method = METHODS[m.method_name]  # type: ignore[attr-defined]
    store = _open_decompose_input(ctx, m.method_name)  # type: ignore[attr-defined]
    try:
        args = method.arguments(m, store)
    except DecompositionError as exc:
        raise InputError(f"step {ctx.step.name!r}: ranks: {exc}") from None
    out = ctx.step.outputs["out"]
    device = method.device(ctx, m)
    # init: the method's own (random, nvecs), a warm start from the previous result at 'previous'
    # (default out), or a result
    init: Any = m.init if m.init in m._inits and m.init != "previous" else "random"  # type: ignore[attr-defined]
    prev, warm = _warm_result(ctx, m)
    if prev is not None:
        start = method.warm(ctx, m, store, args, prev, warm)
        prev, init = (None, init) if start is None else (prev, start)
    checkpoint, resume = None, False
    if method.checkpoints is not None:
        ck = method.checkpoints
        checkpoint, resume = _step_checkpoint(ctx, ck.read(ctx), lambda st: ck.matches(st, m, store, args), ck.where)
    client, scheduler = _scheduler(ctx, m, store.nnz, device)
    this_run = dict(
        client=client,
        scheduler=scheduler,
        init=init,
        checkpoint=checkpoint,
        resume=resume,
        callback=_iteration_events(ctx, method.total(m), key=method.counter),
        out=out,
        overwrite=True,
        device=device,
        progress=False,
        **method.extra(ctx, m),
    )
    function = getattr(decompositions, method.function)
    t0 = time.perf_counter()
    try:
        result = function(store, *args, **_keywords(m, **this_run))
    except method.refusals as exc:
        raise InputError(f"step {ctx.step.name!r}: {exc}") from None
    wall = time.perf_counter() - t0
    if checkpoint is not None:
        loc.remove(checkpoint)  # the result is published: the checkpoint has served
    figures = method.figures(result, store, wall) | method.metrics(m, result, store, args)
    figures["warm_start"] = warm if prev is not None else None
    per = figures.get("seconds_per_iteration")  # completion reports its epochs' own figures
    steady = "" if per is None else f", {per:.3f} s per {method.counter} steady state"
    ctx.log(f"{method.summary(m, result, args)}{steady} -> {out}")
    return figures


def _keywords(m: Any, **this_run: Any) -> dict[str, Any]:
    """A method's API keywords: the step's settings of its declared options, then this run's own
    (client, checkpoint, warm start, ...) that the method takes."""
    options = m._declared_options
    return {**api_keywords(options, m.declared_values()), **{k: v for k, v in this_run.items() if k in options.names}}


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
        checkpointed = record.get("checkpoint_seconds") is not None
        if checkpointed:
            rec["checkpoint_iteration"] = number
        elif ctx.recorder.record.steps[ctx.step.name].progress.get("checkpoint_iteration") is not None:
            rec["checkpoint_iteration"] = ctx.recorder.record.steps[ctx.step.name].progress["checkpoint_iteration"]
        # saved with each checkpoint: a driver killed now shows the iteration a rerun resumes after
        ctx.recorder.step(ctx.step.name, save=checkpointed, progress=rec)
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
