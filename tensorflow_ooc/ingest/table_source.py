"""Tables as a source: Parquet or CSV files (one file, a folder, a glob, local or any fsspec URL
such as ``s3://``), a pandas DataFrame, a Dask DataFrame or a pyarrow Table, with the columns that
are the modes named, and optionally a value column (without one, each row counts one).

Read once, in record batches, never the whole table at once (the next batch is read while one is
mapped): each mode's keys are numbered in order of first appearance as they come
(:class:`~tensorflow_ooc.ingest.key_dictionary.KeyDictionary`), and each batch's indices (uint32 a
mode) and values are spilled to a temporary folder. Once read, the dictionaries give the shape,
and the spilled rows are yielded as ``(coords, values)`` as any other source's, so the conversion
(in memory or out of core) is the one of ``.tns`` files. The dictionaries go into the
store (:mod:`tensorflow_ooc.store.labels`). A source built on a store (``base``, an append) starts
from its dictionaries and yields its nonzeros first.

Rows that cannot be read are refused with the file, the row and the column: a null key or value,
a value that is not a finite number, a key of another type than the column's before, a CSV line
with the wrong number of fields.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import threading
from typing import Any, Iterator, Mapping, Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import EmptyTensorError, IngestError
from .key_dictionary import KeyDictionary, KeyProblem
from .sources import Source
from .table_options import CSV_SUFFIXES, PARQUET_SUFFIXES, TABLE_FORMATS
from .value_range import first_out_of_range, range_problem

DEFAULT_BATCH_ROWS = 1 << 20


def format_of(location: str, given: str | None) -> str:
    """``parquet`` or ``csv``: ``given``, else from the file's suffix."""
    if given is not None:
        if given not in TABLE_FORMATS:
            raise ValueError(f"table format must be one of {TABLE_FORMATS}, got {given!r}")
        return given
    low = location.lower()
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(CSV_SUFFIXES):
        return "csv"
    raise IngestError("neither a Parquet (.parquet) nor a CSV (.csv) file; give the table format", location)


def table_files(location: str | os.PathLike | Sequence[str], table_format: str | None = None) -> list[str]:
    """The files a table location names, sorted by name: one file, a glob's matches, or a folder's
    Parquet or CSV files (recursively, as Hive-partitioned datasets are laid out)."""
    if isinstance(location, (list, tuple)):
        return [f for loc in location for f in table_files(loc, table_format)]
    location = str(location)
    fs, p = fsspec.core.url_to_fs(location)
    proto = location.split("://", 1)[0] + "://" if "://" in location else ""
    if any(c in location for c in "*?["):
        found = sorted(f for f in fs.glob(p) if not fs.isdir(f))
    elif fs.isdir(p):
        suffixes = {"parquet": PARQUET_SUFFIXES, "csv": CSV_SUFFIXES}.get(table_format or "", ())
        wanted = suffixes or PARQUET_SUFFIXES + CSV_SUFFIXES
        found = sorted(f for f in fs.find(p) if f.lower().endswith(wanted))
        if not found:
            raise IngestError("a folder without Parquet or CSV files", location)
    else:
        if not fs.exists(p):
            raise IngestError("no such file", location)
        return [location]
    if not found:
        raise IngestError("no file matches", location)
    return [proto + f if proto and not f.startswith(proto) else f for f in found]


def _is_dask_frame(obj: Any) -> bool:
    return hasattr(obj, "npartitions") and hasattr(obj, "get_partition")


def _is_pandas_frame(obj: Any) -> bool:
    return type(obj).__module__.startswith("pandas") and hasattr(obj, "columns") and hasattr(obj, "iloc")


def is_table(obj: Any) -> bool:
    """Whether ``obj`` is an in-memory table (pandas, Dask or pyarrow)."""
    return isinstance(obj, (pa.Table, pa.RecordBatch)) or _is_pandas_frame(obj) or _is_dask_frame(obj)


_CSV_WHERE = re.compile(
    r"(?:In CSV column #(?P<col>\d+): )?(?:CSV parse error: )?Row #(?P<row>\d+): (?P<what>.*)", re.S
)


class TableSource(Source):
    """A table whose named columns are the modes (see the module's doc).

    Parameters
    ----------
    table : path, URL, glob, folder, list of them, pandas/Dask DataFrame or pyarrow Table
    modes : sequence of str
        The key columns, one per mode, in mode order.
    value : str, optional
        The value column (numbers); None: each row counts one.
    bucket : mapping, optional
        ``{column: unit}``: a date or timestamp mode floored to ``day``, ``hour``, ... first.
    table_format : {"parquet", "csv"}, optional
        Default: from the files' suffixes.
    base : Store, optional
        A labelled store this table is appended to: its keys keep their indices, new keys get
        the next ones, and its nonzeros come first.
    batch_rows : int
        Rows read at once.
    spill_dir : str, optional
        Where the read rows' indices and values wait for the conversion (a folder of this
        process, removed by :meth:`close`; default the system's temporary folder).
    target : str
        The store being written (recorded with the folder, for the clean-up of killed runs).
    """

    def __init__(
        self,
        table: Any,
        modes: Sequence[str],
        value: str | None = None,
        bucket: Mapping[str, str] | None = None,
        table_format: str | None = None,
        base: Any = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        spill_dir: str | None = None,
        target: str = "",
    ) -> None:
        modes = [str(m) for m in modes]
        if not modes:
            raise ValueError("modes: name at least one key column")
        if len(set(modes)) != len(modes):
            raise ValueError(f"modes: a column named twice in {modes}")
        if value is not None and value in modes:
            raise ValueError(f"value column {value!r} is also a mode")
        bucket = dict(bucket or {})
        for col in bucket:
            if col not in modes:
                raise ValueError(f"bucket names {col!r}, which is not one of the modes {modes}")
        self.modes = modes
        self.value = value
        self.bucket = bucket
        self.nmodes = len(modes)
        self.batch_rows = int(batch_rows)
        self.base = base
        self.value_dtype = np.dtype(np.float64)
        self.table = table
        if is_table(table):
            self.files: list[str] = []
            self.formats: list[str] = []
            self.name = f"{type(table).__name__} with columns {', '.join(modes)}"
        else:
            self.files = table_files(table, table_format)
            self.formats = [format_of(f, table_format) for f in self.files]
            first = self.files[0] if len(self.files) == 1 else f"{len(self.files)} files of {table}"
            self.name = str(first)
        keys: list[Any] = [None] * self.nmodes
        if base is not None:
            labels = base.labels
            if labels is None:
                raise IngestError(
                    "a store converted from coordinates has no label dictionaries to append to", base.path
                )
            if labels.names != modes:
                raise IngestError(f"its modes are {labels.names}, the table's {modes}", base.path)
            keys = [labels.keys(m) for m in range(self.nmodes)]
        self.dictionaries = [KeyDictionary(c, keys[m], bucket.get(c)) for m, c in enumerate(modes)]
        self.base_sizes = [0 if k is None else len(k) for k in keys]
        self.rows: int | None = None
        self.given_shape = None
        self.spill_parent = spill_dir
        self.target = str(target)
        self.spill: str | None = None

    # --- reading ---------------------------------------------------------------------------------

    def record_batches(self, columns: list[str]) -> Iterator[tuple[str, int, bool, pa.RecordBatch]]:
        """``(where, first row of the batch in its file (0-based), is CSV, batch)`` in order."""
        if isinstance(self.table, (pa.Table, pa.RecordBatch)) or _is_pandas_frame(self.table):
            t = (
                self.table
                if not _is_pandas_frame(self.table)
                else pa.Table.from_pandas(self.table, preserve_index=False)
            )
            t = pa.Table.from_batches([t]) if isinstance(t, pa.RecordBatch) else t
            self._check_columns(t.schema.names, columns, "the table")
            at = 0
            for b in t.select(columns).to_batches(self.batch_rows):
                yield "the table", at, False, b
                at += b.num_rows
            return
        if _is_dask_frame(self.table):
            for i in range(self.table.npartitions):
                part = self.table.get_partition(i).compute()
                t = pa.Table.from_pandas(part, preserve_index=False)
                where = f"partition {i} of the Dask DataFrame"
                self._check_columns(t.schema.names, columns, where)
                at = 0
                for b in t.select(columns).to_batches(self.batch_rows):
                    yield where, at, False, b
                    at += b.num_rows
            return
        for f, kind in zip(self.files, self.formats):
            if kind == "parquet":
                yield from self._parquet(f, columns)
            else:
                yield from self._csv(f, columns)

    def _check_columns(self, names: list[str], columns: list[str], where: str) -> None:
        missing = [c for c in columns if c not in names]
        if missing:
            raise IngestError(f"no column {', '.join(map(repr, missing))}; the columns are {names}", where)

    def _parquet(self, location: str, columns: list[str]) -> Iterator[tuple[str, int, bool, pa.RecordBatch]]:
        import pyarrow.parquet as pq

        fs, p = fsspec.core.url_to_fs(location)
        with fs.open(p, "rb") as fh:
            try:
                schema = pq.read_schema(fh)
                fh.seek(0)
                self._check_columns(schema.names, columns, location)
                # strings read plain: asking for dictionaries hashes every row of a column whose
                # dictionary Parquet gave up on (over 1 MiB), once more than the key table does
                pf = pq.ParquetFile(fh)
            except (pa.ArrowInvalid, OSError) as exc:
                raise IngestError(f"not a Parquet file ({exc})", location) from None
            at = 0
            try:
                for b in pf.iter_batches(batch_size=self.batch_rows, columns=columns):
                    yield location, at, False, b
                    at += b.num_rows
            except pa.ArrowInvalid as exc:
                raise IngestError(f"row {at + 1} or after: {exc}", location) from None

    def _csv(
        self, location: str, columns: list[str], threads: bool = True
    ) -> Iterator[tuple[str, int, bool, pa.RecordBatch]]:
        import pyarrow.csv as csv

        fs, p = fsspec.core.url_to_fs(location)
        low = p.lower()
        compression = next((c for s, c in (("gz", "gzip"), ("bz2", "bz2"), ("zst", "zstd")) if low.endswith(s)), None)
        types = {self.value: pa.float64()} if self.value in columns else {}
        with fs.open(p, "rb", compression=compression) as fh:
            header: list[str] = []
            at = 0
            try:
                reader = csv.open_csv(
                    fh,
                    read_options=csv.ReadOptions(block_size=32 << 20, use_threads=threads),
                    parse_options=csv.ParseOptions(delimiter="\t" if ".tsv" in low else ","),
                    convert_options=csv.ConvertOptions(
                        include_columns=columns, column_types=types, strings_can_be_null=True
                    ),
                )
                header = reader.schema.names
                for b in reader:
                    yield location, at, True, b
                    at += b.num_rows
            except KeyError as exc:
                raise IngestError(f"no column {exc.args[0] if exc.args else exc}", location) from None
            except pa.ArrowInvalid as exc:
                if "Row #" not in str(exc) and threads:
                    # threaded parsing leaves the row out of the message: find it reading on one thread
                    for _ in self._csv(location, columns, threads=False):
                        pass
                raise self._csv_error(location, str(exc), columns, header) from None

    def _csv_error(self, location: str, text: str, columns: list[str], header: list[str]) -> IngestError:
        m = _CSV_WHERE.search(text)
        if m is None:
            return IngestError(text, location)
        what = m.group("what").strip()
        if m.group("col") is not None:
            k = int(m.group("col"))
            names = header or columns
            col = names[k] if k < len(names) else f"#{k}"
            return IngestError(f"row {int(m.group('row')) - 1}, column {col!r}: {what}", location, int(m.group("row")))
        return IngestError(f"row {int(m.group('row')) - 1}: {what}", location, int(m.group("row")))

    def _where(self, where: str, csv: bool, row: int, column: str, problem: str) -> IngestError:
        """An error at 0-based data row ``row`` of ``where``: rows count from 1, CSV lines too."""
        if csv:
            return IngestError(f"row {row + 1}, column {column!r}: {problem}", where, row + 2)
        return IngestError(f"row {row + 1}, column {column!r}: {problem}", where)

    # --- the pass over the table, and the nonzeros it spilled --------------------------------------

    def prepare(self) -> None:
        """Read the table once: number every mode's keys (the shape follows) and spill each
        batch's indices (uint32 a mode) and values to this source's folder; idempotent."""
        if self.rows is not None:
            return
        from ..tempdirs import make_bucket_dir

        self.spill = make_bucket_dir(self.spill_parent, self.target)
        columns = self.modes + ([self.value] if self.value is not None else [])
        rows = 0
        with (
            open(os.path.join(self.spill, "coords.bin"), "wb") as cf,
            open(os.path.join(self.spill, "values.bin"), "wb") as vf,
        ):
            for where, at, csv, batch in _read_ahead(self.record_batches(columns)):
                n = batch.num_rows
                if n == 0:
                    continue
                coords = np.empty((n, self.nmodes), dtype=np.uint32)
                for m, (d, col) in enumerate(zip(self.dictionaries, self.modes)):
                    try:
                        coords[:, m] = d.index(batch.column(col))
                    except KeyProblem as exc:
                        raise self._key_error(where, csv, at, col, exc) from None
                    if len(d) >= 2**32:
                        raise IngestError(f"mode {col!r} has more than 2^32 keys", where)
                cf.write(coords.data)
                vf.write(self._values(where, csv, at, batch, n).data)
                rows += n
        if rows == 0 and not any(self.base_sizes):
            raise EmptyTensorError("the table has no rows", self.name)
        for d in self.dictionaries:
            d.release()  # the hash tables' memory goes back before the conversion sorts
        self.rows = rows

    def close(self) -> None:
        """Remove the spilled nonzeros."""
        if self.spill is not None:
            shutil.rmtree(self.spill, ignore_errors=True)
            self.spill = None

    def _key_error(self, where: str, csv: bool, at: int, col: str, exc: KeyProblem) -> IngestError:
        if exc.row is None:
            return IngestError(exc.problem, where)
        problem = exc.problem.replace(f"column {col!r} ", "").replace(f"column {col!r}: ", "")
        return self._where(where, csv, at + exc.row, col, problem)

    def nnz_estimate(self) -> int:
        self.prepare()
        return int(self.rows or 0) + (self.base.nnz if self.base is not None else 0)

    def infer_shape(self) -> tuple[int, ...]:
        self.prepare()
        return tuple(max(1, len(d)) for d in self.dictionaries)

    def shape_from_max(self, mx: np.ndarray) -> tuple[int, ...]:
        return self.infer_shape()

    def labels(self) -> tuple[list[str], list[pa.Array]]:
        """The modes' names and keys in index order, for the store."""
        self.prepare()
        return list(self.modes), [d.finished() for d in self.dictionaries]

    def new_keys(self) -> dict[str, int]:
        """Per mode, how many keys the table added to the base store's (all of them without one)."""
        self.prepare()
        return {c: len(d) - b for c, d, b in zip(self.modes, self.dictionaries, self.base_sizes)}

    def batches(self, shape, batch_nnz=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The base store's nonzeros, then the table's rows as spilled: coordinates and values."""
        self.prepare()
        if self.base is not None:
            for ch in self.base.iter_chunks():
                yield ch.coords(self.base.layout), np.asarray(ch.values, dtype=self.value_dtype)
        if self.spill is None:
            raise IngestError("a table source's rows are read once", self.name)
        step = max(1, int(batch_nnz or self.batch_rows))
        with (
            open(os.path.join(self.spill, "coords.bin"), "rb") as cf,
            open(os.path.join(self.spill, "values.bin"), "rb") as vf,
        ):
            left = int(self.rows or 0)
            while left:
                n = min(step, left)
                coords = np.fromfile(cf, dtype=np.uint32, count=n * self.nmodes).reshape(n, self.nmodes)
                yield coords.astype(np.int64), np.fromfile(vf, dtype=np.float64, count=n)
                left -= n

    def _values(self, where: str, csv: bool, at: int, batch: pa.RecordBatch, n: int) -> np.ndarray:
        if self.value is None:
            return np.ones(n, dtype=self.value_dtype)
        col = batch.column(self.value)
        t = col.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)):
            raise IngestError(f"value column {self.value!r} holds {t}, not numbers", where)
        if col.null_count:
            r = int(pc.index(col.is_null(), True).as_py())
            raise self._where(where, csv, at + r, self.value, "empty (null) value")
        v = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        bad = ~np.isfinite(v)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise self._where(where, csv, at + r, self.value, f"value {v[r]} is not a finite number")
        r = first_out_of_range(v)
        if r >= 0:
            raise self._where(where, csv, at + r, self.value, range_problem(float(v[r])))
        return v


def _read_ahead(pieces: Iterator, depth: int = 2) -> Iterator:
    """``pieces``, read on a thread ahead of the consumer (Parquet and CSV decoding release the
    GIL, as the key mapping does): the next batch is read while this one is mapped."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for item in pieces:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((end, None))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put((end, exc))

    t = threading.Thread(target=produce, name="table-read-ahead", daemon=True)
    t.start()
    try:
        while True:
            item, exc = q.get()
            if item is end:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        t.join(timeout=5)
