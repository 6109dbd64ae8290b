"""How reliably FastTuckerPlus (``tucker_sgd``) reaches the noise level on planted models.

    python benchmarks/bench_fasttucker_convergence.py                    # 30 pairs, the defaults
    python benchmarks/bench_fasttucker_convergence.py --pairs 60 --seed 7
    python benchmarks/bench_fasttucker_convergence.py --revive-epochs 0  # without the restart

Issue 13's case: 300 x 200 x 50, 200 k observed entries of a planted FastTucker model
(J = R = 8, ``--planted-rank``) with 5 % noise, fitted at J = R = 8 with a 90/10 split for 50
epochs (no early stop). Each pair is a fresh planted model and a fresh start, drawn from
``--seed``. Prints each pair's final test RMSE over the noise level, its lost-component
restarts, the count above 1.2 x and the median, table + JSON
(``benchmarks/results/fasttucker-convergence-<time>.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=30, help="fresh (planted model, start) pairs (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="seed the pairs are drawn from (default: fresh)")
    ap.add_argument("--planted-rank", type=int, default=8, help="J = R of the planted model (default 8)")
    ap.add_argument("--rank", type=int, default=8, help="J = R fitted (default 8)")
    ap.add_argument("--epochs", type=int, default=50, help="epochs per run (default 50)")
    ap.add_argument("--revive-epochs", type=int, default=10, help="tucker_sgd's revive_epochs (default 10)")
    ap.add_argument("--bar", type=float, default=1.2, help="test RMSE / noise counted as reached (default 1.2)")
    ap.add_argument("--json", help="JSON output path")
    args = ap.parse_args(argv)
    seed = int(np.random.SeedSequence(args.seed).entropy % 2**63) if args.seed is None else args.seed
    rng = np.random.default_rng(seed)
    rows = []
    t_all = time.perf_counter()
    print(
        f"planted 300 x 200 x 50, J = R = {args.planted_rank}, 200,000 entries, 5 % noise; fitted at "
        f"J = R = {args.rank}, {args.epochs} epochs, revive_epochs {args.revive_epochs}; pairs from seed {seed}"
    )
    print("| pair | final test RMSE / noise | best | epochs to < bar | restarts (epoch: component) | s |")
    print("|---|---|---|---|---|---|")
    for k in range(args.pairs):
        p = synthetic.planted_fasttucker(
            (300, 200, 50), args.planted_rank, args.planted_rank, 200_000, noise=0.05, seed=int(rng.integers(2**31))
        )
        store = tfo.convert((p.coords, p.values), f"memory://convergence-{seed}-{k}", shape=p.shape)
        t0 = time.perf_counter()
        r = tfo.tucker_sgd(
            store,
            args.rank,
            args.rank,
            test_fraction=0.1,
            epochs=args.epochs,
            seed=int(rng.integers(2**31)),
            progress=False,
            patience=None,
            revive_epochs=args.revive_epochs,
        )
        ratios = [h["test_rmse"] / p.noise_std for h in r.history]
        restarts = [
            (h["epoch"], h["revived"]["component"]) for h in r.history if "revived" in h and h["revived"]["kept"]
        ]
        reach = next((e + 1 for e, x in enumerate(ratios) if x < args.bar), None)
        row = {
            "pair": k,
            "final": ratios[-1],
            "best": min(ratios),
            "epochs_to_bar": reach,
            "restarts": restarts,
            "seconds": time.perf_counter() - t0,
        }
        rows.append(row)
        print(
            f"| {k} | {row['final']:.3f} | {row['best']:.3f} | {reach if reach else '-'} | "
            f"{', '.join(f'{e}: {c}' for e, c in restarts) or '-'} | {row['seconds']:.1f} |",
            flush=True,
        )
    final = np.array([r["final"] for r in rows])
    above = int((final >= args.bar).sum())
    print(
        f"{above} of {len(rows)} pairs end at or above {args.bar} x the noise; median {np.median(final):.3f}, "
        f"max {final.max():.3f} ({time.perf_counter() - t_all:.0f} s)"
    )
    out = Path(args.json) if args.json else RESULTS / f"fasttucker-convergence-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"seed": seed, "args": vars(args), "above_bar": above, "median": float(np.median(final)), "pairs": rows},
            indent=1,
        )
    )
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
