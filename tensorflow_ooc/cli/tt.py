"""``tfooc tt``: tensor-train ALS of a store."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from ..decompositions.tt.options import TT_ALS
from .declared_flags import add_declared, declared_keywords
from .options import iteration_bar, mean_seconds, run_outputs, this_run


def cmd_tt(args: argparse.Namespace) -> int:
    from tqdm.contrib.logging import logging_redirect_tqdm

    from ..decompositions.tt.tt_als import tt_als
    from ..decompositions.tt.tt_steps import check_ranks
    from ..store import open_store, paths

    store = open_store(paths.resolve_version(args.store))  # a versioned folder: its latest version
    ranks = check_ranks(args.ranks[0] if len(args.ranks) == 1 else args.ranks, store.shape)[1:-1]
    out, checkpoint = run_outputs(args, f"tt-{'x'.join(map(str, ranks))}")
    bar, progress = iteration_bar(args, f"tt-als {args.method}", unit="sweep", counter="sweep")

    t0 = time.perf_counter()
    # the bar is closed (its line cleared) on errors too, before the one error line
    with bar, logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        options = declared_keywords(args, TT_ALS)
        options.update(checkpoint=checkpoint, callback=progress, out=out, overwrite=True)
        result = tt_als(store, ranks, **options)
    wall = time.perf_counter() - t0
    new, steady, per_sweep = this_run(result)  # the first sweep also compiles the kernel
    print(
        f"TT-ALS ({args.method}) ranks {'x'.join(map(str, ranks))} on {store.path} ({store.nnz:,} nonzeros, "
        f"{result.params['execution']} execution, "
        f"{'in this process' if result.params.get('scheduler') == 'inline' else 'Dask graph'})"
    )
    print(f"  fit            {result.fit:.6f} after {result.sweeps} sweeps")
    if not new:
        print(
            f"  this run       no sweeps: the checkpoint had already reached --sweeps {args.max_sweeps} "
            f"or converged ({wall:.1f} s wall)"
        )
    else:
        print(f"  first sweep    {new[0]['seconds']:.3f} s  (includes kernel compilation or cache loading)")
        print(f"  per sweep      {per_sweep:.3f} s  steady state ({len(new)} sweeps in this run, {wall:.1f} s wall)")
        parts = mean_seconds(steady, ("contraction_seconds", "update_seconds", "other_seconds"))
        # randomized: the sampled fibers' gathers, and the exact update that ends an evaluated sweep
        what = "contractions" if args.method == "exact" else "fiber gathers (+ exact for the fit)"
        print(
            f"  of which       {what} {parts['contraction_seconds']:.3f} s, core updates "
            f"{parts['update_seconds']:.3f} s, scheduling and transfers {parts['other_seconds']:.3f} s"
        )
        if args.method != "exact":
            draw = sum(sum(h.get("draw_seconds", [])) for h in steady) / len(steady)
            print(f"                 drawing samples {draw:.3f} s")
    print(f"  result         {out}")
    print(f"  checkpoint     {checkpoint}")
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``tt`` with the CLI's ``add`` (a subparser factory)."""
    t = add(
        "tt",
        help="tensor-train decomposition (TT-ALS) of a store on Dask",
        description="Tensor-train decomposition of a BLCO store by alternating least squares: sweeps "
        "left to right and back, each core the exact least-squares solution with the other cores "
        "orthonormal (a contraction of the nonzeros with the left and right core chains, over the "
        "store's partitions, tree-reduced on Dask), then a QR that moves the orthogonality on. "
        "Cores follow TensorLy's convention (R_{k-1}, I_k, R_k). Writes a Zarr result store (read it "
        "with tensorflow_ooc.TTResult.load) and a checkpoint every sweep; --resume continues from it. "
        "With --log-format json each sweep is one JSON line (fit, change, seconds).",
        epilog="Exit status: 0 done, 2 bad input (ranks not N-1 values, below 1 or beyond what the "
        "unfoldings allow, an unreadable store, an existing result without --overwrite/--resume), "
        "1 internal errors.",
    )
    t.add_argument(
        "store",
        help="input BLCO store (path or URL; a versioned store folder: its latest version, FOLDER@vN: version N)",
    )
    add_declared(t, TT_ALS)
    t.set_defaults(func=cmd_tt)
