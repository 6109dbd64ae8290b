"""What every step runner shares: :class:`StepContext` (the step's plan, the run's recorder, its
cluster and cancellation), opening an input store (a versioned folder: its latest version),
saving an ``.npz`` output whole, and batches that stop at a requested cancel.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StoreError
from ..store import Store, open_store
from . import locations as loc
from .errors import InputError
from .plan import PlannedStep, Workflow
from .records import Recorder

TNS_SUFFIXES = (".tns", ".tns.gz")
VERSIONS_FILE = "versions.json"


@dataclass
class StepContext:
    """What a step needs from the run: its plan, the recorder, the cluster, cancellation."""

    workflow: Workflow
    step: PlannedStep
    fingerprint: str
    recorder: Recorder
    client_for: Callable[[str], Any]  # device -> a Dask client on the run's cluster
    default_device: str = "auto"

    def log(self, message: str, **fields: Any) -> None:
        self.recorder.event("step-log", message, step=self.step.name, **fields)

    def check_cancel(self) -> None:
        self.recorder.check_cancel()

    def state_dir(self, *parts: str) -> str:
        return loc.join(self.workflow.root, "/".join((".tfooc",) + parts))


def is_tns(location: str) -> bool:
    return location.endswith(TNS_SUFFIXES)


def read_versions(location: str) -> dict:
    """The versions file of a versioned store (``{"versions": []}`` when there is none yet)."""
    f = loc.child(location, VERSIONS_FILE)
    if not loc.exists(f):
        return {"format": "tfooc-store-versions", "versions": []}
    return json.loads(loc.read_text(f))


def resolve_store(location: str) -> str:
    """A store location; for a versioned store (a folder with ``versions.json``) its latest version."""
    if loc.isdir(location) and loc.exists(loc.child(location, VERSIONS_FILE)):
        versions = read_versions(location)["versions"]
        if not versions:
            raise InputError(f"{location}: versioned store has no version yet")
        return loc.child(location, versions[-1]["path"])
    return location


def open_input_store(location: str) -> Store:
    try:
        return open_store(resolve_store(location))
    except StoreError as exc:
        raise InputError(str(exc)) from None


def save_npz(location: str, arrays: dict[str, Any]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    loc.write_bytes(location, buf.getvalue())


def cancellable(batches: Iterator, ctx: StepContext) -> Iterator:
    for b in batches:
        ctx.check_cancel()
        yield b
