"""``tfooc apr``: CP-APR (Poisson CP) of a store of counts."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from .options import _positive_int, _seed, _tolerance, print_no_iterations, run_outputs, this_run


def cmd_apr(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from ..decompositions import cp_apr
    from ..store import open_store, paths

    store = open_store(paths.resolve_version(args.store))
    out, checkpoint = run_outputs(args, f"apr-r{args.rank}")
    bar = tqdm(total=args.max_iters, desc=f"cp-apr {args.algorithm}", unit="it", disable=not args.progress, leave=False)

    def progress(record: dict) -> None:
        bar.n = record["iteration"]
        bar.set_postfix(
            loglik=f"{record['loglik']:.6e}", kkt=f"{record['kkt_violation']:.1e}", s_per_it=f"{record['seconds']:.3f}"
        )

    t0 = time.perf_counter()
    with bar, logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        result = cp_apr(
            store,
            args.rank,
            algorithm=args.algorithm,
            scheduler=args.scheduler,
            max_iters=args.max_iters,
            max_inner_iters=args.max_inner_iters,
            tol=args.tol,
            seed=args.seed,
            kappa=args.kappa,
            kappa_tol=args.kappa_tol,
            eps_div_zero=args.eps_div_zero,
            checkpoint=checkpoint,
            resume=args.resume,
            callback=progress,
            execution=args.execution,
            distribution=args.distribution,
            out=out,
            overwrite=True,
        )
    wall = time.perf_counter() - t0
    new, steady, per_it = this_run(result)
    print(
        f"CP-APR ({args.algorithm}) rank {args.rank} on {store.path} ({store.nnz:,} nonzeros, "
        f"{result.params['execution']} execution, "
        f"{'in this process' if result.params.get('scheduler') == 'inline' else 'Dask graph'})"
    )
    print(f"  log-likelihood {result.loglik:.8e} after {result.iterations} outer iterations")
    print(f"  KKT violation  {result.kkt:.3e}  (tolerance {args.tol:g})")
    print(f"  fit            {result.fit:.6f}  (least squares, for comparison with CP-ALS)")
    if not new:
        print_no_iterations(args, wall)
    else:
        inner = sum(h["inner_iterations"] for h in new)
        print(f"  first iter     {new[0]['seconds']:.3f} s  (includes kernel compilation or cache loading)")
        print(
            f"  per iteration  {per_it:.3f} s  steady state ({inner:,} inner iterations in "
            f"{len(new)} outer, {wall:.1f} s wall)"
        )
    print(f"  result         {out}")
    print(f"  checkpoint     {checkpoint}")
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``apr`` with the CLI's ``add`` (a subparser factory)."""
    d = add(
        "apr",
        help="Poisson CP (CP-APR) of a store of counts on Dask",
        description="Rank-R CP-APR of a BLCO store of nonnegative counts: nonnegative factors that "
        "maximize the Poisson log-likelihood, by multiplicative updates (mu, Chi & Kolda 2012) or "
        "row-wise projected damped Newton (pdnr, Hansen, Plantenga & Kolda 2015), as pyttb's "
        "cp_apr. Writes a Zarr result store (columns of unit 1-norm, log-likelihood per outer "
        "iteration) and a checkpoint every outer iteration; --resume continues from it.",
    )
    d.add_argument(
        "store",
        help="input BLCO store of nonnegative counts (a versioned store folder: its latest version; "
        "FOLDER@vN: version N); a negative value is refused, naming it",
    )
    d.add_argument("--rank", type=_positive_int, required=True, help="number of components R")
    d.add_argument(
        "--algorithm",
        choices=["mu", "pdnr"],
        default="mu",
        help="mu = multiplicative updates (cheap inner iterations), pdnr = projected damped Newton "
        "per row (fewer, costlier inner iterations; default mu)",
    )
    d.add_argument("--out", help="result store (default STORE.apr-rR.zarr)")
    d.add_argument(
        "--scheduler",
        help="address of an existing Dask scheduler; 'embedded' for the in-process Dask cluster; "
        "'inline' to run in this process without Dask (default: inline up to 2^24 nonzeros)",
    )
    d.add_argument("--max-iters", type=_positive_int, default=1000, help="outer iterations at most (default 1000)")
    d.add_argument(
        "--max-inner-iters",
        type=_positive_int,
        default=10,
        help="inner iterations per mode and outer iteration (default 10)",
    )
    d.add_argument(
        "--tol", type=_tolerance, default=1e-4, help="stop when every mode's KKT violation is below TOL (default 1e-4)"
    )
    d.add_argument("--seed", type=_seed, default=None, help="seed of the random initial factors (uniform [0, 1))")
    d.add_argument("--kappa", type=_tolerance, default=0.01, help="mu: offset for entries stuck at zero (default 0.01)")
    d.add_argument(
        "--kappa-tol", type=_tolerance, default=1e-10, help="mu: an entry below this counts as zero (default 1e-10)"
    )
    d.add_argument(
        "--eps-div-zero",
        type=_tolerance,
        default=None,
        help="floor of model values in divisions (default pyttb's 1e-10, or 1e-3 of the mean model value "
        "over all cells where that is smaller, as for huge hypersparse tensors)",
    )
    d.add_argument(
        "--execution",
        choices=["auto", "streaming", "in-memory"],
        default="auto",
        help="stream chunks each pass or keep decoded blocks on workers (default: by memory)",
    )
    d.add_argument(
        "--distribution",
        choices=["auto", "owner", "graph"],
        default="auto",
        help="how the run spreads over several workers: owner = owner-computes (each worker keeps its "
        "partitions and the factor rows it owns, one task per worker and outer iteration, rows sent only "
        "where shared; needs Dask CPU workers, not --scheduler inline); graph = per-mode task graphs (what "
        "one worker and the inline scheduler always use); auto = owner on a cluster of several CPU workers, "
        "else graph (default auto)",
    )
    d.add_argument("--checkpoint", help="checkpoint file (default OUT.checkpoint.npz)")
    d.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    d.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing result at OUT (without it, an existing result is an error)",
    )
    d.set_defaults(func=cmd_apr)
