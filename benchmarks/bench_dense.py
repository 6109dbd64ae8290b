"""Dense tensors (issue 14, seed 002): matrix-free MTTKRP kernels, by section.

    python benchmarks/bench_dense.py                          # every section at the full size (~0.7 GB tensors)
    python benchmarks/bench_dense.py --quick                  # a few MB per tensor (CI-sized smoke run)
    python benchmarks/bench_dense.py --sections kernels --ranks 32 --tensors A

Tensors: the seed's tearing-mode A (401 x 201 x 12 x 501) and island-coalescence B
(129 x 129 x 129 x 12 x 39), every mode scaled by the same factor so a float64 copy is about
0.7 GB (``--quick``: about 4 MB), filled with uniform random values.

Section ``kernels``: per tensor and rank (10, 32, 500) the mode-averaged time and throughput of
ELEM, SLICE and TILE (Eq. 6 width) with the seed's model beside each (T_0, T_0,LM, T_inf from
f = N R d and the traffic terms of section IV-B, with tau_f, tau_m and l measured in this run);
then the tile-width sweep at R = 32 in the form of the seed's Table IV, the model's T_0,LM
throughput beside each width (on CPUs a tile is ``w`` wide in every mode but the target and the
innermost one, which it spans whole; see kernels/dense/cpu.py). Throughput is the seed's unit, gflops = f / t /
2^30. ELEM runs for
R <= 32 only (one atomic per element and column: the seed leaves it out on CPUs as well).
Every variant's result is checked against SLICE's. JIT compilation is excluded.

Section ``cpals``: CP-ALS on the same tensors against TensorLy's ``parafac`` (NumPy backend) and
pyttb's ``cp_als`` from the same initial factors, at R = 32 and 500 (``--cpals-ranks``): seconds per
iteration (ours: steady state, the first iteration also loads the kernels) and peak resident memory
beyond the tensor, each run in a fresh process; a peer whose Khatri-Rao product and unfolding would
not fit the free memory is not run, its estimate is printed. Then out of core: a planted dense
Zarr array ``--cpals-ooc-factor`` (4.2) times a worker's memory limit (``--cpals-worker-mb``, 1024)
decomposed on a LocalCluster worker with that limit, against the same array on a worker without a
limit (in memory): seconds per iteration and peak worker RSS (``--quick``: 600 MiB, 4x, rank 16).

Sections are functions ``section_<name>(args, ctx) -> dict`` registered in ``SECTIONS``; ``ctx``
holds the measured machine and the tensors. Prints tables; writes JSON to
benchmarks/results/dense-<time>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numba as nb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tensorflow_ooc.kernels.dense.cpu import dense_mttkrp, tile_items  # noqa: E402
from tensorflow_ooc.kernels.dense.model import Machine, gflops, measure_machine, predict_modes  # noqa: E402
from tensorflow_ooc.kernels.dense.tile import cpu_middle_cache, dense_tile_width  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SEED_SHAPES = {"A": (401, 201, 12, 501), "B": (129, 129, 129, 12, 39)}
FULL_BYTES = 0.7e9
QUICK_BYTES = 4e6
WIDTHS = (2, 4, 6, 8, 10, 12, 14)  # the seed's Table IV sweep
ELEM_MAX_RANK = 32


def scaled_shape(shape: tuple[int, ...], nbytes: float, itemsize: int = 8) -> tuple[int, ...]:
    """``shape`` with every mode scaled by one factor so the tensor holds about ``nbytes``."""
    n = math.prod(shape)
    alpha = (nbytes / itemsize / n) ** (1.0 / len(shape))
    return tuple(max(2, int(round(s * alpha))) for s in shape)


def tensors(names, quick: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in names:
        shape = scaled_shape(SEED_SHAPES[name], QUICK_BYTES if quick else FULL_BYTES)
        out[name] = rng.random(shape)
    return out


def best_time(fn: Callable[[], object], repeat: int, min_total: float = 0.3, max_repeat: int = 50) -> float:
    """Best of at least ``repeat`` runs, repeated until ``min_total`` seconds have passed (at most
    ``max_repeat`` runs): on a shared machine a short call often waits a scheduler quantum (~10 ms)
    for a descheduled thread, so millisecond kernels need many tries."""
    best = math.inf
    spent = 0.0
    n = 0
    while n < repeat or (spent < min_total and n < max_repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        spent += dt
        n += 1
    return best


def warm_up() -> float:
    """Compile (or load from cache) every kernel the sections use; returns seconds spent."""
    t0 = time.perf_counter()
    X = np.random.default_rng(1).random((3, 4, 5, 2))
    A = [np.random.default_rng(2).random((s, 3)) for s in X.shape]
    for variant in ("elem", "slice", "tile"):
        dense_mttkrp(X, A, 1, variant=variant)
    return time.perf_counter() - t0


# --- section: kernels ------------------------------------------------------------------------------


def _modes_time(X, factors, variant, tile, repeat):
    """Best time per mode and the mode-averaged time; the outputs for checking."""
    times, outs = [], []
    for k in range(X.ndim):
        outs.append(dense_mttkrp(X, factors, k, variant=variant, tile=tile))
        times.append(best_time(functools.partial(dense_mttkrp, X, factors, k, variant=variant, tile=tile), repeat))
    return times, outs


def _check(outs, ref, label):
    for k, (a, b) in enumerate(zip(outs, ref)):
        err = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))
        if err > 1e-10:
            raise RuntimeError(f"{label} mode {k}: relative difference {err:.2e} from SLICE")


def _model_row(shape, rank, variant, machine, width, measured):
    items = None
    if variant == "tile":  # the tile sums the CPU kernel writes (rows of a tile are whole)
        items = [tile_items(shape, k, width) for k in range(len(shape))]
    pred = predict_modes(shape, rank, 8, variant, machine, width, items)
    f = pred["flops"]
    return {
        "T": measured,
        "gflops": gflops(f, measured),
        "T_0": pred["T_0"],
        "T_0_lm": pred["T_0_lm"],
        "T_inf": pred["T_inf"],
        "gflops_0_lm": gflops(f, pred["T_0_lm"]),
        "gflops_inf": gflops(f, pred["T_inf"]),
        "T_over_T_0_lm": measured / pred["T_0_lm"],
    }


def section_kernels(args, ctx) -> dict:
    machine: Machine = ctx["machine"]
    out = {"variants": [], "widths": []}
    print("\n== kernels: mode-averaged MTTKRP, model beside each (gflops = f/t/2^30; T in s) ==")
    hdr = (
        f"{'tensor':<22}{'R':>5} {'variant':<10}{'w':>4}{'T':>9}{'gflops':>8}{'T_0':>9}{'T_0,LM':>9}"
        f"{'T_inf':>9}{'T/T_0,LM':>9}"
    )
    print(hdr)
    for name, X in ctx["tensors"].items():
        rng = np.random.default_rng(3)
        for R in args.ranks:
            factors = [rng.random((s, R)) for s in X.shape]
            width = dense_tile_width(X.shape, R, 8)
            ref_times, ref = _modes_time(X, factors, "slice", None, args.repeat)
            runs = [("slice", None, ref_times, ref)]
            for variant, tile in (("tile", None), ("elem", None)):
                if variant == "elem" and R > ELEM_MAX_RANK:
                    continue
                rep = 1 if variant == "elem" else args.repeat
                t, o = _modes_time(X, factors, variant, tile, rep)
                _check(o, ref, f"{name} R={R} {variant}")
                runs.append((variant, tile, t, o))
            for variant, _tile, t, _ in runs:
                w = width if variant == "tile" else None
                row = _model_row(X.shape, R, variant, machine, w, float(np.mean(t)))
                row.update(
                    {"tensor": name, "shape": list(X.shape), "rank": R, "variant": variant, "width": w, "mode_times": t}
                )
                out["variants"].append(row)
                label = f"{name} {'x'.join(map(str, X.shape))}"
                print(
                    f"{label:<22}{R:>5} {variant:<10}{w if w else '-':>4}{row['T']:>9.4f}{row['gflops']:>8.2f}"
                    f"{row['T_0']:>9.4f}{row['T_0_lm']:>9.4f}{row['T_inf']:>9.4f}{row['T_over_T_0_lm']:>9.2f}",
                    flush=True,
                )
    R = 32
    print(
        f"\n== kernels: TILE width sweep at R = {R} (the seed's Table IV), gflops averaged over modes; "
        "model T_0,LM gflops in brackets; * = Eq. 6 width =="
    )
    names = list(ctx["tensors"])
    print(f"{'width':>6}" + "".join(f"{n + ' ' + 'x'.join(map(str, ctx['tensors'][n].shape)):>30}" for n in names))
    sweep = {n: {} for n in names}
    eq6 = {}
    for name, X in ctx["tensors"].items():
        rng = np.random.default_rng(4)
        factors = [rng.random((s, R)) for s in X.shape]
        eq6[name] = dense_tile_width(X.shape, R, 8)
        ref = [dense_mttkrp(X, factors, k, variant="slice") for k in range(X.ndim)]
        for w in WIDTHS:
            t, o = _modes_time(X, factors, "tile", w, args.repeat)
            _check(o, ref, f"{name} width {w}")
            row = _model_row(X.shape, R, "tile", machine, w, float(np.mean(t)))
            row.update({"tensor": name, "rank": R, "width": w, "eq6": w == eq6[name], "mode_times": t})
            sweep[name][w] = row
            out["widths"].append(row)
    for w in WIDTHS:
        cells = []
        for n in names:
            r = sweep[n][w]
            mark = "*" if r["eq6"] else " "
            cells.append(f"{r['gflops']:>12.2f}{mark} [{r['gflops_0_lm']:>9.2f}]")
        print(f"{w:>6}" + "".join(f"{c:>30}" for c in cells))
    out["eq6_width"] = eq6
    return out


# --- section cpals (CP-ALS on dense tensors: against TensorLy and pyttb, and out of core) ---------

CPALS_DEFAULTS = {  # option: (full, --quick)
    "cpals_ranks": ([32, 500], [32, 500]),
    "cpals_iters": (5, 3),
    "cpals_worker_mb": (1024, 600),
    "cpals_ooc_factor": (4.2, 4.0),
    "cpals_ooc_rank": (32, 16),
}


def add_cpals_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``cpals`` section's options; unset ones take the full or ``--quick`` size (CPALS_DEFAULTS)."""
    ap.add_argument("--cpals-ranks", nargs="+", type=int, default=None, help="cpals: ranks against peers (32 500)")
    ap.add_argument("--cpals-iters", type=int, default=None, help="cpals: CP-ALS iterations per run (5; quick 3)")
    ap.add_argument(
        "--cpals-worker-mb",
        type=int,
        default=None,
        help="cpals: worker memory limit of the out-of-core run, MiB (1024; quick 600)",
    )
    ap.add_argument(
        "--cpals-ooc-factor",
        type=float,
        default=None,
        help="cpals: out-of-core array bytes / worker limit (4.2; quick 4.0)",
    )
    ap.add_argument(
        "--cpals-ooc-rank", type=int, default=None, help="cpals: rank of the out-of-core run (32; quick 16)"
    )
    ap.add_argument(
        "--cpals-codec",
        choices=["none", "zstd"],
        default="none",
        help="cpals: compression of the out-of-core Zarr array (default none)",
    )
    ap.add_argument(
        "--cpals-parts",
        nargs="+",
        choices=["peers", "ooc"],
        default=["peers", "ooc"],
        help="cpals: which parts to run (default both)",
    )


def _cpals_opt(args, name: str):
    v = getattr(args, name, None)
    return v if v is not None else CPALS_DEFAULTS[name][1 if args.quick else 0]


def cpals_krp_bytes(shape: tuple[int, ...], rank: int, itemsize: int = 8) -> int:
    """What a Khatri-Rao-product MTTKRP (TensorLy's, pyttb's) holds at its largest mode update:
    the KRP of the other modes (prod_{m != n} I_m x R) and an unfolded copy of the tensor."""
    size = math.prod(shape)
    return max(size // s for s in shape) * rank * itemsize + size * itemsize


def _peak_rss() -> int:
    """This process's peak resident bytes: VmHWM, which a new program image starts afresh (unlike
    ru_maxrss, which keeps the high-water mark of the process that forked it before exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _cpals_child(tool: str, npy: str, rank: int, iters: int, seed: int) -> dict:
    """One tool's CP-ALS of the tensor in ``npy`` in a fresh process: seconds per iteration, fit,
    and the peak resident memory beyond the loaded tensor (the tool's modules imported first)."""
    import psutil

    if tool == "tensorflow_ooc":
        import tensorflow_ooc as tfo
    elif tool == "tensorly":
        import tensorly as tl
        from tensorly.cp_tensor import CPTensor
        from tensorly.decomposition import parafac
    else:
        import pyttb
    X = np.load(npy)
    rng = np.random.default_rng(seed)
    init = [rng.random((s, rank)) for s in X.shape]
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    if tool == "tensorflow_ooc":
        r = tfo.cp_als(X, rank, init=init, max_iters=iters, tol=0)
        wall = time.perf_counter() - t0
        steady = [h["seconds"] for h in r.history[1:]] or [r.history[0]["seconds"]]
        # steady state: the first iteration also loads the kernels from numba's cache (reported apart)
        out = {
            "s_per_iter": float(np.mean(steady)),
            "first_iter_s": r.history[0]["seconds"],
            "wall_s": wall,
            "fit": r.fit,
            "execution": r.params["execution"],
        }
    elif tool == "tensorly":
        tl.set_backend("numpy")
        cp = parafac(
            X,
            rank,
            n_iter_max=iters,
            init=CPTensor((np.ones(rank), [a.copy() for a in init])),
            tol=0,
            normalize_factors=False,
        )
        wall = time.perf_counter() - t0
        out = {"s_per_iter": wall / iters, "wall_s": wall}
        weights, factors = np.asarray(cp.weights), [np.asarray(f) for f in cp.factors]
    else:
        K, _, info = pyttb.cp_als(
            pyttb.tensor(X, copy=False),
            rank,
            maxiters=iters,
            stoptol=0,
            init=pyttb.ktensor([a.copy() for a in init]),
            printitn=0,
        )
        wall = time.perf_counter() - t0
        out = {"s_per_iter": wall / iters, "wall_s": wall, "fit": float(info["fit"])}
    out["peak_beyond_tensor"] = _peak_rss() - rss0
    if "fit" not in out:
        # TensorLy reports no fit: the inner-product identity with the matrix-free kernel, after the peak
        last = len(factors) - 1
        M = dense_mttkrp(np.ascontiguousarray(X), factors, last)
        H = np.outer(weights, weights)
        for f in factors:
            H = H * (f.T @ f)
        nx2 = float(np.vdot(X, X))
        inner = float(((factors[last] * M).sum(0) * weights).sum())
        out["fit"] = 1 - math.sqrt(abs(nx2 + H.sum() - 2 * inner)) / math.sqrt(nx2)
    return out


def _cpals_run(tool: str, npy: str, rank: int, iters: int, seed: int) -> dict:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        try:
            return pool.submit(_cpals_child, tool, npy, rank, iters, seed).result()
        except Exception as exc:  # a peer that fails (out of memory) is reported, not fatal
            return {"error": f"{type(exc).__name__}: {exc}"}


def _cpals_peers(args, ctx, tmp: Path) -> dict:
    import psutil

    ranks, iters = _cpals_opt(args, "cpals_ranks"), _cpals_opt(args, "cpals_iters")
    avail = psutil.virtual_memory().available
    rows = []
    for name, X in ctx["tensors"].items():
        npy = str(tmp / f"{name}.npy")
        np.save(npy, X)
        for rank in ranks:
            row = {"tensor": name, "shape": list(X.shape), "bytes": X.nbytes, "rank": rank}
            for tool in ("tensorflow_ooc", "tensorly", "pyttb"):
                need = cpals_krp_bytes(X.shape, rank) if tool != "tensorflow_ooc" else 0
                if need > 0.8 * avail:
                    row[tool] = {
                        "skipped": f"cannot hold it: its Khatri-Rao product and unfolding need about "
                        f"{need / 2**30:.1f} GiB beyond the tensor, {avail / 2**30:.1f} GiB "
                        f"are available",
                        "estimated_peak_beyond_tensor": need,
                    }
                    continue
                row[tool] = _cpals_run(tool, npy, rank, iters, 1)
            rows.append(row)
    print(
        f"\nDense CP-ALS against TensorLy (parafac, NumPy backend) and pyttb (cp_als): {iters} iterations from "
        f"the same initial factors; peak = resident memory beyond the tensor, a fresh process per run"
    )
    print(f"{'tensor':<7}{'shape':<22}{'R':>5}  {'tool':<16}{'s/iter':>9}{'peak MiB':>10}{'fit':>9}{'ours/peer':>11}")
    for row in rows:
        ours = row["tensorflow_ooc"].get("s_per_iter")
        for tool in ("tensorflow_ooc", "tensorly", "pyttb"):
            r = row[tool]
            head = f"{row['tensor']:<7}{'x'.join(map(str, row['shape'])):<22}{row['rank']:>5}  {tool:<16}"
            if "s_per_iter" not in r:
                print(f"{head}   -- {r.get('skipped') or r.get('error')}")
                continue
            ratio = "" if tool == "tensorflow_ooc" or not ours else f"{ours / r['s_per_iter']:.2f}x"
            print(f"{head}{r['s_per_iter']:>9.3f}{r['peak_beyond_tensor'] / 2**20:>10.0f}{r['fit']:>9.4f}{ratio:>11}")
    return {"rows": rows, "iterations": iters, "available_memory": avail}


def _peak_rss_while(client, fn):
    """``fn()``, sampling the client's worker processes' resident memory every 20 ms; (result, peak)."""
    import psutil
    from peers.common import Sampler

    procs = [psutil.Process(p) for p in client.run(os.getpid).values()]

    def rss(p) -> int:
        try:
            return p.memory_info().rss
        except psutil.NoSuchProcess:
            return 0

    with Sampler(lambda: max((rss(p) for p in procs), default=0)) as peak:
        result = fn()
    return result, peak.peak


def _cpals_ooc(args, tmp: Path) -> dict:
    from distributed import Client, LocalCluster

    import tensorflow_ooc as tfo
    from tensorflow_ooc import synthetic

    limit_mb = _cpals_opt(args, "cpals_worker_mb")
    limit = limit_mb * 2**20
    shape = scaled_shape(SEED_SHAPES["A"], _cpals_opt(args, "cpals_ooc_factor") * limit)
    R, iters = _cpals_opt(args, "cpals_ooc_rank"), _cpals_opt(args, "cpals_iters")
    path = str(tmp / "ooc.zarr")
    t0 = time.perf_counter()
    synthetic.write_planted_dense(path, shape, 10, noise=0.01, seed=0, codec=args.cpals_codec, overwrite=True)
    nbytes = math.prod(shape) * 8
    res: dict = {
        "shape": list(shape),
        "bytes": nbytes,
        "worker_limit": limit,
        "ratio": nbytes / limit,
        "rank": R,
        "codec": args.cpals_codec,
        "write_s": time.perf_counter() - t0,
    }
    # one single-threaded worker process each: with the limit (the plan streams), and without (in memory)
    for label, mem in (("out of core", limit), ("in memory", 0)):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, memory_limit=mem, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            r, peak = _peak_rss_while(
                client, lambda: tfo.cp_als(path, R, client=client, seed=1, max_iters=iters, tol=0)
            )
        steady = [h["seconds"] for h in r.history[1:]] or [r.history[0]["seconds"]]
        res[label] = {
            "execution": r.params["execution"],
            "s_per_iter": float(np.mean(steady)),
            "seconds_per_iter": [h["seconds"] for h in r.history],
            "fit": r.fit,
            "peak_rss": peak,
            "under_limit": (peak < limit) if mem else None,
            "memory_plan": r.params.get("memory_plan"),
        }
    ooc, inm = res["out of core"], res["in memory"]
    res["throughput_vs_in_memory"] = inm["s_per_iter"] / ooc["s_per_iter"]
    print(
        f"\nDense CP-ALS out of core: {'x'.join(map(str, shape))} float64 ({args.cpals_codec} codec) = "
        f"{nbytes / 2**30:.2f} GiB = {res['ratio']:.1f}x the {limit_mb} MiB worker limit, "
        f"rank {R}, {iters} iterations, "
        f"steady-state s/iteration"
    )
    print(f"{'run':<13}{'execution':<12}{'s/iter':>9}{'peak worker RSS MiB':>21}{'limit MiB':>11}{'fit':>9}")
    for label in ("out of core", "in memory"):
        x = res[label]
        print(
            f"{label:<13}{x['execution']:<12}{x['s_per_iter']:>9.3f}{x['peak_rss'] / 2**20:>21.0f}"
            f"{(str(limit_mb) if label == 'out of core' else 'none'):>11}{x['fit']:>9.4f}"
        )
    print(
        f"out-of-core throughput {res['throughput_vs_in_memory']:.2f}x in-memory (target >= 0.7); "
        f"peak worker RSS under the limit: {ooc['under_limit']}"
    )
    return res


def section_cpals(args, ctx) -> dict:
    """Dense CP-ALS (issue 14): against TensorLy's ``parafac`` and pyttb's ``cp_als`` on the section's
    tensors (seconds per iteration, peak memory; where a peer cannot hold its Khatri-Rao product
    the estimate is reported instead), then a planted dense Zarr array ``--cpals-ooc-factor`` times
    a worker's memory limit decomposed on that worker against the same array in memory."""
    import tempfile

    parts = getattr(args, "cpals_parts", ["peers", "ooc"])
    with tempfile.TemporaryDirectory(prefix="bench-dense-cpals-") as d:
        out = {}
        if "peers" in parts:
            out["peers"] = _cpals_peers(args, ctx, Path(d))
        if "ooc" in parts:
            out["out_of_core"] = _cpals_ooc(args, Path(d))
        return out


SECTIONS: dict[str, Callable] = {"kernels": section_kernels, "cpals": section_cpals}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    ap.add_argument("--tensors", nargs="+", default=list(SEED_SHAPES), choices=list(SEED_SHAPES))
    ap.add_argument("--ranks", nargs="+", type=int, default=[10, 32, 500])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    ap.add_argument("--quick", action="store_true", help="tensors of a few MB (smoke run)")
    add_cpals_arguments(ap)
    args = ap.parse_args(argv)
    if args.threads:
        nb.set_num_threads(args.threads)
    jit = warm_up()
    machine = measure_machine(quick=args.quick)
    l2, sharing = cpu_middle_cache()
    info = {
        "cpus": os.cpu_count(),
        "numba_threads": nb.get_num_threads(),
        "python": platform.python_version(),
        "l2_bytes": l2,
        "l2_sharing": sharing,
        **machine.as_dict(),
    }
    print(
        f"machine: {info['cpus']} cpus, {info['numba_threads']} numba threads, L2 {l2 >> 10} KiB; "
        f"tau_f {machine.tau_f / 1e9:.1f} GFLOP/s (GEMM), tau_m {machine.tau_m / 1e9:.1f} GB/s (triad), "
        f"l = {machine.l:.1f}; JIT/cache load {jit:.1f} s (excluded)"
    )
    ctx = {"machine": machine, "tensors": tensors(args.tensors, args.quick), "info": info}
    results = {
        "machine": info,
        "jit_s": jit,
        "quick": args.quick,
        "argv": sys.argv[1:] if argv is None else argv,
        "shapes": {n: list(x.shape) for n, x in ctx["tensors"].items()},
        "sections": {},
    }
    for name in args.sections:
        results["sections"][name] = SECTIONS[name](args, ctx)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"dense-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
