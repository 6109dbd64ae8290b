"""Tucker HOOI checkpoints: the factors after an iteration, written atomically, read back on resume.

As CP-ALS checkpoints (:mod:`.checkpoint`): one ``.npz`` written under a temporary name and
renamed over the previous one, by the worker that holds the factors, with the input fingerprint
and parameters so that a resume against another tensor or other ranks is refused. The factors
and the core are the whole state HOOI carries from one iteration to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.checkpoint_files import CHECKPOINT_VERSION, read_npz, write_npz_atomic
from .tucker_updates import TuckerState

CHECKPOINT_FORMAT = "tucker-checkpoint"


@dataclass
class TuckerCheckpoint:
    iteration: int  # last completed iteration (0-based)
    factors: list[np.ndarray]
    core: np.ndarray
    fit: float
    history: list[dict]
    params: dict
    input: dict


def write_tucker_checkpoint(
    path: str, state: TuckerState, iteration: int, fit: float, history: list[dict], params: dict, input_fp: dict
) -> str:
    """Write atomically (temporary name, then rename). Runs on the worker holding ``state``."""
    return write_npz_atomic(
        path,
        {"core": state.core, **{f"factor{n}": U for n, U in enumerate(state.factors)}},
        {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "iteration": iteration,
            "fit": fit,
            "history": history,
            "params": params,
            "input": input_fp,
        },
    )


def read_tucker_checkpoint(path: str) -> TuckerCheckpoint | None:
    """The checkpoint at ``path``, or None if there is none."""
    got = read_npz(path, CHECKPOINT_FORMAT, "Tucker HOOI")
    if got is None:
        return None
    arrays, meta = got
    factors = [arrays[f"factor{n}"] for n in range(len(meta["input"]["shape"]))]
    return TuckerCheckpoint(
        meta["iteration"], factors, arrays["core"], meta["fit"], meta["history"], meta["params"], meta["input"]
    )
