"""Dense tensors as CP-ALS inputs: a Zarr array (path or fsspec URL), a Dask array or a NumPy array.

:class:`DenseArray` gives the three the one view the execution layer needs: the shape, the grid of
stored chunks (Zarr's chunks, Dask's blocks, or slabs of a NumPy array along its slowest axis),
and each chunk's data, read one at a time so that an array larger than memory can be streamed.
It is what a dense partition task (:mod:`tensorflow_ooc.execution.dense_tasks`) reads. A Zarr
source pickles as its path, so it travels to Dask workers without its data; a NumPy source
travels with its data (the graph scatters it once).

Validation happens in two steps: :func:`open_dense` checks what the metadata tells (the order,
the dtype), and :func:`scan_chunk` checks the values (NaN and Inf) in the same pass over the
chunks that computes ||X||^2, so a streamed array is read once for both.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..errors import CorruptStoreError, DenseArrayError, NonFiniteValueError, TfoocError
from . import paths

MIN_ORDER, MAX_ORDER = 3, 6
# slabs a NumPy array is cut into: small enough that a partition per Dask thread exists, large
# enough that a kernel call amortizes its start
NUMPY_SLAB_BYTES = 64 << 20


@dataclass(frozen=True)
class ChunkScan:
    """One chunk's contribution to the validation pass: its sum of squares and its non-finite entries."""

    sumsq: float
    nonfinite: int
    first_bad: tuple[int, ...] | None  # multi-index (in the whole array) of a NaN or Inf, if any


class DenseArray:
    """A dense tensor read chunk by chunk.

    Attributes
    ----------
    path : str
        The Zarr array's path or URL, or a description (``"<numpy array>"``) for in-memory data.
    shape : tuple of int
    dtype : numpy.dtype
        The stored dtype (chunks are cast to the factors' float dtype when read).
    bounds : list of int arrays
        Per mode, the chunk boundaries ``0 = b_0 < b_1 < ... < b_k = I_m`` (Dask chunks may be
        irregular).
    meta : dict
        ``store_id`` (identity of the input, for checkpoints and results: the array's path, shape,
        chunks and dtype, and once it has been scanned its ||X||^2) and ``norm_sq``.

    Examples
    --------
    >>> import numpy as np
    >>> d = open_dense(np.ones((4, 5, 6)))
    >>> d.shape, d.nchunks, float(scan_chunk(d, 0).sumsq)
    ((4, 5, 6), 1, 120.0)
    """

    kind: str  # "zarr", "dask" or "numpy"
    dense = True  # the decompositions' one input interface, shared with Store

    def __init__(
        self,
        kind: str,
        path: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        bounds: list[np.ndarray],
        array: Any,
        store_id: str,
    ) -> None:
        self.kind = kind
        self.path = path
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.bounds = [np.asarray(b, dtype=np.int64) for b in bounds]
        self._array = array
        self._raw_root: str | None = None  # see _raw_chunk_file ("" once found not to apply)
        self._base_id = store_id
        self.meta: dict = {"store_id": store_id}

    # --- shape and chunk grid ----------------------------------------------------------------------
    @property
    def nmodes(self) -> int:
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """Entries of the array (every entry of a dense tensor counts, zeros included)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.nnz * self.dtype.itemsize

    @property
    def grid(self) -> tuple[int, ...]:
        """Chunks per mode."""
        return tuple(len(b) - 1 for b in self.bounds)

    @property
    def nchunks(self) -> int:
        return math.prod(self.grid)

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """The largest chunk's shape (every chunk's, for a regular grid)."""
        return tuple(int(np.diff(b).max()) for b in self.bounds)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of the largest chunk as stored (before casting)."""
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def chunk_index(self, c: int) -> tuple[int, ...]:
        """Grid position of chunk ``c`` (C order over the grid)."""
        return tuple(int(i) for i in np.unravel_index(c, self.grid))

    def chunk_box(self, c: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(origin, shape)`` of chunk ``c``."""
        idx = self.chunk_index(c)
        lo = tuple(int(b[i]) for b, i in zip(self.bounds, idx))
        hi = tuple(int(b[i + 1]) for b, i in zip(self.bounds, idx))
        return lo, tuple(h - l for l, h in zip(lo, hi))

    @property
    def norm_sq(self) -> float:
        """||X||^2, known once the validation pass has scanned the chunks."""
        return float(self.meta["norm_sq"])

    def set_norm_sq(self, norm_sq: float) -> None:
        """Record ||X||^2 from the validation pass; it also enters the identity (``store_id``), so a
        checkpoint of other data written at the same path is refused on resume."""
        self.meta["norm_sq"] = float(norm_sq)
        ident = f"{self._base_id}|{float(norm_sq).hex()}"
        self.meta["store_id"] = hashlib.sha256(ident.encode()).hexdigest()[:16]

    # --- data ---------------------------------------------------------------------------------------
    def read_chunk(self, c: int, buffer: np.ndarray | None = None) -> np.ndarray:
        """Chunk ``c``'s values as an ndarray in the stored dtype (a view for NumPy sources).

        A Zarr chunk is decoded into ``buffer`` (a flat array of the stored dtype holding at least a
        chunk) when one is given, and the returned array is a C-ordered view of it: a streamed pass
        then reuses its buffers instead of allocating (and page-faulting in) every chunk afresh,
        which doubles the read rate."""
        lo, shp = self.chunk_box(c)
        sl = tuple(slice(l, l + s) for l, s in zip(lo, shp))
        if self.kind == "zarr":
            try:
                return self._read_zarr_chunk(c, sl, shp, buffer)
            except (ValueError, OSError, RuntimeError) as exc:
                if isinstance(exc, TfoocError):
                    raise
                raise CorruptStoreError(
                    f"{self.path}: chunk {list(self.chunk_index(c))} could not be read ({type(exc).__name__}: {exc})"
                ) from exc
        if self.kind == "dask":
            # the block's own graph, computed here: a task reading it holds one block at a time
            return np.asarray(self._array[sl].compute(scheduler="sync"))
        return self._array[sl]

    def _read_zarr_chunk(
        self, c: int, sl: tuple[slice, ...], shp: tuple[int, ...], buffer: np.ndarray | None
    ) -> np.ndarray:
        if buffer is not None and buffer.dtype == self.dtype and buffer.size >= math.prod(shp):
            view = buffer[: math.prod(shp)].reshape(shp)
            raw = self._raw_chunk_file(c)
            if raw is not None and tuple(shp) == self.chunk_shape:
                _read_raw_chunk(raw, view, self.zarr_array.metadata.fill_value)
            elif raw is not None and buffer.size >= math.prod(self.chunk_shape):
                # an edge chunk is stored at the full chunk shape: read it whole, keep its box
                full = buffer[: math.prod(self.chunk_shape)].reshape(self.chunk_shape)
                _read_raw_chunk(raw, full, self.zarr_array.metadata.fill_value)
                box = np.ascontiguousarray(full[tuple(slice(0, s) for s in shp)])
                view[...] = box
            else:
                from zarr.core.buffer.cpu import NDBuffer

                self.zarr_array.get_basic_selection(sl, out=NDBuffer.from_numpy_array(view))
            return view
        return np.asarray(self.zarr_array[sl])

    def map_chunk(self, c: int) -> np.ndarray | None:
        """Chunk ``c``'s values mapped read-only from its file, without a copy, or None where the
        chunk is not a raw file (a compressed or remote array, a missing chunk of fill values) or
        mapping is not available (not a POSIX system).

        Mapping replaces the one copy a read makes (page cache to buffer), which on a streamed
        pass of an uncompressed array is most of the cost outside the kernel: 1.95 GiB of 5 MiB
        chunk files took 0.27 s to read into a reused buffer and 0.03 s to map and touch every
        page. The mapping is released when the last array viewing it goes. Stores are written
        once (atomically) and then only read, so the file cannot shrink under the mapping."""
        raw = self._raw_chunk_file(c) if self.kind == "zarr" else None
        if raw is None or not hasattr(mmap, "MAP_PRIVATE"):
            return None
        lo, shp = self.chunk_box(c)
        try:
            fd = os.open(raw, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            want = math.prod(self.chunk_shape) * self.dtype.itemsize
            if size != want:
                raise CorruptStoreError(f"{raw}: a chunk file of {size:,} bytes where {want:,} were expected")
            # private and writable (copy-on-write, never written) so that the kernels see the
            # writable arrays they are compiled for: a read-only array is another numba type and
            # would compile every kernel again (seconds). Not MAP_POPULATE: on a private writable
            # mapping it faults pages in for writing, which copies them.
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        full = np.frombuffer(mapped, dtype=self.dtype).reshape(self.chunk_shape)
        # an edge chunk is stored at the full chunk shape: its box is a (strided) view
        return full if tuple(shp) == self.chunk_shape else full[tuple(slice(0, s) for s in shp)]

    def _raw_chunk_file(self, c: int) -> str | None:
        """The file holding chunk ``c`` as raw native-endian C-ordered values, when it does: a
        local Zarr v3 array whose only codec is ``bytes`` (no compressor, transpose or sharding).
        Then :meth:`read_chunk` reads the file straight into its buffer, one copy instead of Zarr's
        read, decode and assemble (measured 4.8 against 3 GB/s from the page cache, which is what a
        streamed pass of an uncompressed array is bound by). Edge chunks too: Zarr stores them at
        the full chunk shape, and an array whose chunks do not divide its shape has many (a
        4 GiB array with half its chunks on an edge streamed at 0.33x in-memory through Zarr)."""
        if self._raw_root is None:
            self._raw_root = _raw_layout(self.zarr_array, self.dtype) or ""
        if not self._raw_root:
            return None
        key = self.zarr_array.metadata.encode_chunk_key(self.chunk_index(c))
        return os.path.join(self._raw_root, key)

    def iter_chunks(self, lo: int = 0, hi: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        for c in range(lo, self.nchunks if hi is None else hi):
            yield c, self.read_chunk(c)

    @property
    def zarr_array(self):
        if self._array is None:  # unpickled on a worker: reopen (read-only) from the path
            import zarr

            self._array = zarr.open_array(self.path, mode="r")
        return self._array

    def stored_bytes(self) -> int:
        """Bytes one full pass reads: the chunk files of a Zarr array, else the array's bytes."""
        if self.kind == "zarr":
            try:
                return paths.disk_bytes(self.path)
            except Exception:  # a store fsspec cannot walk: count the raw bytes
                return self.nbytes
        return self.nbytes

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.kind == "zarr":
            state["_array"] = None  # workers reopen by path
            state["_raw_root"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (
            f"DenseArray({self.path}, shape={self.shape}, dtype={self.dtype}, chunks={self.chunk_shape}, "
            f"{self.nchunks} chunks)"
        )

    def info(self) -> dict:
        """Shape, chunks, dtype and bytes (and the norm, when the array has been scanned or its
        generator recorded it) for ``tfooc info``."""
        out = {
            "path": self.path,
            "kind": f"dense {self.kind} array",
            "shape": list(self.shape),
            "order": self.nmodes,
            "dtype": str(self.dtype),
            "chunks": list(self.chunk_shape),
            "nchunks": self.nchunks,
            "bytes": self.nbytes,
            "chunk_bytes": self.chunk_bytes,
        }
        if self.kind == "zarr":
            out["bytes_on_disk"] = self.stored_bytes()
            out["compressors"] = [type(c).__name__ for c in (self.zarr_array.compressors or ())]
            attrs = dict(self.zarr_array.attrs).get("tensorflow_ooc") or {}
            if "norm_sq" in attrs:
                out["norm"] = math.sqrt(float(attrs["norm_sq"]))
            if "planted" in attrs:
                out["planted"] = attrs["planted"]
        if "norm_sq" in self.meta:
            out["norm"] = math.sqrt(self.meta["norm_sq"])
        return out


def _raw_layout(arr: Any, dtype: np.dtype) -> str | None:
    """The directory of a local Zarr v3 array whose chunk files hold raw native-endian C-ordered
    values (its only codec is ``bytes``), else None."""
    import sys

    from zarr.codecs import BytesCodec
    from zarr.storage import LocalStore

    meta = arr.metadata
    if getattr(meta, "zarr_format", None) != 3 or not isinstance(arr.store, LocalStore):
        return None
    codecs = tuple(meta.codecs)
    if len(codecs) != 1 or not isinstance(codecs[0], BytesCodec):
        return None
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    if dtype.itemsize > 1 and endian not in (None, sys.byteorder):
        return None
    if not dtype.isnative or getattr(arr, "order", "C") != "C":
        return None
    return os.path.join(str(arr.store.root), arr.path) if arr.path else str(arr.store.root)


def _read_raw_chunk(path: str, out: np.ndarray, fill_value: Any) -> None:
    """Read a raw chunk file into ``out`` (C-contiguous); a missing file is a chunk of the fill value."""
    try:
        with open(path, "rb", buffering=0) as f:
            view = memoryview(out.reshape(-1)).cast("B")
            got = 0
            while got < view.nbytes:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
    except FileNotFoundError:
        out[...] = fill_value
        return
    if got != out.nbytes:
        raise CorruptStoreError(f"{path}: a chunk file of {got:,} bytes where {out.nbytes:,} were expected")


def _regular_bounds(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[np.ndarray]:
    return [np.append(np.arange(0, s, max(1, c)), s) if s else np.zeros(1, np.int64) for s, c in zip(shape, chunks)]


def _check_meta(what: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if not MIN_ORDER <= len(shape) <= MAX_ORDER:
        raise DenseArrayError(
            f"{what}: a dense tensor of order {len(shape)} (shape {tuple(shape)}); "
            f"dense CP-ALS takes orders {MIN_ORDER} to {MAX_ORDER}"
        )
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
        raise DenseArrayError(f"{what}: dtype {dtype} is not a real numeric type (integers or floats)")
    if 0 in shape:
        raise DenseArrayError(f"{what}: an empty array (shape {tuple(shape)})")


def is_dense_array(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a Zarr array (rather than a group such as a BLCO store)."""
    import zarr

    try:
        node = zarr.open(str(path), mode="r")
    except Exception:
        return False
    return isinstance(node, zarr.Array)


def open_dense(source: Any) -> DenseArray:
    """A :class:`DenseArray` over a Zarr array path or URL, a ``zarr.Array``, a Dask array or a
    NumPy array, with its order and dtype checked (:class:`~tensorflow_ooc.errors.DenseArrayError`).

    Examples
    --------
    >>> import numpy as np
    >>> open_dense(np.zeros((2, 3, 4), order="F")).chunk_shape
    (2, 3, 4)
    """
    import zarr

    if isinstance(source, DenseArray):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = str(source)
        if not paths.exists(path):
            raise DenseArrayError(f"{path}: no such array")
        try:
            arr = zarr.open_array(path, mode="r")
        except Exception as exc:
            raise DenseArrayError(f"{path}: not a Zarr array ({exc})") from exc
        source = arr
    else:
        path = None
    if isinstance(source, zarr.Array):
        path = path or str(source.store_path)
        shape, dtype = tuple(source.shape), np.dtype(source.dtype)
        _check_meta(path, shape, dtype)
        ident = f"zarr|{path}|{shape}|{source.chunks}|{dtype}"
        return DenseArray(
            "zarr",
            path,
            shape,
            dtype,
            _regular_bounds(shape, tuple(source.chunks)),
            source,
            hashlib.sha256(ident.encode()).hexdigest()[:16],
        )
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover - dask is a dependency
        da = None
    if da is not None and isinstance(source, da.Array):
        what = f"<dask array {source.name}>"
        shape, dtype = tuple(int(s) for s in source.shape), np.dtype(source.dtype)
        _check_meta(what, shape, dtype)
        bounds = [np.concatenate([[0], np.cumsum(c)]) for c in source.chunks]
        return DenseArray("dask", what, shape, dtype, bounds, source, source.name[-16:])
    if isinstance(source, np.ndarray):
        what = "<numpy array>"
        _check_meta(what, source.shape, source.dtype)
        arr = source if (source.flags.c_contiguous or source.flags.f_contiguous) else np.ascontiguousarray(source)
        # slabs along the slowest axis are contiguous views of either layout
        axis = 0 if arr.flags.c_contiguous else arr.ndim - 1
        per = max(1, arr.shape[axis] * NUMPY_SLAB_BYTES // max(1, arr.nbytes))
        chunks = list(arr.shape)
        chunks[axis] = per
        from dask.base import tokenize

        return DenseArray(
            "numpy", what, arr.shape, arr.dtype, _regular_bounds(arr.shape, tuple(chunks)), arr, tokenize(arr)[:16]
        )
    raise DenseArrayError(
        f"{type(source).__name__}: not a dense array (give a Zarr array path, a zarr.Array, "
        f"a Dask array or a NumPy array)"
    )


def scan_chunk(dense: DenseArray, c: int, block: np.ndarray | None = None) -> ChunkScan:
    """The validation pass over chunk ``c`` (read unless ``block`` is given): sum of squares and
    non-finite entries, in float64 whatever the stored dtype."""
    if block is None:
        block = dense.read_chunk(c)
    b = block if block.dtype == np.float64 else block.astype(np.float64)
    if np.issubdtype(block.dtype, np.floating):
        bad = ~np.isfinite(b)
        nbad = int(bad.sum())
    else:
        nbad = 0
    first = None
    if nbad:
        lo, _ = dense.chunk_box(c)
        where = np.unravel_index(int(np.argmax(bad)), b.shape)
        first = tuple(int(o + i) for o, i in zip(lo, where))
        sumsq = float("nan")
    else:
        flat = b.ravel(order="K")  # a view of a C- or F-ordered chunk
        sumsq = float(np.dot(flat, flat))
    return ChunkScan(sumsq, nbad, first)


def combine_scans(dense: DenseArray, scans: list[ChunkScan]) -> float:
    """||X||^2 from the chunks' scans, or :class:`~tensorflow_ooc.errors.NonFiniteValueError`
    naming the array, how many entries are NaN or Inf, and where the first is."""
    bad = sum(s.nonfinite for s in scans)
    if bad:
        first = next(s.first_bad for s in scans if s.first_bad is not None)
        raise NonFiniteValueError(
            f"{bad:,} NaN or infinite entries (the first at index {list(first)}); CP-ALS needs finite values",
            dense.path,
        )
    return float(sum(s.sumsq for s in scans))
