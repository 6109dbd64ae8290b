"""Locations in a workflow: local paths and fsspec URLs under a storage root.

Every file the workflow machinery itself writes (run records, logs, locks, output fingerprints)
goes through fsspec, so a storage root may be a local folder or any fsspec URL (``s3://``,
``gcs://``, ``memory://`` in one process). Local paths are made absolute, so a driver running on a
Dask worker with another working directory sees the same files.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
import uuid
from collections.abc import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..disk import disk_writes

GLOB_CHARS = set("*?[")


def is_url(location: str) -> bool:
    """True for ``proto://...`` (``file://`` URLs are turned into local paths by :func:`normalize`)."""
    return "://" in location


def normalize(location: str, base: str | None = None) -> str:
    """An absolute local path or a normalized URL; relative locations are joined to ``base``."""
    location = str(location)
    location = location.removeprefix("file://")
    if is_url(location):
        proto, rest = location.split("://", 1)
        lead = "/" if rest.startswith("/") else ""
        rest = posixpath.normpath(rest) if rest else ""
        rest = "" if rest == "." else rest.lstrip("/")
        return f"{proto}://{lead}{rest}"
    location = os.path.expanduser(location)
    if base is not None and not os.path.isabs(location):
        return join(base, location)
    return os.path.abspath(location)


def join(root: str, relative: str) -> str:
    """``relative`` under ``root`` (which is normalized already)."""
    if is_url(root):
        return normalize(root.rstrip("/") + "/" + relative)
    return os.path.normpath(os.path.join(root, relative))


def is_under(location: str, root: str) -> bool:
    """True when normalized ``location`` is ``root`` or inside it."""
    if is_url(location) != is_url(root):
        return False
    if is_url(root):
        r = root.rstrip("/")
        return location == r or location.startswith(r + "/")
    try:
        return os.path.commonpath([location, root]) == root
    except ValueError:  # different drives
        return False


def has_glob(location: str) -> bool:
    return any(c in GLOB_CHARS for c in location)


def fs_of(location: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(location)


def is_local(location: str) -> bool:
    return not is_url(location)


def exists(location: str) -> bool:
    fs, p = fs_of(location)
    return bool(fs.exists(p))


def isdir(location: str) -> bool:
    fs, p = fs_of(location)
    return bool(fs.isdir(p))


def info(location: str) -> dict:
    fs, p = fs_of(location)
    return fs.info(p)


def listdir(location: str) -> list[str]:
    """Names (not paths) of the entries of a folder; [] when it does not exist."""
    fs, p = fs_of(location)
    if not fs.exists(p):
        return []
    return sorted(posixpath.basename(e.rstrip("/")) for e in fs.ls(p, detail=False))


def glob(pattern: str) -> list[str]:
    """Locations matching a glob, in the same form (local or URL) as ``pattern``."""
    fs, p = fs_of(pattern)
    found = sorted(fs.glob(p))
    if is_url(pattern):
        proto = pattern.split("://", 1)[0]
        return [normalize(f"{proto}://{f}") for f in found]
    return [os.path.abspath(f) for f in found]


def child(location: str, name: str) -> str:
    return join(location, name)


def makedirs(location: str) -> None:
    fs, p = fs_of(location)
    fs.makedirs(p, exist_ok=True)


def read_bytes(location: str) -> bytes:
    fs, p = fs_of(location)
    with fs.open(p, "rb") as f:
        return f.read()


def read_text(location: str) -> str:
    return read_bytes(location).decode()


def write_bytes(location: str, data: bytes) -> None:
    """Write atomically where the file system allows it (a local rename), else in one put. A full
    disk raises :class:`~tensorflow_ooc.errors.DiskFullError` naming the file, and leaves no
    temporary file."""
    fs, p = fs_of(location)
    parent = posixpath.dirname(p) if not isinstance(fs, LocalFileSystem) else os.path.dirname(p)
    with disk_writes(location, needed=len(data)):
        if parent:
            fs.makedirs(parent, exist_ok=True)
        if isinstance(fs, LocalFileSystem):
            tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, p)  # readers never see a half-written record
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
        else:
            # object stores publish a whole object per put; other fsspec file systems are best effort
            with fs.open(p, "wb") as f:
                f.write(data)


def write_text(location: str, text: str) -> None:
    write_bytes(location, text.encode())


def create_exclusive(location: str, data: bytes) -> bool:
    """Create a file only if it does not exist; True when this call created it.

    Local files use ``O_CREAT | O_EXCL`` (atomic). Other file systems have no portable exclusive
    create, so the file is written after an existence check and read back: two writers racing in
    the same instant on an object store may both believe they won; the lock documents this.
    """
    fs, p = fs_of(location)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(p), exist_ok=True)
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        # a full disk: no empty or torn file stays behind to look like a lock
        with disk_writes(p, needed=len(data), cleanup=lambda: os.remove(p)):
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return True
    if fs.exists(p):
        return False
    write_bytes(location, data)
    return read_bytes(location) == data


def append_text(location: str, text: str) -> None:
    """Append to a text file (local: a real append; elsewhere: read, extend, rewrite)."""
    fs, p = fs_of(location)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(p), exist_ok=True)
        data = text.encode("utf-8")
        with disk_writes(p, needed=len(data)):
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                except OSError:
                    os.ftruncate(fd, start)  # no torn line at the end (a full disk)
                    raise
            finally:
                os.close(fd)
        return
    old = read_text(location) if fs.exists(p) else ""
    write_text(location, old + text)


def remove(location: str) -> None:
    fs, p = fs_of(location)
    if fs.exists(p):
        fs.rm(p, recursive=True)


@contextlib.contextmanager
def local_copy(location: str, suffix: str = "") -> Iterator[str]:
    """A local path holding the file at ``location`` (the path itself when it is local)."""
    if is_local(location):
        yield location
        return
    with tempfile.TemporaryDirectory(prefix="tfooc-") as d:
        local = os.path.join(d, "input" + suffix)
        fs, p = fs_of(location)
        fs.get(p, local)
        yield local


@contextlib.contextmanager
def local_target(location: str, suffix: str = "") -> Iterator[str]:
    """A local path to write; on success its file is moved or uploaded to ``location``.

    Local targets are written under a hidden sibling name and renamed into place, so a failed
    step never leaves a half-written output.
    """
    if is_local(location):
        os.makedirs(os.path.dirname(location) or ".", exist_ok=True)
        # the hidden name keeps the final suffix: writers choose gzip or npz by it
        tmp = os.path.join(os.path.dirname(location), f".partial-{uuid.uuid4().hex[:8]}-{os.path.basename(location)}")
        try:
            yield tmp
            os.replace(tmp, location)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    with tempfile.TemporaryDirectory(prefix="tfooc-") as d:
        local = os.path.join(d, posixpath.basename(location.rstrip("/")) or "output" + suffix)
        yield local
        fs, p = fs_of(location)
        parent = posixpath.dirname(p)
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.put(local, p)
