"""``tfooc generate``, ``tfooc convert`` and ``tfooc info``: writing, converting and describing tensors."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Callable

from ..ingest.table_options import TABLE_OPTIONS
from .options import _positive_int, _seed, _tolerance, claim, log, parse_shape, parse_size, parse_skew


def cmd_generate(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import synthetic
    from ..ingest import AltoRunSource, BatchSource, convert

    _check_kind_options(args)
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
    factors_path = (out[:-7] if out.endswith(".tns.gz") else out[:-4] if text else out.rstrip("/")) + ".factors.npz"
    # replaced only if this package wrote it; one writer at a time
    claim(args, {"--out": out, "the planted model": factors_path if args.kind.startswith("planted") else None}, {})
    runs = None  # sorted ALTO runs with their values, for a store
    if args.kind == "planted":
        planted = synthetic.planted_cp(shape, args.rank, nnz, noise=args.noise, seed=args.seed, skew=args.skew)
        batches = iter([(planted.coords, planted.values)])
        np.savez(factors_path, weights=planted.weights, **{f"factor{n}": f for n, f in enumerate(planted.factors)})
        log.info("true factors written to %s", factors_path)
        nnz = planted.coords.shape[0]
        gen = None
    elif args.kind == "planted-poisson":
        concentration = 0.5 if args.concentration is None else args.concentration
        poisson = synthetic.PlantedPoissonGenerator(
            shape, args.rank, nnz, seed=args.seed, skew=args.skew, concentration=concentration
        )
        header += f", rank {args.rank}, Poisson counts (expected total {poisson.weights.sum():.6g})"
        batches = poisson.batches()
        runs = poisson.runs()
        gen = None
    else:
        values = args.values or "uniform"
        gen = synthetic.HeavyTailedGenerator(shape, nnz, skew=args.skew, seed=args.seed, values=values)
        batches = synthetic.iter_heavy_tailed(shape, nnz, skew=args.skew, seed=args.seed, values=values)
    from tqdm.auto import tqdm

    # a store from the heavy-tailed generator gets convert's own bars (generate/partition, merge+write)
    bar = tqdm(
        total=nnz,
        desc="generate",
        unit="nz",
        unit_scale=True,
        leave=False,
        disable=not args.progress or ((gen is not None or runs is not None) and not text),
    )

    def counted(it, axis=0):
        for c, v in it:
            bar.update(c.shape[axis])
            yield c, v

    about = "about " if args.kind == "planted-poisson" else ""
    log.info("generating %s%s nonzeros of a %s tensor shaped %s -> %s", about, f"{nnz:,}", args.kind, shape, out)
    if text:
        if os.path.exists(out) and not args.overwrite:
            raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
        synthetic.write_tns(out, counted(batches), one_based=not args.zero_based, header=header)
    elif gen is not None:
        # sorted ALTO runs straight into the store: merged, not sorted; values recomputed, not spilled
        src = AltoRunSource(
            gen.runs(with_values=False), shape, nnz, values_of=gen.values_of, name="synthetic generator"
        )
        convert(
            src,
            out,
            overwrite=args.overwrite,
            progress=args.progress,
            memory_limit=args.memory_limit,
            tmp_dir=args.tmp_dir,
            out_of_core=args.out_of_core or None,
            compression=args.compression,
            values_dtype=args.values_dtype,
        )
    elif runs is not None:
        # sorted ALTO runs with their counts: merged into the store, not sorted
        src = AltoRunSource(runs, shape, nnz, name="planted Poisson generator")
        convert(
            src,
            out,
            overwrite=args.overwrite,
            progress=args.progress,
            memory_limit=args.memory_limit,
            tmp_dir=args.tmp_dir,
            out_of_core=args.out_of_core or None,
            compression=args.compression,
            values_dtype=args.values_dtype,
        )
    else:
        src = BatchSource(counted(batches), len(shape), shape, nnz, name="synthetic generator")
        convert(
            src,
            out,
            shape=shape,
            overwrite=args.overwrite,
            progress=False,
            memory_limit=args.memory_limit,
            tmp_dir=args.tmp_dir,
            out_of_core=args.out_of_core or None,
            compression=args.compression,
            values_dtype=args.values_dtype,
        )
    bar.close()
    if args.kind == "planted-poisson":  # once the tensor is written: no model beside a failed write
        np.savez(factors_path, weights=poisson.weights, **{f"factor{n}": f for n, f in enumerate(poisson.factors)})
        log.info("true model (weights: expected counts per component) written to %s", factors_path)
    log.info("wrote %s in %.1f s", out, time.perf_counter() - t0)
    print(out)
    return 0


def _check_kind_options(args: argparse.Namespace) -> None:
    """Refuse options that do not apply to ``--kind`` (or ``--dense``) instead of ignoring them."""
    if args.kind == "planted-poisson":
        if args.dense:
            raise ValueError("--dense writes a Gaussian planted model; it does not take --kind planted-poisson")
        if args.noise:
            raise ValueError("--noise does not apply to --kind planted-poisson: its counts are Poisson draws")
        if args.values not in (None, "count"):
            raise ValueError(f"--values {args.values} does not apply to --kind planted-poisson: its values are counts")
    elif args.concentration is not None:
        raise ValueError("--concentration is only for --kind planted-poisson")


def _positive_float(text: str) -> float:
    """A finite number > 0 (``--concentration``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _generate_dense(args: argparse.Namespace) -> int:
    """``generate --dense SHAPE``: a planted rank-R dense Zarr array, written chunk by chunk, and
    its true factors beside it (OUT.factors.npz), as the sparse planted generator does."""
    import numpy as np

    from .. import synthetic

    out = str(args.out).rstrip("/")
    if out.endswith(".tns") or out.endswith(".tns.gz"):
        raise ValueError(f"{out}: a dense tensor is written as a Zarr array; give a directory path or URL")
    claim(args, {"--out": out, "the planted model": out + ".factors.npz"}, {})
    if args.chunks is not None and len(args.chunks) != len(args.dense):
        raise ValueError(f"--chunks has {len(args.chunks)} lengths for a tensor of order {len(args.dense)}")
    t0 = time.perf_counter()
    log.info(
        "generating a planted rank-%d dense tensor shaped %s (noise %g) -> %s", args.rank, args.dense, args.noise, out
    )
    weights, factors = synthetic.write_planted_dense(
        out,
        args.dense,
        args.rank,
        noise=args.noise,
        seed=args.seed,
        chunks=args.chunks,
        dtype=args.dtype,
        codec=args.codec,
        overwrite=args.overwrite,
        progress=args.progress,
    )
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
        f"bytes        {info['bytes']:,}"
        + (
            f"  ({info['bytes_on_disk']:,} on disk, compressors {', '.join(info['compressors']) or 'none'})"
            if "bytes_on_disk" in info
            else ""
        ),
    ]
    if "norm" in info:
        lines.append(f"norm         {info['norm']:.6g}")
    if "planted" in info:
        p = info["planted"]
        lines.append(f"planted      rank {p['rank']}, noise {p['noise']:g}, seed {p['seed']}")
    return "\n".join(lines)


def cmd_convert(args: argparse.Namespace) -> int:
    from ..execution.mode_copies_build import rewrite  # the source's mode-sorted copies kept
    from ..ingest import convert

    t0 = time.perf_counter()
    if args.rewrite:
        store = rewrite(
            args.input,
            args.store,
            compression=args.compression,
            index_encoding=args.index_encoding,
            chunk_nnz=args.chunk_nnz,
            values_dtype=args.values_dtype,
            overwrite=args.overwrite,
            progress=args.progress,
            fiber_index=args.fiber_index,
        )
        dt = time.perf_counter() - t0
        print(
            f"{store.path}: {store.nnz:,} nonzeros rewritten from {args.input} in {dt:.2f} s "
            f"(format v{store.meta['format_version']}, index {store.index_encoding}, {store.meta['compression']})"
        )
        return 0
    store = convert(
        args.input,
        args.store,
        shape=args.shape,
        one_based=not args.zero_based,
        duplicates=args.duplicates,
        chunk_nnz=args.chunk_nnz,
        max_block_nnz=args.max_block_nnz,
        memory_limit=args.memory_limit,
        overwrite=args.overwrite,
        progress=args.progress,
        workers=args.workers,
        tmp_dir=args.tmp_dir,
        compression=args.compression or "fast",
        values_dtype=args.values_dtype,
        out_of_core=args.out_of_core or None,
        index_encoding=args.index_encoding,
        fiber_index=args.fiber_index,
        fiber_chunk_nnz=args.fiber_chunk_nnz,
        **{o.name: getattr(args, o.name) for o in TABLE_OPTIONS},
    )
    dt = time.perf_counter() - t0
    print(
        f"{store.path}: {store.nnz:,} nonzeros, shape {'x'.join(map(str, store.shape))}, "
        f"{store.nblocks} blocks, {store.nchunks} chunks, {dt:.2f} s ({store.nnz / dt / 1e6:.2f} M nonzeros/s)"
    )
    if store.labels is not None:
        before = None
        if args.append_to:
            from ..store import open_store

            before = open_store(args.append_to).shape
        for d in store.labels.describe():
            if before is not None and before[d["mode"]] != d["count"]:
                grew = before[d["mode"]]
                print(
                    f"  mode {d['mode']} {d['name']!r} grew: {grew:,} -> {d['count']:,} keys (+{d['count'] - grew:,})"
                )
            print(
                f"  mode {d['mode']} {d['name']!r}: {d['count']:,} keys ({d['key_type']}), "
                f"{d['bytes_per_key']:.1f} bytes a key"
            )
    return 0


def _cli_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """A table option's parser for argparse: its ValueError becomes the usage error."""

    def typed(text: str) -> object:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return typed


def _chunk_text(info: dict) -> str:
    """Chunks and how full they are: ``chunk_nnz`` is the capacity of a chunk, not its size (a
    9.5 k-nonzero store is one chunk of 9.5 k nonzeros, with room for 1 M)."""
    n, cap, nnz = info["chunks"], info["chunk_nnz"], info["nnz"]
    if n <= 1:
        held = f"{nnz:,} nonzeros" if n == 1 else "empty"
        return f"{n:,}  ({held}; capacity {cap:,} nonzeros per chunk, {info['compression']})"
    last = nnz - (n - 1) * cap
    return (
        f"{n:,}  ({cap:,} nonzeros each, the last {last:,}; {info['compression']})"
        if last != cap
        else f"{n:,}  ({cap:,} nonzeros each, {info['compression']})"
    )


def _format_info(info: dict) -> str:
    lines = [
        f"store        {info['path']}  (BLCO format v{info['format_version']})",
        f"shape        {' x '.join(map(str, info['shape']))}",
        f"nonzeros     {info['nnz']:,}  (density {info['density']:.3g}, values {info['value_dtype']})",
        f"norm         {info['norm']:.6g}",
        f"blocks       {info['blocks']:,}  (nonzeros per block {info['block_nnz_min']:,} .. {info['block_nnz_max']:,})",
        f"chunks       {_chunk_text(info)}",
        f"on disk      {info['bytes_on_disk']:,} bytes = {info['bytes_per_nnz']:.2f} bytes/nonzero "
        f"(index {info['index_bytes_per_nnz']:.2f}, values {info['values_bytes_per_nnz']:.2f}), "
        f"{100 * info['compression_ratio']:.1f} % of raw COO ({info['raw_coo_bytes']:,} bytes)",
        f"index bits   {info['layout']['total_bits']} ({info['layout']['index_bits']} per nonzero, "
        f"{info['layout']['total_bits'] - info['layout']['index_bits']} in block keys; stored "
        f"{info['index_encoding']}, {info['index_patches']:,} patches)",
        "",
        f"{'mode':>4} {'length':>12} {'bits':>5} {'key bits':>8} {'chunk span mean':>16} {'chunk span max':>15}",
    ]
    for m in info["modes"]:
        lines.append(
            f"{m['mode']:>4} {m['length']:>12,} {m['bits']:>5} {m['key_bits']:>8} "
            f"{m['chunk_index_span_mean']:>16,.1f} {m['chunk_index_span_max']:>15,}"
        )
    labels = info.get("labels") or []
    if labels:
        lines += ["", f"{'labels':<12} {'name':<16} {'key type':<16} {'keys':>12} {'bytes':>12} {'bytes/key':>10}"]
        for d in labels:
            lines.append(
                f"{'mode ' + str(d['mode']):<12} {d['name']:<16} {d['key_type']:<16} {d['count']:>12,} "
                f"{d['bytes']:>12,} {d['bytes_per_key']:>10.2f}"
            )
    fibers = info.get("fiber_index") or {}
    if fibers:
        lines += [
            "",
            f"{'fiber index':<12} {'nonzeros':>14} {'fibers':>14} {'chunks':>9} {'bytes':>15} {'Bloom bytes':>13} "
            f"{'bytes/nnz':>10}",
        ]
        for m, f in fibers.items():
            lines.append(
                f"{'mode ' + m:<12} {f['nnz']:>14,} {f['fibers'] or 0:>14,} {f['chunks']:>9,} {f['bytes']:>15,} "
                f"{f['bloom_bytes']:>13,} {f['bytes_per_nnz']:>10.2f}"
            )
    else:
        lines += ["", "fiber index  none (sampled rounds scan the store; tfooc fiber-index STORE builds one)"]
    copies = info.get("mode_copies") or {}
    if copies:
        lines += ["", f"{'mode copies':<12} {'bytes':>15} {'bytes/nnz':>10} {'mean run':>10}"]
        for m, d in copies.items():
            lines.append(f"{'mode ' + m:<12} {d['bytes']:>15,} {d['bytes_per_nnz']:>10.2f} {d['mean_run']:>10.1f}")
    else:
        lines += ["", "mode copies  none (streaming reads ALTO order; tfooc mode-copies STORE writes them)"]
    return "\n".join(lines)


def cmd_mode_copies(args: argparse.Namespace) -> int:
    from ..execution.mode_copies_build import build_mode_copies
    from ..store import open_store
    from ..store.mode_copies import drop_mode_copies

    if args.drop:
        drop_mode_copies(open_store(args.store))
        print(f"{args.store}: mode-sorted copies removed")
        return 0
    modes = args.modes if args.modes in ("auto", "all") else [int(m) for m in args.modes.split(",")]
    t0 = time.perf_counter()
    store = build_mode_copies(args.store, modes)
    dt = time.perf_counter() - t0
    copies = store.mode_copies.describe() if store.mode_copies is not None else {}
    per = ", ".join(f"mode {m} {d['bytes_per_nnz']:.1f} (mean run {d['mean_run']:.0f})" for m, d in copies.items())
    print(f"{args.store}: mode-sorted copies in {dt:.2f} s (bytes a nonzero: {per or 'none kept'})")
    return 0


def cmd_fiber_index(args: argparse.Namespace) -> int:
    from ..ingest import build_fiber_index

    t0 = time.perf_counter()
    index = build_fiber_index(
        args.store,
        args.modes,
        chunk_nnz=args.chunk_nnz,
        memory_limit=args.memory_limit,
        overwrite=args.overwrite,
        progress=args.progress,
    )
    dt = time.perf_counter() - t0
    described = index.describe()
    per = ", ".join(f"mode {m} {f['bytes_per_nnz']:.2f}" for m, f in described.items())
    print(f"{args.store}: fiber index of modes {','.join(described)} in {dt:.2f} s (bytes a nonzero: {per})")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from ..store import open_store, paths
    from ..store.dense import is_dense_array, open_dense

    store = paths.resolve_version(args.store)  # a versioned store folder: its latest version, or @vN
    if is_dense_array(store):
        info = open_dense(store).info()
        print(json.dumps(info, indent=2) if args.json else _format_dense_info(info))
        return 0
    info = open_store(store).info()
    print(json.dumps(info, indent=2) if args.json else _format_info(info))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``generate``, ``convert`` and ``info`` with the CLI's ``add`` (a subparser factory)."""
    from ..synthetic.presets import PRESETS, VALUE_KINDS  # plain data: no generator kernels loaded

    g = add(
        "generate",
        help="write a synthetic sparse tensor (.tns, .tns.gz or a store), or with --dense a planted dense Zarr array",
        description="Write a synthetic sparse tensor: heavy-tailed slice sizes like real data, "
        "a planted low-rank CP model on such a support, or counts drawn from a planted Poisson CP "
        "model (for CP-APR). The output kind follows the name: *.tns, *.tns.gz (text, 1-based) or "
        "anything else (a BLCO store). Planted kinds write their true model beside it as "
        "OUT.factors.npz (weights, factor0, factor1, ...; OUT without .tns/.tns.gz).",
    )
    g.add_argument("out", help="output path: FILE.tns, FILE.tns.gz, or a store path / URL")
    g.add_argument("--like", choices=sorted(PRESETS), help="shape and nonzero count of a FROSTT-like tensor")
    g.add_argument("--shape", type=parse_shape, help="mode lengths, e.g. 183,24,1140,1717 (overrides --like)")
    g.add_argument(
        "--nnz",
        type=_positive_int,
        help="number of nonzeros (overrides --like; 1e6 style allowed); planted-poisson: the expected "
        "number, the draw gives about that many",
    )
    g.add_argument(
        "--kind",
        choices=["heavy-tailed", "planted", "planted-poisson"],
        default="heavy-tailed",
        help="heavy-tailed: heavy-tailed support with random values (default); planted: a rank-RANK CP "
        "model on sparse factor supports, plus --noise; planted-poisson: counts x ~ Poisson(m) of a "
        "rank-RANK Poisson CP model m = sum_r weight_r prod_n factor_n[i_n, r] (factor columns sum "
        "to 1, weight_r is component r's expected total count), only the nonzero counts kept, "
        "the weights scaled so about NNZ cells are nonzero; slice popularity follows --skew",
    )
    g.add_argument("--rank", type=_positive_int, default=8, help="rank of the planted models (default 8)")
    g.add_argument("--noise", type=_tolerance, default=0.0, help="planted: noise std relative to the values' std")
    g.add_argument(
        "--skew",
        type=parse_skew,
        default=1.6,
        help="power-law exponent per mode (1 = uniform; one value or one per mode; default 1.6)",
    )
    g.add_argument(
        "--values",
        choices=VALUE_KINDS,
        help="value distribution for heavy-tailed tensors (default uniform in (0, 1]; count: geometric "
        "1, 2, 3, ... on a heavy-tailed support, not a planted model)",
    )
    g.add_argument(
        "--concentration",
        type=_positive_float,
        help="planted-poisson: gamma shape of the factor entries (default 0.5; below 1 each column has "
        "a few large entries and many near 0, so components are distinct; larger: flatter columns)",
    )
    g.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    g.add_argument("--zero-based", action="store_true", help="write 0-based indices to .tns (default 1-based)")
    g.add_argument(
        "--memory-limit",
        type=parse_size,
        help="peak memory of the whole tfooc process when writing a store directly, e.g. 1GB (default: "
        "half the available memory); it includes the ~120 MiB the process holds before it starts "
        "(Python and its libraries), so leave at least 80 MiB above that",
    )
    g.add_argument("--tmp-dir", help="directory for out-of-core buckets when writing a store (default: beside it)")
    g.add_argument(
        "--out-of-core",
        action="store_true",
        help="write a store through on-disk buckets even when the tensor fits in memory",
    )
    g.add_argument("--overwrite", action="store_true", help="replace an existing output")
    g.add_argument(
        "--compression",
        choices=["fast", "small", "none"],
        default="fast",
        help="sparse store: chunk compression, as for convert (default fast)",
    )
    g.add_argument(
        "--values-dtype",
        choices=["float64", "float32"],
        help="sparse store: how values are stored, as for convert (default float64)",
    )
    g.add_argument(
        "--dense",
        type=parse_shape,
        metavar="SHAPE",
        help="write a planted rank-RANK dense Zarr array of this shape instead (OUT is the array's path "
        "or URL; true factors in OUT.factors.npz); --noise is then the noise's norm relative to "
        "the model's (0.01 = 1 %%)",
    )
    g.add_argument(
        "--chunks",
        type=parse_shape,
        help="--dense: chunk shape (default: chunks of at most 8 MiB, whole trailing modes, the leading "
        "ones cut into equal pieces)",
    )
    g.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="--dense: value dtype")
    g.add_argument(
        "--codec",
        choices=["none", "zstd"],
        default="none",
        help="--dense: chunk compression (default none: noisy floats barely compress, and decompressing "
        "them would bound a streamed CP-ALS)",
    )
    g.set_defaults(func=cmd_generate)

    c = add(
        "convert",
        help="convert a .tns/.tns.gz file or a Parquet/CSV table to a BLCO Zarr store (or --rewrite a store)",
        description="Convert a FROSTT .tns or .tns.gz file, or with --modes a Parquet or CSV table (a file, "
        "a folder, a glob, an s3:// URL), into a BLCO Zarr store (local path or "
        "fsspec URL). Inputs that do not fit --memory-limit (the whole process's peak memory) are converted "
        "out of core. "
        "Nothing is left at STORE if conversion fails. With --rewrite, INPUT is a store of any "
        "format version this build reads, written again in the current one (its compression, "
        "chunking and value dtype kept unless given).",
    )
    c.add_argument(
        "input",
        help="input .tns or .tns.gz file (gzip detected by content); with --modes, Parquet or CSV files; with "
        "--rewrite, a store",
    )
    c.add_argument("store", help="output store: a local path or an fsspec URL")
    c.add_argument("--shape", type=parse_shape, help="mode lengths (default: max index per mode)")
    c.add_argument("--zero-based", action="store_true", help="indices start at 0 (default: 1, as in FROSTT)")
    c.add_argument(
        "--duplicates",
        choices=["error", "sum", "last"],
        default="error",
        help="repeated coordinates: fail (default), add the values, or keep the last",
    )
    c.add_argument("--chunk-nnz", type=_positive_int, help="nonzeros per stored chunk (default 1048576)")
    c.add_argument("--max-block-nnz", type=_positive_int, help="largest BLCO block (default 16777216)")
    c.add_argument(
        "--rewrite",
        action="store_true",
        help="INPUT is a store (e.g. of format version 1): write it again at STORE in the current format",
    )
    c.add_argument(
        "--index-encoding",
        choices=["delta32", "delta64"],
        help="how the index is stored (default: delta32, 32-bit differences patched where a gap is "
        "wider, about 4x quicker to decompress; delta64 where over 1/256 of the gaps are wider)",
    )
    c.add_argument(
        "--compression",
        choices=["fast", "small", "none"],
        help="chunk compression: fast (default; lz4hc index, lz4 values) decodes quickly, which "
        "streaming CP-ALS feels on every mode; small (zstd-3) makes the smallest stores; none "
        "stores raw chunks with their checksums (about 1/3 larger than fast), which streaming "
        "maps instead of decoding: for stores streamed many times from a fast local disk "
        "(--rewrite: default the source's)",
    )
    c.add_argument(
        "--values-dtype",
        choices=["float64", "float32"],
        help="how values are stored (default float64): float32 halves their bytes, for counts (exact "
        "below 2**24) and low-precision data; decompositions still compute in float64. A value "
        "beyond float32's range is an error",
    )
    c.add_argument(
        "--memory-limit",
        type=parse_size,
        help="peak memory of the whole tfooc process, e.g. 512MB (default: half the available memory); it "
        "includes the ~120 MiB the process holds before the conversion starts (Python and its libraries), "
        "so leave at least 80 MiB above that",
    )
    c.add_argument("--workers", type=_positive_int, help="parallel parse tasks (default: cores)")
    c.add_argument("--tmp-dir", help="directory for out-of-core buckets (default: beside the store)")
    c.add_argument(
        "--out-of-core", action="store_true", help="convert through on-disk buckets even when the input fits in memory"
    )
    c.add_argument("--overwrite", action="store_true", help="replace an existing store")
    c.add_argument(
        "--fiber-index",
        metavar="MODES",
        help="also write the fiber index of these modes ('all' or mode numbers like 0,2): randomized CP "
        "and rTT-ALS then read only the sampled fibers each round (--rewrite: default the source's modes)",
    )
    c.add_argument(
        "--fiber-chunk-nnz",
        type=_positive_int,
        help="entries per fiber-index chunk (default: per mode about its fibers' mean length, 128 to 1024)",
    )
    for o in TABLE_OPTIONS:
        c.add_argument(o.flag, dest=o.name, type=_cli_type(o.parse), choices=o.choices, metavar=o.metavar, help=o.help)
    c.set_defaults(func=cmd_convert)

    f = add(
        "fiber-index",
        help="write a store's fiber index, so sampled rounds read only the sampled fibers",
        description="Write, inside STORE, per mode its nonzeros ordered by fiber (their indices in the "
        "other modes) in small chunks with a chunk table: randomized CP (sts, arls-lev) and rTT-ALS, "
        "streamed, then read only the chunks holding the sampled fibers instead of every nonzero. "
        "Built out of core within --memory-limit: one read of the store for every mode whose "
        "entries fit it (a further read for the others), each mode sorted a key range at a time. "
        "The index is bound to the store (refused if edited or copied from another store); tfooc "
        "info reports it.",
    )
    f.add_argument("store", help="store path or URL")
    f.add_argument("--modes", default="all", help="modes to index: 'all' (default) or mode numbers like 0,2")
    f.add_argument(
        "--chunk-nnz",
        type=_positive_int,
        help="entries per index chunk, the unit a sampled fiber is read in (default: per mode about its "
        "fibers' mean length as a power of two, 128 to 1024; 1024 where fibers average under 16 entries)",
    )
    f.add_argument(
        "--memory-limit",
        type=parse_size,
        help="memory the build may hold, e.g. 2GB (default: half the available memory); the store is read "
        "once, its entries held or spilled to files beside it, and sorted in ranges of keys that fit it",
    )
    f.add_argument("--overwrite", action="store_true", help="rebuild modes that already have an index")
    f.set_defaults(func=cmd_fiber_index)

    mc = add(
        "mode-copies",
        help="write a store's mode-sorted copies, so streamed MTTKRP runs the run-table kernel",
        description="Write, inside STORE, per mode a copy of its nonzeros with each work item sorted by "
        "that mode's index (16 bytes a nonzero a mode, uncompressed: streaming maps it and decodes "
        "nothing). Streamed MTTKRP and CP-ALS then read a mode's copy and sum each target row's run "
        "once, as in-memory execution does. Bound to the store (refused if edited or copied from "
        "another store); replaced by a new build; tfooc info reports it.",
    )
    mc.add_argument("store", help="store path")
    mc.add_argument(
        "--modes",
        default="auto",
        help="'auto' (default: the modes whose sorted runs average 4 nonzeros or more), 'all', or mode numbers "
        "like 0,2",
    )
    mc.add_argument("--drop", action="store_true", help="remove the store's copies instead")
    mc.set_defaults(func=cmd_mode_copies)

    i = add(
        "info",
        help="describe a store or a dense Zarr array",
        description="Validate a store and print its shape, nonzeros, blocks, chunks, bytes on "
        "disk, compression ratio and per-mode statistics.",
    )
    i.add_argument(
        "store",
        help="store path or URL (a versioned store folder: its latest version; FOLDER@vN: version N), "
        "or a dense Zarr array (shape, chunks, dtype, bytes)",
    )
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.set_defaults(func=cmd_info)
