"""Write a BLCO Zarr store from ALTO-sorted nonzeros, in order, with bounded memory.

The writer is fed sorted batches (globally in ALTO order), writes whole chunks as soon as they are
full, and builds the block table and per-chunk index ranges on the way. Local stores with the
package's codec chains get whole chunks encoded and written here (``DirectChunkWriter``, the same
bytes Zarr writes, about three times faster); other stores go through Zarr. Nothing is openable until
``commit``: local stores are written under a hidden name and renamed into place, URL stores get
their ``complete`` flag last. Any exception inside ``with StoreWriter(...)`` removes what was written.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr

from ..disk import disk_full_error, free_bytes, is_disk_full
from ..errors import DiskFullError, StoreExistsError, ValueRangeError
from ..format import BitLayout, BlockTable, block_table
from ..format.index_encoding import DELTA32, DELTA64, ENCODINGS, PATCH_MAX_FRACTION, encode_delta32, patch_fraction
from ..format.linearize import chunk_minmax
from ..version import __version__ as _pkg_version
from . import paths
from .chunk_files import ChunkFiles
from .codecs import (
    DEFAULT_COMPRESSION,
    IndexCodecs,
    StoredChain,
    TableCodecs,
    ValueCodecs,
    check_compression,
    quiet_numcodecs,
    value_padding,
)
from .destinations import check_replaceable
from .labels import write_labels
from .metadata import (
    CHECKSUM_KEY,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_KEY,
    arrays_checksum,
    meta_checksum,
    patches_checksum,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_NNZ = 1 << 20
FLUSH_CHUNKS = 4


def _delta_u8(x: np.ndarray, out: np.ndarray) -> None:
    """numcodecs Delta on uint64: out[0] = x[0], out[i] = x[i] - x[i - 1] (wrapping). NumPy, not a
    parallel kernel: waking numba's threads for a fiber index's 1024-entry chunks cost 2 ms a
    chunk on a loaded machine, 59 of a 92 s index build."""
    if x.shape[0]:
        out[0] = x[0]
        np.subtract(x[1:], x[:-1], out=out[1:])


def encoded_chunk(data: np.ndarray, delta: bool, blosc: numcodecs.Blosc | None) -> bytes:
    """A chunk's stored bytes before its CRC32C, as Zarr encodes them with this package's chains:
    Delta on uint64 (``delta``), little-endian bytes, then Blosc if given."""
    if delta:
        d = np.empty_like(data)
        _delta_u8(data, d)
        data = d
    return blosc.encode(data) if blosc is not None else data.view(np.uint8).tobytes()


class DirectChunkWriter:
    """Writes whole chunks of a local 1-D store array straight to their files.

    Zarr's write path spent about three times the encoding work itself (chunk copies, async
    dispatch); this applies the same codec chain (Delta on uint64, little-endian bytes, Blosc,
    CRC32C, or no Blosc for compression "none") with the same parameters and writes the file Zarr would: the bytes
    are identical, so
    Zarr and :class:`~tensorflow_ooc.store.chunk_files.ChunkFiles` read them as before (a test
    compares them). ``for_array`` returns None for any other chain or a non-local store.
    """

    def __init__(self, array: zarr.Array, root: Path, delta: bool, blosc: numcodecs.Blosc | None) -> None:
        self.array = array
        self.root = root
        self.delta = delta
        self.blosc = blosc
        self.chunk_len = int(array.chunks[0])
        self.dtype = np.dtype(array.dtype)
        self._dirs: set[Path] = set()

    @classmethod
    def for_array(cls, array: zarr.Array) -> "DirectChunkWriter | None":
        from zarr.storage import LocalStore

        if not isinstance(array.store, LocalStore) or array.ndim != 1:
            return None
        chain = StoredChain.of(array)
        if not chain.known:
            return None
        return cls(array, Path(array.store.root), chain.delta, chain.numcodecs_blosc())

    def write(self, c: int, data: np.ndarray) -> None:
        """Chunk ``c`` from exactly ``chunk_len`` elements."""
        from .chunk_files import _crc32c

        data = np.ascontiguousarray(data, dtype=self.dtype)
        if data.shape[0] != self.chunk_len:
            raise ValueError(f"a direct chunk write needs {self.chunk_len} elements, got {data.shape[0]}")
        body = encoded_chunk(data, self.delta, self.blosc)
        key = self.array.metadata.chunk_key_encoding.encode_chunk_key((c,))
        path = self.root / (f"{self.array.path}/{key}" if self.array.path else key)
        try:
            if path.parent not in self._dirs:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._dirs.add(path.parent)
            with open(path, "wb") as f:
                f.write(body)
                f.write(int(_crc32c(body)).to_bytes(4, "little"))
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            path.unlink(missing_ok=True)  # no half chunk stays behind
            raise disk_full_error(exc, path, needed=len(body) + 4) from exc


def _allocated_bytes(path: str) -> int:
    """Disk space the files under ``path`` take (their allocated blocks, not their sizes: a small
    file takes a whole block)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            total += max(st.st_size, getattr(st, "st_blocks", 0) * 512)
    return total


class StoreWriter:
    """Append ALTO-sorted nonzeros to a new store.

    Parameters
    ----------
    path : str or PathLike
        Destination, a local path or an fsspec URL.
    layout : BitLayout
    value_dtype : numpy dtype of the values
    capacity : int
        Upper bound on the number of nonzeros (arrays are shrunk to the real count on commit).
    chunk_nnz : nonzeros per chunk
    max_block_nnz : largest block
    overwrite : replace an existing store at ``path``
    attrs : extra provenance stored in the metadata
    flush_chunks : chunks buffered per write; each write compresses its chunks concurrently, so
        memory-bounded callers use 1
    compression : "fast" (default, quick to decode) or "small"; see ``store.codecs``
    index_encoding : "delta32", "delta64" or None (default: ``delta32`` unless more than
        ``PATCH_MAX_FRACTION`` of the first chunk's gaps need patches); see
        :mod:`~tensorflow_ooc.format.index_encoding`
    labels : (mode names, keys per mode as pyarrow Arrays), optional
        The label dictionaries of a table's modes, written in the store (:mod:`.labels`)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        layout: BitLayout,
        value_dtype: Any,
        capacity: int,
        *,
        chunk_nnz: int = DEFAULT_CHUNK_NNZ,
        max_block_nnz: int = 1 << 24,
        overwrite: bool = False,
        attrs: dict | None = None,
        flush_chunks: int = FLUSH_CHUNKS,
        compression: str = DEFAULT_COMPRESSION,
        index_encoding: str | None = None,
        labels: tuple[list[str], list] | None = None,
    ) -> None:
        if index_encoding is not None and index_encoding not in ENCODINGS:
            raise ValueError(f"index_encoding must be one of {ENCODINGS} or None, got {index_encoding!r}")
        if chunk_nnz < 1 or max_block_nnz < 1:
            raise ValueError(f"chunk_nnz and max_block_nnz must be >= 1, got {chunk_nnz}, {max_block_nnz}")
        check_compression(compression)
        self.final_path = str(path)
        if paths.exists(path):
            held = check_replaceable(path)  # only what this package wrote is ever replaced
            if not overwrite:
                raise StoreExistsError(f"{path}: already holds {held.text}; pass overwrite=True to replace it")
        self.layout = layout
        self.value_dtype = np.dtype(value_dtype)
        self.chunk_nnz = int(chunk_nnz)
        self.max_block_nnz = int(max_block_nnz)
        self.overwrite = overwrite
        self.attrs = attrs or {}
        self.labels = labels
        self.flush_chunks = max(1, int(flush_chunks))
        self.compression = compression
        if paths.is_url(path) and paths.exists(path):
            paths.remove(path)
        self.staging = None
        self.capacity = max(int(capacity), 1)
        self.written = 0
        try:
            self.staging = paths.staging_path(path)
            self.root = zarr.open_group(self.staging, mode="w", zarr_format=3)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            if self.staging is not None:
                paths.remove(self.staging)
            raise self._after_abort(self._disk_full(exc)) from exc
        self.index_encoding = index_encoding
        # both created at the first write, when the encoding and codec can look at the data
        self.alto = None
        self.values = None
        self.patch_positions: list[np.ndarray] = []  # delta32: global positions and words
        self.patch_words: list[np.ndarray] = []
        self.written = 0  # nonzeros flushed to the arrays
        self.received = 0  # nonzeros appended (flushed + pending)
        self.pending_keys: list[np.ndarray] = []
        self.pending_vals: list[np.ndarray] = []
        self.pending_n = 0
        self.tables: list[BlockTable] = []
        self.chunk_min: list[np.ndarray] = []
        self.chunk_max: list[np.ndarray] = []
        self.norm_sq = 0.0
        self.committed = False
        self._direct: tuple | None = None
        self.t0 = time.perf_counter()

    # --- feeding ---------------------------------------------------------------------------------

    def append(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Append nonzeros whose ALTO words ``keys`` (nwords, n) are sorted and follow all earlier ones."""
        n = keys.shape[1]
        if n == 0:
            return
        self._extend_blocks(block_table(keys, self.layout, self.max_block_nnz, offset=self.received))
        with np.errstate(over="ignore"):  # an overflow is refused here or at commit, naming it
            stored = np.asarray(values, dtype=self.value_dtype)
            if stored.dtype.itemsize < 8:
                # overflowed, or a nonzero gone subnormal or 0: the stored tensor would not be the input
                bad = ~np.isfinite(stored) | (
                    (np.abs(stored) < np.finfo(stored.dtype).tiny) & (np.asarray(values) != 0)
                )
                if bad.any():
                    self._refuse_narrowed(keys, values, stored, int(np.flatnonzero(bad)[0]))
            # ||X||^2 of the values as stored, so the fit is that of the stored tensor
            v64 = stored.astype(np.float64, copy=False)
            self.norm_sq += float(np.dot(v64, v64))
        self.pending_keys.append(keys)
        self.pending_vals.append(stored)
        self.pending_n += n
        self.received += n
        if self.pending_n >= self.flush_chunks * self.chunk_nnz:
            try:
                self._flush(final=False)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                raise self._disk_full(exc) from exc

    def _extend_blocks(self, new: BlockTable) -> None:
        """Join the new batch's first block to the previous last block when they share a key."""
        if self.tables and new.nblocks:
            last = self.tables[-1]
            if np.array_equal(last.key[-1], new.key[0]):
                room = self.max_block_nnz - int(last.count[-1])
                take = min(room, int(new.count[0]))
                if take > 0:
                    last.count[-1] += take
                    if take == new.count[0]:
                        new = BlockTable(new.key[1:], new.start[1:], new.count[1:], new.base[1:])
                    else:
                        new.start[0] += take
                        new.count[0] -= take
        if new.nblocks:
            self.tables.append(new)

    def _flush(self, final: bool) -> None:
        if not self.pending_n:
            return
        self._alto_array(self.pending_keys[0][0, : self.chunk_nnz])
        self._values_array(self.pending_vals[0][: self.chunk_nnz])
        if self._direct is None:
            self._direct = (DirectChunkWriter.for_array(self.alto), DirectChunkWriter.for_array(self.values))
        if all(self._direct):
            self._flush_direct(final)
            return
        keys = np.concatenate(self.pending_keys, axis=1) if len(self.pending_keys) > 1 else self.pending_keys[0]
        vals = np.concatenate(self.pending_vals) if len(self.pending_vals) > 1 else self.pending_vals[0]
        n = keys.shape[1] if final else (keys.shape[1] // self.chunk_nnz) * self.chunk_nnz
        if n == 0:
            return
        cmin, cmax = chunk_minmax(keys[:, :n], self.layout, self.chunk_nnz)
        self.chunk_min.extend(cmin)
        self.chunk_max.extend(cmax)
        if self.written + n > self.alto.shape[0]:
            raise RuntimeError(
                f"store writer received more nonzeros ({self.written + n}) than its capacity ({self.alto.shape[0]})"
            )
        step = self.flush_chunks * self.chunk_nnz
        for s in range(0, n, step):
            e = min(n, s + step)
            low = keys[0, s:e]
            if self.index_encoding == DELTA32:  # differences per chunk: each chunk starts with a patch
                low = np.concatenate(
                    [
                        self._delta32(low[a : a + self.chunk_nnz], self.written + s + a)
                        for a in range(0, e - s, self.chunk_nnz)
                    ]
                )
            self.alto[self.written + s : self.written + e] = low
            self.values[self.written + s : self.written + e] = vals[s:e]
        self.written += n
        self.pending_keys = [keys[:, n:].copy()] if n < keys.shape[1] else []
        self.pending_vals = [vals[n:].copy()] if n < keys.shape[1] else []
        self.pending_n = keys.shape[1] - n

    def _flush_direct(self, final: bool) -> None:
        """Whole chunks straight from the appended arrays to their files (views, no copies); only a
        chunk that straddles two appends is gathered, and the last, partial one goes through Zarr
        (which pads it). What stays pending is copied, so the caller's arrays can be freed."""
        C = self.chunk_nnz
        while self.pending_n >= C or (final and self.pending_n):
            take = min(C, self.pending_n)
            if self.pending_keys[0].shape[1] >= take:
                ck, cv = self.pending_keys[0][:, :take], self.pending_vals[0][:take]
                self.pending_keys[0] = self.pending_keys[0][:, take:]
                self.pending_vals[0] = self.pending_vals[0][take:]
            else:
                parts_k, parts_v, need = [], [], take
                while need:
                    k, v = self.pending_keys[0], self.pending_vals[0]
                    m = min(need, k.shape[1])
                    parts_k.append(k[:, :m])
                    parts_v.append(v[:m])
                    self.pending_keys[0], self.pending_vals[0] = k[:, m:], v[m:]
                    if self.pending_keys[0].shape[1] == 0:
                        self.pending_keys.pop(0)
                        self.pending_vals.pop(0)
                    need -= m
                ck, cv = np.concatenate(parts_k, axis=1), np.concatenate(parts_v)
            if self.pending_keys and self.pending_keys[0].shape[1] == 0:
                self.pending_keys.pop(0)
                self.pending_vals.pop(0)
            if self.written + take > self.alto.shape[0]:
                raise RuntimeError(
                    f"store writer received more nonzeros ({self.written + take}) than its "
                    f"capacity ({self.alto.shape[0]})"
                )
            cmin, cmax = chunk_minmax(ck, self.layout, C)
            self.chunk_min.extend(cmin)
            self.chunk_max.extend(cmax)
            low = self._delta32(ck[0], self.written) if self.index_encoding == DELTA32 else ck[0]
            if take == C:
                self._direct[0].write(self.written // C, low)
                self._direct[1].write(self.written // C, cv)
            else:
                self.alto[self.written : self.written + take] = low
                self.values[self.written : self.written + take] = cv
            self.written += take
            self.pending_n -= take
        self.pending_keys = [k.copy() for k in self.pending_keys]
        self.pending_vals = [v.copy() for v in self.pending_vals]

    def _delta32(self, words: np.ndarray, start: int) -> np.ndarray:
        """One chunk's stored ``delta32`` differences; its patches (from global position ``start``)
        join the table."""
        diffs, pos, word = encode_delta32(words)
        self.patch_positions.append(pos + start)
        self.patch_words.append(word)
        return diffs

    def _alto_array(self, sample: np.ndarray | None):
        """The index array, created on the first write with the encoding ``sample`` (the first
        chunk's low ALTO words) calls for, unless one was given."""
        if self.alto is None:
            if self.index_encoding is None:
                wide = sample is not None and patch_fraction(sample) > PATCH_MAX_FRACTION
                self.index_encoding = DELTA64 if wide else DELTA32
            options = IndexCodecs(self.compression, self.index_encoding).array_options()
            with quiet_numcodecs():  # the array's metadata re-creates its Delta filter
                self.alto = self.root.create_array(
                    "alto",
                    shape=(self.capacity,),
                    chunks=(self.chunk_nnz,),
                    dtype="<u4" if self.index_encoding == DELTA32 else "<u8",
                    fill_value=0,
                    **options,
                )
        return self.alto

    def _values_array(self, sample: np.ndarray | None):
        if self.values is None:
            # the capacity bounds the nonzeros from above: the padding is at least this
            codecs = ValueCodecs.for_sample(
                self.value_dtype, self.compression, sample, value_padding(self.capacity, self.chunk_nnz)
            )
            self.values_shuffle = codecs.shuffle
            self.values = self.root.create_array(
                "values",
                shape=(self.capacity,),
                chunks=(self.chunk_nnz,),
                dtype=self.value_dtype,
                fill_value=0,
                **codecs.array_options(),
            )
        return self.values

    # --- finishing -------------------------------------------------------------------------------

    def commit(self) -> str:
        """Write the remaining nonzeros, the tables and the metadata; publish the store. Returns its path."""
        try:
            return self._commit()
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise self._disk_full(exc) from exc

    def _disk_full(self, exc: OSError) -> DiskFullError:
        """A disk-full error at a write: the file named under the store's published name, and the
        bytes still needed estimated from what the nonzeros written so far took."""
        where = self.final_path
        inner = getattr(exc, "path", None) if isinstance(exc, DiskFullError) else None
        if inner and self.staging and inner.startswith(self.staging):
            where = self.final_path.rstrip("/") + inner[len(self.staging) :]
        done = _allocated_bytes(self.staging) if self.staging and not paths.is_url(self.staging) else 0
        per_nnz = done / self.written if self.written else 8 + self.value_dtype.itemsize
        # + the tables and metadata: a dozen small files, a block (4 KiB) each at least
        more = int(max(self.capacity - self.written, 0) * per_nnz) + (64 << 10)
        return DiskFullError(
            where, max(more, getattr(exc, "needed", None) or 0), done + more, free_bytes(where), exc.errno
        )

    def _refuse_narrowed(self, keys: np.ndarray, values: np.ndarray, stored: np.ndarray, k: int) -> None:
        """A value that the store's narrower value dtype cannot hold (it overflows, or a nonzero
        becomes subnormal or 0; inputs are finite: ingest refuses the others), named with its
        0-based coordinates."""
        from ..format.linearize import coords_from_words

        at = tuple(int(c) for c in coords_from_words(np.ascontiguousarray(keys[:, k : k + 1]), self.layout)[0])
        info = np.finfo(self.value_dtype)
        given = float(values[k])
        shown = f" ({given!r})" if math.isfinite(given) else ""
        what = (
            f"overflows {self.value_dtype.name} values (largest magnitude {float(info.max):.4g})"
            if not np.isfinite(stored[k])
            else f"is too small for {self.value_dtype.name} values (smallest normal magnitude {float(info.tiny):.4g})"
        )
        raise ValueRangeError(
            f"the value at 0-based coordinates {at}{shown} {what}; store float64 values instead "
            f"(values_dtype='float64')"
        )

    @staticmethod
    def _after_abort(exc: DiskFullError) -> DiskFullError:
        """Once what was written is removed: the whole store's size against the space now free."""
        return DiskFullError(exc.path, exc.total or exc.needed, None, free_bytes(exc.path), exc.errno)

    def _commit(self) -> str:
        if not math.isfinite(self.norm_sq):
            # each value's square is checked at ingest; their sum can still overflow
            raise ValueRangeError(
                f"{self.final_path}: the sum of the squared values (||X||^2) of {self.received:,} "
                f"nonzeros overflows float64 (above {sys.float_info.max:.4g}), so no fit could be "
                f"computed; rescale the data"
            )
        self._flush(final=True)
        nnz = self.written
        self._alto_array(None).resize((nnz,))
        self._values_array(None).resize((nnz,))
        blocks = BlockTable.concat(self.tables, self.layout)
        nchunks = len(self.chunk_min)
        tables = {
            "blocks/key": blocks.key,
            "blocks/start": blocks.start,
            "blocks/count": blocks.count,
            "blocks/base": blocks.base,
            "chunks/min": np.array(self.chunk_min, dtype=np.int64).reshape(nchunks, self.layout.nmodes),
            "chunks/max": np.array(self.chunk_max, dtype=np.int64).reshape(nchunks, self.layout.nmodes),
        }
        # each chunk's stored CRC32C, recorded per position: readers refuse chunks that were moved,
        # swapped, copied from elsewhere or deleted, which the per-chunk CRC alone cannot see
        for name, arr in (("alto", self.alto), ("values", self._values_array(None))):
            files = ChunkFiles(arr)
            tables[f"chunks/crc_{name}"] = np.array([files.stored_checksum(c) for c in range(nchunks)], dtype=np.int64)
        if self.index_encoding == DELTA32:
            tables["patches/position"] = np.concatenate([np.zeros(0, np.int64), *self.patch_positions])
            tables["patches/word"] = np.concatenate([np.zeros(0, np.uint64), *self.patch_words])
        for name, arr in tables.items():
            shape = arr.shape
            chunks = tuple(max(1, s) for s in shape)
            a = self.root.create_array(
                name, shape=shape, chunks=chunks, dtype=arr.dtype, fill_value=0, **TableCodecs().array_options()
            )
            if arr.size:
                a[...] = arr
        with quiet_numcodecs():  # its lookups of alto re-create a delta64 store's Delta filter
            checksum = arrays_checksum(self.root)
        meta = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "store_id": uuid.uuid4().hex,
            "shape": list(self.layout.shape),
            "nmodes": self.layout.nmodes,
            "nnz": nnz,
            "value_dtype": self.value_dtype.str,
            "norm_sq": self.norm_sq,
            "chunk_nnz": self.chunk_nnz,
            "max_block_nnz": self.max_block_nnz,
            "compression": self.compression,
            "values_shuffle": self.values_shuffle,
            "index_encoding": self.index_encoding,
            "nblocks": blocks.nblocks,
            "nchunks": nchunks,
            "layout": self.layout.describe(),
            "created_by": f"tensorflow_ooc {_pkg_version}",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": self.attrs,
            "complete": True,
            "arrays_checksum": checksum,
        }
        if self.labels is not None:
            names, keys = self.labels
            if [len(k) for k in keys] != list(self.layout.shape):
                raise ValueError(f"label dictionaries of {[len(k) for k in keys]} keys for shape {self.layout.shape}")
            meta["labels"] = write_labels(self.staging, names, keys)
        if self.index_encoding == DELTA32:
            meta["patches_checksum"] = patches_checksum(tables["patches/position"], tables["patches/word"])
        meta[CHECKSUM_KEY] = meta_checksum(meta)
        # The flag goes in with the last metadata write: a store without it never opens.
        self.root.attrs.put({META_KEY: meta})
        try:
            paths.publish(self.staging, self.final_path, self.overwrite)
        except FileExistsError:
            raise StoreExistsError(f"{self.final_path}: appeared while writing; pass overwrite=True") from None
        self.committed = True
        log.info(
            "wrote store %s: %d nonzeros, %d blocks, %d chunks in %.2f s",
            self.final_path,
            nnz,
            blocks.nblocks,
            nchunks,
            time.perf_counter() - self.t0,
        )
        return self.final_path

    def abort(self) -> None:
        """Remove everything written so far."""
        if not self.committed:
            paths.remove(self.staging)

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
            if isinstance(exc, DiskFullError):
                raise self._after_abort(exc) from exc
