"""Input sources as streams of validated, 0-based COO batches.

A source knows its number of modes, can infer its shape (max index + 1 per mode), estimates its
nonzero count, and yields ``(coords int64 (n, nmodes), values)`` batches checked against a shape.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Sequence

import numba as nb
import numpy as np

from ..errors import EmptyTensorError, IndexRangeError, IngestError, NonFiniteValueError, ShapeError, ValueRangeError
from . import tns_reader
from .value_range import first_lost_in, first_out_of_range, lost_problem, range_problem

Batch = tuple[np.ndarray, np.ndarray]


class Source:
    name: str = "input"
    nmodes: int
    value_dtype: np.dtype = np.dtype(np.float64)
    given_shape: tuple[int, ...] | None = None

    def nnz_estimate(self) -> int:
        raise NotImplementedError

    def infer_shape(self) -> tuple[int, ...]:
        """Max index + 1 per mode, validating everything on the way (one pass)."""
        mx = np.full(self.nmodes, -1, dtype=np.int64)
        n = 0
        for coords, _ in self.batches(None):
            if coords.shape[0]:
                np.maximum(mx, coords.max(axis=0), out=mx)
                n += coords.shape[0]
        if n == 0:
            raise EmptyTensorError("input has no nonzeros")
        return self.shape_from_max(mx)

    def shape_from_max(self, mx: np.ndarray) -> tuple[int, ...]:
        """The inferred shape for per-mode largest indices ``mx``: max index + 1."""
        return tuple(int(m) + 1 for m in mx)

    def batches(self, shape: Sequence[int] | None, batch_nnz: int | None = None) -> Iterator[Batch]:
        raise NotImplementedError


# --- in-memory arrays -----------------------------------------------------------------------------


def validate_coo(
    coords: np.ndarray, values: np.ndarray, shape: Sequence[int] | None, offset: int = 0, name: str = "coords"
) -> None:
    """Check 0-based COO arrays; messages name the row and column."""
    if (coords < 0).any():
        r, c = np.argwhere(coords < 0)[0]
        raise IndexRangeError(f"{name}[{offset + r}, {c}] = {coords[r, c]} is negative (indices are 0-based)")
    if shape is not None:
        lim = np.asarray(shape, dtype=np.int64)
        bad = coords >= lim
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise IndexRangeError(
                f"{name}[{offset + r}, {c}] = {coords[r, c]} is beyond the shape (mode {c} has length {lim[c]})"
            )
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        r = int(np.flatnonzero(~np.isfinite(values))[0])
        raise NonFiniteValueError(f"values[{offset + r}] = {values[r]} is not finite")
    r = first_out_of_range(values)
    if r >= 0:
        raise ValueRangeError(f"values[{offset + r}]: {range_problem(float(values[r]))}")


class ArraySource(Source):
    """COO arrays: ``coords`` (nnz, nmodes) integer, 0-based; ``values`` (nnz,)."""

    def __init__(self, coords: Any, values: Any, shape: Sequence[int] | None = None, name: str = "coords") -> None:
        coords = np.asarray(coords)
        values = np.asarray(values)
        if coords.ndim != 2:
            raise ShapeError(f"{name} must be a 2-D array (nnz, nmodes), got shape {coords.shape}")
        if coords.dtype.kind not in "iu":
            if (
                coords.dtype.kind == "f"
                and coords.size
                and np.array_equal(coords, np.round(coords))
                and np.isfinite(coords).all()
            ):
                coords = coords.astype(np.int64)
            else:
                raise ShapeError(f"{name} must hold integers, got dtype {coords.dtype}")
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.ndim != 1 or values.shape[0] != coords.shape[0]:
            raise ShapeError(
                f"values must be 1-D with one entry per row of {name}: {name} has "
                f"{coords.shape[0]} rows, values has shape {values.shape}"
            )
        if values.dtype.kind not in "fiub":
            raise ShapeError(f"values must be numeric, got dtype {values.dtype}")
        if coords.shape[0] == 0:
            raise EmptyTensorError("input has no nonzeros")
        if coords.dtype == np.uint64 and coords.size and int(coords.max()) >= 2**63:
            raise IndexRangeError(f"{name} holds an index >= 2**63")
        self.coords = np.ascontiguousarray(coords, dtype=np.int64)
        self.values = values if values.dtype.kind == "f" else values.astype(np.float64)
        self.value_dtype = self.values.dtype if self.values.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        self.nmodes = self.coords.shape[1]
        self.name = name
        if shape is not None and len(shape) != self.nmodes:
            raise ShapeError(f"the given shape has {len(shape)} modes but {name} has {self.nmodes} columns")
        self.given_shape = None if shape is None else tuple(int(s) for s in shape)

    def nnz_estimate(self) -> int:
        return self.coords.shape[0]

    def batches(self, shape, batch_nnz=None):
        n = self.coords.shape[0]
        step = batch_nnz or n
        for s in range(0, n, step):
            c, v = self.coords[s : s + step], self.values[s : s + step]
            validate_coo(c, v, shape, offset=s, name=self.name)
            lost = first_lost_in(v, self.value_dtype)
            if lost >= 0:
                raise ValueRangeError(
                    f"{self.name}: values[{s + lost}]: {lost_problem(float(v[lost]), self.value_dtype)}"
                )
            with np.errstate(over="ignore"):  # a value beyond a narrower dtype: the writer names it
                yield c, v.astype(self.value_dtype, copy=False)


class BatchSource(Source):
    """An iterable of ``(coords, values)`` batches (for example the synthetic generator)."""

    def __init__(
        self,
        batches: Iterable[Batch],
        nmodes: int,
        shape: Sequence[int] | None,
        nnz_hint: int,
        value_dtype: Any = np.float64,
        name: str = "batches",
    ) -> None:
        self._batches = batches
        self.nmodes = nmodes
        self.given_shape = None if shape is None else tuple(int(s) for s in shape)
        self.nnz_hint = int(nnz_hint)
        self.value_dtype = np.dtype(value_dtype)
        self.name = name
        self._used = False

    def nnz_estimate(self) -> int:
        return self.nnz_hint

    def infer_shape(self):
        if self.given_shape is None:
            raise ShapeError("a stream of batches needs an explicit shape")
        return self.given_shape

    def batches(self, shape, batch_nnz=None):
        if self._used:
            raise IngestError("a stream of batches can only be read once")
        self._used = True
        offset = 0
        for coords, values in self._batches:
            src = ArraySource(coords, values, shape, name=f"batch coords (starting at nonzero {offset})")
            for c, v in src.batches(shape):
                yield c, v.astype(self.value_dtype, copy=False)
            offset += src.coords.shape[0]


@nb.njit(nogil=True, cache=True)
def _first_unsorted(keys, top_bits):
    """First column that is below its predecessor or sets a bit at or above ``top_bits`` of the
    top word (0: the whole word is used), else -1."""
    nwords, n = keys.shape
    top = nwords - 1
    for i in range(n):
        if top_bits != 0 and keys[top, i] >> top_bits != 0:
            return i
        if i > 0:
            for w in range(top, -1, -1):
                if keys[w, i] != keys[w, i - 1]:
                    if keys[w, i] < keys[w, i - 1]:
                        return i
                    break
    return -1


class AltoRunSource(Source):
    """Runs of ALTO words, each sorted and without repeats inside it (the synthetic generator's
    batches): conversion merges them instead of sorting, and skips linearizing and validating.

    Parameters
    ----------
    runs : iterable of (keys, values)
        ``keys`` uint64 (nwords, n): ALTO words of ``BitLayout(shape)``, ascending within the run;
        ``values`` (n,), or None when ``values_of`` gives them.
    shape : mode lengths
    nnz_hint : int
        Expected total nonzeros (sizes the conversion plan).
    values_of : callable, optional
        ``values_of(keys) -> values``: values computed from the words, so out-of-core conversion
        spills only the words and asks for the values after the merge.
    """

    def __init__(
        self,
        runs: Iterable[tuple[np.ndarray, np.ndarray | None]],
        shape: Sequence[int],
        nnz_hint: int,
        values_of=None,
        value_dtype: Any = np.float64,
        name: str = "ALTO runs",
    ) -> None:
        from ..format import BitLayout

        self._runs = runs
        self.layout = BitLayout(tuple(int(s) for s in shape))
        self.nmodes = self.layout.nmodes
        self.given_shape = self.layout.shape
        self.nnz_hint = int(nnz_hint)
        self.values_of = values_of
        self.value_dtype = np.dtype(value_dtype)
        self.name = name
        self._used = False

    def nnz_estimate(self) -> int:
        return self.nnz_hint

    def infer_shape(self):
        return self.given_shape

    def runs(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """The runs, checked: sorted keys of the right width, values when there is no ``values_of``."""
        if self._used:
            raise IngestError("a stream of runs can only be read once")
        self._used = True
        for k, (keys, values) in enumerate(self._runs):
            keys = np.asarray(keys)
            if keys.dtype != np.uint64 or keys.ndim != 2 or keys.shape[0] != self.layout.nwords:
                raise ShapeError(
                    f"{self.name}: a run must be uint64 ALTO words of shape ({self.layout.nwords}, n) "
                    f"for shape {self.layout.shape}, got {keys.dtype} {keys.shape}"
                )
            if values is None and self.values_of is None:
                raise IngestError(f"{self.name}: a run without values needs values_of")
            if values is not None:
                values = np.asarray(values, dtype=self.value_dtype)
                if values.shape != (keys.shape[1],):
                    raise ShapeError(f"{self.name}: {keys.shape[1]} keys but values of shape {values.shape}")
                if values.dtype.kind == "f" and not np.isfinite(values).all():
                    r = int(np.flatnonzero(~np.isfinite(values))[0])
                    raise NonFiniteValueError(f"{self.name}: value {r} of a run is {values[r]}")
                r = first_out_of_range(values)
                if r >= 0:
                    raise ValueRangeError(f"{self.name}: value {r} of run {k}: {range_problem(float(values[r]))}")
            bad = int(_first_unsorted(keys, np.uint64(self.layout.total_bits % 64)))
            if bad >= 0:
                raise IngestError(
                    f"{self.name}: run {k} is not ascending, or sets bits beyond the shape's "
                    f"{self.layout.total_bits}, at column {bad}"
                )
            if keys.shape[1]:
                yield keys, values

    def batches(self, shape, batch_nnz=None):
        from ..format import coords_from_words

        for keys, values in self.runs():
            if values is None:
                values = self.values_of(keys)
            yield coords_from_words(keys, self.layout), values


# --- text files -----------------------------------------------------------------------------------


class TextSource(Source):
    """A FROSTT ``.tns`` or ``.tns.gz`` file (gzip detected by content)."""

    def __init__(
        self,
        path: str | os.PathLike,
        one_based: bool = True,
        shape: Sequence[int] | None = None,
        workers: int = 2,
        piece_bytes: int = 32 << 20,
    ) -> None:
        self.path = str(path)
        self.name = self.path
        if not os.path.exists(self.path):
            raise IngestError("no such file", self.path)
        if os.path.isdir(self.path):
            raise IngestError("is a directory, not a .tns file", self.path)
        if os.path.getsize(self.path) == 0:
            raise EmptyTensorError("file is empty", self.path)
        self.one_based = one_based
        self.gzip = tns_reader.is_gzip(self.path)
        self.nmodes = tns_reader.detect_nmodes(self.path)
        tns_reader.check_shape_arity(self.path, shape, self.nmodes)
        self.given_shape = None if shape is None else tuple(int(s) for s in shape)
        # a generated file's header shape: inferred shapes grow to it (trailing empty slices)
        self.declared_shape = tns_reader.declared_shape(self.path, self.nmodes)
        self.workers = workers
        self.piece_bytes = piece_bytes
        self.bytes_per_line = self._sample_line_bytes()

    def _sample_line_bytes(self) -> float:
        with tns_reader._open_text(self.path) as f:
            try:
                sample = f.read(1 << 16)
            except (EOFError, OSError):
                sample = b""
        lines = sample.count(b"\n") or 1
        return max(4.0, len(sample) / lines)

    def size_bytes(self) -> int:
        size = os.path.getsize(self.path)
        return size * 4 if self.gzip else size  # text tensors inflate about 3-5x

    def nnz_estimate(self) -> int:
        return int(self.size_bytes() / self.bytes_per_line) + 1

    def batches(self, shape, batch_nnz=None):
        for piece in self.pieces(shape):
            yield piece.coords, piece.values

    def pieces(self, shape) -> Iterator[tns_reader.ParsedPiece]:
        """Parsed pieces in file order (each with its per-mode max index)."""
        lim = np.full(self.nmodes, -1, dtype=np.int64) if shape is None else np.asarray(shape, dtype=np.int64)
        empty = True
        lines = 0
        for piece in tns_reader.parse_file(self.path, self.nmodes, self.one_based, lim, self.piece_bytes, self.workers):
            lost = first_lost_in(piece.values, self.value_dtype) if piece.error is None else -1
            if lost >= 0:
                # the value's line: the piece's data lines hold its rows in order, after comments
                raise ValueRangeError(
                    f"nonzero {lost + 1} of the piece at line {lines + 1}: "
                    f"{lost_problem(float(piece.values[lost]), self.value_dtype)}",
                    self.path,
                )
            lines += piece.lines
            if piece.coords.shape[0]:
                empty = False
                yield piece
        if empty:
            raise EmptyTensorError("file has no nonzeros (only comments or blank lines)", self.path)

    def infer_shape(self) -> tuple[int, ...]:
        mx = np.full(self.nmodes, -1, dtype=np.int64)
        for piece in self.pieces(None):
            np.maximum(mx, piece.max, out=mx)
        return self.shape_from_max(mx)

    def shape_from_max(self, mx: np.ndarray) -> tuple[int, ...]:
        """The inferred shape for per-mode largest indices ``mx``: max index + 1, grown to the
        header's shape (:func:`~tensorflow_ooc.ingest.tns_reader.declared_shape`) where that is
        larger; an index beyond the header's shape wins (the header is only a comment)."""
        inferred = super().shape_from_max(mx)
        if self.declared_shape is None:
            return inferred
        return tuple(max(a, b) for a, b in zip(inferred, self.declared_shape))


def as_source(
    source: Any, *, shape: Sequence[int] | None, one_based: bool, workers: int = 2, piece_bytes: int = 32 << 20
) -> Source:
    """Wrap any supported input: path, (coords, values), sparse.COO, scipy.sparse, pyttb.sptensor."""
    if isinstance(source, Source):
        return source
    if isinstance(source, (str, os.PathLike)):
        return TextSource(source, one_based=one_based, shape=shape, workers=workers, piece_bytes=piece_bytes)
    if isinstance(source, tuple) and len(source) == 2:
        return ArraySource(source[0], source[1], shape)
    mod = type(source).__module__ or ""
    if mod.startswith("sparse") and hasattr(source, "coords") and hasattr(source, "data"):
        given = shape or source.shape
        return ArraySource(np.asarray(source.coords).T, np.asarray(source.data), given, name="sparse.COO coords")
    if mod.startswith("scipy.sparse"):
        coo = source.tocoo()
        return ArraySource(np.stack([coo.row, coo.col], axis=1), coo.data, shape or coo.shape, name="scipy COO coords")
    if mod.startswith("pyttb") and hasattr(source, "subs") and hasattr(source, "vals"):
        return ArraySource(
            np.asarray(source.subs), np.asarray(source.vals).ravel(), shape or source.shape, name="sptensor subs"
        )
    raise TypeError(
        f"unsupported source type {type(source).__name__}: pass a .tns path, (coords, values), "
        "sparse.COO, a scipy.sparse matrix or a pyttb.sptensor"
    )
