"""Partition tasks of exact TT-ALS: a partition's share of a core's least-squares right-hand side
``Y_j``, from its nonzeros decoded in worker memory or streamed from the store, handed up as the
rows of mode ``j`` it touches (:class:`~.partials.Partial`, tree-reduced by :func:`~.tasks.combine`).

A residual task hands up ``[sum (x - t)^2, sum t^2, seconds]`` instead (:func:`add_residuals`
sums them).

A partial's row ``i - lo`` is ``Y_j[:, i, :]`` flattened (``R_{j-1} R_j`` values), so the MTTKRP
graph's reductions (``partition_pass``, ``pass_update``, reduce-scatter) sum it unchanged.
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..format import BitLayout
from ..kernels import WorkItems
from ..kernels.mttkrp.dispatch import numba_threads
from ..kernels.tt.cores import TTCores
from ..kernels.tt.cpu import core_contraction, residual_sums
from ..kernels.tt.specialized import right_slices
from .partials import Partial, worker_threads
from .stream import BATCH_NNZ, read_ahead_pays
from .tasks import PartitionData, cached_store, partition_batches


def _batches(source, batch_nnz: int, threads: int) -> Iterator[tuple[WorkItems, BitLayout]]:
    """The partition's work items: decoded (in-memory execution) or streamed batch by batch."""
    if isinstance(source, PartitionData):
        yield source.items, source.layout
        return
    path, part = source
    store = cached_store(path)
    for items in partition_batches(store, part, batch_nnz, read_ahead_pays(threads * worker_threads())):
        yield items, store.layout


def contraction_partition(
    source: PartitionData | tuple, cores: TTCores, mode: int, threads: int, batch_nnz: int = BATCH_NNZ
) -> Partial:
    """The rows of ``Y_mode`` (see :mod:`~tensorflow_ooc.kernels.tt.cpu`) that this partition's
    nonzeros touch, summed over them, with the task's seconds."""
    t0 = time.perf_counter()
    part = source.part if isinstance(source, PartitionData) else source[1]
    lo, hi = part.row_lo[mode], part.row_hi[mode]
    width = int(cores.ranks[mode] * cores.ranks[mode + 1])
    out = np.zeros((max(0, hi - lo + 1), width))
    right = None
    with numba_threads(threads):
        for items, layout in _batches(source, batch_nnz, threads):
            if right is None:
                right = right_slices(cores, mode)  # once for the batches of a streamed pass
            core_contraction(items, layout, cores, mode, lo, out, right)
    return Partial(lo, out, time.perf_counter() - t0)


def residual_partition(
    source: PartitionData | tuple, cores: TTCores, threads: int, batch_nnz: int = BATCH_NNZ
) -> np.ndarray:
    """``[sum (x - t)^2, sum t^2, seconds]`` over the partition's nonzeros, ``t`` the train's values."""
    t0 = time.perf_counter()
    sums = np.zeros(3)
    with numba_threads(threads):
        for items, layout in _batches(source, batch_nnz, threads):
            sums[:2] += residual_sums(items, layout, cores)
    sums[2] = time.perf_counter() - t0
    return sums


def add_residuals(*parts: np.ndarray) -> np.ndarray:
    """Sum of the partitions' ``[sum (x - t)^2, sum t^2, seconds]`` (seconds: the slowest)."""
    out = np.sum([p[:2] for p in parts], axis=0)
    return np.array([out[0], out[1], max(p[2] for p in parts)])
