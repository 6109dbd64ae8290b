"""One mode's key dictionary while a table is read: keys (strings, integers, dates, timestamps,
the values of categoricals) get indices in order of first appearance, and a dictionary that
starts from a store's keys (an append) gives new keys the next indices, never renumbering.

Keys are pyarrow arrays, normalized by pyarrow (strings as ``string``, integers as ``int64``,
time buckets floored) and numbered by a hash table kept across batches
(:class:`~tensorflow_ooc.ingest.key_table.KeyTable`) over their bytes, one probe a row.
Dictionary-encoded columns (Parquet's dictionary pages, pandas categoricals) are numbered through
their small dictionary, not row by row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .key_table import KeyTable
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


def _as_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of each value of a plain array, without copying: a string's UTF-8, a
    fixed-width value's little-endian bytes."""
    n = len(values)
    bufs = values.buffers()
    if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
        offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=4 * values.offset)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        return offsets, data
    width = values.type.bit_width // 8
    data = np.frombuffer(bufs[1], dtype=np.uint8, count=n * width, offset=values.offset * width)
    return np.arange(0, (n + 1) * width, width, dtype=np.int64), data


def _from_bytes(t: pa.DataType, offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    n = offsets.shape[0] - 1
    if pa.types.is_string(t) or pa.types.is_binary(t):
        if data.shape[0] >= 2**31:
            big = pa.large_string() if pa.types.is_string(t) else pa.large_binary()
            return pa.Array.from_buffers(big, n, [None, pa.py_buffer(offsets.copy()), pa.py_buffer(data.copy())])
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data.copy())])
    if pa.types.is_boolean(t):
        return pa.array(data.view(np.int8)[:n].astype(bool))
    return pa.Array.from_buffers(t, n, [None, pa.py_buffer(data.copy())])


class KeyDictionary:
    """Keys -> indices of one mode, numbered in order of first appearance.

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
        self.type: pa.DataType | None = None
        self._final: pa.Array | None = None
        self.table: KeyTable | None = KeyTable(1 << 12 if keys is None else max(1 << 12, 2 * len(keys)))
        if keys is not None:
            self.type = keys.type
            self._ids(keys.cast(pa.int8()) if pa.types.is_boolean(keys.type) else keys)

    def __len__(self) -> int:
        return len(self.table) if self.table is not None else len(self._final)

    def release(self) -> None:
        """Keep only the keys (the hash table is not needed once the table is read)."""
        if self.table is not None:
            self._final = self.finished()
            self.table = None

    def _normalized(self, values: pa.Array) -> pa.Array:
        """``values`` (a plain array) as keys: the dictionary's type, floored to the bucket."""
        t = values.type
        _check_type(t, self.column, self.bucket)
        want = plain_type(t)
        if t != want:
            values = values.cast(want)
        if self.bucket is not None:
            values = pc.floor_temporal(values, unit=self.bucket, week_starts_monday=True)
        if self.type is None:
            self.type = values.type
        elif values.type != self.type:
            try:
                values = values.cast(self.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise KeyProblem(f"column {self.column!r} holds {values.type} here, {self.type} before") from None
        return values

    def _ids(self, values: pa.Array) -> np.ndarray:
        if pa.types.is_boolean(values.type):
            values = values.cast(pa.int8())
        offsets, data = _as_bytes(values)
        return self.table.index(offsets, data)

    def index(self, column: pa.Array) -> np.ndarray:
        """Each row's index (int64), numbering keys not seen before in order of first appearance.
        Raises :class:`KeyProblem` naming the first row with a null key."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.null_count:
            raise KeyProblem(
                f"column {self.column!r} is empty (null) here", int(pc.index(column.is_null(), True).as_py())
            )
        if pa.types.is_dictionary(column.type):
            # the dictionary's entries in use, first seen first, numbered; rows through their codes
            codes = column.indices.to_numpy(zero_copy_only=False)
            used = pc.unique(column.indices).to_numpy(zero_copy_only=False)
            ids = np.zeros(len(column.dictionary), dtype=np.int64)
            ids[used] = self._ids(self._normalized(column.dictionary.take(pa.array(used))))
            return ids[codes]
        return self._ids(self._normalized(column))

    def finished(self) -> pa.Array:
        """The keys in index order."""
        if self.table is None:
            return self._final
        offsets, data = self.table.keys()
        return _from_bytes(self.type or pa.string(), offsets, data)
