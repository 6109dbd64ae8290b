"""CP-ALS benchmarks: Dask overhead, streaming vs in-memory, peers, and out-of-core memory.

    python benchmarks/bench_cpals.py                  # overhead + streaming/in-memory (nell2-shaped, 20 M)
                                                      # + peers (uber-shaped, 3.3 M)
    python benchmarks/bench_cpals.py --ooc            # adds the out-of-core run (store >= 4x worker memory)
    python benchmarks/bench_cpals.py --sections peers --iters 3
    python benchmarks/bench_cpals.py --sections nonneg  # nonnegative CP-ALS: a store against the same dense array

Prints tables; writes JSON to benchmarks/results/cpals-<time>.json. Targets (issue 4): embedded
LocalCluster iteration <= 1.15x the kernels called directly; streaming >= 70 % of in-memory
throughput; faster per iteration than GenTen through the embedded default; out of core, every
worker's peak RSS under its memory limit. Nonnegative CP-ALS (issue 49): on a store holding every
entry of a dense array, s/iteration within the dense path's for the same tensor, same factors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.decompositions.cp.updates import solve_normal  # noqa: E402
from tensorflow_ooc.ingest import BatchSource  # noqa: E402
from tensorflow_ooc.kernels import StackedFactors, compile_kernels  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def direct_iterations(tensor, rank: int, iters: int, seed: int) -> list[float]:
    """The same CP-ALS iteration with the kernels called directly in this process (no Dask)."""
    rng = np.random.default_rng(seed)
    shape = tensor.shape
    F = StackedFactors(shape, rank)
    for v in F.views:
        v[...] = rng.random(v.shape)
    grams = [v.T @ v for v in F.views]
    out = []
    for it in range(iters):
        t0 = time.perf_counter()
        for n in range(len(shape)):
            V = np.ones((rank, rank))
            for m in range(len(shape)):
                if m != n:
                    V *= grams[m]
            M = tfo.mttkrp(tensor, F, n)
            A = solve_normal(V, M)
            w = np.sqrt((A * A).sum(0)) if it == 0 else np.maximum(np.abs(A).max(0), 1)
            F.views[n][...] = A / w
            grams[n] = F.views[n].T @ F.views[n]
        out.append(time.perf_counter() - t0)
    return out


def dask_iterations(store, rank: int, iters: int, seed: int, execution: str, client=None) -> tuple[list[float], float]:
    r = tfo.cp_als(store, rank, client=client, seed=seed, max_iters=iters, tol=0, execution=execution)
    return [h["seconds"] for h in r.history], r.fit


def make_tensor(name: str, tmp: Path, seed: int = 21):
    shape, nnz = synthetic.PRESETS[name]
    coords, _ = synthetic.heavy_tailed(shape, nnz, seed=seed)
    values = np.random.default_rng(seed + 1).random(len(coords))
    store = tfo.convert((coords, values), tmp / f"{name}.zarr", overwrite=True)
    return coords, values, store


def section_overhead(tmp: Path, args) -> dict:
    coords, values, store = make_tensor(args.large, tmp)
    tensor = tfo.encode_coo(coords, values, store.shape)
    del coords
    direct, in_mem, stream = [], [], []
    fits = {}
    # Rounds interleave the three ways so slow phases of a shared machine hit all of them alike;
    # each run's first iteration (JIT cache loads, partition decode, 2-norm) is dropped.
    for _ in range(args.rounds):
        direct += direct_iterations(tensor, args.rank, args.iters + 1, seed=1)[1:]
        t, fits["in-memory"] = dask_iterations(store, args.rank, args.iters + 1, 1, "in-memory")
        in_mem += t[1:]
        t, fits["streaming"] = dask_iterations(store, args.rank, args.iters + 1, 1, "streaming")
        stream += t[1:]
    res = {
        "tensor": args.large,
        "nnz": store.nnz,
        "rank": args.rank,
        "rounds": args.rounds,
        "direct_s": min(direct),
        "in_memory_s": min(in_mem),
        "streaming_s": min(stream),
        "direct_median_s": float(np.median(direct)),
        "in_memory_median_s": float(np.median(in_mem)),
        "streaming_median_s": float(np.median(stream)),
        "overhead_ratio": min(in_mem) / min(direct),
        "streaming_vs_in_memory": min(in_mem) / min(stream),
        "overhead_ratio_median": float(np.median(in_mem) / np.median(direct)),
        "streaming_vs_in_memory_median": float(np.median(in_mem) / np.median(stream)),
        "all": {"direct": direct, "in_memory": in_mem, "streaming": stream},
        "fit_equal": abs(fits["in-memory"] - fits["streaming"]),
    }
    print(
        f"\nDask overhead and execution modes: {args.large}-shaped, {store.nnz:,} nonzeros, rank {args.rank}, "
        f"{args.rounds} rounds x {args.iters} iterations (after one warm-up each)"
    )
    print(
        f"{'':>8}{'direct kernels s/it':>20}{'embedded in-memory':>20}{'embedded streaming':>20}{'overhead':>10}"
        f"{'stream/in-mem thr.':>20}"
    )
    for tag, sfx in (("best", "_s"), ("median", "_median_s")):
        ratio = res["overhead_ratio" + ("" if tag == "best" else "_median")]
        thr = res["streaming_vs_in_memory" + ("" if tag == "best" else "_median")]
        print(
            f"{tag:>8}{res['direct' + sfx]:>20.3f}{res['in_memory' + sfx]:>20.3f}{res['streaming' + sfx]:>20.3f}"
            f"{ratio:>10.2f}{100 * thr:>19.0f}%"
        )
    return res


def section_peers(tmp: Path, args) -> dict:
    import peers as P

    coords, values, store = make_tensor(args.small, tmp)
    rng = np.random.default_rng(5)
    init = [rng.random((s, args.rank)) for s in store.shape]
    r = tfo.cp_als(store, args.rank, init=init, max_iters=args.iters + 1, tol=0)
    ours = min(h["seconds"] for h in r.history[1:])
    res = {"tensor": args.small, "nnz": store.nnz, "rank": args.rank, "ours_s": ours, "ours_fit": r.fit}
    try:
        g = P.genten_cp_als(coords, values, store.shape, args.rank, iters=args.iters + 1, init=init, method="fastest")
        res.update(
            genten_s=g["seconds_per_iter"],
            genten_method=g.get("method"),
            genten_fit=g.get("fit"),
            genten_ratio=g["seconds_per_iter"] / ours,
        )
    except Exception as exc:
        res["genten_error"] = repr(exc)
    try:
        p = P.pyttb_cp_als(coords, values, store.shape, args.rank, iters=args.pyttb_iters, init=init)
        res.update(pyttb_s=p["seconds_per_iter"], pyttb_ratio=p["seconds_per_iter"] / ours)
    except Exception as exc:
        res["pyttb_error"] = repr(exc)
    print(f"\nPeers: {args.small}-shaped, {store.nnz:,} nonzeros, rank {args.rank}, per iteration, same init")
    print(f"{'ours (embedded) s':>18}{'GenTen s':>10}{'GenTen/ours':>12}{'pyttb s':>10}{'pyttb/ours':>11}")
    g = f"{res['genten_s']:>10.3f}{res['genten_ratio']:>12.2f}" if "genten_s" in res else f"{'err':>10}{'-':>12}"
    p = f"{res['pyttb_s']:>10.2f}{res['pyttb_ratio']:>11.0f}" if "pyttb_s" in res else f"{'err':>10}{'-':>11}"
    print(f"{ours:>18.3f}{g}{p}")
    return res


def section_ooc(tmp: Path, args) -> dict:
    from distributed import Client, LocalCluster

    budget = args.worker_memory_mb * 2**20
    shape = (12092, 9184, 28818)
    nnz = int(args.ooc_factor * budget / 16) + 1
    t0 = time.perf_counter()
    src = BatchSource(synthetic.iter_heavy_tailed(shape, nnz, seed=31), 3, shape, nnz, name="generator")
    store = tfo.convert(src, tmp / "ooc.zarr", shape=shape, memory_limit=2 << 30, overwrite=True)
    build = time.perf_counter() - t0
    decoded = store.nnz * 16
    peaks: dict[int, int] = {}
    stop = threading.Event()
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, memory_limit=budget, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = list(client.run(os.getpid).values())

        def watch():
            procs = [psutil.Process(p) for p in pids]
            while not stop.is_set():
                for p in procs:
                    try:
                        peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                    except psutil.NoSuchProcess:
                        pass
                time.sleep(0.02)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        t0 = time.perf_counter()
        r = tfo.cp_als(store, 16, client=client, seed=1, max_iters=3, tol=0)
        secs = time.perf_counter() - t0
        stop.set()
        w.join()
    res = {
        "nnz": store.nnz,
        "decoded_bytes": decoded,
        "worker_budget": budget,
        "ratio": decoded / budget,
        "execution": r.params["execution"],
        "iterations": r.iterations,
        "seconds": secs,
        "seconds_per_iter": [h["seconds"] for h in r.history],
        "fit": r.fit,
        "store_build_s": build,
        "peak_rss": {str(k): v for k, v in peaks.items()},
        "under_budget": all(v < budget for v in peaks.values()),
    }
    print(
        f"\nOut of core: {store.nnz:,} nonzeros, decoded {decoded / 2**30:.2f} GiB = {res['ratio']:.1f}x the "
        f"{args.worker_memory_mb} MiB worker limit, rank 16, 3 iterations ({r.params['execution']})"
    )
    print(f"{'s/iteration':>12}{'peak worker RSS MiB':>21}{'limit MiB':>10}{'under':>7}")
    print(
        f"{np.mean(res['seconds_per_iter']):>12.2f}{max(peaks.values()) / 2**20:>21.0f}{args.worker_memory_mb:>10}"
        f"{str(res['under_budget']):>7}"
    )
    return res


def section_nonneg(tmp: Path, args) -> dict:
    """Nonnegative CP-ALS (HALS) on a sparse store holding every entry of a dense array against the
    same array given dense, from the same initial factors: s/iteration of each, their ratio, and the
    largest factor difference."""
    rng = np.random.default_rng(49)
    rows = []
    print(
        f"\nNonnegative CP-ALS, store against the same tensor dense: rank {args.rank}, {args.rounds} rounds x "
        f"{args.iters} iterations interleaved (after one warm-up each); s/iteration best (median)"
    )
    print(f"{'shape':>22}{'entries':>11}{'store s/it':>22}{'dense s/it':>22}{'store/dense':>13}{'max |dF|':>10}")
    for text in args.nonneg_shapes:
        shape = tuple(int(v) for v in text.split("x"))
        letters = "".join(chr(105 + n) for n in range(len(shape)))
        planted = [rng.random((n, args.rank)) for n in shape]
        X = np.einsum(",".join(f"{c}r" for c in letters) + "->" + letters, *planted)
        X += 0.05 * X.mean() * rng.random(shape)
        coords = np.argwhere(np.ones(shape, dtype=bool))
        store = tfo.convert((coords, X[tuple(coords.T)]), tmp / f"nonneg-{text}.zarr", shape=shape, overwrite=True)
        del coords
        init = [rng.random((n, args.rank)) for n in shape]
        runs: dict[str, list[float]] = {"store": [], "dense": []}
        last = {}
        for _ in range(args.rounds):
            for kind, source in (("store", store), ("dense", X)):
                r = tfo.cp_als(source, args.rank, init=init, max_iters=args.iters + 1, tol=0, nonnegative=True)
                runs[kind] += [h["seconds"] for h in r.history[1:]]
                last[kind] = r
        diff = max(float(np.abs(a - b).max()) for a, b in zip(last["store"].factors, last["dense"].factors))
        row = {
            "shape": list(shape),
            "entries": int(X.size),
            "rank": args.rank,
            "store_s": min(runs["store"]),
            "dense_s": min(runs["dense"]),
            "store_median_s": float(np.median(runs["store"])),
            "dense_median_s": float(np.median(runs["dense"])),
            "ratio": min(runs["store"]) / min(runs["dense"]),
            "ratio_median": float(np.median(runs["store"]) / np.median(runs["dense"])),
            "max_factor_difference": diff,
            "fit_store": last["store"].fit,
            "fit_dense": last["dense"].fit,
            "execution": last["store"].params.get("execution"),
            "all": runs,
        }
        rows.append(row)
        print(
            f"{text:>22}{X.size:>11,}{row['store_s']:>12.5f} ({row['store_median_s']:.5f})"
            f"{row['dense_s']:>12.5f} ({row['dense_median_s']:.5f}){row['ratio']:>6.2f} ({row['ratio_median']:.2f})"
            f"{diff:>10.1e}"
        )
    return {"rows": rows}


SECTIONS = {"overhead": section_overhead, "peers": section_peers, "ooc": section_ooc, "nonneg": section_nonneg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", nargs="+", default=["overhead", "peers"], choices=list(SECTIONS))
    ap.add_argument("--ooc", action="store_true", help="add the out-of-core section")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="overhead section: interleaved rounds")
    ap.add_argument("--pyttb-iters", type=int, default=1)
    ap.add_argument("--large", default="nell2", help="tensor for overhead/streaming (default nell2, 20 M)")
    ap.add_argument("--small", default="uber", help="tensor for peers (default uber, 3.3 M)")
    ap.add_argument("--worker-memory-mb", type=int, default=450)
    ap.add_argument("--ooc-factor", type=float, default=4.2, help="decoded store size / worker memory")
    ap.add_argument(
        "--nonneg-shapes",
        nargs="+",
        default=["64x64x64", "128x128x128", "24x24x24x24", "12x12x12x12x12"],
        help="nonneg section: dense tensors stored whole",
    )
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    sections = list(args.sections) + (["ooc"] if args.ooc and "ooc" not in args.sections else [])
    jit = compile_kernels(3, (args.rank,)) + compile_kernels(4, (args.rank,))
    print(f"JIT/cache load {jit:.1f} s (excluded); {os.cpu_count()} cpus")
    out: dict = {"jit_s": jit, "args": vars(args)}
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        tmp = Path(d)
        for s in sections:
            out[s] = SECTIONS[s](tmp, args)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"cpals-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
