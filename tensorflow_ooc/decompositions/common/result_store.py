"""Zarr result stores shared by every decomposition: written atomically, read back only when complete.

A result store is a Zarr group holding the model's arrays and, in its attributes under
``tensorflow_ooc``, the format name and version, the run's summary (fit or errors, iterations,
history, parameters, the input's fingerprint) and ``complete: true``, set last. Local stores are
written to a staging directory and renamed into place, so a crash never leaves a store that opens
as a result.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import zarr

from ...disk import disk_writes
from ...errors import StoreError
from ...store import paths
from ...store.destinations import holding
from ...store.output_claim import claim_outputs

# rows per chunk of a factor matrix in a result store
ROWS_PER_CHUNK = 1 << 16


def write_result_store(
    path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict, overwrite: bool = False
) -> str:
    """Write ``arrays`` and ``meta`` (which names the ``format``) as a result store; returns its path.

    Raises :class:`StoreError` if ``path`` exists and ``overwrite`` is false.
    """
    final = str(path)
    # a full disk: the staging store is removed (by ``staged``), then the error names the result,
    # the bytes it needs (the arrays, uncompressed, and the metadata) and the space free
    needed = sum(np.asarray(a).nbytes for a in arrays.values()) + len(json.dumps(meta, default=str)) + 4096
    with (
        disk_writes(final, needed=needed),
        paths.staged(
            final, overwrite, StoreError(f"{final}: exists; pass overwrite=True to replace the result")
        ) as staging,
    ):
        root = zarr.open_group(staging, mode="w", zarr_format=3)
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            chunks = (max(1, min(a.shape[0], ROWS_PER_CHUNK)), *a.shape[1:]) if a.ndim == 2 else None
            root.create_array(name, data=a, **({"chunks": chunks} if chunks else {}))
        root.attrs.put(
            {
                "tensorflow_ooc": {
                    **meta,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "complete": True,
                }
            }
        )
    return final


@contextmanager
def claim_run(
    store: Any,
    out: str | os.PathLike | None,
    checkpoint: str | os.PathLike | None,
    overwrite: bool,
    purpose: str,
    inputs: dict | None = None,
    error: type[Exception] = StoreError,
) -> Iterator[None]:
    """Hold a decomposition's ``out`` and ``checkpoint`` for its run, before it starts: refused
    when either is, contains or lies inside the input ``store`` (or another of ``inputs``) or holds
    something this package did not write, when another run writes either, and when ``out`` holds
    a result and ``overwrite`` is false (``error`` is raised then, naming what is there)."""
    where = getattr(store, "path", None)
    given = {"store": where if isinstance(where, str) and paths.exists(where) else None, **(inputs or {})}
    with claim_outputs({"out": out, "checkpoint": checkpoint}, given, purpose):
        if out is not None and paths.exists(str(out)) and not overwrite:
            raise error(f"{out}: already holds {holding(out).text}; pass overwrite=True to replace it")
        yield


def _open(path: str) -> tuple[zarr.Group, Any]:
    if not paths.exists(path):
        raise StoreError(f"{path}: no such result")
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:
        raise StoreError(f"{path}: not a Zarr group ({exc})") from exc
    return root, dict(root.attrs).get("tensorflow_ooc")


def _complete(path: str, meta: dict) -> None:
    if meta.get("complete") is not True:
        raise StoreError(f"{path}: the result was not completely written")


def result_format(path: str | os.PathLike) -> tuple[zarr.Group, dict]:
    """Open a complete result store of any format: its group and its ``tensorflow_ooc`` metadata."""
    root, meta = _open(str(path))
    if not isinstance(meta, dict) or "format" not in meta:
        raise StoreError(f"{path}: not a tensorflow_ooc result")
    _complete(str(path), meta)
    return root, meta


def read_result_store(path: str | os.PathLike, fmt: str, what: str) -> tuple[zarr.Group, dict]:
    """Open a complete result store of format ``fmt`` (``what`` names it in errors)."""
    root, meta = _open(str(path))
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise StoreError(f"{path}: not a tensorflow_ooc {what} result")
    _complete(str(path), meta)
    return root, meta
