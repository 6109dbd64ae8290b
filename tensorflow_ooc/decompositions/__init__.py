"""Decompositions: CP-ALS and CP-APR over Dask graph reductions, Tucker, tensor train, completion, results,
checkpoints."""

from .checkpoint import read_checkpoint
from .cp_als import cp_als
from .cp_apr import cp_apr
from .fasttucker_result import CompletionError, FastTuckerResult, load_fasttucker_result
from .result import CPResult, PoissonResult, load_result
from .tt_als import tt_als
from .tt_result import TTResult, load_tt
from .tucker_hooi import tucker_hooi
from .tucker_result import TuckerResult, load_tucker
from .tucker_sgd import tucker_sgd

__all__ = [
    "CPResult",
    "cp_als",
    "cp_apr",
    "PoissonResult",
    "load_result",
    "read_checkpoint",
    "CompletionError",
    "FastTuckerResult",
    "load_fasttucker_result",
    "tucker_sgd",
    "TuckerResult",
    "load_tucker",
    "tucker_hooi",
    "TTResult",
    "load_tt",
    "tt_als",
]
