"""The power law of synthetic indices: per-mode skews checked, ranks sampled, and rank probabilities."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _as_skews(skew: float | Sequence[float], nmodes: int) -> np.ndarray:
    s = np.full(nmodes, float(skew)) if np.isscalar(skew) else np.asarray(skew, dtype=np.float64)
    if s.shape != (nmodes,) or (s < 1).any():
        raise ValueError(f"skew must be >= 1 (1 = uniform), one value or one per mode; got {skew!r}")
    return s


def _sample_ranks(rng, length: int, skew: float, n: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Power-law ranks in [lo, hi): P(rank < r) = (r / length) ** (1 / skew)."""
    hi = length if hi is None else hi
    u_lo, u_hi = (lo / length) ** (1 / skew), (hi / length) ** (1 / skew)
    u = rng.uniform(u_lo, u_hi, n)
    r = np.floor(length * u**skew).astype(np.int64)
    return np.clip(r, lo, hi - 1)


def _rank_probabilities(length: int, skew: float, lo: int, hi: int) -> np.ndarray:
    r = np.arange(lo, hi + 1, dtype=np.float64)
    cdf = (r / length) ** (1 / skew)
    return np.diff(cdf)
