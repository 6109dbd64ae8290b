"""Tucker benchmarks (issue 13), by section: sparse TTM kernels and their selector (``ttm``), Tucker
HOOI against pyttb and TensorLy (``hooi``).

    python benchmarks/bench_tucker.py --quick                      # every section at small size
    python benchmarks/bench_tucker.py --sections ttm               # full-size FROSTT shapes
    python benchmarks/bench_tucker.py --sections ttm --tensors uber,nips --rank 16 --threads 2
    python benchmarks/bench_tucker.py --sections hooi                          # HOOI vs pyttb, TensorLy

``ttm``: heavy-tailed synthetic tensors shaped like FROSTT's uber, nips, chicago-crime and
vast-2015 (``tensorflow_ooc.synthetic.PRESETS``; the same seed every run; ``--quick`` keeps the
shapes and takes 1/32 of the nonzeros). For every mode, the layout is sorted once (time reported
apart), then each kernel (``coo``, ``csr``, ``fiber``) runs the mode's TTM by a random
``I_n x R`` matrix, best of several interleaved rounds; GFLOP/s counts ``2 nnz R``. The
selector's pick (the shipped decision tree) is reported with its GFLOP/s, whether it was the
fastest, and its slowdown against the fastest. The chain ``X x_{m != n} U_m`` at rank
``--chain-rank`` (what HOOI runs per mode) is timed after, split into the first sparse TTM and
the Kronecker accumulation of the remaining modes.

``hooi``: ``tucker_hooi`` seconds per iteration at ranks ``--hooi-rank`` (8) per mode against
pyttb's ``tucker_als`` (sparse input) and TensorLy's ``tucker`` (dense input), from the same
initial factors as pyttb (TensorLy draws its own), on the uber-shaped tensor (3.3 M nonzeros) and
copies with every mode but the hours scaled by 1/2, 1/4, 1/8 at uber's density (``--quick``: 1/4
and 1/8). Peers run in a child process each, under a memory limit (``--peer-memory``) and a time
limit (``--peer-timeout``, 10 minutes); a peer whose estimated peak exceeds the limit is reported
out of memory without running (pyttb's sparse TTM makes a dense (prod(shape) / I_m) x J_m array
and two copies of it; TensorLy holds the dense tensor). The speedup against pyttb is taken on the
largest tensor pyttb completes (target >= 20x).

Sections are functions in ``SECTIONS`` taking the parsed arguments and returning a JSON-able dict
with a printable ``table``; more are added beside ``ttm``. Prints the tables; writes JSON to
``benchmarks/results/tucker-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable


def _early_threads(argv: list[str]) -> None:
    # numba reads NUMBA_NUM_THREADS when first imported, so --threads must act before the imports
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            os.environ["NUMBA_NUM_THREADS"] = argv[i + 1]
        elif a.startswith("--threads="):
            os.environ["NUMBA_NUM_THREADS"] = a.split("=", 1)[1]


_early_threads(sys.argv)

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from train_ttm_selector import time_kernels  # noqa: E402

from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels.ttm.chain import (  # noqa: E402
    KERNELS,
    TTMLayouts,
    chain_first_mode,
    chain_order,
    compile_ttm_kernels,
    ttm_chain,
)
from tensorflow_ooc.kernels.ttm.select import load_tree, select_kernel  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TTM_TENSORS = ("uber", "nips", "chicago", "vast")
QUICK_FRACTION = 1 / 32


def _tensor(name: str, fraction: float, seed: int):
    shape, nnz = synthetic.PRESETS[name]
    nnz = max(1, int(nnz * fraction))
    t0 = time.perf_counter()
    coords, values = synthetic.heavy_tailed(shape, nnz, seed=seed)
    return shape, coords, values, time.perf_counter() - t0


def section_ttm(args) -> dict:
    """Every kernel and the selector's pick, every mode of each tensor."""
    jit = compile_ttm_kernels()
    tree = load_tree(device=args.device)
    rng = np.random.default_rng(args.seed)
    rows, chains = [], []
    for name in args.tensors:
        shape, coords, values, gen_s = _tensor(name, args.fraction, args.seed)
        nnz = int(values.shape[0])
        X = TTMLayouts(coords, values, shape)
        for mode in range(len(shape)):
            lay = X.layout(mode)
            U = rng.standard_normal((shape[mode], args.rank))
            secs = time_kernels(lay, U, args.repeat, args.min_seconds, args.device)
            pick = select_kernel(lay, args.rank, device=args.device)
            if pick not in secs:  # the GPU's csr without CuPy: ttm() runs the fallback
                pick = "coo"
            best = min(secs, key=secs.get)
            flops = 2.0 * nnz * args.rank
            rows.append(
                {
                    "tensor": name,
                    "shape": list(shape),
                    "nnz": nnz,
                    "mode": mode,
                    "rank": args.rank,
                    "fibers": lay.nfibers,
                    "sort_seconds": lay.sort_seconds,
                    "seconds": secs,
                    "gflops": {k: flops / t / 1e9 for k, t in secs.items()},
                    "pick": pick,
                    "best": best,
                    "pick_gflops": flops / secs[pick] / 1e9,
                    "slowdown": secs[pick] / secs[best],
                }
            )
        mats = [rng.standard_normal((s, args.chain_rank)) for s in shape]
        for skip in range(len(shape)):
            ttm_chain(X, mats, skip, device=args.device)  # sorts this skip's layout
            best_run = None
            for _ in range(max(1, args.repeat)):
                st = {}
                t0 = time.perf_counter()
                ttm_chain(X, mats, skip, device=args.device, stats=st)
                st["seconds"] = time.perf_counter() - t0
                best_run = st if best_run is None or st["seconds"] < best_run["seconds"] else best_run
            chains.append(
                {
                    "tensor": name,
                    "skip": skip,
                    "rank": args.chain_rank,
                    "seconds": best_run["seconds"],
                    "first_ttm_seconds": best_run["kernel_seconds"],
                    "kernel": best_run["kernel"],
                    "kronecker_seconds": best_run["chain_seconds"],
                    "fibers": best_run["fibers"],
                    "sort_seconds": X.layout(chain_first_mode(shape, skip), chain_order(shape, skip)).sort_seconds,
                }
            )
    picks_best = [r["pick"] == r["best"] for r in rows]
    sl = np.array([r["slowdown"] for r in rows])
    summary = {
        "selection_accuracy": float(np.mean(picks_best)),
        "within_10pct": float(np.mean(sl <= 1.10)),
        "geomean_slowdown": float(np.exp(np.log(sl).mean())),
        "max_slowdown": float(sl.max()),
        "tree_trained": None if tree is None else tree.get("training", {}).get("command"),
        "jit_seconds": jit,
    }
    where = "GPU" if args.device == "gpu" else f"{nb.get_num_threads()} threads"
    lines = [
        f"TTM, R = {args.rank}, {where}, nonzeros x {args.fraction:g} of the FROSTT sizes",
        f"{'tensor':8s} {'mode':>4s} {'nnz':>9s} {'fibers':>9s} {'sort s':>7s} "
        + " ".join(f"{k + ' GF/s':>10s}" for k in KERNELS)
        + f" {'pick':>6s} {'pick GF/s':>10s} {'slowdown':>8s}",
    ]
    for r in rows:
        lines.append(
            f"{r['tensor']:8s} {r['mode']:4d} {r['nnz']:9d} {r['fibers']:9d} {r['sort_seconds']:7.3f} "
            + " ".join(f"{r['gflops'].get(k, float('nan')):10.2f}" for k in KERNELS)
            + f" {r['pick']:>6s} {r['pick_gflops']:10.2f} {r['slowdown']:8.2f}"
        )
    lines.append(
        f"selector: picked the fastest in {summary['selection_accuracy']:.0%} of modes, within 10 % in "
        f"{summary['within_10pct']:.0%}; slowdown against the fastest geomean "
        f"{summary['geomean_slowdown']:.3f}, max {summary['max_slowdown']:.2f}"
    )
    lines.append("")
    lines.append(f"TTM chain (all modes but one), R = {args.chain_rank}")
    lines.append(
        f"{'tensor':8s} {'skip':>4s} {'seconds':>8s} {'first TTM':>9s} {'kernel':>6s} {'Kronecker':>9s} "
        f"{'fibers':>9s} {'sort s':>7s}"
    )
    for c in chains:
        lines.append(
            f"{c['tensor']:8s} {c['skip']:4d} {c['seconds']:8.4f} {c['first_ttm_seconds']:9.4f} "
            f"{c['kernel']:>6s} {c['kronecker_seconds']:9.4f} {c['fibers']:9d} {c['sort_seconds']:7.3f}"
        )
    return {"rows": rows, "chains": chains, "summary": summary, "table": "\n".join(lines)}


HOOI_UBER = ((183, 24, 1140, 1717), 3_309_490)
# pyttb and TensorLy run in a child process each (a peer that runs out of memory or time cannot
# take the benchmark down); the child reads the tensor and the initial factors from an .npz
_HOOI_PEER = r"""
import json, sys, time
import numpy as np
tool, path, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
z = np.load(path)
coords, values, shape, ranks = z["coords"], z["values"], tuple(int(s) for s in z["shape"]), [int(j) for j in z["ranks"]]
init = [None] + [z[f"init{n}"] for n in range(1, len(shape))]
normX2 = float(values @ values)
try:
    if tool == "pyttb":
        import pyttb as ttb
        tiny = ttb.sptensor(np.array([[0, 0, 0], [1, 1, 1]]), np.array([[1.0], [2.0]]), (2, 2, 2))
        ttb.tucker_als(tiny, [1, 1, 1], maxiters=1, printitn=0)       # first-use costs, untimed
        X = ttb.sptensor(coords, values.reshape(-1, 1), shape)
        t0 = time.perf_counter()
        _, _, out = ttb.tucker_als(X, ranks, stoptol=0, maxiters=iters, init=init, printitn=0)
        dt = time.perf_counter() - t0
        fit = float(out["fit"])
    else:
        import tensorly as tl
        from tensorly.decomposition import tucker
        X = np.zeros(shape)
        X[tuple(coords.T)] = values
        t0 = time.perf_counter()
        core, _ = tucker(X, rank=ranks, n_iter_max=iters, init="random", tol=0, random_state=0)
        dt = time.perf_counter() - t0
        fit = 1 - np.sqrt(abs(normX2 - float((np.asarray(core) ** 2).sum()))) / np.sqrt(normX2)
    print(json.dumps({"status": "ok", "seconds_per_iteration": dt / iters, "fit": fit}))
except MemoryError:
    print(json.dumps({"status": "out of memory (MemoryError)"}))
"""


def _uber_scaled(scale: float) -> tuple[tuple[int, ...], int]:
    """The uber shape with every mode but the 24 hours scaled by ``scale``, nonzeros at uber's density."""
    shape, nnz = HOOI_UBER
    out = tuple(s if s == 24 else max(2, int(np.ceil(s * scale))) for s in shape)
    return out, max(1, int(round(nnz * float(np.prod(out, dtype=float)) / float(np.prod(shape, dtype=float)))))


def _peer_bytes(tool: str, shape: tuple[int, ...], ranks: list[int]) -> float:
    """Peak memory estimate of a peer. pyttb's sparse TTM multiplies the unfolding by the factor
    into a dense (prod(shape) / I_m) x J_m array, then turns it into a COO sptensor (N + 1 words
    an entry) and back into a dense tensor: about N + 3 copies of that array for the first mode of
    each chain. TensorLy works on the dense tensor: the tensor, an unfolding and the partial products."""
    N = len(shape)
    total = float(np.prod(shape, dtype=float))
    if tool == "pyttb":
        first = [1 if n == 0 else 0 for n in range(N)]
        return (N + 3) * 8.0 * max(total / shape[m] * ranks[m] for m in first)
    return 4 * 8.0 * total


def _run_hooi_peer(tool: str, npz: Path, iters: int, timeout: float, budget: float) -> dict:
    import resource
    import subprocess

    def limit() -> None:  # a peer that asks for more than the budget gets MemoryError, not the OOM killer
        resource.setrlimit(resource.RLIMIT_AS, (int(budget), int(budget)))

    try:
        p = subprocess.run(
            [sys.executable, "-c", _HOOI_PEER, tool, str(npz), str(iters)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
        )
    except subprocess.TimeoutExpired:
        return {"status": f"did not finish {iters} iterations within {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    if p.returncode == -9:
        return {"status": "out of memory (killed)"}
    err = (p.stderr.strip().splitlines() or ["?"])[-1]
    return {
        "status": "out of memory"
        if "MemoryError" in p.stderr or "Unable to allocate" in p.stderr
        else f"failed: {err[:200]}"
    }


def section_hooi(args) -> dict:
    """Tucker HOOI seconds per iteration against pyttb's tucker_als and TensorLy's tucker."""
    import psutil
    from peers.external import steady

    import tensorflow_ooc as tfo

    scales = (0.25, 0.125) if args.quick else (1.0, 0.5, 0.25, 0.125)
    iters = args.hooi_iters or (4 if args.quick else 6)
    avail = float(psutil.virtual_memory().available)
    budget = min(args.peer_memory or 0.6 * avail, 0.8 * avail)
    rows = []
    work = Path(args.workdir) if getattr(args, "workdir", None) else RESULTS / "tucker-data"
    work.mkdir(parents=True, exist_ok=True)
    for scale in scales:
        shape, nnz = _uber_scaled(scale)
        ranks = [min(args.hooi_rank, s) for s in shape]
        coords, values = synthetic.heavy_tailed(shape, nnz, seed=args.seed)
        nnz = int(values.shape[0])
        rng = np.random.default_rng(args.seed)
        init = [None] + [rng.random((s, j)) for s, j in zip(shape[1:], ranks[1:])]
        store = tfo.convert(
            (coords, values), work / f"uber-x{scale:g}-s{args.seed}.zarr", shape=shape, overwrite=True, progress=False
        )
        r = tfo.tucker_hooi(store, ranks, init=init, max_iters=iters, tol=0, progress=False)
        h = r.history
        row = {
            "tensor": f"uber x{scale:g}",
            "shape": list(shape),
            "nnz": nnz,
            "ranks": ranks,
            "ours": {
                "seconds_per_iteration": steady([x["seconds"] for x in h]),
                "fit": r.fit,
                "first_iteration_seconds": h[0]["seconds"],
                "ttm_seconds": steady([sum(x["ttm_seconds"]) for x in h]),
                "svd_seconds": steady([sum(x["svd_seconds"]) for x in h]),
                "layout_seconds": sum(h[0]["layout_seconds"]),
                "svd_methods": h[-1]["svd_methods"],
                "execution": r.params["execution"],
                "scheduler": r.params["scheduler"],
            },
        }
        npz = work / f"uber-x{scale:g}-s{args.seed}.npz"
        np.savez(
            npz,
            coords=coords,
            values=values.astype(np.float64),
            shape=np.array(shape),
            ranks=np.array(ranks),
            **{f"init{n}": init[n] for n in range(1, len(shape))},
        )
        for tool, peer_iters in (("pyttb", min(iters, 2)), ("tensorly", min(iters, 2))):
            need = _peer_bytes(tool, shape, ranks)
            if need > budget:
                row[tool] = {
                    "status": f"out of memory (needs about {need / 2**30:.0f} GiB, {budget / 2**30:.0f} GiB allowed)",
                    "estimated_bytes": need,
                }
            else:
                row[tool] = _run_hooi_peer(tool, npz, peer_iters, args.peer_timeout, budget)
                row[tool]["estimated_bytes"] = need
            if "seconds_per_iteration" in row[tool]:
                row[tool]["speedup"] = row[tool]["seconds_per_iteration"] / row["ours"]["seconds_per_iteration"]
                # pyttb starts from our initial factors: after as many iterations, the same fit
                row[tool]["ours_fit_after_as_many"] = h[peer_iters - 1]["fit"]
        npz.unlink()
        rows.append(row)
        print(f"  hooi: {row['tensor']} done", flush=True)
    done = [r for r in rows if "speedup" in r["pyttb"]]
    largest = max(done, key=lambda r: r["nnz"]) if done else None
    summary = {
        "largest_pyttb_tensor": largest and largest["tensor"],
        "speedup_vs_pyttb": largest and largest["pyttb"]["speedup"],
        "target_20x_met": bool(largest and largest["pyttb"]["speedup"] >= 20),
    }

    def cell(d: dict) -> str:
        if "seconds_per_iteration" not in d:
            return f"{d['status'][:44]:>44s}"
        return (
            f"{d['seconds_per_iteration']:9.3f} s {d['speedup']:6.1f}x fit {d['fit']:.5f} "
            f"({d['ours_fit_after_as_many']:.5f})"
        )[:44].rjust(44)

    lines = [
        f"Tucker HOOI, ranks {args.hooi_rank} per mode, {nb.get_num_threads()} threads; uber-shaped heavy-tailed "
        f"tensors (modes but the hours scaled, uber's density); s/it steady (median after the first)",
        f"{'tensor':11s} {'nnz':>9s} {'ours s/it':>9s} {'TTM s':>7s} {'SVD s':>6s} {'ours fit':>8s} "
        f"{'pyttb tucker_als: s/it, ours faster by, fit':>44s} {'TensorLy tucker (dense input)':>44s}",
    ]
    for r in rows:
        o = r["ours"]
        lines.append(
            f"{r['tensor']:11s} {r['nnz']:9d} {o['seconds_per_iteration']:9.3f} {o['ttm_seconds']:7.3f} "
            f"{o['svd_seconds']:6.3f} {o['fit']:8.4f} {cell(r['pyttb'])} {cell(r['tensorly'])}"
        )
    lines.append(
        "peer fits after their 2 iterations, ours after as many in brackets (pyttb starts from our "
        "initial factors; TensorLy from its own)"
    )
    if largest:
        lines.append(
            f"largest tensor pyttb completed: {largest['tensor']} ({largest['nnz']:,} nonzeros): ours "
            f"{largest['pyttb']['speedup']:.1f}x faster per iteration (target >= 20x: "
            f"{'met' if summary['target_20x_met'] else 'not met'})"
        )
    return {"rows": rows, "summary": summary, "table": "\n".join(lines)}


SECTIONS: dict[str, Callable] = {"ttm": section_ttm, "hooi": section_hooi}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sections",
        type=lambda s: s.split(","),
        default=list(SECTIONS),
        help=f"comma-separated, of {sorted(SECTIONS)} (default: all)",
    )
    ap.add_argument("--quick", action="store_true", help=f"nonzeros x {QUICK_FRACTION} (shapes kept), fewer repeats")
    ap.add_argument("--tensors", type=lambda s: s.split(","), default=list(TTM_TENSORS))
    ap.add_argument("--fraction", type=float, help="fraction of the FROSTT nonzero counts (default 1, quick 1/32)")
    ap.add_argument("--rank", type=int, default=16, help="TTM matrix columns (default 16)")
    ap.add_argument("--chain-rank", type=int, default=8, help="per-mode rank of the TTM chain (default 8)")
    ap.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="ttm: run the kernels on this device (gpu: numba.cuda, cuSPARSE through CuPy)",
    )
    ap.add_argument("--repeat", type=int, help="timed rounds at the least (default 5, quick 3)")
    ap.add_argument("--min-seconds", type=float, default=0.03, help="rounds go on until each kernel ran this long")
    ap.add_argument("--threads", type=int, help="numba threads (set before numba loads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hooi-rank", type=int, default=8, help="hooi: Tucker rank of every mode (default 8)")
    ap.add_argument("--hooi-iters", type=int, help="hooi: our iterations (default 6, quick 4; peers run 2)")
    ap.add_argument("--peer-timeout", type=float, default=600, help="hooi: seconds a peer may take (default 600)")
    ap.add_argument("--peer-memory", type=float, help="hooi: bytes a peer may use (default 60%% of available memory)")
    ap.add_argument(
        "--workdir", help="hooi: where the tensors' stores are written (default benchmarks/results/tucker-data)"
    )
    args = ap.parse_args(argv)
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown sections {bad}; known: {sorted(SECTIONS)}")
    args.fraction = args.fraction or (QUICK_FRACTION if args.quick else 1.0)
    args.repeat = args.repeat or (3 if args.quick else 5)
    out = {
        "command": " ".join(["python", "benchmarks/bench_tucker.py"] + (argv if argv is not None else sys.argv[1:])),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": nb.get_num_threads(),
        "quick": args.quick,
    }
    for name in args.sections:
        res = SECTIONS[name](args)
        print(res["table"], flush=True)
        out[name] = res
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"tucker-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
