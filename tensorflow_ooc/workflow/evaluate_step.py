"""The evaluate step: a model's fit, RMSE or log-likelihood on a tensor and its factor match
against a reference model, checked against the step's thresholds.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..decompositions import CPResult, PoissonResult, TTResult, TuckerResult
from ..errors import TfoocError
from ..store import Store
from ..store.dense import DenseArray, is_dense_array, open_dense
from . import locations as loc
from .errors import InputError, StepFailed
from .evaluation import evaluate_tensor, factor_match, load_model
from .step_context import StepContext, open_input_store, resolve_store
from .step_models import EvaluateStep


def _open_tensor(location: str) -> Store | DenseArray:
    """A store (a versioned folder: its latest version) or a dense Zarr array."""
    location = resolve_store(location)
    if is_dense_array(location):
        try:
            return open_dense(location)
        except TfoocError as exc:
            raise InputError(str(exc)) from None
    return open_input_store(location)


def run_evaluate(ctx: StepContext) -> dict:
    m: EvaluateStep = ctx.step.model  # type: ignore[assignment]
    result_loc = ctx.step.inputs["result"]
    model = load_model(result_loc)
    metrics: dict[str, Any] = {"result": result_loc, "model": model.kind, **model.sizes}
    if model.poisson:
        metrics["poisson"] = True
    r = model.result if loc.isdir(result_loc) else None
    if isinstance(r, (CPResult, TuckerResult)):
        metrics.update(fit_reported=r.fit, iterations=r.iterations)
        if isinstance(r, PoissonResult):
            metrics.update(loglik_reported=r.loglik, kkt_violation_reported=r.kkt, algorithm=r.params.get("algorithm"))
    elif isinstance(r, TTResult):
        metrics.update(fit_reported=r.fit, iterations=r.sweeps, algorithm=r.params.get("method"))
    elif r is not None:
        metrics.update(test_rmse_reported=r.test_rmse, test_mae_reported=r.test_mae, epochs=r.epochs)
    if "tensor" in ctx.step.inputs:
        tensor = _open_tensor(ctx.step.inputs["tensor"])
        metrics["tensor"] = tensor.path
        metrics.update(evaluate_tensor(tensor, model))
    else:
        if "fit_reported" in metrics:
            metrics["fit"] = metrics["fit_reported"]
        if "loglik_reported" in metrics:
            metrics["loglik"] = metrics["loglik_reported"]
    if "reference" in ctx.step.inputs:
        ref = load_model(ctx.step.inputs["reference"])
        match = factor_match(model, ref)
        metrics.update(
            reference=ref.source,
            reference_rank=ref.rank,
            fms=match["fms"],
            congruence=match["congruence"],
            pairs=match["pairs"],
        )
    parts = [
        f"log-likelihood {metrics['loglik']:.8e}" if "loglik" in metrics else None,
        f"fit {metrics['fit']:.6f}" if "fit" in metrics else None,
        f"RMSE {metrics['rmse']:.6g} (MAE {metrics['mae']:.6g}) on {metrics['entries']:,} entries"
        if "rmse" in metrics
        else None,
        f"factor match score {metrics['fms']:.4f} (congruence {metrics['congruence']:.4f}) against "
        f"{metrics['reference']}"
        if "fms" in metrics
        else None,
    ]
    ctx.log("; ".join(p for p in parts if p) or f"{model.what}: nothing to measure without 'tensor'")
    failed = []
    if m.min_fit is not None:
        if "fit" not in metrics:
            raise InputError(
                f"min_fit: {model.what} has no fit (a completion model leaves the missing entries out); "
                "use max_rmse with a tensor"
            )
        if metrics["fit"] < m.min_fit:
            failed.append(f"fit {metrics['fit']:.6f} < min_fit {m.min_fit}")
    if m.min_fms is not None and metrics.get("fms", -math.inf) < m.min_fms:
        failed.append(f"factor match score {metrics['fms']:.4f} < min_fms {m.min_fms}")
    if m.max_rmse is not None and not metrics["rmse"] <= m.max_rmse:
        failed.append(f"RMSE {metrics['rmse']:.6g} > max_rmse {m.max_rmse}")
    if failed:
        # metrics stay in the record; the output is not written so the next run evaluates again
        ctx.recorder.step(ctx.step.name, metrics={k: v for k, v in metrics.items() if k != "pairs"})
        raise StepFailed("; ".join(failed))
    loc.write_text(ctx.step.outputs["out"], json.dumps(metrics, indent=1))
    return {k: v for k, v in metrics.items() if k != "pairs"}
