"""Workflows: YAML specs of steps (generate, convert, decompose, evaluate, export) run in the
foreground or submitted to a Dask cluster, idempotent and resumable, with run records under the
storage root. See ``workflows/README.md``."""

from .errors import InputError, LockError, Problem, RunCancelled, RunNotFound, SpecError, StepFailed
from .plan import Workflow, load_spec
from .step_models import Spec

__all__ = [
    "InputError",
    "LockError",
    "Problem",
    "RunCancelled",
    "RunNotFound",
    "Spec",
    "SpecError",
    "StepFailed",
    "Workflow",
    "load_spec",
]
