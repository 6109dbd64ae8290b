"""Decompositions: CP-ALS and CP-APR over Dask graph reductions, Tucker, tensor train, completion, results,
checkpoints."""

from .apr.cp_apr import cp_apr
from .apr.result import PoissonResult
from .common.cp_result import CPResult
from .completion.fasttucker_result import CompletionError, FastTuckerResult, load_fasttucker_result
from .completion.tucker_sgd import tucker_sgd
from .cp.checkpoint import read_checkpoint
from .cp.cp_als import cp_als
from .results import load_result
from .tt.tt_als import tt_als
from .tt.tt_result import TTResult, load_tt
from .tucker.tucker_hooi import tucker_hooi
from .tucker.tucker_result import TuckerResult, load_tucker

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
