"""``tfooc cpd``: CP-ALS of a store or a dense array."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

from .options import (
    _positive_int,
    _seed,
    _tolerance,
    iteration_bar,
    mean_seconds,
    parse_size,
    print_no_iterations,
    run_outputs,
    this_run,
)


def cmd_cpd(args: argparse.Namespace) -> int:

    from ..decompositions import cp_als
    from ..decompositions.common.mttkrp_input import open_input
    from ..execution import DeviceOptions
    from ..store.dense import DenseArray

    store = open_input(args.store)  # a BLCO store or a dense Zarr array
    entries, entry = ("entries", "entry") if isinstance(store, DenseArray) else ("nonzeros", "nonzero")
    out, checkpoint = run_outputs(args, f"cp-r{args.rank}")
    bar, progress = iteration_bar(args, "cp-als")

    from tqdm.contrib.logging import logging_redirect_tqdm

    t0 = time.perf_counter()
    # the bar is closed (its line cleared) on errors too, before the one error line
    with bar, logging_redirect_tqdm(loggers=[logging.getLogger("tensorflow_ooc")]):
        result = cp_als(
            store,
            args.rank,
            scheduler=args.scheduler,
            max_iters=args.max_iters,
            tol=args.tol,
            seed=args.seed,
            dtype=args.dtype,
            checkpoint=checkpoint,
            resume=args.resume,
            callback=progress,
            execution=args.execution,
            out=out,
            overwrite=True,
            device=args.device,
            method=args.method,
            samples=args.samples,
            fit_every=args.fit_every,
            nonnegative=args.nonnegative,
            reg=args.reg,
            device_options=DeviceOptions(
                conflict=args.conflict, streams=args.streams, device_memory_limit=args.device_memory_limit
            ),
        )
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
    d.add_argument("--rank", type=_positive_int, required=True, help="number of components R")
    d.add_argument("--out", help="result store (default STORE.cp-rR.zarr)")
    d.add_argument(
        "--scheduler",
        help="address of an existing Dask scheduler; 'embedded' for the in-process Dask "
        "cluster (dashboard link logged); 'inline' to run in this process without "
        "Dask (default: inline up to 2^24 nonzeros, embedded above)",
    )
    d.add_argument("--max-iters", type=_positive_int, default=50, help="iterations at most (default 50)")
    d.add_argument("--tol", type=_tolerance, default=1e-5, help="stop when the fit changes by less (default 1e-5)")
    d.add_argument("--seed", type=_seed, default=None, help="seed of the random initial factors")
    d.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="factor precision")
    d.add_argument(
        "--execution",
        choices=["auto", "streaming", "in-memory"],
        default="auto",
        help="stream chunks each pass or keep decoded blocks on workers (default: by memory)",
    )
    d.add_argument(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where MTTKRP runs: gpu = GPU workers (LocalCUDACluster when GPUs are visible and "
        "dask-cuda is installed; error if no worker can run GPU kernels), cpu, or auto = GPUs "
        "when the cluster has them (default auto)",
    )
    d.add_argument(
        "--conflict",
        choices=["auto", "hierarchical", "register"],
        default="auto",
        help="GPU conflict resolution (default auto: hierarchical when the target mode is shorter "
        "than the device's SM count)",
    )
    d.add_argument("--streams", type=_positive_int, default=8, help="CUDA streams for GPU streaming (default 8)")
    d.add_argument(
        "--device-memory-limit",
        type=parse_size,
        default=None,
        help="device memory a GPU task may use, e.g. 8GiB (default 80%% of free device memory); "
        "tensors larger than this are streamed in batches",
    )
    d.add_argument(
        "--method",
        choices=["exact", "sts", "arls-lev", "arls-lev-hybrid"],
        default="exact",
        help="least-squares solves: exact (full MTTKRP), or randomized by sampling rows of the "
        "Khatri-Rao product: sts = exact leverage scores (STS-CP), arls-lev = product of the "
        "factors' leverage scores (CP-ARLS-LEV), arls-lev-hybrid = the same with rows of "
        "probability >= 1/SAMPLES taken deterministically (default exact)",
    )
    d.add_argument(
        "--samples",
        type=_positive_int,
        default=65536,
        help="randomized methods: Khatri-Rao rows drawn per mode and iteration (default 65536)",
    )
    d.add_argument(
        "--fit-every",
        type=_positive_int,
        default=None,
        help="randomized methods: evaluate the fit (one exact MTTKRP) every N iterations and at the "
        "last (default 1 up to 2^24 nonzeros, else 5)",
    )
    d.add_argument(
        "--nonnegative",
        action="store_true",
        help="nonnegative CP: every factor >= 0, each mode solved by HALS (hierarchical ALS, "
        "column by column on the normal equations, as TensorLy's non_negative_parafac_hals) "
        "instead of the least-squares solve; method exact only (default off)",
    )
    d.add_argument(
        "--reg",
        type=_tolerance,
        default=0.0,
        help="with --nonnegative: L2 (ridge) regularization REG >= 0 added to the diagonal of each "
        "HALS update's normal equations, shrinking the factors (default 0: none)",
    )
    d.add_argument("--checkpoint", help="checkpoint file (default OUT.checkpoint.npz)")
    d.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    d.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing result at OUT (without it, an existing result is an error)",
    )
    d.set_defaults(func=cmd_cpd)
