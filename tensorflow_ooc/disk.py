"""Full disks: turn ENOSPC / EDQUOT at a write into a :class:`~tensorflow_ooc.errors.DiskFullError`
that names the file and the bytes still needed.

Every write site that can fill a disk (store chunks and metadata, conversion buckets,
checkpoints, result stores, workflow records) removes what its failed write left (a half
chunk, a temporary file, a staging store) and raises ``disk_full_error(exc, path, ...)``; an
outer layer that knows more (the whole output's estimated size) calls it again on the inner
error, which keeps the inner path and the larger figures. ``tfooc`` prints the message as one
``tfooc: error:`` line and exits with status 1.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from typing import Callable, Iterator

from .errors import DiskFullError

DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e is not None)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-space or out-of-quota error (a :class:`DiskFullError` too)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes (for this user) on the file system holding ``path`` or its nearest existing
    parent; None for URLs or when it cannot be found out."""
    p = str(path)
    if "://" in p and not p.startswith("file://"):
        return None
    p = os.path.abspath(p[len("file://") :] if p.startswith("file://") else p)
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    try:
        return int(shutil.disk_usage(p).free)
    except OSError:
        return None


def disk_full_error(
    exc: OSError, path: str | os.PathLike | None, *, needed: int | None = None, total: int | None = None
) -> DiskFullError:
    """A :class:`DiskFullError` for the disk-full ``exc`` (check :func:`is_disk_full` first).

    ``path``: the file or store being written (ignored when ``exc`` already is a
    ``DiskFullError``, whose path is the more precise one). ``needed``: bytes still to write,
    at least the failed write; ``total``: the whole output's estimated size. The larger of the
    given and the inner figures are kept; free space is measured now, so call this after the
    failed write's leftovers are removed."""
    inner = exc if isinstance(exc, DiskFullError) else None
    where = (
        inner.path
        if inner is not None
        else (str(path) if path is not None else getattr(exc, "filename", None) or "a file it did not name")
    )
    figures = [x for x in (needed, inner.needed if inner else None) if x is not None]
    need = max(figures) if figures else None
    totals = [x for x in (total, inner.total if inner else None) if x is not None]
    tot = max(totals) if totals else None
    if tot is not None and need is not None and tot < need:
        tot = need
    return DiskFullError(where, need, tot, free_bytes(where), exc.errno)


@contextmanager
def disk_writes(
    path: str | os.PathLike,
    *,
    needed: int | Callable[[], int | None] | None = None,
    total: int | None = None,
    cleanup: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Within the block, a disk-full ``OSError`` runs ``cleanup`` (errors in it ignored) and
    becomes a :class:`DiskFullError` for ``path`` (``needed`` may be a callable, evaluated then)."""
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        if cleanup is not None:
            try:
                cleanup()
            except Exception:
                pass
        raise disk_full_error(exc, path, needed=needed() if callable(needed) else needed, total=total) from exc
