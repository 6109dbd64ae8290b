"""Dense partitions: whole stored chunks of a dense array, and the worker functions over them.

A dense partition is a contiguous range of chunks (C order over the chunk grid). Its MTTKRP task
runs the dense kernel (:func:`tensorflow_ooc.kernels.dense.cpu.dense_mttkrp`, the TILE variant
inside each chunk) on one chunk at a time, adding into a partial that covers only the target-mode
rows the partition spans; partials are tree-reduced exactly as sparse ones are
(:func:`~tensorflow_ooc.execution.tasks.combine`). Streamed, a task holds at most two chunks (the
one computed on and the one read ahead); in memory, its chunks stay on the worker, already cast
to the factors' dtype. The validation pass (sum of squares, NaN and Inf) goes over the same
partitions, fused with the load in memory.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..kernels import StackedFactors
from ..kernels.mttkrp.dispatch import numba_threads, threads_for
from ..store.dense import ChunkScan, DenseArray, scan_chunk
from .partials import Partial, to_host, worker_threads
from .stream import read_ahead_pays


@dataclass(frozen=True)
class DensePartition:
    """Chunks ``[chunk_lo, chunk_hi)`` of a dense array and the rows they span in every mode
    (the attributes :class:`~tensorflow_ooc.execution.partitions.Partition` has, so the graph
    treats both alike)."""

    id: int
    chunk_lo: int
    chunk_hi: int
    nnz: int  # entries
    row_lo: tuple[int, ...]
    row_hi: tuple[int, ...]  # inclusive
    itemsize: int = 8  # bytes per entry once loaded (the factors' dtype)

    def decoded_bytes(self, nmodes: int = 0) -> int:
        """Memory of the partition's chunks held on a worker (in-memory execution)."""
        return self.nnz * self.itemsize


def plan_dense_partitions(
    dense: DenseArray, n_parts: int, itemsize: int = 8, max_bytes: int | None = None
) -> list[DensePartition]:
    """Cut the chunk grid into about ``n_parts`` contiguous ranges of whole chunks (more where a
    range would hold more than ``max_bytes``)."""
    nchunks = dense.nchunks
    if max_bytes:
        n_parts = max(n_parts, -(-dense.nnz * itemsize // max(max_bytes, dense.chunk_bytes)))
    n_parts = max(1, min(n_parts, nchunks))
    cuts = np.unique((np.arange(n_parts + 1) * nchunks) // n_parts).tolist()
    N = dense.nmodes
    boxes = [dense.chunk_box(c) for c in range(nchunks)]
    parts = []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        lo = tuple(min(boxes[c][0][m] for c in range(a, b)) for m in range(N))
        hi = tuple(max(boxes[c][0][m] + boxes[c][1][m] for c in range(a, b)) - 1 for m in range(N))
        nnz = sum(int(np.prod(boxes[c][1])) for c in range(a, b))
        parts.append(DensePartition(i, a, b, nnz, lo, hi, itemsize))
    return parts


@dataclass
class DensePartitionData:
    """A dense partition's chunks held in worker memory: (origin, block) pairs in the factors'
    dtype, and the validation scans made while loading them."""

    part: DensePartition
    blocks: list[tuple[tuple[int, ...], np.ndarray]]
    scans: list[ChunkScan] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for _, b in self.blocks))


def _as_kernel_block(block: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The block in the factors' dtype, C- or F-ordered (the kernel reads either)."""
    if block.dtype == dtype and (block.flags.c_contiguous or block.flags.f_contiguous):
        return block
    return np.asarray(block, dtype=dtype, order="F" if block.flags.f_contiguous else "C")


def load_dense_partition(dense: DenseArray, part: DensePartition, dtype: str = "float64") -> DensePartitionData:
    """Read a partition's chunks into worker memory (in-memory execution), scanning each as it
    comes (the validation pass, fused with the load)."""
    dt = np.dtype(dtype)
    blocks, scans = [], []
    for c in range(part.chunk_lo, part.chunk_hi):
        raw = dense.read_chunk(c)
        scans.append(scan_chunk(dense, c, raw))
        blocks.append((dense.chunk_box(c)[0], _as_kernel_block(raw, dt)))
    return DensePartitionData(part, blocks, scans)


def partition_scans(source: DensePartitionData | tuple[DenseArray, DensePartition]) -> list[ChunkScan]:
    """The validation pass of one partition: those made at load, or read and scan chunk by chunk."""
    if isinstance(source, DensePartitionData):
        return source.scans
    dense, part = source
    buffer = None
    scans = []
    for c in range(part.chunk_lo, part.chunk_hi):
        block = dense.map_chunk(c)
        if block is None:
            if buffer is None:
                buffer = np.empty(math.prod(dense.chunk_shape), dtype=dense.dtype)
            block = dense.read_chunk(c, buffer)
        scans.append(scan_chunk(dense, c, block))
    return scans


def _streamed_blocks(
    dense: DenseArray, part: DensePartition, dtype: np.dtype, read_ahead: bool
) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """The partition's chunks one at a time: mapped from their files where they are raw
    (:meth:`DenseArray.map_chunk`, no copy), otherwise decoded into reused buffers (two with
    read-ahead: the next chunk is read and decompressed in a background thread while the caller
    computes on the current one); a block stays valid until the caller asks for the next but one."""
    chunks = range(part.chunk_lo, part.chunk_hi)
    ahead = read_ahead and len(chunks) > 1
    n = math.prod(dense.chunk_shape)
    buffers: list[np.ndarray] = []

    def read(i: int) -> tuple[tuple[int, ...], np.ndarray]:
        c = chunks[i]
        block = dense.map_chunk(c)
        if block is None:
            while len(buffers) < (2 if ahead else 1):  # allocated only if a chunk needs reading
                buffers.append(np.empty(n, dtype=dense.dtype))
            block = dense.read_chunk(c, buffers[i % len(buffers)])
        return dense.chunk_box(c)[0], _as_kernel_block(block, dtype)

    if not ahead:
        for i in range(len(chunks)):
            yield read(i)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfooc-dense-read-ahead") as pool:
        pending = pool.submit(read, 0)
        for i in range(1, len(chunks)):
            current = pending.result()
            # buffer i % 2 was last used by chunk i - 2: the caller is done with it
            pending = pool.submit(read, i)
            yield current
        yield pending.result()


def dense_mttkrp_partition(
    source: DensePartitionData | tuple[DenseArray, DensePartition],
    factors: StackedFactors,
    mode: int,
    threads: int = 1,
    read_ahead: bool | None = None,
    device: str = "cpu",
    device_options: object | None = None,
) -> Partial:
    """Mode-``mode`` MTTKRP of one dense partition: the dense kernel on each of its chunks (held
    in memory, or streamed from the array), summed into the partition's rows of the mode; with
    ``device="gpu"`` the GPU kernel (:func:`tensorflow_ooc.kernels.dense.gpu.dense_mttkrp_gpu`)."""
    t0 = time.perf_counter()
    part = source.part if isinstance(source, DensePartitionData) else source[1]
    lo, hi = part.row_lo[mode], part.row_hi[mode]
    dtype = np.dtype(factors.dtype)
    out = np.zeros((hi - lo + 1, factors.rank), dtype=dtype)
    if isinstance(source, DensePartitionData):
        blocks: Iterator = iter(source.blocks)
    else:
        if read_ahead is None:
            read_ahead = read_ahead_pays(threads * worker_threads())
        blocks = _streamed_blocks(source[0], part, dtype, read_ahead)
    views = factors.views
    if device == "gpu":
        from ..kernels.dense.gpu import dense_mttkrp_gpu

        for origin, block in blocks:
            o = origin[mode] - lo
            out[o : o + block.shape[mode]] += to_host(dense_mttkrp_gpu(block, views, mode, origin=origin))
        return Partial(lo, out, time.perf_counter() - t0)
    from ..kernels.dense.cpu import dense_mttkrp

    for origin, block in blocks:
        o = origin[mode] - lo
        # a small chunk runs on fewer threads: a parallel region costs more than it saves
        with numba_threads(threads_for(threads, block.size)):
            dense_mttkrp(block, views, mode, origin=origin, out=out[o : o + block.shape[mode]])
    return Partial(lo, out, time.perf_counter() - t0)
