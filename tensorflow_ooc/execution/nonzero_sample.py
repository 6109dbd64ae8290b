"""A uniform sample of a store's nonzeros, drawn once per run where the model lives: what an
estimated fit evaluates the model at between its exact fits (a full pass each)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tasks import cached_store


@dataclass
class NonzeroSample:
    """``coords`` (n, N) int64 and ``values`` (n,) of nonzeros each kept with probability ``rate``
    (independently: a Bernoulli sample, so sums scale by ``1 / rate`` without bias)."""

    coords: np.ndarray
    values: np.ndarray
    rate: float
    nnz: int


def sample_nonzeros(path: str, count: int, seed: int) -> NonzeroSample:
    """About ``count`` nonzeros of the store at ``path``, each kept with probability
    ``count / nnz``, from one pass over its chunks (their indices checked as every read does)."""
    store = cached_store(path)
    rate = min(1.0, count / max(1, store.nnz))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5A3]))
    coords, values = [], []
    for c in range(store.nchunks):
        chunk = store.read_chunk(c)
        keep = rng.random(chunk.values.shape[0]) < rate
        if keep.any():
            coords.append(chunk.coords(store.layout)[keep])
            values.append(np.asarray(chunk.values[keep], dtype=np.float64))
    N = store.nmodes
    return NonzeroSample(
        np.concatenate(coords) if coords else np.zeros((0, N), np.int64),
        np.concatenate(values) if values else np.zeros(0),
        rate,
        store.nnz,
    )
