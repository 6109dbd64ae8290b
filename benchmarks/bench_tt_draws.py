"""rTT-ALS's draws alone: the leverage-score draws of one sweep's core updates, no tensor.

    python benchmarks/bench_tt_draws.py --shapes uber nell2 --ranks 4 8 --samples 65536 16384
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_tt_draws.py ...   # the same on another commit

For each preset shape (uber: order 4, nell2: order 3), rank ``R`` (every TT rank) and draw count
``J``: random cores made left-orthonormal before and right-orthonormal after each target core (as
a sweep leaves them), their sampler trees built first (as the state caches them, off the clock),
then ``draw_core_samples`` for every update of a sweep (cores ``0 .. N-2`` then ``N-1 .. 1``) on
``--threads`` numba threads (rTT-ALS draws on one up to 2^20 walk steps). Prints the median and
minimum over ``--repeats`` sweeps of the sweep's draw seconds, on the thread's CPU clock (``time.
thread_time``: on a shared machine the wall clock holds other processes' time slices) and on the
wall clock, and ns a draw and update; writes JSON to ``benchmarks/results/tt-draws-<time>.json``.
Uses only ``chain_trees`` and ``draw_core_samples``, so it runs on earlier commits as well.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from bench_peers import _git_commit  # noqa: E402

import tensorflow_ooc  # noqa: E402
from tensorflow_ooc.kernels.sampling.tt_sampler import chain_trees, draw_core_samples  # noqa: E402
from tensorflow_ooc.synthetic.presets import PRESETS  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def _orthonormal(core: np.ndarray, side: str) -> np.ndarray:
    Ra, I, Rb = core.shape
    if side == "left":
        q, _ = np.linalg.qr(core.reshape(Ra * I, Rb))
        return q.reshape(Ra, I, Rb)
    q, _ = np.linalg.qr(core.reshape(Ra, I * Rb).T)
    return q.T.reshape(Ra, I, Rb)


def sweep_draws(shape: tuple[int, ...], rank: int, samples: int, repeats: int, seed: int) -> dict:
    """Seconds of a sweep's draws (thread CPU and wall), ``repeats`` sweeps after one untimed."""
    rng = np.random.default_rng(seed)
    N = len(shape)
    ranks = [1] + [min(rank, int(np.prod(shape[:k])), int(np.prod(shape[k:]))) for k in range(1, N)] + [1]
    cores = [rng.standard_normal((ranks[k], shape[k], ranks[k + 1])) for k in range(N)]
    left = [_orthonormal(c, "left") for c in cores]
    right = [_orthonormal(c, "right") for c in cores]
    order = list(range(N - 1)) + list(range(N - 1, 0, -1))
    setups = []
    for j in order:
        cs = [left[k] if k < j else right[k] if k > j else cores[k] for k in range(N)]
        trees = chain_trees(cs, j)
        for tr in trees:
            if tr is not None:
                tr.build_walks()
        setups.append((cs, j, trees))
    cpu, wall = [], []
    for rep in range(repeats + 1):
        c = w = 0.0
        for u, (cs, j, trees) in enumerate(setups):
            c0, w0 = time.thread_time(), time.perf_counter()
            draw_core_samples(cs, j, samples, np.random.default_rng([seed, rep, u]), trees)
            c += time.thread_time() - c0
            w += time.perf_counter() - w0
        if rep:  # the first compiles and warms the caches
            cpu.append(c)
            wall.append(w)
    return {
        "updates": len(order),
        "cpu_s_median": float(np.median(cpu)),
        "cpu_s_min": float(np.min(cpu)),
        "wall_s_median": float(np.median(wall)),
        "ns_per_draw_update": float(np.median(cpu)) / (len(order) * samples) * 1e9,
        "cpu_s": cpu,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["uber", "nell2"], choices=["uber", "nell2", "nips", "chicago"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--samples", nargs="+", type=int, default=[65536, 16384])
    ap.add_argument("--repeats", type=int, default=5, help="timed sweeps (after one untimed)")
    ap.add_argument("--threads", type=int, default=1, help="numba threads of the draws")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    numba.set_num_threads(args.threads)
    rows = []
    print(f"{'shape':8} {'R':>3} {'J':>7} | {'cpu s/sweep':>11} {'(min)':>7} {'wall':>7} | {'ns/draw/update':>14}")
    for name in args.shapes:
        shape = tuple(PRESETS[name][0])
        for rank in args.ranks:
            for samples in args.samples:
                r = sweep_draws(shape, rank, samples, args.repeats, args.seed)
                rows.append({"shape": name, "dims": shape, "rank": rank, "samples": samples, **r})
                print(
                    f"{name:8} {rank:3d} {samples:7d} | {r['cpu_s_median']:11.4f} {r['cpu_s_min']:7.4f} "
                    f"{r['wall_s_median']:7.4f} | {r['ns_per_draw_update']:14.0f}"
                )
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "tt-draws",
        "commit": _git_commit(tensorflow_ooc.__file__),  # of the package measured, not of this script
        "machine": {"platform": platform.platform(), "threads": args.threads},
        "args": vars(args),
        "rows": rows,
    }
    path = RESULTS / f"tt-draws-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
