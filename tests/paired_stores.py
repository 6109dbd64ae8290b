"""Stores whose last two modes take few distinct index pairs, so CP-ALS memoizes them."""

from __future__ import annotations

import numpy as np

import tensorflow_ooc as tfo


def paired_store(rng: np.random.Generator, path, shape: tuple[int, ...], nnz: int):
    """Fresh random nonzeros of ``shape`` whose last two modes take 4 distinct pairs, converted to
    a store at ``path``; returns ``(coords, values, store)``."""
    coords = np.column_stack([rng.integers(0, s, nnz) for s in shape])
    few = rng.integers(0, 4, nnz)
    coords[:, -2] = few % shape[-2]
    coords[:, -1] = (few * 3) % shape[-1]
    coords = np.unique(coords, axis=0)
    values = rng.standard_normal(coords.shape[0])
    store = tfo.convert((coords, values), path, shape=shape, chunk_nnz=2048)
    return coords, values, store
