"""CPU MTTKRP benchmark: FROSTT-shaped synthetic tensors, every mode, ranks 16 and 32, with peers.

    python benchmarks/bench_mttkrp.py                   # the suite of issue 3 (uber, nips, chicago, nell2, hypersparse)
    python benchmarks/bench_mttkrp.py --tensors uber --ranks 32 --no-peers
    python benchmarks/bench_mttkrp.py --tensors vast --ranks 32

Per tensor and rank it reports per-mode and all-mode MTTKRP time (best of --repeat; the public
``mttkrp``, which reads each mode's sorted copy of the items where it keeps one, and beside it the
same kernels on the ALTO-ordered items, "ALTO-order"), nonzeros x
modes per second, achieved bandwidth for the minimal traffic against the copy bandwidth measured
in the same run, the time over the performance-model floor (seed 002 section IV-B: flops
f = nnz R N; traffic m_0,LM = index and value bytes + output + factor rows read at L2 speed),
the slowest/fastest mode ratio, and GenTen (pygenten, fastest method) and pyttb in the same run.
JIT compilation is timed once up front and excluded. Prints a table; writes JSON to
benchmarks/results/mttkrp-<time>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numba as nb
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels import StackedFactors, compile_kernels, run_items, tensor_items  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SUITE = ("uber", "nips", "chicago", "nell2", "hypersparse")
# GenTen's CPU methods that give correct results with 2 threads (Atomic is the reference the
# peers module checks the others against); Single races with more than one thread.
GENTEN_METHODS = ["Atomic", "Perm", "Duplicated", "Default", "All-Atomic", "All-Duplicated", "All-Iterated"]


# --- machine characteristics, measured in this run ---------------------------------------------------


@nb.njit(parallel=True, cache=True)
def _par_copy(dst, src, reps):
    for _ in range(reps):
        for i in nb.prange(src.shape[0]):
            dst[i] = src[i]


@nb.njit(parallel=True, cache=True)
def _fma_peak(out, iters, coef):
    """64 independent multiply-add chains per thread; coefficients come from an array so the
    compiler cannot fold the loop."""
    for t in nb.prange(out.shape[0]):
        a = np.empty(64)
        for r in range(64):
            a[r] = 1.0 + (r + t) * 1e-9
        c0, c1 = coef[0], coef[1]
        for _ in range(iters):
            for r in range(64):
                a[r] = a[r] * c0 + c1
        out[t] = a.sum()


def _best(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def machine() -> dict:
    """Copy bandwidth (DRAM-sized and L2-sized arrays, read + write counted) and FMA throughput."""
    big = np.ones(1 << 25)
    dst = np.empty_like(big)
    t = _best(lambda: _par_copy(dst, big, 1), 5)
    dram = 2 * big.nbytes / t
    small = np.ones(40_000)  # 320 KB: inside L2 per core
    sdst = np.empty_like(small)
    t = _best(lambda: _par_copy(sdst, small, 2000), 3)
    l2 = 2 * small.nbytes * 2000 / t
    threads = nb.get_num_threads()
    out = np.empty(threads * 4)
    iters = 2_000_000
    coef = np.array([0.999999999, 1e-9])
    t = _best(lambda: _fma_peak(out, iters, coef), 3)
    flops = 2 * 64 * iters * out.shape[0] / t
    if not np.isfinite(out).all():
        raise RuntimeError("FMA probe diverged")
    return {
        "copy_GBps": dram / 1e9,
        "l2_copy_GBps": l2 / 1e9,
        "l2_ratio": l2 / dram,
        "fma_GFLOPs": flops / 1e9,
        "threads": threads,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def model(nnz: int, shape, R: int, mode: int, m: dict) -> dict:
    """Seed 002 IV-B models adapted to sparse BLCO (8-byte index + value per nonzero)."""
    N = len(shape)
    f = nnz * R * N
    stream = 16 * nnz
    out_bytes = 8 * R * shape[mode]
    m_inf = stream + 8 * R * sum(shape)
    m_0lm = stream + out_bytes + 8 * nnz * R * (N - 1) / m["l2_ratio"]
    tau_f, tau_m = m["fma_GFLOPs"] * 1e9, m["copy_GBps"] * 1e9
    return {
        "flops": f,
        "m_inf": m_inf,
        "m_0lm": m_0lm,
        "T_inf": f / tau_f + m_inf / tau_m,
        "T_0lm": f / tau_f + m_0lm / tau_m,
    }


# --- the benchmark -------------------------------------------------------------------------------------


def _zeroed(out: np.ndarray) -> np.ndarray:
    out[...] = 0
    return out


def bench_tensor(name: str, ranks, repeat: int, peers: bool, m: dict, threads: int, pyttb_modes: int) -> list[dict]:
    shape, nnz = synthetic.PRESETS[name]
    t0 = time.perf_counter()
    coords, _ = synthetic.heavy_tailed(shape, nnz, seed=11)
    values = np.random.default_rng(12).random(len(coords))
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tensor = tfo.encode_coo(coords, values, shape)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tensor_items(tensor)
    plan_s = time.perf_counter() - t0
    rows = []
    for R in ranks:
        rng = np.random.default_rng(R)
        F = StackedFactors.from_list([rng.random((s, R)) for s in shape])
        outs = [np.zeros((s, R)) for s in shape]
        per_mode, stats, alto = [], [], []
        for mode in range(len(shape)):
            st = {}
            per_mode.append(_best(functools.partial(tfo.mttkrp, tensor, F, mode, out=outs[mode], stats=st), repeat))
            stats.append(st)
            # the same kernels on the ALTO-ordered items, without the mode-sorted copies
            alto.append(
                _best(
                    lambda mode=mode, F=F, outs=outs: run_items(
                        tensor_items(tensor), tensor.layout, F, mode, _zeroed(outs[mode])
                    ),
                    repeat,
                )
            )
        total = sum(per_mode)
        mods = [model(len(values), shape, R, k, m) for k in range(len(shape))]
        floor = sum(x["T_0lm"] for x in mods)
        row = {
            "tensor": name,
            "shape": shape,
            "nnz": len(values),
            "rank": R,
            "threads": threads,
            "generate_s": gen_s,
            "blco_build_s": build_s,
            "plan_s": plan_s,
            "per_mode_s": per_mode,
            "all_mode_s": total,
            "alto_order_all_mode_s": sum(alto),
            "alto_order_per_mode_s": alto,
            "mode_sorted": [tensor_items(tensor, k).sorted_mode == k for k in range(len(shape))],
            "nnz_modes_per_s": len(values) * len(shape) / total,
            "GBps_min_traffic": sum(x["m_inf"] for x in mods) / total / 1e9,
            "pct_copy_bw": 100 * sum(x["m_inf"] for x in mods) / total / 1e9 / m["copy_GBps"],
            "GFLOPs": sum(x["flops"] for x in mods) / total / 1e9,
            "model_floor_s": floor,
            "over_floor": total / floor,
            "mode_imbalance": max(per_mode) / min(per_mode),
            "conflict": [
                {k: s[k] for k in ("private_items", "atomic_items", "run_items", "private_bytes")} for s in stats
            ],
        }
        if peers:
            import peers as P

            try:
                # duplicated/all-mode methods keep a copy of the output per thread: 10^7-row modes
                # need gigabytes per copy, so very long modes get the atomic and permuted kernels only
                methods = GENTEN_METHODS if max(shape) <= 1_000_000 else ["Atomic", "Perm"]
                g = P.genten_mttkrp(coords, values, shape, R, threads=threads, methods=methods)
                row["genten_s"], row["genten_method"], row["genten_what"] = g["seconds"], g["method"], g["what"]
                row["genten_ratio"] = g["seconds"] / total
            except Exception as exc:  # a peer failing must not hide our numbers
                row["genten_error"] = repr(exc)
            try:
                modes = list(range(min(pyttb_modes, len(shape))))
                p = P.pyttb_mttkrp(coords, values, shape, R, modes=modes)
                row["pyttb_s"], row["pyttb_measured_modes"] = p["seconds"], p["measured_modes"]
                row["pyttb_ratio"] = p["seconds"] / total
            except Exception as exc:
                row["pyttb_error"] = repr(exc)
        rows.append(row)
        print_row(row, header=False)
    return rows


HEADER = (
    f"{'tensor':<12}{'R':>3}{'nnz':>12}{'all-mode s':>11}{'ALTO-order':>11}{'per-mode s':>34}{'Mnz*m/s':>9}"
    f"{'GB/s':>7}"
    f"{'%copy':>6}{'/floor':>7}{'imbal':>6}{'GenTen s':>9}{'xGT':>6}{'pyttb s':>9}{'xPT':>7}"
)


def print_row(r: dict, header: bool) -> None:
    if header:
        print(HEADER)
    pm = " ".join(f"{s:.4f}" for s in r["per_mode_s"])
    g = f"{r['genten_s']:>9.3f}{r['genten_ratio']:>6.1f}" if "genten_s" in r else f"{'-':>9}{'-':>6}"
    p = f"{r['pyttb_s']:>9.2f}{r['pyttb_ratio']:>7.0f}" if "pyttb_s" in r else f"{'-':>9}{'-':>7}"
    print(
        f"{r['tensor']:<12}{r['rank']:>3}{r['nnz']:>12,}{r['all_mode_s']:>11.4f}{r['alto_order_all_mode_s']:>11.4f}"
        f"{pm:>34}"
        f"{r['nnz_modes_per_s'] / 1e6:>9.0f}{r['GBps_min_traffic']:>7.1f}{r['pct_copy_bw']:>6.0f}"
        f"{r['over_floor']:>7.1f}{r['mode_imbalance']:>6.2f}{g}{p}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", nargs="+", default=list(SUITE), choices=sorted(synthetic.PRESETS))
    ap.add_argument("--ranks", nargs="+", type=int, default=[16, 32])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-peers", action="store_true", help="skip GenTen and pyttb")
    ap.add_argument(
        "--pyttb-modes",
        type=int,
        default=1,
        help="pyttb is ~100x slower: time this many modes and scale to all (default 1)",
    )
    args = ap.parse_args()
    nb.set_num_threads(args.threads)
    m = machine()
    jit = compile_kernels(nmodes=3, ranks=args.ranks) + compile_kernels(nmodes=4, ranks=args.ranks)
    print(
        f"machine: {m['cpus']} cpus, {m['threads']} numba threads, copy {m['copy_GBps']:.1f} GB/s, "
        f"L2 copy {m['l2_copy_GBps']:.0f} GB/s, FMA {m['fma_GFLOPs']:.1f} GFLOP/s; JIT/cache load {jit:.1f} s "
        "(excluded)"
    )
    print(
        "GB/s: minimal traffic (index+value+factors once) / time; /floor: time over the T_0,LM model; "
        "imbal: slowest/fastest mode; xGT, xPT: peer time / ours"
    )
    print(HEADER)
    rows = []
    for name in args.tensors:
        rows += bench_tensor(name, args.ranks, args.repeat, not args.no_peers, m, args.threads, args.pyttb_modes)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"mttkrp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": m, "jit_s": jit, "rows": rows}, indent=2, default=str))
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
