"""``tfooc``: the command-line interface.

Every command logs what it is doing to stderr, shows progress bars on long steps (``--quiet``
turns both off), and on bad input prints one ``tfooc: error: ...`` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Sequence

log = logging.getLogger("tensorflow_ooc.cli")

DEFAULT_STORAGE = Path(os.environ.get("TFOOC_STORAGE", "storage"))
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """'512MB', '2GiB', '1000000' -> bytes."""
    m = _SIZE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512MB, 2GiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _positive_ints(text: str, refusal: str, example: str, rule: str) -> tuple[int, ...]:
    """'8,8,8', '183x24' or '8' -> positive integers; ``refusal`` starts the error message."""
    try:
        values = tuple(int(s) for s in re.split(r"[x,\s]+", text.strip()) if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{refusal}: {text!r} (example: {example})") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{refusal}: {text!r}: {rule}")
    return values


def parse_shape(text: str) -> tuple[int, ...]:
    return _positive_ints(text, "not a shape", "183,24,1140,1717", "mode lengths must be >= 1")


def parse_skew(text: str) -> float | tuple[float, ...]:
    vals = tuple(float(s) for s in text.split(","))
    return vals[0] if len(vals) == 1 else vals


#: the largest count (rank, iterations, samples, ...) a command takes; the memory plan judges
#: what fits, this only keeps numbers in the range integers are computed in
MAX_COUNT = 2**62


def _count(text: str, low: int) -> int:
    """An integer >= ``low`` written as '16', '1e3' or '1_000'; NaN, infinities and fractions are
    refused here, at parse time, rather than truncated or passed on."""
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        v = int(f)
    if v < low or v > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be an integer in [{low}, 2^62], got {text}")
    return v


def _positive_int(text: str) -> int:
    return _count(text, 1)


def _nonnegative_int(text: str) -> int:
    return _count(text, 0)


def _tolerance(text: str) -> float:
    """A finite number >= 0 (``--tol``): NaN, infinities and negative numbers are refused."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def _finite_float(text: str) -> float:
    """A finite number (rates, regularization): NaN and infinities are refused at parse time."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return v


def _fraction(text: str) -> float:
    """A number strictly between 0 and 1 (``--test-fraction``)."""
    v = _finite_float(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return v


# --- commands -------------------------------------------------------------------------------------

def cmd_generate(args: argparse.Namespace) -> int:
    import numpy as np

    from . import synthetic
    from .ingest import AltoRunSource, BatchSource, convert

    if args.dense:
        return _generate_dense(args)
    shape, nnz = args.shape, args.nnz
    if args.like:
        pshape, pnnz = synthetic.PRESETS[args.like]
        shape = shape or pshape
        nnz = nnz or pnnz
    if shape is None or nnz is None:
        raise ValueError("give --shape and --nnz, or --like NAME")
    out = str(args.out)
    text = out.endswith(".tns") or out.endswith(".tns.gz")
    t0 = time.perf_counter()
    header = f"tensorflow_ooc synthetic {args.kind} tensor, shape {','.join(map(str, shape))}, seed {args.seed}"
    if args.kind == "planted":
        planted = synthetic.planted_cp(shape, args.rank, nnz, noise=args.noise, seed=args.seed, skew=args.skew)
        batches = iter([(planted.coords, planted.values)])
        factors_path = (out[:-7] if out.endswith(".tns.gz") else out[:-4] if text else out.rstrip("/")) + ".factors.npz"
        np.savez(factors_path, weights=planted.weights, **{f"factor{n}": f for n, f in enumerate(planted.factors)})
        log.info("true factors written to %s", factors_path)
        nnz = planted.coords.shape[0]
        gen = None
    else:
        gen = synthetic.HeavyTailedGenerator(shape, nnz, skew=args.skew, seed=args.seed, values=args.values)
        batches = synthetic.iter_heavy_tailed(shape, nnz, skew=args.skew, seed=args.seed, values=args.values)
    from tqdm.auto import tqdm

    # a store from the heavy-tailed generator gets convert's own bars (generate/partition, merge+write)
    bar = tqdm(total=nnz, desc="generate", unit="nz", unit_scale=True, leave=False,
               disable=args.quiet or (gen is not None and not text))

    def counted(it, axis=0):
        for c, v in it:
            bar.update(c.shape[axis])
            yield c, v

    log.info("generating %s nonzeros of a %s tensor shaped %s -> %s", f"{nnz:,}", args.kind, shape, out)
    if text:
        if os.path.exists(out) and not args.overwrite:
            raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
        synthetic.write_tns(out, counted(batches), one_based=not args.zero_based, header=header)
    elif gen is not None:
        # sorted ALTO runs straight into the store: merged, not sorted; values recomputed, not spilled
        src = AltoRunSource(gen.runs(with_values=False), shape, nnz, values_of=gen.values_of,
                            name="synthetic generator")
        convert(src, out, overwrite=args.overwrite, progress=not args.quiet, memory_limit=args.memory_limit,
                tmp_dir=args.tmp_dir, out_of_core=args.out_of_core or None, compression=args.compression)
    else:
        src = BatchSource(counted(batches), len(shape), shape, nnz, name="synthetic generator")
        convert(src, out, shape=shape, overwrite=args.overwrite, progress=False, memory_limit=args.memory_limit,
                tmp_dir=args.tmp_dir, out_of_core=args.out_of_core or None, compression=args.compression)
    bar.close()
    log.info("wrote %s in %.1f s", out, time.perf_counter() - t0)
    print(out)
    return 0


def _generate_dense(args: argparse.Namespace) -> int:
    """``generate --dense SHAPE``: a planted rank-R dense Zarr array, written chunk by chunk, and
    its true factors beside it (OUT.factors.npz), as the sparse planted generator does."""
    import numpy as np

    from . import synthetic

    out = str(args.out).rstrip("/")
    if out.endswith(".tns") or out.endswith(".tns.gz"):
        raise ValueError(f"{out}: a dense tensor is written as a Zarr array; give a directory path or URL")
    if args.chunks is not None and len(args.chunks) != len(args.dense):
        raise ValueError(f"--chunks has {len(args.chunks)} lengths for a tensor of order {len(args.dense)}")
    t0 = time.perf_counter()
    log.info("generating a planted rank-%d dense tensor shaped %s (noise %g) -> %s", args.rank, args.dense,
             args.noise, out)
    weights, factors = synthetic.write_planted_dense(out, args.dense, args.rank, noise=args.noise, seed=args.seed,
                                                     chunks=args.chunks, dtype=args.dtype, codec=args.codec,
                                                     overwrite=args.overwrite, progress=not args.quiet)
    factors_path = out + ".factors.npz"
    np.savez(factors_path, weights=weights, **{f"factor{n}": f for n, f in enumerate(factors)})
    log.info("true factors written to %s; wrote %s in %.1f s", factors_path, out, time.perf_counter() - t0)
    print(out)
    return 0


def _format_dense_info(info: dict) -> str:
    lines = [
        f"array        {info['path']}  ({info['kind']})",
        f"shape        {' x '.join(map(str, info['shape']))}  (order {info['order']}, {info['dtype']})",
        f"chunks       {' x '.join(map(str, info['chunks']))}  ({info['nchunks']:,} chunks of "
        f"{info['chunk_bytes']:,} bytes at most)",
        f"bytes        {info['bytes']:,}" + (f"  ({info['bytes_on_disk']:,} on disk, compressors "
                                              f"{', '.join(info['compressors']) or 'none'})"
                                              if "bytes_on_disk" in info else ""),
    ]
    if "norm" in info:
        lines.append(f"norm         {info['norm']:.6g}")
    if "planted" in info:
        p = info["planted"]
        lines.append(f"planted      rank {p['rank']}, noise {p['noise']:g}, seed {p['seed']}")
    return "\n".join(lines)


def cmd_convert(args: argparse.Namespace) -> int:
    from .ingest import convert

    t0 = time.perf_counter()
    store = convert(args.input, args.store, shape=args.shape, one_based=not args.zero_based,
                    duplicates=args.duplicates, chunk_nnz=args.chunk_nnz, max_block_nnz=args.max_block_nnz,
                    memory_limit=args.memory_limit, overwrite=args.overwrite, progress=not args.quiet,
                    workers=args.workers, tmp_dir=args.tmp_dir, compression=args.compression,
                    out_of_core=args.out_of_core or None)
    dt = time.perf_counter() - t0
    print(f"{store.path}: {store.nnz:,} nonzeros, shape {'x'.join(map(str, store.shape))}, "
          f"{store.nblocks} blocks, {store.nchunks} chunks, {dt:.2f} s ({store.nnz / dt / 1e6:.2f} M nonzeros/s)")
    return 0


def _chunk_text(info: dict) -> str:
    """Chunks and how full they are: ``chunk_nnz`` is the capacity of a chunk, not its size (a
    9.5 k-nonzero store is one chunk of 9.5 k nonzeros, with room for 1 M)."""
    n, cap, nnz = info["chunks"], info["chunk_nnz"], info["nnz"]
    if n <= 1:
        held = f"{nnz:,} nonzeros" if n == 1 else "empty"
        return f"{n:,}  ({held}; capacity {cap:,} nonzeros per chunk, {info['compression']})"
    last = nnz - (n - 1) * cap
    return (f"{n:,}  ({cap:,} nonzeros each, the last {last:,}; {info['compression']})" if last != cap
            else f"{n:,}  ({cap:,} nonzeros each, {info['compression']})")


def _format_info(info: dict) -> str:
    lines = [
        f"store        {info['path']}  (BLCO format v{info['format_version']})",
        f"shape        {' x '.join(map(str, info['shape']))}",
        f"nonzeros     {info['nnz']:,}  (density {info['density']:.3g}, values {info['value_dtype']})",
        f"norm         {info['norm']:.6g}",
        f"blocks       {info['blocks']:,}  (nonzeros per block {info['block_nnz_min']:,} .. {info['block_nnz_max']:,})",
        f"chunks       {_chunk_text(info)}",
        f"on disk      {info['bytes_on_disk']:,} bytes = {info['bytes_per_nnz']:.2f} bytes/nonzero, "
        f"{100 * info['compression_ratio']:.1f} % of raw COO ({info['raw_coo_bytes']:,} bytes)",
        f"index bits   {info['layout']['total_bits']} ({info['layout']['index_bits']} per nonzero, "
        f"{info['layout']['total_bits'] - info['layout']['index_bits']} in block keys)",
        "",
        f"{'mode':>4} {'length':>12} {'bits':>5} {'key bits':>8} {'chunk span mean':>16} {'chunk span max':>15}",
    ]
    for m in info["modes"]:
        lines.append(f"{m['mode']:>4} {m['length']:>12,} {m['bits']:>5} {m['key_bits']:>8} "
                     f"{m['chunk_index_span_mean']:>16,.1f} {m['chunk_index_span_max']:>15,}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from .store import open_store
    from .store.dense import is_dense_array, open_dense

    if is_dense_array(args.store):
        info = open_dense(args.store).info()
        print(json.dumps(info, indent=2) if args.json else _format_dense_info(info))
        return 0
    info = open_store(args.store).info()
    print(json.dumps(info, indent=2) if args.json else _format_info(info))
    return 0


def run_outputs(args: argparse.Namespace, tag: str) -> tuple[str, str]:
    """The result store and checkpoint paths of a decomposition command (``--out``, default
    ``STORE.<tag>.zarr``; ``--checkpoint``, default beside it), refusing to replace an earlier
    result without ``--overwrite`` or ``--resume``; a fresh ``--overwrite`` run drops the old
    checkpoint so it never resumes from the old run's state."""
    from .store import paths

    out = args.out or f"{str(args.store).rstrip('/')}.{tag}.zarr"
    checkpoint = args.checkpoint or f"{out}.checkpoint.npz"
    if paths.exists(out) and not (args.overwrite or args.resume):
        # an earlier result and its checkpoint would be replaced without a word: refuse, as
        # cp_als(out=...) does, and say how to go on
        raise FileExistsError(f"{out} holds the result of an earlier run; pass --out NEW to keep it, --overwrite "
                              f"to replace it, or --resume to continue from its checkpoint")
    if args.resume and not paths.exists(checkpoint):
        raise FileNotFoundError(f"--resume: there is no checkpoint at {checkpoint} to continue from; run without "
                                f"--resume to start afresh, or give --checkpoint PATH")
    if paths.exists(checkpoint) and not (args.overwrite or args.resume):
        # a run that stopped before writing its result left this: starting afresh would replace it
        raise FileExistsError(f"{checkpoint} holds the checkpoint of an earlier run that did not finish; pass "
                              f"--resume to continue it, or --overwrite to start over and replace it")
    if args.overwrite and not args.resume and paths.exists(checkpoint):
        paths.remove(checkpoint)
    return out, checkpoint


def iteration_bar(args: argparse.Namespace, desc: str):
    """A progress bar over ``--max-iters`` iterations and the callback that moves it (fit, change,
    seconds per iteration from each history record)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=args.max_iters, desc=desc, unit="it", disable=args.quiet, leave=False)

    def progress(record: dict) -> None:
        bar.n = record["iteration"]
        bar.set_postfix(fit=f"{record['fit']:.6f}", dfit=f"{record['fit_change']:.1e}",
                        s_per_it=f"{record['seconds']:.3f}")

    return bar, progress


def cmd_cpd(args: argparse.Namespace) -> int:

    from .decompositions import cp_als
    from .decompositions.cp_als import open_input
    from .execution import DeviceOptions
    from .store.dense import DenseArray

    store = open_input(args.store)      # a BLCO store or a dense Zarr array
    entries, entry = ("entries", "entry") if isinstance(store, DenseArray) else ("nonzeros", "nonzero")
    out, checkpoint = run_outputs(args, f"cp-r{args.rank}")
    bar, progress = iteration_bar(args, "cp-als")

    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.perf_counter()
    # the bar is closed (its line cleared) on errors too, before the one error line
    with bar, logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        result = cp_als(store, args.rank, scheduler=args.scheduler, max_iters=args.max_iters, tol=args.tol,
                        seed=args.seed, dtype=args.dtype, checkpoint=checkpoint, resume=args.resume,
                        callback=progress, execution=args.execution, out=out, overwrite=True, device=args.device,
                        method=args.method, samples=args.samples, fit_every=args.fit_every,
                        device_options=DeviceOptions(conflict=args.conflict, streams=args.streams,
                                                     device_memory_limit=args.device_memory_limit))
    wall = time.perf_counter() - t0
    new = result.history[result.params.get("resumed_after", 0):]
    # the first iteration of a process also compiles (or loads) the kernels: reported apart
    steady = new[1:] or new
    per_it = sum(h["seconds"] for h in steady) / max(1, len(steady))
    how = "" if args.method == "exact" else f", {args.method} sampling of {args.samples:,} rows"
    print(f"CP-ALS rank {args.rank}{how} on {store.path} ({store.nnz:,} {entries}, "
          f"{result.params['execution']} execution "
          f"on {result.params['device']}, "
          f"{'in this process' if result.params.get('scheduler') == 'inline' else 'Dask graph'})")
    print(f"  fit            {result.fit:.6f} after {result.iterations} iterations")
    if not new:
        # nothing ran: no time per iteration, no throughput to report
        print(f"  this run       no iterations: the checkpoint had already reached --max-iters "
              f"{args.max_iters} or converged ({wall:.1f} s wall)")
    else:
        print(f"  first iter     {new[0]['seconds']:.3f} s  (includes kernel compilation or cache loading)")
        print(f"  per iteration  {per_it:.3f} s  steady state ({store.nnz * store.nmodes / max(per_it, 1e-12) / 1e6:.1f} "
              f"M {entry}-modes/s; {len(new)} iterations in this run, {wall:.1f} s wall)")
    if new and steady:
        parts = {k: sum(sum(h[k]) if isinstance(h[k], list) else h[k] for h in steady) / len(steady)
                 for k in ("mttkrp_seconds", "update_seconds", "other_seconds")}
        what = "MTTKRP" if args.method == "exact" else "sampled MTTKRP (+ exact for the fit)"
        print(f"  of which       {what} {parts['mttkrp_seconds']:.3f} s, updates {parts['update_seconds']:.3f} s, "
              f"scheduling and transfers {parts['other_seconds']:.3f} s")
        if args.method != "exact":
            draw = sum(sum(h.get("sampling_seconds", [])) for h in steady) / len(steady)
            print(f"                 drawing samples {draw:.3f} s")
    print(f"  result         {out}")
    print(f"  checkpoint     {checkpoint}")
    return 0


def parse_ranks(text: str) -> tuple[int, ...]:
    """'8,8,8' or '8' -> factor ranks."""
    return _positive_ints(text, "not ranks", "8,8,8", "every rank must be >= 1")


def cmd_complete(args: argparse.Namespace) -> int:
    from .decompositions import tucker_sgd
    from .store import open_store, paths

    store = open_store(args.store)
    out = args.out or f"{str(args.store).rstrip('/')}.fasttucker-r{args.core_rank}.zarr"
    if paths.exists(out) and not args.overwrite:
        raise FileExistsError(f"{out} holds an earlier result; pass --out NEW to keep it or --overwrite to replace it")
    ranks = args.ranks[0] if len(args.ranks) == 1 else args.ranks
    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.perf_counter()
    with logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        training = {k: getattr(args, k) for k in ("lr_factors", "lr_core", "lr_decay", "reg_factors", "reg_core",
                                                   "step", "rebalance", "revive_epochs")}
        fraction = args.test_fraction if args.test is not None or args.test_fraction is not None else 0.1
        result = tucker_sgd(store, ranks, args.core_rank, test=args.test,
                            test_fraction=None if args.test is not None else fraction, epochs=args.epochs,
                            batch=args.batch, seed=args.seed, patience=args.patience, **training, progress=not args.quiet, out=out, overwrite=args.overwrite,
                            scheduler=args.scheduler, device=args.device, threads=args.threads)
    wall = time.perf_counter() - t0
    h = result.history
    steady = h[1:] or h
    print(f"FastTuckerPlus completion of {store.path} (ranks {','.join(map(str, result.ranks))}, core rank "
          f"{result.core_rank}; {result.params['n_train']:,} training, {result.params['n_test']:,} test entries)")
    print(f"  test RMSE      {result.test_rmse:.6g} (MAE {result.test_mae:.6g}) at epoch {result.best_epoch} "
          f"of {result.epochs}")
    print(f"  per epoch      {sum(r['seconds'] for r in steady) / len(steady):.3f} s steady state: factor pass "
          f"{sum(r['factor_seconds'] for r in steady) / len(steady):.3f} s, core pass "
          f"{sum(r['core_seconds'] for r in steady) / len(steady):.3f} s ({wall:.1f} s wall)")
    print(f"  result         {out}")
    return 0


def find_quickstart_spec() -> Path:
    """``workflows/quickstart.yaml``: from ``$TFOOC_WORKFLOWS``, the source tree this package runs
    from, or the current directory."""
    candidates = [Path(os.environ["TFOOC_WORKFLOWS"]) / "quickstart.yaml"] if os.environ.get("TFOOC_WORKFLOWS") else []
    candidates += [Path(__file__).resolve().parent.parent / "workflows" / "quickstart.yaml",
                   Path("workflows") / "quickstart.yaml"]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError("workflows/quickstart.yaml not found (looked in " + ", ".join(map(str, candidates))
                            + "); run tfooc run PATH/TO/quickstart.yaml, or set TFOOC_WORKFLOWS")


def cmd_quickstart(args: argparse.Namespace) -> int:
    """The main job: ``tfooc run workflows/quickstart.yaml``."""
    spec = find_quickstart_spec()
    log.info("quickstart: tfooc run %s", spec)
    args.spec, args.scheduler, args.force = str(spec), None, args.force
    return cmd_run(args)


# --- workflows ----------------------------------------------------------------------------------------

def _load(args: argparse.Namespace):
    from .workflow import load_spec

    return load_spec(args.spec, storage=args.storage, allow_paths=getattr(args, "allow_paths", None))


def cmd_run(args: argparse.Namespace) -> int:
    from .workflow.report import run_summary
    from .workflow.runner import execute

    workflow = _load(args)          # a bad spec raises SpecError: exit 2, nothing started
    outcome = execute(workflow, cluster=args.scheduler, force=args.force)
    print(run_summary(outcome.record))
    if outcome.state == "failed":
        print(f"tfooc: run {outcome.run_id} failed: {outcome.record.error}\n  details: tfooc logs {outcome.run_id}"
              f" --storage {workflow.root}\n  after fixing the cause, run the spec again: finished steps are "
              "skipped and CP-ALS resumes from its checkpoint", file=sys.stderr)
    return outcome.exit_code


def cmd_submit(args: argparse.Namespace) -> int:
    from .workflow.submit import submit

    workflow = _load(args)
    try:
        run_id = submit(workflow, args.scheduler, force=args.force)
    except (OSError, TimeoutError) as exc:
        print(f"tfooc: error: could not submit to {args.scheduler}: {exc}", file=sys.stderr)
        return 1
    log.info("submitted run %s to %s; follow it with: tfooc status %s --storage %s  (or tfooc logs -f %s)",
             run_id, args.scheduler, run_id, workflow.root, run_id)
    print(run_id)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .workflow.records import EXIT_CODES, RunStore
    from .workflow.report import run_summary, status_table, to_json
    from .workflow.submit import wait

    runs = RunStore(args.storage)
    if not args.run:
        records = runs.list(limit=None if args.all else 20)
        print(json.dumps([json.loads(r.model_dump_json()) for r in records], indent=1) if args.json
              else status_table(records))
        return 0
    rec = wait(args.storage, args.run, timeout=args.timeout) if args.wait else runs.read(args.run)
    print(to_json(rec) if args.json else run_summary(rec))
    if args.wait:
        return EXIT_CODES.get(rec.state, 1) if rec.exit_code is None else rec.exit_code
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from .workflow.records import RunStore
    from .workflow.report import format_event

    runs = RunStore(args.storage)
    run_id = runs.resolve(args.run)
    shown = 0
    while True:
        events = runs.events(run_id)
        for ev in events[shown:]:
            print(json.dumps(ev) if args.json else format_event(ev), flush=True)
        shown = len(events)
        if not args.follow:
            return 0
        rec = runs.read(run_id)
        if rec.final or rec.display_state() == "lost":
            events = runs.events(run_id)
            for ev in events[shown:]:
                print(json.dumps(ev) if args.json else format_event(ev), flush=True)
            return 0
        time.sleep(0.5)


def cmd_cancel(args: argparse.Namespace) -> int:
    from .workflow.submit import cancel, wait

    rec = cancel(args.storage, args.run)
    if rec.final and rec.state != "cancelled":
        print(f"run {rec.run_id} already {rec.state}: nothing to cancel")
        return 0
    if rec.state == "cancelled":
        print(f"run {rec.run_id} cancelled")
        return 0
    print(f"run {rec.run_id}: cancel requested; it stops before its next step or CP-ALS iteration")
    if args.wait:
        rec = wait(args.storage, rec.run_id, timeout=args.timeout)
        print(f"run {rec.run_id} {rec.display_state()}")
    return 0


# --- parser -----------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one error line: ``tfooc: error: cpd: argument --tol: ...`` and a
    pointer to ``--help`` (exit 2), the same form every other bad input gets."""

    def error(self, message: str):
        command = self.prog.removeprefix("tfooc").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_BAD_INPUT, f"tfooc: error: {where}{message} (see '{self.prog} --help')\n")

def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .synthetic import PRESETS, VALUE_KINDS

    p = _Parser(
        prog="tfooc",
        description="Out-of-core sparse tensor decomposition on BLCO Zarr stores.",
        epilog="Exit status: 0 on success, 2 on bad input (the message names the file, line or field), "
               "1 on internal errors, 130 when interrupted. Docs: README.md and docs/FORMAT.md.")
    p.add_argument("--version", action="version", version=f"tfooc {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and only warnings in the log")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # -q/-v are accepted after the subcommand too (tfooc cpd STORE -q); SUPPRESS keeps a value given
    # before the subcommand when none is given after it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars and only warnings in the log")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
    # monitoring and deployment (tensorflow_ooc/monitoring): log format and Dask TLS, also after the subcommand
    for parser, default in ((p, None), (common, argparse.SUPPRESS)):
        parser.add_argument("--log-format", choices=["text", "json"], default=default or "text",
                            help="log lines as text (default) or one JSON object per line (time, level, logger, "
                                 "message, run_id, step, iteration)")
        parser.add_argument("--tls-ca-file", metavar="CA", default=default,
                            help="Dask TLS: CA certificate of a tls:// scheduler (with --tls-cert, --tls-key)")
        parser.add_argument("--tls-cert", metavar="CERT", default=default, help="Dask TLS: this client's certificate")
        parser.add_argument("--tls-key", metavar="KEY", default=default,
                            help="Dask TLS: this client's private key (unless CERT holds it)")

    def add(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)


    g = add("generate", help="write a synthetic sparse tensor (.tns, .tns.gz or a store), or with --dense a planted "
                             "dense Zarr array",
                       description="Write a synthetic sparse tensor: heavy-tailed slice sizes like real data, "
                                   "or a planted low-rank CP model on such a support. The output kind follows "
                                   "the name: *.tns, *.tns.gz (text, 1-based) or anything else (a BLCO store).")
    g.add_argument("out", help="output path: FILE.tns, FILE.tns.gz, or a store path / URL")
    g.add_argument("--like", choices=sorted(PRESETS), help="shape and nonzero count of a FROSTT-like tensor")
    g.add_argument("--shape", type=parse_shape, help="mode lengths, e.g. 183,24,1140,1717 (overrides --like)")
    g.add_argument("--nnz", type=_positive_int, help="number of nonzeros (overrides --like; 1e6 style allowed)")
    g.add_argument("--kind", choices=["heavy-tailed", "planted"], default="heavy-tailed",
                   help="heavy-tailed support with random values, or planted CP (default heavy-tailed)")
    g.add_argument("--rank", type=_positive_int, default=8, help="rank of the planted model (default 8)")
    g.add_argument("--noise", type=_tolerance, default=0.0, help="planted: noise std relative to the values' std")
    g.add_argument("--skew", type=parse_skew, default=1.6,
                   help="power-law exponent per mode (1 = uniform; one value or one per mode; default 1.6)")
    g.add_argument("--values", choices=VALUE_KINDS, default="uniform",
                   help="value distribution for heavy-tailed tensors (default uniform in (0, 1])")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--zero-based", action="store_true", help="write 0-based indices to .tns (default 1-based)")
    g.add_argument("--memory-limit", type=parse_size, help="peak memory when writing a store directly")
    g.add_argument("--tmp-dir", help="directory for out-of-core buckets when writing a store (default: beside it)")
    g.add_argument("--out-of-core", action="store_true",
                   help="write a store through on-disk buckets even when the tensor fits in memory")
    g.add_argument("--overwrite", action="store_true", help="replace an existing output")
    g.add_argument("--compression", choices=["fast", "small", "none"], default="fast",
                   help="sparse store: chunk compression, as for convert (default fast)")
    g.add_argument("--dense", type=parse_shape, metavar="SHAPE",
                   help="write a planted rank-RANK dense Zarr array of this shape instead (OUT is the array's path "
                        "or URL; true factors in OUT.factors.npz); --noise is then the noise's norm relative to "
                        "the model's (0.01 = 1 %%)")
    g.add_argument("--chunks", type=parse_shape, help="--dense: chunk shape (default: chunks of at most 8 MiB, whole trailing modes, the leading ones cut into equal pieces)")
    g.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="--dense: value dtype")
    g.add_argument("--codec", choices=["none", "zstd"], default="none",
                   help="--dense: chunk compression (default none: noisy floats barely compress, and decompressing "
                        "them would bound a streamed CP-ALS)")
    g.set_defaults(func=cmd_generate)

    c = add("convert", help="convert a .tns/.tns.gz file to a BLCO Zarr store",
                       description="Convert a FROSTT .tns or .tns.gz file into a BLCO Zarr store (local path or "
                                   "fsspec URL). Inputs larger than --memory-limit are converted out of core. "
                                   "Nothing is left at STORE if conversion fails.")
    c.add_argument("input", help="input .tns or .tns.gz file (gzip detected by content)")
    c.add_argument("store", help="output store: a local path or an fsspec URL")
    c.add_argument("--shape", type=parse_shape, help="mode lengths (default: max index per mode)")
    c.add_argument("--zero-based", action="store_true", help="indices start at 0 (default: 1, as in FROSTT)")
    c.add_argument("--duplicates", choices=["error", "sum", "last"], default="error",
                   help="repeated coordinates: fail (default), add the values, or keep the last")
    c.add_argument("--chunk-nnz", type=_positive_int, help="nonzeros per stored chunk (default 1048576)")
    c.add_argument("--max-block-nnz", type=_positive_int, help="largest BLCO block (default 16777216)")
    c.add_argument("--compression", choices=["fast", "small", "none"], default="fast",
                   help="chunk compression: fast (default; lz4 index and values) decodes quickly, which "
                        "streaming CP-ALS feels on every mode; small (zstd-3) makes the smallest stores; none "
                        "stores raw chunks with their checksums (about 1/3 larger than fast), which streaming "
                        "maps instead of decoding: for stores streamed many times from a fast local disk")
    c.add_argument("--memory-limit", type=parse_size,
                   help="peak memory of the conversion, e.g. 512MB (default: half the available memory)")
    c.add_argument("--workers", type=_positive_int, help="parallel parse tasks (default: cores)")
    c.add_argument("--tmp-dir", help="directory for out-of-core buckets (default: beside the store)")
    c.add_argument("--out-of-core", action="store_true",
                   help="convert through on-disk buckets even when the input fits in memory")
    c.add_argument("--overwrite", action="store_true", help="replace an existing store")
    c.set_defaults(func=cmd_convert)

    i = add("info", help="describe a store or a dense Zarr array",
                       description="Validate a store and print its shape, nonzeros, blocks, chunks, bytes on "
                                   "disk, compression ratio and per-mode statistics.")
    i.add_argument("store", help="store path or URL, or a dense Zarr array (shape, chunks, dtype, bytes)")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.set_defaults(func=cmd_info)

    storage_help = "storage root: a folder or fsspec URL (default: the spec's 'storage', else $TFOOC_STORAGE, else ./storage)"
    q = add("quickstart", help="the main job: tfooc run workflows/quickstart.yaml",
            description="Run workflows/quickstart.yaml on the embedded default: generate a planted low-rank "
                        "heavy-tailed tensor with noise (uber-shaped, 3.3 M nonzeros) as a .tns file, convert it "
                        "to a store, decompose it with rank-16 CP-ALS, and report the fit and the factor match "
                        "against the planted model. Steps that are up to date are skipped (exit status 3).")
    q.add_argument("--storage", default=None, help=storage_help)
    q.add_argument("--force", action="store_true", help="run every step even when up to date")
    q.set_defaults(func=cmd_quickstart)

    exits = ("Exit status: 0 done, 1 failed, 2 bad spec or input (nothing started), 3 skipped because every "
             "step was up to date.")
    allow_help = ("a folder or URL besides the storage root that the spec may read and write (repeatable; also "
                  "$TFOOC_ALLOW_PATHS, os.pathsep-separated, and allow_paths in $TFOOC_CONFIG or "
                  "~/.config/tfooc/config.yaml). A spec's own allow_paths can only pick folders inside these")
    r = add("run", help="run a workflow spec in the foreground",
            description="Run a workflow spec (YAML; see workflows/README.md) in this process: steps in dependency "
                        "order, each skipped when its outputs exist with matching input fingerprints; a failed "
                        "run resumes from its last finished step (CP-ALS from its checkpoint). Records go under "
                        "STORAGE/.tfooc/runs.", epilog=exits)
    r.add_argument("spec", help="workflow spec (YAML)")
    r.add_argument("--storage", default=None, help=storage_help)
    r.add_argument("--scheduler", default=None,
                   help="run step graphs on this Dask scheduler, or 'embedded' / 'gpu' (default: the spec's cluster)")
    r.add_argument("--force", action="store_true", help="run every step even when up to date")
    r.add_argument("--allow-path", dest="allow_paths", action="append", default=None, metavar="PATH",
                   help=allow_help)
    r.set_defaults(func=cmd_run)

    sb = add("submit", help="submit a workflow spec to a Dask cluster and return its run id",
             description="Validate the spec here, then submit its driver as a Dask task (fire and forget) to the "
                         "scheduler: prints the run id at once; the run goes on on the cluster after this command "
                         "exits. Follow it with tfooc status / logs, stop it with tfooc cancel. The storage root "
                         "must be reachable from the workers (a shared folder or an fsspec URL).",
             epilog="Exit status: 0 submitted, 2 bad spec or input (nothing submitted), 1 scheduler unreachable.")
    sb.add_argument("spec", help="workflow spec (YAML)")
    sb.add_argument("--scheduler", required=True, help="Dask scheduler address, e.g. tcp://host:8786")
    sb.add_argument("--storage", default=None, help=storage_help)
    sb.add_argument("--force", action="store_true", help="run every step even when up to date")
    sb.add_argument("--allow-path", dest="allow_paths", action="append", default=None, metavar="PATH",
                    help=allow_help)
    sb.set_defaults(func=cmd_submit)

    st = add("status", help="list runs, or show one run",
             description="Without RUN: the latest runs under the storage root. With RUN (an id or a unique prefix): "
                         "its steps, states, times, fits, errors and outputs. A running run whose driver stopped "
                         "heartbeating shows as lost.",
             epilog="With --wait, the exit status is the run's: " + exits)
    st.add_argument("run", nargs="?", help="run id (or a unique prefix)")
    st.add_argument("--storage", default=str(DEFAULT_STORAGE), help="storage root (default ./storage or $TFOOC_STORAGE)")
    st.add_argument("--json", action="store_true", help="print the record(s) as JSON")
    st.add_argument("--all", action="store_true", help="list every run, not only the latest 20")
    st.add_argument("--wait", action="store_true", help="wait until RUN ends; exit with its exit status")
    st.add_argument("--timeout", type=_tolerance, default=None, help="seconds to wait at most with --wait")
    st.set_defaults(func=cmd_status)

    lg = add("logs", help="print a run's events",
             description="Print a run's events (step transitions, CP-ALS iterations, log lines, errors with "
                         "tracebacks) from STORAGE/.tfooc/runs/RUN/events.jsonl.")
    lg.add_argument("run", help="run id (or a unique prefix)")
    lg.add_argument("--storage", default=str(DEFAULT_STORAGE), help="storage root (default ./storage or $TFOOC_STORAGE)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    lg.add_argument("--json", action="store_true", help="one JSON object per line")
    lg.set_defaults(func=cmd_logs)

    cn = add("cancel", help="stop a run",
             description="Ask a run to stop: a queued run is dropped from the scheduler; a running one stops "
                         "before its next step or CP-ALS iteration (its record ends cancelled, and running the "
                         "spec again resumes it).")
    cn.add_argument("run", help="run id (or a unique prefix)")
    cn.add_argument("--storage", default=str(DEFAULT_STORAGE), help="storage root (default ./storage or $TFOOC_STORAGE)")
    cn.add_argument("--wait", action="store_true", help="wait until the run has stopped")
    cn.add_argument("--timeout", type=_tolerance, default=None, help="seconds to wait at most with --wait")
    cn.set_defaults(func=cmd_cancel)

    d = add("cpd", help="CP decomposition (CP-ALS) of a store or a dense array on Dask",
                       description="Rank-R CP-ALS of a BLCO store (or a dense Zarr array) as iterated Dask graph reductions: on an embedded "
                                   "in-process cluster (dashboard link logged) or on --scheduler. Writes a Zarr "
                                   "result store and a checkpoint every iteration; --resume continues from it.")
    d.add_argument("store", help="input BLCO store, or a dense Zarr array of order 3-6 (path or URL)")
    d.add_argument("--rank", type=_positive_int, required=True, help="number of components R")
    d.add_argument("--out", help="result store (default STORE.cp-rR.zarr)")
    d.add_argument("--scheduler", help="address of an existing Dask scheduler; 'embedded' for the in-process Dask "
                                       "cluster (dashboard link logged); 'inline' to run in this process without "
                                       "Dask (default: inline up to 2^24 nonzeros, embedded above)")
    d.add_argument("--max-iters", type=_positive_int, default=50, help="iterations at most (default 50)")
    d.add_argument("--tol", type=_tolerance, default=1e-5, help="stop when the fit changes by less (default 1e-5)")
    d.add_argument("--seed", type=int, default=None, help="seed of the random initial factors")
    d.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="factor precision")
    d.add_argument("--execution", choices=["auto", "streaming", "in-memory"], default="auto",
                   help="stream chunks each pass or keep decoded blocks on workers (default: by memory)")
    d.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                   help="where MTTKRP runs: gpu = GPU workers (LocalCUDACluster when GPUs are visible and "
                        "dask-cuda is installed; error if no worker can run GPU kernels), cpu, or auto = GPUs "
                        "when the cluster has them (default auto)")
    d.add_argument("--conflict", choices=["auto", "hierarchical", "register"], default="auto",
                   help="GPU conflict resolution (default auto: hierarchical when the target mode is shorter "
                        "than the device's SM count)")
    d.add_argument("--streams", type=_positive_int, default=8, help="CUDA streams for GPU streaming (default 8)")
    d.add_argument("--device-memory-limit", type=parse_size, default=None,
                   help="device memory a GPU task may use, e.g. 8GiB (default 80%% of free device memory); "
                        "tensors larger than this are streamed in batches")
    d.add_argument("--method", choices=["exact", "sts", "arls-lev", "arls-lev-hybrid"], default="exact",
                   help="least-squares solves: exact (full MTTKRP), or randomized by sampling rows of the "
                        "Khatri-Rao product: sts = exact leverage scores (STS-CP), arls-lev = product of the "
                        "factors' leverage scores (CP-ARLS-LEV), arls-lev-hybrid = the same with rows of "
                        "probability >= 1/SAMPLES taken deterministically (default exact)")
    d.add_argument("--samples", type=_positive_int, default=65536,
                   help="randomized methods: Khatri-Rao rows drawn per mode and iteration (default 65536)")
    d.add_argument("--fit-every", type=_positive_int, default=None,
                   help="randomized methods: evaluate the fit (one exact MTTKRP) every N iterations and at the "
                        "last (default 1 up to 2^24 nonzeros, else 5)")
    d.add_argument("--checkpoint", help="checkpoint file (default OUT.checkpoint.npz)")
    d.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    d.add_argument("--overwrite", action="store_true",
                   help="replace an existing result at OUT (without it, an existing result is an error)")
    d.set_defaults(func=cmd_cpd)

    t = add("complete", help="tensor completion (FastTuckerPlus SGD) of a store",
            description="Fit a FastTucker model (factors A_n of I_n x J_n, a core that is the Kruskal tensor of "
                        "B_n, J_n x R) to the observed entries of STORE by FastTuckerPlus (seed 003, Algorithm 3): "
                        "per epoch a factor pass over uniformly drawn batches and a core pass by the accumulated "
                        "gradient. The test RMSE and MAE are measured every epoch on a held-out fraction of STORE "
                        "or on a separate test store; the model of the best epoch is written to OUT.",
            epilog="Exit status: 0 done, 2 bad input (ranks, rates, a test set that overlaps STORE or lies outside "
                   "its shape; nothing is written).")
    t.add_argument("store", help="training entries: a BLCO store (path or URL)")
    t.add_argument("--ranks", type=parse_ranks, required=True, help="factor ranks J_n, e.g. 8,8,8 (or one for all)")
    t.add_argument("--core-rank", type=_positive_int, required=True, help="rank R of the Kruskal core")
    tt = t.add_mutually_exclusive_group()
    tt.add_argument("--test", help="test entries: a store of the same shape, disjoint from STORE")
    tt.add_argument("--test-fraction", type=_fraction, default=None,
                    help="hold out this fraction of STORE's entries as the test set (seeded; default 0.1 "
                         "when --test is not given)")
    t.add_argument("--epochs", type=_positive_int, default=50, help="epochs at most (default 50)")
    t.add_argument("--batch", type=_positive_int, default=64, help="entries per batch of the factor pass (default 64)")
    t.add_argument("--step", choices=["normalized", "plain"], default="normalized",
                   help="factor steps: 'normalized' divides a sample's moves by the squared norm of its gradient "
                        "(normalized LMS; default), 'plain' is the seed's rule 14")
    t.add_argument("--lr-factors", type=_finite_float, default=None,
                   help="factor rate: the step fraction in (0, 2) of normalized steps (default 0.3), or the "
                        "learning rate of plain steps (default 0.01)")
    t.add_argument("--lr-core", type=_finite_float, default=0.3, help="learning rate of the core (default 0.3)")
    t.add_argument("--lr-decay", type=_finite_float, default=None,
                   help="rates of epoch t divided by 1 + DECAY * t (default 0.05 with normalized steps, 0 with plain)")
    t.add_argument("--no-rebalance", dest="rebalance", action="store_false",
                   help="do not reset the model's gauge after every epoch (orthonormal core-factor rows, columns of "
                        "equal scale in every mode; same predictions)")
    t.add_argument("--revive-epochs", type=_nonnegative_int, default=10,
                   help="for this many first epochs, restart a component SGD has lost (strength under 5%% of the "
                        "median) as the best rank-1 fit of the training residual; 0: never (default 10)")
    t.add_argument("--reg-factors", type=_finite_float, default=0.001, help="regularization of the factors (default 0.001)")
    t.add_argument("--reg-core", type=_finite_float, default=0.001, help="regularization of the core (default 0.001)")
    t.add_argument("--patience", type=_positive_int, default=5,
                   help="stop when the test RMSE has not improved for this many epochs (default 5)")
    t.add_argument("--seed", type=int, default=0, help="seed of the initial model, the batches and the split (default 0)")
    t.add_argument("--threads", type=_positive_int, default=None,
                   help="numba threads per task (1: reproducible; default all)")
    t.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu", help="where the kernels run (default cpu)")
    t.add_argument("--scheduler", help="address of a Dask scheduler, 'embedded' or 'inline' (default: inline up to "
                                       "2^24 entries, embedded above)")
    t.add_argument("--out", help="result store (default STORE.fasttucker-rR.zarr)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing result at OUT")
    t.set_defaults(func=cmd_complete)

    from .tucker_cli import add_tucker_command

    add_tucker_command(add)      # tfooc tucker (Tucker HOOI)
    return p


def _setup_logging(quiet: bool, verbose: bool, log_format: str = "text") -> None:
    from .monitoring.logs import setup_logging

    # lines go through tqdm.write: a progress bar is cleared first and redrawn below the line
    setup_logging(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO, log_format)


def main(argv: Sequence[str] | None = None) -> int:
    from .disk import disk_full_error, is_disk_full
    from .errors import DiskFullError, TfoocError

    import dask

    from .monitoring.tls import check_scheduler_address, tls_config

    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.quiet, args.verbose, args.log_format)
    try:
        # Dask's client TLS settings for this command: every Client it makes picks them up
        with dask.config.set(tls_config(args.tls_ca_file, args.tls_cert, args.tls_key)):
            check_scheduler_address(getattr(args, "scheduler", None))
            return int(args.func(args) or 0)
    except DiskFullError as exc:       # not bad input: the command may succeed once there is space
        print(f"tfooc: error: {exc}", file=sys.stderr)
        return 1
    except (TfoocError, ValueError, FileExistsError, FileNotFoundError, TypeError) as exc:
        print(f"tfooc: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(f"tfooc: error: {disk_full_error(exc, None)}", file=sys.stderr)     # a write no site translated
        return 1
    except KeyboardInterrupt:
        print("tfooc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
