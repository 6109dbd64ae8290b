"""Where a workflow may read and write: the storage root, the paths the spec and the operator allow,
and the confinement test every location passes."""

from __future__ import annotations

import os

from . import locations as loc
from .errors import Problem, SpecError
from .spec_source import read_source


def default_storage() -> str:
    return os.environ.get("TFOOC_STORAGE", "storage")


ALLOW_ENV = "TFOOC_ALLOW_PATHS"


CONFIG_ENV = "TFOOC_CONFIG"


def config_path() -> str:
    """The operator's config file: ``$TFOOC_CONFIG``, else ``$XDG_CONFIG_HOME/tfooc/config.yaml``
    (``~/.config/tfooc/config.yaml``)."""
    if os.environ.get(CONFIG_ENV):
        return os.path.abspath(os.path.expanduser(os.environ[CONFIG_ENV]))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "tfooc", "config.yaml")


def _config_allow_paths() -> list[tuple[str, str]]:
    """``allow_paths`` of the operator's config file ([] when there is none; ``$TFOOC_CONFIG``
    naming a missing file is an error)."""
    path = config_path()
    if not os.path.exists(path):
        if os.environ.get(CONFIG_ENV):
            raise SpecError(path, [Problem(None, None, f"no such config file (${CONFIG_ENV})")])
        return []
    with open(path, encoding="utf-8") as f:
        if not f.read().strip():
            return []
    src = read_source(path)
    unknown = [k for k in src.data if k != "allow_paths"]
    problems = [Problem(src.line((k,)), str(k), "unknown key (expected: allow_paths)") for k in unknown]
    entries = src.data.get("allow_paths") or []
    if not isinstance(entries, list):
        problems.append(Problem(src.line(("allow_paths",)), "allow_paths", "expected a list of folders or URLs"))
        entries = []
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, str) or not (loc.is_url(e) or os.path.isabs(os.path.expanduser(e))):
            problems.append(
                Problem(
                    src.line(("allow_paths", i)), f"allow_paths.{i}", f"expected an absolute path or a URL, got {e!r}"
                )
            )
            continue
        out.append((loc.normalize(e), f"{path}, line {src.line(('allow_paths', i))}"))
    if problems:
        raise SpecError(path, problems)
    return out


def operator_allow_paths(
    allow_paths: list[str] | tuple[str, ...] | None = None, *, environment: bool = True
) -> list[tuple[str, str]]:
    """Folders or URLs besides the storage root that the operator lets specs use, each with where
    it was given: ``allow_paths`` (``tfooc run/submit --allow-path``), and with ``environment``
    also ``$TFOOC_ALLOW_PATHS`` (``os.pathsep``-separated) and ``allow_paths`` in the config file
    (:func:`config_path`). A spec never widens this: its own ``allow_paths`` may only pick folders
    inside these (or inside the storage root)."""
    out = [(loc.normalize(a), "--allow-path") for a in (allow_paths or ()) if str(a).strip()]
    if environment:
        env = os.environ.get(ALLOW_ENV, "")
        out += [(loc.normalize(a), f"${ALLOW_ENV}") for a in env.split(os.pathsep) if a.strip()]
        out += _config_allow_paths()
    seen: set[str] = set()
    return [(a, w) for a, w in out if not (a in seen or seen.add(a))]


def real_location(location: str) -> str:
    """Where a location really is: local paths with every symbolic link resolved (as far as the
    path exists), URLs as they are."""
    return location if loc.is_url(location) else os.path.realpath(location)


def confined(location: str, allowed: list[str]) -> bool:
    """Is ``location``, symbolic links resolved, inside one of the ``allowed`` roots (also resolved)?"""
    real = real_location(location)
    return any(loc.is_under(real, real_location(a)) for a in allowed)


def _resolve(raw: str, root: str) -> str:
    return loc.normalize(raw, base=root)
