"""MTTKRP task graphs over a dense array: the sparse graph's machinery with dense partitions.

:class:`DenseMTTKRPGraph` is :class:`~tensorflow_ooc.execution.graph.MTTKRPGraph` with its input
hooks replaced: partitions are ranges of whole stored chunks
(:func:`~tensorflow_ooc.execution.dense_tasks.plan_dense_partitions`), in-memory execution holds
them on the workers in the factors' dtype, streaming execution hands each task the array itself
(a Zarr array travels as its path; a NumPy or Dask array is scattered to the cluster once), and
the worker memory plan counts dense chunk buffers
(:func:`~tensorflow_ooc.execution.memory_plan.dense_candidates`). The partition tasks, the tree
reduction and the fused mode updates are the sparse graph's own.
"""

from __future__ import annotations

import math

import numpy as np
from distributed import Client, Future

from ..store.dense import DenseArray, combine_scans
from .dense_tasks import (
    DensePartition,
    load_dense_partition,
    partition_scans,
    plan_dense_partitions,
)
from .graph import MTTKRPGraph
from .inline import is_inline
from .memory_plan import MemoryPlan, dense_candidates


class DenseMTTKRPGraph(MTTKRPGraph):
    """MTTKRP graphs for one dense array (a :class:`~tensorflow_ooc.store.dense.DenseArray`).

    Takes the arguments of :class:`~tensorflow_ooc.execution.graph.MTTKRPGraph`, with the dense
    array in place of the store path; ``max_partition_nnz`` bounds a partition's entries.
    :meth:`scan` makes the validation pass (||X||^2, NaN and Inf) over the same partitions.
    """

    def __init__(self, client: Client, dense: DenseArray, *, dtype: str = "float64", **kwargs) -> None:
        self.dense = dense
        self.dtype = np.dtype(dtype)
        self._ref = None
        super().__init__(client, dense, dtype=dtype, **kwargs)

    def _open(self, path) -> tuple[str, DenseArray]:
        return self.dense.path, self.dense

    def _partitions(self, n_parts: int, max_partition_nnz: int | None) -> list[DensePartition]:
        cap = None if max_partition_nnz is None else max_partition_nnz * self.dtype.itemsize
        return plan_dense_partitions(self.dense, n_parts, self.dtype.itemsize, cap)

    def _source_ref(self):
        """The array as partition tasks receive it: itself for a Zarr array (pickled as its path)
        or in this process; a NumPy or Dask array is scattered once, not sent with every task."""
        if self._ref is None:
            if self.dense.kind == "zarr" or is_inline(self.client):
                self._ref = self.dense
            else:
                self._ref = self.client.scatter(self.dense, broadcast=True, hash=False)
        return self._ref

    def _load(self, part: DensePartition) -> Future:
        return self.client.submit(
            load_dense_partition,
            self._source_ref(),
            part,
            self.dtype.name,
            key=f"tfooc-dense-partition-{self.dense.meta['store_id']}-{self.dtype.name}-{part.id}-of-{len(self.parts)}",
            **self.placement,
        )

    def _streaming_parts(self, itemsize: int) -> list[DensePartition]:
        """One partition per Dask thread, cut at whole chunks."""
        return plan_dense_partitions(self.dense, self.n_parts, itemsize)

    def _single_task_parts(self, execution: str) -> None:
        """Dense arrays plan a task per Dask thread only (their plan has no per-thread outputs to spare)."""
        return None

    def _candidates(
        self, parts: list[DensePartition], per_worker: int, samples: int, owner: bool = False, **common
    ) -> list[MemoryPlan]:
        """The dense memory plans (:func:`~.memory_plan.dense_candidates`) of one execution (dense
        arrays run the task graphs, never owner-computes: ``owner`` is False)."""
        return dense_candidates(
            shape=tuple(self.dense.shape),
            worker_bytes=per_worker * max((p.decoded_bytes() for p in parts), default=0),
            chunk_bytes=math.prod(self.dense.chunk_shape) * common["itemsize"],
            chunk_shape=self.dense.chunk_shape,
            kernel_threads=self.numba_threads,
            **common,
        )

    def scan(self) -> float:
        """||X||^2, checking every entry is finite: one pass over the partitions (their chunks
        already in memory, or streamed one at a time); raises
        :class:`~tensorflow_ooc.errors.NonFiniteValueError` naming the array and the first bad index."""
        futures = [self.client.submit(partition_scans, src, pure=False, **self.placement) for src in self.sources()]
        scans = [s for f in futures for s in f.result()]
        return combine_scans(self.dense, scans)
