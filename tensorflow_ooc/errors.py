"""Exception types. Every error names the problem and where it is (file, line, field)."""

from __future__ import annotations


class TfoocError(Exception):
    """Base class of all tensorflow_ooc errors."""


class IngestError(TfoocError, ValueError):
    """The input tensor could not be read or is invalid.

    Attributes
    ----------
    problem : str
        What is wrong.
    path : str or None
        The input file, when the input is a file.
    line : int or None
        1-based line number of the offending line, when known.
    """

    def __init__(self, problem: str, path: str | None = None, line: int | None = None) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        if self.path is not None and line is not None:
            msg = f"{self.path}, line {line}: {problem}"
        elif self.path is not None:
            msg = f"{self.path}: {problem}"
        else:
            msg = problem
        super().__init__(msg)


class ParseError(IngestError):
    """A text tensor file is malformed (wrong column count, non-numeric token, truncated file)."""


class EmptyTensorError(IngestError):
    """The input has no nonzeros."""


class IndexRangeError(IngestError):
    """An index is out of range (zero/negative in 1-based data, or beyond the given shape)."""


class NonFiniteValueError(IngestError):
    """A value is NaN or infinite."""


class DuplicateError(IngestError):
    """The input holds the same coordinate more than once and duplicates="error"."""


class ShapeError(IngestError):
    """A given or implied shape is inconsistent with the data."""


class StoreError(TfoocError, ValueError):
    """A store could not be opened or written."""


class ForeignStoreError(StoreError):
    """The path holds something that is not a tensorflow_ooc BLCO store."""


class IncompleteStoreError(StoreError):
    """The store was not completely written (a crash or error mid-write)."""


class CorruptStoreError(StoreError):
    """The store's metadata or data are inconsistent or damaged."""


class StoreExistsError(StoreError, FileExistsError):
    """The destination store already exists and overwrite was not requested."""


class DenseArrayError(TfoocError, ValueError):
    """A dense input array cannot be decomposed (its order, dtype or shape), or a dense CP-ALS
    parameter does not suit it (a rank above what the dense kernel supports)."""


class DecompositionError(TfoocError, ValueError):
    """A decomposition's parameters do not suit the tensor (ranks, initial factors, options), or
    a checkpoint to resume from belongs to another tensor or other parameters."""
