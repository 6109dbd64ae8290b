"""Tucker HOOI checkpoints: the factors after an iteration, written atomically, read back on resume.

As CP-ALS checkpoints (:mod:`.checkpoint`): one ``.npz`` written under a temporary name and
renamed over the previous one, by the worker that holds the factors, with the input fingerprint
and parameters so that a resume against another tensor or other ranks is refused. The factors
and the core are the whole state HOOI carries from one iteration to the next.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from ..errors import StoreError
from .tucker_updates import TuckerState

CHECKPOINT_FORMAT = "tucker-checkpoint"
CHECKPOINT_VERSION = 1


@dataclass
class TuckerCheckpoint:
    iteration: int            # last completed iteration (0-based)
    factors: list[np.ndarray]
    core: np.ndarray
    fit: float
    history: list[dict]
    params: dict
    input: dict


def write_tucker_checkpoint(path: str, state: TuckerState, iteration: int, fit: float, history: list[dict],
                            params: dict, input_fp: dict) -> str:
    """Write atomically (temporary name, then rename). Runs on the worker holding ``state``."""
    meta = json.dumps({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "iteration": iteration,
                       "fit": fit, "history": history, "params": params, "input": input_fp})
    fs, p = fsspec.core.url_to_fs(path)
    parent = os.path.dirname(p)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open(tmp, "wb") as f:
        np.savez(f, core=state.core, **{f"factor{n}": U for n, U in enumerate(state.factors)},
                 meta=np.frombuffer(meta.encode(), dtype=np.uint8))
    if isinstance(fs, LocalFileSystem):
        os.replace(tmp, p)  # atomic on POSIX
    else:
        fs.mv(tmp, p)
    return path


def read_tucker_checkpoint(path: str) -> TuckerCheckpoint | None:
    """The checkpoint at ``path``, or None if there is none."""
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return None
    try:
        with fs.open(p, "rb") as f:
            z = np.load(f)
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("format") != CHECKPOINT_FORMAT:
                raise StoreError(f"{path}: not a Tucker HOOI checkpoint (a CP-ALS one?)")
            factors = [z[f"factor{n}"] for n in range(len(meta["input"]["shape"]))]
            core = z["core"]
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"{path}: unreadable checkpoint ({exc})") from exc
    if meta.get("version") != CHECKPOINT_VERSION:
        raise StoreError(f"{path}: checkpoint version {meta.get('version')} is not supported")
    return TuckerCheckpoint(meta["iteration"], factors, core, meta["fit"], meta["history"], meta["params"],
                            meta["input"])
