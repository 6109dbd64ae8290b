"""Decompositions: CP-ALS and CP-APR over Dask graph reductions, Tucker, tensor train, completion, results,
checkpoints.

The names below load on first use, so that a family's declared options
(``decompositions.<family>.options``) can be read without loading any kernel.
"""

from __future__ import annotations

from ..lazy_names import lazy_names

_WHERE = {
    "cp_apr": ".apr.cp_apr",
    "PoissonResult": ".apr.result",
    "CPResult": ".common.cp_result",
    "CompletionError": ".completion.fasttucker_result",
    "FastTuckerResult": ".completion.fasttucker_result",
    "load_fasttucker_result": ".completion.fasttucker_result",
    "tucker_sgd": ".completion.tucker_sgd",
    "read_checkpoint": ".cp.checkpoint",
    "cp_als": ".cp.cp_als",
    "load_result": ".results",
    "tt_als": ".tt.tt_als",
    "TTResult": ".tt.tt_result",
    "load_tt": ".tt.tt_result",
    "tucker_hooi": ".tucker.tucker_hooi",
    "TuckerResult": ".tucker.tucker_result",
    "load_tucker": ".tucker.tucker_result",
}

__all__ = list(_WHERE)


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
