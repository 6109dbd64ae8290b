"""Sampled MTTKRP through a store's fiber index: a round reads only the index chunks that hold the
sampled fibers, not every nonzero (seed 000, section 3.3.3: the sketched solve needs only them).

Each task takes one share of the distinct sample keys (a range of keys, so every fiber lies in
one share), finds the chunks of their fibers in the index's chunk table, reads those, and adds
each sample's fiber into its rows in sample order, as the in-memory index does
(:func:`~tensorflow_ooc.kernels.sampling.fiber_gather.index_gather`): one share gives the sums of
one in-memory partition exactly.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..format.fiber_keys import sample_keys
from ..kernels.mttkrp.dispatch import numba_threads
from ..kernels.sampling.fiber_gather import FENCE, FiberIndex, index_gather, run_rows
from .partials import Partial
from .tasks import cached_store


def share_keys(keys: np.ndarray, share: tuple[int, int]) -> np.ndarray:
    """The positions of the samples whose key falls in share ``k`` of ``K``: the distinct keys cut
    into ``K`` runs of about equal count, so all samples of one key (one fiber) go to one share."""
    k, K = share
    if K <= 1:
        return np.arange(keys.shape[0])
    distinct = np.unique(keys)
    cuts = distinct[(np.arange(1, K) * distinct.shape[0]) // K] if distinct.shape[0] else distinct[:0]
    lo = np.uint64(0) if k == 0 else cuts[k - 1]
    keep = keys >= lo
    if k < K - 1:
        keep &= keys < cuts[k]
    return np.flatnonzero(keep)


def indexed_sampled_partial(
    path: str, samples: Any, mode: int, threads: int = 1, share: tuple[int, int] = (0, 1)
) -> Partial:
    """Mode-``mode`` sampled MTTKRP of the ``samples`` (a
    :class:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet`) in share ``share`` (k of K)
    of their keys, from the fiber index of the store at ``path``. Its ``reads`` say what the
    round read: nonzeros matched (``nnz``), entries and bytes read, chunks, fibers with nonzeros."""
    t0 = time.perf_counter()
    store = cached_store(path)
    idx = store.fibers.mode(mode) if store.fibers is not None else None
    if idx is None:
        raise ValueError(f"{path}: mode {mode} has no fiber index")
    mine = share_keys(sample_keys(samples.coords, store.shape, mode), share)
    skeys = sample_keys(samples.coords[mine], store.shape, mode)
    # only fibers the Bloom filter may hold are looked up: the others hold no nonzero for certain
    chunks = idx.chunks_of(skeys[idx.may_hold(skeys)])
    # one thread decodes: each chunk is a few us of Blosc between Python calls, and two threads
    # contending for the GIL took 2.6 s where one took 1.0 (65 k fibers, 86 M heavy-tailed)
    got = idx.read(chunks, 1)
    fence = np.ascontiguousarray(got.keys[::FENCE]) if got.keys.shape[0] >= FENCE else None
    index = FiberIndex(mode, got.keys, got.rows, got.values, fence)
    runs = index.ranges(skeys)
    offsets, first = runs
    lo, hi = run_rows(index, first, offsets)
    out = np.zeros((hi - lo + 1, samples.ncols), dtype=samples.dtype)
    if hi >= lo:

        def rows_of(used: np.ndarray) -> np.ndarray:
            return samples.weighted_rows(mine[used])

        with numba_threads(threads):
            index_gather(index, skeys, rows_of, out, lo, runs)
    reads = {
        "path": "index",
        "nnz": int(offsets[-1]),
        "nnz_read": int(got.keys.shape[0]),
        "bytes_read": int(got.bytes_read),
        "chunks_read": int(got.chunks_read),
        "fibers": int(np.count_nonzero(offsets[1:] > offsets[:-1])),
    }
    return Partial(int(lo), out, time.perf_counter() - t0, reads)
