"""Randomized CP-ALS: drawing each mode's Khatri-Rao samples beside the model state (seed 000, ch. 3).

These run as tasks where the state lives (the samplers need the factor rows), so only the sample
set travels to the partition tasks: ``J`` multi-indices and their weighted Khatri-Rao rows.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ...execution.partials import to_host
from ...kernels.sampling.arls_lev import arls_lev_sample
from ...kernels.sampling.krp_sampler import SampleSet, build_tree, sts_sample
from .updates import CPState, _with_arrays

METHODS = ("exact", "sts", "arls-lev", "arls-lev-hybrid")


def check_method(method: str, samples: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "exact" and int(samples) < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")


def with_trees(state: CPState) -> CPState:
    """The state with every mode's STS-CP segment tree built (O(sum I_n R^2)); shares the factors."""
    out = _with_arrays(state, state.data, list(state.grams))
    out.trees = [build_tree(to_host(v)) for v in state.views]
    return out


def draw_samples(state: CPState, mode: int, method: str, draws: int, seed: Sequence[int]) -> SampleSet:
    """``draws`` rows of the Khatri-Rao product of all factors but ``mode``'s, merged into a
    :class:`SampleSet`: by exact leverage scores (``"sts"``) or by the product of the factors'
    leverage scores (``"arls-lev"``, ``"arls-lev-hybrid"``). ``seed`` (run entropy, iteration,
    mode) makes every draw reproducible, a resumed run's included. The draw time is kept in the
    set's ``seconds``."""
    t0 = time.perf_counter()
    factors = [to_host(v) for v in state.views]
    rng = np.random.default_rng(np.random.SeedSequence([int(x) for x in seed]))
    if method == "sts":
        out = sts_sample(factors, state.trees, mode, int(draws), rng)  # builds trees it is not given
    elif method in ("arls-lev", "arls-lev-hybrid"):
        out = arls_lev_sample(factors, mode, int(draws), rng, hybrid=method == "arls-lev-hybrid")
    else:
        raise ValueError(f"no sampler for method {method!r}")
    out.seconds = time.perf_counter() - t0
    return out
