"""``tfooc``: the command-line interface.

Every command logs what it is doing to stderr, shows progress bars on long steps (``--quiet``
turns both off), and on bad input prints one ``tfooc: error: ...`` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
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


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in re.split(r"[x,\s]+", text.strip()) if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (example: 183,24,1140,1717)") from None
    if not shape or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"not a shape: {text!r}: mode lengths must be >= 1")
    return shape


def parse_skew(text: str) -> float | tuple[float, ...]:
    vals = tuple(float(s) for s in text.split(","))
    return vals[0] if len(vals) == 1 else vals


def _positive_int(text: str) -> int:
    v = int(float(text))
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v


# --- commands -------------------------------------------------------------------------------------

def cmd_generate(args: argparse.Namespace) -> int:
    import numpy as np

    from . import synthetic
    from .ingest import BatchSource, convert

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
    else:
        batches = synthetic.iter_heavy_tailed(shape, nnz, skew=args.skew, seed=args.seed, values=args.values)
    from tqdm.auto import tqdm

    bar = tqdm(total=nnz, desc="generate", unit="nz", unit_scale=True, disable=args.quiet, leave=False)

    def counted(it):
        for c, v in it:
            bar.update(c.shape[0])
            yield c, v

    log.info("generating %s nonzeros of a %s tensor shaped %s -> %s", f"{nnz:,}", args.kind, shape, out)
    if text:
        if os.path.exists(out) and not args.overwrite:
            raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
        synthetic.write_tns(out, counted(batches), one_based=not args.zero_based, header=header)
    else:
        src = BatchSource(counted(batches), len(shape), shape, nnz, name="synthetic generator")
        convert(src, out, shape=shape, overwrite=args.overwrite, progress=False, memory_limit=args.memory_limit)
    bar.close()
    log.info("wrote %s in %.1f s", out, time.perf_counter() - t0)
    print(out)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .ingest import convert

    t0 = time.perf_counter()
    store = convert(args.input, args.store, shape=args.shape, one_based=not args.zero_based,
                    duplicates=args.duplicates, chunk_nnz=args.chunk_nnz, max_block_nnz=args.max_block_nnz,
                    memory_limit=args.memory_limit, overwrite=args.overwrite, progress=not args.quiet,
                    workers=args.workers, tmp_dir=args.tmp_dir, compression=args.compression)
    dt = time.perf_counter() - t0
    print(f"{store.path}: {store.nnz:,} nonzeros, shape {'x'.join(map(str, store.shape))}, "
          f"{store.nblocks} blocks, {store.nchunks} chunks, {dt:.2f} s ({store.nnz / dt / 1e6:.2f} M nonzeros/s)")
    return 0


def _format_info(info: dict) -> str:
    lines = [
        f"store        {info['path']}  (BLCO format v{info['format_version']})",
        f"shape        {' x '.join(map(str, info['shape']))}",
        f"nonzeros     {info['nnz']:,}  (density {info['density']:.3g}, values {info['value_dtype']})",
        f"norm         {info['norm']:.6g}",
        f"blocks       {info['blocks']:,}  (nonzeros per block {info['block_nnz_min']:,} .. {info['block_nnz_max']:,})",
        f"chunks       {info['chunks']:,}  ({info['chunk_nnz']:,} nonzeros each, {info['compression']})",
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

    info = open_store(args.store).info()
    print(json.dumps(info, indent=2) if args.json else _format_info(info))
    return 0


def cmd_cpd(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from .decompositions import cp_als
    from .execution import DeviceOptions
    from .store import open_store

    store = open_store(args.store)
    out = args.out or f"{str(args.store).rstrip('/')}.cp-r{args.rank}.zarr"
    checkpoint = args.checkpoint or f"{out}.checkpoint.npz"
    bar = tqdm(total=args.max_iters, desc="cp-als", unit="it", disable=args.quiet, leave=False)

    def progress(record: dict) -> None:
        bar.n = record["iteration"]
        bar.set_postfix(fit=f"{record['fit']:.6f}", dfit=f"{record['fit_change']:.1e}",
                        s_per_it=f"{record['seconds']:.3f}")

    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.perf_counter()
    with logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        result = cp_als(store, args.rank, scheduler=args.scheduler, max_iters=args.max_iters, tol=args.tol,
                        seed=args.seed, dtype=args.dtype, checkpoint=checkpoint, resume=args.resume,
                        callback=progress, execution=args.execution, out=out, overwrite=True, device=args.device,
                        device_options=DeviceOptions(conflict=args.conflict, streams=args.streams,
                                                     device_memory_limit=args.device_memory_limit))
    bar.close()
    wall = time.perf_counter() - t0
    new = result.history[result.params.get("resumed_after", 0):]
    # the first iteration of a process also compiles (or loads) the kernels: reported apart
    steady = new[1:] or new
    per_it = sum(h["seconds"] for h in steady) / max(1, len(steady))
    print(f"CP-ALS rank {args.rank} on {store.path} ({store.nnz:,} nonzeros, {result.params['execution']} execution "
          f"on {result.params['device']}, "
          f"{'in this process' if result.params.get('scheduler') == 'inline' else 'Dask graph'})")
    print(f"  fit            {result.fit:.6f} after {result.iterations} iterations")
    if new:
        print(f"  first iter     {new[0]['seconds']:.3f} s  (includes kernel compilation or cache loading)")
    print(f"  per iteration  {per_it:.3f} s  steady state ({store.nnz * store.nmodes / max(per_it, 1e-12) / 1e6:.1f} "
          f"M nonzero-modes/s; {len(new)} iterations in this run, {wall:.1f} s wall)")
    if steady:
        parts = {k: sum(sum(h[k]) if isinstance(h[k], list) else h[k] for h in steady) / len(steady)
                 for k in ("mttkrp_seconds", "update_seconds", "other_seconds")}
        print(f"  of which       MTTKRP {parts['mttkrp_seconds']:.3f} s, updates {parts['update_seconds']:.3f} s, "
              f"scheduling and transfers {parts['other_seconds']:.3f} s")
    print(f"  result         {out}")
    print(f"  checkpoint     {checkpoint}")
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    """The embedded default main job: generate -> convert -> info -> cpd, under the storage root."""
    root = Path(args.storage)
    root.mkdir(parents=True, exist_ok=True)
    tns = root / "quickstart.tns"
    store = root / "quickstart.zarr"
    common = ["--quiet"] if args.quiet else []
    steps = [
        ["generate", str(tns), "--like", args.like, "--seed", str(args.seed), "--overwrite"],
        ["convert", str(tns), str(store), "--overwrite"],
        ["info", str(store)],
        ["cpd", str(store), "--rank", str(args.rank), "--max-iters", str(args.max_iters), "--seed", str(args.seed),
         "--out", str(root / "quickstart.cp.zarr")],
    ]
    for step in steps:
        log.info("quickstart: tfooc %s", " ".join(step))
        rc = main(common + step)
        if rc:
            return rc
    return 0


# --- parser -----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .synthetic import PRESETS, VALUE_KINDS

    p = argparse.ArgumentParser(
        prog="tfooc",
        description="Out-of-core sparse tensor decomposition on BLCO Zarr stores.",
        epilog="Exit status: 0 on success, 2 on bad input (the message names the file, line or field), "
               "1 on internal errors, 130 when interrupted. Docs: README.md and docs/FORMAT.md.")
    p.add_argument("--version", action="version", version=f"tfooc {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and only warnings in the log")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="write a synthetic sparse tensor (.tns, .tns.gz or a store)",
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
    g.add_argument("--noise", type=float, default=0.0, help="planted: noise std relative to the values' std")
    g.add_argument("--skew", type=parse_skew, default=1.6,
                   help="power-law exponent per mode (1 = uniform; one value or one per mode; default 1.6)")
    g.add_argument("--values", choices=VALUE_KINDS, default="uniform",
                   help="value distribution for heavy-tailed tensors (default uniform in (0, 1])")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--zero-based", action="store_true", help="write 0-based indices to .tns (default 1-based)")
    g.add_argument("--memory-limit", type=parse_size, help="peak memory when writing a store directly")
    g.add_argument("--overwrite", action="store_true", help="replace an existing output")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("convert", help="convert a .tns/.tns.gz file to a BLCO Zarr store",
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
    c.add_argument("--compression", choices=["fast", "small"], default="fast",
                   help="chunk compression: fast (default; zstd-1 index, lz4 values) decodes quickly, which "
                        "streaming CP-ALS feels on every mode; small (zstd-3) makes the smallest stores")
    c.add_argument("--memory-limit", type=parse_size,
                   help="peak memory of the conversion, e.g. 512MB (default: half the available memory)")
    c.add_argument("--workers", type=_positive_int, help="parallel parse tasks (default: cores)")
    c.add_argument("--tmp-dir", help="directory for out-of-core buckets (default: beside the store)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing store")
    c.set_defaults(func=cmd_convert)

    i = sub.add_parser("info", help="describe a store",
                       description="Validate a store and print its shape, nonzeros, blocks, chunks, bytes on "
                                   "disk, compression ratio and per-mode statistics.")
    i.add_argument("store", help="store path or URL")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.set_defaults(func=cmd_info)

    q = sub.add_parser("quickstart", help="the default main job: generate -> convert -> info -> cpd under storage/",
                       description="Generate a FROSTT-like tensor, convert it to a store, describe it and "
                                   "decompose it with CP-ALS, all under the storage root, with the embedded defaults.")
    q.add_argument("--storage", default=str(DEFAULT_STORAGE), help="storage root (default ./storage or $TFOOC_STORAGE)")
    q.add_argument("--like", choices=sorted(PRESETS), default="uber", help="tensor preset (default uber)")
    q.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    q.add_argument("--rank", type=_positive_int, default=16, help="CP rank (default 16)")
    q.add_argument("--max-iters", type=_positive_int, default=20, help="CP-ALS iterations at most (default 20)")
    q.set_defaults(func=cmd_quickstart)

    d = sub.add_parser("cpd", help="CP decomposition (CP-ALS) of a store on Dask",
                       description="Rank-R CP-ALS of a BLCO store as iterated Dask graph reductions: on an embedded "
                                   "in-process cluster (dashboard link logged) or on --scheduler. Writes a Zarr "
                                   "result store and a checkpoint every iteration; --resume continues from it.")
    d.add_argument("store", help="input BLCO store (path or URL)")
    d.add_argument("--rank", type=_positive_int, required=True, help="number of components R")
    d.add_argument("--out", help="result store (default STORE.cp-rR.zarr)")
    d.add_argument("--scheduler", help="address of an existing Dask scheduler; 'embedded' for the in-process Dask "
                                       "cluster (dashboard link logged); 'inline' to run in this process without "
                                       "Dask (default: inline up to 2^20 nonzeros, embedded above)")
    d.add_argument("--max-iters", type=_positive_int, default=50, help="iterations at most (default 50)")
    d.add_argument("--tol", type=float, default=1e-5, help="stop when the fit changes by less (default 1e-5)")
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
    d.add_argument("--checkpoint", help="checkpoint file (default OUT.checkpoint.npz)")
    d.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    d.set_defaults(func=cmd_cpd)
    return p


def _setup_logging(quiet: bool, verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    root = logging.getLogger("tensorflow_ooc")
    if not root.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        root.addHandler(h)
    root.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import TfoocError

    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.quiet, args.verbose)
    try:
        return int(args.func(args) or 0)
    except (TfoocError, ValueError, FileExistsError, FileNotFoundError, TypeError) as exc:
        print(f"tfooc: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tfooc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
