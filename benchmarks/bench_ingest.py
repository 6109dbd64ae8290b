"""Ingest benchmarks: BLCO construction, .tns parse throughput, bytes per nonzero, out-of-core RSS.

    python benchmarks/bench_ingest.py [--large] [--ooc] [--ooc-gb 2.0] [--repeat 3]

Prints a table and writes JSON to benchmarks/results/ingest-<time>.json. Timings exclude JIT
compilation, which is measured once and reported on its own line. Targets (issue 2, 2 cores):
construction of the uber-shaped tensor <= 0.4 s; end-to-end .tns -> store >= 2.5 M nonzeros/s;
store <= 30 % of raw COO bytes; out-of-core peak RSS under the 512 MB limit.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
import psutil

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.format import BitLayout, alto_words, block_table, encode_coo, sort_nonzeros

RESULTS = Path(__file__).parent / "results"


def best(fn, repeat: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def bench_construction(name: str, repeat: int) -> dict:
    shape, nnz = synthetic.PRESETS[name]
    coords, _ = synthetic.heavy_tailed(shape, nnz, seed=1)
    values = np.random.default_rng(2).random(len(coords))
    layout = BitLayout(shape)
    total, times = best(lambda: encode_coo(coords, values, shape), repeat)
    # breakdown of one run
    t0 = time.perf_counter()
    keys = alto_words(coords, layout)
    t1 = time.perf_counter()
    keys, vals = sort_nonzeros(keys, values.copy(), layout)
    t2 = time.perf_counter()
    block_table(keys, layout, 1 << 24)
    t3 = time.perf_counter()
    return {
        "tensor": name,
        "shape": shape,
        "nnz": len(coords),
        "bits": layout.total_bits,
        "seconds": total,
        "all_seconds": times,
        "linearize_s": t1 - t0,
        "sort_s": t2 - t1,
        "block_s": t3 - t2,
    }


def bench_parse(tmp: Path, repeat: int) -> list[dict]:
    shape, nnz = synthetic.PRESETS["uber"]
    out = []
    for suffix in (".tns", ".tns.gz"):
        path = tmp / f"uber{suffix}"
        synthetic.write_tns(path, synthetic.iter_heavy_tailed(shape, nnz, seed=3))
        size = path.stat().st_size
        store = tmp / "parse.zarr"
        secs, times = best(functools.partial(tfo.convert, path, store, overwrite=True), repeat)
        out.append(
            {
                "input": path.name,
                "bytes": size,
                "nnz": nnz,
                "seconds": secs,
                "all_seconds": times,
                "nnz_per_s": nnz / secs,
                "mb_per_s": size / secs / 1e6,
            }
        )
    return out


def bench_bytes(tmp: Path) -> list[dict]:
    out = []
    rng = np.random.default_rng(4)
    for name in ("uber", "nips", "chicago"):
        shape, nnz = synthetic.PRESETS[name]
        coords, counts = synthetic.heavy_tailed(shape, nnz, seed=5, values="count")
        for kind, values in (("random float64", rng.random(len(coords))), ("integer counts", counts)):
            s = tfo.convert((coords, values), tmp / "bytes.zarr", overwrite=True)
            info = s.info()
            out.append(
                {
                    "tensor": name,
                    "values": kind,
                    "nnz": s.nnz,
                    "bytes_on_disk": info["bytes_on_disk"],
                    "bytes_per_nnz": info["bytes_per_nnz"],
                    "raw_bytes_per_nnz": 8 * len(shape) + 8,
                    "ratio": info["compression_ratio"],
                }
            )
    return out


def bench_ooc(tmp: Path, gigabytes: float, limit_mb: int) -> dict:
    shape = (12092, 9184, 28818)
    bytes_per_line = 24.5
    nnz = int(gigabytes * 1e9 / bytes_per_line)
    path = tmp / "big.tns"
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorflow_ooc.cli",
            "-q",
            "generate",
            str(path),
            "--shape",
            ",".join(map(str, shape)),
            "--nnz",
            str(nnz),
            "--seed",
            "6",
        ],
        check=True,
    )
    gen_s = time.perf_counter() - t0
    written = nnz
    size = path.stat().st_size
    store = tmp / "big.zarr"
    cmd = [
        sys.executable,
        "-m",
        "tensorflow_ooc.cli",
        "-q",
        "convert",
        str(path),
        str(store),
        "--shape",
        ",".join(map(str, shape)),
        "--memory-limit",
        f"{limit_mb}MB",
        "--tmp-dir",
        str(tmp),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = _poll_peak_rss(proc)
    secs = time.perf_counter() - t0
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(err)
    s = tfo.open_store(store)
    assert s.nnz == written, (s.nnz, written)
    return {
        "input_bytes": size,
        "nnz": written,
        "generate_s": gen_s,
        "seconds": secs,
        "nnz_per_s": written / secs,
        "mb_per_s": size / secs / 1e6,
        "memory_limit_mb": limit_mb,
        "peak_rss_mb": peak / 1e6,
        "store_bytes": s.disk_bytes(),
    }


def _poll_peak_rss(proc: subprocess.Popen, every: float = 0.02) -> int:
    """Peak RSS of a running child (polled; the kernel's ru_maxrss would count pages shared at fork)."""
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(every)
    return peak


def copy_bandwidth() -> float:
    a = np.ones(1 << 26)
    b = np.empty_like(a)
    t, _ = best(lambda: np.copyto(b, a), 5)
    return 2 * a.nbytes / t / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--large", action="store_true", help="also the vast-shaped 26 M nonzero construction")
    ap.add_argument("--ooc", action="store_true", help="also the out-of-core conversion of a large .tns")
    ap.add_argument("--ooc-gb", type=float, default=2.1, help="size of the out-of-core .tns (default 2.1 GB)")
    ap.add_argument("--limit-mb", type=int, default=512, help="out-of-core memory limit (default 512)")
    ap.add_argument("--only-ooc", action="store_true", help="run only the out-of-core section")
    ap.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    args = ap.parse_args()

    # JIT compile once on a tiny input and report it separately
    t0 = time.perf_counter()
    c = np.array([[0, 1, 2, 3], [1, 2, 3, 4]])
    encode_coo(c, np.ones(2), (5, 5, 5, 5))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "w.tns"
        p.write_text("1 1 1 1.5\n2 2 2 2.5\n")
        tfo.convert(p, Path(d) / "w.zarr")
    jit_s = time.perf_counter() - t0

    result: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "numba_threads": numba.get_num_threads(),
            "python": platform.python_version(),
            "copy_GBps": copy_bandwidth(),
        },
        "jit_and_first_call_s": jit_s,
    }
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        tmp = Path(d)
        if not args.only_ooc:
            result["construction"] = [bench_construction("uber", args.repeat)]
            if args.large:
                result["construction"].append(bench_construction("vast", args.repeat))
            result["parse"] = bench_parse(tmp, args.repeat)
            result["bytes"] = bench_bytes(tmp)
        if args.ooc or args.only_ooc:
            result["ooc"] = bench_ooc(tmp, args.ooc_gb, args.limit_mb)

    print(f"\nmachine: {result['machine']}; JIT + first call {jit_s:.2f} s (excluded below)\n")
    if args.only_ooc:
        result["construction"], result["parse"], result["bytes"] = [], [], []
    print("BLCO construction from in-memory COO (encode + sort + block), best of", args.repeat)
    print(f"{'tensor':<10}{'nnz':>12}{'bits':>6}{'total s':>10}{'linearize':>11}{'sort':>8}{'block':>8}")
    for r in result["construction"]:
        print(
            f"{r['tensor']:<10}{r['nnz']:>12,}{r['bits']:>6}{r['seconds']:>10.3f}{r['linearize_s']:>11.3f}"
            f"{r['sort_s']:>8.3f}{r['block_s']:>8.3f}"
        )
    print("\n.tns -> store, end to end, best of", args.repeat)
    print(f"{'input':<14}{'MB':>8}{'nnz':>12}{'s':>8}{'M nnz/s':>9}{'MB/s':>8}")
    for r in result["parse"]:
        print(
            f"{r['input']:<14}{r['bytes'] / 1e6:>8.1f}{r['nnz']:>12,}{r['seconds']:>8.2f}"
            f"{r['nnz_per_s'] / 1e6:>9.2f}{r['mb_per_s']:>8.1f}"
        )
    print("\nbytes on disk per nonzero")
    print(f"{'tensor':<10}{'values':<16}{'nnz':>12}{'B/nnz':>8}{'raw B/nnz':>10}{'% of raw':>9}")
    for r in result["bytes"]:
        print(
            f"{r['tensor']:<10}{r['values']:<16}{r['nnz']:>12,}{r['bytes_per_nnz']:>8.2f}"
            f"{r['raw_bytes_per_nnz']:>10}{100 * r['ratio']:>9.1f}"
        )
    if "ooc" in result:
        r = result["ooc"]
        print("\nout-of-core .tns -> store (subprocess, tfooc convert --memory-limit)")
        print(
            f"{'GB':>6}{'nnz':>14}{'s':>8}{'M nnz/s':>9}{'MB/s':>7}{'limit MB':>9}{'peak RSS MB':>12}{'generate s':>11}"
        )
        print(
            f"{r['input_bytes'] / 1e9:>6.2f}{r['nnz']:>14,}{r['seconds']:>8.1f}{r['nnz_per_s'] / 1e6:>9.2f}"
            f"{r['mb_per_s']:>7.1f}{r['memory_limit_mb']:>9}{r['peak_rss_mb']:>12.0f}{r['generate_s']:>11.1f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"ingest-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
