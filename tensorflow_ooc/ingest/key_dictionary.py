"""One mode's key dictionary while a table is read: keys (strings, integers, dates, timestamps,
the values of categoricals) get indices in order of first appearance, and a dictionary that
starts from a store's keys (an append) gives new keys the next indices, never renumbering.

Keys are pyarrow arrays and the work is pyarrow's hash kernels: ``unique`` keeps the order of
first appearance, ``index_in`` maps a batch to indices. Dictionary-encoded columns (Parquet's
dictionary pages, pandas categoricals) are mapped through their small dictionary, not row by row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .table_options import BUCKET_UNITS as BUCKETS


class KeyProblem(ValueError):
    """A column that cannot be keys; ``row`` (0-based within the batch) where a row is at fault."""

    def __init__(self, problem: str, row: int | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.row = row


def plain_type(t: pa.DataType) -> pa.DataType:
    """The type keys of ``t`` are kept as: strings as ``string``, integers as ``int64``."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_integer(t):
        return pa.int64()
    return t


def _check_type(t: pa.DataType, column: str, bucket: str | None) -> None:
    t = plain_type(t)
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        raise KeyProblem(
            f"column {column!r} holds numbers with a fraction ({t}): keys are strings, integers, dates or "
            "categories (an integer column with missing values reads as floats: fill or drop them)"
        )
    if not (
        pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_temporal(t)
    ):
        raise KeyProblem(f"column {column!r} holds {t}, which cannot be keys")
    if bucket is not None and not (pa.types.is_timestamp(t) or pa.types.is_date(t)):
        raise KeyProblem(f"column {column!r} holds {t}, not dates or times, so it has no {bucket!r} bucket")
    if bucket in ("second", "minute", "hour") and pa.types.is_date(t):
        raise KeyProblem(f"column {column!r} holds dates ({t}), which have no {bucket!r} bucket")


class KeyDictionary:
    """Keys -> indices of one mode.

    Parameters
    ----------
    column : str
        The table column (the mode's name).
    keys : pyarrow.Array, optional
        Keys already numbered (a store's dictionary, for an append): they keep their indices.
    bucket : str, optional
        Floor dates or timestamps to this unit (one of :data:`BUCKETS`) before they become keys.
    """

    def __init__(self, column: str, keys: Any = None, bucket: str | None = None) -> None:
        if bucket is not None and bucket not in BUCKETS:
            raise ValueError(f"bucket of {column!r} must be one of {BUCKETS}, got {bucket!r}")
        self.column = column
        self.bucket = bucket
        self.keys: pa.Array | None = None if keys is None else keys
        self._pending: list[pa.Array] = []
        self._pending_n = 0

    @property
    def type(self) -> pa.DataType | None:
        if self.keys is not None:
            return self.keys.type
        return self._pending[0].type if self._pending else None

    def __len__(self) -> int:
        self._merge()
        return 0 if self.keys is None else len(self.keys)

    def _normalized(self, values: pa.Array) -> pa.Array:
        """``values`` (a plain array) as keys: the dictionary's type, floored to the bucket."""
        t = values.type
        _check_type(t, self.column, self.bucket)
        want = plain_type(t)
        if t != want:
            values = values.cast(want)
        if self.bucket is not None:
            unit = self.bucket
            values = pc.floor_temporal(values, unit=unit, week_starts_monday=True)
        have = self.type
        if have is not None and values.type != have:
            try:
                values = values.cast(have)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise KeyProblem(f"column {self.column!r} holds {values.type} here, {have} before") from None
        return values

    def _split(self, column: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        """(distinct-ish values to hash, indices into them or None): a dictionary column is
        handled through its dictionary."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.null_count:
            raise KeyProblem(
                f"column {self.column!r} is empty (null) here", int(pc.index(column.is_null(), True).as_py())
            )
        if pa.types.is_dictionary(column.type):
            return self._normalized(column.dictionary), column.indices
        return self._normalized(column), None

    def add(self, column: pa.Array) -> None:
        """Number the keys of ``column`` not seen yet, in order of first appearance."""
        values, indices = self._split(column)
        if indices is not None:
            values = values.take(pc.unique(indices))  # the dictionary's entries in use, first seen first
        u = pc.unique(values)
        self._pending.append(u)
        self._pending_n += len(u)
        # merged once the pending keys outweigh the dictionary: each key is hashed a few times at most
        if self._pending_n > max(1 << 20, 0 if self.keys is None else len(self.keys)):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        parts = ([self.keys] if self.keys is not None else []) + self._pending
        # unique keeps first appearances in order: the numbered keys stay a prefix
        self.keys = pc.unique(pa.concat_arrays(parts))
        self._pending, self._pending_n = [], 0

    def lookup(self, column: pa.Array) -> np.ndarray:
        """Each row's index (int64); every key must have been added. Raises :class:`KeyProblem`
        naming the first row whose key is unknown."""
        self._merge()
        values, indices = self._split(column)
        if self.keys is None:
            raise KeyProblem(f"column {self.column!r}: no keys numbered yet", 0)
        idx = pc.index_in(values, value_set=self.keys)
        if indices is not None:
            idx = idx.take(indices)
        if idx.null_count:
            r = int(pc.index(idx.is_null(), True).as_py())
            raise KeyProblem(f"column {self.column!r}: key {column[r].as_py()!r} is not in the dictionary", r)
        return idx.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)

    def finished(self) -> pa.Array:
        """The keys in index order."""
        self._merge()
        if self.keys is None:
            return pa.array([], type=pa.string())
        return self.keys
