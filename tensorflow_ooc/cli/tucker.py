"""``tfooc tucker``: Tucker HOOI of a store."""

from __future__ import annotations

import argparse
import logging
import re
import time
from typing import Callable

from .options import (
    LazyChoices,
    _positive_int,
    _seed,
    _tolerance,
    iteration_bar,
    mean_seconds,
    print_no_iterations,
    run_outputs,
    this_run,
)

log = logging.getLogger("tensorflow_ooc.cli")


def parse_ranks(text: str) -> tuple[int, ...]:
    """'8,8,8' or '8x8x8' (one rank per mode) or '8' (every mode)."""
    try:
        ranks = tuple(int(s) for s in re.split(r"[x,\s]+", text.strip()) if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ranks: {text!r} (examples: 8,8,8 or 8 for every mode)") from None
    if not ranks:
        raise argparse.ArgumentTypeError(f"not ranks: {text!r} (examples: 8,8,8 or 8 for every mode)")
    return ranks


def cmd_tucker(args: argparse.Namespace) -> int:
    from tqdm.contrib.logging import logging_redirect_tqdm

    from ..decompositions.tucker.tucker_hooi import check_ranks, tucker_hooi
    from ..store import open_store, paths

    store = open_store(paths.resolve_version(args.store))  # a versioned folder: its latest version
    ranks = check_ranks(args.ranks[0] if len(args.ranks) == 1 else args.ranks, store.shape)
    out, checkpoint = run_outputs(args, f"tucker-{'x'.join(map(str, ranks))}")
    bar, progress = iteration_bar(args, "tucker-hooi")

    t0 = time.perf_counter()
    # the bar is closed (its line cleared) on errors too, before the one error line
    with bar, logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        result = tucker_hooi(
            store,
            ranks,
            scheduler=args.scheduler,
            max_iters=args.max_iters,
            tol=args.tol,
            init=args.init,
            seed=args.seed,
            svd=args.svd,
            kernel=args.kernel,
            checkpoint=checkpoint,
            resume=args.resume,
            callback=progress,
            execution=args.execution,
            partitions=args.partitions,
            device=args.device,
            out=out,
            overwrite=True,
            progress=False,
        )
    wall = time.perf_counter() - t0
    new, steady, per_it = this_run(result)  # the first iteration also compiles kernels and sorts layouts
    print(
        f"Tucker HOOI ranks {'x'.join(map(str, ranks))} on {store.path} ({store.nnz:,} nonzeros, "
        f"{result.params['execution']} execution on {result.params['device']}, "
        f"{'in this process' if result.params.get('scheduler') == 'inline' else 'Dask graph'})"
    )
    print(f"  fit            {result.fit:.6f} after {result.iterations} iterations")
    if not new:
        print_no_iterations(args, wall)
    else:
        print(f"  first iter     {new[0]['seconds']:.3f} s  (includes kernel compilation and layout sorting)")
        print(f"  per iteration  {per_it:.3f} s  steady state ({len(new)} iterations in this run, {wall:.1f} s wall)")
    if new and steady:
        parts = mean_seconds(steady, ("ttm_seconds", "svd_seconds", "other_seconds"))
        print(
            f"  of which       TTM chains {parts['ttm_seconds']:.3f} s, SVDs {parts['svd_seconds']:.3f} s "
            f"({', '.join(sorted(set(steady[-1]['svd_methods'])))}), scheduling and transfers "
            f"{parts['other_seconds']:.3f} s"
        )
    print(f"  result         {out}")
    print(f"  checkpoint     {checkpoint}")
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``tucker`` with the CLI's ``add`` (a subparser factory)."""
    t = add(
        "tucker",
        help="Tucker decomposition (HOOI) of a store on Dask",
        description="Tucker decomposition of a BLCO store by higher-order orthogonal iteration (pyttb's "
        "tucker_als): per mode, a semi-sparse TTM chain over the store's partitions (tree-reduced "
        "on Dask) and the leading left singular vectors of its unfolding; the core from the last "
        "mode, the fit from ||X||^2 - ||G||^2. Writes a Zarr result store (read it with "
        "tensorflow_ooc.decompositions.load_tucker) and a checkpoint every iteration; --resume "
        "continues from it.",
        epilog="Exit status: 0 done, 2 bad input (ranks not one per mode or outside 1..mode length, an "
        "unreadable store, an existing result without --overwrite/--resume), 1 internal errors.",
    )
    t.add_argument(
        "store",
        help="input BLCO store (path or URL; a versioned store folder: its latest version, FOLDER@vN: version N)",
    )
    t.add_argument(
        "--ranks",
        type=parse_ranks,
        required=True,
        help="core size per mode, e.g. 8,8,8 (one value: every mode); each in 1..mode length",
    )
    t.add_argument("--out", help="result store (default STORE.tucker-J1xJ2x...zarr)")
    t.add_argument(
        "--scheduler",
        help="address of an existing Dask scheduler; 'embedded' for the in-process Dask "
        "cluster (dashboard link logged); 'inline' to run in this process without "
        "Dask (default: inline up to 2^24 nonzeros, embedded above)",
    )
    t.add_argument(
        "--max-iters",
        "--iters",
        dest="max_iters",
        type=_positive_int,
        default=50,
        help="iterations at most (default 50)",
    )
    t.add_argument(
        "--tol",
        type=_tolerance,
        default=1e-4,
        help="stop when the fit changes by less, the first iteration included, as pyttb (default 1e-4)",
    )
    t.add_argument(
        "--init",
        choices=["random", "nvecs"],
        default="random",
        help="initial factors as pyttb: random = uniform [0, 1); nvecs = leading eigenvectors of "
        "X_(n) X_(n)^T (reads the nonzeros into memory) (default random)",
    )
    t.add_argument("--seed", type=_seed, default=None, help="seed of the random initial factors and randomized SVDs")
    t.add_argument(
        "--svd",
        choices=["auto", "gram", "randomized"],
        default="auto",
        help="leading singular vectors by the Gram matrix's eigendecomposition or a randomized range "
        "finder (default auto: gram when the smaller side of the non-empty unfolding is <= 2048)",
    )
    t.add_argument(
        "--kernel",
        # the kernel module (numba) loads only when --kernel is given or tucker's help is shown
        choices=LazyChoices("tensorflow_ooc.kernels.ttm.select", "KERNELS"),
        metavar="KERNEL",  # argparse lists choices in the usage line while building the parser
        default=None,
        help="TTM kernel for every mode: %(choices)s (default: the decision tree's choice per mode)",
    )
    t.add_argument(
        "--device",
        choices=["cpu", "gpu", "auto"],
        default="cpu",
        help="where partition tasks run: gpu = GPU workers, whose sparse TTMs run on the device "
        "(LocalCUDACluster when GPUs are visible and dask-cuda is installed); auto = GPUs when the "
        "cluster has them (default cpu)",
    )
    t.add_argument(
        "--execution",
        choices=["auto", "streaming", "in-memory"],
        default="auto",
        help="stream chunks each pass or keep decoded partitions on workers (default: by memory)",
    )
    t.add_argument(
        "--partitions", type=_positive_int, default=None, help="partition tasks per mode (default one per Dask thread)"
    )
    t.add_argument("--checkpoint", help="checkpoint file (default OUT.checkpoint.npz)")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing result at OUT (without it, an existing result is an error)",
    )
    t.set_defaults(func=cmd_tucker)
