"""Khatri-Rao row sampling for randomized CP (seed 000, chapters 3-4): exact leverage scores by
segment trees (``krp_sampler``, STS-CP), products of factor leverage scores (``arls_lev``,
CP-ARLS-LEV) and the sampled MTTKRP over gathered fibers (``fiber_gather``)."""
