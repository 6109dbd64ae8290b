"""``convert``: any supported input -> BLCO Zarr store, in memory or out of core.

In memory: read all batches, linearize, radix-sort, write. Out of core (the input does not fit the
memory budget): parse batches -> ALTO words -> radix-partition by the top bits of the ALTO index
into on-disk buckets (buckets are therefore in global ALTO order) -> sort each bucket in memory ->
append to the store. A bucket that is still too big (skewed data) is partitioned again on the next
bits. Peak memory follows the budget, not the input size; bucket files are compressed frames, so
temporary disk stays below the finished store, and each bucket file is deleted once written.

Sources of sorted runs (``AltoRunSource``: the synthetic generator sorts each batch to make it
distinct) skip linearizing and sorting: runs are split into buckets by binary search, spilled as
delta-coded runs, and each bucket's runs are merged (``format.merge``), in memory or per bucket.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import struct
import tempfile
import time
from typing import Any, Iterator, Sequence

import numba as nb
import numcodecs
import numpy as np
import psutil
from tqdm.auto import tqdm

from ..disk import disk_full_error, is_disk_full
from ..errors import DiskFullError, DuplicateError, IngestError, ShapeError, StoreExistsError
from ..format import DEFAULT_MAX_BLOCK_NNZ, BitLayout, alto_words, sort_nonzeros, top_bits
from ..format.blco import apply_duplicates, duplicate_error
from ..format.blocking import DUPLICATE_POLICIES
from ..format.index_encoding import ENCODINGS
from ..format.merge import merge_runs
from ..store import DEFAULT_CHUNK_NNZ, Store, StoreWriter, open_store
from ..store.chunk_cache import parse_bytes
from ..store.codecs import DEFAULT_COMPRESSION, check_compression
from ..tempdirs import clean_stale, make_bucket_dir
from .memory import limit_heap_growth, trim
from .memory import rss as _rss
from .sources import AltoRunSource, Source, TextSource, as_source

log = logging.getLogger(__name__)

MIN_BUDGET = 48 << 20
MAX_BUCKET_BITS = 12


def _sort_bytes_per_nnz(layout: BitLayout) -> int:
    """Working bytes per nonzero while a batch is sorted: keys + values, double-buffered, plus
    the coordinates decoded per chunk for the range table."""
    return 2 * (8 * layout.nwords + 8) + 8


def _parse_bytes_per_nnz(nmodes: int, nwords: int) -> int:
    """Bytes per nonzero while parsed batches are in flight: coords, values, parse scratch, ALTO words."""
    return 8 * nmodes + 8 + 24 + 8 * nwords + 8


@nb.njit(nogil=True, cache=True)
def _bucket_order(bucket, nbuckets):
    counts = np.zeros(nbuckets + 1, dtype=np.int64)
    for b in bucket:
        counts[b + 1] += 1
    for k in range(nbuckets):
        counts[k + 1] += counts[k]
    pos = counts[:-1].copy()
    order = np.empty(bucket.shape[0], dtype=np.int64)
    for i in range(bucket.shape[0]):
        b = bucket[i]
        order[pos[b]] = i
        pos[b] += 1
    return order, counts


@nb.njit(parallel=True, nogil=True, cache=True)
def _delta(x, out):
    """out[i] = x[i] - x[i - 1] (uint64, wrapping); out[0] = x[0]."""
    n = x.shape[0]
    if n:
        out[0] = x[0]
    for i in nb.prange(1, n):
        out[i] = x[i] - x[i - 1]


@nb.njit(nogil=True, cache=True)
def _undelta(d):
    acc = np.uint64(0)
    for i in range(d.shape[0]):
        acc += d[i]
        d[i] = acc


@nb.njit(inline="always")
def _top_of(keys, i, hi, nbits):
    v = 0
    for p in range(hi - 1, hi - nbits - 1, -1):
        v = (v << 1) | np.int64((keys[p // 64, i] >> np.uint64(p % 64)) & np.uint64(1))
    return v


@nb.njit(nogil=True, cache=True)
def _run_edges(keys, hi, nbits):
    """For ascending keys, the first column of every bucket (ALTO bits [hi - nbits, hi)), and
    the end: binary searches instead of a pass over the run."""
    n = keys.shape[1]
    nb_ = 1 << nbits
    edges = np.empty(nb_ + 1, dtype=np.int64)
    edges[nb_] = n
    lo = 0
    for b in range(nb_):
        a, z = lo, n
        while a < z:
            mid = (a + z) // 2
            if _top_of(keys, mid, hi, nbits) < b:
                a = mid + 1
            else:
                z = mid
        edges[b] = a
        lo = a
    return edges


_FRAME = struct.Struct("<4sIQ")  # magic, flags, nonzeros; then one u64 byte count per payload
_MAGIC = b"TFSP"
_SORTED, _VALUES = 1, 2


class BucketSpill:
    """On-disk buckets of (ALTO words, values): one file per bucket, holding compressed frames.

    Each write adds one frame per bucket it touches: one payload per ALTO word row (delta-coded
    when the frame is a sorted run, which sorted sources give) and one for the values, each
    shuffled and lz4-compressed with Blosc, and decompressed on load straight into the bucket's
    arrays. Spilled bytes are what bounds temporary disk: raw words and values took 24 bytes per
    nonzero for 65-bit indices, more than the finished store; frames take about 6 for sorted
    words plus what the values compress to, and nothing for values the source computes from the
    words. A frame that is a sorted run stays one, so a bucket of runs is merged, not sorted.
    """

    def __init__(
        self, directory: str, nbuckets: int, nwords: int, value_dtype: np.dtype, with_values: bool = True
    ) -> None:
        self.dir = directory
        self.nbuckets = nbuckets
        self.nwords = nwords
        self.value_dtype = np.dtype(value_dtype)
        self.with_values = with_values
        self.counts = np.zeros(nbuckets, dtype=np.int64)
        self.nbytes = np.zeros(nbuckets, dtype=np.int64)
        self._files: dict[int, Any] = {}
        self._scratch = np.empty(0, dtype=np.uint64)
        self._heads = struct.Struct(f"<{nwords + 1}Q")
        self._codec = numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=1 << 20)

    def path(self, b: int) -> str:
        return os.path.join(self.dir, f"b{b:05d}.bin")

    def _file(self, b: int):
        f = self._files.get(b)
        if f is None:
            f = self._files[b] = open(self.path(b), "ab")
        return f

    def write(
        self,
        bucket: np.ndarray | None,
        keys: np.ndarray,
        values: np.ndarray | None,
        sorted_run: bool = False,
        hi: int = 0,
    ) -> None:
        """Add nonzeros to their buckets (ALTO bits [hi - log2(nbuckets), hi)). ``bucket``: each
        nonzero's bucket; for a sorted run (``keys`` ascend) None, the edges are searched."""
        if sorted_run:
            edges = _run_edges(keys, hi, self.nbuckets.bit_length() - 1)
        else:
            order, edges = _bucket_order(bucket, self.nbuckets)
            keys = keys[:, order]
            values = values[order] if values is not None else None
        for b in np.flatnonzero(np.diff(edges)):
            s, e = edges[b], edges[b + 1]
            self.write_frame(int(b), keys[:, s:e], None if values is None else values[s:e], sorted_run)

    def write_frame(self, b: int, keys: np.ndarray, values: np.ndarray | None, sorted_run: bool) -> None:
        n = keys.shape[1]
        payloads = []
        for w in range(self.nwords):
            row = keys[w]
            if sorted_run:
                if self._scratch.shape[0] < n:
                    self._scratch = np.empty(n, dtype=np.uint64)
                _delta(row, self._scratch[:n])
                row = self._scratch[:n]
            payloads.append(self._codec.encode(np.ascontiguousarray(row)))
        flags = _SORTED if sorted_run else 0
        if self.with_values:
            flags |= _VALUES
            payloads.append(self._codec.encode(np.ascontiguousarray(values, dtype=self.value_dtype)))
        else:
            payloads.append(b"")
        size = _FRAME.size + self._heads.size + sum(len(p) for p in payloads)
        try:
            f = self._file(b)
            f.write(_FRAME.pack(_MAGIC, flags, n))
            f.write(self._heads.pack(*(len(p) for p in payloads)))
            for p in payloads:
                f.write(p)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise disk_full_error(exc, self.path(b), needed=size) from exc
        self.counts[b] += n
        self.nbytes[b] += size

    def close(self) -> None:
        try:
            for b in list(self._files):
                f = self._files.pop(b)
                try:
                    f.close()  # flushes the last frames
                except OSError as exc:
                    if not is_disk_full(exc):
                        raise
                    raise disk_full_error(exc, self.path(b), needed=int(self.nbytes[b])) from exc
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close every bucket file, ignoring errors (their folder is about to be removed): a buffered
        file left open would try to flush when collected, into a full disk."""
        for f in self._files.values():
            try:
                f.close()
            except OSError:
                pass
        self._files.clear()

    def _read_frames(self, b: int, take):
        """Walk bucket b's frames; ``take(n, flags)`` returns (word rows, values) to fill, or None
        to fill fresh arrays. Yields (keys, values or None, sorted) as filled."""
        if self.counts[b] == 0:
            return
        with open(self.path(b), "rb") as f:
            while True:
                head = f.read(_FRAME.size)
                if not head:
                    break
                magic, flags, n = _FRAME.unpack(head)
                if magic != _MAGIC:
                    raise IngestError(f"bucket file {self.path(b)} is damaged (bad frame header)")
                sizes = self._heads.unpack(f.read(self._heads.size))
                dest = take(n, flags)
                keys, vals = (
                    dest
                    if dest is not None
                    else (
                        np.empty((self.nwords, n), dtype=np.uint64),
                        np.empty(n, dtype=self.value_dtype) if flags & _VALUES else None,
                    )
                )
                for w in range(self.nwords):
                    self._decode(f.read(sizes[w]), keys[w], b)  # straight into place
                    if flags & _SORTED:
                        _undelta(keys[w])
                if flags & _VALUES:
                    self._decode(f.read(sizes[-1]), vals, b)
                yield keys, (vals if flags & _VALUES else None), bool(flags & _SORTED)

    def _decode(self, payload: bytes, dest: np.ndarray, b: int) -> None:
        # a Blosc header holds the decoded size at bytes 4..8
        if len(payload) < 16 or int.from_bytes(payload[4:8], "little") != dest.nbytes:
            raise IngestError(f"bucket file {self.path(b)} is damaged (a frame does not decode to its size)")
        numcodecs.blosc.decompress(payload, dest)

    def frames(self, b: int) -> Iterator[tuple[np.ndarray, np.ndarray | None, bool]]:
        """The frames of bucket b in write order: ``(keys (nwords, n), values or None, sorted)``."""
        return self._read_frames(b, lambda n, flags: None)

    def load(self, b: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """All of bucket b, then its file is deleted: ``(keys, values, run bounds)``; the bounds
        (start of every sorted run, and the end) are None unless every frame is a sorted run."""
        count = int(self.counts[b])
        keys = np.empty((self.nwords, count), dtype=np.uint64)
        vals = np.empty(count, dtype=self.value_dtype) if self.with_values else None
        bounds = [0]

        def take(n, flags):
            s = bounds[-1]
            bounds.append(s + n)
            return keys[:, s : s + n], (vals[s : s + n] if vals is not None else None)

        all_sorted = True
        for _, _, srt in self._read_frames(b, take):
            all_sorted &= srt
        self.discard(b)
        return keys, vals, (np.array(bounds, dtype=np.int64) if all_sorted else None)

    def discard(self, b: int) -> None:
        f = self._files.pop(b, None)
        if f is not None:
            f.close()
        if os.path.exists(self.path(b)):
            os.remove(self.path(b))


def convert(
    source: Any,
    store: str | os.PathLike,
    *,
    shape: Sequence[int] | None = None,
    one_based: bool = True,
    duplicates: str = "error",
    chunk_nnz: int | None = None,
    max_block_nnz: int | None = None,
    memory_limit: int | str | None = None,
    overwrite: bool = False,
    progress: bool = False,
    workers: int | None = None,
    tmp_dir: str | None = None,
    out_of_core: bool | None = None,
    sort_nnz: int | None = None,
    compression: str = DEFAULT_COMPRESSION,
    values_dtype: str | np.dtype | None = None,
    index_encoding: str | None = None,
    fiber_index: str | Sequence[int] | None = None,
    fiber_chunk_nnz: int | None = None,
    modes: Sequence[str] | None = None,
    value: str | None = None,
    bucket: dict[str, str] | None = None,
    table_format: str | None = None,
    append_to: str | os.PathLike | Store | None = None,
) -> Store:
    """Convert a sparse tensor into a BLCO Zarr store.

    Parameters
    ----------
    source : str or PathLike, tuple, sparse.COO, scipy.sparse matrix, pyttb.sptensor, Source, table
        A FROSTT ``.tns`` / ``.tns.gz`` file, or ``(coords, values)`` with 0-based ``coords``
        (nnz, nmodes), or a pydata-sparse / scipy / pyttb sparse object, or a ``BatchSource`` of
        COO batches or an ``AltoRunSource`` of sorted ALTO runs (streams larger than memory).
        With ``modes``: a table, as Parquet or CSV files (a file, a folder, a glob, a list; local
        or an fsspec URL such as ``s3://``), a pandas or Dask DataFrame or a pyarrow Table.
    store : str or PathLike
        Destination: a local path or an fsspec URL such as ``memory://name``.
    shape : sequence of int, optional
        Mode lengths; inferred (max index + 1) when omitted. An index beyond it is an error.
    one_based : bool
        Text files only: indices start at 1 (FROSTT). In-memory arrays are always 0-based.
    duplicates : {"error", "sum", "last"}
        What to do with a coordinate given more than once.
    chunk_nnz : int, optional
        Nonzeros per stored chunk (default 2**20).
    max_block_nnz : int, optional
        Largest BLCO block (default 2**24).
    memory_limit : int or str, optional
        Bytes the converting process may hold (peak RSS; a count or ``"4GiB"``). Inputs that do
        not fit are converted out of core. Default: half of the available memory.
    overwrite : bool
        Replace an existing store.
    progress : bool
        Show progress bars.
    workers : int, optional
        Parallel parse tasks (default: cores).
    tmp_dir : str, optional
        Where out-of-core buckets go (default: beside the store, or the system temp dir for URLs).
        Temporaries of killed runs found there and beside the store are removed first, or
        reported while their owner runs (``tensorflow_ooc.tempdirs``).
    out_of_core : bool, optional
        Force (True) or forbid (False) the out-of-core path; default: out of core when the input
        does not fit the memory budget.
    sort_nnz : int, optional
        Out of core: most nonzeros sorted in memory at once (default: from the memory budget).
    fiber_index : "all" or mode numbers, optional
        Also write the fiber index of these modes (see :func:`~tensorflow_ooc.build_fiber_index`),
        so randomized CP and rTT-ALS read only the sampled fibers; built in the same memory budget.
    fiber_chunk_nnz : int, optional
        Entries per fiber-index chunk (default: per mode about its fibers' mean length, 128 to 1024).
    modes : sequence of str, optional
        A table's key columns, one per mode: each mode's keys (strings, integers, dates,
        categories) are numbered in order of first appearance, and the dictionaries kept in the
        store (``Store.labels``) label the results (``CPResult.factor_frame``).
    value : str, optional
        A table's value column; without one each row counts one (with ``duplicates="sum"``, the
        number of rows of each coordinate).
    bucket : dict, optional
        ``{column: unit}``: floor a date or timestamp mode to ``day``, ``hour``, ``week``, ...
    table_format : {"parquet", "csv"}, optional
        The table files' format (default: from their suffix).
    append_to : str or Store, optional
        A store converted from a table: its nonzeros come first, its keys keep their indices and
        the table's new keys get the next ones (the modes grow, never renumber).
    compression : {"fast", "small", "none"}
        Chunk compression profile: "fast" (default) decodes quickly, which streaming MTTKRP feels
        on every mode; "small" makes the smallest stores; "none" stores raw chunks (with their
        checksums), which streaming maps from the page cache instead of decoding (see
        ``tensorflow_ooc.store.codecs``).
    values_dtype : {"float64", "float32"}, optional
        How the values are stored (default: float32 for float32 input arrays, else float64).
        float32 halves the value bytes, for counts (exact below 2**24) and low-precision data;
        MTTKRP and CP-ALS still compute in the factors' dtype. A value beyond float32's range
        is an error naming its coordinates.
    index_encoding : {"delta32", "delta64"}, optional
        How the index is stored (format version 2; see docs/FORMAT.md). Default: ``delta32``
        (32-bit differences, patched where a gap is wider; about 4x quicker to decompress) unless
        more than 1/256 of the first chunk's gaps need 64 bits (hypersparse tensors), then
        ``delta64``.

    Returns
    -------
    Store

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> coords = np.array([[0, 0, 0], [1, 2, 3]])
    >>> s = tfo.convert((coords, np.array([1.0, 2.0])), "memory://doc-convert", shape=(2, 3, 4))
    >>> s.shape, s.nnz
    ((2, 3, 4), 2)
    """
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {duplicates!r}")
    check_compression(compression)
    if index_encoding is not None and index_encoding not in ENCODINGS:
        raise ValueError(f"index_encoding must be one of {list(ENCODINGS)}, got {index_encoding!r}")
    if values_dtype is not None and np.dtype(values_dtype) not in (np.float32, np.float64):
        raise ValueError(f"values_dtype must be float64 or float32, got {values_dtype!r}")
    from ..store import paths as store_paths
    from ..store.destinations import holding
    from ..store.output_claim import claim_outputs

    # before anything is read or written: the store apart from the input, replacing only what
    # this package wrote, and one writer at a time (held until the store is published)
    inputs = {"source": source} if isinstance(source, (str, os.PathLike)) else {}
    with claim_outputs({"store": store}, inputs, f"convert to {store}", temporaries={"tmp_dir": tmp_dir}):
        if not overwrite and store_paths.exists(store):
            # before any input is read: parsing a 193 MB file took 12.8 s only to be refused here
            raise StoreExistsError(f"{store}: already holds {holding(store).text}; pass overwrite=True to replace it")
        chunk_nnz = int(chunk_nnz or DEFAULT_CHUNK_NNZ)
        max_block_nnz = int(max_block_nnz or DEFAULT_MAX_BLOCK_NNZ)
        workers = int(workers or os.cpu_count() or 1)
        t0 = time.perf_counter()
        rss0 = _rss()
        if memory_limit is None:
            budget = psutil.virtual_memory().available // 2
        else:
            memory_limit = parse_bytes(memory_limit)
            budget = memory_limit - rss0 - (32 << 20)
            if budget < MIN_BUDGET:
                least = -(-(rss0 + (32 << 20) + MIN_BUDGET) // 2**20)  # MiB, rounded up
                raise ValueError(
                    f"memory_limit={memory_limit} bytes ({int(memory_limit) / 2**20:.0f} MiB) is the peak memory "
                    f"of the whole process, which already holds {rss0 >> 20} MiB before converting (Python and its "
                    f"libraries): that leaves {max(budget, 0) >> 20} MiB for the conversion, which needs at least "
                    f"{MIN_BUDGET >> 20} MiB; give memory_limit={least}MiB or more, or leave it unset (half the "
                    f"available memory)"
                )
        # Parse pieces sized so that the in-flight pieces use a quarter of the budget.
        src0 = _table_source(source, modes, value, bucket, table_format, append_to, shape, budget, tmp_dir, store)
        if src0 is None:
            src0 = as_source(source, shape=shape, one_based=one_based, workers=workers, piece_bytes=32 << 20)
        try:
            if isinstance(src0, TextSource):
                per_line = _parse_bytes_per_nnz(src0.nmodes, 4) + src0.bytes_per_line
                src0.piece_bytes = int(
                    max(1 << 20, min(8 << 20, budget / 4 / workers / per_line * src0.bytes_per_line))
                )
            src: Source = src0
            if values_dtype is not None:
                src.value_dtype = np.dtype(values_dtype)
            given = shape if shape is not None else src.given_shape
            labels = None
            if modes is not None:
                log.info("pass 1: numbering the keys of %s", src.name)
                given = src.infer_shape()  # type: ignore[attr-defined]
                labels = src.labels()  # type: ignore[attr-defined]
            est_nnz = src.nnz_estimate()
            if isinstance(src, AltoRunSource):
                if shape is not None and tuple(int(x) for x in shape) != src.layout.shape:
                    raise ShapeError(f"shape {tuple(shape)} differs from the shape {src.layout.shape} of the ALTO runs")
                # the runs as they arrive, their merge, and the values
                in_memory_bytes = est_nnz * (2 * 8 * src.layout.nwords + 16)
            else:
                # coords + values as read, then ALTO words (up to two words assumed) sorted with their values
                in_memory_bytes = est_nnz * (8 * src.nmodes + 8 + 2 * (2 * 8 + 8) + 16)
            fits = in_memory_bytes <= budget if out_of_core is None else not out_of_core
            log.info(
                "converting %s (%s nonzeros estimated) -> %s, %s",
                src.name,
                f"{est_nnz:,}",
                store,
                "in memory" if fits else f"out of core (budget {budget >> 20} MiB)",
            )
            writer_args = {
                "chunk_nnz": chunk_nnz,
                "max_block_nnz": max_block_nnz,
                "overwrite": overwrite,
                "compression": compression,
                "index_encoding": index_encoding,
                "labels": labels,
            }
            attrs = {
                "input": src.name,
                "one_based": bool(one_based) if isinstance(src, TextSource) else False,
                "duplicates": duplicates,
            }
            if modes is not None:
                attrs["table"] = {"modes": list(modes), "value": value, "bucket": dict(bucket or {})}
            if not store_paths.is_url(store):
                # half-written stores and bucket folders that killed runs left beside this one
                clean_stale(store_paths.local_path(store).absolute().parent)
            try:
                if fits and isinstance(src, AltoRunSource):
                    result = _convert_runs_in_memory(src, store, duplicates, writer_args, progress, attrs)
                elif fits:
                    result = _convert_in_memory(src, store, given, duplicates, writer_args, progress, attrs)
                else:
                    result = _convert_out_of_core(
                        src, store, given, duplicates, writer_args, progress, attrs, budget, tmp_dir, sort_nnz
                    )
            except DuplicateError as exc:
                if exc.path is None and isinstance(src, TextSource):
                    raise DuplicateError(exc.problem, src.path) from None
                raise
            except OSError as exc:
                if isinstance(exc, DiskFullError) or not is_disk_full(exc):
                    raise
                raise disk_full_error(exc, store) from exc  # a write no site below named
            log.info("converted %s nonzeros in %.2f s", f"{result.nnz:,}", time.perf_counter() - t0)
            if fiber_index:
                result = with_fiber_index(result, fiber_index, fiber_chunk_nnz, budget, progress)
            return result
        finally:
            if hasattr(src0, "close"):
                src0.close()  # a table's spilled rows


def _table_source(
    source, modes, value, bucket, table_format, append_to, shape, budget, tmp_dir, store
) -> Source | None:
    """The table source of ``convert``'s table arguments, or None for other inputs."""
    table_args = {"value": value, "bucket": bucket, "table_format": table_format, "append_to": append_to}
    if modes is None:
        given = [k for k, v in table_args.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to tables only: name the key columns with modes=")
        from .table_options import is_table_location

        if isinstance(source, (str, os.PathLike)):
            if is_table_location(str(source)):
                raise ValueError(
                    f"{source} is a table: name its key columns, one per mode, with modes= (tfooc convert --modes)"
                )
            return None
        from .table_source import is_table

        if is_table(source):
            raise ValueError("a table needs modes=: the columns that are the modes, in order")
        return None
    if shape is not None:
        raise ValueError("a table's shape is the number of keys of each mode: give no shape")
    from .table_source import TableSource

    base = None
    if append_to is not None:
        from ..store.paths import resolve_version

        # a versioned store folder appends to its latest version
        base = append_to if isinstance(append_to, Store) else open_store(resolve_version(append_to))
    # batches of rows sized so that one batch's columns and coordinates take a sixteenth of the budget
    rows = int(min(1 << 22, max(1 << 14, budget // 16 // (40 * (len(modes) + 1)))))
    from ..store import paths as store_paths

    spill = tmp_dir or (None if store_paths.is_url(store) else str(store_paths.local_path(store).absolute().parent))
    return TableSource(
        source,
        modes,
        value=value,
        bucket=bucket,
        table_format=table_format,
        base=base,
        batch_rows=rows,
        spill_dir=spill,
        target=str(store),
    )


def with_fiber_index(store: Store, modes, chunk_nnz: int | None, budget: int | None, progress: bool) -> Store:
    """``store`` (just written) with its fiber index for ``modes``; a build that fails removes the
    store, as a failed conversion leaves nothing."""
    from ..store import paths as store_paths
    from .fiber_index_build import build_fiber_index

    try:
        build_fiber_index(store, modes, chunk_nnz=chunk_nnz, memory_limit=budget, progress=progress)
    except BaseException:
        store_paths.remove(store.path)
        raise
    return open_store(store.path)


def _progress(total: int, desc: str, unit: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=not enabled, leave=False)


def _read_all(src: Source, shape, progress: bool) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """All batches of a source, with the per-mode max index."""
    coords_parts, value_parts = [], []
    mx = np.full(src.nmodes, -1, dtype=np.int64)
    is_text = isinstance(src, TextSource)
    with _progress(
        src.size_bytes() if is_text else src.nnz_estimate(), "parse", "B" if is_text else "nz", progress and is_text
    ) as bar:
        if is_text:
            for piece in src.pieces(shape):
                coords_parts.append(piece.coords)
                value_parts.append(piece.values)
                np.maximum(mx, piece.max, out=mx)
                bar.update(piece.nbytes)
        else:
            for c, v in src.batches(shape):
                coords_parts.append(c)
                value_parts.append(v)
                np.maximum(mx, c.max(axis=0), out=mx)
    return coords_parts, value_parts, mx


def _convert_in_memory(src, store, shape, duplicates, writer_args, progress, attrs) -> Store:
    coords_parts, value_parts, mx = _read_all(src, shape, progress)
    if shape is None:
        shape = src.shape_from_max(mx)
    layout = BitLayout(tuple(shape))
    total = sum(c.shape[0] for c in coords_parts)
    # linearize piece by piece into one key array: the coordinates are never concatenated
    keys = np.empty((layout.nwords, total), dtype=np.uint64)
    values = np.empty(total, dtype=src.value_dtype)
    pos = 0
    while coords_parts:
        c, v = coords_parts.pop(0), value_parts.pop(0)
        keys[:, pos : pos + c.shape[0]] = alto_words(c, layout)
        values[pos : pos + c.shape[0]] = v
        pos += c.shape[0]
    keys, values = sort_nonzeros(keys, values, layout, duplicates, one_based_report=attrs["one_based"])
    with StoreWriter(store, layout, src.value_dtype, keys.shape[1], attrs=attrs, **writer_args) as w:
        w.append(keys, values)
        path = w.commit()
    return open_store(path)


def _convert_runs_in_memory(src: AltoRunSource, store, duplicates, writer_args, progress, attrs) -> Store:
    """Sorted runs: gather them side by side, merge once, write."""
    layout = src.layout
    cap = max(1, src.nnz_estimate())
    keys = np.empty((layout.nwords, cap), dtype=np.uint64)
    values = None if src.values_of is not None else np.empty(cap, dtype=src.value_dtype)
    bounds = [0]
    with _progress(cap, "generate" if "generator" in src.name else "read", "nz", progress) as bar:
        for k, v in src.runs():
            s, n = bounds[-1], k.shape[1]
            if s + n > keys.shape[1]:  # more than announced: grow
                grow = max(s + n, int(keys.shape[1] * 1.5))
                keys = np.concatenate([keys[:, :s], np.empty((layout.nwords, grow - s), np.uint64)], axis=1)
                if values is not None:
                    values = np.concatenate([values[:s], np.empty(grow - s, values.dtype)])
            keys[:, s : s + n] = k
            if values is not None:
                values[s : s + n] = v
            bounds.append(s + n)
            bar.update(n)
    total = bounds[-1]
    if total == 0:
        raise IngestError("input has no nonzeros", src.name)
    t0 = time.perf_counter()
    keys, values = merge_runs(
        keys[:, :total], np.array(bounds, dtype=np.int64), None if values is None else values[:total]
    )
    if values is None:
        values = src.values_of(keys)
    keys, values = apply_duplicates(keys, values, layout, duplicates)
    log.info("merged %d sorted runs of %s nonzeros in %.2f s", len(bounds) - 1, f"{total:,}", time.perf_counter() - t0)
    with StoreWriter(store, layout, src.value_dtype, keys.shape[1], attrs=attrs, **writer_args) as w:
        w.append(keys, values)
        path = w.commit()
    return open_store(path)


def _convert_out_of_core(
    src, store, shape, duplicates, writer_args, progress, attrs, budget, tmp_dir, sort_nnz
) -> Store:
    runs = isinstance(src, AltoRunSource)
    if runs:
        layout = src.layout
    else:
        if shape is None:
            log.info("pass 1: inferring the shape of %s", src.name)
            shape = src.infer_shape()
        layout = BitLayout(tuple(shape))
    limit_heap_growth()
    # runs: loaded words + their merge + values; otherwise the radix sort's working set
    per_nnz = 2 * 8 * layout.nwords + 16 if runs else _sort_bytes_per_nnz(layout)
    # a sorted bucket also passes through the writer (chunk copies, compression buffers): 40 % for the sort
    sort_capacity = int(sort_nnz) if sort_nnz else max(1024, int(budget * 0.4) // per_nnz)
    est = src.nnz_estimate()
    bits = min(layout.total_bits, MAX_BUCKET_BITS, max(0, math.ceil(math.log2(max(1, 2 * est / sort_capacity)))))
    nbuckets = 1 << bits
    from ..store import paths as store_paths

    if tmp_dir is None:
        tmp_dir = (
            tempfile.gettempdir() if store_paths.is_url(store) else str(store_paths.local_path(store).absolute().parent)
        )
    if store_paths.is_url(store) or os.path.abspath(tmp_dir) != str(store_paths.local_path(store).absolute().parent):
        clean_stale(tmp_dir)  # bucket folders of killed runs (beside the store: cleaned already)
    workdir = make_bucket_dir(tmp_dir, str(store))
    with_values = not (runs and src.values_of is not None)
    spill = None
    log.info(
        "partitioning into %d on-disk buckets under %s (sort capacity %s nonzeros%s)",
        nbuckets,
        workdir,
        f"{sort_capacity:,}",
        "" if with_values else "; values recomputed from the indices, not spilled",
    )
    try:
        try:
            spill = BucketSpill(workdir, nbuckets, layout.nwords, np.dtype(src.value_dtype), with_values=with_values)
            is_text = isinstance(src, TextSource)
            t0 = time.perf_counter()
            with _progress(
                src.size_bytes() if is_text else est, "partition", "B" if is_text else "nz", progress
            ) as bar:
                if runs:
                    for keys, values in src.runs():
                        spill.write(None, keys, values if with_values else None, sorted_run=True, hi=layout.total_bits)
                        bar.update(keys.shape[1])
                        del keys, values
                        trim()
                else:
                    batch_nnz = max(16, sort_capacity // 4)
                    for coords, values in src.batches(shape, batch_nnz):
                        keys = alto_words(coords, layout)
                        bucket = (
                            top_bits(keys, layout, layout.total_bits, bits)
                            if bits
                            else np.zeros(keys.shape[1], np.int64)
                        )
                        spill.write(bucket, keys, np.asarray(values, dtype=src.value_dtype))
                        trim()
                        log.debug("partitioned %d nonzeros, rss %d MiB", keys.shape[1], _rss() >> 20)
                        bar.update(coords.shape[0] * (src.bytes_per_line if is_text else 1))
                        del coords, values, keys, bucket
            spill.close()
        except OSError as exc:
            if not is_disk_full(exc) or spill is None:
                raise
            spill.abandon()
            shutil.rmtree(workdir, ignore_errors=True)
            # the buckets of the whole input, at the bytes per nonzero of those spilled so far
            done, spilled = int(spill.counts.sum()), int(spill.nbytes.sum())
            per_nnz = spilled / done if done else 8 * layout.nwords + np.dtype(src.value_dtype).itemsize
            raise disk_full_error(exc, workdir, needed=int(per_nnz * max(est, done))) from exc
        total = int(spill.counts.sum())
        if total == 0:
            raise IngestError("input has no nonzeros", src.name)
        log.info(
            "partitioned %s nonzeros in %.1f s: %s MiB of buckets, %.2f bytes per nonzero",
            f"{total:,}",
            time.perf_counter() - t0,
            f"{spill.nbytes.sum() / 2**20:,.1f}",
            spill.nbytes.sum() / total,
        )
        log.debug("partition done: rss %d MiB, bucket sizes %s", _rss() >> 20, spill.counts.tolist())
        values_of = src.values_of if runs else None
        with (
            StoreWriter(store, layout, src.value_dtype, total, attrs=attrs, flush_chunks=1, **writer_args) as w,
            _progress(total, "merge+write" if runs else "sort+write", "nz", progress) as bar,
        ):
            for b in range(nbuckets):
                _write_bucket(
                    spill,
                    b,
                    int(spill.counts[b]),
                    layout.total_bits - bits,
                    layout,
                    w,
                    duplicates,
                    sort_capacity,
                    workdir,
                    attrs["one_based"],
                    bar,
                    values_of,
                )
            path = w.commit()
    finally:
        if spill is not None:
            spill.abandon()
        shutil.rmtree(workdir, ignore_errors=True)
    return open_store(path)


def _write_bucket(
    spill: BucketSpill,
    b: int,
    count: int,
    hi: int,
    layout: BitLayout,
    writer: StoreWriter,
    duplicates: str,
    capacity: int,
    workdir: str,
    one_based: bool,
    bar: tqdm,
    values_of=None,
) -> None:
    """Order one bucket (bits below ``hi`` still unordered) and append it; split it again if too big.

    A bucket of sorted runs is merged; anything else is radix sorted. ``values_of`` computes the
    values of a bucket spilled without them.
    """
    if count == 0:
        spill.discard(b)
        return
    if count <= capacity or hi == 0:
        if count > capacity:
            # hi == 0: every nonzero here has the same coordinate; merge while streaming.
            _write_identical(spill, b, count, layout, writer, duplicates, one_based, bar, values_of)
            return
        keys, values, bounds = spill.load(b)
        if bounds is not None:
            keys, values = merge_runs(keys, bounds, values)
            if values is None:
                values = values_of(keys)
            keys, values = apply_duplicates(keys, values, layout, duplicates, one_based)
        else:
            if values is None:
                values = values_of(keys)
            keys, values = sort_nonzeros(keys, values, layout, duplicates, one_based_report=one_based)
        log.debug("bucket %d: %d nonzeros ordered, rss %d MiB", b, count, _rss() >> 20)
        writer.append(keys, values)
        del keys, values
        trim()
        log.debug("bucket %d appended, rss %d MiB", b, _rss() >> 20)
        bar.update(count)
        return
    bits = min(hi, MAX_BUCKET_BITS, max(1, math.ceil(math.log2(2 * count / capacity))))
    log.debug(
        "bucket of %d nonzeros exceeds the sort capacity %d: splitting on ALTO bits [%d, %d)",
        count,
        capacity,
        hi - bits,
        hi,
    )
    subdir = tempfile.mkdtemp(prefix=f"b{b}-", dir=workdir)
    sub = BucketSpill(subdir, 1 << bits, layout.nwords, spill.value_dtype, with_values=spill.with_values)
    try:
        for keys, values, sorted_run in spill.frames(b):
            # a sorted frame split on lower bits gives sorted pieces: runs stay runs
            sub.write(
                None if sorted_run else top_bits(keys, layout, hi, bits), keys, values, sorted_run=sorted_run, hi=hi
            )
        spill.discard(b)
        sub.close()
    finally:
        sub.abandon()
    for s in range(1 << bits):
        _write_bucket(
            sub,
            s,
            int(sub.counts[s]),
            hi - bits,
            layout,
            writer,
            duplicates,
            capacity,
            subdir,
            one_based,
            bar,
            values_of,
        )
    shutil.rmtree(subdir, ignore_errors=True)


def _write_identical(spill, b, count, layout, writer, duplicates, one_based, bar, values_of=None) -> None:
    """A bucket larger than memory whose nonzeros all share one coordinate: merge while streaming."""
    first_keys, acc, seen = None, 0.0, 0
    for keys, values, _ in spill.frames(b):
        if values is None:
            values = values_of(keys)
        seen += keys.shape[1]
        if duplicates == "error" and seen > 1:
            raise duplicate_error(keys, 0, layout, one_based)
        if first_keys is None:
            first_keys = keys[:, :1].copy()
        acc = float(values[-1]) if duplicates == "last" else acc + float(values.sum())
    spill.discard(b)
    writer.append(first_keys, np.array([acc], dtype=spill.value_dtype))
    bar.update(count)
