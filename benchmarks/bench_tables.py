"""Tables in: a Parquet event table with three string keys converts, under a memory limit, at a
speed compared with converting the same tensor from an integer ``.tns`` file; and the label
dictionaries' bytes a key.

    python benchmarks/bench_tables.py [--rows 100e6] [--memory-limit 2GB] [--dir storage/bench/tables]

The table has columns ``user`` (``--users`` distinct strings, default 1 M), ``item`` (100 k),
``day`` (365 dates as strings) and ``count`` (1..9); the ``.tns`` file holds the same rows as
1-based integer indices. Each conversion runs as ``tfooc convert`` in its own process, with
``--memory-limit`` and ``--duplicates sum``; its wall time and peak RSS (``wait4``) are measured.
Issue 48's target: 100 M rows under 2 GB at >= 0.5x the ``.tns`` speed, <= 40 bytes a key.
Prints a table and writes JSON to benchmarks/results/tables-<time>.json. The generated files are
kept (``--dir``) and reused when their size matches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc.synthetic.tns_writer import format_tns  # noqa: E402

CHUNK = 1 << 20


def _keys(prefix: str, n: int, width: int) -> pa.Array:
    return pa.array([f"{prefix}{i:0{width}d}" for i in range(n)])


def generate(folder: Path, rows: int, users: int, items: int, days: int, files: int, seed: int) -> tuple[Path, Path]:
    """The Parquet folder and the .tns file of the same rows (made once per size)."""
    stamp = folder / "made.json"
    want = {"rows": rows, "users": users, "items": items, "days": days, "files": files, "seed": seed}
    table_dir, tns = folder / "events", folder / "events.tns"
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return table_dir, tns
    shutil.rmtree(folder, ignore_errors=True)
    table_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    user_keys, item_keys = _keys("user", users, 7), _keys("item", items, 6)
    day_keys = pa.array([str(np.datetime64("2026-01-01") + d) for d in range(days)])
    per_file = -(-rows // files)
    t0 = time.perf_counter()
    with open(tns, "wb") as text:
        done = 0
        for f in range(files):
            n_file = min(per_file, rows - done)
            with pq.ParquetWriter(table_dir / f"part-{f:04d}.parquet", _schema(), compression="snappy") as w:
                at = 0
                while at < n_file:
                    n = min(CHUNK, n_file - at)
                    u = rng.integers(0, users, n)
                    i = rng.integers(0, items, n)
                    d = rng.integers(0, days, n)
                    c = rng.integers(1, 10, n)
                    w.write_table(
                        pa.table(
                            {
                                "user": user_keys.take(pa.array(u)),
                                "item": item_keys.take(pa.array(i)),
                                "day": day_keys.take(pa.array(d)),
                                "count": pa.array(c, pa.int32()),
                            }
                        ),
                        row_group_size=CHUNK,
                    )
                    text.write(format_tns(np.column_stack([u, i, d]), c.astype(np.float64), one_based=True))
                    at += n
            done += n_file
            print(f"  generated {done:,} of {rows:,} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
    stamp.write_text(json.dumps(want))
    return table_dir, tns


def _schema() -> pa.Schema:
    return pa.schema([("user", pa.string()), ("item", pa.string()), ("day", pa.string()), ("count", pa.int32())])


def timed_convert(args: list[str]) -> tuple[float, int, str]:
    """``tfooc convert ARGS`` in its own process: (seconds, peak RSS bytes, its output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "tensorflow_ooc.cli", "convert", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    _, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    out = p.stdout.read() if p.stdout else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"tfooc convert {' '.join(args)} failed ({code}):\n{out}")
    return dt, usage.ru_maxrss * 1024, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=float, default=100e6)
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--files", type=int, default=0, help="Parquet files (default: one per 10 M rows)")
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--dir", default=str(ROOT / "storage" / "bench" / "tables"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rows = int(a.rows)
    files = a.files or max(1, -(-rows // 10_000_000))
    folder = Path(a.dir) / f"rows-{rows}"
    print(f"data: {rows:,} rows, {a.users:,} users x {a.items:,} items x {a.days} days, {files} Parquet file(s)")
    table_dir, tns = generate(folder, rows, a.users, a.items, a.days, files, a.seed)
    table_bytes = sum(p.stat().st_size for p in table_dir.iterdir())
    common = ["--memory-limit", a.memory_limit, "--duplicates", "sum", "--overwrite"]
    t_tns, rss_tns, _ = timed_convert([str(tns), str(folder / "tns.zarr"), *common])
    t_tab, rss_tab, out = timed_convert(
        [str(table_dir), str(folder / "table.zarr"), "--modes", "user,item,day", "--value", "count", *common]
    )
    store = tfo.open_store(folder / "table.zarr")
    ref = tfo.open_store(folder / "tns.zarr")
    labels = store.labels.describe()
    keys = sum(d["count"] for d in labels)
    dict_bytes = sum(d["bytes"] for d in labels)
    result = {
        "rows": rows,
        "nnz": store.nnz,
        "shape": list(store.shape),
        "tns_shape": list(ref.shape),
        "tns_nnz": ref.nnz,
        "same_nnz_and_norm": ref.nnz == store.nnz and ref.norm_sq == store.norm_sq,
        "tns_bytes": tns.stat().st_size,
        "parquet_bytes": table_bytes,
        "memory_limit": a.memory_limit,
        "tns_seconds": t_tns,
        "tns_peak_rss": rss_tns,
        "table_seconds": t_tab,
        "table_peak_rss": rss_tab,
        "speed_vs_tns": t_tns / t_tab,
        "dictionary_bytes": dict_bytes,
        "dictionary_bytes_per_key": dict_bytes / keys,
        "modes": labels,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    mb = 2**20
    print()
    print(f"{'input':<10} {'rows':>13} {'seconds':>9} {'M rows/s':>9} {'peak RSS MiB':>13}")
    print(f"{'.tns':<10} {rows:>13,} {t_tns:>9.1f} {rows / t_tns / 1e6:>9.2f} {rss_tns / mb:>13,.0f}")
    print(f"{'Parquet':<10} {rows:>13,} {t_tab:>9.1f} {rows / t_tab / 1e6:>9.2f} {rss_tab / mb:>13,.0f}")
    print(f"table / .tns speed: {t_tns / t_tab:.2f}x (target >= 0.5x); limit {a.memory_limit}")
    print(f"same tensor: {result['same_nnz_and_norm']} ({store.nnz:,} nonzeros, ||X||^2 {store.norm_sq:.6g} both)")
    print(f"{'mode':<6} {'keys':>10} {'bytes':>12} {'bytes/key':>10}")
    for d in labels:
        print(f"{d['name']:<6} {d['count']:>10,} {d['bytes']:>12,} {d['bytes_per_key']:>10.2f}")
    print(f"dictionaries: {dict_bytes / keys:.2f} bytes a key (target <= 40)")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"tables-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
