"""Limits every stage shares, in a module that imports nothing: the command line and the workflow
specs check counts against them without loading the decompositions (numba, Dask) to do so."""

#: counts (ranks, iterations, samples) beyond this are not meaningful, and not representable where
#: they meet int64 arithmetic
MAX_COUNT = 2**62
