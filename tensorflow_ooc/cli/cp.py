"""``tfooc cpd``: CP-ALS of a store or a dense array."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from ..decompositions.cp.options import CP_ALS
from .declared_flags import add_declared, declared_keywords
from .options import (
    iteration_bar,
    mean_seconds,
    print_no_iterations,
    run_outputs,
    this_run,
)


def cmd_cpd(args: argparse.Namespace) -> int:

    from ..decompositions import cp_als
    from ..decompositions.common.mttkrp_input import open_input

    store = open_input(args.store)  # a BLCO store or a dense Zarr array
    entries, entry = ("entries", "entry") if store.dense else ("nonzeros", "nonzero")
    out, checkpoint = run_outputs(args, f"cp-r{args.rank}")
    bar, progress = iteration_bar(args, "cp-als")

    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.perf_counter()
    # the bar is closed (its line cleared) on errors too, before the one error line
    with bar, logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        options = declared_keywords(args, CP_ALS)
        options.update(checkpoint=checkpoint, callback=progress, out=out, overwrite=True)
        result = cp_als(store, args.rank, **options)
    wall = time.perf_counter() - t0
    # the first iteration of a process also compiles (or loads) the kernels: reported apart
    new, steady, per_it = this_run(result)
    how = "" if args.method == "exact" else f", {args.method} sampling of {args.samples:,} rows"
    if args.nonnegative:
        how += ", nonnegative (HALS" + (f", reg {args.reg:g})" if args.reg else ")")
    print(
        f"CP-ALS rank {args.rank}{how} on {store.path} ({store.nnz:,} {entries}, "
        f"{result.params['execution']} execution "
        f"on {result.params['device']}, "
        f"{'in this process' if result.params.get('scheduler') == 'inline' else 'Dask graph'})"
    )
    print(f"  fit            {result.fit:.6f} after {result.iterations} iterations")
    if not new:
        print_no_iterations(args, wall)
    else:
        print(f"  first iter     {new[0]['seconds']:.3f} s  (includes kernel compilation or cache loading)")
        rate = store.nnz * store.nmodes / max(per_it, 1e-12) / 1e6
        print(
            f"  per iteration  {per_it:.3f} s  steady state ({rate:.1f} "
            f"M {entry}-modes/s; {len(new)} iterations in this run, {wall:.1f} s wall)"
        )
    if new and steady:
        parts = mean_seconds(steady, ("mttkrp_seconds", "update_seconds", "other_seconds"))
        what = "MTTKRP" if args.method == "exact" else "sampled MTTKRP (+ exact for the fit)"
        print(
            f"  of which       {what} {parts['mttkrp_seconds']:.3f} s, updates {parts['update_seconds']:.3f} s, "
            f"scheduling and transfers {parts['other_seconds']:.3f} s"
        )
        if args.method != "exact":
            draw = sum(sum(h.get("sampling_seconds", [])) for h in steady) / len(steady)
            print(f"                 drawing samples {draw:.3f} s")
    print(f"  result         {out}")
    print(f"  checkpoint     {checkpoint}")
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``cpd`` with the CLI's ``add`` (a subparser factory)."""
    d = add(
        "cpd",
        help="CP decomposition (CP-ALS) of a store or a dense array on Dask",
        description="Rank-R CP-ALS of a BLCO store (or a dense Zarr array) as iterated Dask graph "
        "reductions: on an embedded "
        "in-process cluster (dashboard link logged) or on --scheduler. Writes a Zarr "
        "result store and a checkpoint every iteration; --resume continues from it.",
    )
    d.add_argument(
        "store",
        help="input BLCO store (a versioned store folder: its latest version; FOLDER@vN: version N), "
        "or a dense Zarr array of order 3-6 (path or URL)",
    )
    add_declared(d, CP_ALS)
    d.set_defaults(func=cmd_cpd)
