"""The data steps: ``generate`` (a synthetic tensor as a store or a ``.tns`` file) and ``convert``
(``.tns`` files into a store, or appended as the next version of a versioned store, its files
recognized by content in ``versions.json``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import synthetic
from ..execution.mode_copies_build import build_mode_copies
from ..ingest import AltoRunSource, BatchSource, TextSource, convert
from ..ingest.table_options import TABLE_SUFFIXES
from ..store import open_store
from . import locations as loc
from .errors import InputError
from .step_context import TNS_SUFFIXES, VERSIONS_FILE, StepContext, cancellable, is_tns, read_versions, save_npz
from .step_models import ConvertStep, GenerateStep


def input_files(location: str, table: bool = False) -> list[str]:
    """The files a convert input names: one file, a glob's matches, or a folder's ``*.tns`` /
    ``*.tns.gz`` (a table's: its Parquet or CSV files), sorted by name, which is also the order
    new files are appended."""
    if loc.has_glob(location):
        return [m for m in loc.glob(location) if not loc.isdir(m)]
    if loc.isdir(location):
        suffixes = TABLE_SUFFIXES if table else TNS_SUFFIXES
        return [loc.child(location, n) for n in loc.listdir(location) if n.lower().endswith(suffixes)]
    return [location]


def _file_key(location: str) -> dict:
    i = loc.info(location)
    stamp = next((str(i[k]) for k in ("mtime", "LastModified", "created", "ETag") if i.get(k) is not None), None)
    return {"location": location, "size": int(i.get("size") or 0), "time": stamp}


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
        save_npz(
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
    batches = cancellable(batches, ctx)
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
        save_npz(factors, {"weights": poisson.weights, **{f"factor{n}": f for n, f in enumerate(poisson.factors)}})
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
    files = input_files(src_loc, table=m.modes is not None)
    one_based = not m.zero_based
    args = dict(
        duplicates=m.duplicates,
        chunk_nnz=m.chunk_nnz,
        max_block_nnz=m.max_block_nnz,
        compression=m.compression,
        values_dtype=m.values_dtype,
        memory_limit=m.memory_limit,
        fiber_index=m.fiber_index,
    )
    if m.modes is not None:
        args.update(modes=m.modes, value=m.value, bucket=m.bucket, table_format=m.table_format)
    if not m.append:
        if not files:
            raise InputError(f"{src_loc}: no {'Parquet or CSV' if m.modes else '.tns or .tns.gz'} files")
        if m.modes is not None:
            store = convert(files, out, overwrite=True, **args)
            ctx.log(f"{len(files)} table file(s) -> {out}: {store.nnz:,} nonzeros, shape {_labelled_shape(store)}")
            return {"nnz": store.nnz, "shape": list(store.shape), "files": len(files), "keys": _key_counts(store)}
        if len(files) == 1 and not loc.has_glob(src_loc) and not loc.isdir(src_loc):
            with loc.local_copy(files[0], suffix=".gz" if files[0].endswith(".gz") else ".tns") as lp:
                store = convert(lp, out, shape=m.shape, one_based=one_based, overwrite=True, **args)
        else:
            need, est = _files_shape(files, one_based)
            shape = _grow(need, m.shape)
            src = BatchSource(
                cancellable(_text_batches(files, one_based, shape), ctx),
                len(shape),
                shape,
                est,
                name=f"{len(files)} files of {src_loc}",
            )
            store = convert(src, out, shape=shape, overwrite=True, **args)
        ctx.log(f"{len(files)} file(s) -> {out}: {store.nnz:,} nonzeros, shape {'x'.join(map(str, store.shape))}")
        return {"nnz": store.nnz, "shape": list(store.shape), "files": len(files)}
    return _append_version(ctx, m, files, out, one_based, args)


def _labelled_shape(store) -> str:
    """``user 120 x item 40 x day 5`` for a store with labels, else ``120x40x5``."""
    if store.labels is None:
        return "x".join(map(str, store.shape))
    return " x ".join(f"{n} {s:,}" for n, s in zip(store.labels.names, store.shape))


def _key_counts(store) -> dict[str, int]:
    return {} if store.labels is None else dict(zip(store.labels.names, map(int, store.shape)))


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
    if m.modes is not None:
        return _append_table_version(ctx, m, out, args, versions, old, replace, texts, what, file_records, new, changed)
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

    name = _version_name(number)
    target = loc.child(out, name)
    src = BatchSource(
        cancellable(batches(), ctx),
        len(shape),
        shape,
        est + (old.nnz if old is not None and not replace else 0),
        name=f"{out} version {number}: {what}",
    )
    if old is not None and args.get("values_dtype") is None:
        args = {**args, "values_dtype": old.value_dtype.name}  # a version keeps the values' dtype
    if old is not None and args.get("fiber_index") is None and old.fiber_modes():
        args = {**args, "fiber_index": old.fiber_modes()}  # and its fiber index
    store = convert(src, target, shape=shape, overwrite=True, **args)
    if old is not None and old.copy_modes():
        # and its mode-sorted copies, written again for the new version's chunks (those of the
        # old version are bound to it and would be refused)
        store = build_mode_copies(store, old.copy_modes())
    return _record_version(ctx, m, out, versions, store, number, name, file_records, new, changed, replace, what)


def _version_name(number: int) -> str:
    return f"v{number:06d}.zarr"


def _append_table_version(ctx, m, out, args, versions, old, replace, files, what, file_records, new, changed) -> dict:
    """The next version of a versioned store of a table: the latest version's nonzeros and label
    dictionaries, then the new files' rows, whose new keys get the next indices (old keys keep
    theirs, so a warm start from the last result lines up); each growing mode is reported."""
    number = versions["versions"][-1]["version"] + 1 if versions["versions"] else 1
    name = _version_name(number)
    target = loc.child(out, name)
    base = None if replace else old
    if old is not None and args.get("values_dtype") is None:
        args = {**args, "values_dtype": old.value_dtype.name}  # a version keeps the values' dtype
    if old is not None and args.get("fiber_index") is None and old.fiber_modes():
        args = {**args, "fiber_index": old.fiber_modes()}  # and its fiber index
    ctx.check_cancel()
    store = convert(files, target, overwrite=True, append_to=base, **args)
    if old is not None and old.labels is not None and store.labels is not None:
        if old.labels.names != store.labels.names:
            raise InputError(f"{out}: the modes were {old.labels.names}, the step names {store.labels.names}")
        grown = {
            n: {"from": int(a), "to": int(b), "new_keys": int(b - a)}
            for n, a, b in zip(store.labels.names, old.shape, store.shape)
            if b != a
        }
    else:
        grown = {n: {"from": 0, "to": int(b), "new_keys": int(b)} for n, b in _key_counts(store).items()}
    if grown:
        ctx.log(
            "the tensor grows: "
            + ", ".join(f"{n} {g['from']:,} -> {g['to']:,} (+{g['new_keys']:,} new keys)" for n, g in grown.items())
        )
    metrics = _record_version(ctx, m, out, versions, store, number, name, file_records, new, changed, replace, what)
    metrics.update(grown=grown, keys=_key_counts(store))
    return metrics


def _record_version(ctx, m, out, versions, store, number, name, file_records, new, changed, replace, what) -> dict:
    """Record version ``number`` in the versions file (written last), drop the versions beyond
    ``keep_versions``, and return the step's metrics."""
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
        f"{_labelled_shape(store)}" + (f"; dropped versions {[d['version'] for d in dropped]}" if dropped else "")
    )
    metrics = {"version": number, "new_files": len(new), "nnz": store.nnz, "shape": list(store.shape)}
    if changed:
        metrics["changed_files"] = [key["location"] for _, key in changed]
    return metrics
