"""Admission of submitted runs to a cluster: which workers may take a run, and whether it fits one.

A submitted run's driver is one Dask task (:mod:`.submit`). Small decompositions run inside it,
in its worker's process, and a worker that runs two drivers at once holds two models in one
memory limit. So a run with a decompose step asks for one unit of the worker resource
:data:`~tensorflow_ooc.limits.SLOT_RESOURCE` (``tfooc-slot``): a worker started with
``--resources tfooc-slot=1`` runs one such run at a time, and the others wait on the scheduler,
their records ``queued``, until a slot is free. Dask resources belong to a task from its start to
its end, so the driver holds its slot for the whole run, not for the decompose step alone.

Workers that declare no slot at all (a cluster started before slots existed) still take runs as
before, with a warning: the scheduler cannot queue what nothing limits.

Before a run is submitted, :func:`check_fits` compares each decompose step whose input store
exists with the workers' memory limits: if even the leanest execution of the worker memory plan
(:mod:`tensorflow_ooc.execution.memory_plan`) needs more than the largest limit allows, the run
is refused with both figures (a :class:`~.errors.SpecError`, exit 2), rather than failing on the
worker later. An input that a step of the run writes is checked by the driver when that step
starts (the memory plan then names the same figures).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..execution.cluster import scheduler_workers
from ..limits import SLOT_RESOURCE
from .errors import Problem, SpecError
from .plan import Workflow

log = logging.getLogger("tensorflow_ooc.workflow")

# decompositions whose worker memory plan is CP-ALS's (exact and randomized)
CP_METHODS = ("exact", "cp", "sts", "arls-lev", "arls-lev-hybrid")


@dataclass
class Admission:
    """Where a run may go: the ``client.submit`` keywords and the workers that qualify.

    Attributes
    ----------
    submit_kwargs : dict
        ``{"resources": {"tfooc-slot": 1}}``, or empty when no worker declares slots.
    workers : dict
        The workers that may run the driver (address -> the scheduler's worker info).
    warning : str or None
        Why runs are not queued per worker on this cluster, when they are not.
    """

    submit_kwargs: dict
    workers: dict
    warning: str | None = None


def needs_slot(workflow: Workflow) -> bool:
    """Whether a run of ``workflow`` holds a worker slot: it has a decompose step."""
    return any(st.kind == "decompose" for st in workflow.steps)


def admission(client: Any, workflow: Workflow) -> Admission:
    """The placement of ``workflow``'s driver on ``client``'s cluster.

    Parameters
    ----------
    client : distributed.Client
        Connected to the scheduler the run is submitted to.
    workflow : Workflow
        The validated spec.

    Returns
    -------
    Admission
    """
    workers = scheduler_workers(client)
    if not needs_slot(workflow):
        return Admission({}, workers)
    slotted = {a: w for a, w in workers.items() if (w.get("resources") or {}).get(SLOT_RESOURCE)}
    if slotted:
        return Admission({"resources": {SLOT_RESOURCE: 1}}, slotted)
    warning = (
        f"no worker of this cluster declares the {SLOT_RESOURCE} resource: concurrent runs are not queued "
        f"and may decompose side by side in one worker's memory; start workers with "
        f"'dask worker ... --resources {SLOT_RESOURCE}=1' (one run at a time each)"
    )
    return Admission({}, workers, warning)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def check_fits(workflow: Workflow, workers: dict) -> None:
    """Refuse ``workflow`` when a decompose step cannot fit any of ``workers``.

    For each CP decompose step whose input store exists now, the leanest execution of the worker
    memory plan (streamed, in-place updates, small batches, one task on one worker: a lower
    bound of what any execution needs) is computed with the smallest resident memory the
    workers report as its baseline, and compared with the largest memory limit among
    ``workers`` (its usable fraction: below Dask's spill, pause and terminate thresholds).

    Parameters
    ----------
    workflow : Workflow
        The validated spec.
    workers : dict
        Address -> the scheduler's worker info (``memory_limit``, ``metrics``).

    Raises
    ------
    SpecError
        Naming the step's ``rank`` line, the memory its leanest execution needs and the
        largest worker limit. Nothing was submitted.
    """
    from ..execution.memory_plan import candidates
    from ..store import open_store

    limits = [int(w.get("memory_limit") or 0) for w in workers.values()]
    if not limits or not all(limits):  # a worker without a limit fits anything
        return
    largest = max(limits)
    baseline = min(int((w.get("metrics") or {}).get("memory") or 0) for w in workers.values())
    problems = []
    for st in workflow.steps:
        m = st.model
        rank = getattr(m, "rank", None)
        if st.kind != "decompose" or not isinstance(rank, int) or getattr(m, "method", "exact") not in CP_METHODS:
            continue
        if getattr(m, "device", None) == "gpu":  # the device's memory plan is the GPU's own
            continue
        try:
            store = open_store(st.inputs["input"])
        except Exception:  # written by an earlier step, or not a sparse store: checked when it runs
            continue
        itemsize = 4 if getattr(m, "dtype", "float64") == "float32" else 8
        plans = candidates(
            shape=tuple(store.shape),
            rank=rank,
            itemsize=itemsize,
            worker_nnz=store.nnz,
            chunk_nnz=store.chunk_nnz,
            tasks=1,
            partitions_per_mode=1,
            workers=1,
            baseline=baseline,
            limit=largest,
            value_itemsize=store.value_dtype.itemsize,
            execution="streaming",
        )
        floor = min(plans, key=lambda p: p.peak)
        if floor.fits:
            continue
        big = sorted(((v, k) for k, v in floor.terms.items() if v >= 1 << 19), reverse=True)  # >= 0.5 MiB
        terms = ", ".join(f"{k} {_mib(v)}" for v, k in big)
        problems.append(
            Problem(
                workflow.source.line(("steps", st.name, "rank")),
                f"steps.{st.name}.rank",
                f"a rank-{rank} CP-ALS of {st.inputs['input']} ({store.nnz:,} nonzeros, shape "
                f"{'x'.join(map(str, store.shape))}) needs a worker memory limit of at least "
                f"{_mib(floor.required_limit)} (its leanest execution peaks at {_mib(floor.peak)}: {terms}; "
                f"usable {floor.usable_fraction:.0%} of a limit), but the largest worker limit is "
                f"{_mib(largest)}: nothing was submitted; start workers with a larger --memory-limit, or "
                "lower the rank",
            )
        )
    if problems:
        # a rank set by --set is named by the option: the file's line holds another value
        raise SpecError(workflow.path, workflow.source.annotate(problems))


__all__ = ["Admission", "admission", "check_fits", "needs_slot"]
