"""Randomized CP at users' scale: exact streamed CP-ALS against STS-CP and CP-ARLS-LEV reading the
store's fiber index, on one worker under a memory limit (or several workers).

Per store it prints the index (bytes a nonzero per mode, build seconds), then per method: seconds
per round (the sampled round without the fit's exact pass), nonzeros and bytes read per round
against the store's, the fit after equal rounds, and the time to 95 % of exact's final fit (from
the start, the exact warm-up included), and the memory plan taken with its peak against the
worker's measured peak resident memory. A table, and JSON with ``--json``.

    python benchmarks/bench_sampled_scale.py storage/bench/amazon86p storage/bench/amazon86h \\
        --memory-limit 6GB --threads 2 --rounds 10 --json benchmarks/results/sampled_scale.json

Stores need a fiber index (``tfooc fiber-index STORE``); without one the sampled rounds scan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import tensorflow_ooc as tfo


def _cluster(workers: int, threads: int, memory_limit: str):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=threads, memory_limit=memory_limit, processes=True, dashboard_address=None
    )
    return cluster, Client(cluster)


def _peak_rss() -> int:
    """Run on a worker: its process's peak resident bytes so far (Linux's VmHWM; 0 elsewhere).
    Not getrusage's ru_maxrss: a restarted worker is forked from the nanny's process, here the
    driver's, and ru_maxrss keeps the driver's resident size from before the worker's exec (a
    fresh STS-CP worker read 3,251 MiB after an exact run's factors had reached the driver, 2,413 MiB
    where it had not)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def _run(client, store: str, method: str, args, index_info: dict | None = None) -> dict:
    kw = dict(seed=args.seed, max_iters=args.rounds, tol=0, execution="streaming", client=client)
    if args.distribution:
        kw["distribution"] = args.distribution
    if method != "exact":
        kw.update(method=method, samples=args.samples, fit_every=1)
    t0 = time.time()
    try:
        r = tfo.cp_als(store, args.rank, **kw)
    except Exception as exc:  # a refusal (the memory plan) is a result of its own
        return {"method": method, "error": f"{type(exc).__name__}: {exc}"}
    wall = time.time() - t0
    # the workers were restarted before this run, so their peaks are this run's
    peak = max(client.run(_peak_rss).values(), default=0)
    plan = r.params.get("memory_plan") or {}
    hist = r.history
    sampled = [h for h in hist if not h.get("warmup")] if method != "exact" else hist
    per_round = [h.get("round_seconds", h["seconds"]) for h in sampled[1:] or sampled]
    reads = [h.get("reads") or {} for h in sampled]
    nnz_read = [sum(v.get("nnz_read", 0) for v in rd.values()) for rd in reads]
    bytes_read = [sum(v.get("bytes_read", 0) for v in rd.values()) for rd in reads]
    matched = [sum(v.get("nnz", 0) for v in rd.values()) for rd in reads]
    # the stored bytes of the matched entries themselves (each mode's index bytes a nonzero) and
    # of the Bloom filter blocks the queries read: the floor a round's reads are held against
    index_bpn = {m: f["bytes"] / max(1, f["nnz"]) for m, f in (index_info or {}).items()}
    matched_bytes = [sum(v.get("nnz", 0) * index_bpn.get(str(m), 0) for m, v in rd.items()) for rd in reads]
    filter_bytes = [sum(v.get("filter_bytes", 0) for v in rd.values()) for rd in reads]
    return {
        "method": method,
        "rounds": len(hist),
        "wall_seconds": wall,
        "worker_peak_rss": peak,
        "plan": plan.get("name"),
        "plan_peak": plan.get("peak"),
        "seconds_per_round": statistics.median(per_round),
        "fit": r.fit,
        "fits": [h["fit"] for h in hist],
        "clock": [h.get("round_seconds", h["seconds"]) for h in hist],
        "nnz_read_per_round": statistics.mean(nnz_read) if method != "exact" else None,
        "bytes_read_per_round": statistics.mean(bytes_read) if method != "exact" else None,
        "matched_nnz_per_round": statistics.mean(matched) if method != "exact" else None,
        # per sampled round, the nonzeros each mode's sampled fibers held (history reads[m]["nnz"])
        "matched_nnz_by_round": [
            [v.get("nnz") for _, v in sorted(rd.items(), key=lambda kv: int(kv[0]))] for rd in reads
        ]
        if method != "exact"
        else None,
        "round_seconds": [h.get("round_seconds", h["seconds"]) for h in sampled],
        "matched_bytes_per_round": statistics.mean(matched_bytes) if method != "exact" else None,
        "filter_bytes_per_round": statistics.mean(filter_bytes) if method != "exact" else None,
        "sampled_reads": r.params.get("sampled_reads"),
        "draw_seconds": statistics.mean(sum(h.get("sampling_seconds", [0])) for h in sampled),
    }


def _time_to(row: dict, target: float) -> float | None:
    t = 0.0
    for fit, dt in zip(row["fits"], row["clock"]):
        t += dt
        if fit >= target:
            return t
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stores", nargs="+")
    p.add_argument("--methods", default="exact,sts,arls-lev,arls-lev-hybrid")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--samples", type=int, default=1 << 16)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory-limit", default="6GB")
    p.add_argument(
        "--distribution", help="several workers: graph (the task graphs, which read the fiber index) or owner"
    )
    p.add_argument("--json")
    args = p.parse_args()
    out = {"args": vars(args), "stores": []}
    cluster, client = _cluster(args.workers, args.threads, args.memory_limit)
    try:
        for path in args.stores:
            store = tfo.open_store(path)
            info = store.info()
            entry = {
                "store": path,
                "nnz": store.nnz,
                "store_bytes": store.stored_bytes(),
                "fiber_index": info["fiber_index"],
                "runs": [],
            }
            print(f"\n{path}: {store.nnz:,} nonzeros, {entry['store_bytes'] / store.nnz:.2f} bytes a nonzero")
            for m, f in info["fiber_index"].items():
                built = f["build_seconds"]
                print(f"  fiber index mode {m}: {f['bytes_per_nnz']:.2f} bytes a nonzero, built in {built:.1f} s")
            for method in args.methods.split(","):
                # fresh workers for each method: the memory plan measures each worker's baseline,
                # which the caches of a run before (Bloom filters, decoded chunks) would raise
                client.restart()
                row = _run(client, path, method, args, info["fiber_index"])
                entry["runs"].append(row)
                print("  ", json.dumps({k: v for k, v in row.items() if k not in ("fits", "clock")}), flush=True)
                if "plan" in row:
                    print(
                        f"   {method}: plan {row['plan']}, planned peak {row['plan_peak'] / 2**20:,.0f} MiB, "
                        f"measured worker peak {row['worker_peak_rss'] / 2**20:,.0f} MiB",
                        flush=True,
                    )
            exact = next((r for r in entry["runs"] if r["method"] == "exact" and "error" not in r), None)
            print(
                f"\n  {'method':<16} {'s/round':>8} {'x exact':>8} {'nnz read':>13} {'bytes read':>14} "
                f"{'x store':>8} {'x match':>8} {'fit':>9} {'x exact':>8} {'t95 s':>8} {'x exact':>8}"
            )
            for r in entry["runs"]:
                if "error" in r:
                    print(f"  {r['method']:<16} {r['error'][:100]}")
                    continue
                base = exact or r
                t95 = _time_to(r, 0.95 * base["fit"])
                t95x = _time_to(base, 0.95 * base["fit"])
                r["t95_seconds"] = t95
                ratio = r["seconds_per_round"] / base["seconds_per_round"]
                r["round_ratio"] = ratio
                r["fit_ratio"] = r["fit"] / base["fit"] if base["fit"] else None
                r["t95_ratio"] = t95 / t95x if t95 is not None and t95x else None
                nbytes = r["bytes_read_per_round"]
                # bytes read against the matched entries' bytes plus the filter blocks (the target's floor)
                floor = (r["matched_bytes_per_round"] or 0) + (r["filter_bytes_per_round"] or 0)
                r["bytes_vs_matched"] = nbytes / floor if nbytes and floor else None
                print(
                    f"  {r['method']:<16} {r['seconds_per_round']:>8.2f} {ratio:>8.3f} "
                    f"{(r['nnz_read_per_round'] or 0):>13,.0f} {(nbytes or 0):>14,.0f} "
                    f"{(nbytes or 3 * entry['store_bytes']) / (3 * entry['store_bytes']):>8.3f} "
                    f"{(r['bytes_vs_matched'] or float('nan')):>8.2f} {r['fit']:>9.5f} "
                    f"{(r['fit_ratio'] or 0):>8.3f} {(t95 or float('nan')):>8.1f} "
                    f"{(r['t95_ratio'] or float('nan')):>8.3f}"
                )
            out["stores"].append(entry)
    finally:
        client.close()
        cluster.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)


if __name__ == "__main__":
    main()
