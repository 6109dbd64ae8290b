"""CP-ALS and MTTKRP side by side with ALTO, SPLATT and GenTen, on the same tensors, in one run.

    python benchmarks/bench_peers.py --alto ~/peers/alto64/cpd64 --splatt ~/peers/splatt/bin/splatt
    python benchmarks/bench_peers.py --tensors nips --ranks 16 --iters 10 --threads 2 --no-genten
    python benchmarks/bench_peers.py --alto ~/peers/alto64/cpd64 --no-genten --threads 2 --iters 5 --repeat 3

This script builds nothing. ALTO (github.com/IntelLabs/ALTO) and SPLATT (github.com/ShadenSmith/splatt)
are built by the user outside this repository and passed by path; a peer not given (or not
runnable) is skipped with a note. GenTen runs in this process from its ``pygenten`` wheel.

For each tensor (heavy-tailed, the same seed every run: shaped like FROSTT's uber, nips and
chicago-crime, and generated shapes of other orders and skews, ``GENERATED``: an order-4 tensor
of flatter slices, an order-5 one and a very skewed order-3 one, so ranks are checked on more
supports than the presets) the nonzeros are written once as a 1-based ``.tns`` file under ``--workdir`` (reused on
later runs) and converted to a store. Then, for each rank, every tool runs exactly ``--iters``
CP-ALS iterations with ``--threads`` threads:

- ours: ``cp_als(store, R)`` through the embedded default, steady-state seconds per iteration
  (the median over iterations 2.., the rule used for every tool; the first, which loads or
  compiles the kernels, is reported apart); all-mode MTTKRP (factors given as one
  ``StackedFactors``, as CP-ALS keeps them) of the in-memory tensor (``encode_coo``) and of the
  store (``mttkrp(store, ...)``), median of ``--repeat``, for the default store and for the
  same tensor stored with ``compression="none"`` ("raw": streamed by
  mapping its chunks); and streaming CP-ALS (``execution="streaming"``) on both stores, as a share
  of the embedded default's (in-memory) throughput ("cpd st" and "raw");
- ALTO, SPLATT: their own per-iteration and MTTKRP timers (see ``peers/alto.py`` and
  ``peers/splatt.py`` for what each one times);
- GenTen: best CP-ALS iteration and fastest MTTKRP method (``peers/genten.py``).

Each row records the 1-minute load average before and after it (``load``): on a machine shared
with other work every time moves with it. ``--rounds K`` runs our CP-ALS and ALTO's K times each,
alternately, and keeps each tool's best steady state (the other columns are from the first round).

Ratios are ours / peer (below 1: we are faster). Prints a table, then the CP-ALS target's table
(ours / ALTO per tensor and rank, each marked where it misses ``--target``); writes JSON to
``benchmarks/results/peers-<time>.json`` (``targets``: the bar, the misses, whether all met).
Targets: issue 49, CP-ALS <= 0.8x ALTO at ranks 8, 16, 32, 50, 64, 100 on every tensor (the
defaults); issue 9, <= 0.5x SPLATT and all-mode in-memory MTTKRP <= 1.0x ALTO.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def _early_threads(argv: list[str]) -> None:
    # numba reads NUMBA_NUM_THREADS when first imported, so --threads must act before the imports
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            os.environ["NUMBA_NUM_THREADS"] = argv[i + 1]
        elif a.startswith("--threads="):
            os.environ["NUMBA_NUM_THREADS"] = a.split("=", 1)[1]


_early_threads(sys.argv)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from peers.external import steady  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels import compile_kernels  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.cpu import kernel_variants  # noqa: E402
from tensorflow_ooc.store.metadata import FORMAT_VERSION  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PRESET_SUITE = ("uber", "nips", "chicago")
# generated shapes beside the presets (shape, nonzeros, power-law skew per mode; 1 = uniform):
# other orders and skews than the FROSTT-like ones, 3-4 M nonzeros so a rank's run stays short
GENERATED: dict[str, tuple[tuple[int, ...], int, tuple[float, ...]]] = {
    # order 4, flatter slices than nips/uber and no tiny mode
    "gen-o4": ((6000, 4000, 1500, 120), 3_500_000, (1.3, 1.3, 1.2, 1.1)),
    # order 5: two short modes, as time-of-day and category modes are
    "gen-o5": ((1500, 1200, 600, 48, 12), 3_000_000, (1.6, 1.6, 1.4, 1.2, 1.0)),
    # order 3, very skewed: the top 1 % of slices of the two long modes hold 37 % and 29 % of the
    # nonzeros (nips-like: 6 %), the largest slice 10 %, beside a uniform short mode
    "gen-skewed": ((40000, 25000, 400), 4_000_000, (5.0, 4.0, 1.0)),
}
SUITE = PRESET_SUITE + tuple(GENERATED)
DEFAULT_RANKS = (8, 16, 32, 50, 64, 100)
# issue 49's bar: our CP-ALS seconds per iteration at most this share of ALTO's
CP_ALS_VS_ALTO_TARGET = 0.8


def tensor_spec(name: str) -> tuple[tuple[int, ...], int, float | tuple[float, ...]]:
    """Shape, nonzeros and skew of a preset (``synthetic.PRESETS``, the generator's default skew)
    or a generated shape (``GENERATED``)."""
    if name in GENERATED:
        return GENERATED[name]
    shape, nnz = synthetic.PRESETS[name]
    return shape, nnz, 1.6


def _git_commit(path: str | None) -> str | None:
    """The commit of the source tree an executable was built in, if it lies in a git work tree."""
    if not path:
        return None
    for d in Path(path).resolve().parents:
        for cand in (d, d.parent / f"{d.name}-src", d.parent / "ALTO-src", d.parent / "splatt-src"):
            if (cand / ".git").exists():
                try:
                    out = subprocess.run(
                        ["git", "-C", str(cand), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
                    )
                except (OSError, subprocess.SubprocessError):
                    return None
                return out.stdout.strip() or None
    return None


def tensor_files(name: str, workdir: Path, seed: int) -> tuple[Path, Path, np.ndarray, np.ndarray, tuple]:
    """The tensor's ``.tns`` file and store under ``workdir`` (made once), and its COO arrays."""
    shape, nnz, skew = tensor_spec(name)
    coords, _ = synthetic.heavy_tailed(shape, nnz, skew=skew, seed=seed)
    values = np.random.default_rng(seed + 1).random(len(coords))
    # the content hash keeps files from an older generator (same seed, other nonzeros) from being reused
    digest = hashlib.sha1(np.ascontiguousarray(coords).data)
    digest.update(np.ascontiguousarray(values).data)
    tag = f"{name}-s{seed}-{len(coords)}-{digest.hexdigest()[:10]}"
    tns = workdir / f"{tag}.tns"
    store_path = workdir / f"{tag}.zarr"
    if not tns.exists():
        t0 = time.perf_counter()
        synthetic.write_tns(tns, [(coords, values)], one_based=True)
        print(f"  wrote {tns} ({tns.stat().st_size / 2**20:.0f} MiB, {time.perf_counter() - t0:.1f} s)")
    for path, compression in ((store_path, "fast"), (raw_path(store_path), "none")):
        try:
            # a store of an older format version is converted again: its index decodes differently
            if tfo.open_store(path).meta["format_version"] != FORMAT_VERSION:
                raise ValueError("older format")
        except Exception:
            tfo.convert((coords, values), path, shape=shape, overwrite=True, compression=compression)
    return tns, store_path, coords, values, tuple(shape)


def raw_path(store_path: Path) -> Path:
    """The same tensor's store written with compression "none" (streamed by mapping its chunks)."""
    return store_path.with_name(store_path.stem + "-raw.zarr")


def _median(fn, repeat: int) -> float:
    """Median seconds of ``repeat`` calls after one untimed call (ALTO reports a mean of its
    sweeps and SPLATT each sweep, so a median compares like with like better than a best)."""
    fn()
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def ours(store_path: Path, coords, values, shape, rank: int, iters: int, repeat: int, seed: int) -> dict:
    store = tfo.open_store(store_path)
    r = tfo.cp_als(store, rank, seed=seed, max_iters=iters, tol=0)
    per_it = steady([h["seconds"] for h in r.history])
    mttkrp_it = steady([sum(h["mttkrp_seconds"]) for h in r.history])
    tensor = tfo.encode_coo(coords, values, shape)
    # stacked once, as CP-ALS keeps its factors (a list would be restacked by every call)
    factors = tfo.StackedFactors.from_list([np.random.default_rng(n).random((s, rank)) for n, s in enumerate(shape)])
    mem = _median(lambda: [tfo.mttkrp(tensor, factors, n) for n in range(len(shape))], repeat)
    strm = _median(lambda: [tfo.mttkrp(store, factors, n) for n in range(len(shape))], repeat)
    raw = tfo.open_store(raw_path(store_path))
    strm_raw = _median(lambda: [tfo.mttkrp(raw, factors, n) for n in range(len(shape))], repeat)
    # streaming CP-ALS (issue 4's bar: >= 70 % of in-memory throughput), default and raw stores
    streamed = {}
    for label, s in (("fast", store), ("raw", raw)):
        h = tfo.cp_als(s, rank, seed=seed, max_iters=iters, tol=0, execution="streaming").history
        streamed[label] = steady([x["seconds"] for x in h])
    info = store.info()
    return {
        "store_index_bytes_per_nnz": info["index_bytes_per_nnz"],
        "store_values_bytes_per_nnz": info["values_bytes_per_nnz"],
        "store_index_encoding": info["index_encoding"],
        # modes whose streamed passes read the store's mode-sorted copies (tfooc mode-copies)
        "store_mode_copies": {"fast": store.copy_modes(), "raw": raw.copy_modes()},
        "store_format_version": info["format_version"],
        "mttkrp_raw_store_s": strm_raw,
        "raw_store_vs_in_memory": mem / strm_raw,
        "cp_als_streaming_s": streamed["fast"],
        "cp_als_streaming_raw_s": streamed["raw"],
        "streaming_vs_in_memory": per_it / streamed["fast"],
        "streaming_raw_vs_in_memory": per_it / streamed["raw"],
        "cp_als_s": per_it,
        "first_iter_s": r.history[0]["seconds"],
        "fit": r.fit,
        "execution": r.params.get("execution"),
        "iterations": r.iterations,
        "outside_mttkrp_share": 1 - mttkrp_it / per_it,
        "mttkrp_in_memory_s": mem,
        "mttkrp_store_s": strm,
        "store_vs_in_memory": mem / strm,
    }


def best_rounds(row: dict, store_path: Path, tns: Path, rank: int, args) -> None:
    """``args.rounds - 1`` more CP-ALS runs of ours and ALTO, alternately (load from other processes
    then falls on both alike), each tool's seconds per iteration the best of its rounds' steady
    states; every round's kept under ``cp_als_rounds_s``."""
    from peers import alto

    store = tfo.open_store(store_path)
    mine = [row["ours"]["cp_als_s"]]
    theirs = [row["alto"]["cp_als_s"]] if "cp_als_s" in row.get("alto", {}) else []
    for _ in range(args.rounds - 1):
        r = tfo.cp_als(store, rank, seed=args.seed, max_iters=args.iters, tol=0)
        mine.append(steady([h["seconds"] for h in r.history]))
        if theirs:
            a = run_peer("ALTO", alto.cp_als, args.alto, tns, rank, args.iters, args.threads, mttkrp=False)
            if "cp_als_s" in a:
                theirs.append(a["cp_als_s"])
    row["ours"]["cp_als_rounds_s"], row["ours"]["cp_als_s"] = mine, min(mine)
    if theirs:
        row["alto"]["cp_als_rounds_s"], row["alto"]["cp_als_s"] = theirs, min(theirs)


def run_peer(name: str, fn, *args, **kwargs) -> dict:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # a peer that fails is reported, the others still run
        print(f"    {name}: failed: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def bench(args) -> dict:
    import peers as P
    from peers import alto, splatt

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    # compile cost per order (issue 33: bounded, reported): kernel variants built and seconds
    jit = {}
    for n in sorted({len(tensor_spec(name)[0]) for name in args.tensors}):
        before = len(kernel_variants())
        seconds = compile_kernels(n, tuple(args.ranks))
        jit[n] = {"seconds": seconds, "variants": len(kernel_variants()) - before}
        print(f"order {n}: {jit[n]['variants']} kernel variants (5 loops each) compiled or loaded in {seconds:.1f} s")
    out: dict = {
        "args": vars(args),
        "jit_s": sum(j["seconds"] for j in jit.values()),
        "jit_per_order": jit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "processor": platform.processor()},
        "peers": {
            "alto": {"path": args.alto, "commit": _git_commit(args.alto)},
            "splatt": {"path": args.splatt, "commit": _git_commit(args.splatt)},
        },
        "rows": [],
    }
    for name in args.tensors:
        print(f"{name}:")
        tns, store_path, coords, values, shape = tensor_files(name, workdir, args.seed)
        for path in (store_path, raw_path(store_path)) if args.mode_copies else ():
            if not tfo.open_store(path).copy_modes():  # written once, kept with the store
                tfo.build_mode_copies(path)
        for rank in args.tensor_ranks.get(name, args.ranks):
            row = {
                "tensor": name,
                "generated": name in GENERATED,
                "skew": tensor_spec(name)[2],
                "shape": list(shape),
                "nnz": int(len(coords)),
                "rank": rank,
            }
            load_before = os.getloadavg()[0]
            print(f"  rank {rank}: ours", flush=True)
            row["ours"] = ours(store_path, coords, values, shape, rank, args.iters, args.repeat, args.seed)
            if args.alto:
                print(f"  rank {rank}: ALTO", flush=True)
                row["alto"] = run_peer("ALTO", alto.cp_als, args.alto, tns, rank, args.iters, args.threads)
            if args.rounds > 1:
                best_rounds(row, store_path, tns, rank, args)
            # on a shared machine other processes' load moves every number: kept beside them
            row["load_avg_1min"] = [load_before, os.getloadavg()[0]]
            if args.splatt:
                print(f"  rank {rank}: SPLATT", flush=True)
                row["splatt"] = run_peer("SPLATT", splatt.cp_als, args.splatt, tns, rank, args.iters, args.threads)
            if not args.no_genten:
                print(f"  rank {rank}: GenTen", flush=True)
                g = run_peer(
                    "GenTen",
                    P.genten_cp_als,
                    coords,
                    values,
                    shape,
                    rank,
                    iters=args.iters,
                    threads=args.threads,
                    method="fastest",
                )
                m = run_peer(
                    "GenTen", P.genten_mttkrp, coords, values, shape, rank, threads=args.threads, iters=args.iters
                )
                row["genten"] = {
                    "cp_als_s": g.get("seconds_per_iter"),
                    "fit": g.get("fit"),
                    "method": g.get("method"),
                    "mttkrp_s": m.get("seconds"),
                    "mttkrp_method": m.get("method"),
                    **({"error": g["error"]} if "error" in g else {}),
                }
            out["rows"].append(row)
    return out


def _ratio(a, b) -> float | None:
    return a / b if a and b else None


def table(out: dict) -> None:
    print("\nseconds per CP-ALS iteration (steady state) and all-mode MTTKRP; ratio = ours / peer (< 1: ours faster)")
    head = (
        f"{'tensor':<11}{'R':>3}{'ours cpd':>9}{'ALTO':>8}{'xALTO':>7}{'SPLATT':>8}{'xSPL':>6}{'GenTen':>8}{'xGT':>6}"
        f"{' |':>3}{'ours mttkrp':>12}{'ALTO':>8}{'xALTO':>7}{'SPLATT':>8}{'xSPL':>6}{'GenTen':>8}"
        f"{' |':>3}{'store':>7}{'st/mem':>7}{'raw st':>7}{'raw/mem':>8}{'cpd st':>7}{'raw':>5}"
        f"{'outside':>8}{'1st it':>7}{'load':>6}"
    )
    print(head)

    def f(v, w=8, p=3):
        return f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>{w}}"

    for row in out["rows"]:
        o = row["ours"]
        a, s, g = row.get("alto", {}), row.get("splatt", {}), row.get("genten", {})
        row["ratios"] = {
            "cp_als_vs_alto": _ratio(o["cp_als_s"], a.get("cp_als_s")),
            "cp_als_vs_splatt": _ratio(o["cp_als_s"], s.get("cp_als_s")),
            "cp_als_vs_genten": _ratio(o["cp_als_s"], g.get("cp_als_s")),
            "mttkrp_vs_alto": _ratio(o["mttkrp_in_memory_s"], a.get("mttkrp_s")),
            "mttkrp_vs_splatt": _ratio(o["mttkrp_in_memory_s"], s.get("mttkrp_s")),
        }
        r = row["ratios"]
        print(
            f"{row['tensor']:<11}{row['rank']:>3}{f(o['cp_als_s'], 9)}{f(a.get('cp_als_s'))}"
            f"{f(r['cp_als_vs_alto'], 7, 2)}"
            f"{f(s.get('cp_als_s'))}{f(r['cp_als_vs_splatt'], 6, 2)}{f(g.get('cp_als_s'))}"
            f"{f(r['cp_als_vs_genten'], 6, 2)}{' |':>3}{f(o['mttkrp_in_memory_s'], 12)}{f(a.get('mttkrp_s'))}"
            f"{f(r['mttkrp_vs_alto'], 7, 2)}{f(s.get('mttkrp_s'))}{f(r['mttkrp_vs_splatt'], 6, 2)}"
            f"{f(g.get('mttkrp_s'))}{' |':>3}{f(o['mttkrp_store_s'], 7)}{o['store_vs_in_memory'] * 100:>6.0f}%"
            f"{f(o['mttkrp_raw_store_s'], 7)}{o['raw_store_vs_in_memory'] * 100:>7.0f}%"
            f"{o['streaming_vs_in_memory'] * 100:>6.0f}%{o['streaming_raw_vs_in_memory'] * 100:>4.0f}%"
            f"{o['outside_mttkrp_share'] * 100:>7.0f}%{f(o['first_iter_s'], 7, 2)}"
            f"{f(max(row.get('load_avg_1min') or [None]), 6, 1)}"
        )
    print("default store bytes per nonzero (index, values):")
    seen = set()
    for row in out["rows"]:
        o = row["ours"]
        if row["tensor"] not in seen and "store_index_bytes_per_nnz" in o:
            seen.add(row["tensor"])
            print(
                f"  {row['tensor']:<11} index {o['store_index_bytes_per_nnz']:.2f} ({o['store_index_encoding']}, "
                f"format v{o['store_format_version']}), values {o['store_values_bytes_per_nnz']:.2f}"
            )
    print("fits after the last iteration (different starts, so they differ):")
    for row in out["rows"]:
        fits = {k: row[k].get("fit") for k in ("ours", "alto", "splatt", "genten") if k in row}
        print(
            f"  {row['tensor']:<11}R{row['rank']:<4}"
            + "  ".join(f"{k} {v:.6f}" for k, v in fits.items() if isinstance(v, float))
        )
    for k in ("alto", "splatt"):
        p = out["peers"][k]
        print(f"{k}: {p['path'] or 'not given (skipped)'}" + (f", commit {p['commit']}" if p.get("commit") else ""))


def target_table(out: dict, bar: float) -> dict:
    """Print ours / ALTO CP-ALS seconds per iteration, a tensor a line and a rank a column, each
    ratio above ``bar`` marked ``!``; returns the bar, the rows that miss it and whether all met it
    (None where no row has an ALTO time)."""
    ranks = sorted({row["rank"] for row in out["rows"]})
    names = list(dict.fromkeys(row["tensor"] for row in out["rows"]))
    ratio = {(row["tensor"], row["rank"]): (row.get("ratios") or {}).get("cp_als_vs_alto") for row in out["rows"]}
    print(f"\nCP-ALS ours / ALTO, seconds per iteration (target <= {bar:g}x; ! misses it)")
    print(f"{'tensor':<12}{'shape':<28}{'nnz':>10}" + "".join(f"{'R' + str(r):>8}" for r in ranks))
    for name in names:
        row = next(r for r in out["rows"] if r["tensor"] == name)
        cells = []
        for r in ranks:
            v = ratio.get((name, r))
            cells.append(f"{'-':>8}" if v is None else f"{v:>7.2f}{'!' if v > bar else ' '}")
        shape = "x".join(map(str, row["shape"]))
        print(f"{name:<12}{shape:<28}{row['nnz']:>10}" + "".join(cells))
    measured = {k: v for k, v in ratio.items() if v is not None}
    misses = [{"tensor": t, "rank": r, "cp_als_vs_alto": v} for (t, r), v in measured.items() if v > bar]
    met = None if not measured else not misses
    print(
        "target: "
        + (
            "no ALTO times"
            if met is None
            else "met on every row"
            if met
            else f"missed on {len(misses)} of {len(measured)}"
        )
    )
    return {"cp_als_vs_alto_max": bar, "rows": len(measured), "misses": misses, "met": met}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alto", help="ALTO's cpd executable (64-bit index build); skipped if not given")
    ap.add_argument("--splatt", help="SPLATT's splatt executable; skipped if not given")
    ap.add_argument("--no-genten", action="store_true", help="skip GenTen (pygenten)")
    ap.add_argument(
        "--mode-copies",
        action="store_true",
        help="write both stores' mode-sorted copies (tfooc mode-copies) where they have none, so the streamed "
        "columns read them; stores that have copies read them either way",
    )
    ap.add_argument(
        "--tensors", nargs="+", default=list(SUITE), choices=sorted(set(synthetic.PRESETS) | set(GENERATED))
    )
    ap.add_argument("--ranks", nargs="+", type=int, default=list(DEFAULT_RANKS))
    ap.add_argument(
        "--target",
        type=float,
        default=CP_ALS_VS_ALTO_TARGET,
        help="the CP-ALS bar: ours / ALTO seconds per iteration at most this (default %(default)s)",
    )
    ap.add_argument(
        "--tensor-ranks",
        nargs="+",
        default=[],
        metavar="NAME=R,R",
        help="ranks for one tensor instead of --ranks (e.g. nell2=50: the 20 M tensor at rank 50 only)",
    )
    ap.add_argument("--iters", type=int, default=10, help="CP-ALS iterations every tool runs")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every tool")
    ap.add_argument("--repeat", type=int, default=7, help="our MTTKRP timings: median of this many")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="CP-ALS runs of ours and ALTO per row, alternating; each tool's best (on a shared machine)",
    )
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument(
        "--workdir",
        default=str(Path(__file__).parent / "results" / "peer-data"),
        help="where the .tns files and stores are kept between runs",
    )
    args = ap.parse_args(argv)
    per_tensor = {}
    for item in args.tensor_ranks:
        name, _, ranks = item.partition("=")
        try:
            per_tensor[name] = [int(r) for r in ranks.split(",")]
        except ValueError:
            ap.error(f"--tensor-ranks {item}: expected NAME=R[,R...]")
        if name not in args.tensors:
            ap.error(f"--tensor-ranks {item}: {name} is not among --tensors")
    args.tensor_ranks = per_tensor
    for k in ("alto", "splatt"):
        p = getattr(args, k)
        if p and not os.access(p, os.X_OK):
            ap.error(f"--{k} {p}: not an executable file")
    out = bench(args)
    table(out)
    out["targets"] = target_table(out, args.target)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
