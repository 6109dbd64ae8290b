"""Fingerprints: what a step's result depends on, and whether an output is still what a step wrote.

A step's fingerprint is a hash of its kind, its settings and the fingerprints of its inputs. A
location's fingerprint is cheap and content-sensitive where it matters:

- a Zarr store or result store: the hash of its root ``zarr.json`` (which holds a random
  ``store_id`` or a creation time and the metadata, so a rewritten store changes it); a dense
  Zarr array: also the names, sizes and times of its chunk files;
- a versioned store (``versions.json``): the hash of that file;
- a file: its size and modification time (as ``make`` does; no full read of large ``.tns``);
- a folder or a glob: the names, sizes and times of what it holds or matches.

After a step finishes, each of its outputs gets a small index entry under
``ROOT/.tfooc/outputs/`` with the step fingerprint and the output's own fingerprint. A step is up
to date when every output exists, its entry carries the step's current fingerprint, and the
output still has the fingerprint recorded then (nobody replaced it since).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from typing import Any

from . import locations as loc

FINGERPRINT_VERSION = 1
_TIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "created", "ETag", "etag", "md5Hash")


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj``."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _file_entry(info: dict) -> dict:
    stamp = next((str(info[k]) for k in _TIME_KEYS if info.get(k) is not None), None)
    return {"size": int(info.get("size") or 0), "time": stamp}


def location_fingerprint(location: str) -> dict | None:
    """Fingerprint of whatever is at ``location`` (None when nothing is)."""
    if loc.has_glob(location):
        matches = loc.glob(location)
        return {"glob": [{"name": m, **_file_entry(loc.info(m))} for m in matches]}
    fs, p = loc.fs_of(location)
    if not fs.exists(p):
        return None
    if fs.isdir(p):
        for marker in ("zarr.json", "versions.json"):
            mp = posixpath.join(p, marker) if loc.is_url(location) else f"{p.rstrip('/')}/{marker}"
            if fs.exists(mp):
                with fs.open(mp, "rb") as f:
                    text = f.read()
                out: dict[str, Any] = {marker: hashlib.sha256(text).hexdigest()}
                if marker == "zarr.json" and _is_array(text):
                    # a dense Zarr array's metadata holds no identity of its values (a BLCO store's
                    # holds a random store id): rewritten chunks must change its fingerprint too
                    chunks = [e for e in fs.find(p, detail=True).values() if not e["name"].endswith("zarr.json")]
                    out["chunks"] = sorted([posixpath.relpath(e["name"], p), *_file_entry(e).values()] for e in chunks)
                return out
        entries = []
        for e in sorted(fs.ls(p, detail=True), key=lambda e: e["name"]):
            if e.get("type") == "file":
                entries.append({"name": posixpath.basename(e["name"].rstrip("/")), **_file_entry(e)})
        return {"folder": entries}
    return {"file": _file_entry(fs.info(p))}


def _is_array(zarr_json: bytes) -> bool:
    try:
        return json.loads(zarr_json).get("node_type") == "array"
    except (ValueError, AttributeError):
        return False


def step_fingerprint(kind: str, config: dict, inputs: dict[str, dict | None]) -> str:
    """Hash of a step's kind, settings and input fingerprints."""
    return digest({"v": FINGERPRINT_VERSION, "kind": kind, "config": config, "inputs": inputs})


class OutputIndex:
    """Per-output entries under ``ROOT/.tfooc/outputs``: which step fingerprint made each output."""

    def __init__(self, root: str) -> None:
        self.dir = loc.join(root, ".tfooc/outputs")

    def _entry(self, location: str) -> str:
        return loc.join(self.dir, hashlib.sha1(location.encode()).hexdigest()[:24] + ".json")

    def read(self, location: str) -> dict | None:
        entry = self._entry(location)
        if not loc.exists(entry):
            return None
        try:
            return json.loads(loc.read_text(entry))
        except (ValueError, OSError):
            return None

    def write(self, location: str, step_fp: str, step: str, run_id: str) -> None:
        loc.write_text(
            self._entry(location),
            json.dumps(
                {
                    "output": location,
                    "step": step,
                    "step_fingerprint": step_fp,
                    "run_id": run_id,
                    "output_fingerprint": location_fingerprint(location),
                    "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=1,
            ),
        )

    def forget(self, location: str) -> None:
        loc.remove(self._entry(location))

    def why_stale(self, location: str, step_fp: str) -> str | None:
        """None when ``location`` is up to date for ``step_fp``, else the reason it is not."""
        if not loc.exists(location):
            return "output missing"
        entry = self.read(location)
        if entry is None:
            return "output not made by a workflow step (no fingerprint recorded)"
        if entry.get("step_fingerprint") != step_fp:
            return "inputs or settings changed"
        if entry.get("output_fingerprint") != location_fingerprint(location):
            return "output changed since it was written"
        return None
