"""CP-ALS checkpoints: the state after an iteration, written atomically, read back on resume.

A checkpoint is one ``.npz`` file written under a temporary name and renamed over the previous
one, so a crash at any moment leaves either the old or the new checkpoint, never a torn one. It
is written by a worker (the factors live there), and records the input fingerprint and the
parameters so a resume against another tensor or rank is refused.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem
import numpy as np

from ..errors import StoreError
from ..kernels import StackedFactors

CHECKPOINT_VERSION = 1


@dataclass
class Checkpoint:
    iteration: int            # last completed iteration (0-based)
    factors: StackedFactors
    weights: np.ndarray
    fit: float
    history: list[dict]
    params: dict
    input: dict


def write_checkpoint(path: str, factors: StackedFactors, weights: np.ndarray, iteration: int, fit: float,
                     history: list[dict], params: dict, input_fp: dict) -> str:
    """Write atomically (temporary name, then rename). Runs on a worker."""
    meta = json.dumps({"version": CHECKPOINT_VERSION, "iteration": iteration, "fit": fit, "history": history,
                       "params": params, "input": input_fp, "shape": list(factors.shape)})
    fs, p = fsspec.core.url_to_fs(path)
    parent = os.path.dirname(p)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open(tmp, "wb") as f:
        np.savez(f, factors=factors.data, weights=weights, meta=np.frombuffer(meta.encode(), dtype=np.uint8))
    if isinstance(fs, LocalFileSystem):
        os.replace(tmp, p)  # atomic on POSIX
    else:
        fs.mv(tmp, p)
    return path


def read_checkpoint(path: str) -> Checkpoint | None:
    """The checkpoint at ``path``, or None if there is none."""
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return None
    try:
        with fs.open(p, "rb") as f:
            z = np.load(f)
            data, weights = z["factors"], z["weights"]
            meta = json.loads(bytes(z["meta"]).decode())
    except Exception as exc:
        raise StoreError(f"{path}: unreadable checkpoint ({exc})") from exc
    if meta.get("version") != CHECKPOINT_VERSION:
        raise StoreError(f"{path}: checkpoint version {meta.get('version')} is not supported")
    factors = StackedFactors(meta["shape"], data.shape[1], data.dtype, np.ascontiguousarray(data))
    return Checkpoint(meta["iteration"], factors, weights, meta["fit"], meta["history"], meta["params"],
                      meta["input"])
