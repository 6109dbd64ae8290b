"""Limits every stage shares, in a module that imports nothing: the command line and the workflow
specs check counts against them without loading the decompositions (numba, Dask) to do so."""

#: counts (ranks, iterations, samples) beyond this are not meaningful, and not representable where
#: they meet int64 arithmetic
MAX_COUNT = 2**62

#: The Dask worker resource a submitted run's driver holds while it runs, so that concurrent runs
#: queue for workers instead of decomposing side by side in one worker's memory. Workers declare
#: how many runs they take at once (``dask worker --resources tfooc-slot=1``); the embedded
#: cluster's workers have one each. Here so that the monitoring page reads it without loading
#: the execution stage.
SLOT_RESOURCE = "tfooc-slot"
