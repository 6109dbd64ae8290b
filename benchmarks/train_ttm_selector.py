"""Fit the decision tree that picks the sparse TTM kernel (seed 004, section 5), and ship it.

    python benchmarks/train_ttm_selector.py --quick        # about a minute on 2 cores
    python benchmarks/train_ttm_selector.py                # the full training set
    python benchmarks/train_ttm_selector.py --no-write-tree --threads 2
    python benchmarks/train_ttm_selector.py --device gpu   # a GPU's tree: ttm_selector_gpu.json

A training set of synthetic tensors is generated here: heavy-tailed (skews 1.3-2.2) and uniform
(skew 1) supports of orders 3-5, mode lengths log-uniform in [2, 50 000] (every fourth tensor
with all modes but one shorter than 40), so unfoldings range from short and wide to tall and
narrow, hypersparse to nearly dense. For every tensor, mode and rank R
the three kernels (``coo``, ``csr``, ``fiber``) run on the same cached layout, best of
``--repeat`` after a warm-up; the label is the fastest. The seed's features of the unfolding
(:func:`tensorflow_ooc.kernels.ttm.select.features`) feed a scikit-learn decision tree whose depth
and leaf size are chosen by cross-validation; each leaf answers the kernel with the least mean
log slowdown over its training samples (cost, not votes). It is scored by nested cross-validation
grouped by tensor (a tensor's modes and ranks are never split between training and test): the
accuracy and the slowdown of the picked kernel against the fastest on held-out tensors, beside
the slowdown of always running one kernel. The tree refitted on all samples is written to
``tensorflow_ooc/kernels/ttm/ttm_selector.json`` (read without scikit-learn by ``ttm_select``);
the samples and scores to ``benchmarks/results/ttm-selector-<time>.json``.

Timings on a shared machine are noisy: the minimum of repeats is taken, and near-ties (within
``TIE``) are not counted as mispredictions in the "accuracy within 10 %" score.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numba as nb
import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))

from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.dispatch import numba_threads  # noqa: E402
from tensorflow_ooc.kernels.ttm.chain import KERNELS, TTMLayouts, compile_ttm_kernels, run_kernel  # noqa: E402
from tensorflow_ooc.kernels.ttm.select import FEATURES, TREE_FILE, TREE_FILES, features  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TREE_PATH = Path(__file__).parent.parent / "tensorflow_ooc" / "kernels" / TREE_FILE
TIE = 1.10
MIN_SECONDS = 0.03
MAX_ROUNDS = 200


def training_tensors(count: int, nnz_lo: int, nnz_hi: int, seed: int):
    """(name, coords, values, shape) of ``count`` generated tensors of varied order and shape."""
    rng = np.random.default_rng(seed)
    for t in range(count):
        order = int(rng.integers(3, 6))
        shape = tuple(int(round(math.exp(rng.uniform(math.log(2), math.log(50_000))))) for _ in range(order))
        if t % 4 == 3:
            # one long mode, the others short: few, long, unequal fibers (where the fiber kernel
            # runs out of work items and the COO kernel's nonzero split pays)
            long = int(rng.integers(order))
            shape = tuple(s if m == long else int(rng.integers(2, 40)) for m, s in enumerate(shape))
        cells = math.prod(shape)
        nnz = int(math.exp(rng.uniform(math.log(nnz_lo), math.log(nnz_hi))))
        nnz = max(1, min(nnz, cells // 3))
        uniform = t % 3 == 0
        skew = 1.0 if uniform else float(rng.uniform(1.3, 2.2))
        coords, values = synthetic.heavy_tailed(shape, nnz, skew=skew, seed=int(rng.integers(1 << 30)))
        yield f"t{t}-{'uniform' if uniform else f'skew{skew:.1f}'}", coords, values, shape


def device_kernels(device: str) -> tuple[str, ...]:
    """The kernels that run on ``device`` here (the GPU's ``csr`` needs CuPy)."""
    if device == "gpu":
        from tensorflow_ooc.kernels.ttm.gpu import cupy_available

        return KERNELS if cupy_available() else tuple(k for k in KERNELS if k != "csr")
    return KERNELS


def time_kernels(
    layout, U: np.ndarray, repeat: int, min_seconds: float = MIN_SECONDS, device: str = "cpu"
) -> dict[str, float]:
    """Best time of each kernel. The kernels take turns, round by round, so a busy spell of the
    shared machine slows all of them alike; rounds go on past ``repeat`` until each kernel has
    run ``min_seconds`` in all (at most ``MAX_ROUNDS``), so microsecond kernels get many tries
    at a run that no other process interrupted."""
    kernels = device_kernels(device)
    best = {k: float("inf") for k in kernels}
    spent = {k: 0.0 for k in kernels}
    for k in kernels:
        run_kernel(layout, U, k, device)
    rounds = 0
    while rounds < repeat or (min(spent.values()) < min_seconds and rounds < MAX_ROUNDS):
        for k in kernels:
            t0 = time.perf_counter()
            run_kernel(layout, U, k, device)
            dt = time.perf_counter() - t0
            best[k] = min(best[k], dt)
            spent[k] += dt
        rounds += 1
    return best


def collect(args) -> list[dict]:
    """Time every (tensor, mode, rank) in ``args.passes`` passes over the whole set, keeping each
    kernel's best: a busy spell of the shared machine lasts seconds, a pass minutes, so a sample
    slowed in one pass is rarely slowed in the next. Tensors are generated again each pass (the
    same seed gives the same tensor), so only one is in memory at a time."""
    samples: dict[tuple, dict] = {}
    for p in range(args.passes):
        rng = np.random.default_rng(args.seed + 1 + p)
        for name, coords, values, shape in training_tensors(args.tensors, args.nnz_lo, args.nnz_hi, args.seed):
            X = TTMLayouts(coords, values, shape)
            for mode in range(len(shape)):
                layout = X.layout(mode)
                for R in args.ranks:
                    U = rng.standard_normal((shape[mode], R))
                    times = time_kernels(layout, U, args.repeat, device=args.device)
                    key = (name, mode, R)
                    if key in samples:
                        old = samples[key]["seconds"]
                        times = {k: min(times[k], old[k]) for k in times}
                    samples[key] = {
                        "tensor": name,
                        "shape": list(shape),
                        "nnz": int(values.shape[0]),
                        "mode": mode,
                        "rank": R,
                        "features": features(layout, R),
                        "seconds": times,
                        "sort_seconds": layout.sort_seconds,
                        "best": min(times, key=times.get),
                    }
            print(
                f"pass {p + 1} {name:18s} {str(shape):40s} nnz={values.shape[0]:>8d}  best: "
                + " ".join(s["best"] for s in samples.values() if s["tensor"] == name),
                flush=True,
            )
    return list(samples.values())


def slowdowns(samples: list[dict], picks: list[str]) -> np.ndarray:
    return np.array([s["seconds"][p] / s["seconds"][s["best"]] for s, p in zip(samples, picks)])


def summary(samples: list[dict], picks: list[str]) -> dict:
    sl = slowdowns(samples, picks)
    return {
        "accuracy": float(np.mean([p == s["best"] for s, p in zip(samples, picks)])),
        "within_10pct": float(np.mean(sl <= TIE)),
        "mean_slowdown": float(sl.mean()),
        "geomean_slowdown": float(np.exp(np.log(sl).mean())),
        "max_slowdown": float(sl.max()),
    }


def leaf_kernels(clf, X: np.ndarray, log_slow: np.ndarray) -> dict[int, int]:
    """Per leaf, the kernel (column of ``log_slow``) with the least mean log slowdown over the
    leaf's training samples: the tree's splits come from the labels, its answers from the cost,
    so a leaf where two kernels tie on wins but one loses badly when it loses picks the safe one."""
    leaves = clf.apply(X)
    return {int(leaf): int(np.argmin(log_slow[leaves == leaf].mean(axis=0))) for leaf in np.unique(leaves)}


def fit(samples: list[dict], folds: int, seed: int):
    from sklearn.model_selection import GridSearchCV, GroupKFold
    from sklearn.tree import DecisionTreeClassifier

    X = np.array([[s["features"][f] for f in FEATURES] for s in samples])
    y = np.array([s["best"] for s in samples])
    log_slow = np.log([[s["seconds"].get(k, np.inf) / s["seconds"][s["best"]] for k in KERNELS] for s in samples])
    groups = np.array([s["tensor"] for s in samples])
    grid = {"max_depth": [1, 2, 3, 4, 5, 6], "min_samples_leaf": [1, 3, 6]}
    n_groups = len(set(groups))
    folds = max(2, min(folds, n_groups))

    def search(Xtr, ytr, gtr):
        if len(set(gtr)) < 2:  # too few tensors to cross-validate the depth
            params = {"max_depth": 3, "min_samples_leaf": 1}
            return DecisionTreeClassifier(random_state=seed, **params).fit(Xtr, ytr), params
        inner = max(2, min(folds, len(set(gtr))))
        gs = GridSearchCV(DecisionTreeClassifier(random_state=seed), grid, cv=GroupKFold(n_splits=inner))
        gs.fit(Xtr, ytr, groups=gtr)
        return gs.best_estimator_, gs.best_params_

    # nested cross-validation: held-out tensors never seen by the depth search nor the fit
    picks = np.empty(len(samples), dtype=object)
    for train, test in GroupKFold(n_splits=folds).split(X, y, groups):
        clf, _ = search(X[train], y[train], groups[train])
        answer = leaf_kernels(clf, X[train], log_slow[train])
        picks[test] = [KERNELS[answer[int(leaf)]] for leaf in clf.apply(X[test])]
    clf, params = search(X, y, groups)
    return clf, params, leaf_kernels(clf, X, log_slow), list(picks)


def export_tree(clf, answers: dict[int, int], training: dict) -> dict:
    t = clf.tree_
    leaf_class = [answers.get(node, 0) for node in range(t.node_count)]
    return {
        "features": list(FEATURES),
        "classes": list(KERNELS),
        "left": [int(x) for x in t.children_left],
        "right": [int(x) for x in t.children_right],
        "feature": [int(x) for x in t.feature],
        "threshold": [float(x) for x in t.threshold],
        "leaf_class": leaf_class,
        "training": training,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small training set (about a minute)")
    ap.add_argument("--tensors", type=int, help="training tensors (default 120, quick 30)")
    ap.add_argument("--nnz-lo", type=int, help="fewest nonzeros of a tensor (default 20k, quick 5k)")
    ap.add_argument("--nnz-hi", type=int, help="most nonzeros of a tensor (default 2M, quick 150k)")
    ap.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16])
    ap.add_argument("--repeat", type=int, help="timed runs per kernel, best taken (default 5, quick 3)")
    ap.add_argument("--passes", type=int, default=2, help="timing passes over the whole set, best kept (default 2)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--threads", type=int, help="numba threads (default: numba's)")
    ap.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="time the kernels on this device; gpu writes the GPU's tree file",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write-tree", action="store_true", help=f"do not overwrite {TREE_PATH.name}")
    ap.add_argument("--from-results", help="refit on the samples of an earlier results JSON (no timing)")
    args = ap.parse_args(argv)
    args.tensors = args.tensors or (30 if args.quick else 120)
    args.nnz_lo = args.nnz_lo or (5_000 if args.quick else 20_000)
    args.nnz_hi = args.nnz_hi or (150_000 if args.quick else 2_000_000)
    args.repeat = args.repeat or (3 if args.quick else 5)

    if args.from_results:
        earlier = json.loads(Path(args.from_results).read_text())
        samples, jit, collect_s = earlier["samples"], 0.0, 0.0
        args.tensors = len({s["tensor"] for s in samples})
    else:
        with numba_threads(args.threads):
            jit = compile_ttm_kernels()
            t0 = time.perf_counter()
            samples = collect(args)
            collect_s = time.perf_counter() - t0
    clf, params, answers, picks = fit(samples, args.folds, args.seed)
    held_out = summary(samples, picks)
    timed = [k for k in KERNELS if all(k in s["seconds"] for s in samples)]
    baselines = {k: summary(samples, [k] * len(samples)) for k in timed}
    counts = {k: sum(s["best"] == k for s in samples) for k in timed}
    training = {
        "cv_accuracy": held_out["accuracy"],
        "held_out": held_out,
        "always": baselines,
        "best_counts": counts,
        "samples": len(samples),
        "tensors": args.tensors,
        "params": params,
        "quick": args.quick,
        "passes": getattr(args, "passes", None),
        "device": getattr(args, "device", "cpu"),
        "threads": nb.get_num_threads() if args.threads is None else args.threads,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "command": " ".join(["python", "benchmarks/train_ttm_selector.py"] + (argv or sys.argv[1:])),
    }
    tree = export_tree(clf, answers, training)

    print(
        f"\n{len(samples)} samples from {args.tensors} tensors ({collect_s:.0f} s timing, JIT {jit:.1f} s); "
        f"fastest: {counts}; tree {params}, {sum(1 for x in tree['left'] if x == -1)} leaves"
    )
    print(f"{'':22s} {'accuracy':>9s} {'within10%':>9s} {'mean slow':>9s} {'geo slow':>9s} {'max slow':>9s}")
    for label, row in [("tree (held-out, nested CV)", held_out)] + [(f"always {k}", v) for k, v in baselines.items()]:
        print(
            f"{label:22s} {row['accuracy']:9.3f} {row['within_10pct']:9.3f} {row['mean_slowdown']:9.3f} "
            f"{row['geomean_slowdown']:9.3f} {row['max_slowdown']:9.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"ttm-selector-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"training": training, "tree": tree, "samples": samples, "held_out_picks": [str(p) for p in picks]},
            indent=1,
        )
    )
    print(f"wrote {out}")
    if not args.no_write_tree:
        path = TREE_PATH.parent / TREE_FILES[args.device]
        path.write_text(json.dumps(tree, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
