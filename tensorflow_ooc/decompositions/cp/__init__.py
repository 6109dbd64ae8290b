"""CP-ALS: exact, randomized (STS-CP, CP-ARLS-LEV), nonnegative (HALS), dense inputs, owner-computes on workers."""
