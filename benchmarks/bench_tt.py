"""Tensor-train ALS, exact against randomized (rTT-ALS), in the form of seed 000's Table 5.1.

    python benchmarks/bench_tt.py --tensors uber nell2 --ranks 4 6 8 10 12 --sweeps 40 --trials 5
    python benchmarks/bench_tt.py --tensors uber --ranks 4 --sweeps 5 --trials 2   # a quick look
    python benchmarks/bench_tt.py --tensors nell2 --nnz nell2=76900000 --ranks 4 8 12   # NELL-2's count
    python benchmarks/bench_tt.py --tensors uber --data counts --ranks 4 8   # issue 47: counts, not planted

For each tensor (uber- and nell2-shaped: the preset's shape and nonzero count holding a planted
sparse CP model of rank 8 plus noise; with ``--data counts`` the count tensors of ``bench_apr.py``,
heavy-tailed supports with values ``1 + Geometric(1/2)``, not planted (uber: 3.28 M nonzeros);
with ``--data random`` the heavy-tailed tensors of ``bench_peers.py``; stores made once under
``--workdir``) and each rank ``R`` (every TT rank equal to ``R``), in one run:

- exact TT-ALS (``tt_als(store, R, method="exact")``) for ``--sweeps`` sweeps (tol 0): its final
  fit and steady-state seconds per sweep (median over sweeps 2..; the first compiles kernels);
- randomized rTT-ALS (``method="randomized", samples=J``) for as many sweeps (the first ``--warmup``
  exact, the method's default, not timed), ``--trials`` times
  with other seeds, the fit evaluated at the last sweep only: final fit mean and standard
  deviation, and seconds per sweep without the fit's evaluation (a pass over every nonzero);
- exact CP-ALS at the same rank for ``--cp-iters`` iterations, seconds per iteration: both are
  passes over the nonzeros, so an exact TT sweep is held to at most 2x a CP-ALS iteration.

The fit of every method is that of the whole model against the tensor (``1 - ||X - T|| / ||X||``,
by the inner-product identity). Prints a table and the targets (issue 47: on the uber-shaped
counts a randomized sweep at most 0.5x an exact one with the fit at least 0.97x exact; nell2-shaped,
at least 10x faster a sweep; issue 32: the fit ratios of the planted tensors, an exact sweep at
most 2x a CP-ALS iteration); writes JSON to ``benchmarks/results/tt-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
from bench_apr import count_coo  # noqa: E402
from bench_peers import _git_commit, tensor_files  # noqa: E402,F401  (sets NUMBA_NUM_THREADS from --threads)
from peers.external import steady  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def _sweep_seconds(result) -> float:
    """Steady-state seconds per sweep, without the fit's evaluation (randomized runs evaluate it
    once, at the last sweep: a pass over every nonzero, as costly as an exact core update) and
    without a randomized run's exact warm-up sweeps (the first sketched sweep, which builds the
    fiber indexes, is then the one ``steady`` leaves out)."""
    return steady([h["seconds"] - h.get("fit_seconds", 0.0) for h in result.history if not h.get("warmup")])


def planted_store(name: str, workdir: Path, seed: int, rank: int = 8, noise: float = 0.1, nnz: int | None = None):
    """The preset's shape and nonzero count (or ``nnz``) holding a planted sparse CP model of
    ``rank`` (a TT of ranks ``rank``) plus ``noise``: data with structure to fit (the heavy-tailed
    tensors of ``bench_peers.py`` hold uniform random values, whose fits are near 0 at every rank)."""
    from tensorflow_ooc import synthetic

    shape, preset_nnz = synthetic.PRESETS[name]
    nnz = int(nnz or preset_nnz)
    path = workdir / f"{name}-plantedcp{rank}-n{noise:g}-s{seed}-{nnz}.zarr"
    try:
        return tfo.open_store(path), tuple(shape)
    except Exception:
        t = synthetic.planted_cp(shape, rank, nnz, noise=noise, seed=seed)
        return tfo.convert((t.coords, t.values), path, shape=shape, overwrite=True), tuple(shape)


def counts_store(name: str, workdir: Path, seed: int):
    """``bench_apr.py``'s count tensor (heavy-tailed support, values ``1 + Geometric(1/2)``) as a
    store under ``workdir``, made once under the name ``bench_apr.py`` gives it (no ``.tns``)."""
    from tensorflow_ooc.store.metadata import FORMAT_VERSION

    tag, coords, values, shape = count_coo(name, seed)
    path = workdir / f"{tag}.zarr"
    try:
        store = tfo.open_store(path)
        if store.meta["format_version"] != FORMAT_VERSION:
            raise ValueError("older format")
        return store, shape
    except Exception:
        return tfo.convert((coords, values), path, shape=shape, overwrite=True), shape


def bench_rank(store, rank: int, args) -> dict:
    row: dict = {"rank": rank}
    t0 = time.perf_counter()
    exact = tfo.tt_als(store, rank, method="exact", max_sweeps=args.sweeps, tol=0, seed=args.seed)
    row["exact"] = {
        "fit": exact.fit,
        "sweeps": exact.sweeps,
        "sweep_s": _sweep_seconds(exact),
        "first_sweep_s": exact.history[0]["seconds"],
        "wall_s": time.perf_counter() - t0,
    }
    fits, per_sweep = [], []
    for trial in range(args.trials):
        seed = args.seed + trial
        r = tfo.tt_als(
            store,
            rank,
            method="randomized",
            samples=args.samples,
            max_sweeps=args.sweeps,
            tol=0,
            seed=seed,
            fit_every=args.sweeps,
            warmup=args.warmup,
        )
        fits.append(r.fit)
        per_sweep.append(_sweep_seconds(r))
    row["randomized"] = {
        "fits": fits,
        "fit_mean": float(np.mean(fits)),
        "fit_std": float(np.std(fits)),
        "sweep_s": float(np.median(per_sweep)),
        "sweep_s_trials": per_sweep,
    }
    cp = tfo.cp_als(store, rank, max_iters=args.cp_iters, tol=0, seed=args.seed)
    row["cp_als_iter_s"] = steady([h["seconds"] for h in cp.history])
    row["fit_ratio"] = row["randomized"]["fit_mean"] / row["exact"]["fit"] if row["exact"]["fit"] else None
    row["speedup"] = row["exact"]["sweep_s"] / row["randomized"]["sweep_s"]
    row["exact_vs_cp_iter"] = row["exact"]["sweep_s"] / row["cp_als_iter_s"]
    return row


def targets(name: str, row: dict, data: str = "planted") -> dict:
    """The bars of one row. Issue 47: on the counts tensor a randomized sweep at most 0.5x an exact
    one with the fit at least 0.97x exact; nell2-shaped, a randomized sweep at least 10x faster.
    Issue 32: the fit ratio of a planted tensor (0.99 uber-shaped), an exact sweep against CP."""
    fit_bar = 0.99 if name == "uber" and data == "planted" else 0.97
    out = {"fit_ratio >= %.2f" % fit_bar: row["fit_ratio"] is not None and row["fit_ratio"] >= fit_bar}
    if data == "counts":
        out["rTT sweep <= 0.5x exact"] = row["speedup"] >= 2.0
    if name == "nell2":
        out["speedup >= 10"] = row["speedup"] >= 10.0
    out["exact sweep <= 2x CP-ALS iteration"] = row["exact_vs_cp_iter"] <= 2.0
    return out


def table(out: dict) -> None:
    print()
    print(
        f"{'tensor':8} {'R':>3} | {'exact fit':>9} {'rTT fit (mean ± std)':>22} {'ratio':>6} | "
        f"{'exact s/sw':>10} {'rTT s/sw':>9} {'speedup':>7} | {'CP s/it':>8} {'TT/CP':>6} | targets"
    )
    for name, t in out["tensors"].items():
        for row in t["ranks"]:
            e, r = row["exact"], row["randomized"]
            missed = [k for k, ok in row["targets"].items() if not ok]
            print(
                f"{name:8} {row['rank']:>3} | {e['fit']:9.4f} {r['fit_mean']:13.4f} ± {r['fit_std']:.4f} "
                f"{row['fit_ratio']:6.3f} | {e['sweep_s']:10.3f} {r['sweep_s']:9.3f} {row['speedup']:7.1f} | "
                f"{row['cp_als_iter_s']:8.3f} {row['exact_vs_cp_iter']:6.2f} | "
                + ("met" if not missed else "missed: " + "; ".join(missed))
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", nargs="+", default=["uber", "nell2"], choices=["uber", "nips", "chicago", "nell2"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[4, 6, 8, 10, 12])
    ap.add_argument("--samples", type=int, default=1 << 16, help="rTT-ALS draws per core update (J)")
    ap.add_argument("--sweeps", type=int, default=40, help="sweeps of every TT-ALS run (tol 0)")
    ap.add_argument("--warmup", type=int, default=1, help="rTT-ALS's exact sweeps first (of --sweeps)")
    ap.add_argument("--trials", type=int, default=5, help="randomized runs per rank (seeds seed, seed+1, ...)")
    ap.add_argument("--cp-iters", type=int, default=6, help="CP-ALS iterations timed at each rank")
    ap.add_argument(
        "--data",
        choices=["planted", "counts", "random"],
        default="planted",
        help="planted: a sparse CP model of rank 8 plus 10%% noise on the preset's shape and nonzero count; "
        "counts: bench_apr.py's count tensor (heavy-tailed support, values 1 + Geometric(1/2)); "
        "random: bench_peers.py's heavy-tailed tensor with uniform random values",
    )
    ap.add_argument(
        "--nnz",
        nargs="+",
        default=[],
        metavar="TENSOR=COUNT",
        help="planted nonzeros of a tensor instead of its preset's, e.g. nell2=76900000 (NELL-2's own count)",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="numba threads")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument(
        "--workdir",
        default=str(Path(__file__).parent / "results" / "peer-data"),
        help="where the .tns files and stores are kept between runs (shared with bench_peers.py)",
    )
    args = ap.parse_args(argv)
    try:
        counts = {k: int(float(v)) for k, _, v in (item.partition("=") for item in args.nnz)}
    except ValueError:
        ap.error(f"--nnz takes TENSOR=COUNT, got {args.nnz}")
    if counts and args.data == "counts":
        ap.error("--nnz sets planted tensors' nonzeros; --data counts is bench_apr.py's count tensor as it is")
    out = {
        "benchmark": "tt",
        "commit": _git_commit(__file__),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads},
        "args": vars(args),
        "tensors": {},
    }
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in args.tensors:
        if args.data == "planted":
            store, shape = planted_store(name, workdir, 21, nnz=counts.get(name))
        elif args.data == "counts":
            store, shape = counts_store(name, workdir, 21)
        else:
            _, store_path, coords, _, shape = tensor_files(name, workdir, 21)
            store = tfo.open_store(store_path)
        print(f"{name}: shape {shape}, {store.nnz:,} nonzeros")
        rows = []
        for rank in args.ranks:
            row = bench_rank(store, rank, args)
            row["targets"] = targets(name, row, args.data)
            rows.append(row)
            print(
                f"  R {rank}: exact fit {row['exact']['fit']:.4f} ({row['exact']['sweep_s']:.3f} s/sweep), "
                f"rTT {row['randomized']['fit_mean']:.4f} ± {row['randomized']['fit_std']:.4f} "
                f"({row['randomized']['sweep_s']:.3f} s/sweep), CP-ALS {row['cp_als_iter_s']:.3f} s/it",
                flush=True,
            )
        out["tensors"][name] = {"shape": list(shape), "nnz": int(store.nnz), "ranks": rows}
    table(out)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"tt-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
