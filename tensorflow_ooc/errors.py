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


class ValueRangeError(IngestError):
    """A value is finite but outside what float64 arithmetic on it can hold: its square overflows
    (magnitude above sqrt(DBL_MAX), about 1.34e154, so ||X||^2 and the fit would be infinite or NaN)
    or, the value not being 0, its square is subnormal or 0 (magnitude below sqrt(DBL_MIN) = 2^-511,
    about 1.49e-154)."""


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


class DestinationError(TfoocError, ValueError):
    """An output, checkpoint or temporary path would destroy an input or something this package
    did not write (an ordinary file, a folder holding other things)."""


class OutputLockedError(DestinationError):
    """Another run is writing the same output (its lock names the run, host and PID)."""


class DenseArrayError(TfoocError, ValueError):
    """A dense input array cannot be decomposed (its order, dtype or shape), or a dense CP-ALS
    parameter does not suit it (a rank above what the dense kernel supports)."""


class DecompositionError(TfoocError, ValueError):
    """A decomposition's parameters do not suit the tensor (ranks, initial factors, options), or
    a checkpoint to resume from belongs to another tensor or other parameters."""


class DiskFullError(TfoocError, OSError):
    """A write ran out of disk space (ENOSPC) or disk quota (EDQUOT).

    Raised by :func:`tensorflow_ooc.disk.disk_full_error` at the write sites (store chunks and
    metadata, conversion buckets, checkpoints, result stores, workflow records) once what the
    failed write left behind is removed. The message names the file and the bytes still needed.

    Attributes
    ----------
    path : str
        The file or store whose write failed (the published name, not a temporary one).
    needed : int or None
        Bytes still needed: at least the failed write, and the estimated rest of the output.
    total : int or None
        Estimated bytes of the whole output, when known.
    free : int or None
        Free bytes on that file system when the write failed (None: unknown, e.g. a URL).
    """

    def __init__(
        self,
        path: str,
        needed: int | None = None,
        total: int | None = None,
        free: int | None = None,
        errno_: int | None = None,
    ) -> None:
        import errno as _errno

        self.path = str(path)
        self.needed = None if needed is None else int(needed)
        self.total = None if total is None else int(total)
        self.free = None if free is None else int(free)
        code = _errno.ENOSPC if errno_ is None else int(errno_)
        what = "disk quota exceeded" if code == getattr(_errno, "EDQUOT", -1) else "no space left on device"
        figures = []
        if self.needed is not None:
            figures.append(
                f"needs about {format_bytes(self.needed)} more"
                if self.total is not None and self.total > self.needed
                else f"needs about {format_bytes(self.needed)}"
            )
        if self.total is not None and self.total > (self.needed or 0):
            figures.append(f"about {format_bytes(self.total)} in all")
        if self.free is not None:
            figures.append(f"{format_bytes(self.free)} free")
        self.message = f"{what} writing {self.path}" + (f" ({', '.join(figures)})" if figures else "")
        OSError.__init__(self, code, self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # rebuilt from its fields when it crosses processes (a checkpoint written on a Dask worker)
        return (type(self), (self.path, self.needed, self.total, self.free, self.errno))


def format_bytes(n: int) -> str:
    """``12.3 MB``, ``512 bytes`` (decimal units, as ``df -H``)."""
    n = int(n)
    if abs(n) < 1000:
        return f"{n} bytes"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    return f"{n} bytes"  # pragma: no cover
