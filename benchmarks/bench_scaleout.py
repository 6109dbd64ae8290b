"""Scale-out benchmark: the same CP-ALS with the machine's cores split into 1, 2 and 4 workers.

    python benchmarks/bench_scaleout.py                        # uber-shaped 3.3 M + vast-shaped 26 M
    python benchmarks/bench_scaleout.py --tensors uber --iters 5
    python benchmarks/bench_scaleout.py --tensors vast amazon86 # amazon86: Amazon-shaped, 86 M nonzeros
    python benchmarks/bench_scaleout.py --network               # workers in network namespaces, shaped links
    python benchmarks/bench_scaleout.py --tensors amazon86 --method sts   # STS-CP (J = 2^16 draws a mode)

Every row uses the same cores (2 here), so an ideal distributed engine gives the same time in every
row. Rows: inline (this process, no Dask) or the embedded default, 1 process worker x 2 threads,
2 process workers x 1 thread (owner-computes, and the per-mode task graph for comparison), 4 x 1
(oversubscribed on 2 cores; reported anyway). Per row: the median steady-state seconds per
iteration (rank 16, tol 0, first iteration left out), the parallel efficiency against 1 x 2, and
bytes sent per iteration against the lower bound of the distribution.

Targets (issue 30): 2 x 1 <= 1.11 x 1 x 2 at >= 25 M (<= 1.33 x at 3.3 M); 2 x 1 <= 1.1 x the
embedded default at >= 25 M; bytes sent <= 1.25 x the lower bound; STS-CP at 86 M on 2 workers
>= 0.9 efficiency.

Prints a table; writes JSON to benchmarks/results/scaleout-<time>.json.

Dask's share of an iteration (issue 49), ``--overhead``: the same CP-ALS inline (this process, no
Dask), on the embedded default (the in-process cluster of one worker, one thread) and on 2 process
workers x 1 thread, each against the inline run, with the target (<= 1.1 x inline at >= 25 M):

    python benchmarks/bench_scaleout.py --overhead                # vast-shaped 26 M, rank 16
    python benchmarks/bench_scaleout.py --overhead --rounds 3     # rows interleaved 3 times, best median kept
    python benchmarks/bench_scaleout.py --overhead --parts        # and 2 x 1 without links / batches / both

Writes JSON to benchmarks/results/overhead-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402

RESULTS = Path(__file__).parent / "results"
STORES = Path(__file__).resolve().parent.parent / "storage" / "bench"

TENSORS = {
    "uber": synthetic.PRESETS["uber"],
    "vast": synthetic.PRESETS["vast"],
    # Amazon's shape with 86 M nonzeros (1/20 of the real one): long modes, few nonzeros per row
    "amazon86": (synthetic.PRESETS["amazon"][0], 86_000_000),
    # the real size (22 GB stored; streamed under a worker memory limit: --row-memory)
    "amazon1740": (synthetic.PRESETS["amazon"][0], 1_740_000_000),
}


def store_for(name: str, seed: int = 21):
    """The benchmark tensor as a store under storage/bench (made once, then reused)."""
    shape, nnz = TENSORS[name]
    path = STORES / f"scaleout-{name}.zarr"
    if path.exists():
        try:
            return tfo.open_store(path)
        except Exception:
            pass
    STORES.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if nnz > 30_000_000:
        from tensorflow_ooc.cli import main as cli_main

        rc = cli_main(
            ["generate", str(path), "--shape", ",".join(map(str, shape)), "--nnz", str(nnz), "--seed", str(seed)]
        )
        if rc:
            raise SystemExit(f"generate failed ({rc})")
        store = tfo.open_store(path)
    else:
        coords, _ = synthetic.heavy_tailed(shape, nnz, seed=seed)
        values = np.random.default_rng(seed + 1).random(len(coords))
        store = tfo.convert((coords, values), path, overwrite=True)
    print(f"# made {path} ({store.nnz:,} nonzeros) in {time.time() - t0:.0f} s", flush=True)
    return store


@contextlib.contextmanager
def cluster(workers: int, threads: int, network: bool, memory_limit: str | None):
    from distributed import Client, LocalCluster

    if network:
        from scaleout_network import NetworkUnavailable, shaped_cluster

        try:
            with shaped_cluster(workers, threads, memory_limit=memory_limit) as addr, Client(addr) as c:
                yield c
            return
        except NetworkUnavailable as exc:
            print(f"# no shaped network ({exc}); loopback", flush=True)
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=True,
            dashboard_address=None,
            memory_limit=memory_limit or "auto",
        ) as lc,
        Client(lc) as c,
    ):
        yield c


def run(store, rank: int, iters: int, **kw) -> dict:
    client = kw.get("client")
    peaks: dict = {}
    if client is not None:  # each worker process's peak RSS, sampled every 0.2 s
        import psutil
        from peers.common import Sampler

        procs = {a: psutil.Process(pid) for a, pid in client.run(os.getpid).items()}
        samplers = {a: Sampler(lambda p=p: p.memory_info().rss, 0.2) for a, p in procs.items()}
    with contextlib.ExitStack() as stack:
        for a, smp in samplers.items() if client is not None else ():
            peaks[a] = stack.enter_context(smp)
        r = tfo.cp_als(store, rank, seed=1, max_iters=iters, tol=0, **kw)
    # randomized runs: the steady state is the iterations that do not evaluate the fit (those add
    # an exact MTTKRP)
    plain = [h for h in r.history[1:] if not h.get("fit_evaluated", True) or "sampling_seconds" not in h]
    steady = plain or r.history[1:] or r.history
    secs = [h["seconds"] for h in steady]
    out = {
        "seconds": statistics.median(secs),
        "all_seconds": [h["seconds"] for h in r.history],
        "fit": r.fit,
        "distribution": r.params.get("distribution", {}).get("kind", "graph")
        if isinstance(r.params.get("distribution"), dict)
        else "graph",
        "execution": r.params.get("execution"),
        "method": r.params.get("method"),
        "memory_plan": (r.params.get("memory_plan") or {}).get("peak"),
    }
    if peaks:
        out["peak_rss"] = [smp.peak for smp in peaks.values()]
    if "sampling_seconds" in steady[-1]:
        out["sampling_seconds"] = statistics.median(sum(h["sampling_seconds"]) for h in steady)
    h = steady[-1]
    if "bytes_sent" in h:
        N = len(h["mttkrp_seconds"])
        out.update(
            bytes_sent=h["bytes_sent"],
            bytes_lower_bound=h["bytes_lower_bound"],
            mttkrp_seconds=sum(h["mttkrp_seconds"]),
            update_seconds=sum(h["update_seconds"]),
            exchange_seconds=sum(h["exchange_seconds"]),
            modes=N,
            message_rounds=h.get("rounds"),  # an iteration's message rounds between the workers
        )
    return out


def bench_tensor(name: str, args) -> list[dict]:
    store = store_for(name)
    rows = []

    def row(label: str, workers: int, threads: int, **kw) -> None:
        if (args.rows and label not in args.rows) or (label == "1x1" and not args.rows):
            return
        if args.execution:
            kw.update(execution=args.execution)
        memory = dict(m.split("=", 1) for m in args.row_memory or []).get(label, args.memory_limit)
        if args.method != "exact":
            kw.update(method=args.method, samples=args.samples, fit_every=args.iters)
        t0 = time.time()
        try:
            if workers == 0:
                got = run(store, args.rank, args.iters, **kw)
            else:
                with cluster(workers, threads, args.network, memory) as c:
                    got = run(store, args.rank, args.iters, client=c, **kw)
        except Exception as exc:  # a row that fails is reported, the others still run
            got = {"error": f"{type(exc).__name__}: {exc}"}
        got.update(tensor=name, nnz=store.nnz, row=label, workers=workers, threads=threads)
        got["wall"] = time.time() - t0
        rows.append(got)
        print(f"# {name} {label}: {got.get('seconds', got.get('error'))}", flush=True)

    if store.nnz <= 1 << 24:
        row("inline", 0, 0, scheduler="inline")
    row("embedded", 0, 0, scheduler="embedded")
    row("1x1", 1, 1)  # one worker, its kernels on every core (asked for by --rows only)
    row("1x2", 1, 2)
    row("1x2 owner", 1, 2, distribution="owner")
    row("2x1", 2, 1)
    row("2x1 graph", 2, 1, distribution="graph")
    if not args.skip4:
        row("4x1", 4, 1)
    base = next((r["seconds"] for r in rows if r["row"] == "1x2" and "seconds" in r), None)
    for r in rows:
        if base and "seconds" in r:
            r["vs_1x2"] = r["seconds"] / base
            r["efficiency"] = base / r["seconds"]
    return rows


OVERHEAD_TARGET = 1.1  # embedded and 2 x 1 against inline, at >= 25 M nonzeros (issue 49)
OVERHEAD_ROWS = (
    ("inline", 0, 0, {"scheduler": "inline"}),
    ("embedded", 0, 0, {"scheduler": "embedded"}),
    ("2x1", 2, 1, {}),
)
# --parts: 2 x 1 without host links (Dask's comms), without iteration batches (one task an
# iteration), and without either (the code before session 41), to tell their shares apart
PART_ROWS = (
    ("2x1 dask-comms", 2, 1, {"links": False}),
    ("2x1 one-task", 2, 1, {"batch": 1}),
    ("2x1 neither", 2, 1, {"links": False, "batch": 1}),
)


@contextlib.contextmanager
def transport(links: bool = True, batch: int | None = None):
    """Host links on or off on the workers started inside (their Dask config, from the environment
    they inherit) and the driver's largest iteration batch."""
    from tensorflow_ooc.decompositions.cp import iteration

    key = "DASK_TFOOC__EXCHANGE__HOST_LINKS"
    old_env, old_batch = os.environ.get(key), iteration.MAX_BATCH
    os.environ[key] = "true" if links else "false"
    iteration.MAX_BATCH = batch or old_batch
    try:
        yield
    finally:
        iteration.MAX_BATCH = old_batch
        if old_env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old_env


def bench_overhead(name: str, args) -> list[dict]:
    """Inline, embedded and 2 x 1 rows of one tensor, ``args.rounds`` times in turn (so a burst of
    load from elsewhere meets every row); per row the lowest of its rounds' medians, and its ratio
    to the inline row's: the median over rounds of each round's ratio (rows of one round ran under
    about the same load) and the ratio of the lowest medians."""
    import psutil

    store = store_for(name)
    run(store, args.rank, 2, scheduler="inline")  # kernels compiled or loaded from numba's cache: not timed
    table = OVERHEAD_ROWS + (PART_ROWS if args.parts else ())
    got: dict[str, list[dict]] = {label: [] for label, *_ in table}
    for k in range(args.rounds):
        for label, workers, threads, kw in table:
            load = os.getloadavg()[0]
            t0 = time.time()
            try:
                if workers == 0:
                    r = run(store, args.rank, args.iters, **kw)
                else:
                    with transport(**kw), cluster(workers, threads, False, args.memory_limit) as c:
                        r = run(store, args.rank, args.iters, client=c)
            except Exception as exc:  # a row that fails is reported, the others still run
                r = {"error": f"{type(exc).__name__}: {exc}"}
            r.update(load_before=load, load_after=os.getloadavg()[0], wall=time.time() - t0)
            got[label].append(r)
            print(f"# {name} round {k + 1} {label}: {r.get('seconds', r.get('error'))} (load {load:.1f})", flush=True)
    rows = []
    for label, workers, threads, _ in table:
        ok = [r for r in got[label] if "seconds" in r]
        best = min(ok, key=lambda r: r["seconds"]) if ok else got[label][-1]
        rows.append(
            {
                **best,
                "tensor": name,
                "nnz": store.nnz,
                "row": label,
                "workers": workers,
                "threads": threads,
                "rounds": [r.get("seconds") for r in got[label]],
                "cores": psutil.cpu_count(),
            }
        )
    base = rows[0].get("seconds")
    inline_rounds = rows[0]["rounds"]
    for r in rows:
        if base and "seconds" in r:
            paired = [x / b for x, b in zip(r["rounds"], inline_rounds) if x is not None and b]
            r["vs_inline_rounds"] = paired
            r["vs_inline"] = statistics.median(paired) if paired else r["seconds"] / base
            r["vs_inline_best"] = r["seconds"] / base
            r["meets_target"] = r["vs_inline"] <= OVERHEAD_TARGET
    return rows


def overhead_table(rows: list[dict]) -> str:
    lines = [
        "| tensor | nnz | rank | row | s/it (best) | rounds | x inline (paired) | x inline (best) | target | met "
        "| load before/after |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        if "seconds" not in r:
            lines.append(f"| {r['tensor']} | {r['nnz']:,} | | {r['row']} | error: {r.get('error', '')[:80]} ||||||")
            continue
        ratio = r.get("vs_inline", float("nan"))
        lines.append(
            f"| {r['tensor']} | {r['nnz']:,} | {r.get('rank', '')} | {r['row']} | {r['seconds']:.3f} "
            f"| {' / '.join(f'{x:.3f}' for x in r['rounds'] if x is not None)} | {ratio:.2f} "
            f"| {r.get('vs_inline_best', float('nan')):.2f} "
            f"| {'' if r['row'] == 'inline' else f'<= {OVERHEAD_TARGET}'} "
            f"| {'' if r['row'] == 'inline' else ('yes' if r.get('meets_target') else 'no')} "
            f"| {r['load_before']:.1f} / {r['load_after']:.1f} |"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = (
        "| tensor | nnz | row | s/it | x 1x2 | efficiency | bytes sent/it | lower bound | sent/LB | mttkrp | exch "
        "| peak RSS MiB |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['tensor']} | {r['nnz']:,} | {r['row']} | error: {r['error'][:80]} ||||||||")
            continue
        lb = r.get("bytes_lower_bound")
        sent = r.get("bytes_sent")
        lines.append(
            f"| {r['tensor']} | {r['nnz']:,} | {r['row']} | {r['seconds']:.3f} | {r.get('vs_1x2', float('nan')):.2f} "
            f"| {r.get('efficiency', float('nan')):.2f} | {'' if sent is None else f'{sent:,}'} "
            f"| {'' if lb is None else f'{lb:,}'} | {'' if not lb else f'{sent / lb:.3f}'} "
            f"| {r.get('mttkrp_seconds', float('nan')):.3f} | {r.get('exchange_seconds', float('nan')):.3f} "
            f"| {' / '.join(f'{p / 2**20:,.0f}' for p in r.get('peak_rss', []))} |"
        )
    return "\n".join(lines)


AMAZON = synthetic.PRESETS["amazon"]
REDDIT = ((8_211_298, 176_962, 8_116_559), 4_700_000_000)  # Reddit-2015-shaped (user, subreddit, word)


def model_section(rows: list[dict], args) -> dict:
    """Fit the cost model (benchmarks/scaleout_model.py) to the owner-computes rows measured here
    (1 x 2 and 2 x 1; 4 x 1 oversubscribes the cores and is left out), check its bytes estimate
    (with the grid the ALTO order implies) against the bytes measured, and predict 8, 16 and 64
    workers of 16 cores on 10 Gbit/s, 0.1 ms links at 1.74 B (Amazon) and 4.7 B (Reddit)."""
    import scaleout_model as M

    points, checks = [], []
    for r in rows:
        if "seconds" not in r or r["row"] not in ("1x2 owner", "2x1"):
            continue
        if args.fit_tensors and r["tensor"] not in args.fit_tensors:
            continue
        shape, nnz = TENSORS[r["tensor"]]
        points.append(
            {
                "nnz": r["nnz"],
                "nmodes": len(shape),
                "workers": r["workers"],
                "cores_per_worker": r["threads"],
                "seconds": r["seconds"],
                "bytes_sent": r.get("bytes_lower_bound", 0) if r["workers"] > 1 else 0,
                "link_bandwidth": None,
                "link_latency": None,
            }
        )
    for r in rows:
        if r.get("bytes_lower_bound") and r["workers"] in (2, 4):
            shape, nnz = TENSORS[r["tensor"]]
            est = M.predict_bytes(shape, r["nnz"], args.rank, r["workers"], grid=M.alto_grid(shape, r["workers"]))
            checks.append(
                {"tensor": r["tensor"], "workers": r["workers"], "measured": r["bytes_lower_bound"], "estimate": est}
            )
    out: dict = {"points": points, "bytes_checks": checks}
    print("\n# bytes per iteration (lower bound) measured against the model's estimate (ALTO grid)")
    for c in checks:
        print(f"#   {c['tensor']} W={c['workers']}: measured {c['measured']:,}  estimate {c['estimate']:,}")
    if len({(p["nnz"], p["workers"]) for p in points}) < 2:
        print("# model: too few measured points to fit (need two tensors)")
        return out
    try:
        model = M.fit(points)
    except ValueError:
        # one tensor, one compute size (1 x 2 and 2 x 1 both spread nnz * N over 2 cores): no
        # fixed cost can be told apart, so c0 = 0 (tens of ms against seconds at this size); a from
        # the one-worker point, the link from what the 2 x 1 point takes beyond it
        one = next(p for p in points if p["workers"] == 1)
        many = next(p for p in points if p["workers"] > 1)
        a = one["seconds"] * one["workers"] * one["cores_per_worker"] / (one["nnz"] * one["nmodes"])
        extra = many["seconds"] - a * many["nnz"] * many["nmodes"] / (many["workers"] * many["cores_per_worker"])
        bw = many["bytes_sent"] / many["workers"] / extra if extra > 0 else float("inf")
        model = M.Model(a=a, c0=0.0, bandwidth=bw, bandwidth_fitted=True, n_points=2)
    print("# model:", M.describe(model))
    link = 10e9 / 8
    preds = []
    for name, (shape, nnz) in {"amazon 1.74 B": AMAZON, "reddit 4.7 B": REDDIT}.items():
        t1 = model.predict(nnz, len(shape), 1, 16, 0)
        for W in (8, 16, 64):
            for layout, grid in (
                ("ALTO runs", M.alto_grid(shape, W)),
                ("best grid", M.best_grid(shape, nnz, args.rank, W)),
            ):
                sent = M.predict_bytes(shape, nnz, args.rank, W, grid=grid)
                terms = model.terms(nnz, len(shape), W, 16, sent, link_bandwidth=link, link_latency=1e-4)
                t = sum(terms.values())
                preds.append(
                    {
                        "tensor": name,
                        "workers": W,
                        "layout": layout,
                        "grid": grid,
                        "bytes_sent": sent,
                        "seconds": t,
                        "speedup": t1 / t,
                        "efficiency": t1 / (W * t),
                        **terms,
                    }
                )
    print("| tensor | workers | layout | grid | GB sent/it | s/it | compute | transfer | speedup | efficiency |")
    print("|" + "---|" * 10)
    for p in preds:
        print(
            f"| {p['tensor']} | {p['workers']} | {p['layout']} | {p['grid']} | {p['bytes_sent'] / 1e9:.2f} "
            f"| {p['seconds']:.2f} | {p['compute']:.2f} | {p['transfer']:.2f} | {p['speedup']:.1f} "
            f"| {p['efficiency']:.2f} |"
        )
    out.update(model=vars(model) if hasattr(model, "__dict__") else str(model), predictions=preds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", nargs="+", default=["uber", "vast"], choices=sorted(TENSORS))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--network", action="store_true", help="workers in network namespaces with shaped links (root)")
    ap.add_argument("--memory-limit", default=None, help="per-worker memory limit (default: Dask's share)")
    ap.add_argument("--skip4", action="store_true", help="leave out the oversubscribed 4 x 1 row")
    ap.add_argument("--execution", choices=["in-memory", "streaming"], help="force one execution (default: the plan's)")
    ap.add_argument(
        "--row-memory",
        nargs="+",
        metavar="LABEL=LIMIT",
        help='per-row worker memory limit, e.g. "1x2=4GB" "2x1=3GB" (default --memory-limit)',
    )
    ap.add_argument("--rows", nargs="+", metavar="LABEL", help='run only these rows (e.g. "1x2" "2x1")')
    ap.add_argument("--method", default="exact", choices=["exact", "sts"], help="CP-ALS or STS-CP (randomized)")
    ap.add_argument("--samples", type=int, default=1 << 16, help="STS-CP draws per mode (J)")
    ap.add_argument("--refit", nargs="+", metavar="JSON", help="fit the model to the rows of earlier runs, run nothing")
    ap.add_argument(
        "--fit-tensors",
        nargs="+",
        choices=sorted(TENSORS),
        help="fit the model to these tensors' rows only (the compute rate depends on the shape: long modes "
        "miss the caches, so Amazon-scale predictions fit amazon86)",
    )
    ap.add_argument(
        "--overhead",
        action="store_true",
        help="Dask's share of an iteration: inline, embedded and 2 x 1 against inline (default tensor vast)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="--overhead: run the rows this many times in turn")
    ap.add_argument(
        "--parts",
        action="store_true",
        help="--overhead: also 2 x 1 without host links, without iteration batches, and without either",
    )
    args = ap.parse_args()
    if args.overhead:
        tensors = args.tensors if args.tensors != ap.get_default("tensors") else ["vast"]
        rows = [dict(r, rank=args.rank) for name in tensors for r in bench_overhead(name, args)]
        print(overhead_table(rows))
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps({"args": vars(args), "target": OVERHEAD_TARGET, "rows": rows}, indent=1, default=str))
        print(f"# JSON: {out}")
        return
    if args.refit:
        rows = [r for f in args.refit for r in json.loads(Path(f).read_text())["rows"]]
        print(table(rows))
        model_section(rows, args)
        return
    rows = []
    for name in args.tensors:
        rows += bench_tensor(name, args)
    print(table(rows))
    model = model_section(rows, args) if args.method == "exact" else None  # the model is exact CP-ALS's
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"scaleout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "model": model}, indent=1, default=str))
    print(f"# JSON: {out}")


if __name__ == "__main__":
    main()
