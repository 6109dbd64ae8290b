"""Planted FastTucker models: :class:`PlantedFastTucker` and ``planted_fasttucker``, observed entries with noise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class PlantedFastTucker:
    """Observed entries of a known FastTucker model (seed 003): ``values = clean + noise`` with
    ``clean = sum_r prod_n (factors[n] @ core_factors[n])[coords[:, n], r]``; ``noise_std`` is the
    standard deviation of the added Gaussian noise."""

    coords: np.ndarray
    values: np.ndarray
    clean: np.ndarray
    factors: list[np.ndarray]
    core_factors: list[np.ndarray]
    noise_std: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)


def planted_fasttucker(
    shape: Sequence[int],
    ranks: int | Sequence[int],
    core_rank: int,
    nnz: int,
    *,
    noise: float = 0.0,
    seed: int | None = None,
    decay: float = 1.0,
) -> PlantedFastTucker:
    """``nnz`` distinct entries, uniform over the tensor, of a random FastTucker model.

    Factors are standard normal, core factors normal with variance ``1 / J_n`` (so every
    ``C^(n) = A^(n) B^(n)`` has unit-variance entries) and the first scaled by ``1 / sqrt(R)``, so
    the values have about unit variance; with ``decay < 1`` component ``r`` of the Kruskal core is
    scaled by ``decay**r`` (a decaying spectrum, as real data have). ``noise`` adds Gaussian noise of
    that standard deviation relative to the clean values' standard deviation.

    Examples
    --------
    >>> from tensorflow_ooc import synthetic
    >>> p = synthetic.planted_fasttucker((30, 20, 10), 4, 4, 2000, noise=0.05, seed=0)
    >>> p.coords.shape, round(p.noise_std / p.clean.std(), 2)
    ((2000, 3), 0.05)
    """
    shape = tuple(int(x) for x in shape)
    N = len(shape)
    J = [int(ranks)] * N if np.ndim(ranks) == 0 else [int(j) for j in ranks]
    total = math.prod(shape)
    if not 0 < nnz <= total:
        raise ValueError(f"nnz must be in 1..{total} for shape {shape}, got {nnz}")
    rng = np.random.default_rng(seed)
    factors = [rng.standard_normal((L, j)) for L, j in zip(shape, J, strict=False)]
    core = [rng.standard_normal((j, core_rank)) / math.sqrt(j) for j in J]
    core[0] /= math.sqrt(core_rank)
    core[0] *= float(decay) ** np.arange(core_rank)
    # distinct uniform entries: draw, drop repeats, top up (few rounds unless nnz ~ the whole tensor)
    if total < 2**62:
        keys = np.zeros(0, np.int64)
        while keys.shape[0] < nnz:
            keys = np.unique(np.concatenate([keys, rng.integers(0, total, size=int((nnz - keys.shape[0]) * 1.1) + 16)]))
        keys = rng.choice(keys, size=nnz, replace=False) if keys.shape[0] > nnz else keys
        coords = np.stack(np.unravel_index(keys, shape), axis=1).astype(np.int64)
    else:
        coords = np.zeros((0, N), np.int64)
        while coords.shape[0] < nnz:
            extra = np.stack([rng.integers(0, L, size=int((nnz - coords.shape[0]) * 1.1) + 16) for L in shape], axis=1)
            coords = np.unique(np.concatenate([coords, extra]), axis=0)
        coords = coords[rng.choice(coords.shape[0], size=nnz, replace=False)]
    coords = coords[rng.permutation(nnz)]
    prod = np.ones((nnz, core_rank))
    for n in range(N):
        prod *= (factors[n] @ core[n])[coords[:, n]]
    clean = prod.sum(axis=1)
    noise_std = float(noise * clean.std())
    values = clean + noise_std * rng.standard_normal(nnz)
    return PlantedFastTucker(coords, values, clean, factors, core, noise_std)
