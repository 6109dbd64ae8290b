"""Workflow errors: bad specs (exit 2), locked outputs, cancelled runs, unknown runs."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TfoocError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: where (line, dotted field) and what was expected."""

    line: int | None
    field: str | None
    message: str

    def format(self, path: str) -> str:
        where = path if self.line is None else f"{path}, line {self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class SpecError(TfoocError, ValueError):
    """A workflow spec is malformed or inconsistent. Nothing was started.

    Attributes
    ----------
    path : str
        The spec file (or ``<string>``).
    problems : list of Problem
        Every problem found, each with its line and field.
    """

    def __init__(self, path: str, problems: list[Problem]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        lines = [p.format(self.path) for p in self.problems]
        super().__init__("\n  ".join(lines) if len(lines) > 1 else lines[0])

    @property
    def line(self) -> int | None:
        """Line of the first problem."""
        return self.problems[0].line if self.problems else None


class InputError(TfoocError, ValueError):
    """A step's input is missing or unusable when the step is about to run."""


class LockError(TfoocError):
    """An output is being written by another run."""


class RunCancelled(TfoocError):
    """The run was cancelled (``tfooc cancel``) while it was going."""


class RunNotFound(TfoocError, LookupError):
    """No run record with that id under the storage root."""


class StepFailed(TfoocError):
    """A step ran but its result failed a declared check (for example ``min_fit``)."""
