"""Row sampling for randomized decompositions (seed 000, chapters 3-5): Khatri-Rao products by
exact leverage scores through segment trees (``krp_sampler``, STS-CP) or products of factor
leverage scores (``arls_lev``, CP-ARLS-LEV), orthonormal tensor-train core chains by squared row
norms on the same trees (``tt_sampler``), and the sampled MTTKRP over gathered fibers
(``fiber_gather``)."""
