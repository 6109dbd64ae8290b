"""Reading any result store back: the family is read from the store's own metadata."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .apr.result import PoissonResult
from .common.cp_result import RESULT_FORMAT, CPResult
from .common.result_store import read_result_store, result_format

if TYPE_CHECKING:
    from .completion.fasttucker_result import FastTuckerResult
    from .tt.tt_result import TTResult
    from .tucker.tucker_result import TuckerResult


def load_result(path: str | os.PathLike) -> CPResult | TuckerResult | FastTuckerResult | TTResult:
    """Read a result store: a CP result written by :meth:`CPResult.save`, or a Tucker, FastTucker
    or tensor-train result (as :func:`~tensorflow_ooc.decompositions.tucker.tucker_result.load_tucker`,
    :func:`~tensorflow_ooc.decompositions.completion.fasttucker_result.load_fasttucker_result` and
    :func:`~tensorflow_ooc.decompositions.tt.tt_result.load_tt` read them)."""
    root, meta = result_format(path)
    if meta["format"] == "tt-result":
        from .tt.tt_result import load_tt

        return load_tt(path)
    if meta["format"] == "tucker-result":
        from .tucker.tucker_result import load_tucker

        return load_tucker(path)
    if meta["format"] == "fasttucker-result":
        from .completion.fasttucker_result import load_fasttucker_result

        return load_fasttucker_result(path)
    root, meta = read_result_store(path, RESULT_FORMAT, "CP")
    n = (
        len(meta["input"]["shape"])
        if meta.get("input")
        else len([k for k in root.array_keys() if k.startswith("factor")])
    )
    factors = [root[f"factor{i}"][...] for i in range(n)]
    if (meta.get("params") or {}).get("model") == "poisson":
        last = meta["history"][-1] if meta["history"] else {}
        return PoissonResult(
            root["weights"][...],
            factors,
            meta["fit"],
            meta["iterations"],
            meta["history"],
            meta["params"],
            meta["input"],
            float(last.get("loglik", float("nan"))),
            float(last.get("kkt_violation", float("nan"))),
        )
    return CPResult(
        root["weights"][...], factors, meta["fit"], meta["iterations"], meta["history"], meta["params"], meta["input"]
    )
