"""Store locations: local paths (written atomically by rename) or fsspec URLs."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import fsspec

from .destinations import check_replaceable


def is_url(path: str | os.PathLike) -> bool:
    s = str(path)
    return "://" in s and not s.startswith("file://")


def local_path(path: str | os.PathLike) -> Path:
    s = str(path)
    return Path(s[len("file://") :] if s.startswith("file://") else s)


def read_options(path: str | os.PathLike) -> dict:
    """Keyword arguments for ``zarr.open_group(path, mode="r", ...)`` of a store written by this
    package: Zarr v3 named (no probing for v2 metadata, four requests an open in object storage)
    and, for S3, whole-object reads in one request (s3fs otherwise asks for each object's size
    first, to split large objects into parallel ranged reads: twice the requests for the small
    metadata objects and chunks of a store; chunk reads run in parallel anyway)."""
    if not is_url(path):
        return {}
    protocol = str(path).split("://", 1)[0].lower()
    options: dict = {"zarr_format": 3}
    if protocol in ("s3", "s3a"):
        options["storage_options"] = {"max_concurrency": 1}
    return options


def exists(path: str | os.PathLike) -> bool:
    if is_url(path):
        fs, p = fsspec.core.url_to_fs(str(path))
        return fs.exists(p)
    return local_path(path).exists()


def remove(path: str | os.PathLike) -> None:
    if is_url(path):
        fs, p = fsspec.core.url_to_fs(str(path))
        if fs.exists(p):
            fs.rm(p, recursive=True)
        return
    p = local_path(path)
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


def staging_path(final: str | os.PathLike) -> str:
    """Where to write before publishing: a hidden sibling for local paths, the URL itself otherwise.

    URLs have no portable atomic rename, so for them the store is written in place and only the
    ``complete`` flag, written last, makes it openable.
    """
    if is_url(final):
        return str(final)
    from ..tempdirs import owner_suffix

    p = local_path(final).absolute()
    p.parent.mkdir(parents=True, exist_ok=True)
    # host and pid in the name: the next run into this folder removes it if this process dies
    return str(p.parent / f".{p.name}.partial-{owner_suffix()}-{uuid.uuid4().hex[:12]}")


def publish(staging: str, final: str | os.PathLike, overwrite: bool) -> None:
    """Move a finished local store into place atomically."""
    if is_url(final):
        return
    dest = local_path(final).absolute()
    if dest.exists() or dest.is_symlink():
        if not overwrite:
            raise FileExistsError(dest)
        check_replaceable(dest)  # whatever appeared there while the store was written
        trash = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:12]}"
        os.replace(dest, trash)
        os.replace(staging, dest)
        remove(trash)
    else:
        os.replace(staging, dest)


@contextmanager
def staged(final: str | os.PathLike, overwrite: bool, exists_error: Exception) -> Iterator[str]:
    """Write a whole store or array at ``final``: yields the staging path to write to, published
    at ``final`` when the block ends and removed (locally) when it raises, so that a half-written
    result never opens as valid. ``exists_error`` is raised, before anything is written, when
    ``final`` exists and ``overwrite`` is false; an existing URL is removed first (no rename)."""
    final = str(final)
    if exists(final):
        check_replaceable(final)  # only what this package wrote is ever replaced
        if not overwrite:
            raise exists_error
    if is_url(final) and exists(final):
        remove(final)
    staging = staging_path(final)
    try:
        yield staging
        publish(staging, final, overwrite)
    except BaseException:
        if not is_url(final):
            remove(staging)
        raise


def disk_bytes(path: str | os.PathLike) -> int:
    """Bytes the store occupies."""
    if is_url(path):
        fs, p = fsspec.core.url_to_fs(str(path))
        return int(sum(fs.du(p, total=False).values())) if fs.exists(p) else 0
    total = 0
    for root, _, files in os.walk(local_path(path)):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


# a versioned store: a folder of versions (v000001.zarr, ...) listed in this file, which a
# workflow's convert step with ``append: true`` writes last, after the version it adds
VERSIONS_FILE = "versions.json"
_VERSION_SUFFIX = re.compile(r"^(?P<folder>.+)@v?(?P<number>\d+)$")


def resolve_version(path: str | os.PathLike) -> str:
    """The store a location names: ``path`` itself, or for a versioned store folder (one holding
    ``versions.json``) its latest version, and for ``FOLDER@vN`` (or ``FOLDER@N``) version N.

    Raises
    ------
    StoreError
        ``@vN`` on a folder that is not a versioned store, a version it does not hold (the
        message lists those it holds), or a versioned store with no version yet.

    Examples
    --------
    >>> resolve_version("storage/quickstart.zarr")  # not a versioned folder: as given
    'storage/quickstart.zarr'
    """
    from ..errors import StoreError

    text = str(path)
    m = _VERSION_SUFFIX.match(text)
    if m is not None and not exists(text):  # a store whose own name ends in @3 stays itself
        folder, number = m.group("folder"), int(m.group("number"))
    else:
        folder, number = text, None
    listing = folder.rstrip("/") + "/" + VERSIONS_FILE
    if not exists(listing):
        if number is not None:
            raise StoreError(
                f"{text}: {folder} is not a versioned store (no {VERSIONS_FILE}), so it has no version {number}"
            )
        return text
    with fsspec.open(listing if is_url(listing) else str(local_path(listing)), "rt") as f:
        versions = json.load(f).get("versions") or []
    if not versions:
        raise StoreError(f"{folder}: versioned store has no version yet ({listing} lists none)")
    if number is None:
        chosen = versions[-1]
    else:
        chosen = next((v for v in versions if v.get("version") == number), None)
        if chosen is None:
            held = ", ".join(f"v{v.get('version')}" for v in versions)
            raise StoreError(f"{text}: {folder} holds no version {number} (it holds {held})")
    return folder.rstrip("/") + "/" + chosen["path"]
