"""Memoized mode pairs (a two-level dimension tree) against the in-memory kernels, per tensor and rank.

    python benchmarks/bench_mode_pairs.py --tensors nips gen-o4 uber chicago --ranks 8 16 32 --threads 2

For each tensor (bench_peers' generated tensors: same generator, seed and values) prints the
distinct ``(i_m, i_m+1)`` pairs per nonzero of each pair of modes a CP-ALS sweep updates in turn,
the pairs :func:`~tensorflow_ooc.kernels.mttkrp.mode_pairs.choose_pairs` takes, and per rank and
chosen pair the two modes' MTTKRPs as CP-ALS runs them in memory (mode-sorted copies, per-thread
outputs) against the memoized pair (one pass over the nonzeros for the memo and mode ``a``, one
over the pairs for mode ``b``); best of ``--repeat`` calls, interleaved.

    python benchmarks/bench_mode_pairs.py --stores STORE.zarr ... --ranks 8 --threads 2

With ``--stores``, per store and rank instead: each mode's partition MTTKRP as a one-partition
CP-ALS sweep runs it (``mttkrp_partition`` on the decoded partition with mode-sorted copies),
against the same partition with memoized pairs (``pair_partition`` with the sweep's memo).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _early_threads(argv: list[str]) -> None:
    # numba reads NUMBA_NUM_THREADS when first imported
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            os.environ["NUMBA_NUM_THREADS"] = argv[i + 1]


_early_threads(sys.argv)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from bench_peers import tensor_spec  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels.mttkrp import mode_pairs as mp  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items  # noqa: E402


def _best(fns: dict, repeat: int) -> dict:
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], (time.perf_counter() - t0) * 1e3)
    return best


def _compare(tensor, pair: mp.ModePair, R: int, threads: int, repeat: int, seed: int) -> str:
    """One rank's line: the two modes' in-memory kernels against the memoized pair."""
    shape, a, b = tensor.shape, pair.a, pair.b
    rng = np.random.default_rng(seed + R)
    F = tfo.StackedFactors.from_list([rng.random((s, R)) for s in shape])
    oa, ob = np.zeros((shape[a], R)), np.zeros((shape[b], R))
    Z = np.zeros((pair.groups, R))

    def memo() -> None:
        oa[...] = 0
        mp.pair_first(pair, F.data, F.offsets, Z, oa)
        ob[...] = 0
        mp.pair_second(pair, F.data, F.offsets, Z, ob)

    def kernel() -> None:
        tfo.mttkrp(tensor, F, a, threads=threads)
        tfo.mttkrp(tensor, F, b, threads=threads)

    memo()
    ref = (tfo.mttkrp(tensor, F, a), tfo.mttkrp(tensor, F, b))
    err = max(float(np.abs(o - r).max() / np.abs(r).max()) for o, r in zip((oa, ob), ref))
    best = _best({"kernel": kernel, "memo": memo}, repeat)
    return (
        f"  R{R:<3} pair ({a},{b}): {pair.groups} pairs; kernels {best['kernel']:.2f} ms, "
        f"memoized {best['memo']:.2f} ms ({best['memo'] / best['kernel']:.2f}x); "
        f"largest relative difference {err:.1e}"
    )


def sweep_profile(path: str, R: int, threads: int, repeat: int) -> None:
    """Per mode, ms of a sweep's partition MTTKRP with mode-sorted copies and with memoized pairs."""
    from tensorflow_ooc.execution.pair_tasks import PairMemo, pair_partition
    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition

    store = tfo.open_store(path)
    part = plan_partitions(store, 1, None)[0]
    plain = load_partition(store.path, part, mode_copies=True, threads=threads)
    paired = load_partition(store.path, part, mode_copies=True, threads=threads, mode_pairs=True)
    N = len(store.shape)
    rng = np.random.default_rng(R)
    F = tfo.StackedFactors.from_list([rng.random((s, R)) for s in store.shape])
    best: dict = {}
    for _ in range(repeat):
        memo = PairMemo()
        for m in range(N):
            for kind in ("copies", "pairs"):
                t0 = time.perf_counter()
                if kind == "pairs" and m in paired.mode_pairs:
                    pair_partition(paired, F, m, threads, memo)
                else:
                    mttkrp_partition(plain if kind == "copies" else paired, F, m, threads=threads)
                best[kind, m] = min(best.get((kind, m), float("inf")), (time.perf_counter() - t0) * 1e3)
    pairs = sorted({(p.a, p.b) for p in paired.mode_pairs.values()})
    print(f"\n{path}: R{R}, {threads} thread(s), best of {repeat}, ms per mode; pairs {pairs or 'none'}")
    for kind in ("copies", "pairs"):
        row = [best[kind, m] for m in range(N)]
        print(f"  {kind:<7}" + "".join(f"{x:7.2f}" for x in row) + f"   all {sum(row):6.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", nargs="+", default=["nips", "gen-o4", "uber", "chicago"])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--stores", nargs="+", default=None, help="per-mode sweep profile of these stores instead")
    args = ap.parse_args(argv)
    if args.stores:
        for path in args.stores:
            for R in args.ranks:
                sweep_profile(path, R, args.threads, args.repeat)
        return 0
    for name in args.tensors:
        shape, nnz, skew = tensor_spec(name)
        coords, _ = synthetic.heavy_tailed(shape, nnz, skew=skew, seed=args.seed)
        values = np.random.default_rng(args.seed + 1).random(len(coords))
        tensor = tfo.encode_coo(coords, values, shape)
        items = tensor_items(tensor)
        c, vals = mp.item_nonzeros(items, tensor.layout)
        N = len(shape)
        fr = [mp.pair_fraction(c, shape, m, m + 1) for m in range(N - 1)]
        chosen = mp.choose_pairs(c, shape)
        print(f"\n{name} {'x'.join(map(str, shape))}, {len(coords)} nonzeros, {args.threads} thread(s)")
        print("  distinct pairs a nonzero: " + ", ".join(f"({m},{m + 1}) {f:.3f}" for m, f in enumerate(fr)))
        print(f"  chosen: {chosen or 'none'}")
        for a, b in chosen:
            pair = mp.mode_pair(c, vals, shape, a, b)
            for R in args.ranks:
                print(_compare(tensor, pair, R, args.threads, args.repeat, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
