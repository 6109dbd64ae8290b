"""Step implementations: each calls the public API (synthetic generators, ``convert``, ``cp_als``,
results and their exports) and returns the metrics that go into the run record.

A step writes only its declared outputs, and publishes each one whole (a hidden temporary name
renamed into place for local files, the stores' own atomic publish), so a step that fails or is
killed leaves either the previous output or none: never a torn one that a later run would
mistake for finished work.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import synthetic
from ..decompositions import (
    CPResult,
    FastTuckerResult,
    PoissonResult,
    TTResult,
    TuckerResult,
    cp_als,
    load_result,
    read_checkpoint,
)
from ..decompositions.common.checkpoint_files import read_npz
from ..errors import DecompositionError, StoreError, TfoocError
from ..execution.inline import INLINE_MAX_NNZ
from ..ingest import AltoRunSource, BatchSource, TextSource, convert
from ..store import Store, open_store
from ..store.dense import DenseArray, is_dense_array, open_dense
from . import locations as loc
from .errors import InputError, StepFailed
from .evaluation import KIND_NAMES, evaluate_tensor, factor_match, load_model, model_of, model_values
from .plan import PlannedStep, Workflow
from .records import Recorder
from .step_models import (
    CompletionDecomposeStep,
    ConvertStep,
    DecomposeStep,
    EvaluateStep,
    ExportStep,
    GenerateStep,
    PoissonDecomposeStep,
    PredictStep,
    TTDecomposeStep,
    TuckerDecomposeStep,
)

TNS_SUFFIXES = (".tns", ".tns.gz")
VERSIONS_FILE = "versions.json"


@dataclass
class StepContext:
    """What a step needs from the run: its plan, the recorder, the cluster, cancellation."""

    workflow: Workflow
    step: PlannedStep
    fingerprint: str
    recorder: Recorder
    client_for: Callable[[str], Any]  # device -> a Dask client on the run's cluster
    default_device: str = "auto"

    def log(self, message: str, **fields: Any) -> None:
        self.recorder.event("step-log", message, step=self.step.name, **fields)

    def check_cancel(self) -> None:
        self.recorder.check_cancel()

    def state_dir(self, *parts: str) -> str:
        return loc.join(self.workflow.root, "/".join((".tfooc",) + parts))


# --- helpers ------------------------------------------------------------------------------------------


def is_tns(location: str) -> bool:
    return location.endswith(TNS_SUFFIXES)


def input_files(location: str) -> list[str]:
    """The ``.tns`` files a convert input names: one file, a glob's matches, or a folder's
    ``*.tns`` / ``*.tns.gz`` (sorted by name, which is also the order new files are appended)."""
    if loc.has_glob(location):
        return [m for m in loc.glob(location) if not loc.isdir(m)]
    if loc.isdir(location):
        return [loc.child(location, n) for n in loc.listdir(location) if n.endswith(TNS_SUFFIXES)]
    return [location]


def _file_key(location: str) -> dict:
    i = loc.info(location)
    stamp = next((str(i[k]) for k in ("mtime", "LastModified", "created", "ETag") if i.get(k) is not None), None)
    return {"location": location, "size": int(i.get("size") or 0), "time": stamp}


def read_versions(location: str) -> dict:
    """The versions file of a versioned store (``{"versions": []}`` when there is none yet)."""
    f = loc.child(location, VERSIONS_FILE)
    if not loc.exists(f):
        return {"format": "tfooc-store-versions", "versions": []}
    return json.loads(loc.read_text(f))


def resolve_store(location: str) -> str:
    """A store location; for a versioned store (a folder with ``versions.json``) its latest version."""
    if loc.isdir(location) and loc.exists(loc.child(location, VERSIONS_FILE)):
        versions = read_versions(location)["versions"]
        if not versions:
            raise InputError(f"{location}: versioned store has no version yet")
        return loc.child(location, versions[-1]["path"])
    return location


def open_input_store(location: str) -> Store:
    try:
        return open_store(resolve_store(location))
    except StoreError as exc:
        raise InputError(str(exc)) from None


def _save_npz(location: str, arrays: dict[str, Any]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    loc.write_bytes(location, buf.getvalue())


def _cancellable(batches: Iterator, ctx: StepContext) -> Iterator:
    for b in batches:
        ctx.check_cancel()
        yield b


# --- generate ------------------------------------------------------------------------------------------


def run_generate(ctx: StepContext) -> dict:
    m: GenerateStep = ctx.step.model  # type: ignore[assignment]
    shape = tuple(m.shape) if m.shape else None
    nnz = m.nnz
    if m.like:
        pshape, pnnz = synthetic.PRESETS[m.like]
        shape = shape or tuple(pshape)
        nnz = nnz or pnnz
    assert shape is not None and nnz is not None
    out = ctx.step.outputs["out"]
    header = f"tensorflow_ooc synthetic {m.model} tensor, shape {','.join(map(str, shape))}, seed {m.seed}"
    metrics: dict[str, Any] = {"shape": list(shape)}
    if m.model == "planted":
        skew = m.skew if m.skew is not None else 1.3
        p = synthetic.planted_cp(shape, m.rank, nnz, noise=m.noise, seed=m.seed, skew=skew)
        _save_npz(
            ctx.step.outputs["factors_out"],
            {"weights": p.weights, **{f"factor{n}": f for n, f in enumerate(p.factors)}},
        )
        values = p.values
        if is_tns(out):
            # text files get 6 decimals: the writer's fast path is exact for fixed-point values
            # (noisy values would take its shortest-repr Python path, ~15x slower at uber size),
            # and it needs non-negative ones, so the few values noise made negative go apart
            values = np.round(values, 6)
            neg = values < 0
            batches: Iterator = iter([(p.coords[~neg], values[~neg]), (p.coords[neg], values[neg])])
        else:
            batches = iter([(p.coords, values)])
        nnz = int(p.coords.shape[0])
        metrics.update(rank=m.rank, noise=m.noise)
        ctx.log(
            f"planted rank-{m.rank} model with noise {m.noise}: {nnz:,} nonzeros; true factors in "
            f"{ctx.step.outputs['factors_out']}"
        )
    elif m.model == "planted-poisson":
        skew = m.skew if m.skew is not None else 1.3
        concentration = 0.5 if m.concentration is None else m.concentration
        poisson = synthetic.PlantedPoissonGenerator(
            shape, m.rank, nnz, seed=m.seed, skew=skew, concentration=concentration
        )
        total = float(poisson.weights.sum())
        header += f", rank {m.rank}, Poisson counts (expected total {total:.6g})"
        # a store gets the generator's sorted ALTO runs (merged, not sorted); text its batches
        batches = poisson.batches() if is_tns(out) else poisson.runs()
        metrics.update(rank=m.rank, concentration=concentration, expected_total=total)
    else:
        skew = m.skew if m.skew is not None else 1.6
        batches = synthetic.iter_heavy_tailed(shape, nnz, skew=skew, seed=m.seed, values=m.values)
    batches = _cancellable(batches, ctx)
    if is_tns(out):
        with loc.local_target(out) as tmp:
            written = synthetic.write_tns(tmp, batches, one_based=not m.zero_based, header=header)
    elif m.model == "planted-poisson":
        src = AltoRunSource(batches, shape, nnz, name="planted Poisson generator")
        written = convert(src, out, overwrite=True).nnz
    else:
        src = BatchSource(batches, len(shape), shape, nnz, name="synthetic generator")
        written = convert(src, out, shape=shape, overwrite=True).nnz
    metrics["nnz"] = int(written)
    ctx.log(f"wrote {written:,} nonzeros to {out}")
    if m.model == "planted-poisson":
        # once the tensor is written (as tfooc generate): no true model beside a failed write
        factors = ctx.step.outputs["factors_out"]
        _save_npz(factors, {"weights": poisson.weights, **{f"factor{n}": f for n, f in enumerate(poisson.factors)}})
        ctx.log(
            f"planted rank-{m.rank} Poisson model (expected total count {total:.6g}); true model in {factors} "
            "(weights: expected counts per component, factor columns summing to 1)"
        )
    return metrics


# --- convert ------------------------------------------------------------------------------------------


def _text_batches(files: list[str], one_based: bool, shape: tuple[int, ...]) -> Iterator:
    for f in files:
        with loc.local_copy(f, suffix=".gz" if f.endswith(".gz") else ".tns") as lp:
            yield from TextSource(lp, one_based=one_based).batches(shape)


def _files_shape(files: list[str], one_based: bool) -> tuple[list[int], int]:
    """Per-mode lengths the files need (max index + 1) and their estimated nonzeros."""
    shape: list[int] | None = None
    est = 0
    for f in files:
        with loc.local_copy(f, suffix=".gz" if f.endswith(".gz") else ".tns") as lp:
            src = TextSource(lp, one_based=one_based)
            s = src.infer_shape()
            est += src.nnz_estimate()
        if shape is not None and len(s) != len(shape):
            raise InputError(f"{f} has {len(s)} modes, earlier files {len(shape)}")
        shape = list(s) if shape is None else [max(a, b) for a, b in zip(shape, s)]
    return shape or [], est


def _grow(shape: list[int], *others: Any) -> tuple[int, ...]:
    out = list(shape)
    for o in others:
        if o is None:
            continue
        if out and len(o) != len(out):
            raise InputError(f"shapes disagree on the number of modes: {list(o)} vs {out}")
        out = [max(a, b) for a, b in zip(out, o)] if out else list(o)
    return tuple(int(s) for s in out)


def run_convert(ctx: StepContext) -> dict:
    m: ConvertStep = ctx.step.model  # type: ignore[assignment]
    src_loc, out = ctx.step.inputs["input"], ctx.step.outputs["out"]
    files = input_files(src_loc)
    one_based = not m.zero_based
    args = dict(
        duplicates=m.duplicates,
        chunk_nnz=m.chunk_nnz,
        max_block_nnz=m.max_block_nnz,
        compression=m.compression,
        values_dtype=m.values_dtype,
        memory_limit=m.memory_limit,
    )
    if not m.append:
        if not files:
            raise InputError(f"{src_loc}: no .tns or .tns.gz files")
        if len(files) == 1 and not loc.has_glob(src_loc) and not loc.isdir(src_loc):
            with loc.local_copy(files[0], suffix=".gz" if files[0].endswith(".gz") else ".tns") as lp:
                store = convert(lp, out, shape=m.shape, one_based=one_based, overwrite=True, **args)
        else:
            need, est = _files_shape(files, one_based)
            shape = _grow(need, m.shape)
            src = BatchSource(
                _cancellable(_text_batches(files, one_based, shape), ctx),
                len(shape),
                shape,
                est,
                name=f"{len(files)} files of {src_loc}",
            )
            store = convert(src, out, shape=shape, overwrite=True, **args)
        ctx.log(f"{len(files)} file(s) -> {out}: {store.nnz:,} nonzeros, shape {'x'.join(map(str, store.shape))}")
        return {"nnz": store.nnz, "shape": list(store.shape), "files": len(files)}
    return _append_version(ctx, m, files, out, one_based, args)


def file_sha256(location: str) -> str:
    """sha256 of a file's bytes, streamed (a ``.tns.gz`` is hashed as stored, compressed)."""
    h = hashlib.sha256()
    fs, p = loc.fs_of(location)
    with fs.open(p, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _short(digest: str | None) -> str:
    return (digest or "unknown")[:12]


def _changed_error(ctx: StepContext, changed: list[tuple[dict, dict]]) -> InputError:
    lines = []
    for rec, key in changed:
        if rec.get("sha256"):
            what = (
                f"sha256 {_short(rec['sha256'])}... ({rec['size']} bytes) when ingested in version "
                f"{rec.get('version', '?')}, now sha256 {_short(key['sha256'])}... ({key['size']} bytes)"
            )
        else:
            what = (
                f"size/time {rec['size']} bytes / {rec['time']} when ingested (recorded before content hashes "
                f"were kept), now {key['size']} bytes / {key['time']}: its content may have changed"
            )
        lines.append(f"{key['location']}: {what}")
    return InputError(
        f"step {ctx.step.name!r}: {len(changed)} already-ingested file(s) changed since they were ingested: "
        + "; ".join(lines)
        + ". Their old content is in the tensor already. Put the original back and add "
        "corrections as a new file, or set 'on_changed' on the step: 'append' adds the new content as new data "
        "(the old stays), 'replace-version' rebuilds the next version with the file's new content instead of its "
        "old one"
    )


def _classify(ctx: StepContext, files: list[str], records: list[dict]) -> tuple[list[dict], list, list, bool]:
    """Sort the input files by content against the ingested ``records`` (oldest first).

    Returns (new file keys, [(record, key)] of changed files, keys of every current file with its
    hash, whether a legacy record got its hash). A file is unchanged when its location has a
    record with the same sha256 (whatever its time), a duplicate when its content was ingested
    under another name (a rename or a copy) or comes twice in this batch; both are never appended.
    """
    current: dict[str, dict] = {}
    for r in records:
        current[r["location"]] = r  # the last ingestion of each location counts
    known = {r["sha256"]: r for r in records if r.get("sha256")}
    new: list[dict] = []
    changed: list[tuple[dict, dict]] = []
    keys: list[dict] = []
    batch: dict[str, str] = {}
    migrated = False
    for f in files:
        ctx.check_cancel()
        key = _file_key(f)
        key["sha256"] = file_sha256(f)
        keys.append(key)
        rec = current.get(f)
        if rec is not None:
            if rec.get("sha256") is None and (rec.get("size"), rec.get("time")) == (key["size"], key["time"]):
                rec["sha256"] = key["sha256"]  # a record from before hashes: kept from now on
                known.setdefault(key["sha256"], rec)
                migrated = True
                continue
            if rec.get("sha256") != key["sha256"]:
                changed.append((rec, key))
            continue
        same = known.get(key["sha256"])
        if same is not None:
            ctx.log(
                f"{f}: same content as {same['location']} (ingested in version {same.get('version', '?')}): "
                "not appended again"
            )
            continue
        if key["sha256"] in batch:
            ctx.log(f"{f}: same content as {batch[key['sha256']]} in this batch: appended once")
            continue
        batch[key["sha256"]] = f
        new.append(key)
    return new, changed, keys, migrated


def _rebuild_sources(
    ctx: StepContext, records: list[dict], changed: list[tuple[dict, dict]], keys: list[dict], number: int
) -> tuple[list[str], list[dict]]:
    """replace-version: the files the next version is rebuilt from, in ingestion order, and the new
    records. Every ingested content must still be there (under any name); a changed file's
    records are replaced by one record of its new content, at the place of its first ingestion."""
    by_hash: dict[str, str] = {}
    for k in keys:
        by_hash.setdefault(k["sha256"], k["location"])
    new_key = {key["location"]: key for _, key in changed}
    sources: list[str] = []
    out: list[dict] = []
    done: set[str] = set()
    missing = []
    for r in records:
        if r["location"] in new_key:
            if r["location"] not in done:
                done.add(r["location"])
                k = new_key[r["location"]]
                sources.append(k["location"])
                out.append({**k, "version": number, "replaced": r.get("sha256")})
            continue
        here = by_hash.get(r.get("sha256") or "")
        if here is None:
            missing.append(f"{r['location']} (version {r.get('version', '?')}, sha256 {_short(r.get('sha256'))}...)")
            continue
        sources.append(here)
        out.append(r)
    if missing:
        raise InputError(
            f"step {ctx.step.name!r}: on_changed: replace-version rebuilds the tensor from every "
            f"ingested file, but {len(missing)} of them are no longer in {ctx.step.inputs['input']} "
            f"with their ingested content: {', '.join(missing)}. Put them back, or use on_changed: "
            "append"
        )
    return sources, out


def _append_version(ctx: StepContext, m: ConvertStep, files: list[str], out: str, one_based: bool, args: dict) -> dict:
    """Append the files whose content is not in the latest version to its nonzeros, as the next
    version (see :class:`~tensorflow_ooc.workflow.step_models.ConvertStep` for changed files)."""
    versions = read_versions(out)
    latest = versions["versions"][-1] if versions["versions"] else None
    records = [dict(r) for r in (latest["files"] if latest else [])]
    new, changed, keys, migrated = _classify(ctx, files, records)
    number = (latest["version"] + 1) if latest else 1
    replace = False
    if changed:
        if m.on_changed == "error":
            raise _changed_error(ctx, changed)
        names = ", ".join(key["location"] for _, key in changed)
        if m.on_changed == "append":
            for rec, key in changed:
                if any(r.get("sha256") == key["sha256"] for r in records) or any(
                    k["sha256"] == key["sha256"] for k in new
                ):
                    ctx.log(f"{key['location']} changed, but its new content was ingested already: not appended")
                    continue
                new.append({**key, "changed_from": rec.get("sha256")})
            ctx.log(f"changed since ingested, appended as new data (on_changed: append): {names}")
        else:
            replace = True
            ctx.log(
                f"changed since ingested, the next version is rebuilt with their new content "
                f"(on_changed: replace-version): {names}"
            )
    if not new and not replace:
        if latest is None:
            raise InputError(f"{ctx.step.inputs['input']}: no .tns or .tns.gz files yet, and {out} has no version")
        if migrated:
            # records from before content hashes: keep the hashes now, so a later touch is recognized
            latest["files"] = records
            loc.write_text(loc.child(out, VERSIONS_FILE), json.dumps(versions, indent=1))
        ctx.log(f"no new content: {out} stays at version {latest['version']}")
        return {
            "version": latest["version"],
            "new_files": 0,
            "nnz": latest["nnz"],
            "shape": latest["shape"],
            "nothing_new": True,
        }
    for k in new:
        k["version"] = number
    old = open_store(loc.child(out, latest["path"])) if latest else None
    if replace:
        rebuilt, kept = _rebuild_sources(ctx, records, changed, keys, number)
        texts = rebuilt + [k["location"] for k in new]
        what = f"rebuilt from {len(texts)} file(s)"
        file_records = kept + new
    else:
        texts = [k["location"] for k in new]
        what = f"previous nonzeros + {len(new)} new file(s)"
        file_records = records + new
    need, est = _files_shape(texts, one_based)
    # the shape never shrinks: a warm start cannot drop rows
    shape = _grow(need, m.shape, old.shape if old else None)
    if old is not None and tuple(shape) != tuple(old.shape):
        grown = [f"mode {n}: {a} -> {b}" for n, (a, b) in enumerate(zip(old.shape, shape)) if a != b]
        ctx.log("the tensor grows: " + ", ".join(grown))

    def batches() -> Iterator:
        if old is not None and not replace:
            for ch in old.iter_chunks():
                yield ch.coords(old.layout), ch.values
        yield from _text_batches(texts, one_based, shape)

    name = f"v{number:06d}.zarr"
    target = loc.child(out, name)
    src = BatchSource(
        _cancellable(batches(), ctx),
        len(shape),
        shape,
        est + (old.nnz if old is not None and not replace else 0),
        name=f"{out} version {number}: {what}",
    )
    if old is not None and args.get("values_dtype") is None:
        args = {**args, "values_dtype": old.value_dtype.name}  # a version keeps the values' dtype
    store = convert(src, target, shape=shape, overwrite=True, **args)
    entry = {
        "version": number,
        "path": name,
        "nnz": store.nnz,
        "shape": list(store.shape),
        "files": file_records,
        "new_files": [k["location"] for k in new],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_id": ctx.recorder.record.run_id,
    }
    if replace:
        entry["replaced_files"] = [key["location"] for _, key in changed]
    versions["versions"].append(entry)
    dropped = []
    if m.keep_versions is not None:
        while len(versions["versions"]) > m.keep_versions:
            dropped.append(versions["versions"].pop(0))
    # the versions file is written last: until then readers keep seeing the previous version
    loc.write_text(loc.child(out, VERSIONS_FILE), json.dumps(versions, indent=1))
    for d in dropped:
        loc.remove(loc.child(out, d["path"]))
    ctx.log(
        f"version {number} of {out}: {store.nnz:,} nonzeros ({what}), shape "
        f"{'x'.join(map(str, store.shape))}"
        + (f"; dropped versions {[d['version'] for d in dropped]}" if dropped else "")
    )
    metrics = {"version": number, "new_files": len(new), "nnz": store.nnz, "shape": list(store.shape)}
    if changed:
        metrics["changed_files"] = [key["location"] for _, key in changed]
    return metrics


# --- decompose ----------------------------------------------------------------------------------------


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
    from ..execution import DeviceOptions

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
    opts = DeviceOptions(conflict=m.conflict, streams=m.streams, device_memory_limit=m.device_memory_limit)
    result = cp_als(
        store,
        m.rank,
        client=client,
        scheduler=scheduler,
        max_iters=m.max_iters,
        tol=m.tol,
        init=init,
        seed=m.seed,
        dtype=m.dtype,
        checkpoint=checkpoint,
        resume=resume,
        callback=_iteration_events(ctx, m.max_iters),
        execution=m.execution,
        checkpoint_every=m.checkpoint_every,
        partitions=m.partitions,
        out=out,
        overwrite=True,
        device=device,
        device_options=opts,
        method=m.solver,
        samples=m.samples,
        fit_every=m.fit_every,
        nonnegative=m.nonnegative,
        reg=m.reg,
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
    client, scheduler = _scheduler(ctx, m, store.nnz, "cpu")
    t0 = time.perf_counter()
    result = cp_apr(
        store,
        m.rank,
        algorithm=m.algorithm,
        client=client,
        scheduler=scheduler,
        max_iters=m.max_iters,
        max_inner_iters=m.max_inner_iters,
        tol=m.tol,
        init=init,
        seed=m.seed,
        kappa=m.kappa,
        kappa_tol=m.kappa_tol,
        eps_div_zero=m.eps_div_zero,
        eps_active=m.eps_active,
        mu0=m.mu0,
        inexact=m.inexact,
        checkpoint=checkpoint,
        resume=resume,
        checkpoint_every=m.checkpoint_every,
        callback=_iteration_events(ctx, m.max_iters),
        execution=m.execution,
        partitions=m.partitions,
        out=out,
        overwrite=True,
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
            method=m.algorithm,
            samples=m.samples,
            fit_every=m.fit_every,
            client=client,
            scheduler=scheduler,
            max_sweeps=m.max_iters,
            tol=m.tol,
            init=init,
            seed=m.seed,
            checkpoint=checkpoint,
            resume=resume,
            checkpoint_every=m.checkpoint_every,
            callback=_iteration_events(ctx, m.max_iters, key="sweep"),
            execution=m.execution,
            partitions=m.partitions,
            out=out,
            overwrite=True,
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
        client=client,
        scheduler=scheduler,
        max_iters=m.max_iters,
        tol=m.tol,
        init=init,
        seed=m.seed,
        svd=m.svd,
        kernel=m.kernel,
        device=device,
        checkpoint=checkpoint,
        resume=resume,
        checkpoint_every=m.checkpoint_every,
        callback=_iteration_events(ctx, m.max_iters),
        execution=m.execution,
        partitions=m.partitions,
        out=out,
        overwrite=True,
        progress=False,
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
            test=test,
            test_fraction=None if test is not None else fraction,
            epochs=m.epochs,
            batch=m.batch,
            lr_factors=m.lr_factors,
            lr_core=m.lr_core,
            reg_factors=m.reg_factors,
            reg_core=m.reg_core,
            seed=m.seed,
            client=client,
            patience=m.patience,
            progress=False,
            out=out,
            overwrite=True,
            threads=m.threads,
            device=device,
            scheduler=scheduler,
            partitions=m.partitions,
            lr_decay=m.lr_decay,
            step=m.step,
            rebalance=m.rebalance,
            revive_epochs=m.revive_epochs,
            callback=_iteration_events(ctx, m.epochs, key="epoch"),
            init=init,
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


# --- evaluate -----------------------------------------------------------------------------------------


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
        _save_npz(out, {**result.to_numpy(), "history": json.dumps(result.history), **arrays})
    elif m.format == "zarr":
        result.save(out, overwrite=True)
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


def run_predict(ctx: StepContext) -> dict:
    m: PredictStep = ctx.step.model  # type: ignore[assignment]
    src, coords_loc, out = ctx.step.inputs["result"], ctx.step.inputs["coords"], ctx.step.outputs["out"]
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
        _save_npz(out, {"coords": coords, "values": values})
        written = int(values.shape[0])
    else:
        header = (
            f"tensorflow_ooc predictions of the {KIND_NAMES[model.kind]} model {src} at the coordinates of {coords_loc}"
        )
        with loc.local_target(out) as tmp:
            written = synthetic.write_tns(tmp, predictions(), one_based=one_based, header=header)
    ctx.log(f"{written:,} predictions of {src} at {coords_loc} -> {out}")
    return {"predictions": int(written), "model": model.kind, "coords": coords_loc}


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
