"""Before a run writes: its outputs checked against its inputs and against what they hold, then locked.

Every command, API function and workflow step that writes calls :func:`claim_outputs` first, so
the three rules hold in one place: no output, checkpoint or temporary path is, contains or lies
inside an input; an existing output is replaced only if this package wrote it; one writer per
output at a time.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping

from . import paths
from .destinations import check_replaceable, refuse_overlap
from .output_lock import OutputLock

PathLike = str | os.PathLike | None


def _located(path: PathLike) -> list[str]:
    """The locations a path argument names: itself, and for ``FOLDER@vN`` or a versioned folder
    the version it resolves to."""
    if path is None:
        return []
    text = os.fspath(path)
    try:
        resolved = paths.resolve_version(text)
    except Exception:  # not a versioned name: the path as given is what is read or written
        resolved = text
    return [text] if resolved == text else [text, resolved]


def refuse_unsafe(
    outputs: Mapping[str, PathLike], inputs: Mapping[str, PathLike], temporaries: Mapping[str, PathLike] | None = None
) -> None:
    """The checks of :func:`claim_outputs` without the locks: outputs and temporary folders apart
    from inputs, and each existing output something this package wrote (or nothing, or an empty
    folder)."""
    flat_in = {}
    for name, p in inputs.items():
        for i, loc in enumerate(_located(p)):
            flat_in[name if i == 0 else f"{name} (version {loc})"] = loc
    flat_out = {name: loc for name, p in {**outputs, **(temporaries or {})}.items() for loc in _located(p)}
    refuse_overlap(flat_out, flat_in)
    for name, p in outputs.items():
        if p is not None:
            check_replaceable(p, name)


@contextmanager
def claim_outputs(
    outputs: Mapping[str, PathLike],
    inputs: Mapping[str, PathLike],
    purpose: str,
    temporaries: Mapping[str, PathLike] | None = None,
) -> Iterator[OutputLock]:
    """Check ``outputs`` (role -> path: ``{"out": ..., "checkpoint": ...}``) and ``temporaries``
    (folders a run writes temporary files into) against ``inputs`` (role -> path) and the outputs
    against what they hold, then hold a lock on each output for the block. Roles name the
    arguments in messages: API keywords (``out``) or CLI flags (``--out``).

    Raises
    ------
    DestinationError
        An output or temporary folder is, contains or lies inside an input, or an output holds
        something this package did not write (whatever ``overwrite`` says).
    OutputLockedError
        Another live run holds one of the outputs.
    """
    refuse_unsafe(outputs, inputs, temporaries)
    with OutputLock([p for p in outputs.values() if p is not None], purpose) as lock:
        yield lock
