"""Planted sparse CP tensors: :class:`PlantedCP` and ``planted_cp``, exactly rank R on sparse factor supports."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .power_law import _as_skews, _sample_ranks


@dataclass
class PlantedCP:
    """A sparse tensor that is exactly a known CP model (plus optional noise on its nonzeros).

    ``values = sum_r weights[r] * prod_n factors[n][coords[:, n], r]`` (+ noise), and the model
    is zero everywhere else: every factor column has a sparse support.
    """

    coords: np.ndarray
    values: np.ndarray
    weights: np.ndarray
    factors: list[np.ndarray]
    noise: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)


def planted_cp(
    shape: Sequence[int],
    rank: int,
    nnz: int,
    *,
    noise: float = 0.0,
    seed: int | None = None,
    skew: float | Sequence[float] = 1.3,
) -> PlantedCP:
    """Planted rank-``rank`` CP tensor whose factors have sparse supports.

    Component r is the outer product of factor columns that are non-zero on ``s_n`` indices of
    mode n (drawn with the heavy-tailed preference ``skew``, values uniform in [0.5, 1.5)), sized so
    the components together hold about ``nnz`` nonzeros; overlapping components add. The sparse
    tensor is therefore exactly rank ``rank``. ``noise`` adds Gaussian noise with that standard
    deviation relative to the values' standard deviation, on the nonzeros only.
    """
    shape = tuple(int(x) for x in shape)
    N = len(shape)
    rng = np.random.default_rng(seed)
    skews = _as_skews(skew, N)
    per = max(1.0, nnz / rank)
    sizes = [1] * N
    # grow supports mode by mode (short modes saturate) until a component holds ~nnz/rank cells
    grew = True
    while grew:  # ends: every size is bounded by its mode's length
        grew = False
        for n in range(N):
            if sizes[n] < shape[n] and math.prod(sizes) * (sizes[n] + 1) / sizes[n] <= per:
                sizes[n] += 1
                grew = True
    factors = [np.zeros((L, rank)) for L in shape]
    boxes = []
    for r in range(rank):
        support = []
        for n, L in enumerate(shape):
            idx = np.unique(_sample_ranks(rng, L, skews[n], 4 * sizes[n] + 8))
            if idx.shape[0] < sizes[n]:
                rest = np.setdiff1d(rng.choice(L, size=min(L, 4 * sizes[n] + 8), replace=False), idx)
                idx = np.concatenate([idx, rest])
            idx = np.sort(rng.choice(idx, size=sizes[n], replace=False))
            factors[n][idx, r] = rng.uniform(0.5, 1.5, sizes[n])
            support.append(idx)
        boxes.append(support)
    weights = np.ones(rank)
    if math.prod(shape) < 2**64:
        # Fast path: each box's cells as C-order linear keys (their order is the rows' lexicographic
        # order), one 1-D unique, and each cell's value as the sum over the boxes covering it of
        # that component's outer-product value (a bincount); about 6x faster than a row-wise
        # unique and an (nnz x rank) product at uber size, and the same tensor.
        # (unsigned keys: an Amazon-shaped tensor's 1.5e19 cells fit 64 bits, not 63; the slow
        # path below held 24 GB at 86 M nonzeros)
        strides = [np.uint64(math.prod(shape[n + 1 :])) for n in range(N)]
        keys, vals = [], []
        for r, support in enumerate(boxes):
            k = np.zeros(1, dtype=np.uint64)
            v = np.full(1, weights[r])
            for n, idx in enumerate(support):
                k = (k[:, None] + idx[None, :].astype(np.uint64) * strides[n]).ravel()
                v = (v[:, None] * factors[n][idx, r][None, :]).ravel()
            keys.append(k)
            vals.append(v)
        lin, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        values = np.bincount(inverse, weights=np.concatenate(vals), minlength=lin.shape[0])
        del keys, vals
        coords = np.empty((lin.shape[0], N), dtype=np.int64)
        rest = lin
        for n in range(N):
            q, rest = np.divmod(rest, strides[n])
            coords[:, n] = q
    else:
        grids = [np.meshgrid(*support, indexing="ij") for support in boxes]
        coords = np.unique(np.concatenate([np.stack([g.ravel() for g in gr], axis=1) for gr in grids]), axis=0)
        prod = np.ones((coords.shape[0], rank))
        for n, A in enumerate(factors):
            prod *= A[coords[:, n]]
        values = prod @ weights
    if noise > 0:
        values = values + noise * values.std() * rng.standard_normal(values.shape[0])
    return PlantedCP(coords, values, weights, factors, float(noise))
