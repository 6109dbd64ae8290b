"""Sampled MTTKRP of every in-memory partition of one worker, in one task.

A sketched update's gathers are short (tens of milliseconds a partition at ``J = 2^16``) and run
on one numba thread each (:func:`~tensorflow_ooc.decompositions.tt.tt_randomized.sketch_threads`:
a parallel loop of sub-millisecond steps waits on its slowest thread). As partition tasks on a
worker of one Dask thread they ran one after another, the worker's other cores idle, each task
paying the scheduler's round trips. Here one task gathers all of the worker's partitions, one
Python thread each (the kernels release the GIL): the partials are those of the partition tasks,
bit for bit, whatever the thread count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .partials import Partial
from .tasks import PartitionData, partition_fiber_index, sampled_partition


def gather_partitions(
    datas: Sequence[PartitionData],
    samples: Any,
    mode: int,
    threads: int,
    gather_threads: int | None,
    beside: Callable[[], Any] | None = None,
) -> tuple[list[Partial], Any]:
    """The mode-``mode`` sampled MTTKRP of ``samples`` on each decoded partition, in their order.

    Parameters
    ----------
    datas : sequence of PartitionData
        The worker's decoded partitions (each keeps its fiber indexes between calls).
    samples : SampleSet
        The drawn design rows (:class:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet`).
    mode : int
        The target mode.
    threads : int
        The cores the task may use: partitions gathered at once, when each gathers on one thread.
    gather_threads : int or None
        Numba threads of one partition's gather; above 1 the partitions are gathered in turn.
    beside : callable, optional
        Work of the calling thread while the partitions are gathered (the sketched Gram, which
        depends on the draws only); after the gathers where they run in turn.

    Returns
    -------
    list of Partial
        One a partition, as :func:`~tensorflow_ooc.execution.tasks.sampled_partition` gives it.
    object
        What ``beside`` returned (None without it).
    """
    at_once = min(max(1, int(threads)), len(datas)) if gather_threads == 1 else 1
    if at_once <= 1:
        parts = [sampled_partition(d, samples, mode, threads=gather_threads) for d in datas]
        return parts, None if beside is None else beside()
    # indexes missing (a mode's first update) are built one at a time, on every thread: built at
    # once, their sort buffers (about 70 bytes a nonzero) took a 77 M-nonzero worker over Dask's
    # spill threshold, which spilled the partitions and dropped the indexes kept beside them
    t0 = time.perf_counter()
    for d in datas:
        partition_fiber_index(d, mode, threads)
    built = time.perf_counter() - t0
    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="tfooc-gather") as pool:
        gathers = pool.map(lambda d: sampled_partition(d, samples, mode, threads=1), datas)
        # on the calling thread meanwhile: it takes a core from the gathers for a few milliseconds,
        # and gives it back before the slower of two unequal partitions ends
        done = None if beside is None else beside()
        parts = list(gathers)
    for p in parts:  # the builds preceded every gather: part of each one's time, as in its own task
        p.seconds += built
    return parts, done
