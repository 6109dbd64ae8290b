"""Fiber keys: a nonzero's indices in every mode but one, as one mixed-radix number.

The nonzeros of a mode-``m`` fiber share every index but the mode-``m`` one, so they share this
key; sorting by it puts each fiber in one run (the fiber index of a store, the in-memory index of
a partition, the hash join of a streamed sampled MTTKRP). When the product of the other modes'
lengths exceeds 2^63 the keys wrap (a hash); :func:`exact_keys` says whether they do not.
"""

from __future__ import annotations

import numpy as np


def key_strides(shape: tuple[int, ...], mode: int) -> np.ndarray:
    """uint64 (N,) strides of the mixed-radix key over the modes other than ``mode`` (0 for it);
    products wrap modulo 2^64 where the key space is larger."""
    strides = np.zeros(len(shape), dtype=np.uint64)
    s = 1
    for m in range(len(shape) - 1, -1, -1):
        if m != mode:
            strides[m] = np.uint64(s % 2**64)
            s *= int(shape[m])
    return strides


def exact_keys(shape: tuple[int, ...], mode: int) -> bool:
    """Whether mode ``mode``'s keys are exact (the other modes' index space fits in 63 bits)."""
    p = 1
    for m, s in enumerate(shape):
        if m != mode:
            p *= int(s)
    return p < 2**63


def sample_keys(coords: np.ndarray, shape: tuple[int, ...], mode: int) -> np.ndarray:
    """uint64 keys of sampled multi-indices ``coords`` (S, N); column ``mode`` is ignored."""
    strides = key_strides(shape, mode)
    return (np.asarray(coords, dtype=np.int64).astype(np.uint64) * strides[None, :]).sum(axis=1, dtype=np.uint64)
