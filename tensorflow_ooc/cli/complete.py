"""``tfooc complete``: tensor completion (FastTuckerPlus SGD) of a store."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from ..decompositions.completion.options import TUCKER_SGD
from .declared_flags import add_declared, declared_keywords
from .options import claim


def cmd_complete(args: argparse.Namespace) -> int:
    from ..decompositions import tucker_sgd
    from ..store import open_store, paths
    from ..store.destinations import holding

    store = open_store(paths.resolve_version(args.store))  # a versioned folder: its latest version
    out = args.out or f"{str(args.store).rstrip('/')}.fasttucker-r{args.core_rank}.zarr"
    claim(args, {"--out": out}, {"store": args.store, "--test": args.test})
    if paths.exists(out) and not args.overwrite:
        raise FileExistsError(
            f"{out} holds {holding(out).text}; pass --out NEW to keep it or --overwrite to replace it"
        )
    ranks = args.ranks[0] if len(args.ranks) == 1 else args.ranks
    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.perf_counter()
    with logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        options = declared_keywords(args, TUCKER_SGD)
        fraction = args.test_fraction if args.test is not None or args.test_fraction is not None else 0.1
        options.update(
            test_fraction=None if args.test is not None else fraction,
            progress=args.progress,
            out=out,
            overwrite=args.overwrite,
        )
        result = tucker_sgd(store, ranks, args.core_rank, **options)
    wall = time.perf_counter() - t0
    h = result.history
    steady = h[1:] or h
    print(
        f"FastTuckerPlus completion of {store.path} (ranks {','.join(map(str, result.ranks))}, core rank "
        f"{result.core_rank}; {result.params['n_train']:,} training, {result.params['n_test']:,} test entries)"
    )
    print(
        f"  test RMSE      {result.test_rmse:.6g} (MAE {result.test_mae:.6g}) at epoch {result.best_epoch} "
        f"of {result.epochs}"
    )
    print(
        f"  per epoch      {sum(r['seconds'] for r in steady) / len(steady):.3f} s steady state: factor pass "
        f"{sum(r['factor_seconds'] for r in steady) / len(steady):.3f} s, core pass "
        f"{sum(r['core_seconds'] for r in steady) / len(steady):.3f} s ({wall:.1f} s wall)"
    )
    print(f"  result         {out}")
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``complete`` with the CLI's ``add`` (a subparser factory)."""
    t = add(
        "complete",
        help="tensor completion (FastTuckerPlus SGD) of a store",
        description="Fit a FastTucker model (factors A_n of I_n x J_n, a core that is the Kruskal tensor of "
        "B_n, J_n x R) to the observed entries of STORE by FastTuckerPlus (seed 003, Algorithm 3): "
        "per epoch a factor pass over uniformly drawn batches and a core pass by the accumulated "
        "gradient. The test RMSE and MAE are measured every epoch on a held-out fraction of STORE "
        "or on a separate test store; the model of the best epoch is written to OUT.",
        epilog="Exit status: 0 done, 2 bad input (ranks, rates, a test set that overlaps STORE or lies outside "
        "its shape; nothing is written).",
    )
    t.add_argument(
        "store",
        help="training entries: a BLCO store (path or URL; a versioned store folder: its latest "
        "version, FOLDER@vN: version N)",
    )
    add_declared(t, TUCKER_SGD)
    t.set_defaults(func=cmd_complete)
