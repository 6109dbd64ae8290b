"""Decompositions: CP-ALS over Dask graph reductions, results, checkpoints."""

from .checkpoint import read_checkpoint
from .cp_als import cp_als
from .result import CPResult, load_result

__all__ = ["CPResult", "cp_als", "load_result", "read_checkpoint"]
