"""Codec chains of the BLCO store arrays.

ALTO indices are sorted inside a block, so their differences are small: Delta makes them small
integers, byte shuffle groups the (mostly zero) high bytes, and the compressor removes them.
Values get shuffle + the compressor, which pays off for integer-valued (count) data. Every chunk
carries a CRC32C so a damaged chunk is detected when read instead of feeding garbage indices to
unchecked kernels.

Two compressors (the ``compression`` option of ``convert``):

- ``"lz4"`` (default): decodes about 2x faster than zstd, which matters because streaming
  MTTKRP decodes every chunk once per mode; about 0.2-0.3 more bytes per nonzero.
- ``"zstd"``: the smallest stores, for archives and slow disks.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec

COMPRESSIONS = {"lz4": ("lz4", 5), "zstd": ("zstd", 3)}
DEFAULT_COMPRESSION = "lz4"

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


def _blosc(compression: str, typesize: int | None = None) -> BloscCodec:
    cname, level = COMPRESSIONS[check_compression(compression)]
    extra = {} if typesize is None else {"typesize": typesize}
    return BloscCodec(cname=cname, clevel=level, shuffle="shuffle", **extra)


def index_codecs(compression: str = DEFAULT_COMPRESSION) -> dict:
    from zarr.codecs.numcodecs import Delta

    with quiet_numcodecs():
        delta = Delta(dtype="<u8")
    return {"filters": [delta], "compressors": [_blosc(compression), Crc32cCodec()]}


def value_codecs(dtype: np.dtype, compression: str = DEFAULT_COMPRESSION) -> dict:
    return {"compressors": [_blosc(compression, np.dtype(dtype).itemsize), Crc32cCodec()]}


def table_codecs() -> dict:
    return {"compressors": [_blosc("zstd"), Crc32cCodec()]}
