"""What a path really holds, and the two rules every writer follows before it writes there.

- **Outputs never touch inputs.** :func:`refuse_overlap` refuses an output, checkpoint or
  temporary path that is, contains or lies inside one of the run's inputs, compared after
  symlinks and ``..`` are resolved (:func:`canonical`), whatever ``overwrite`` says.
- **Overwriting replaces only what this package wrote.** :func:`holding` recognises this
  package's own outputs by their metadata (a tensor store, a dense array, a result, a checkpoint,
  a versioned store, a generated ``.tns`` file); :func:`check_replaceable` refuses anything else
  (an ordinary file, a folder holding other things) with a line saying what is there.

Nothing here writes; :mod:`.output_claim` puts the rules and the output locks together.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import zipfile
from dataclasses import dataclass

import fsspec

from ..errors import DestinationError
from .metadata import META_KEY  # the attribute every Zarr output of this package carries

VERSIONS_FORMAT = "tfooc-store-versions"
GENERATED_TNS_HEADER = b"# tensorflow_ooc synthetic"
_FACTOR_MEMBER = re.compile(r"^(weights|factor\d+|core(_factor)?\d*)\.npy$")

# result and checkpoint formats by what they are called in messages
_FORMATS = {
    "blco": "a tensor store (BLCO)",
    "cp-result": "a CP result",
    "tucker-result": "a Tucker result",
    "tt-result": "a tensor-train result",
    "fasttucker-result": "a tensor-completion result",
    "tucker-checkpoint": "a Tucker checkpoint",
    "tt-checkpoint": "a tensor-train checkpoint",
    "cp-apr": "a CP-APR checkpoint",
}


@dataclass(frozen=True)
class Holding:
    """What a path holds: ``kind`` (``"nothing"``, ``"store"``, ``"dense"``, ``"result"``,
    ``"checkpoint"``, ``"factors"``, ``"versions"``, ``"tns"``, ``"empty"``, ``"file"`` or ``"folder"``), whether
    this package wrote it, and a phrase for messages ("a CP result written by tensorflow_ooc")."""

    kind: str
    ours: bool
    text: str


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def canonical(path: str | os.PathLike) -> str:
    """The location ``path`` names, comparable with others: local paths absolute with symlinks
    and ``..`` resolved (also where the last parts do not exist yet), URLs with ``..`` and
    repeated or trailing slashes folded."""
    text = os.fspath(path)
    if _is_url(text):
        protocol, rest = text.split("://", 1)
        rest = posixpath.normpath("/" + rest).lstrip("/") if rest else rest
        return f"{protocol.lower()}://{rest}"
    return os.path.realpath(os.path.abspath(_local(text)))


def overlap(output: str | os.PathLike, input_: str | os.PathLike) -> str | None:
    """How ``output`` meets ``input_``: ``"is"``, ``"contains"`` (the input lies inside the output),
    ``"inside"`` (the output lies inside the input), or None."""
    a, b = canonical(output), canonical(input_)
    if a == b:
        return "is"
    sep = "/" if _is_url(a) else os.sep
    if b.startswith(a.rstrip(sep) + sep):
        return "contains"
    if a.startswith(b.rstrip(sep) + sep):
        return "inside"
    return None


def refuse_overlap(outputs: dict[str, str | os.PathLike | None], inputs: dict[str, str | os.PathLike | None]) -> None:
    """Raise :class:`DestinationError` if any output (name -> path: ``"out"``, ``"checkpoint"``,
    ...) is, contains or lies inside any input. None entries are skipped."""
    for oname, out in outputs.items():
        if out is None:
            continue
        for iname, inp in inputs.items():
            if inp is None:
                continue
            how = overlap(out, inp)
            if how is None:
                continue
            where = {
                "is": "is the input",
                "contains": "contains the input",
                "inside": "lies inside the input",
            }[how]
            raise DestinationError(
                f"{out}: the {oname} path {where} {iname} {inp}; writing there would destroy it "
                f"(overwrite does not change this): choose another {oname} path"
            )


def _read_bytes(fs, p: str, limit: int | None = None) -> bytes | None:
    try:
        with fs.open(p, "rb") as f:
            return f.read(limit) if limit else f.read()
    except (OSError, ValueError):
        return None


def _json_at(fs, p: str) -> dict | None:
    """The JSON object in file ``p``, None when there is none (missing, unreadable, not an object)."""
    raw = _read_bytes(fs, p)
    try:
        found = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _zarr_holding(meta: dict) -> Holding:
    attrs = meta.get("attributes") or {}
    ours = attrs.get(META_KEY) if isinstance(attrs, dict) else None
    node = meta.get("node_type", "node")
    if not isinstance(ours, dict):
        return Holding("folder", False, f"a Zarr {node} not written by tensorflow_ooc")
    fmt = ours.get("format")
    if fmt == "blco":
        return Holding("store", True, "a tensor store (BLCO) written by tensorflow_ooc")
    if isinstance(fmt, str):
        return Holding("result", True, f"{_FORMATS.get(fmt, f'a {fmt} result')} written by tensorflow_ooc")
    if node == "array":
        return Holding("dense", True, "a dense array written by tensorflow_ooc")
    return Holding("folder", False, f"a Zarr {node} not written by tensorflow_ooc")


def _npz_holding(fs, p: str) -> Holding | None:
    """A checkpoint of this package: an .npz whose ``meta`` member is JSON with a version."""
    try:
        with fs.open(p, "rb") as f, zipfile.ZipFile(f) as z:
            names = z.namelist()
            if "meta.npy" not in names:
                # the planted model beside a generated tensor, or an npz export: weights and factors
                if "weights.npy" in names and all(_FACTOR_MEMBER.match(n) for n in names):
                    return Holding("factors", True, "a factor file (weights, factors) written by tensorflow_ooc")
                return None
            raw = z.read("meta.npy")
    except (OSError, ValueError, zipfile.BadZipFile):
        return None
    # an .npy of uint8: the JSON text follows a header that ends in a newline
    body = raw[raw.find(b"\n") + 1 :] if raw.startswith(b"\x93NUMPY") else b""
    try:
        meta = json.loads(body.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(meta, dict) or "version" not in meta:
        return None
    fmt = meta.get("format")
    what = _FORMATS.get(fmt, "a checkpoint") if fmt else "a CP-ALS checkpoint"
    return Holding("checkpoint", True, f"{what} written by tensorflow_ooc")


def holding(path: str | os.PathLike) -> Holding:
    """What ``path`` (local or URL) holds now; never raises for a missing or unreadable path."""
    text = os.fspath(path)
    try:
        fs, p = fsspec.core.url_to_fs(text)
        if not fs.exists(p):
            return Holding("nothing", False, "nothing")
        if fs.isfile(p):
            size = fs.size(p) or 0
            found = _npz_holding(fs, p)
            if found is not None:
                return found
            if (_read_bytes(fs, p, len(GENERATED_TNS_HEADER)) or b"") == GENERATED_TNS_HEADER:
                return Holding("tns", True, "a tensor file generated by tensorflow_ooc")
            return Holding("file", False, f"an ordinary file ({size:,} bytes) not written by tensorflow_ooc")
        meta = _json_at(fs, posixpath.join(p, "zarr.json"))
        if meta is not None:
            return _zarr_holding(meta)
        listing = _json_at(fs, posixpath.join(p, "versions.json"))
        if listing is not None and listing.get("format") == VERSIONS_FORMAT:
            return Holding("versions", True, "a versioned tensor store written by tensorflow_ooc")
        names = sorted(posixpath.basename(e.rstrip("/")) for e in fs.ls(p, detail=False))
        names = [n for n in names if n and n != posixpath.basename(p.rstrip("/"))]
        if not names:
            return Holding("empty", False, "an empty folder")
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return Holding(
            "folder", False, f"a folder holding {len(names)} {'entry' if len(names) == 1 else 'entries'} ({shown})"
        )
    except (OSError, ValueError) as exc:
        return Holding("file", False, f"something this process cannot read ({exc})")


def check_replaceable(path: str | os.PathLike, role: str = "output") -> Holding:
    """Refuse (:class:`DestinationError`) to replace ``path`` unless it holds nothing, an empty
    folder, or an output of this package; returns what it holds."""
    h = holding(path)
    if h.kind in ("nothing", "empty") or h.ours:
        return h
    raise DestinationError(
        f"{os.fspath(path)}: the {role} path holds {h.text}; overwrite replaces only what "
        f"tensorflow_ooc wrote, so it is left as it is: choose another {role} path"
    )
