"""CP-APR: Poisson CP of count data (MU and PDN-R), in one process or owner-computes on workers."""
