"""One writer per output: a lock file beside each output, taken before a run writes anything.

The lock of ``DIR/NAME`` is ``DIR/.NAME.tfooc-lock``, a small JSON file naming the holder (what
it is doing, host, PID, user, when it started) and a heartbeat the holder refreshes every
``HEARTBEAT_S`` seconds. A second writer is refused at once with the holder's details. A lock
left by a dead process is taken over: at once when the holder ran on this host and its PID is
gone (or now belongs to a younger process), else when its heartbeat is older than
:func:`stale_seconds` (``$TFOOC_LOCK_STALE_S``, default 60), as workflow locks are.

Local locks are created with ``O_EXCL``, atomic on local disks (and on NFS v3 and later). On
object stores there is no exclusive create: a lock is an existence check, a write and a
read-back, which two writers starting in the same instant could both pass; give concurrent runs
distinct outputs there.

A thread that holds a lock may take it again (a run restarted after a lost worker re-enters its
driver); the lock goes when the outermost holder releases it.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid

import fsspec
import psutil
from fsspec.implementations.local import LocalFileSystem

from ..errors import OutputLockedError
from .destinations import canonical

log = logging.getLogger(__name__)

LOCK_SUFFIX = ".tfooc-lock"
HEARTBEAT_S = 10.0

# lock file -> [token, depth, thread id] for the locks this process holds
_held: dict[str, list] = {}
_held_guard = threading.Lock()


def stale_seconds() -> float:
    """Seconds without a heartbeat after which another host's lock counts as abandoned."""
    return float(os.environ.get("TFOOC_LOCK_STALE_S", "60"))


def lock_path(output: str | os.PathLike) -> str:
    """The lock file of ``output``: a hidden sibling."""
    c = canonical(output)
    if "://" not in c:
        parent, name = os.path.split(c.rstrip(os.sep))
        return os.path.join(parent, f".{name}{LOCK_SUFFIX}")
    protocol, rest = c.split("://", 1)
    parent, _, name = rest.rstrip("/").rpartition("/")  # memory://x has no parent folder
    return f"{protocol}://{parent + '/' if parent else ''}.{name}{LOCK_SUFFIX}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


def _read(fs, p: str) -> dict | None:
    try:
        with fs.open(p, "rb") as f:
            d = json.loads(f.read())
        return d if isinstance(d, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable or torn: held until stale by its age


def _create(fs, p: str, data: bytes) -> bool:
    """Create ``p`` holding ``data`` unless it exists; True if this call created it."""
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(p), exist_ok=True)
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    if fs.exists(p):
        return False
    fs.pipe_file(p, data)
    return _read(fs, p) == json.loads(data)


def _why_stale(d: dict, p: str, fs) -> str | None:
    """Why the lock ``d`` may be taken over (None: its holder may still be writing)."""
    age = time.time() - float(d.get("heartbeat") or 0)
    if d.get("host") == socket.gethostname() and isinstance(d.get("pid"), int):
        try:
            proc = psutil.Process(d["pid"])
            if proc.create_time() > float(d.get("started") or 0) + 1.0:
                return f"PID {d['pid']} now belongs to another process"
        except psutil.NoSuchProcess:
            return f"PID {d['pid']} is no longer running"
        except psutil.AccessDenied:
            pass
        return None
    if not d:
        try:
            age = time.time() - float(fs.info(p).get("mtime") or 0)
        except (OSError, TypeError, ValueError):
            age = 0.0
    if age > stale_seconds():
        return f"its heartbeat is {age:.0f} s old (more than {stale_seconds():.0f} s)"
    return None


def _holder_text(d: dict) -> str:
    if not d:
        return "another run (its lock file is unreadable)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(d.get("started") or 0)))
    who = d.get("purpose", "another run")
    return f"{who} (host {d.get('host')}, PID {d.get('pid')}, user {d.get('user')}, since {since})"


class OutputLock:
    """Exclusive locks on ``outputs`` for the life of a ``with`` block (see the module doc)."""

    def __init__(self, outputs: list[str | os.PathLike], purpose: str) -> None:
        # in the order given: a refusal names the first output (the result before its checkpoint)
        self.files = list({lock_path(o): os.fspath(o) for o in outputs}.items())
        self.purpose = purpose
        self.token = uuid.uuid4().hex
        self.taken: list[str] = []
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _payload(self, started: float) -> bytes:
        return json.dumps(
            {
                "purpose": self.purpose,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "user": _user(),
                "started": started,
                "heartbeat": time.time(),
                "token": self.token,
            }
        ).encode()

    def acquire(self) -> list[tuple[str, str]]:
        """Take every lock; returns (lock file, why) for stale locks taken over. Raises
        :class:`OutputLockedError`, keeping nothing, when a live writer holds one."""
        taken_over: list[tuple[str, str]] = []
        self.started = time.time()
        try:
            for path, output in self.files:
                with _held_guard:
                    mine = _held.get(path)
                    if mine is not None and mine[2] == threading.get_ident():
                        mine[1] += 1
                        self.taken.append(path)
                        continue
                fs, p = fsspec.core.url_to_fs(path)
                for _ in range(3):
                    try:
                        created = _create(fs, p, self._payload(self.started))
                    except OSError as exc:  # a read-only or forbidden folder: named as the output's
                        raise OSError(exc.errno, exc.strerror, f"{output} (in {os.path.dirname(p)})") from None
                    if created:
                        break
                    d = _read(fs, p)
                    if d is None:
                        continue  # released in between
                    why = None if d.get("token") in {h[0] for h in _held.values()} else _why_stale(d, p, fs)
                    if why is None:
                        raise OutputLockedError(
                            f"{output} is being written by {_holder_text(d)}; wait for it to finish or "
                            f"choose another output (a lock left by a process that died is taken over "
                            f"after {stale_seconds():.0f} s without a heartbeat; lock file {path})"
                        )
                    fs.rm(p)
                    taken_over.append((path, why))
                    log.warning("took over the lock of %s from %s: %s", output, _holder_text(d), why)
                else:
                    raise OutputLockedError(f"{output}: could not take its lock {path} (another run keeps taking it)")
                with _held_guard:
                    _held[path] = [self.token, 1, threading.get_ident()]
                self.taken.append(path)
        except BaseException:
            self.release()
            raise
        if any(_held[f][0] == self.token for f in self.taken if f in _held):
            self._beat = threading.Thread(target=self._heartbeat, name="tfooc-output-lock", daemon=True)
            self._beat.start()
        return taken_over

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for path in list(self.taken):
                with _held_guard:
                    if _held.get(path, [None])[0] != self.token:
                        continue
                try:
                    fs, p = fsspec.core.url_to_fs(path)
                    d = _read(fs, p)
                    if d and d.get("token") == self.token:
                        fs.pipe_file(p, self._payload(float(d.get("started") or self.started)))
                except Exception:  # a missed beat only makes the lock look older
                    pass

    def release(self) -> None:
        self._stop.set()
        for path in reversed(self.taken):
            with _held_guard:
                mine = _held.get(path)
                if mine is None:
                    continue
                mine[1] -= 1
                if mine[1] > 0:
                    continue
                del _held[path]
            try:
                fs, p = fsspec.core.url_to_fs(path)
                d = _read(fs, p)
                if d is not None and d.get("token") == mine[0]:
                    fs.rm(p)
            except (OSError, FileNotFoundError):
                pass
        self.taken = []

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
