"""``tfooc complete``: tensor completion (FastTuckerPlus SGD) of a store."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from .options import _finite_float, _fraction, _nonnegative_int, _positive_int, _seed, claim, parse_ranks


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
        training = {
            k: getattr(args, k)
            for k in (
                "lr_factors",
                "lr_core",
                "lr_decay",
                "reg_factors",
                "reg_core",
                "step",
                "rebalance",
                "revive_epochs",
            )
        }
        fraction = args.test_fraction if args.test is not None or args.test_fraction is not None else 0.1
        result = tucker_sgd(
            store,
            ranks,
            args.core_rank,
            test=args.test,
            test_fraction=None if args.test is not None else fraction,
            epochs=args.epochs,
            batch=args.batch,
            seed=args.seed,
            patience=args.patience,
            **training,
            progress=args.progress,
            out=out,
            overwrite=args.overwrite,
            scheduler=args.scheduler,
            device=args.device,
            threads=args.threads,
        )
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
    t.add_argument("--ranks", type=parse_ranks, required=True, help="factor ranks J_n, e.g. 8,8,8 (or one for all)")
    t.add_argument("--core-rank", type=_positive_int, required=True, help="rank R of the Kruskal core")
    tt = t.add_mutually_exclusive_group()
    tt.add_argument("--test", help="test entries: a store of the same shape, disjoint from STORE")
    tt.add_argument(
        "--test-fraction",
        type=_fraction,
        default=None,
        help="hold out this fraction of STORE's entries as the test set (seeded; default 0.1 when --test is not given)",
    )
    t.add_argument("--epochs", type=_positive_int, default=50, help="epochs at most (default 50)")
    t.add_argument("--batch", type=_positive_int, default=64, help="entries per batch of the factor pass (default 64)")
    t.add_argument(
        "--step",
        choices=["normalized", "plain"],
        default="normalized",
        help="factor steps: 'normalized' divides a sample's moves by the squared norm of its gradient "
        "(normalized LMS; default), 'plain' is the seed's rule 14",
    )
    t.add_argument(
        "--lr-factors",
        type=_finite_float,
        default=None,
        help="factor rate: the step fraction in (0, 2) of normalized steps (default 0.3), or the "
        "learning rate of plain steps (default 0.01)",
    )
    t.add_argument("--lr-core", type=_finite_float, default=0.3, help="learning rate of the core (default 0.3)")
    t.add_argument(
        "--lr-decay",
        type=_finite_float,
        default=None,
        help="rates of epoch t divided by 1 + DECAY * t (default 0.05 with normalized steps, 0 with plain)",
    )
    t.add_argument(
        "--no-rebalance",
        dest="rebalance",
        action="store_false",
        help="do not reset the model's gauge after every epoch (orthonormal core-factor rows, columns of "
        "equal scale in every mode; same predictions)",
    )
    t.add_argument(
        "--revive-epochs",
        type=_nonnegative_int,
        default=10,
        help="for this many first epochs, restart a component SGD has lost (strength under 5%% of the "
        "median) as the best rank-1 fit of the training residual; 0: never (default 10)",
    )
    t.add_argument(
        "--reg-factors", type=_finite_float, default=0.001, help="regularization of the factors (default 0.001)"
    )
    t.add_argument("--reg-core", type=_finite_float, default=0.001, help="regularization of the core (default 0.001)")
    t.add_argument(
        "--patience",
        type=_positive_int,
        default=5,
        help="stop when the test RMSE has not improved for this many epochs (default 5)",
    )
    t.add_argument(
        "--seed", type=_seed, default=0, help="seed of the initial model, the batches and the split (default 0)"
    )
    t.add_argument(
        "--threads", type=_positive_int, default=None, help="numba threads per task (1: reproducible; default all)"
    )
    t.add_argument(
        "--device", choices=["cpu", "gpu", "auto"], default="cpu", help="where the kernels run (default cpu)"
    )
    t.add_argument(
        "--scheduler",
        help="address of a Dask scheduler, 'embedded' or 'inline' (default: inline up to 2^24 entries, embedded above)",
    )
    t.add_argument("--out", help="result store (default STORE.fasttucker-rR.zarr)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing result at OUT")
    t.set_defaults(func=cmd_complete)
