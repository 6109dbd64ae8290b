"""TT-ALS checkpoints: the cores after a sweep, written atomically, read back on resume.

As CP-ALS checkpoints (:mod:`.checkpoint`): one ``.npz`` written under a temporary name and
renamed over the previous one, by the worker that holds the cores, with the input fingerprint and
parameters so that a resume against another tensor, other ranks or another method is refused.
The cores (core 0 general, the others right-orthonormal) are the whole state one sweep hands the
next, so a resumed run continues bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.checkpoint_files import CHECKPOINT_VERSION, read_npz, write_npz_atomic
from .tt_steps import TTState

CHECKPOINT_FORMAT = "tt-checkpoint"


@dataclass
class TTCheckpoint:
    sweep: int  # last completed sweep (0-based)
    state: TTState
    fit: float
    history: list[dict]
    params: dict
    input: dict


def write_tt_checkpoint(
    path: str, state: TTState, sweep: int, fit: float, history: list[dict], params: dict, input_fp: dict
) -> str:
    """Write atomically (temporary name, then rename). Runs on the worker holding ``state``."""
    return write_npz_atomic(
        path,
        {"cores": state.data},
        {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "sweep": sweep,
            "fit": fit,
            "history": history,
            "params": params,
            "input": input_fp,
            "shape": list(state.shape),
            "ranks": [int(r) for r in state.ranks],
        },
    )


def read_tt_checkpoint(path: str) -> TTCheckpoint | None:
    """The checkpoint at ``path``, or None if there is none."""
    got = read_npz(path, CHECKPOINT_FORMAT, "TT-ALS")
    if got is None:
        return None
    arrays, meta = got
    state = TTState(meta["shape"], meta["ranks"], arrays["cores"].copy())
    return TTCheckpoint(meta["sweep"], state, meta["fit"], meta["history"], meta["params"], meta["input"])
