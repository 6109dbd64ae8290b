"""How fast the quick ``tfooc`` commands start: ``--help``, ``--version``, ``status``, ``logs``, ``cancel``.

    python benchmarks/bench_cli_startup.py               # median of 5 runs per command
    python benchmarks/bench_cli_startup.py --repeat 9

Each command runs as a user runs it, as a new process (the ``tfooc`` script beside this Python, else
``python -m tensorflow_ooc.cli``), and its wall time from start to exit is measured; the median
of ``--repeat`` runs is reported, after one unmeasured run that warms the file cache. ``status``,
``logs`` and ``cancel`` read a real run: a one-step workflow (a tiny ``.tns`` converted to a store)
is run once, under a temporary storage root, before anything is timed. For each command the
table also says whether the process imported Dask, numba or Zarr (``python -X importtime``):
these commands should not, and the target (issue 31) is at most 0.5 s each. Bare Python's
startup (``python -c pass``) is the floor, shown for reference.

Prints a table; writes JSON to ``benchmarks/results/cli-startup-<time>.json``. A benchmark, not a
test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
TARGET_S = 0.5
HEAVY = ("dask", "distributed", "numba", "zarr")


def _tfooc() -> list[str]:
    script = Path(sys.executable).parent / "tfooc"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tensorflow_ooc.cli"]


def _make_run(root: Path) -> str:
    """A finished run under ``root``: a one-step workflow that converts a 3-nonzero ``.tns``."""
    (root / "t.tns").write_text("1 1 1 1.0\n2 3 4 2.0\n3 2 1 1.5\n")
    spec = root / "startup.yaml"
    spec.write_text("name: startup\nsteps:\n  convert: {kind: convert, input: t.tns, out: t.zarr}\n")
    r = subprocess.run([*_tfooc(), "-q", "run", str(spec), "--storage", str(root)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"could not run the workflow the benchmark reads:\n{r.stderr}")
    return r.stdout.split()[1].rstrip(":")  # "run RUN_ID: done in ..."


def _time(argv: list[str], repeat: int) -> list[float]:
    subprocess.run(argv, capture_output=True)  # warm the page cache; not measured
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if r.returncode not in (0, 3):
            raise SystemExit(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr}")
    return out


def _heavy_imports(argv: list[str]) -> list[str]:
    """The heavy top-level packages ``argv`` imports (``-X importtime`` lines at nesting level 0)."""
    cmd = [sys.executable, "-X", "importtime", "-m", "tensorflow_ooc.cli", *argv[len(_tfooc()) :]]
    err = subprocess.run(cmd, capture_output=True, text=True).stderr
    seen = set()
    for line in err.splitlines():
        name = line.rsplit("|", 1)[-1].strip()
        if name in HEAVY:
            seen.add(name)
    return sorted(seen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="runs per command; the median is reported (default 5)")
    args = p.parse_args()
    RESULTS.mkdir(exist_ok=True)
    tfooc = _tfooc()
    with tempfile.TemporaryDirectory(prefix="tfooc-startup-") as tmp:
        root = Path(tmp)
        run_id = _make_run(root)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "tfooc --help": [*tfooc, "--help"],
            "tfooc --version": [*tfooc, "--version"],
            "tfooc status": [*tfooc, "status", "--storage", str(root)],
            "tfooc status RUN": [*tfooc, "status", run_id, "--storage", str(root)],
            "tfooc logs RUN": [*tfooc, "logs", run_id, "--storage", str(root)],
            "tfooc cancel RUN": [*tfooc, "cancel", run_id, "--storage", str(root)],
        }
        rows = []
        for name, argv in commands.items():
            times = _time(argv, args.repeat)
            heavy = [] if name.startswith("python") else _heavy_imports(argv)
            rows.append(
                {
                    "command": name,
                    "median_s": statistics.median(times),
                    "min_s": min(times),
                    "max_s": max(times),
                    "runs_s": times,
                    "heavy_imports": heavy,
                    "within_target": name.startswith("python") or statistics.median(times) <= TARGET_S,
                }
            )
    print(f"tfooc startup, median of {args.repeat} runs ({platform.node()}, {os.cpu_count()} cores, {tfooc[0]})")
    print(f"{'command':<20} {'median s':>9} {'min s':>7} {'max s':>7}  {'imports':<20} target <= {TARGET_S} s")
    for r in rows:
        mark = "" if r["command"].startswith("python") else ("ok" if r["within_target"] else "SLOW")
        imports = ", ".join(r["heavy_imports"]) or "-"
        print(f"{r['command']:<20} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['max_s']:>7.3f}  {imports:<20} {mark}")
    out = RESULTS / f"cli-startup-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "cli-startup",
                "repeat": args.repeat,
                "target_s": TARGET_S,
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "tfooc": tfooc,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"written to {out}")


if __name__ == "__main__":
    main()
