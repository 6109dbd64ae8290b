"""Codec chains of the BLCO store arrays.

ALTO indices are sorted inside a block, so their differences are small: Delta makes them small
integers, byte shuffle groups the (mostly zero) high bytes, and the compressor removes them.
Values get shuffle + the compressor, which pays off for integer-valued (count) data. Every chunk
carries a CRC32C so a damaged chunk is detected when read instead of feeding garbage indices to
unchecked kernels.

Three profiles (the ``compression`` option of ``convert``): ``"fast"`` (default; index lz4hc level
3, values shuffle + lz4, or no compressor for values that do not shrink to half: streaming decodes
every chunk once per mode, so decode speed is throughput), ``"small"`` (zstd level 3 for both: the
smallest stores, for archives and slow disks) and ``"none"`` (only the CRC32C; streamed chunks are
used mapped where they lie). Big (1 MiB) Blosc blocks for the index. The measurements that chose
them are in docs/FORMAT.md ("Group layout": the profiles and their measurements).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import numcodecs
import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec

# profile -> ((index cname, level), (values cname, level))
COMPRESSIONS = {"fast": (("lz4hc", 3), ("lz4", 5)), "small": (("zstd", 3), ("zstd", 3)), "none": ((None, 0), (None, 0))}
DEFAULT_COMPRESSION = "fast"
BLOCK_BYTES = 1 << 20

# Reading a store re-creates its Delta codec, which makes zarr repeat this notice on every open.
warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3 specification")


@contextmanager
def quiet_numcodecs() -> Iterator[None]:
    """Silence zarr's notice that numcodecs filters (Delta) are outside the v3 core spec."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3")
        yield


def check_compression(compression: str) -> str:
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}")
    return compression


def _blosc(cname: str, level: int, typesize: int | None = None, shuffle: str = "shuffle") -> BloscCodec:
    extra = {} if typesize is None else {"typesize": typesize}
    return BloscCodec(cname=cname, clevel=level, shuffle=shuffle, blocksize=BLOCK_BYTES, **extra)


def index_codecs(compression: str = DEFAULT_COMPRESSION, encoding: str = "delta64") -> dict:
    """Codecs of the ``alto`` array: ``delta64`` has the numcodecs Delta filter on uint64 (format
    version 1's chain); ``delta32`` arrays hold the differences already (uint32, computed by the
    writer with their patches), so no filter."""
    cname, level = COMPRESSIONS[check_compression(compression)][0]
    if encoding == "delta32":
        filters = []
    else:
        from zarr.codecs.numcodecs import Delta

        with quiet_numcodecs():
            filters = [Delta(dtype="<u8")]
    if cname is None:
        return {"filters": filters, "compressors": [Crc32cCodec()]}
    return {"filters": filters, "compressors": [_blosc(cname, level), Crc32cCodec()]}


VALUES_RAW_RATIO = 0.5
# Zarr stores the last chunk whole, padding included: uncompressed values are kept only where
# that padding adds at most this fraction of the values' size (small tensors are not streamed)
VALUES_RAW_MAX_PADDING = 0.5


def value_padding(nnz: int, chunk_nnz: int) -> float:
    """The zero padding of the last chunk, as a fraction of ``nnz`` values."""
    nnz = max(1, int(nnz))
    return (-(-nnz // chunk_nnz) * chunk_nnz - nnz) / nnz


def value_codecs(
    dtype: np.dtype, compression: str = DEFAULT_COMPRESSION, sample: np.ndarray | None = None, padding: float = 0.0
) -> dict:
    """Codecs of the values array; with the "fast" profile, a ``sample`` (the first chunk) that
    shuffle + lz4 shrinks to more than ``VALUES_RAW_RATIO`` of its bytes is stored uncompressed,
    unless the last chunk's ``padding`` (:func:`value_padding`) exceeds
    ``VALUES_RAW_MAX_PADDING``."""
    cname, level = COMPRESSIONS[check_compression(compression)][1]
    if cname is None:
        return {"compressors": [Crc32cCodec()]}
    itemsize = np.dtype(dtype).itemsize
    if compression == "fast" and sample is not None and sample.size and padding <= VALUES_RAW_MAX_PADDING:
        probe = numcodecs.Blosc(cname=cname, clevel=level, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=BLOCK_BYTES)
        data = np.ascontiguousarray(sample, dtype=dtype)
        if len(probe.encode(data)) > VALUES_RAW_RATIO * data.nbytes:
            return {"compressors": [Crc32cCodec()]}
    return {"compressors": [_blosc(cname, level, itemsize), Crc32cCodec()]}


def table_codecs() -> dict:
    return {"compressors": [BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"), Crc32cCodec()]}
