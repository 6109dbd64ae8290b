"""``tfooc tucker``: Tucker HOOI of a store."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from ..decompositions.tucker.options import TUCKER_HOOI
from .declared_flags import add_declared, declared_keywords
from .options import (
    iteration_bar,
    mean_seconds,
    print_no_iterations,
    run_outputs,
    this_run,
)

log = logging.getLogger("tensorflow_ooc.cli")


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
        options = declared_keywords(args, TUCKER_HOOI)
        options.update(checkpoint=checkpoint, callback=progress, out=out, overwrite=True, progress=False)
        result = tucker_hooi(store, ranks, **options)
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
    add_declared(t, TUCKER_HOOI)
    t.set_defaults(func=cmd_tucker)
