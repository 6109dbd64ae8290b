"""The estimated fit of randomized CP-ALS between its exact fits.

An exact fit needs ``<X, M>``, a full pass over the nonzeros. Between those, ``<X, M>`` is
estimated from a Bernoulli sample of the nonzeros (each kept with probability ``p``):
``sum_s x_s m_s / p`` is unbiased, with variance ``(1 - p) / p sum_s (x_s m_s)^2`` estimated from
the sample itself; ``||M||^2`` comes exactly from the Grams and ``||X||^2`` from the store. The
fit's standard error follows by the delta method:
``se(fit) = se(<X, M>) / (||X|| ||X - M||)``.
"""

from __future__ import annotations

import math

import numpy as np

from ...execution.nonzero_sample import NonzeroSample
from ...execution.partials import to_host
from . import updates as U


def estimated_fit(state: U.CPState, sample: NonzeroSample, normX2: float, norm_model2: float) -> tuple[float, float]:
    """(fit, its standard error) of the model in ``state`` from the nonzeros in ``sample``."""
    if sample.values.shape[0] == 0 or normX2 <= 0:
        return float("nan"), float("inf")
    prod = np.ones((sample.values.shape[0], state.rank))
    for n, view in enumerate(state.views):
        prod *= to_host(view)[sample.coords[:, n]]
    terms = sample.values * (prod @ np.asarray(state.weights, dtype=np.float64))
    p = sample.rate
    inner = float(terms.sum()) / p
    var = (1 - p) / (p * p) * float((terms * terms).sum())
    res2 = max(normX2 + norm_model2 - 2 * inner, 0.0)
    normX = math.sqrt(normX2)
    fit = 1 - math.sqrt(res2) / normX
    se = math.sqrt(var) / (normX * max(math.sqrt(res2), 1e-300))
    return fit, se
