"""``tfooc tt``: tensor-train ALS of a store."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from .options import _positive_int, _seed, _tolerance, iteration_bar, mean_seconds, parse_ranks, run_outputs, this_run


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
        result = tt_als(
            store,
            ranks,
            method=args.method,
            samples=args.samples,
            fit_every=args.fit_every,
            scheduler=args.scheduler,
            max_sweeps=args.max_sweeps,
            tol=args.tol,
            seed=args.seed,
            checkpoint=checkpoint,
            resume=args.resume,
            callback=progress,
            execution=args.execution,
            partitions=args.partitions,
            out=out,
            overwrite=True,
        )
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
        print(
            f"  of which       contractions {parts['contraction_seconds']:.3f} s, core updates "
            f"{parts['update_seconds']:.3f} s, scheduling and transfers {parts['other_seconds']:.3f} s"
        )
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
    t.add_argument(
        "--ranks",
        type=parse_ranks,
        required=True,
        help="the N-1 inner TT ranks R_1..R_{N-1}, e.g. 8,8,8 for an order-4 tensor (one value: all of "
        "them); ranks[k] is at most min(I_0*..*I_k, I_{k+1}*..*I_{N-1})",
    )
    t.add_argument(
        "--method",
        choices=["exact", "randomized"],
        default="exact",
        help="exact = each core's least-squares solution from every nonzero; randomized = a "
        "leverage-score sampled solve (seed 000, chapter 5) (default exact)",
    )
    t.add_argument(
        "--samples",
        metavar="J",
        type=_positive_int,
        default=65536,
        help="randomized: design-matrix rows drawn per core update (default 65536)",
    )
    t.add_argument(
        "--fit-every",
        metavar="K",
        type=_positive_int,
        default=None,
        help="randomized: evaluate the fit (a pass over every nonzero) every K sweeps and at the last "
        "(default every sweep up to 2^24 nonzeros, else every 5th)",
    )
    t.add_argument("--out", help="result store (default STORE.tt-R1xR2x...zarr)")
    t.add_argument(
        "--scheduler",
        help="address of an existing Dask scheduler; 'embedded' for the in-process Dask "
        "cluster (dashboard link logged); 'inline' to run in this process without "
        "Dask (default: inline up to 2^24 nonzeros, embedded above)",
    )
    t.add_argument(
        "--sweeps",
        "--max-sweeps",
        dest="max_sweeps",
        metavar="N",
        type=_positive_int,
        default=20,
        help="sweeps at most, each left to right and back (default 20)",
    )
    t.add_argument(
        "--tol",
        type=_tolerance,
        default=1e-5,
        help="stop when a sweep after the first changes the fit by less (default 1e-5)",
    )
    t.add_argument("--seed", type=_seed, default=None, help="seed of the random initial cores (standard normal)")
    t.add_argument(
        "--execution",
        choices=["auto", "streaming", "in-memory"],
        default="auto",
        help="stream chunks each pass or keep decoded partitions on workers (default: by memory)",
    )
    t.add_argument(
        "--partitions", type=_positive_int, default=None, help="partition tasks per pass (default one per Dask thread)"
    )
    t.add_argument("--checkpoint", help="checkpoint file (default OUT.checkpoint.npz)")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing result at OUT (without it, an existing result is an error)",
    )
    t.set_defaults(func=cmd_tt)
