"""Generation at scale: ``tfooc generate`` straight to a store, and ``tfooc convert`` of a .tns.

    python benchmarks/bench_generate.py [--sizes 5e6,20e6] [--like amazon] [--modes memory,ooc]
                                        [--convert-nnz 5e6] [--dir DIR]

Each run is a fresh process (``python -m tensorflow_ooc.cli generate ...``), as a user runs it.
Reported per size and mode:

- rate: nonzeros / seconds of the ``generate`` command itself (from the process's own timer, so
  interpreter start and imports are out; loading the numba kernels from their cache is in), and
  the rate over the whole process wall time;
- peak temporary disk: bucket folders (``.tfooc-buckets-*``) polled every 20 ms, and beside it the
  peak of buckets plus the staging store being written;
- store bytes per nonzero, and temporary peak / store;
- peak RSS of the process.

Modes: ``memory`` lets ``generate`` choose (in memory when the tensor fits half the free memory);
``ooc`` forces the bucketed out-of-core path (``--out-of-core``) under ``--memory-limit``
(``--ooc-memory-limit``, by default about half the in-memory need, 1 to 4 GiB). ``--convert-nnz`` also writes a .tns
of that many
nonzeros (not timed) and times ``tfooc convert`` on it, out of core. Targets (issue 15, 2 cores):
>= 2.5 M nonzeros/s straight to a store; temporary disk <= 1.5x the final store.

Writes JSON to benchmarks/results/generate-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(ROOT))

from tensorflow_ooc import synthetic  # noqa: E402  (after the path is set)

# runs main() and prints its own seconds last, so the rate excludes interpreter start and imports
_RUNNER = (
    "import sys, time, json; from tensorflow_ooc.cli import main; t = time.perf_counter(); "
    "rc = main(sys.argv[1:]); print(json.dumps({'seconds': time.perf_counter() - t})); sys.exit(rc)"
)


class Poller:
    """Peak bytes of temporary entries in a folder and peak RSS of a process, polled in a thread."""

    def __init__(self, folder: Path, pid: int, store_name: str, every: float = 0.02) -> None:
        self.folder, self.pid, self.store_name, self.every = folder, pid, store_name, every
        self.peak_buckets = self.peak_temp_total = self.peak_rss = 0
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _du(path: str) -> int:
        total = 0
        for root, _, files in os.walk(path):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        return total

    def _run(self) -> None:
        try:
            proc = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            buckets = staging = 0
            try:
                names = os.listdir(self.folder)
            except OSError:
                names = []
            for name in names:
                if name.startswith(".tfooc-buckets-"):
                    buckets += self._du(str(self.folder / name))
                elif name.startswith(f".{self.store_name}.partial-"):
                    staging += self._du(str(self.folder / name))
            self.peak_buckets = max(self.peak_buckets, buckets)
            self.peak_temp_total = max(self.peak_temp_total, buckets + staging)
            try:
                self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
                t = proc.cpu_times()
                self.cpu_seconds = t.user + t.system  # the last reading before exit
            except psutil.NoSuchProcess:
                pass
            time.sleep(self.every)

    def __enter__(self) -> "Poller":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def run_cli(argv: list[str], folder: Path, store_name: str, threads: int | None) -> dict:
    env = dict(os.environ)
    if threads:
        env["NUMBA_NUM_THREADS"] = str(threads)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    with Poller(folder, proc.pid, store_name) as poll:
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"tfooc {' '.join(argv)} failed ({proc.returncode}):\n{err[-4000:]}")
    seconds = json.loads(out.strip().splitlines()[-1])["seconds"]
    return {
        "seconds": seconds,
        "wall_seconds": wall,
        "cpu_seconds": poll.cpu_seconds,
        "cores_busy": poll.cpu_seconds / wall,
        "peak_bucket_bytes": poll.peak_buckets,
        "peak_temp_bytes": poll.peak_temp_total,
        "peak_rss_bytes": poll.peak_rss,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "log_tail": err.strip().splitlines()[-12:],
    }


def store_bytes(path: Path) -> int:
    return Poller._du(str(path))


def ooc_limit(nnz: int) -> str:
    """The memory limit of out-of-core runs: about half the tensor's in-memory need, 1 to 4 GiB."""
    mb = min(4096, max(1024, int(nnz * 24 / 2**20) + 400))
    return f"{mb}MiB"


def bench_generate(folder: Path, shape, nnz: int, mode: str, seed: int, threads: int | None, limit: str | None) -> dict:
    store = folder / f"gen-{nnz}-{mode}.zarr"
    argv = [
        "-q",
        "generate",
        str(store),
        "--shape",
        ",".join(map(str, shape)),
        "--nnz",
        str(nnz),
        "--seed",
        str(seed),
        "--overwrite",
    ]
    if mode == "ooc":
        limit = limit or ooc_limit(nnz)
        argv += ["--memory-limit", limit, "--out-of-core"]
    r = run_cli(argv, folder, store.name, threads)
    sb = store_bytes(store)
    shutil.rmtree(store)
    return {
        "mode": mode,
        "nnz": nnz,
        "memory_limit": limit if mode == "ooc" else None,
        **r,
        "store_bytes": sb,
        "store_bytes_per_nnz": sb / nnz,
        "nnz_per_s": nnz / r["seconds"],
        "nnz_per_s_wall": nnz / r["wall_seconds"],
        "peak_bucket_over_store": r["peak_bucket_bytes"] / sb,
        "peak_temp_over_store": r["peak_temp_bytes"] / sb,
        "argv": ["tfooc", *argv],
    }


def bench_convert(folder: Path, shape, nnz: int, seed: int, threads: int | None) -> dict:
    tns = folder / f"conv-{nnz}.tns"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorflow_ooc.cli",
            "-q",
            "generate",
            str(tns),
            "--shape",
            ",".join(map(str, shape)),
            "--nnz",
            str(nnz),
            "--seed",
            str(seed),
            "--overwrite",
        ],
        check=True,
        cwd=ROOT,
    )
    store = folder / f"conv-{nnz}.zarr"
    limit = ooc_limit(nnz)
    argv = [
        "-q",
        "convert",
        str(tns),
        str(store),
        "--shape",
        ",".join(map(str, shape)),
        "--memory-limit",
        limit,
        "--out-of-core",
        "--overwrite",
    ]
    r = run_cli(argv, folder, store.name, threads)
    sb = store_bytes(store)
    size = tns.stat().st_size
    tns.unlink()
    shutil.rmtree(store)
    return {
        "mode": "convert .tns",
        "nnz": nnz,
        "tns_bytes": size,
        "memory_limit": limit,
        **r,
        "store_bytes": sb,
        "store_bytes_per_nnz": sb / nnz,
        "nnz_per_s": nnz / r["seconds"],
        "nnz_per_s_wall": nnz / r["wall_seconds"],
        "peak_bucket_over_store": r["peak_bucket_bytes"] / sb,
        "peak_temp_over_store": r["peak_temp_bytes"] / sb,
        "argv": ["tfooc", *argv],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5e6,20e6", help="nonzero counts, comma separated (default 5e6,20e6)")
    ap.add_argument("--like", default="amazon", choices=sorted(synthetic.PRESETS), help="shape preset (default amazon)")
    ap.add_argument("--shape", help="explicit shape, e.g. 4821207,1774269,1805187 (overrides --like)")
    ap.add_argument("--modes", default="memory,ooc", help="memory, ooc or both (default both)")
    ap.add_argument(
        "--ooc-memory-limit",
        help="--memory-limit of the ooc mode (default: sized so the tensor does not fit, 600 MiB to 4 GiB)",
    )
    ap.add_argument("--convert-nnz", type=float, default=0, help="also time tfooc convert of a .tns this size (0: no)")
    ap.add_argument(
        "--repeat", type=int, default=1, help="runs of each size and mode (the machine is shared: report the median)"
    )
    ap.add_argument("--threads", type=int, help="NUMBA_NUM_THREADS of the runs (default: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="scratch folder (default: a temporary folder under /work or the system temp)")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else synthetic.PRESETS[args.like][0]
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    parent = args.dir or (str(ROOT.parent) if os.access(ROOT.parent, os.W_OK) else None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-generate-", dir=parent) as d:
        folder = Path(d)
        for nnz in sizes:
            need = nnz * 30
            free = shutil.disk_usage(folder).free
            if free < need:
                raise SystemExit(f"{nnz:,} nonzeros need about {need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free")
            for _ in range(args.repeat):
                for mode in modes:
                    print(f"generate {nnz:,} nonzeros ({mode}) ...", file=sys.stderr, flush=True)
                    rows.append(
                        bench_generate(folder, shape, nnz, mode, args.seed, args.threads, args.ooc_memory_limit)
                    )
        if args.convert_nnz:
            print(f"convert .tns of {int(args.convert_nnz):,} nonzeros ...", file=sys.stderr, flush=True)
            rows.append(bench_convert(folder, shape, int(args.convert_nnz), args.seed, args.threads))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False
    ).stdout.strip()
    result = {
        "shape": shape,
        "cpus": os.cpu_count(),
        "threads": args.threads or os.cpu_count(),
        "commit": commit,
        "rows": rows,
    }
    print(f"\nshape {'x'.join(map(str, shape))}, {os.cpu_count()} cores, commit {commit}")
    print(
        f"{'step':<14}{'nnz':>13}{'limit':>10}{'s':>8}{'M nnz/s':>9}{'wall s':>8}{'M/s wall':>9}{'store B/nz':>11}"
        f"{'tmp peak MB':>12}{'tmp/store':>10}{'+staging':>9}{'RSS MB':>8}{'cores':>6}{'load':>6}"
    )
    for r in rows:
        print(
            f"{r['mode']:<14}{r['nnz']:>13,}{(r['memory_limit'] or '-'):>10}{r['seconds']:>8.2f}"
            f"{r['nnz_per_s'] / 1e6:>9.2f}{r['wall_seconds']:>8.2f}{r['nnz_per_s_wall'] / 1e6:>9.2f}"
            f"{r['store_bytes_per_nnz']:>11.2f}{r['peak_bucket_bytes'] / 2**20:>12.1f}"
            f"{r['peak_bucket_over_store']:>10.2f}{r['peak_temp_over_store']:>9.2f}{r['peak_rss_bytes'] / 2**20:>8.0f}"
            f"{r['cores_busy']:>6.2f}{r['load_before']:>6.1f}"
        )
    if args.repeat > 1:
        print("\nmedian of", args.repeat)
        for nnz in sizes:
            for mode in modes:
                rs = sorted(r["nnz_per_s"] for r in rows if r["nnz"] == nnz and r["mode"] == mode)
                print(
                    f"{mode:<14}{nnz:>13,}  {rs[len(rs) // 2] / 1e6:.2f} M nnz/s (runs: "
                    f"{', '.join(f'{x / 1e6:.2f}' for x in rs)})"
                )
    print(
        "\ns: the command's own time (imports excluded, numba cache loading included); tmp peak: bucket "
        "folders; +staging: buckets + the store being written, over the final store; load: 1-min load "
        "average before the run (other work on the machine); cores: CPU seconds of the process / its wall time"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"generate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
