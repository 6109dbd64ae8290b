"""Checkpoint files of every family: arrays and JSON meta in one ``.npz``, written under a temporary
name and renamed over the previous one (a crash leaves the old or the new, never a torn one), read
back without ever loading a pickle; and a full disk on a worker returned as one line."""

from __future__ import annotations

import json
import os
import uuid

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from ...disk import disk_full_error, is_disk_full
from ...errors import DiskFullError, StoreError

CHECKPOINT_VERSION = 1


def write_npz_atomic(path: str, arrays: dict[str, np.ndarray], meta: dict) -> str:
    """``arrays`` and the JSON ``meta`` as one ``.npz``, written under a temporary name and renamed
    over ``path`` (local or fsspec URL)."""
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    fs, p = fsspec.core.url_to_fs(path)
    parent = os.path.dirname(p)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open(tmp, "wb") as f:
            np.savez(f, **arrays, meta=blob)
        if isinstance(fs, LocalFileSystem):
            os.replace(tmp, p)  # atomic on POSIX
        else:
            fs.mv(tmp, p)
    except BaseException as exc:
        try:  # no temporary file stays behind (on a full disk least of all)
            if fs.exists(tmp):
                fs.rm(tmp)
        except Exception:
            pass
        if is_disk_full(exc):
            # the whole file is needed again; the previous checkpoint, if any, is still in place
            raise disk_full_error(
                exc,
                path,
                needed=sum(np.asarray(a).nbytes for a in arrays.values()) + blob.nbytes + 512 * (len(arrays) + 1),
            ) from exc
        raise
    return path


def read_npz(path: str, fmt: str | None = None, what: str = "") -> tuple[dict[str, np.ndarray], dict] | None:
    """The arrays and meta of a checkpoint written by :func:`write_npz_atomic`, None if there is
    none; with ``fmt``, a checkpoint whose meta names another format is refused."""
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return None
    try:
        with fs.open(p, "rb") as f:
            arrays, meta = _load_npz(f)
    except _Foreign as exc:
        raise StoreError(
            f"{path}: unreadable checkpoint: not a checkpoint written by tensorflow_ooc ({exc}); "
            "name another checkpoint path (checkpoint=PATH)"
        ) from None
    except OSError as exc:  # the file system's refusal: permissions, a folder, an I/O error
        raise StoreError(f"{path}: unreadable checkpoint: {exc.strerror or exc}") from exc
    if fmt is not None and meta.get("format") != fmt:
        raise StoreError(f"{path}: not a {what} checkpoint")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise StoreError(f"{path}: checkpoint version {meta.get('version')} is not supported")
    return arrays, meta


class _Foreign(Exception):
    """A file at a checkpoint's path that this package did not write (the message says what it is)."""


def _load_npz(f) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and JSON meta of an open checkpoint file; :class:`_Foreign` naming what the file
    is when it is none. Pickles are never loaded, and NumPy's errors (which advise
    ``allow_pickle=True``, loading a stranger's code) are not passed on."""
    head = f.read(6)
    f.seek(0)
    if not head.startswith(b"PK"):
        if head.startswith(b"\x93NUMPY"):
            raise _Foreign("a NumPy .npy array, not an .npz archive")
        if head[:1] == b"\x80":
            raise _Foreign("a Python pickle, which is never loaded")
        raise _Foreign("not an .npz archive" if head else "an empty file")
    try:
        z = np.load(f, allow_pickle=False)
        names = list(z.files)
    except Exception as exc:
        raise _Foreign(f"a damaged or foreign zip archive: {_reason(exc)}") from None
    if "meta" not in names:
        raise _Foreign(f"an .npz archive without a meta record, holding {', '.join(names) or 'nothing'}")
    arrays = {}
    for k in names:
        try:
            arrays[k] = z[k]
        except Exception as exc:
            raise _Foreign(f"its array {k!r} cannot be read: {_reason(exc)}") from None
    try:
        meta = json.loads(bytes(arrays.pop("meta")).decode())
    except (ValueError, TypeError):
        raise _Foreign("its meta record is not JSON") from None
    if not isinstance(meta, dict):
        raise _Foreign("its meta record is not a JSON object")
    return arrays, meta


def _reason(exc: Exception) -> str:
    """An error of NumPy's or zipfile's, as a reason; pickle advice left out. The file system's own
    errors (an ``OSError`` with an errno) are raised again, as they are."""
    if isinstance(exc, OSError) and exc.errno is not None:
        raise exc
    text = str(exc)
    if "pickle" in text or "Object arrays" in text:
        return "it holds Python objects (pickles), which are never loaded"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def disk_full_returned(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a Dask worker, a :class:`DiskFullError` returned instead of raised:
    a worker logs every task that raises, with its traceback, on stderr, and a full disk is to be
    one line. The driver raises it again (:func:`raise_returned`)."""
    try:
        return fn(*args, **kwargs)
    except DiskFullError as exc:
        return exc


def raise_returned(value):
    """``value``, or raise it if :func:`disk_full_returned` returned an error."""
    if isinstance(value, DiskFullError):
        raise value
    return value
