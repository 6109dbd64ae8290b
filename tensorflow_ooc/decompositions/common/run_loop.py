"""The one run loop of every iterative family: claim the outputs, get a client, start or resume,
iterate, record, test convergence, checkpoint, call back, and write the result.

A family supplies an :class:`IterativeMethod`: its steps, which this loop calls in this order. A
worker lost by an owner-computes run (:class:`~tensorflow_ooc.execution.owner_computes.TeamLost`)
starts the method again on the workers left, from the checkpoint when there is one, else from the
first iteration (the same initial state: the result is the uninterrupted run's).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any, Protocol

from distributed import Client

from ...errors import DecompositionError
from ...execution import get_client
from ...execution.cluster import scheduler_workers
from ...execution.inline import INLINE_MAX_NNZ
from ...execution.owner_computes import TeamLost
from .result_store import claim_run

log = logging.getLogger(__name__)

MAX_RESTARTS = 3


class IterativeMethod(Protocol):
    """A decomposition's steps, as :func:`run_iterations` calls them."""

    name: str  # the API function's name, for messages
    title: str  # the method's name for people ("CP-ALS")
    device: str  # the device the client is asked for
    max_iters: int
    claim_error: type[Exception]  # what a refused output raises
    # optional: claim_inputs, further inputs ({name: path}) the outputs must not overlap

    def start(self, c: Client, cleanup: ExitStack, resume: bool) -> int:
        """Open the graph on ``c`` (releases registered on ``cleanup``) and set the initial state:
        fresh, or the checkpoint's when ``resume``; the first iteration to run (0-based)."""

    def iterate(self, iteration: int) -> dict:
        """Run ``iteration``; its history record (appended to the history, logged)."""

    def converged(self, iteration: int, record: dict) -> bool:
        """Whether the run stops after ``iteration``."""

    def save_checkpoint(self, path: str, iteration: int) -> float:
        """Write the state after ``iteration`` to ``path``; the seconds it took."""

    def finish(self) -> Any:
        """The result, read back from the cluster."""


def inline_when_small(run: Any, nnz: int, device: str) -> None:
    """Run in this process, without Dask, when no client or scheduler is given and the tensor is
    small: Dask's per-task cost would outweigh the kernels (see execution/inline.py)."""
    if run.client is None and run.scheduler is None and device != "gpu" and nnz <= INLINE_MAX_NNZ:
        run.scheduler = "inline"


def checkpoint_due(run: Any, iteration: int, max_iters: int) -> bool:
    """Whether the iteration after ``iteration`` writes the checkpoint unless the run ends first."""
    return bool(run.checkpoint) and ((iteration + 1) % run.checkpoint_every == 0 or iteration + 1 == max_iters)


def ends_or_checkpoints(run: Any, iteration: int, max_iters: int) -> bool:
    """Whether ``iteration`` is the run's last or writes the checkpoint: then no iteration may be
    submitted ahead of it (a checkpoint's rows must be this iteration's)."""
    return iteration + 1 >= max_iters or checkpoint_due(run, iteration, max_iters)


def run_iterations(method: IterativeMethod, store: Any, run: Any) -> Any:
    """Run ``method`` on ``store`` under ``run`` (a :class:`~.options.RunControl`); its result, also
    written to ``run.out`` when given."""
    purpose, inputs = f"{method.name} of {store.path}", getattr(method, "claim_inputs", None)
    claim = claim_run(store, run.out, run.checkpoint, run.overwrite, purpose, inputs, method.claim_error)
    resume = run.resume
    with claim, get_client(run.client, run.scheduler, device=method.device) as c:
        for attempt in range(MAX_RESTARTS + 1):
            try:
                with ExitStack() as cleanup:
                    result = _iterate(method, run, c, cleanup, resume)
                break
            except TeamLost as exc:
                if attempt == MAX_RESTARTS:
                    lost = f"{method.title} lost a worker {attempt + 1} times; giving up ({exc})"
                    raise DecompositionError(lost) from exc
                log.warning(
                    "%s; restarting %s on %d worker(s)",
                    exc,
                    f"from checkpoint {run.checkpoint}" if run.checkpoint else "from the first iteration",
                    len(scheduler_workers(c)),
                )
                resume = bool(run.checkpoint) or resume
    if run.out is not None:
        result.save(run.out, overwrite=run.overwrite)
        log.info("result written to %s", run.out)
    return result


def _iterate(method: IterativeMethod, run: Any, c: Client, cleanup: ExitStack, resume: bool) -> Any:
    start = method.start(c, cleanup, resume)
    for iteration in range(start, method.max_iters):
        record = method.iterate(iteration)
        done = method.converged(iteration, record)
        if run.checkpoint and (done or checkpoint_due(run, iteration, method.max_iters)):
            record["checkpoint_seconds"] = method.save_checkpoint(run.checkpoint, iteration)
        # after the write, so a callback that stops the run (cancel) finds this iteration saved
        if run.callback is not None:
            run.callback(record)
        if done:
            break
    return method.finish()
