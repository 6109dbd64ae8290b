"""Temporary files of conversions, and the ones killed runs left behind.

A conversion or ``write_tns`` that is killed (SIGKILL, power loss, out of memory) cannot clean up:
its bucket folder (gigabytes), its ``.partial`` text file or its half-written store stays beside
the output. Every temporary name therefore carries its owner, host and process id, and the next
run into the same folder looks at what is there:

- owner on this host and no longer running (or its pid now belongs to a process started after
  the entry was last written): removed, with a log line;
- owner still running, or on another host: kept and reported (it may be a conversion in
  progress, perhaps on a shared file system);
- no owner in the name (made by versions before owners were recorded): removed when nothing in
  it changed for ``LEGACY_STALE_SECONDS``, else reported.

Names:

- bucket folders ``.tfooc-buckets-<host>-<pid>-<tag>/`` (with ``owner.json`` inside),
- text files ``<name>.partial-<host>-<pid>``,
- staging stores ``.<name>.partial-<host>-<pid>-<tag>/`` and replaced stores ``.<name>.old-<tag>/``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

BUCKETS_PREFIX = ".tfooc-buckets-"
OWNER_FILE = "owner.json"
LEGACY_STALE_SECONDS = 3600.0

_HOST_SAFE = re.compile(r"[^A-Za-z0-9_.]")
# .tfooc-buckets-<host>-<pid>-<tag>; legacy .tfooc-buckets-<random> (tempfile.mkdtemp)
_BUCKETS = re.compile(r"^\.tfooc-buckets-(?:(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-)?(?P<tag>[A-Za-z0-9_]+)$")
# <name>.partial-<host>-<pid>[-<tag>] (staging stores start with a dot)
_PARTIAL = re.compile(r"^(?P<base>.+)\.partial-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)(?:-(?P<tag>[0-9a-f]+))?$")
# before owners were recorded: <name>.tns[.gz].partial-<pid> (write_tns, this host) and
# .<name>.partial-<hex12>/ (staging stores, no owner)
_LEGACY_TNS = re.compile(r"^.+\.tns(?:\.gz)?\.partial-(?P<pid>\d+)$")
_LEGACY_STAGING = re.compile(r"^\..+\.partial-[0-9a-f]{12}$")
_OLD = re.compile(r"^\..+\.old-[0-9a-f]{12}$")
_LABELS = {"buckets": "temporary bucket folder", "partial": "partial output", "old": "replaced store"}


def host_tag() -> str:
    """This host's name as it appears in temporary names (letters, digits, '_' and '.')."""
    return _HOST_SAFE.sub("_", socket.gethostname()) or "host"


def owner_suffix() -> str:
    """``<host>-<pid>``: the owner part of this process's temporary names."""
    return f"{host_tag()}-{os.getpid()}"


def make_bucket_dir(parent: str | None, target: str) -> str:
    """Create this process's bucket folder under ``parent`` (None: the system temp dir), with an
    ``owner.json`` that records pid, host, process start time and the output it is for."""
    from .disk import disk_writes

    parent = parent or tempfile.gettempdir()
    path = os.path.join(parent, f"{BUCKETS_PREFIX}{owner_suffix()}-{uuid.uuid4().hex[:8]}")
    owner = {
        "pid": os.getpid(),
        "host": host_tag(),
        "process_started": psutil.Process().create_time(),
        "created": time.time(),
        "target": str(target),
    }
    # a full disk: no folder is left behind
    with disk_writes(path, needed=4096, cleanup=lambda: shutil.rmtree(path, ignore_errors=True)):
        os.makedirs(parent, exist_ok=True)
        os.mkdir(path)
        with open(os.path.join(path, OWNER_FILE), "w") as f:
            json.dump(owner, f)
    return path


@dataclass
class StaleEntry:
    """A temporary file or folder left by some run, and what was done about it."""

    path: str
    kind: str  # "buckets", "partial" or "old"
    host: str | None
    pid: int | None
    nbytes: int
    action: str  # "removed" or "kept"
    reason: str


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _newest_mtime(path: Path) -> float:
    newest = path.stat().st_mtime
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                try:
                    newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
                except OSError:
                    pass
    return newest


def _owner_state(host: str | None, pid: int | None, started: float | None, path: Path) -> tuple[bool, str]:
    """(stale, reason) for an entry owned by (host, pid); ``started``: the owner's start time, if known."""
    if host is not None and host != host_tag():
        return False, f"owned by pid {pid} on host {host}, which this process cannot check"
    try:
        proc = psutil.Process(pid)
        proc_started = proc.create_time()
    except psutil.NoSuchProcess:
        return True, f"pid {pid} is no longer running"
    except psutil.AccessDenied:  # pragma: no cover - a live process of another user
        return False, f"pid {pid} is running (another user)"
    # the pid may have been reused since: a process younger than the owner (or than the entry's
    # last write) is not the owner
    if started is not None and proc_started > started + 1.0:
        return True, f"pid {pid} now belongs to a process started after the owner"
    if started is None and proc_started > _newest_mtime(path) + 1.0:
        return True, f"pid {pid} now belongs to a process started after the entry was last written"
    if pid == os.getpid():
        return False, "owned by this process"
    return False, f"pid {pid} is still running"


def _classify(path: Path) -> tuple[str, str | None, int | None, float | None] | None:
    """(kind, host, pid, owner start time) of one of our temporary names, else None."""
    name = path.name
    m = _BUCKETS.match(name)
    if m and path.is_dir():
        host, pid, started = m["host"], (int(m["pid"]) if m["pid"] else None), None
        try:
            with open(path / OWNER_FILE) as f:
                owner = json.load(f)
            host, pid, started = owner.get("host", host), int(owner["pid"]), owner.get("process_started")
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return "buckets", host, pid, started
    if _LEGACY_STAGING.match(name) and (path / "zarr.json").exists():
        return "partial", None, None, None
    m = _PARTIAL.match(name)
    if m:
        return "partial", m["host"], int(m["pid"]), None
    m = _LEGACY_TNS.match(name)
    if m and path.is_file():
        return "partial", host_tag(), int(m["pid"]), None
    if _OLD.match(name) and path.is_dir():
        return "old", None, None, None
    return None


def clean_stale(directory: str | os.PathLike | None, *, legacy_age: float = LEGACY_STALE_SECONDS) -> list[StaleEntry]:
    """Remove temporary entries of dead runs in ``directory``; report those that may be live.

    Returns what was found. Each removal logs a warning that names the entry, its size and why it
    was stale; each entry kept logs why.
    """
    if directory is None:
        return []
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for path in sorted(d.iterdir()):
        try:
            info = _classify(path)
            if info is None:
                continue
            kind, host, pid, started = info
            if pid is None:
                age = time.time() - _newest_mtime(path)
                stale = age > legacy_age
                reason = (
                    f"no owner recorded and nothing in it changed for {age / 3600:.1f} h"
                    if stale
                    else f"no owner recorded and it changed {age:.0f} s ago (removed once unchanged for "
                    f"{legacy_age / 3600:.1f} h)"
                )
            else:
                stale, reason = _owner_state(host, pid, started, path)
            nbytes = _size(path)
        except FileNotFoundError:  # its owner finished while we looked
            continue
        entry = StaleEntry(str(path), kind, host, pid, nbytes, "removed" if stale else "kept", reason)
        if stale:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            log.warning("removed stale %s %s (%s MiB): %s", _LABELS[kind], path, f"{nbytes / 2**20:,.1f}", reason)
        elif reason != "owned by this process":
            log.warning(
                "kept %s %s (%s MiB): %s; remove it by hand if that run is gone",
                _LABELS[kind],
                path,
                f"{nbytes / 2**20:,.1f}",
                reason,
            )
        found.append(entry)
    return found
