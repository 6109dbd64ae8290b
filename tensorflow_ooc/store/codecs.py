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

Each chain is a small typed object: :class:`IndexCodecs`, :class:`ValueCodecs` and
:class:`TableCodecs` make the codecs a new array is created with (``array_options()``);
:class:`StoredChain` reads an existing array's chain back for the package's own chunk reader
and writer.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numcodecs
import numpy as np
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec

from ..format.index_encoding import DELTA32

DEFAULT_COMPRESSION = "fast"
BLOCK_BYTES = 1 << 20
VALUES_RAW_RATIO = 0.5
# Zarr stores the last chunk whole, padding included: uncompressed values are kept only where
# that padding adds at most this fraction of the values' size (small tensors are not streamed)
VALUES_RAW_MAX_PADDING = 0.5


@contextmanager
def quiet_numcodecs() -> Iterator[None]:
    """Silence, inside the block only, zarr's notice that numcodecs codecs (the Delta filter of a
    ``delta64`` index) are outside the v3 core spec: zarr repeats it at every lookup of such an
    array, which opening and reading a store do many times."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3")
        yield


@dataclass(frozen=True)
class Compressor:
    """The Blosc compressor of one array in one profile; ``cname`` None: none (only the CRC32C)."""

    cname: str | None
    level: int

    def codec(self, typesize: int | None = None) -> BloscCodec:
        """The Zarr codec: byte shuffle, 1 MiB blocks, ``typesize`` if given (else Zarr's)."""
        extra = {} if typesize is None else {"typesize": typesize}
        return BloscCodec(cname=self.cname, clevel=self.level, shuffle="shuffle", blocksize=BLOCK_BYTES, **extra)


@dataclass(frozen=True)
class Profile:
    """A ``compression`` profile: the compressors of the index, of the values and of a fiber
    index's keys."""

    index: Compressor
    values: Compressor
    fiber_keys: Compressor


PROFILES: dict[str, Profile] = {
    # fiber keys: lz4hc took 5x lz4's time for 3 % fewer bytes (137 against 27 ms for 2.1 M
    # Amazon-shaped keys, 2.99 against 3.08 bytes each): most of an index build's encoding
    "fast": Profile(Compressor("lz4hc", 3), Compressor("lz4", 5), Compressor("lz4", 5)),
    "small": Profile(Compressor("zstd", 3), Compressor("zstd", 3), Compressor("zstd", 3)),
    "none": Profile(Compressor(None, 0), Compressor(None, 0), Compressor(None, 0)),
}


def check_compression(compression: str) -> str:
    if compression not in PROFILES:
        raise ValueError(f"compression must be one of {sorted(PROFILES)}, got {compression!r}")
    return compression


@dataclass(frozen=True)
class IndexCodecs:
    """Codecs of the ``alto`` array: ``delta64`` has the numcodecs Delta filter on uint64 (format
    version 1's chain); ``delta32`` arrays hold the differences already (uint32, computed by the
    writer with their patches), so no filter. Then the profile's Blosc, if any, and CRC32C."""

    compression: str = DEFAULT_COMPRESSION
    encoding: str = "delta64"
    fiber_keys: bool = False  # a fiber index's keys: the profile's ``fiber_keys`` compressor

    def __post_init__(self) -> None:
        check_compression(self.compression)

    def filters(self) -> list:
        if self.encoding == DELTA32:
            return []
        from zarr.codecs.numcodecs import Delta

        with quiet_numcodecs():
            return [Delta(dtype="<u8")]

    def compressors(self) -> list:
        profile = PROFILES[self.compression]
        compressor = profile.fiber_keys if self.fiber_keys else profile.index
        if compressor.cname is None:
            return [Crc32cCodec()]
        return [compressor.codec(), Crc32cCodec()]

    def array_options(self) -> dict[str, list]:
        """The ``filters`` and ``compressors`` keywords of ``zarr.Group.create_array``."""
        return {"filters": self.filters(), "compressors": self.compressors()}


def value_padding(nnz: int, chunk_nnz: int) -> float:
    """The zero padding of the last chunk, as a fraction of ``nnz`` values."""
    nnz = max(1, int(nnz))
    return (-(-nnz // chunk_nnz) * chunk_nnz - nnz) / nnz


@dataclass(frozen=True)
class ValueCodecs:
    """Codecs of the values array: the profile's Blosc (typesize the values' itemsize), unless
    ``raw``, and CRC32C. Made by :meth:`for_sample`, which chooses ``raw``."""

    dtype: np.dtype
    compression: str = DEFAULT_COMPRESSION
    raw: bool = False  # stored uncompressed: the "fast" profile's values that do not shrink to half

    def __post_init__(self) -> None:
        check_compression(self.compression)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @classmethod
    def for_sample(
        cls,
        dtype: Any,
        compression: str = DEFAULT_COMPRESSION,
        sample: np.ndarray | None = None,
        padding: float = 0.0,
    ) -> ValueCodecs:
        """With the "fast" profile, a ``sample`` (the first chunk) that shuffle + lz4 shrinks to
        more than ``VALUES_RAW_RATIO`` of its bytes is stored uncompressed, unless the last chunk's
        ``padding`` (:func:`value_padding`) exceeds ``VALUES_RAW_MAX_PADDING``."""
        compressor = PROFILES[check_compression(compression)].values
        raw = False
        if (
            compressor.cname is not None
            and compression == "fast"
            and sample is not None
            and sample.size
            and padding <= VALUES_RAW_MAX_PADDING
        ):
            probe = numcodecs.Blosc(
                cname=compressor.cname, clevel=compressor.level, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=BLOCK_BYTES
            )
            data = np.ascontiguousarray(sample, dtype=dtype)
            raw = len(probe.encode(data)) > VALUES_RAW_RATIO * data.nbytes
        return cls(np.dtype(dtype), compression, raw)

    @property
    def compressed(self) -> bool:
        return not self.raw and PROFILES[self.compression].values.cname is not None

    @property
    def shuffle(self) -> str:
        """The store metadata's ``values_shuffle``: ``"shuffle"``, or ``"none"`` without Blosc."""
        return "shuffle" if self.compressed else "none"

    def compressors(self) -> list:
        if not self.compressed:
            return [Crc32cCodec()]
        return [PROFILES[self.compression].values.codec(self.dtype.itemsize), Crc32cCodec()]

    def array_options(self) -> dict[str, list]:
        """The ``compressors`` keyword of ``zarr.Group.create_array``."""
        return {"compressors": self.compressors()}


@dataclass(frozen=True)
class TableCodecs:
    """Codecs of the small tables (blocks, chunk ranges, checksums, patches): zstd, CRC32C."""

    def compressors(self) -> list:
        return [BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"), Crc32cCodec()]

    def array_options(self) -> dict[str, list]:
        """The ``compressors`` keyword of ``zarr.Group.create_array``."""
        return {"compressors": self.compressors()}


def is_delta64(codec: Any) -> bool:
    """Whether ``codec`` is the numcodecs Delta filter on uint64 (a ``delta64`` index's)."""
    cfg = getattr(codec, "codec_config", None) or {}
    return getattr(codec, "codec_name", "") == "numcodecs.delta" and np.dtype(cfg.get("dtype", "|V0")) == np.dtype(
        "<u8"
    )


@dataclass(frozen=True)
class StoredChain:
    """A 1-D array's codec chain as stored, read back: whether it is one of the chains this
    package writes (optional Delta, little-endian bytes, optional Blosc, CRC32C), whose chunks
    the package encodes and decodes itself; any other goes through Zarr."""

    delta: bool  # starts with the Delta filter on uint64
    raw: bool  # then exactly little-endian bytes and CRC32C (compression "none")
    blosc: BloscCodec | None  # or exactly little-endian bytes, this Blosc and CRC32C
    crc: bool  # ends with a CRC32C, whatever comes before

    @classmethod
    def of(cls, array: Any) -> StoredChain:
        codecs = list(array.metadata.codecs)
        delta = bool(codecs) and is_delta64(codecs[0])
        rest = codecs[1:] if delta else codecs
        dtype = np.dtype(array.dtype)
        little = (
            bool(rest)
            and isinstance(rest[0], BytesCodec)
            and (rest[0].endian is None or rest[0].endian.value == "little")
            and (dtype.itemsize == 1 or dtype.byteorder in "<=")
        )
        raw = little and len(rest) == 2 and isinstance(rest[1], Crc32cCodec)
        framed = little and len(rest) == 3 and isinstance(rest[1], BloscCodec) and isinstance(rest[2], Crc32cCodec)
        crc = bool(codecs) and isinstance(codecs[-1], Crc32cCodec)
        return cls(delta, raw, rest[1] if framed else None, crc)

    @property
    def known(self) -> bool:
        """One of this package's chains."""
        return self.raw or self.blosc is not None

    def numcodecs_blosc(self) -> numcodecs.Blosc | None:
        """numcodecs' Blosc with the chain's parameters (it writes the bytes Zarr's codec does);
        None without Blosc."""
        b = self.blosc
        if b is None:
            return None
        shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[b.shuffle.value]
        return numcodecs.Blosc(
            cname=b.cname.value, clevel=b.clevel, shuffle=shuffle, blocksize=b.blocksize, typesize=b.typesize
        )
