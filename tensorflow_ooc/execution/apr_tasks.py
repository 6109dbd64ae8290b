"""Partition tasks of CP-APR (Poisson CP): passes over a partition's nonzeros, in memory or
streamed from the store, that hand up per-row sums (:class:`~.partials.Partial`) or scalars.

A task whose model state says its mode is done (``state.skip``) returns at once without reading
anything: CP-APR submits a mode's inner iterations ahead, and the ones after the mode converged
cost one scheduling hop each.
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..format import BitLayout
from ..kernels import WorkItems
from ..kernels.apr.cpu import candidate_terms, hessian_width, model_values, newton_terms
from ..kernels.mttkrp.dispatch import numba_threads
from .partials import Partial, worker_threads
from .stream import BATCH_NNZ, read_ahead_pays
from .tasks import PartitionData, cached_store, mttkrp_partition, partition_batches


def phi_partition(
    source,
    state,
    mode: int,
    threads: int,
    batch_nnz: int,
    eps: float,
    max_private_bytes: int,
    device: str = "cpu",
    device_options=None,
):
    """Rows of ``Phi = (X_(n) ./ max(M_(n), eps)) Pi`` this partition touches: the MTTKRP kernels'
    Poisson form, with their conflict resolution (``state``'s mode ``mode`` rows hold ``B``), on
    this worker's GPU with ``device="gpu"``."""
    if state.skip:
        return Partial(0, np.zeros((0, state.rank), dtype=state.dtype))
    if device == "gpu":
        from .device_stream import forget_device_factors

        # the state's rows change in place between passes: a device copy kept for this object
        # would be the previous inner iteration's
        forget_device_factors(state)
    return mttkrp_partition(
        source,
        state,
        mode,
        threads,
        batch_nnz=batch_nnz,
        max_private_bytes=max_private_bytes,
        poisson_eps=eps,
        device=device,
        device_options=device_options,
    )


def _batches(source, mode: int, batch_nnz: int, threads: int) -> Iterator[tuple[WorkItems, BitLayout]]:
    """The partition's work items: decoded (the mode-sorted copy when there is one) or streamed."""
    if isinstance(source, PartitionData):
        yield source.mode_items.get(mode, source.items), source.layout
        return
    path, part = source
    store = cached_store(path)
    for items in partition_batches(store, part, batch_nnz, read_ahead_pays(threads * worker_threads())):
        yield items, store.layout


def loglik_partition(source, state, threads: int, batch_nnz: int = BATCH_NNZ, weights=None) -> np.ndarray:
    """``[sum x log m, sum x m]`` over the partition's nonzeros, ``m`` the model (factors and
    weights of ``state``; ``weights`` given: those)."""
    t0 = time.perf_counter()
    sums = np.zeros(3)
    with numba_threads(threads):
        for items, layout in _batches(source, 0, batch_nnz, threads):
            ll, xm = model_values(items, layout, state, state.weights if weights is None else weights, 0.0)
            sums[:2] += (ll, xm)
    sums[2] = time.perf_counter() - t0
    return sums


def add_sums(*parts: np.ndarray) -> np.ndarray:
    """Sum of the partitions' ``[sum x log m, sum x m, seconds]`` (seconds: the slowest)."""
    out = np.sum([p[:2] for p in parts], axis=0)
    return np.array([out[0], out[1], max(p[2] for p in parts)])


def newton_partition(source, state, mode: int, threads: int, batch_nnz: int, eps: float) -> Partial:
    """The damped Newton row terms (gradient term, Hessian, log-likelihood, nonzero count) of the
    active rows of ``state``'s current row block of ``mode``."""
    t0 = time.perf_counter()
    block = state.block
    if state.skip:
        return Partial(block.lo, np.zeros((0, hessian_width(state.rank))), 0.0)
    out = newton_rows(source, state, mode, block.lo, block.active, threads, batch_nnz, eps)
    return Partial(block.lo, out, time.perf_counter() - t0)


def newton_rows(source, factors, mode: int, lo: int, active: np.ndarray, threads: int, batch_nnz: int, eps: float):
    """The Newton row terms of the rows ``lo .. lo + len(active) - 1`` of ``mode`` whose ``active``
    flag is set, over the partition's nonzeros (``len(active) x`` :func:`hessian_width`)."""
    out = np.zeros((active.shape[0], hessian_width(factors.rank)))
    with numba_threads(threads):
        for items, layout in _batches(source, mode, batch_nnz, threads):
            newton_terms(items, layout, factors, mode, lo, active, eps, out)
    return out


def candidates_partition(source, state, mode: int, threads: int, batch_nnz: int) -> Partial:
    """``sum x log(c_k . pi)`` per active row of the block and line-search candidate ``c_k``."""
    t0 = time.perf_counter()
    block = state.block
    if state.skip:
        return Partial(block.lo, np.zeros((0, block.candidates.shape[1])), 0.0)
    out = candidate_rows(source, state, mode, block.lo, block.active, block.candidates, threads, batch_nnz)
    return Partial(block.lo, out, time.perf_counter() - t0)


def candidate_rows(source, factors, mode: int, lo: int, active: np.ndarray, cand: np.ndarray, threads, batch_nnz):
    """``sum x log(cand[row, k] . pi)`` per row ``lo ..`` of ``mode`` whose ``active`` flag is set and
    line-search candidate ``k``, over the partition's nonzeros (``len(active) x cand.shape[1]``)."""
    out = np.zeros((active.shape[0], cand.shape[1]))
    with numba_threads(threads):
        for items, layout in _batches(source, mode, batch_nnz, threads):
            candidate_terms(items, layout, factors, mode, lo, active, cand, out)
    return out
