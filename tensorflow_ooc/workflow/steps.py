"""Running one step: :func:`run_step` hands it to the runner of its kind (:mod:`.data_steps`,
:mod:`.decompose_step`, :mod:`.evaluate_step`, :mod:`.export_predict_steps`), which returns the
metrics that go into the run record. Every runner writes only the step's declared outputs and
publishes each one whole (a hidden temporary name renamed into place for local files, the stores'
own atomic publish), so a step that fails or is killed leaves the previous output or none: never a
torn one that a later run would mistake for finished work."""

from __future__ import annotations

from collections.abc import Callable

from .data_steps import run_convert, run_generate
from .decompose_step import run_decompose
from .evaluate_step import run_evaluate
from .export_predict_steps import run_export, run_predict
from .step_context import StepContext

RUNNERS: dict[str, Callable[[StepContext], dict]] = {
    "generate": run_generate,
    "convert": run_convert,
    "decompose": run_decompose,
    "evaluate": run_evaluate,
    "export": run_export,
    "predict": run_predict,
}


def run_step(ctx: StepContext) -> dict:
    """Run one step; returns its metrics."""
    return RUNNERS[ctx.step.kind](ctx)
