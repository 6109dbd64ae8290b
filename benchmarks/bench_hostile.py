"""Hostile-user sweep: bad .tns files, damaged stores, hostile workflow specs and a fuzz pass, each
run through the real ``tfooc`` command line as a subprocess (issue 28).

    .venv/bin/python benchmarks/bench_hostile.py                      # everything: ~600 cases, ~14 min
    .venv/bin/python benchmarks/bench_hostile.py --only tns --limit 5 # a few cases of one sweep
    .venv/bin/python benchmarks/bench_hostile.py --only store --match norm
    .venv/bin/python benchmarks/bench_hostile.py --only fuzz --fuzz 50 --seed 3 --json out.json
    .venv/bin/python benchmarks/bench_hostile.py --list               # the case tables, nothing run
    .venv/bin/python benchmarks/bench_hostile.py --tfooc OTHER/tfooc  # another build's CLI

Run it with the project's virtual environment: the checks read stores and results in this process
(``tensorflow_ooc.open_store`` / ``load_result``, compared with the benchmark's own parse of the
input). Each ``tfooc`` call costs about 2 s of start-up (imports), so the full run is about 900
calls: ~14 min with the default ``--jobs 2`` on 2 cores, about twice that with ``--jobs 1``.

Every case runs in a fresh temporary directory (``TFOOC_STORAGE`` points into it), each command
with a timeout (``--timeout``, default 120 s) and an address-space limit (``--mem-limit``, default
6 GiB, so that a YAML bomb cannot take the machine), and ends in exactly one outcome:

- ``ok``: every command exited 0 and its result is right, checked independently of the package's
  own checks: the store's nonzeros and values equal a small pure-Python parse of the input (sorted
  coordinates and values compared), ``tfooc info --json`` shows the true nnz, shape and norm (1e-9
  relative), a decomposition's fit is finite and in [0, 1] and its model is not all zero; a
  damaged store gives the undamaged store's results only where the damage cannot matter; a spec
  run wrote its outputs inside the storage root and nothing outside it.
- ``clear error``: a command exited non-zero with a one-line message (``tfooc: error: ...``, an
  argparse ``tfooc CMD: error: ...`` or ``tfooc: run ID failed: ...``) and no ``Traceback``.
- ``traceback``: ``Traceback`` in the output, a signal, or a non-zero exit without such a line.
- ``silent``: exit 0, but something is wrong (wrong nnz, values, shape or norm, NaN/inf printed or
  fitted, an all-zero model, a damaged store whose results differ from the undamaged one's or that
  was accepted although the damage must be refused, a spec violation accepted, data doubled, a
  file written outside the storage root, ...).
- ``hang``: a command ran past the timeout (its whole process group is killed).

A case is judged by its worst command (hang > traceback > silent > clear error > ok). Inputs that
are valid (CRLF line endings, tabs, ...) are expected to come out ``ok``: a clear error on them is
counted as ``clear error`` but listed as "valid input refused" and makes the exit status 1 too.
Inputs that may be either refused or accepted (values whose square overflows, denormals: the
issue allows a refusal or a correct, finite norm) are ``ok`` when refused clearly or when the
result is right.

The five sweeps, each a module of ``benchmarks/hostile/`` (beside ``harness``, which runs a case,
``reference``, the benchmark's own parse and readers, and ``report``): ``tns`` (convert, then info
and cpd where convert succeeded), ``store`` (a small valid store, copied and damaged per case, then
info and cpd compared with the undamaged store's output for the same seed; plus CLI number
checks), ``spec`` (``tfooc run SPEC --storage ROOT``), ``fuzz`` (seeded mutations of a valid .tns,
checked against a reference parser, and of a valid spec, checked against a reference loader) and
``outputs`` (outputs that could destroy the user's data: self-output of every command, a user's
files under ``--overwrite``, two writers, read-only and permission-denied destinations, confusing
messages). ``--list`` prints every case with what it does and, for damaged stores, why an
identical result is or is not acceptable.

Prints per sweep the count of each outcome, every case that is neither ok nor a clear error with
the first lines of its output, and a total line; ``--json PATH`` writes every case. Exit status 0
when no case is silent, traceback or hang (and no valid input was refused), else 1.

Nothing here is committed data: every input is generated at run time in the temporary directory.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the hostile package beside this script

from hostile import harness
from hostile.fuzz_sweep import fuzz_cases
from hostile.harness import REPO, SWEEPS, Case, run_case
from hostile.outputs_sweep import output_cases
from hostile.report import report
from hostile.spec_sweep import spec_cases
from hostile.store_sweep import prepare_store, store_cases
from hostile.tns_sweep import tns_cases


def git_commit() -> str:
    try:
        h = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "tensorflow_ooc"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return h + (f" + {len(dirty.splitlines())} uncommitted package files" if dirty else "")
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=SWEEPS, action="append", help="run only this sweep (repeatable)")
    ap.add_argument("--fuzz", type=int, default=200, help="mutations of the .tns and of the spec (default 200 each)")
    ap.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="cases run at once (default: 2, or 1 on one core; a full run at 1 takes about twice as long)",
    )
    ap.add_argument("--limit", type=int, default=None, help="only the first N cases of each sweep")
    ap.add_argument("--match", default=None, help="only cases whose name contains this")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per command before it counts as a hang")
    ap.add_argument("--mem-limit", type=float, default=6.0, help="GiB of address space per command (default 6)")
    ap.add_argument("--tfooc", default=None, help="the tfooc executable (default .venv/bin/tfooc, else PATH)")
    ap.add_argument("--json", default=None, help="write every case's result here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (printed)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    found = (
        shutil.which(args.tfooc)
        if args.tfooc
        else (harness.TFOOC if Path(harness.TFOOC).exists() else shutil.which("tfooc"))
    )
    if not found:
        ap.error(f"no tfooc executable ({args.tfooc or harness.TFOOC}, nor on PATH): pass --tfooc")
    harness.TFOOC = str(Path(found).absolute())
    harness.TIMEOUT = args.timeout
    harness.MEM_LIMIT = int(args.mem_limit * (1 << 30))
    sweeps = args.only or list(SWEEPS)
    makers = {
        "tns": tns_cases,
        "store": store_cases,
        "spec": spec_cases,
        "fuzz": lambda: fuzz_cases(args.fuzz, args.seed),
        "outputs": output_cases,
    }
    cases: list[Case] = []
    for s in sweeps:
        cs = makers[s]()
        if args.match:
            cs = [c for c in cs if args.match in c.name]
        cases += cs[: args.limit] if args.limit else cs
    if args.list:
        for c in cases:
            print(f"{c.sweep:6s} {c.name:34s} {c.desc}" + (f"\n{'':41s}identical result: {c.why}" if c.why else ""))
        print(f"{len(cases)} cases")
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    try:
        return _run_all(cases, sweeps, args, base)
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _run_all(cases: list[Case], sweeps: list[str], args: argparse.Namespace, base: Path) -> int:
    shared: dict = {"keep": args.keep}
    env = dict(os.environ, TFOOC_STORAGE=str(base / "root"))
    t0 = time.monotonic()
    commit_start = git_commit()
    print(
        f"bench_hostile: {len(cases)} cases ({', '.join(sweeps)}), {args.jobs} at a time, in {base}; "
        f"tfooc = {harness.TFOOC}; commit {commit_start}",
        flush=True,
    )
    if any(c.sweep in ("store", "outputs") for c in cases):
        shared["store"] = prepare_store(base, env)
        for p in shared["store"]["problems"]:
            print(f"WARNING: {p}", flush=True)
    results: list[dict] = []
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futs = {pool.submit(run_case, c, base, shared): c for c in cases}
        for f in concurrent.futures.as_completed(futs):
            r = f.result()
            results.append(r)
            done += 1
            print(
                f"  [{done:4d}/{len(cases)}] {r['outcome']:11s} {r['sweep']}/{r['name']} ({r['seconds']:.1f} s)"
                + (f"  {r['why'][:110]}" if r["outcome"] not in ("ok", "clear error") else ""),
                flush=True,
            )
    order = {(c.sweep, c.name): i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order[(r["sweep"], r["name"])])
    commit_end = git_commit()
    commit = (
        commit_start if commit_end == commit_start else f"{commit_start} (tree changed to {commit_end} during the run)"
    )
    status = report(results, sweeps, time.monotonic() - t0, commit)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "commit": commit,
                    "tfooc": harness.TFOOC,
                    "sweeps": sweeps,
                    "fuzz": args.fuzz,
                    "seed": args.seed,
                    "jobs": args.jobs,
                    "exit_status": status,
                    "cases": results,
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
