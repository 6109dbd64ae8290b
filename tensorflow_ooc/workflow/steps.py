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
from ..decompositions import CPResult, cp_als, load_result, read_checkpoint
from ..errors import StoreError
from ..execution.inline import INLINE_MAX_NNZ
from ..ingest import BatchSource, TextSource, convert
from ..store import Store, open_store
from . import locations as loc
from .errors import InputError, StepFailed
from .evaluation import factor_match, load_model, model_fit
from .records import Recorder
from .spec import ConvertStep, DecomposeStep, EvaluateStep, ExportStep, GenerateStep, PlannedStep, Workflow

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
    else:
        skew = m.skew if m.skew is not None else 1.6
        batches = synthetic.iter_heavy_tailed(shape, nnz, skew=skew, seed=m.seed, values=m.values)
    batches = _cancellable(batches, ctx)
    if is_tns(out):
        with loc.local_target(out) as tmp:
            written = synthetic.write_tns(tmp, batches, one_based=not m.zero_based, header=header)
    else:
        src = BatchSource(batches, len(shape), shape, nnz, name="synthetic generator")
        written = convert(src, out, shape=shape, overwrite=True).nnz
    metrics["nnz"] = int(written)
    ctx.log(f"wrote {written:,} nonzeros to {out}")
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
    version (see :class:`~tensorflow_ooc.workflow.spec.ConvertStep` for changed files)."""
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


def run_decompose(ctx: StepContext) -> dict:
    m: DecomposeStep = ctx.step.model  # type: ignore[assignment]
    from ..execution import DeviceOptions

    store = open_input_store(ctx.step.inputs["input"])
    out = ctx.step.outputs["out"]
    # randomized methods run on CPU workers (any worker of a GPU cluster runs them)
    device = m.device or ("cpu" if m.method != "exact" else ctx.default_device)
    # init: random, a warm start from the previous result at 'previous' (default out), or a result
    init: Any = "random"
    warm = m.warm_start_location()
    if warm is not None:
        warm = loc.normalize(warm, base=ctx.workflow.root)
        if loc.exists(warm):
            prev = load_result(warm)
            init, notes = warm_start(prev, store.shape, m.rank, m.seed)
            ctx.log(
                f"warm start from {warm} (fit {prev.fit:.6f} after {prev.iterations} iterations)"
                + (f"; {notes}" if notes else "")
            )
        elif m.init == "previous":
            ctx.log(f"no previous result at {warm} yet: random initial factors")
        else:
            raise InputError(f"init: {warm} does not exist")
    # the checkpoint belongs to this step's fingerprint: a resume never mixes settings or inputs
    checkpoint = ctx.state_dir("checkpoints", f"{ctx.step.name}-{ctx.fingerprint[:16]}.npz")
    resume = False
    state = read_checkpoint(checkpoint) if loc.exists(checkpoint) else None
    if state is not None:
        if state.input.get("store_id") == store.meta["store_id"] and state.params.get("rank") == m.rank:
            resume = True
            ctx.log(
                f"resuming from the checkpoint after iteration {state.iteration + 1} (fit {state.fit:.6f})",
                resumed_after=state.iteration + 1,
            )
            ctx.recorder.step(ctx.step.name, resumed_from_iteration=state.iteration + 1)
        else:
            loc.remove(checkpoint)
    client, scheduler = None, None
    if m.scheduler == "inline" or (m.scheduler == "auto" and store.nnz <= INLINE_MAX_NNZ and device != "gpu"):
        scheduler = "inline"  # Dask's per-task cost would dominate (see execution/inline.py)
    else:
        client = ctx.client_for(device)
    t0 = time.perf_counter()

    def progress(record: dict) -> None:
        rec = {k: record[k] for k in ("iteration", "fit", "fit_change", "seconds") if k in record}
        ctx.recorder.step(ctx.step.name, save=False, progress=rec)
        ctx.recorder.event(
            "iteration",
            "",
            step=ctx.step.name,
            echo=False,
            **{k: v for k, v in record.items() if k != "iteration"},
            iteration=record["iteration"],
            max_iters=m.max_iters,
        )
        ctx.check_cancel()

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
        callback=progress,
        execution=m.execution,
        checkpoint_every=m.checkpoint_every,
        partitions=m.partitions,
        out=out,
        overwrite=True,
        device=device,
        device_options=opts,
        method=m.method,
        samples=m.samples,
        fit_every=m.fit_every,
    )
    wall = time.perf_counter() - t0
    loc.remove(checkpoint)  # the result is published: the checkpoint has served
    new = result.history[result.params.get("resumed_after", 0) :]
    steady = new[1:] or new
    per_it = sum(h["seconds"] for h in steady) / max(1, len(steady))
    metrics = {
        "fit": result.fit,
        "iterations": result.iterations,
        "iterations_this_run": len(new),
        "seconds_per_iteration": per_it,
        "first_iteration_seconds": new[0]["seconds"] if new else None,
        "nnz": store.nnz,
        "rank": m.rank,
        "method": m.method,
        "execution": result.params.get("execution"),
        "device": result.params.get("device"),
        "scheduler": result.params.get("scheduler"),
        "nnz_modes_per_second": store.nnz * store.nmodes / max(per_it, 1e-12),
        "wall_seconds": wall,
        "input_store": store.path,
        "warm_start": warm if not isinstance(init, str) else None,
    }
    ctx.log(
        f"rank {m.rank}: fit {result.fit:.6f} after {result.iterations} iterations, {per_it:.3f} s per "
        f"iteration steady state -> {out}"
    )
    return metrics


# --- evaluate -----------------------------------------------------------------------------------------


def run_evaluate(ctx: StepContext) -> dict:
    m: EvaluateStep = ctx.step.model  # type: ignore[assignment]
    result_loc = ctx.step.inputs["result"]
    model = load_model(result_loc)
    metrics: dict[str, Any] = {"result": result_loc, "rank": model.rank}
    if loc.isdir(result_loc):
        r = load_result(result_loc)
        metrics.update(fit_reported=r.fit, iterations=r.iterations)
    if "tensor" in ctx.step.inputs:
        store = open_input_store(ctx.step.inputs["tensor"])
        metrics["tensor"] = store.path
        metrics["fit"] = model_fit(store, model)
    elif "fit_reported" in metrics:
        metrics["fit"] = metrics["fit_reported"]
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
        f"fit {metrics['fit']:.6f}" if "fit" in metrics else None,
        f"factor match score {metrics['fms']:.4f} (congruence {metrics['congruence']:.4f}) against "
        f"{metrics['reference']}"
        if "fms" in metrics
        else None,
    ]
    ctx.log("; ".join(p for p in parts if p))
    failed = []
    if m.min_fit is not None and metrics.get("fit", -math.inf) < m.min_fit:
        failed.append(f"fit {metrics.get('fit', float('nan')):.6f} < min_fit {m.min_fit}")
    if m.min_fms is not None and metrics.get("fms", -math.inf) < m.min_fms:
        failed.append(f"factor match score {metrics['fms']:.4f} < min_fms {m.min_fms}")
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
    result = load_result(src)
    if m.format == "npz":
        _save_npz(out, {**result.to_numpy(), "history": json.dumps(result.history), "fit": result.fit})
    elif m.format == "zarr":
        result.save(out, overwrite=True)
    elif m.format == "tensorly":
        loc.write_bytes(out, pickle.dumps(result.to_tensorly()))
    elif m.format == "pyttb":
        import pyttb

        with loc.local_target(out) as tmp:
            pyttb.export_data(result.to_pyttb(), tmp)
    ctx.log(f"{m.format} export of {src} -> {out}")
    return {"format": m.format, "rank": result.rank, "fit": result.fit}


RUNNERS: dict[str, Callable[[StepContext], dict]] = {
    "generate": run_generate,
    "convert": run_convert,
    "decompose": run_decompose,
    "evaluate": run_evaluate,
    "export": run_export,
}


def run_step(ctx: StepContext) -> dict:
    """Run one step; returns its metrics."""
    return RUNNERS[ctx.step.kind](ctx)
