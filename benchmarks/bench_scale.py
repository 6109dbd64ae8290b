"""FROSTT-scale CP-ALS on one machine: Amazon-shaped tensors under a worker memory limit, with peers.

    python benchmarks/bench_scale.py                                  # 86 M nonzeros, 4 GB worker
    python benchmarks/bench_scale.py --sizes 86e6 400e6 1.74e9 --workdir /big/disk
    python benchmarks/bench_scale.py --alto /path/alto128/cpd128 --splatt /path/splatt/splatt

For each size: ``tfooc generate --like amazon --nnz N`` writes the store (generate rate, peak
temporary disk beside it, store bytes per nonzero); then exact CP-ALS (rank ``--rank``,
``--iters`` iterations) runs on a ``LocalCluster(n_workers=1, threads_per_worker=1,
processes=True, memory_limit=--worker-memory)``, with the worker's peak RSS sampled every 20 ms
and the memory plan it chose. Peers (ALTO's 128-bit build: the tensor needs 65 index bits; and
SPLATT), built outside this repository and passed by path, run on the same tensor written as
``.tns`` (only when a peer is given, and only up to ``--peer-max-nnz``: they hold the tensor in
memory). Prints a table; writes JSON to ``benchmarks/results/scale-<time>.json``.

``--methods exact sts`` also runs randomized CP-ALS (issue 10) under the same worker limit and
prints its seconds per iteration, the fit evaluation's share, draw and sampled-MTTKRP seconds.

Targets (issue 15): every size under a 4 GB worker; <= 1.0x SPLATT's and ALTO's seconds per
iteration at 86 M and 400 M; at 1.74 B, <= SPLATT's seconds per nonzero at 400 M x 1.74 B.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from peers.common import Sampler  # noqa: E402
from peers.external import steady  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TFOOC = [sys.executable, "-m", "tensorflow_ooc.cli"]


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def generate(store: Path, nnz: int, seed: int, compression: str = "fast") -> dict:
    """``tfooc generate`` a store; rate, peak temporary bytes beside it, bytes per nonzero."""
    parent = store.parent

    def temp_bytes() -> int:
        return sum(_dir_bytes(p) for p in parent.iterdir() if p.name.startswith(".tfooc") or ".partial" in p.name)

    t0 = time.perf_counter()
    with Sampler(temp_bytes, 0.5) as temp:
        subprocess.run(
            TFOOC
            + [
                "generate",
                "-q",
                "--like",
                "amazon",
                "--nnz",
                str(nnz),
                "--seed",
                str(seed),
                "--compression",
                compression,
                "--overwrite",
                str(store),
            ],
            check=True,
        )
    secs = time.perf_counter() - t0
    s = tfo.open_store(store)
    size = _dir_bytes(store)
    return {
        "seconds": secs,
        "nnz": s.nnz,
        "rate_nnz_per_s": s.nnz / secs,
        "peak_temp_bytes": temp.peak,
        "store_bytes": size,
        "bytes_per_nnz": size / s.nnz,
        "temp_vs_store": temp.peak / size,
    }


def cp_als_limited(
    store: Path,
    rank: int,
    iters: int,
    memory: str,
    seed: int,
    method: str = "exact",
    samples: int = 65536,
    fit_every: int | None = None,
    dtype: str = "float64",
) -> dict:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, memory_limit=memory, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        pid = next(iter(client.run(os.getpid).values()))
        proc = psutil.Process(pid)
        t0 = time.perf_counter()
        with Sampler(lambda: proc.memory_info().rss) as rss:
            try:
                kw = {} if method == "exact" else {"method": method, "samples": samples, "fit_every": fit_every}
                r = tfo.cp_als(
                    tfo.open_store(store), rank, client=client, max_iters=iters, tol=0, seed=seed, dtype=dtype, **kw
                )
            except Exception as exc:
                return {"error": f"{type(exc).__name__}: {exc}", "peak_rss": rss.peak}
        wall = time.perf_counter() - t0
        restarts = len(cluster.scheduler.workers) != 1 or next(iter(client.run(os.getpid).values())) != pid
    per_iter = [h["seconds"] for h in r.history]
    return {
        "seconds_per_iter": steady(per_iter),
        "per_iter": per_iter,
        "fit": r.fit,
        "wall_s": wall,
        "peak_rss": rss.peak,
        "limit": memory,
        "worker_restarted": bool(restarts),
        "plan": r.params.get("memory_plan"),
        "execution": r.params.get("execution"),
        "in_place": r.params.get("in_place_updates"),
        "mttkrp_s": [steady([h["mttkrp_seconds"][n] for h in r.history]) for n in range(3)],
        "update_s": [steady([h["update_seconds"][n] for h in r.history]) for n in range(3)],
        "method": method,
        "samples": samples if method != "exact" else None,
        "sampling_s": [steady([h.get("sampling_seconds", [0.0] * 3)[n] for h in r.history]) for n in range(3)],
        "fit_s": [h.get("fit_seconds", 0.0) for h in r.history],
        "fits": [h["fit"] for h in r.history],
    }


def peers(store: Path, args) -> dict:
    from peers import alto, splatt

    out: dict = {}
    tns = store.with_suffix(".tns")
    if not tns.exists():
        t0 = time.perf_counter()
        c, v = tfo.open_store(store).to_coo()
        from tensorflow_ooc import synthetic

        synthetic.write_tns(tns, [(c[i : i + (1 << 24)], v[i : i + (1 << 24)]) for i in range(0, len(c), 1 << 24)])
        del c, v
        out["tns_write_s"] = time.perf_counter() - t0
    for name, mod, exe in (("alto", alto, args.alto), ("splatt", splatt, args.splatt)):
        if not exe:
            continue
        try:
            out[name] = mod.cp_als(exe, tns, args.rank, args.iters, args.threads, mttkrp=False)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=float, default=[86e6], help="nonzeros (1e6 style)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--worker-memory", default="4GB")
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["exact"],
        choices=["exact", "sts", "arls-lev", "arls-lev-hybrid"],
        help="CP-ALS methods to run",
    )
    ap.add_argument("--samples", type=int, default=65536, help="randomized methods: rows drawn per mode")
    ap.add_argument("--fit-every", type=int, default=None, help="randomized methods: fit evaluated every N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dtype",
        choices=["float64", "float32"],
        default="float64",
        help="our factor matrices' dtype (float32 halves the factor rows' cache misses)",
    )
    ap.add_argument(
        "--compression",
        choices=["fast", "small", "none"],
        default="fast",
        help="the store's compression (none: raw chunks, mapped when streamed)",
    )
    ap.add_argument("--alto", help="ALTO cpd executable, 128-bit index build")
    ap.add_argument("--splatt", help="SPLATT splatt executable")
    ap.add_argument("--peer-max-nnz", type=float, default=450e6, help="largest size the peers are run on")
    ap.add_argument("--workdir", default=str(RESULTS / "scale-data"))
    ap.add_argument("--keep", action="store_true", help="keep the stores (default: delete each after use)")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        nnz = int(size)
        store = work / f"amazon-{nnz}.zarr"
        print(f"amazon-shaped, {nnz:,} nonzeros: generate", flush=True)
        row = {
            "nnz_requested": nnz,
            "compression": args.compression,
            "dtype": args.dtype,
            "generate": generate(store, nnz, args.seed, args.compression),
        }
        for method in args.methods:
            print(f"  CP-ALS R{args.rank} ({method}) under a {args.worker_memory} worker", flush=True)
            key = "cp_als" if method == "exact" else f"cp_als_{method}"
            row[key] = cp_als_limited(
                store,
                args.rank,
                args.iters,
                args.worker_memory,
                args.seed,
                method,
                args.samples,
                args.fit_every,
                args.dtype,
            )
        if (args.alto or args.splatt) and nnz <= args.peer_max_nnz:
            print("  peers", flush=True)
            row["peers"] = peers(store, args)
        rows.append(row)
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
            tns = store.with_suffix(".tns")
            if tns.exists():
                tns.unlink()
    print(
        f"\n{'nnz':>14}{'gen M/s':>9}{'temp/store':>11}{'B/nnz':>7}{'ours s/it':>10}{'peak RSS':>10}{'limit':>7}"
        f"{'plan':>30}{'ALTO':>8}{'SPLATT':>8}{'xALTO':>7}{'xSPL':>6}"
    )
    for row in rows:
        g, c, p = row["generate"], row.get("cp_als", {}), row.get("peers", {})
        a, s = p.get("alto", {}).get("cp_als_s"), p.get("splatt", {}).get("cp_als_s")
        ours = c.get("seconds_per_iter")
        plan = (
            f"{c['execution']}, {'in-place' if c['in_place'] else 'copying'}"
            if "execution" in c
            else c.get("error", "")[:28]
        )

        def fmt(x, w, p=2):
            return f"{x:>{w}.{p}f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"

        print(
            f"{g['nnz']:>14,}{g['rate_nnz_per_s'] / 1e6:>9.2f}{g['temp_vs_store']:>11.2f}{g['bytes_per_nnz']:>7.1f}"
            f"{fmt(ours, 10)}{c.get('peak_rss', 0) / 2**30:>9.2f}G{args.worker_memory:>7}{plan:>30}"
            f"{fmt(a, 8)}{fmt(s, 8)}{fmt(ours / a if ours and a else None, 7)}"
            f"{fmt(ours / s if ours and s else None, 6)}"
        )
    randomized = [
        (row["generate"]["nnz"], m, row[f"cp_als_{m}"])
        for row in rows
        for m in args.methods
        if m != "exact" and f"cp_als_{m}" in row
    ]
    if randomized:
        print(
            f"\n{'nnz':>14}{'method':>17}{'s/it':>8}{'of it: fit s':>13}{'draw s':>8}{'gather s':>9}{'fit':>9}"
            f"{'peak RSS':>10}"
        )
        for nnz, m, c in randomized:
            if "error" in c:
                print(f"{nnz:>14,}{m:>17}  {c['error'][:80]}")
                continue
            print(
                f"{nnz:>14,}{m:>17}{c['seconds_per_iter']:>8.2f}{max(c['fit_s']):>13.2f}{sum(c['sampling_s']):>8.2f}"
                f"{sum(c['mttkrp_s']):>9.2f}{c['fit']:>9.5f}{c['peak_rss'] / 2**30:>9.2f}G"
            )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
