"""Decompositions: CP-ALS and CP-APR over Dask graph reductions, Tucker, tensor train, completion, results,
checkpoints.

The names below load on first use, so that a family's declared options
(``decompositions.<family>.options``) can be read without loading any kernel.
"""

from __future__ import annotations

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
