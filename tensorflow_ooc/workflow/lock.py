"""Output locks: one run at a time writes a given output.

A run takes a lock for every output of its spec before its first step and releases them when it
ends. A lock is a small JSON file under ``ROOT/.tfooc/locks/`` naming the output and the run,
created exclusively (``O_EXCL`` for local roots; on object stores an existence check, a write
and a read-back, which two writers starting in the same instant could both pass).

A lock is released by its run, and is taken over when its holder is finished or lost (its record
stopped heartbeating, see :func:`tensorflow_ooc.workflow.records.stale_after`): a driver killed by
SIGKILL cannot release anything, and its outputs must not stay locked forever. A new attempt of
the same run (a Dask retry of its driver) holds its run's locks already.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from . import locations as loc
from .errors import LockError
from .records import RunStore, host_info, now_iso, parse_iso, stale_after
from .report import shell_command


@dataclass
class Holder:
    output: str
    run_id: str
    acquired_at: str | None


class OutputLocks:
    """The locks of a storage root."""

    def __init__(self, root: str, runs: RunStore) -> None:
        self.dir = loc.join(root, ".tfooc/locks")
        self.runs = runs

    def _file(self, output: str) -> str:
        return loc.join(self.dir, hashlib.sha1(output.encode()).hexdigest()[:24] + ".json")

    def holder(self, output: str) -> Holder | None:
        f = self._file(output)
        if not loc.exists(f):
            return None
        try:
            d = json.loads(loc.read_text(f))
            return Holder(d["output"], d["run_id"], d.get("acquired_at"))
        except (ValueError, KeyError, OSError, FileNotFoundError):
            return Holder(output, "?", None)  # unreadable: treated as held until stale by age

    def _why_free(self, h: Holder) -> str | None:
        """Why a lock held by another run may be taken over (None: it may not)."""
        try:
            rec = self.runs.read(h.run_id)
        except Exception:
            age = time.time() - (parse_iso(h.acquired_at) or 0)
            return f"run {h.run_id} has no record and the lock is {age:.0f} s old" if age > stale_after() else None
        if rec.final:
            return f"run {h.run_id} is {rec.state}"
        if rec.display_state() == "lost":
            return f"run {h.run_id} stopped heartbeating at {rec.heartbeat_at} (lost)"
        return None

    def acquire(self, outputs: list[str], run_id: str) -> list[tuple[str, str]]:
        """Lock every output for ``run_id``; returns ``(previous holder, reason)`` for locks taken
        over. Raises :class:`LockError` (and keeps nothing) when another live run holds one."""
        got: list[str] = []
        taken: list[tuple[str, str]] = []
        payload = json.dumps({"run_id": run_id, "acquired_at": now_iso(), **host_info()})
        try:
            for out in sorted(set(outputs)):
                data = json.dumps({"output": out, **json.loads(payload)}).encode()
                for _ in range(3):
                    if loc.create_exclusive(self._file(out), data):
                        got.append(out)
                        break
                    h = self.holder(out)
                    if h is None:
                        continue  # released in between: try again
                    if h.run_id == run_id:
                        got.append(out)  # a new attempt of this run: it holds the lock already
                        break
                    why = self._why_free(h)
                    if why is None:
                        rec = None
                        try:
                            rec = self.runs.read(h.run_id)
                        except Exception:
                            pass
                        beat = f", last heartbeat {rec.heartbeat_at}" if rec is not None else ""
                        raise LockError(
                            f"{out} is being written by run {h.run_id} "
                            f"({rec.state if rec else 'starting'}{beat}); wait for it to finish "
                            f"({shell_command('status', h.run_id, '--storage', self.runs.root)}) or stop it "
                            f"({shell_command('cancel', h.run_id, '--storage', self.runs.root)})"
                        )
                    loc.remove(self._file(out))
                    taken.append((h.run_id, why))
                else:
                    raise LockError(f"{out}: could not take its lock (another run keeps taking it)")
        except BaseException:
            self.release(got, run_id)
            raise
        return taken

    def release(self, outputs: list[str], run_id: str) -> None:
        """Remove the locks ``run_id`` holds among ``outputs``."""
        for out in set(outputs):
            h = self.holder(out)
            if h is not None and h.run_id == run_id:
                try:
                    loc.remove(self._file(out))
                except FileNotFoundError:
                    pass
