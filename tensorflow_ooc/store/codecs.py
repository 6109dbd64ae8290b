"""Codec chains of the BLCO store arrays.

ALTO indices are sorted inside a block, so their differences are small: Delta makes them small
integers, byte shuffle groups the (mostly zero) high bytes, and zstd removes them. Values get
shuffle + zstd, which pays off for integer-valued (count) data. Every chunk carries a CRC32C so a
damaged chunk is detected when read instead of feeding garbage indices to unchecked kernels.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec

ZSTD_LEVEL = 3

# Reading a store re-creates its Delta codec, which makes zarr repeat this notice on every open.
warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3 specification")


@contextmanager
def quiet_numcodecs() -> Iterator[None]:
    """Silence zarr's notice that numcodecs filters (Delta) are outside the v3 core spec."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3")
        yield


def index_codecs() -> dict:
    from zarr.codecs.numcodecs import Delta

    with quiet_numcodecs():
        delta = Delta(dtype="<u8")
    return {
        "filters": [delta],
        "compressors": [BloscCodec(cname="zstd", clevel=ZSTD_LEVEL, shuffle="shuffle"), Crc32cCodec()],
    }


def value_codecs(dtype: np.dtype) -> dict:
    return {
        "compressors": [BloscCodec(cname="zstd", clevel=ZSTD_LEVEL, shuffle="shuffle",
                                   typesize=np.dtype(dtype).itemsize), Crc32cCodec()],
    }


def table_codecs() -> dict:
    return {"compressors": [BloscCodec(cname="zstd", clevel=ZSTD_LEVEL, shuffle="shuffle"), Crc32cCodec()]}
