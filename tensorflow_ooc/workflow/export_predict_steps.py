"""The export step (a result as npz, Zarr, TensorLy or pyttb) and the predict step (a model's
values at the coordinates of a ``.tns`` file or a store).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import synthetic
from ..decompositions import CPResult, FastTuckerResult, PoissonResult, TTResult, TuckerResult, load_result
from ..errors import StoreError
from ..ingest import TextSource
from . import locations as loc
from .errors import InputError
from .evaluation import KIND_NAMES, load_model, model_of, model_values
from .step_context import StepContext, is_tns, open_input_store, save_npz
from .step_models import ExportStep, PredictStep

# --- export -------------------------------------------------------------------------------------------


def run_export(ctx: StepContext) -> dict:
    m: ExportStep = ctx.step.model  # type: ignore[assignment]
    src, out = ctx.step.inputs["result"], ctx.step.outputs["out"]
    if not loc.isdir(src):
        raise InputError(f"{src}: expected a result store (written by a decompose step)")
    try:
        result = load_result(src)
    except StoreError as exc:
        raise InputError(str(exc)) from None
    kind = model_of(result, src).kind
    summary: dict[str, Any]
    if isinstance(result, FastTuckerResult):
        summary = {"test_rmse": result.test_rmse, "ranks": list(result.ranks), "core_rank": result.core_rank}
        arrays = {"test_rmse": result.test_rmse, "test_mae": result.test_mae}
    elif isinstance(result, TTResult):
        summary = {"fit": result.fit, "ranks": list(result.ranks[1:-1]), "sweeps": result.sweeps}
        # as TTResult.save_npz: TTResult.load reads the export back, an evaluate step as a train
        arrays = {
            "fit": result.fit,
            "sweeps": result.sweeps,
            "params": json.dumps(result.params),
            "input": json.dumps(result.input),
        }
    elif isinstance(result, TuckerResult):
        summary = {"fit": result.fit, "ranks": list(result.ranks)}
        arrays = {"fit": result.fit}
    else:
        summary = {"fit": result.fit, "rank": result.rank}
        arrays = {"fit": result.fit}
        if isinstance(result, PoissonResult):
            # as PoissonResult.save_npz: an evaluate step reads the npz back as a Poisson model
            summary.update(loglik=result.loglik, kkt_violation=result.kkt, poisson=True)
            arrays.update(loglik=result.loglik, kkt=result.kkt)
    if m.format == "npz":
        save_npz(out, {**result.to_numpy(), "history": json.dumps(result.history), **arrays})
    elif m.format == "zarr":
        result.save(out, overwrite=True)
    elif m.format == "parquet":
        if not isinstance(result, CPResult) or not (result.input or {}).get("labels"):
            raise InputError(
                f"{src}: a parquet export writes a CP result's factors keyed by its table's labels; this result "
                "is not a CP result of a table converted with modes (export it as npz or zarr)"
            )
        try:
            summary["files"] = len(result.to_parquet(out))
        except StoreError as exc:
            raise InputError(str(exc)) from None
    elif m.format == "tensorly":
        loc.write_bytes(out, pickle.dumps(result.to_tensorly()))
    elif m.format == "pyttb":
        if not isinstance(result, CPResult):
            raise InputError(
                f"{src} is a {KIND_NAMES[kind]} result: pyttb's export_data writes CP models (ktensor) only; "
                "export it as npz, tensorly or zarr"
            )
        import pyttb

        with loc.local_target(out) as tmp:
            pyttb.export_data(result.to_pyttb(), tmp)
    what = "Poisson CP (CP-APR)" if isinstance(result, PoissonResult) else KIND_NAMES[kind]
    ctx.log(f"{m.format} export of {src} ({what} result) -> {out}")
    return {"format": m.format, "model": kind, **summary}


# --- predict ------------------------------------------------------------------------------------------

PREDICT_BATCH = 1 << 20  # coordinates predicted (and written) at once


def _coordinate_batches(location: str, nmodes: int, one_based: bool) -> Iterator[np.ndarray]:
    """0-based coordinates from a ``.tns`` file (N indices a line, with or without a value) or a
    store (its nonzeros' coordinates), in batches, in the order they are read."""
    if not is_tns(location):
        store = open_input_store(location)
        if store.nmodes != nmodes:
            raise InputError(f"{store.path} has {store.nmodes} modes, the model {nmodes}")
        for ch in store.iter_chunks():
            yield ch.coords(store.layout)
        return
    with loc.local_copy(location, suffix=".gz" if location.endswith(".gz") else ".tns") as lp:
        src = TextSource(lp, one_based=one_based)
        if src.nmodes not in (nmodes, nmodes - 1):
            raise InputError(
                f"{location}: {src.nmodes + 1} columns a line; the model has {nmodes} modes (expected "
                f"{nmodes} indices, with or without a value)"
            )
        for coords, values in src.batches(None):
            if src.nmodes == nmodes - 1:
                # no value column: what the parser read as the value is the last index
                last = values - (1 if one_based else 0)
                if not np.all(last == np.round(last)) or (last.size and last.min() < 0):
                    raise InputError(f"{location}: the last column holds non-index values; expected {nmodes} indices")
                coords = np.column_stack([coords, last.astype(np.int64)])
            yield coords


def _predict_keys(ctx: StepContext, m: PredictStep, src: str, keys_loc: str, out: str) -> dict:
    """A CP result of a table, at the rows of a Parquet or CSV file of keys: the keys and
    ``prediction`` written to ``out`` (Parquet or CSV), batch by batch."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    from ..decompositions.common.labelled_factors import mode_names
    from ..ingest.table_source import TableSource

    try:
        result = load_result(src) if loc.isdir(src) else None
    except StoreError as exc:
        raise InputError(str(exc)) from None
    if not isinstance(result, CPResult) or not mode_names(result):
        raise InputError(f"{src}: predicting at keys needs a CP result of a table converted with modes")
    names = mode_names(result)
    written = skipped = 0
    writer = None
    with loc.local_target(out) as tmp:
        try:
            for _, _, _, batch in TableSource(keys_loc, names).record_batches(names):
                ctx.check_cancel()
                frame = batch.to_pandas()
                try:
                    got = result.predict(frame, unknown=m.unknown)
                except (KeyError, ValueError) as exc:
                    raise InputError(f"{keys_loc}: {exc.args[0] if exc.args else exc}") from None
                except StoreError as exc:
                    raise InputError(str(exc)) from None
                table = pa.Table.from_pandas(got, preserve_index=False)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema) if out.endswith(".parquet") else None
                    csv_out = None if writer is not None else pa_csv.CSVWriter(tmp, table.schema)
                (writer or csv_out).write_table(table)
                written += len(got)
                skipped += len(frame) - len(got)
        finally:
            if writer is not None:
                writer.close()
            elif "csv_out" in locals() and csv_out is not None:
                csv_out.close()
    ctx.log(
        f"{written:,} predictions of {src} at the keys of {keys_loc} -> {out}"
        + (f" ({skipped:,} rows with unknown keys left out)" if skipped else "")
    )
    return {"predictions": written, "skipped": skipped, "model": "cp", "coords": keys_loc}


def run_predict(ctx: StepContext) -> dict:
    m: PredictStep = ctx.step.model  # type: ignore[assignment]
    src, coords_loc, out = ctx.step.inputs["result"], ctx.step.inputs["coords"], ctx.step.outputs["out"]
    if out.endswith((".parquet", ".csv")):
        return _predict_keys(ctx, m, src, coords_loc, out)
    model = load_model(src)
    shape = model.shape
    one_based = not m.zero_based
    count = [0]

    def predictions() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for batch in _coordinate_batches(coords_loc, len(shape), one_based):
            ctx.check_cancel()
            for s in range(0, batch.shape[0], PREDICT_BATCH):
                c = batch[s : s + PREDICT_BATCH]
                bad = np.flatnonzero(((c < 0) | (c >= np.asarray(shape))).any(axis=1))
                if bad.size:
                    row = c[bad[0]] + (1 if one_based else 0)
                    raise InputError(
                        f"{coords_loc}: coordinate {count[0] + s + int(bad[0]) + 1} ({', '.join(map(str, row))}, "
                        f"{'1' if one_based else '0'}-based) lies outside the model's shape {shape}"
                    )
                yield c, model_values(model, c)
            count[0] += batch.shape[0]

    if out.endswith(".npz"):
        parts = list(predictions())
        coords = np.concatenate([c for c, _ in parts]) if parts else np.zeros((0, len(shape)), np.int64)
        values = np.concatenate([v for _, v in parts]) if parts else np.zeros(0)
        save_npz(out, {"coords": coords, "values": values})
        written = int(values.shape[0])
    else:
        header = (
            f"tensorflow_ooc predictions of the {KIND_NAMES[model.kind]} model {src} at the coordinates of {coords_loc}"
        )
        with loc.local_target(out) as tmp:
            written = synthetic.write_tns(tmp, predictions(), one_based=one_based, header=header)
    ctx.log(f"{written:,} predictions of {src} at {coords_loc} -> {out}")
    return {"predictions": int(written), "model": model.kind, "coords": coords_loc}
