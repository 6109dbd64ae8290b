"""What every iterative family shares to run: the convergence test and the run's sampling entropy."""

from __future__ import annotations

import logging

import numpy as np

from .model_checks import check_seed

log = logging.getLogger(__package__ + ".cp_als")


# randomized methods evaluate the fit (one exact MTTKRP) every iteration up to this size by default
FIT_EVERY_ITERATION_NNZ = 1 << 24


def run_entropy(sample_entropy: int | None, seed: int | None) -> int:
    """The randomized methods' sampling entropy: one per run, kept in checkpoints, so a resumed run
    draws what the first would have."""
    if sample_entropy is None:
        sample_entropy = int(np.random.SeedSequence(check_seed(seed)).entropy) % 2**63  # None: fresh entropy
    return int(sample_entropy)


def converged(
    randomized: bool, tol: float, iteration: int, fit: float, fit_old: float, evaluate: bool, evaluated: list[float]
) -> bool:
    """The stopping test after ``iteration``: exact CP-ALS stops when the fit changed by less than
    ``tol``; randomized CP-ALS on its evaluated fits (``evaluated``, this run's and a resumed one's)."""
    if randomized:
        # sketched solves make the fit noisy: stop when the best of the last 3 evaluations
        # does not beat the best before them by tol (seed 000, section 3.6.9)
        return tol > 0 and evaluate and len(evaluated) > 3 and max(evaluated[-3:]) - max(evaluated[:-3]) < tol
    return iteration > 0 and abs(fit - fit_old) < tol
