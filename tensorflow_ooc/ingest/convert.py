"""``convert``: any supported input -> BLCO Zarr store, in memory or out of core.

In memory: read all batches, linearize, radix-sort, write. Out of core (the input does not fit the
memory budget): parse batches -> ALTO words -> radix-partition by the top bits of the ALTO index
into on-disk buckets (buckets are therefore in global ALTO order) -> sort each bucket in memory ->
append to the store. A bucket that is still too big (skewed data) is partitioned again on the next
bits. Peak memory follows the budget, not the input size.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any, Sequence

import numba as nb
import numpy as np
import psutil
from tqdm.auto import tqdm

from ..errors import DuplicateError, IngestError
from ..format import DEFAULT_MAX_BLOCK_NNZ, BitLayout, alto_words, sort_nonzeros, top_bits
from ..format.blco import duplicate_error
from ..format.blocking import DUPLICATE_POLICIES
from ..store import DEFAULT_CHUNK_NNZ, Store, StoreWriter, open_store
from ..store.codecs import DEFAULT_COMPRESSION, check_compression
from .memory import limit_heap_growth, rss as _rss, trim
from .sources import Source, TextSource, as_source

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


class BucketSpill:
    """On-disk buckets of (ALTO words, values), one pair of files per bucket."""

    def __init__(self, directory: str, nbuckets: int, nwords: int, value_dtype: np.dtype) -> None:
        self.dir = directory
        self.nbuckets = nbuckets
        self.nwords = nwords
        self.value_dtype = value_dtype
        self.counts = np.zeros(nbuckets, dtype=np.int64)
        self.key_files = [open(os.path.join(directory, f"k{b:05d}.bin"), "wb") for b in range(nbuckets)]
        self.val_files = [open(os.path.join(directory, f"v{b:05d}.bin"), "wb") for b in range(nbuckets)]

    def write(self, bucket: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        order, offsets = _bucket_order(bucket, self.nbuckets)
        keys_t = keys.T[order]            # (n, nwords) rows in bucket order
        vals = values[order]
        nonempty = np.flatnonzero(np.diff(offsets))
        for b in nonempty:
            s, e = offsets[b], offsets[b + 1]
            keys_t[s:e].tofile(self.key_files[b])
            vals[s:e].tofile(self.val_files[b])
            self.counts[b] += e - s

    def close(self) -> None:
        for f in self.key_files + self.val_files:
            f.close()

    def load(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        keys = np.fromfile(os.path.join(self.dir, f"k{b:05d}.bin"), dtype=np.uint64).reshape(-1, self.nwords)
        vals = np.fromfile(os.path.join(self.dir, f"v{b:05d}.bin"), dtype=self.value_dtype)
        self.discard(b)
        return np.ascontiguousarray(keys.T), vals

    def discard(self, b: int) -> None:
        for prefix in ("k", "v"):
            p = os.path.join(self.dir, f"{prefix}{b:05d}.bin")
            if os.path.exists(p):
                os.remove(p)

    def iter_chunks(self, b: int, nnz: int):
        """Stream a bucket back in pieces of ``nnz`` nonzeros (for re-partitioning)."""
        kp = os.path.join(self.dir, f"k{b:05d}.bin")
        vp = os.path.join(self.dir, f"v{b:05d}.bin")
        with open(kp, "rb") as kf, open(vp, "rb") as vf:
            while True:
                k = np.fromfile(kf, dtype=np.uint64, count=nnz * self.nwords)
                if k.size == 0:
                    break
                v = np.fromfile(vf, dtype=self.value_dtype, count=k.size // self.nwords)
                yield np.ascontiguousarray(k.reshape(-1, self.nwords).T), v
        self.discard(b)


def convert(source: Any, store: str | os.PathLike, *, shape: Sequence[int] | None = None, one_based: bool = True,
            duplicates: str = "error", chunk_nnz: int | None = None, max_block_nnz: int | None = None,
            memory_limit: int | None = None, overwrite: bool = False, progress: bool = False,
            workers: int | None = None, tmp_dir: str | None = None, out_of_core: bool | None = None,
            sort_nnz: int | None = None, compression: str = DEFAULT_COMPRESSION) -> Store:
    """Convert a sparse tensor into a BLCO Zarr store.

    Parameters
    ----------
    source : str or PathLike, tuple, sparse.COO, scipy.sparse matrix, pyttb.sptensor
        A FROSTT ``.tns`` / ``.tns.gz`` file, or ``(coords, values)`` with 0-based ``coords``
        (nnz, nmodes), or a pydata-sparse / scipy / pyttb sparse object.
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
    memory_limit : int, optional
        Bytes the converting process may hold (peak RSS). Inputs that do not fit are converted out
        of core. Default: half of the available memory.
    overwrite : bool
        Replace an existing store.
    progress : bool
        Show progress bars.
    workers : int, optional
        Parallel parse tasks (default: cores).
    tmp_dir : str, optional
        Where out-of-core buckets go (default: beside the store, or the system temp dir for URLs).
    out_of_core : bool, optional
        Force (True) or forbid (False) the out-of-core path; default: out of core when the input
        does not fit the memory budget.
    sort_nnz : int, optional
        Out of core: most nonzeros sorted in memory at once (default: from the memory budget).
    compression : {"fast", "small"}
        Chunk compression profile: "fast" (default) decodes quickly, which streaming MTTKRP feels
        on every mode; "small" makes the smallest stores (see ``tensorflow_ooc.store.codecs``).

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
    chunk_nnz = int(chunk_nnz or DEFAULT_CHUNK_NNZ)
    max_block_nnz = int(max_block_nnz or DEFAULT_MAX_BLOCK_NNZ)
    workers = int(workers or os.cpu_count() or 1)
    t0 = time.perf_counter()
    rss0 = _rss()
    if memory_limit is None:
        budget = psutil.virtual_memory().available // 2
    else:
        budget = int(memory_limit) - rss0 - (32 << 20)
        if budget < MIN_BUDGET:
            raise ValueError(f"memory_limit={memory_limit} bytes leaves {max(budget, 0) >> 20} MiB of working memory "
                             f"beside the {rss0 >> 20} MiB this process already uses; at least "
                             f"{MIN_BUDGET >> 20} MiB are needed")
    # Parse pieces sized so that the in-flight pieces use a quarter of the budget.
    src0 = as_source(source, shape=shape, one_based=one_based, workers=workers,
                     piece_bytes=32 << 20)
    if isinstance(src0, TextSource):
        per_line = _parse_bytes_per_nnz(src0.nmodes, 4) + src0.bytes_per_line
        src0.piece_bytes = int(max(1 << 20, min(8 << 20, budget / 4 / workers / per_line * src0.bytes_per_line)))
    src: Source = src0
    given = shape if shape is not None else src.given_shape
    est_nnz = src.nnz_estimate()
    # coords + values as read, then ALTO words (up to two words assumed) sorted with their values
    in_memory_bytes = est_nnz * (8 * src.nmodes + 8 + 2 * (2 * 8 + 8) + 16)
    fits = in_memory_bytes <= budget if out_of_core is None else not out_of_core
    log.info("converting %s (%s nonzeros estimated) -> %s, %s", src.name, f"{est_nnz:,}", store,
             "in memory" if fits else f"out of core (budget {budget >> 20} MiB)")
    writer_args = {"chunk_nnz": chunk_nnz, "max_block_nnz": max_block_nnz, "overwrite": overwrite,
                   "compression": compression}
    attrs = {"input": src.name, "one_based": bool(one_based) if isinstance(src, TextSource) else False,
             "duplicates": duplicates}
    try:
        if fits:
            result = _convert_in_memory(src, store, given, duplicates, writer_args, progress, attrs)
        else:
            result = _convert_out_of_core(src, store, given, duplicates, writer_args, progress, attrs, budget,
                                          tmp_dir, sort_nnz)
    except DuplicateError as exc:
        if exc.path is None and isinstance(src, TextSource):
            raise DuplicateError(exc.problem, src.path) from None
        raise
    log.info("converted %s nonzeros in %.2f s", f"{result.nnz:,}", time.perf_counter() - t0)
    return result


def _progress(total: int, desc: str, unit: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=not enabled, leave=False)


def _read_all(src: Source, shape, progress: bool) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """All batches of a source, with the per-mode max index."""
    coords_parts, value_parts = [], []
    mx = np.full(src.nmodes, -1, dtype=np.int64)
    is_text = isinstance(src, TextSource)
    with _progress(src.size_bytes() if is_text else src.nnz_estimate(), "parse", "B" if is_text else "nz",
                   progress and is_text) as bar:
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
        shape = tuple(int(m) + 1 for m in mx)
    layout = BitLayout(tuple(shape))
    total = sum(c.shape[0] for c in coords_parts)
    # linearize piece by piece into one key array: the coordinates are never concatenated
    keys = np.empty((layout.nwords, total), dtype=np.uint64)
    values = np.empty(total, dtype=src.value_dtype)
    pos = 0
    while coords_parts:
        c, v = coords_parts.pop(0), value_parts.pop(0)
        keys[:, pos:pos + c.shape[0]] = alto_words(c, layout)
        values[pos:pos + c.shape[0]] = v
        pos += c.shape[0]
    keys, values = sort_nonzeros(keys, values, layout, duplicates, one_based_report=attrs["one_based"])
    with StoreWriter(store, layout, src.value_dtype, keys.shape[1], attrs=attrs, **writer_args) as w:
        w.append(keys, values)
        path = w.commit()
    return open_store(path)


def _convert_out_of_core(src, store, shape, duplicates, writer_args, progress, attrs, budget, tmp_dir,
                         sort_nnz) -> Store:
    if shape is None:
        log.info("pass 1: inferring the shape of %s", src.name)
        shape = src.infer_shape()
    layout = BitLayout(tuple(shape))
    limit_heap_growth()
    per_nnz = _sort_bytes_per_nnz(layout)
    # a sorted bucket also passes through the writer (chunk copies, compression buffers): 40 % for the sort
    sort_capacity = int(sort_nnz) if sort_nnz else max(1024, int(budget * 0.4) // per_nnz)
    est = src.nnz_estimate()
    bits = min(layout.total_bits, MAX_BUCKET_BITS, max(0, math.ceil(math.log2(max(1, 2 * est / sort_capacity)))))
    nbuckets = 1 << bits
    if tmp_dir is None:
        from ..store import paths as store_paths
        tmp_dir = None if store_paths.is_url(store) else str(store_paths.local_path(store).absolute().parent)
    if tmp_dir is not None:
        os.makedirs(tmp_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=".tfooc-buckets-", dir=tmp_dir)
    log.info("partitioning into %d on-disk buckets under %s (sort capacity %s nonzeros)",
             nbuckets, workdir, f"{sort_capacity:,}")
    try:
        spill = BucketSpill(workdir, nbuckets, layout.nwords, np.dtype(src.value_dtype))
        is_text = isinstance(src, TextSource)
        with _progress(src.size_bytes() if is_text else est, "partition", "B" if is_text else "nz", progress) as bar:
            batch_nnz = max(16, sort_capacity // 4)
            for coords, values in src.batches(shape, batch_nnz):
                keys = alto_words(coords, layout)
                bucket = top_bits(keys, layout, layout.total_bits, bits) if bits else np.zeros(keys.shape[1], np.int64)
                spill.write(bucket, keys, np.asarray(values, dtype=src.value_dtype))
                trim()
                log.debug("partitioned %d nonzeros, rss %d MiB", keys.shape[1], _rss() >> 20)
                bar.update(coords.shape[0] * (src.bytes_per_line if is_text else 1))
                del coords, values, keys, bucket
        spill.close()
        log.debug("partition done: rss %d MiB, bucket sizes %s", _rss() >> 20, spill.counts.tolist())
        total = int(spill.counts.sum())
        if total == 0:
            raise IngestError("input has no nonzeros", src.name)
        with StoreWriter(store, layout, src.value_dtype, total, attrs=attrs, flush_chunks=1, **writer_args) as w, \
                _progress(total, "sort+write", "nz", progress) as bar:
            for b in range(nbuckets):
                _write_bucket(spill, b, int(spill.counts[b]), layout.total_bits - bits, layout, w, duplicates,
                              sort_capacity, workdir, attrs["one_based"], bar)
            path = w.commit()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return open_store(path)


def _write_bucket(spill: BucketSpill, b: int, count: int, hi: int, layout: BitLayout, writer: StoreWriter,
                  duplicates: str, capacity: int, workdir: str, one_based: bool, bar: tqdm) -> None:
    """Sort one bucket (bits below ``hi`` still unsorted) and append it; split it again if too big."""
    if count == 0:
        spill.discard(b)
        return
    if count <= capacity or hi == 0:
        if count > capacity:
            # hi == 0: every nonzero here has the same coordinate; merge while streaming.
            _write_identical(spill, b, count, layout, writer, duplicates, one_based, bar)
            return
        keys, values = spill.load(b)
        keys, values = sort_nonzeros(keys, values, layout, duplicates, one_based_report=one_based)
        log.debug("bucket %d: %d nonzeros sorted, rss %d MiB", b, count, _rss() >> 20)
        writer.append(keys, values)
        del keys, values
        trim()
        log.debug("bucket %d appended, rss %d MiB", b, _rss() >> 20)
        bar.update(count)
        return
    bits = min(hi, MAX_BUCKET_BITS, max(1, math.ceil(math.log2(2 * count / capacity))))
    log.debug("bucket of %d nonzeros exceeds the sort capacity %d: splitting on ALTO bits [%d, %d)",
              count, capacity, hi - bits, hi)
    subdir = tempfile.mkdtemp(prefix=f"b{b}-", dir=workdir)
    sub = BucketSpill(subdir, 1 << bits, layout.nwords, spill.value_dtype)
    for keys, values in spill.iter_chunks(b, max(16, capacity // 4)):
        sub.write(top_bits(keys, layout, hi, bits), keys, values)
    sub.close()
    for s in range(1 << bits):
        _write_bucket(sub, s, int(sub.counts[s]), hi - bits, layout, writer, duplicates, capacity, subdir,
                      one_based, bar)
    shutil.rmtree(subdir, ignore_errors=True)


def _write_identical(spill, b, count, layout, writer, duplicates, one_based, bar) -> None:
    """A bucket larger than memory whose nonzeros all share one coordinate: merge while streaming."""
    first_keys, acc = None, 0.0
    for keys, values in spill.iter_chunks(b, 1 << 16):
        if duplicates == "error":
            raise duplicate_error(keys, 0, layout, one_based)
        if first_keys is None:
            first_keys = keys[:, :1].copy()
        acc = float(values[-1]) if duplicates == "last" else acc + float(values.sum())
    writer.append(first_keys, np.array([acc], dtype=spill.value_dtype))
    bar.update(count)
