"""CP-APR (Poisson CP) side by side with ALTO's APR, pyttb and GenTen, on count tensors, in one run.

    python benchmarks/bench_apr.py --alto ~/peers/alto64/cpd64 --tensors uber nips chicago nell2 --threads 2
    python benchmarks/bench_apr.py --tensors amazon --memory-limit 4GB      # 86 M nonzeros, streamed
    # issue 49's MU table: binary knowledge-graph tensors (public ones from --kg-dir, generated
    # ones) and the 3.3 M uber-shaped counts, ranks 8 and 16
    python benchmarks/bench_apr.py --alto ~/peers/alto64/cpd64 --kg-dir ~/peers/kg --threads 2 \
        --tensors kinship umls kg-10k kg-30k kg-100k uber --ranks 8 16 --no-pdnr --repeats 3

This script builds nothing: ALTO (github.com/IntelLabs/ALTO) is built outside the repository and
passed by path, as for ``bench_peers.py``; pyttb and GenTen (``pygenten``) run in this process.

For each tensor (the heavy-tailed supports ``bench_peers.py`` uses, shaped like FROSTT's uber,
nips, chicago, nell2 and Amazon (86 M nonzeros: a store written out of core by ``tfooc generate``, no .tns);
values are counts ``1 + Geometric(1/2)``, the same seed every
run) the nonzeros are written once as a 1-based ``.tns`` under ``--workdir`` and converted to a
store. Then, with ``--threads`` threads:

- MU: ours (``cp_apr(algorithm="mu")``) and ALTO's APR each run ``--outer`` outer iterations of
  10 inner iterations per mode (tolerance far below reach). Seconds per inner iteration: ours,
  the steady-state outer iteration (median after the first, which loads the kernels; it includes
  the log-likelihood pass) divided by its inner iterations; ALTO, its main-loop timer divided by
  its inner iterations. Both report the final log-likelihood.
- PDN-R: ours, seconds per outer iteration and the log-likelihood after ``--outer``; on tensors of
  at most ``--small`` nonzeros also pyttb's ``cp_apr(algorithm="pdnr")`` from the same start
  (``--outer`` outer iterations), and the seconds each of ours (up to 4 x ``--outer``) and
  GenTen needs to reach pyttb's final log-likelihood. pygenten 0.1.5 (the wheel on PyPI) exposes
  no CP-APR, and its GCP-OPT refuses sparse tensors: its count model here is GCP-SGD with the
  Poisson loss, from the same start, timed by its own per-epoch log (its sampled loss estimate).

Knowledge-graph tensors (issue 49), values 1: ``kg-10k``, ``kg-30k``, ``kg-100k`` are
entity x relation x entity supports of that many nonzeros drawn by the heavy-tailed generator
(:data:`KG_SHAPES`); a public one (``kinship``, ``umls``, ...) is read from ``--kg-dir``, where
``NAME-*.txt`` hold its triples ``head<TAB>relation<TAB>tail`` (e.g. the train, valid and test
splits; their union, each triple once, ids in order of first appearance). They are not part of
this repository.

``--repeats K``: ours and ALTO each run K times per row and the fastest run counts (the machines
these run on are shared; a busy core stalls both tools' threads). Tensors of at most 1 M
nonzeros run ``--small-outer`` outer iterations instead of ``--outer``.

``--memory-limit``: ours runs on a one-worker Dask cluster with this memory limit (the memory
plan then streams what does not fit), and the worker's peak memory is reported.

Prints a table; writes JSON to ``benchmarks/results/apr-<time>.json``. Targets (issue 34): MU
seconds per inner iteration <= 1.0 x ALTO (moonshot 0.8 x); PDN-R reaching pyttb's final
log-likelihood in fewer seconds than GenTen; the 86 M tensor under a 4 GB worker. Issue 49's
target table (printed when ALTO ran): MU <= 1.0 x ALTO per inner iteration below 1 M nonzeros
(10 k-100 k), <= 0.7 x at the 3.3 M counts tensor.
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

from bench_peers import _git_commit  # noqa: E402
from peers.external import steady  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.store.metadata import FORMAT_VERSION  # noqa: E402

RESULTS = Path(__file__).parent / "results"
INNER = 10


# above this many nonzeros the tensor is written as a store only, by ``tfooc generate`` (out of
# core; no .tns for ALTO, no COO arrays in this process)
LARGE_NNZ = 30_000_000


def large_count_store(
    name: str, workdir: Path, seed: int, nnz: int, tns: bool = False
) -> tuple[Path | None, Path, None, None, tuple]:
    """A preset-shaped count store of ``nnz`` nonzeros written by ``tfooc generate --values count``
    (made once); with ``tns``, also its 1-based ``.tns`` for ALTO, written chunk by chunk from the
    store (made once: 86 M nonzeros take about 2.5 GB)."""
    store_path = workdir / f"{name}-counts-s{seed}-{nnz}-generated.zarr"
    try:
        s = tfo.open_store(store_path)
        if s.meta["format_version"] != FORMAT_VERSION:
            raise ValueError("older format")
    except Exception:
        cmd = [sys.executable, "-m", "tensorflow_ooc.cli", "generate", str(store_path), "--like", name]
        cmd += ["--nnz", str(nnz), "--values", "count", "--seed", str(seed), "--overwrite"]
        subprocess.run(cmd, check=True)
        s = tfo.open_store(store_path)
    path = None
    if tns:
        path = store_path.with_suffix(".tns")
        if not path.exists():
            part = path.with_suffix(".tns.part")
            batches = ((ch.coords(s.layout), ch.values) for ch in s.iter_chunks())
            synthetic.write_tns(part, batches, one_based=True)
            part.rename(path)
    return path, store_path, None, None, tuple(s.shape)


# the out-of-core case: Amazon's shape at 86 M nonzeros (the whole Amazon has 1.7 G);
# NAME-100k: the preset's shape at 100,000 nonzeros, small enough for pyttb
SIZES = {"amazon": 86_000_000, **{f"{k}-100k": 100_000 for k in ("uber", "nips", "chicago")}}


def count_tensor(
    name: str, workdir: Path, seed: int, tns: bool = False
) -> tuple[Path | None, Path, np.ndarray | None, np.ndarray | None, tuple]:
    """The count tensor's ``.tns`` and store under ``workdir`` (made once), and its COO arrays."""
    shape, nnz = synthetic.PRESETS[name.split("-")[0]]
    nnz = SIZES.get(name, nnz)
    if nnz > LARGE_NNZ:
        return large_count_store(name, workdir, seed, nnz, tns)
    tag, coords, values, shape = count_coo(name, seed)
    return _written(tag, workdir, coords, values, shape)


def count_coo(name: str, seed: int) -> tuple[str, np.ndarray, np.ndarray, tuple]:
    """The in-memory count tensor of :func:`count_tensor` (at most ``LARGE_NNZ`` nonzeros): its
    name for files under the workdir, COO arrays and shape (``bench_tt.py --data counts`` reads it)."""
    shape, nnz = synthetic.PRESETS[name.split("-")[0]]
    nnz = SIZES.get(name, nnz)
    coords, _ = synthetic.heavy_tailed(shape, nnz, seed=seed)
    values = (1 + np.random.default_rng(seed + 1).geometric(0.5, len(coords))).astype(np.float64)
    digest = hashlib.sha1(np.ascontiguousarray(coords).data)
    digest.update(np.ascontiguousarray(values).data)
    return f"{name}-counts-s{seed}-{len(coords)}-{digest.hexdigest()[:10]}", coords, values, tuple(shape)


def _written(
    tag: str, workdir: Path, coords: np.ndarray, values: np.ndarray, shape
) -> tuple[Path, Path, np.ndarray, np.ndarray, tuple]:
    """The tensor as ``.tns`` and store under ``workdir``, named by ``tag`` (each made once)."""
    tns, store_path = workdir / f"{tag}.tns", workdir / f"{tag}.zarr"
    if not tns.exists():
        synthetic.write_tns(tns, [(coords, values)], one_based=True)
    try:
        if tfo.open_store(store_path).meta["format_version"] != FORMAT_VERSION:
            raise ValueError("older format")
    except Exception:
        tfo.convert((coords, values), store_path, shape=shape, overwrite=True)
    return tns, store_path, coords, values, tuple(shape)


# knowledge-graph-shaped supports (entities, relations, entities) per generated size
KG_SHAPES = {"kg-10k": (2_000, 20, 2_000), "kg-30k": (3_000, 40, 3_000), "kg-100k": (5_000, 60, 5_000)}
KG_NNZ = {"kg-10k": 10_000, "kg-30k": 30_000, "kg-100k": 100_000}
# issue 49: MU per inner iteration against ALTO's, below and above this many nonzeros
SMALL_NNZ = 1_000_000
TARGET_SMALL, TARGET_LARGE = 1.0, 0.7


def kg_triples(name: str, kg_dir: Path) -> tuple[np.ndarray, tuple]:
    """The public knowledge graph ``name``'s triples from ``kg_dir/NAME-*.txt`` as coordinates
    (entity, relation, entity), each triple once, ids in order of first appearance."""
    files = sorted(kg_dir.glob(f"{name}-*.txt"))
    if not files:
        raise SystemExit(f"--kg-dir {kg_dir}: no {name}-*.txt with {name}'s triples")
    entities: dict[str, int] = {}
    relations: dict[str, int] = {}
    seen: dict[tuple, None] = {}
    for f in files:
        for lineno, line in enumerate(f.read_text().splitlines(), 1):
            parts = line.split("\t")
            if not line.strip():
                continue
            if len(parts) != 3:
                raise SystemExit(f"{f}:{lineno}: expected head<TAB>relation<TAB>tail, got {line!r}")
            h, r, t = (p.strip() for p in parts)
            key = (entities.setdefault(h, len(entities)), relations.setdefault(r, len(relations)))
            seen[key + (entities.setdefault(t, len(entities)),)] = None
    coords = np.array(list(seen), dtype=np.int64)
    return coords, (len(entities), len(relations), len(entities))


def binary_tensor(
    name: str, workdir: Path, seed: int, kg_dir: Path | None
) -> tuple[Path, Path, np.ndarray, np.ndarray, tuple]:
    """A knowledge-graph tensor of ones: public (from ``kg_dir``) or generated (``kg-*``), as
    ``.tns`` and store under ``workdir`` (made once), and its COO arrays."""
    if name in KG_SHAPES:
        shape = KG_SHAPES[name]
        coords, _ = synthetic.heavy_tailed(shape, KG_NNZ[name], skew=1.2, seed=seed)
    else:
        if kg_dir is None:
            raise SystemExit(f"--tensors {name}: a public knowledge graph needs --kg-dir")
        coords, shape = kg_triples(name, kg_dir)
    values = np.ones(len(coords))
    digest = hashlib.sha1(np.ascontiguousarray(coords).data)
    return _written(f"{name}-binary-s{seed}-{len(coords)}-{digest.hexdigest()[:10]}", workdir, coords, values, shape)


def fastest(runs: list[dict]) -> dict:
    """The run with the fewest seconds per inner iteration, with every run's figure beside it."""
    best = min(runs, key=lambda r: r.get("inner_s", float("inf")))
    return {**best, "inner_s_runs": [r.get("inner_s") for r in runs]}


def _client(memory_limit: str | None, threads: int):
    if not memory_limit:
        return None
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, memory_limit=memory_limit, dashboard_address=None
    )
    return Client(cluster)


def _peak_rss(client) -> int | None:
    if client is None:
        return None
    import resource

    # the worker process's peak resident set (ru_maxrss, KiB on Linux), not its size now
    return max(client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024).values())


def ours_mu(store_path: Path, rank: int, outer: int, seed: int, client) -> dict:
    r = tfo.cp_apr(
        store_path, rank, algorithm="mu", max_iters=outer, max_inner_iters=INNER, tol=1e-300, seed=seed, client=client
    )
    per_inner = [h["seconds"] / max(1, h["inner_iterations"]) for h in r.history]
    return {
        "inner_s": steady(per_inner),
        "outer_s": steady([h["seconds"] for h in r.history]),
        "first_outer_s": r.history[0]["seconds"],
        "loglik": r.loglik,
        "inner_iterations": sum(h["inner_iterations"] for h in r.history),
        "execution": r.params.get("execution"),
        "inner_loop": r.params.get("inner_loop", "task graph"),
        "pass_seconds": r.history[-1].get("pass_seconds"),
        "peak_worker_rss": _peak_rss(client),
    }


def ours_pdnr(store_path: Path, rank: int, outer: int, seed: int, init, client) -> dict:
    r = tfo.cp_apr(store_path, rank, algorithm="pdnr", max_iters=outer, tol=1e-300, init=init, client=client)
    t = np.cumsum([h["seconds"] for h in r.history])
    return {
        "outer_s": steady([h["seconds"] for h in r.history]),
        "loglik": r.loglik,
        "trace": [(float(s), h["loglik"]) for s, h in zip(t, r.history)],
        "inner_iterations": sum(h["inner_iterations"] for h in r.history),
        "peak_worker_rss": _peak_rss(client),
    }


def pyttb_pdnr(coords, values, shape, rank: int, outer: int, init) -> dict:
    import pyttb as ttb

    X = ttb.sptensor(coords, values[:, None], shape)
    t0 = time.perf_counter()
    M, _, out = ttb.cp_apr(
        X,
        rank,
        algorithm="pdnr",
        init=ttb.ktensor([a.copy() for a in init]),
        maxiters=outer,
        stoptol=1e-300,
        printitn=0,
    )
    return {"seconds": time.perf_counter() - t0, "loglik": float(out["obj"])}


def genten_poisson(coords, values, shape, rank: int, init, target: float, threads: int, epochs: int = 30) -> dict:
    """GenTen's count model: GCP-SGD with the Poisson loss from ``init`` (pygenten 0.1.5 has no
    CP-APR, and its GCP-OPT refuses sparse tensors). Its per-epoch log prints the estimated loss
    ``f-est`` (``-log-likelihood`` from its samples) and the elapsed seconds: ``reach_s`` is the
    first epoch's time at which ``-f-est`` is at least ``target``; ``loglik`` is the final model's,
    computed exactly (pyttb's formula)."""
    import re

    import pyttb as ttb
    from peers.common import _capture_output
    from peers.genten import _load_genten

    gt = _load_genten(threads)
    X = ttb.sptensor(np.ascontiguousarray(coords, dtype=np.int64), np.ascontiguousarray(values[:, None]), shape)
    u0 = ttb.ktensor([np.ascontiguousarray(a) for a in init], np.ones(rank))
    with _capture_output() as out:
        t0 = time.perf_counter()
        M, _, _ = gt.gcp_sgd(X, init=u0, rank=rank, loss_function_type="poisson", maxiters=epochs, printitn=1, seed=1)
        secs = time.perf_counter() - t0
    weights = np.array(M.weights, dtype=np.float64)
    factors = [np.array(f, dtype=np.float64) for f in M.factor_matrices]
    del M
    model = np.ones((len(values), rank)) * weights
    for n, f in enumerate(factors):
        model *= f[coords[:, n]]
    m = model.sum(axis=1)
    total = float(np.sum(weights * np.prod([f.sum(axis=0) for f in factors], axis=0)))
    ll = float(np.sum(values * np.log(np.maximum(m, 1e-300)))) - total
    epochs_seen = [
        (float(t), -float(f))
        for f, t in re.findall(r"Epoch\s+\d+: f-est =\s*([-+0-9.eE]+),.*time =\s*([-+0-9.eE]+) sec", out.text)
    ]
    return {
        "method": "GCP-SGD, Poisson loss",
        "seconds": secs,
        "loglik": ll,
        "reach_s": _reach(epochs_seen, target),
        "epochs": epochs_seen,
    }


def _reach(trace, target: float) -> float | None:
    for s, ll in trace:
        if ll >= target:
            return s
    return None


def bench(args) -> dict:
    from peers import alto

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    client = _client(args.memory_limit, args.threads)
    out = {
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "peers": {"alto": {"path": args.alto, "commit": _git_commit(args.alto)}},
        "rows": [],
    }
    try:
        for name in args.tensors:
            if name in SIZES or name in synthetic.PRESETS:
                tns, store_path, coords, values, shape = count_tensor(name, workdir, args.seed, tns=bool(args.alto))
                kind = "counts"
            else:
                kg_dir = Path(args.kg_dir) if args.kg_dir else None
                tns, store_path, coords, values, shape = binary_tensor(name, workdir, args.seed, kg_dir)
                kind = "binary"
            nnz = tfo.open_store(store_path).nnz
            outer = args.small_outer if nnz <= SMALL_NNZ else args.outer
            for rank in args.ranks:
                row = {"tensor": name, "kind": kind, "shape": list(shape), "nnz": int(nnz), "rank": rank}
                row["outer"] = outer
                print(f"{name} rank {rank}: ours MU", flush=True)
                runs = [ours_mu(store_path, rank, outer, args.seed, client) for _ in range(args.repeats)]
                row["ours_mu"] = fastest(runs)
                if args.alto and tns is not None:
                    print(f"{name} rank {rank}: ALTO APR", flush=True)
                    try:
                        runs = [
                            alto.cp_apr(args.alto, tns, rank, outer, INNER, args.threads) for _ in range(args.repeats)
                        ]
                        row["alto_mu"] = fastest(runs)
                    except Exception as exc:
                        row["alto_mu"] = {"error": f"{type(exc).__name__}: {exc}"}
                if not args.no_pdnr:
                    init = [np.random.default_rng(args.seed + n).random((s, rank)) for n, s in enumerate(shape)]
                    print(f"{name} rank {rank}: ours PDN-R", flush=True)
                    # ours may run up to 4x the outer iterations to reach pyttb's final log-likelihood
                    outer = args.outer * 4 if coords is not None and len(coords) <= args.small else args.outer
                    row["ours_pdnr"] = ours_pdnr(store_path, rank, outer, args.seed, init, client)
                    if coords is not None and len(coords) <= args.small:
                        print(f"{name} rank {rank}: pyttb PDN-R", flush=True)
                        row["pyttb_pdnr"] = p = pyttb_pdnr(coords, values, shape, rank, args.outer, init)
                        row["ours_pdnr"]["reach_pyttb_s"] = _reach(row["ours_pdnr"]["trace"], p["loglik"])
                        if not args.no_genten:
                            print(f"{name} rank {rank}: GenTen GCP-SGD Poisson", flush=True)
                            try:
                                row["genten_poisson"] = genten_poisson(
                                    coords, values, shape, rank, init, p["loglik"], args.threads
                                )
                            except Exception as exc:
                                row["genten_poisson"] = {"error": f"{type(exc).__name__}: {exc}"}
                out["rows"].append(row)
    finally:
        if client is not None:
            client.close()
    return out


def table(out: dict) -> None:
    def f(v, p=4):
        return "-" if v is None else f"{v:.{p}f}"

    print()
    head = f"{'tensor':9} {'nnz':>11} {'R':>3} | {'MU s/inner':>10} {'ALTO':>10} {'x ALTO':>7}"
    print(head + f" | {'loglik ours':>13} {'ALTO':>13}")
    for r in out["rows"]:
        o, a = r["ours_mu"], r.get("alto_mu") or {}
        ratio = o["inner_s"] / a["inner_s"] if a.get("inner_s") else None
        print(
            f"{r['tensor']:9} {r['nnz']:>11,} {r['rank']:>3} | {f(o['inner_s'], 6):>10} {f(a.get('inner_s'), 6):>10} "
            f"{f(ratio, 2):>7} | {o['loglik']:>13.6e} {a.get('loglik', float('nan')):>13.6e}"
        )
    rows = [r for r in out["rows"] if "ours_pdnr" in r]
    if rows:
        print()
        head = f"{'tensor':9} {'R':>3} | {'PDN-R s/outer':>13} {'loglik':>13} | {'pyttb s':>8} {'pyttb ll':>13}"
        print(head + f" | {'ours reach s':>12} {'GenTen reach s':>14}")
        for r in rows:
            o, p, g = r["ours_pdnr"], r.get("pyttb_pdnr") or {}, r.get("genten_poisson") or {}
            ll = p.get("loglik", float("nan"))
            print(
                f"{r['tensor']:9} {r['rank']:>3} | {f(o['outer_s']):>13} {o['loglik']:>13.6e} | "
                f"{f(p.get('seconds'), 2):>8} {ll:>13.6e} | {f(o.get('reach_pyttb_s'), 2):>12} "
                f"{f(g.get('reach_s'), 2):>14}"
            )


def target_table(out: dict) -> None:
    """Issue 49's table: MU seconds per inner iteration against ALTO's, with the target per row."""
    rows = [r for r in out["rows"] if (r.get("alto_mu") or {}).get("inner_s")]
    if not rows:
        return
    print()
    print("Issue 49 target: CP-APR MU s/inner-iteration <= 1.0x ALTO below 1 M nonzeros, <= 0.7x at ~3 M")
    head = f"{'tensor':9} {'kind':7} {'nnz':>10} {'R':>3} | {'ours s/it':>10} {'ALTO s/it':>10}"
    print(head + f" {'ratio':>6} {'target':>7} {'met?':>5} | {'our path':>11}")
    for r in rows:
        o, a = r["ours_mu"], r["alto_mu"]
        ratio = o["inner_s"] / a["inner_s"]
        target = TARGET_SMALL if r["nnz"] <= SMALL_NNZ else TARGET_LARGE
        r["target"] = {"ratio": ratio, "target": target, "met": ratio <= target}
        print(
            f"{r['tensor']:9} {r.get('kind', 'counts'):7} {r['nnz']:>10,} {r['rank']:>3} | {o['inner_s']:10.6f} "
            f"{a['inner_s']:10.6f} {ratio:6.2f} {target:7.1f} {'yes' if ratio <= target else 'NO':>5} | "
            f"{o.get('inner_loop', '-'):>11}"
        )


COUNT_NAMES = sorted(synthetic.PRESETS) + sorted(k for k in SIZES if k.endswith("-100k"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alto", help="ALTO's cpd executable (64-bit index build); skipped if not given")
    ap.add_argument("--no-genten", action="store_true", help="skip GenTen (pygenten)")
    ap.add_argument("--no-pdnr", action="store_true", help="MU only")
    ap.add_argument(
        "--tensors",
        nargs="+",
        default=["uber", "nips", "chicago", "nell2"],
        help=f"count presets ({', '.join(COUNT_NAMES)}), generated knowledge graphs ({', '.join(KG_SHAPES)}) "
        "or public ones found in --kg-dir",
    )
    ap.add_argument("--kg-dir", help="folder of public knowledge graphs' triples, NAME-*.txt (see above)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of ours and of ALTO per row; the fastest counts")
    ap.add_argument(
        "--small-outer", type=int, default=20, help="outer iterations on tensors up to 1 M nonzeros (10 inner each)"
    )
    ap.add_argument("--ranks", nargs="+", type=int, default=[16])
    ap.add_argument("--outer", type=int, default=5, help="outer iterations every tool runs (10 inner each)")
    ap.add_argument(
        "--small", type=int, default=200_000, help="pyttb and GenTen only on tensors up to this many nonzeros"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--memory-limit", help="run ours on a one-worker Dask cluster with this memory limit, e.g. 4GB")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--workdir", default=str(RESULTS / "peer-data"))
    args = ap.parse_args(argv)
    if args.alto and not os.access(args.alto, os.X_OK):
        ap.error(f"--alto {args.alto}: not an executable file")
    out = bench(args)
    table(out)
    target_table(out)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"apr-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
