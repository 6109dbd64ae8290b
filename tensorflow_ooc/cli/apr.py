"""``tfooc apr``: CP-APR (Poisson CP) of a store of counts."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from ..decompositions.apr.options import CP_APR
from .declared_flags import add_declared, declared_keywords
from .options import print_no_iterations, run_outputs, this_run


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
        options = declared_keywords(args, CP_APR)
        options.update(checkpoint=checkpoint, callback=progress, out=out, overwrite=True)
        result = cp_apr(store, args.rank, **options)
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
    add_declared(d, CP_APR)
    d.set_defaults(func=cmd_apr)
