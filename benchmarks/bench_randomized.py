"""Randomized CP-ALS (STS-CP, CP-ARLS-LEV) against exact CP-ALS: fit and time, same start.

    python benchmarks/bench_randomized.py                                  # uber-like, 3.3 M nonzeros
    python benchmarks/bench_randomized.py --like amazon --nnz 20e6 --samples 65536 --ranks 16 32
    python benchmarks/bench_randomized.py --kind heavy-tailed              # no planted structure

Each tensor is written once with ``tfooc generate`` (kept under ``--workdir``; a planted rank-R
model with noise on a heavy-tailed support by default, so fits are well above the noise floor).
For each rank every method runs ``--iters`` iterations from the same random start (``tol=0``) on
the embedded default, evaluating the exact fit every iteration (``fit_every=1``; the fit's own
exact MTTKRP is timed apart in the history and left out of the "solve" time). Reports per method:
steady seconds per iteration without the fit's MTTKRP, the draw time, the sampled-MTTKRP time, the
final fit and its ratio to exact's, and the time (without fit evaluations) until the fit first
reached 95 % of exact's final fit. Prints a table; writes JSON to
``benchmarks/results/randomized-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tensorflow_ooc as tfo

RESULTS = Path(__file__).parent / "results"
TFOOC = [sys.executable, "-m", "tensorflow_ooc.cli"]
METHODS = ("exact", "sts", "arls-lev", "arls-lev-hybrid")


def steady(xs: list[float]) -> float:
    return float(np.median(xs[1:] if len(xs) > 1 else xs))


def ensure_store(args) -> Path:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    name = f"{args.like}-{args.kind}-{int(args.nnz)}-r{args.planted_rank}-s{args.seed}.zarr"
    store = work / name
    if not store.exists():
        cmd = TFOOC + ["generate", "-q", "--like", args.like, "--nnz", str(int(args.nnz)), "--kind", args.kind,
                       "--seed", str(args.seed), str(store)]
        if args.kind == "planted":
            cmd += ["--rank", str(args.planted_rank), "--noise", str(args.noise)]
        subprocess.run(cmd, check=True)
    return store


def run(store, rank: int, method: str, args) -> dict:
    kw = {} if method == "exact" else {"method": method, "samples": args.samples, "fit_every": 1}
    r = tfo.cp_als(store, rank, seed=args.seed, max_iters=args.iters, tol=0, **kw)
    N = store.nmodes
    rows = []
    for h in r.history:
        rows.append({"fit": h["fit"], "seconds": h["seconds"], "mttkrp": h["mttkrp_seconds"],
                     "update": h["update_seconds"], "sampling": h.get("sampling_seconds", [0.0] * N),
                     "fit_seconds": h.get("fit_seconds", 0.0)})
    return {"method": method, "fit": r.fit, "history": rows, "params": {k: v for k, v in r.params.items()
                                                                       if k != "memory_plan"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--like", default="uber", help="shape of a FROSTT tensor (tfooc generate --like)")
    ap.add_argument("--nnz", type=float, default=3.3e6)
    ap.add_argument("--kind", choices=["planted", "heavy-tailed"], default="planted")
    ap.add_argument("--planted-rank", type=int, default=16)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[16])
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--samples", type=int, default=65536)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=str(RESULTS / "randomized-data"))
    args = ap.parse_args(argv)
    store = tfo.open_store(ensure_store(args))
    print(f"{store.path}: shape {store.shape}, {store.nnz:,} nonzeros")
    results = []
    for rank in args.ranks:
        runs = {}
        for method in ["exact"] + [m for m in args.methods if m != "exact"]:
            print(f"  R{rank} {method}", flush=True)
            runs[method] = run(store, rank, method, args)
        ex = runs["exact"]
        target = 0.95 * ex["fit"]
        for method, res in runs.items():
            hs = res["history"]
            # a randomized iteration also ran the exact MTTKRP of its fit evaluation: not the solve's
            solve = [h["seconds"] - h["fit_seconds"] for h in hs]
            t, reached = 0.0, None
            for h, s in zip(hs, solve):
                t += max(s, 0.0)
                if reached is None and h["fit"] >= target:
                    reached = t
            res.update(rank=rank, solve_s_per_iter=steady(solve), sampling_s=steady([sum(h["sampling"]) for h in hs]),
                       gather_or_mttkrp_s=steady([sum(h["mttkrp"]) for h in hs]),
                       fit_eval_s=steady([h["fit_seconds"] for h in hs]),
                       fit_ratio=res["fit"] / ex["fit"] if ex["fit"] else None, seconds_to_95=reached)
            results.append(res)
    print(f"\n{'R':>4}{'method':>17}{'s/it':>8}{'draw s':>8}{'gather s':>9}{'fit':>9}{'/exact':>8}{'t95 s':>8}")
    for r in results:
        t95 = f"{r['seconds_to_95']:>8.2f}" if r["seconds_to_95"] is not None else f"{'never':>8}"
        print(f"{r['rank']:>4}{r['method']:>17}{r['solve_s_per_iter']:>8.3f}{r['sampling_s']:>8.3f}"
              f"{r['gather_or_mttkrp_s']:>9.3f}{r['fit']:>9.4f}{r['fit_ratio']:>8.3f}{t95}")
    print("s/it: steady seconds per iteration without the fit's exact MTTKRP (randomized methods); gather s: "
          "the sampled MTTKRP of every mode (exact: the MTTKRP); t95: solve seconds until the fit first reached "
          "95% of exact's final fit")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"randomized-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "store": {"path": str(store.path), "shape": store.shape,
                                                              "nnz": store.nnz}, "results": results},
                               indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
