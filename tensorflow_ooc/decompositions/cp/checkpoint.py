"""CP-ALS checkpoints: the state after an iteration, written atomically by a worker (the factors live
there), with the input fingerprint and the parameters, so a resume against another tensor or rank
is refused."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import StoreError
from ...kernels import StackedFactors
from ...kernels.factors import aligned_copy
from ..common.checkpoint_files import CHECKPOINT_VERSION, read_npz, write_npz_atomic


@dataclass
class Checkpoint:
    iteration: int  # last completed iteration (0-based)
    factors: StackedFactors
    weights: np.ndarray
    fit: float
    history: list[dict]
    params: dict
    input: dict


def write_checkpoint(
    path: str,
    factors: StackedFactors,
    weights: np.ndarray,
    iteration: int,
    fit: float,
    history: list[dict],
    params: dict,
    input_fp: dict,
) -> str:
    """Write atomically (temporary name, then rename). Runs on a worker."""
    return write_npz_atomic(
        path,
        {"factors": factors.data, "weights": weights},
        {
            "version": CHECKPOINT_VERSION,
            "iteration": iteration,
            "fit": fit,
            "history": history,
            "params": params,
            "input": input_fp,
            "shape": list(factors.shape),
        },
    )


def read_checkpoint(path: str) -> Checkpoint | None:
    """The checkpoint at ``path``, or None if there is none."""
    got = read_npz(path)
    if got is None:
        return None
    arrays, meta = got
    if "factors" not in arrays or "weights" not in arrays:
        raise StoreError(f"{path}: not a CP-ALS checkpoint")
    data = arrays["factors"]
    factors = StackedFactors(meta["shape"], data.shape[1], data.dtype, aligned_copy(data))
    return Checkpoint(
        meta["iteration"], factors, arrays["weights"], meta["fit"], meta["history"], meta["params"], meta["input"]
    )
