"""Where an owner-computes iteration's time goes on 2 process workers x 1 thread (issue 49).

    python benchmarks/profile_owner_iteration.py                    # vast-shaped 26 M, rank 16, 10 iterations
    python benchmarks/profile_owner_iteration.py --workers 2 --iters 12 --inline

Runs CP-ALS on a LocalCluster of process workers with every step of a worker's iteration timed
in the worker processes (wrappers installed with ``client.run``; the code itself is unchanged):
per mode the local MTTKRP (wall and the task thread's CPU), the sends (the task thread's share:
copies and the hand-off to the event loop), the waits for other workers' rows, the update (the
mode's step less its sends and waits), each message's delivery (sender's hand-off to the
receiver's mailbox, one clock: perf_counter is CLOCK_MONOTONIC across processes) and the event
loop's time writing it (Dask's comms only); per iteration (a task runs a batch of them, each timed
on its own) the wait between iterations, the CPU the worker process's other threads took beside
the task thread, and the driver process's (client and scheduler) CPU.
With ``--inline``, the same CP-ALS inline for the per-mode MTTKRP and update seconds beside it.

Prints tables (medians over iterations 3 onwards); writes JSON to
benchmarks/results/owner-profile-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_scaleout import RESULTS, store_for  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402

TRACE_MODULE = "tfooc_owner_profile"


def install(dask_worker=None) -> int:
    """Run on a worker: wrap the steps of an owner-computes iteration to record timed events in
    the module ``TRACE_MODULE`` (made here); returns the worker's pid."""
    import functools
    import threading
    import time
    import types

    from tensorflow_ooc.decompositions.cp import cp_owner, cp_owner_one_round
    from tensorflow_ooc.execution import exchange, owner_computes

    if TRACE_MODULE in sys.modules:
        return os.getpid()
    mod = types.ModuleType(TRACE_MODULE)
    mod.events = []
    mod.lock = threading.Lock()
    sys.modules[TRACE_MODULE] = mod

    def rec(*event) -> None:
        with mod.lock:
            mod.events.append(event)

    def timed(owner, name, label, key=None):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                rec(label, None if key is None else key(a, kw), t0, time.perf_counter(), time.thread_time() - c0)

        setattr(owner, name, wrapper)

    WS, Team, Box = owner_computes.WorkerState, exchange.Team, exchange.Mailbox
    timed(WS, "local_mttkrp", "mttkrp", lambda a, kw: a[1])
    mttkrp = WS.local_mttkrp

    def layout_once(self, mode, *a, **kw):
        """The worker's partitions (nonzeros, row ranges) and per mode its shared rows, once."""
        if not getattr(self, "_profiled_layout", False):
            self._profiled_layout = True
            parts = [s.part if hasattr(s, "part") else s[1] for s in self.sources]
            rec(
                "layout",
                [(p.nnz, list(p.row_lo), list(p.row_hi)) for p in parts],
                [
                    {
                        "owned": int(pl.owned.shape[0]),
                        "touched": None if pl.touched is None else int(pl.touched.shape[0]),
                        "shared": {
                            int(k): [int(v.shape[0]), int(v.min()), int(v.max())]
                            for k, v in pl.shared.items()
                            if len(v)
                        },
                        "one_round": pl.one_round,
                        "whole": pl.whole,
                    }
                    for pl in self.plans
                ],
            )
        return mttkrp(self, mode, *a, **kw)

    WS.local_mttkrp = layout_once
    timed(WS, "exchange_partials", "exchange", lambda a, kw: a[1])
    timed(WS, "all_reduce", "all_reduce", lambda a, kw: list(a[2]))
    timed(cp_owner, "one_round_mode", "mode_step", lambda a, kw: a[1])
    timed(cp_owner_one_round, "finish", "finish", lambda a, kw: a[1])
    timed(cp_owner_one_round, "solve_touched", "solve", lambda a, kw: a[1])
    timed(Team, "send_many", "send", lambda a, kw: list(a[1]))
    timed(Team, "receive", "receive", lambda a, kw: [list(a[1]) if isinstance(a[1], tuple) else a[1], a[2]])

    put = Box.put

    def put_wrapper(self, run, tag, src, payload):
        rec("arrive", [list(tag) if isinstance(tag, (list, tuple)) else tag, int(src)], time.perf_counter())
        return put(self, run, tag, src, payload)

    Box.put = put_wrapper

    send_all = exchange._send_all

    async def send_all_wrapper(worker, run, tag, src, payloads, addresses):
        t0 = time.perf_counter()
        try:
            await send_all(worker, run, tag, src, payloads, addresses)
        finally:
            rec("delivered", list(tag), t0, time.perf_counter())

    exchange._send_all = send_all_wrapper

    iterate = owner_computes._iterate
    import psutil

    me = psutil.Process()

    def thread_cpu() -> dict:
        """CPU seconds of each thread of this process, by name (numba's and others' unnamed)."""
        names = {t.native_id: t.name for t in threading.enumerate()}
        out: dict = {}
        for t in me.threads():
            name = names.get(t.id, "other")
            out[name] = out.get(name, 0.0) + t.user_time + t.system_time
        return out

    counter = iter(range(1 << 62))

    def timed_step(step):
        # each iteration of a task's batch on its own: its start, end and CPU (a task runs a batch)
        def one(*a, **kw):
            k = next(counter)
            t0 = time.perf_counter()
            rec("turn", k, t0, t0, time.process_time(), time.thread_time(), thread_cpu())
            try:
                return step(*a, **kw)
            finally:
                rec("iterated", k, time.perf_counter(), time.process_time(), time.thread_time(), thread_cpu())

        return one

    def iterate_wrapper(run, step, batch, seq):
        return iterate(run, timed_step(step), batch, seq)

    owner_computes._iterate = iterate_wrapper
    return os.getpid()


def collect(dask_worker=None) -> list:
    mod = sys.modules.get(TRACE_MODULE)
    return list(mod.events) if mod is not None else []


def _med(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def analyse(traces: dict[int, list], skip: int) -> dict:
    """Per worker rank, per mode and per iteration (from ``skip`` on): the medians of each step."""
    out: dict = {"workers": {}}
    arrivals = {}  # (receiver, tag, src) -> time
    handoffs = {}  # (sender, tag) -> time
    for rank, events in traces.items():
        for e in events:
            if e[0] == "arrive":
                arrivals[(rank, tuple(e[1][0]) if isinstance(e[1][0], list) else e[1][0], e[1][1])] = e[2]
            if e[0] == "send":
                handoffs[(rank, tuple(e[1]))] = e[2]
    latency: dict = {}
    for (_rcv, tag, src), t in arrivals.items():
        if (src, tag) in handoffs and isinstance(tag, tuple) and isinstance(tag[0], int) and tag[0] >= skip:
            latency.setdefault((tag[1], tag[-1]), []).append(t - handoffs[(src, tag)])
    out["delivery_ms"] = {f"mode {m} {kind}": 1e3 * _med(v) for (m, kind), v in sorted(latency.items())}
    for rank, events in traces.items():
        per: dict = {}
        iters = {}
        for e in events:
            kind = e[0]
            if kind == "turn":
                iters.setdefault(e[1], {})["turn"] = e
            elif kind == "iterated":
                iters.setdefault(e[1], {})["end"] = e
        seqs = sorted(iters)
        it_rows = []
        for s in seqs:
            if s < skip or "turn" not in iters[s] or "end" not in iters[s]:
                continue
            turn, end = iters[s]["turn"], iters[s]["end"]
            prev = iters.get(s - 1, {}).get("end")
            wall = end[2] - turn[3]
            other_cpu = (end[3] - turn[4]) - (end[4] - turn[5])
            threads = {
                k: end[5].get(k, 0.0) - turn[6].get(k, 0.0) for k in end[5] if end[5].get(k, 0.0) - turn[6].get(k, 0.0)
            }
            it_rows.append(
                {
                    "threads": threads,
                    "wall": wall,
                    "gap_before": turn[3] - prev[2] if prev else None,
                    "task_cpu": end[4] - turn[5],
                    "other_threads_cpu": other_cpu,
                    "start": turn[3],
                    "end": end[2],
                }
            )
        spans = [(r["start"], r["end"]) for r in it_rows]

        def inside(t: float, spans=spans) -> bool:
            return any(a <= t <= b for a, b in spans)

        for e in events:
            kind = e[0]
            if kind in ("mttkrp", "exchange", "mode_step", "finish", "solve"):
                if not inside(e[2]):
                    continue
                per.setdefault((e[1], kind), []).append((e[3] - e[2], e[4]))
            elif kind in ("send", "receive"):
                tag = e[1] if kind == "send" else e[1][0]
                if not (isinstance(tag, list) and isinstance(tag[0], int) and tag[0] >= skip):
                    continue
                per.setdefault((tag[1], kind), []).append((e[3] - e[2], e[4]))
            elif kind == "delivered":
                tag = e[1]
                if isinstance(tag[0], int) and tag[0] >= skip:
                    per.setdefault((tag[1], "event_loop_send"), []).append((e[3] - e[2], 0.0))
        n_it = max(1, len(it_rows))
        steps = {}
        for (mode, kind), v in sorted(per.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            # per iteration: sum the step's calls of one iteration (a mode has one call of most)
            steps[f"mode {mode} {kind}"] = {
                "ms_per_iteration": 1e3 * sum(x[0] for x in v) / n_it,
                "cpu_ms_per_iteration": 1e3 * sum(x[1] for x in v) / n_it,
                "calls_per_iteration": len(v) / n_it,
            }
        out["workers"][rank] = {
            "layout": next((e[1:] for e in events if e[0] == "layout"), None),
            "iterations": len(it_rows),
            "wall_ms": 1e3 * _med(r["wall"] for r in it_rows),
            "gap_before_ms": 1e3 * _med(r["gap_before"] for r in it_rows),
            "task_cpu_ms": 1e3 * _med(r["task_cpu"] for r in it_rows),
            "other_threads_cpu_ms": 1e3 * _med(r["other_threads_cpu"] for r in it_rows),
            # per thread (by name; sampled at 10 ms ticks by the OS), CPU ms an iteration, summed / iterations
            "thread_cpu_ms": {
                k: 1e3 * sum(r["threads"].get(k, 0.0) for r in it_rows) / max(1, len(it_rows))
                for k in sorted({k for r in it_rows for k in r["threads"]})
            },
            "steps": steps,
        }
    return out


def run_profile(store, args) -> dict:
    import dask
    import psutil
    from distributed import Client, LocalCluster

    config = {"distributed.worker.profile.enabled": False} if args.no_dask_profile else {}
    with (
        dask.config.set(config),
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None) as lc,
        Client(lc) as c,
    ):
        pids = c.run(install)
        addrs = sorted(pids)
        procs = {"driver_and_scheduler": psutil.Process()}
        procs.update({f"worker {addrs.index(a)} process": psutil.Process(p) for a, p in pids.items()})
        marks = []  # (wall, {process: CPU s}) at each iteration's end, seen by the driver

        def mark(record) -> None:
            marks.append((time.perf_counter(), {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}))

        t0 = time.perf_counter()
        r = tfo.cp_als(store, args.rank, seed=1, max_iters=args.iters, tol=0, client=c, callback=mark)
        wall = time.perf_counter() - t0
        traces = c.run(collect)
    got = analyse({addrs.index(a): traces[a] for a in addrs}, args.skip)
    hist = r.history[args.skip :]
    got["history"] = {
        "seconds": _med(h["seconds"] for h in hist),
        "all_seconds": [h["seconds"] for h in r.history],
        "mttkrp_seconds": [_med(h["mttkrp_seconds"][n] for h in hist) for n in range(store.nmodes)],
        "update_seconds": [_med(h["update_seconds"][n] for h in hist) for n in range(store.nmodes)],
        "exchange_seconds": [_med(h["exchange_seconds"][n] for h in hist) for n in range(store.nmodes)],
        "rounds": r.history[-1].get("rounds"),
        "bytes_sent": r.history[-1].get("bytes_sent"),
        "bytes_lower_bound": r.history[-1].get("bytes_lower_bound"),
        "mode_bytes_sent": r.history[-1].get("mode_bytes_sent"),
        "mode_bytes_lower_bound": r.history[-1].get("mode_bytes_lower_bound"),
        "fit": r.fit,
    }
    # each process's CPU over the steady iterations (from the end of iteration ``skip`` on), per iteration
    a, b = marks[args.skip - 1] if args.skip else marks[0], marks[-1]
    n = max(1, len(marks) - max(args.skip, 1))
    got["cpu_seconds_per_iteration"] = {k: (b[1][k] - a[1][k]) / n for k in procs}
    got["wall_per_iteration"] = (b[0] - a[0]) / n
    got["run_wall"] = wall
    return got


def run_inline(store, args) -> dict:
    r = tfo.cp_als(store, args.rank, seed=1, max_iters=args.iters, tol=0, scheduler="inline")
    hist = r.history[args.skip :]
    return {
        "seconds": _med(h["seconds"] for h in hist),
        "all_seconds": [h["seconds"] for h in r.history],
        "mttkrp_seconds": [_med(h["mttkrp_seconds"][n] for h in hist) for n in range(store.nmodes)],
        "update_seconds": [_med(h["update_seconds"][n] for h in hist) for n in range(store.nmodes)],
        "fit": r.fit,
    }


def print_profile(p: dict, inline: dict | None) -> None:
    h = p["history"]
    print(
        f"# history: s/it {h['seconds']:.4f}; per mode MTTKRP {fmt(h['mttkrp_seconds'])} update "
        f"{fmt(h['update_seconds'])} exchange {fmt(h['exchange_seconds'])} (slowest worker's, s)"
    )
    print(
        f"# rounds/it {h['rounds']}; bytes sent/it {h['bytes_sent']:,} against the lower bound "
        f"{h['bytes_lower_bound']:,} (per mode {h['mode_bytes_sent']} / {h['mode_bytes_lower_bound']})"
    )
    if inline:
        print(
            f"# inline: s/it {inline['seconds']:.4f}; per mode MTTKRP {fmt(inline['mttkrp_seconds'])} update "
            f"{fmt(inline['update_seconds'])}"
        )
    print(f"# wall s an iteration (driver's view) {p['wall_per_iteration']:.4f}")
    print("# CPU s an iteration: " + ", ".join(f"{k} {v:.3f}" for k, v in p["cpu_seconds_per_iteration"].items()))
    print(
        "# message delivery (hand-off to the receiver's mailbox), median ms: "
        + ", ".join(f"{k} {v:.2f}" for k, v in p["delivery_ms"].items())
    )
    for rank, w in p["workers"].items():
        print(
            f"\n## worker {rank}: iteration {w['wall_ms']:.1f} ms wall, task thread CPU {w['task_cpu_ms']:.1f}, "
            f"other threads' CPU {w['other_threads_cpu_ms']:.1f}, gap before {w['gap_before_ms']:.2f} ms"
        )
        print(f"# partitions (nnz, row_lo, row_hi) and per mode rows: {w['layout']}")
        print("# threads' CPU ms / it: " + ", ".join(f"{k} {v:.1f}" for k, v in w["thread_cpu_ms"].items()))
        print("| step | ms / it | task-thread CPU ms / it | calls / it |")
        print("|---|---|---|---|")
        for k, v in w["steps"].items():
            print(
                f"| {k} | {v['ms_per_iteration']:.2f} | {v['cpu_ms_per_iteration']:.2f} | "
                f"{v['calls_per_iteration']:.1f} |"
            )


def fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.4f}" for x in xs) + "]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensor", default="vast")
    ap.add_argument("--store", help="profile this store instead of --tensor's")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skip", type=int, default=2, help="iterations left out of the medians (warm-up)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-dask-profile", action="store_true", help="workers without Dask's statistical profiler")
    ap.add_argument("--inline", action="store_true", help="also run CP-ALS inline, for its per-mode seconds")
    args = ap.parse_args()
    store = tfo.open_store(args.store) if args.store else store_for(args.tensor)
    load = os.getloadavg()
    p = run_profile(store, args)
    inline = run_inline(store, args) if args.inline else None
    p["load"] = [load, os.getloadavg()]
    print(
        f"# {args.tensor} {store.nnz:,} nonzeros, rank {args.rank}, {args.workers} x 1; load {load[0]:.1f} -> "
        f"{p['load'][1][0]:.1f}"
    )
    print_profile(p, inline)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"owner-profile-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "profile": p, "inline": inline}, indent=1, default=str))
    print(f"# JSON: {out}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
