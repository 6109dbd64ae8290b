"""The CLI's shared option types, exit codes, error-line parser, result paths and progress bar."""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
from pathlib import Path

# counts (rank, iterations, samples) stop where the API's do; the memory plan judges what fits
from ..limits import MAX_COUNT

log = logging.getLogger("tensorflow_ooc.cli")

DEFAULT_STORAGE = Path(os.environ.get("TFOOC_STORAGE", "storage"))
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of our output went away (tfooc status | head -1)


# --scheduler values that are no address: this process, or clusters this process starts
LOCAL_SCHEDULERS = ("inline", "embedded", "gpu")
# the arguments of any command that name a store, result or checkpoint
PATH_ARGUMENTS = ("store", "out", "checkpoint", "test", "input")


def paths_for_workers(args: argparse.Namespace) -> None:
    """With ``--scheduler`` naming a cluster's address, the command's relative local paths become
    absolute here: they are sent to workers, which run in working directories of their own (on
    other machines, in other folders). URLs (``s3://...``) are left as they are."""
    scheduler = getattr(args, "scheduler", None)
    if not scheduler or scheduler in LOCAL_SCHEDULERS:
        return
    from ..store import paths  # the store package loads Zarr and numba: only for a remote cluster

    for name in PATH_ARGUMENTS:
        value = getattr(args, name, None)
        if isinstance(value, (str, os.PathLike)) and str(value) and not paths.is_url(value):
            setattr(args, name, os.path.abspath(paths.local_path(value)))


def parse_size(text: str) -> int:
    """'512MB', '2GiB', '1000000' -> bytes: the sizes specs take (:func:`~..workflow.step_models.parse_size`)."""
    from ..workflow.step_models import parse_size as size_of  # pydantic and yaml load only when a size is given

    try:
        return size_of(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512MB, 2GiB, 1000000)") from None


def _positive_ints(text: str, refusal: str, example: str, rule: str) -> tuple[int, ...]:
    """'8,8,8', '183x24' or '8' -> positive integers; ``refusal`` starts the error message."""
    try:
        values = tuple(int(s) for s in re.split(r"[x,\s]+", text.strip()) if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{refusal}: {text!r} (example: {example})") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{refusal}: {text!r}: {rule}")
    return values


def parse_shape(text: str) -> tuple[int, ...]:
    return _positive_ints(text, "not a shape", "183,24,1140,1717", "mode lengths must be >= 1")


def parse_skew(text: str) -> float | tuple[float, ...]:
    vals = tuple(float(s) for s in text.split(","))
    return vals[0] if len(vals) == 1 else vals


def _count(text: str, low: int) -> int:
    """An integer >= ``low`` written as '16', '1e3' or '1_000'; NaN, infinities and fractions are
    refused here, at parse time, rather than truncated or passed on."""
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        v = int(f)
    if v < low or v > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be an integer in [{low}, 2^62], got {text}")
    return v


def _positive_int(text: str) -> int:
    return _count(text, 1)


def _nonnegative_int(text: str) -> int:
    return _count(text, 0)


def _seed(text: str) -> int:
    """A random seed (``--seed``): an integer >= 0, as NumPy's generators take; a negative one is
    refused here, where argparse names the option, rather than by NumPy without it."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return v


def _tolerance(text: str) -> float:
    """A finite number >= 0 (``--tol``): NaN, infinities and negative numbers are refused."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def _finite_float(text: str) -> float:
    """A finite number (rates, regularization): NaN and infinities are refused at parse time."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return v


def _fraction(text: str) -> float:
    """A number strictly between 0 and 1 (``--test-fraction``)."""
    v = _finite_float(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return v


def claim(args: argparse.Namespace, outputs: dict, inputs: dict) -> None:
    """Claim a command's ``outputs`` (flag -> path) for as long as it runs: refused when one is,
    contains or lies inside one of ``inputs`` (name -> path) or holds something this package did
    not write; then locked against a second writer until the command ends (``args.cleanup``, the
    command's exit stack, set by :func:`tensorflow_ooc.cli.main`)."""
    from ..store.output_claim import claim_outputs, refuse_unsafe

    cleanup = getattr(args, "cleanup", None)
    if cleanup is None:
        refuse_unsafe(outputs, inputs)  # called as a function: the API takes the locks
    else:
        what = getattr(args, "store", None) or getattr(args, "input", None)
        cleanup.enter_context(claim_outputs(outputs, inputs, f"tfooc {args.command} on {what}"))


def run_outputs(args: argparse.Namespace, tag: str) -> tuple[str, str]:
    """The result store and checkpoint paths of a decomposition command (``--out``, default
    ``STORE.<tag>.zarr``; ``--checkpoint``, default beside it), claimed for the command: refused
    when one is, contains or lies inside the input or holds something this package did not write,
    locked against a second writer (released when the command ends), and refused when it holds
    an earlier result without ``--overwrite`` or ``--resume``; a fresh ``--overwrite`` run drops
    the old checkpoint so it never resumes from the old run's state."""
    from ..store import paths
    from ..store.destinations import holding

    out = args.out or f"{str(args.store).rstrip('/')}.{tag}.zarr"
    checkpoint = args.checkpoint or f"{out}.checkpoint.npz"
    claim(args, {"--out": out, "--checkpoint": checkpoint}, {"store": args.store})
    if paths.exists(out) and not (args.overwrite or args.resume):
        # an earlier result and its checkpoint would be replaced without a word: refuse, as
        # cp_als(out=...) does, and say how to go on
        raise FileExistsError(
            f"{out} holds {holding(out).text}; pass --out NEW to keep it, --overwrite "
            f"to replace it, or --resume to continue from its checkpoint"
        )
    if args.resume and not paths.exists(checkpoint):
        raise FileNotFoundError(
            f"--resume: there is no checkpoint at {checkpoint} to continue from; run without "
            f"--resume to start afresh, or give --checkpoint PATH"
        )
    if paths.exists(checkpoint) and not (args.overwrite or args.resume):
        # a run that stopped before writing its result left this: starting afresh would replace it
        raise FileExistsError(
            f"{checkpoint} holds {holding(checkpoint).text}, left by an earlier run that did not "
            f"finish; pass --resume to continue it, or --overwrite to start over and replace it"
        )
    if args.overwrite and not args.resume and paths.exists(checkpoint):
        paths.remove(checkpoint)  # this package's checkpoint (checked above), under this command's lock
    return out, checkpoint


def this_run(result) -> tuple[list[dict], list[dict], float]:
    """A decomposition's history records of this run (a resumed run's earlier ones left out),
    those of its steady state (the first iteration also compiles kernels), and the mean seconds
    per steady iteration."""
    new = result.history[result.params.get("resumed_after", 0) :]
    steady = new[1:] or new
    return new, steady, sum(h["seconds"] for h in steady) / max(1, len(steady))


def mean_seconds(steady: list[dict], keys: tuple[str, ...]) -> dict[str, float]:
    """Per key, the mean over ``steady`` records of its seconds (summed over modes when a list)."""
    return {k: sum(sum(h[k]) if isinstance(h[k], list) else h[k] for h in steady) / len(steady) for k in keys}


def print_no_iterations(args: argparse.Namespace, wall: float) -> None:
    """A resumed run with nothing left to do: no time per iteration, no throughput to report."""
    print(
        f"  this run       no iterations: the checkpoint had already reached --max-iters "
        f"{args.max_iters} or converged ({wall:.1f} s wall)"
    )


def iteration_bar(args: argparse.Namespace, desc: str, unit: str = "it", counter: str = "iteration"):
    """A progress bar over ``--max-iters`` iterations (``unit="sweep"``: ``--max-sweeps`` sweeps)
    and the callback that moves it to each history record's ``counter`` (fit, change, seconds per
    iteration or sweep)."""
    from tqdm.auto import tqdm

    total = args.max_sweeps if unit == "sweep" else args.max_iters
    bar = tqdm(total=total, desc=desc, unit=unit, disable=not args.progress, leave=False)

    def progress(record: dict) -> None:
        bar.n = record[counter]
        seconds = {f"s_per_{unit}": f"{record['seconds']:.3f}"}
        if "fit" not in record:  # a randomized sweep whose fit was not evaluated
            bar.set_postfix(fit="not evaluated", **seconds)
            return
        bar.set_postfix(fit=f"{record['fit']:.6f}", dfit=f"{record['fit_change']:.1e}", **seconds)

    return bar, progress


def parse_ranks(text: str) -> tuple[int, ...]:
    """'8,8,8' or '8' -> factor ranks."""
    return _positive_ints(text, "not ranks", "8,8,8", "every rank must be >= 1")


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one error line: ``tfooc: error: cpd: argument --tol: ...`` and a
    pointer to ``--help`` (exit 2), the same form every other bad input gets."""

    def error(self, message: str):
        command = self.prog.removeprefix("tfooc").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_BAD_INPUT, f"tfooc: error: {where}{message} (see '{self.prog} --help')\n")
