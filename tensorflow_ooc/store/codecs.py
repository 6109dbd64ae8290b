"""Codec chains of the BLCO store arrays.

ALTO indices are sorted inside a block, so their differences are small: Delta makes them small
integers, byte shuffle groups the (mostly zero) high bytes, and the compressor removes them.
Values get shuffle + the compressor, which pays off for integer-valued (count) data. Every chunk
carries a CRC32C so a damaged chunk is detected when read instead of feeding garbage indices to
unchecked kernels.

Two profiles (the ``compression`` option of ``convert``), measured on 2^20-nonzero chunks of the
nell2- and uber-shaped benchmark tensors:

- ``"fast"`` (default): index lz4hc level 3 in 1 MiB Blosc blocks, values
  shuffle + lz4 (~2 ms). Streaming MTTKRP decodes every chunk once per mode, so decode speed is
  throughput. Values that shuffle + lz4 does not shrink to at most half on the first chunk
  (random floats: 6.3 of 8 bytes) are stored uncompressed instead: reading them compressed cost
  2.6 ns a nonzero per pass, more than the mode's kernel (about 1 ns), to save a fifth, and
  uncompressed chunks are used where they lie in the page cache (mapped, as with ``"none"``).
  Read from a disk at 2 GB/s, 8 raw bytes take 4 ns, and a compressed copy only wins below
  about a third of the size. Counts and other repetitive values stay compressed.
- ``"small"``: zstd level 3 for both, 1 MiB blocks: the smallest stores, values decode about
  twice as slowly. For archives and slow disks.
- ``"none"``: no compressor, only the CRC32C (the index keeps its Delta filter): 16 bytes per
  nonzero, about a third more than ``"fast"``, and nothing to decode. Streamed, a chunk is then
  used where it lies in the page cache, mapped (:meth:`ChunkFiles.view`), and a read pass costs
  little beyond its checksum: uber-shaped, one pass over 3.3 M nonzeros took 13 ms with
  ``"fast"`` (9.5 ms of it Blosc). For stores streamed many times from a fast local disk.

The index codec, measured on the 32-bit differences of format version 2 (byte shuffle, one Blosc
thread, best of 15 decodes of whole stores): lz4hc writes the format lz4 reads, so it costs time
only when writing (about 60 ms per million nonzeros at level 3, against 10 for lz4) and finds
longer matches. Bytes per nonzero, lz4 level 1 against lz4hc level 3: uber-shaped 2.01 / 1.92,
nips-shaped 3.01 / 2.94, chicago-shaped 1.17 / 1.12, nell2-shaped 2.84 / 2.62; decode ms per
million nonzeros 0.59 / 0.86, 1.96 / 2.18, 0.99 / 0.86, 2.14 / 2.26, against a streamed mode's
kernel of about 5 ms per million. Levels above 3 saved under 1 % more; zstd level 1 was smaller
(nips 2.68 B) but decoded 2 to 4 times as slowly. Version 1's 64-bit differences: lz4 level 1
took 2.0 B and 1.0 ms per 2^20-nonzero uber-shaped chunk, zstd level 1 1.7 B and 1.8 ms.

Big Blosc blocks matter for the index: zstd with the default (256 KiB) blocks measured 2.6 B and
6.5 ms on the same chunk.
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
