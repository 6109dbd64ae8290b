"""Many inner chunks of one sharded array encoded at once, in native code on numba's threads: the
write twin of :mod:`.shard_decode`.

A fiber index writes about 250 small (1024-entry) chunks a shard and array; numcodecs' Blosc
wrapper, the Delta filter and the bytes objects around them cost about 12 us a chunk in Python
(8.4 s of a 114 s build of an 86 M-nonzero index). Here Blosc's re-entrant ``blosc_compress_ctx``
(the one numcodecs links in, called with numcodecs' parameters, so the bytes are the ones Zarr
writes: a test compares them) compresses every chunk of a shard in one parallel loop; chunks
stored without Blosc (values that do not compress) are framed natively too.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba as nb
import numcodecs
import numpy as np
from numcodecs import blosc as _numcodecs_blosc

from .shard_decode import chunk_crcs_serial

# declared by name, not as a ctypes pointer, so the kernel is cached between processes (numba
# cannot cache a function that holds a ctypes pointer); pointers are passed as integers, which
# the x86-64 and AArch64 calling conventions pass as they pass pointers
llvm.load_library_permanently(_numcodecs_blosc.__file__)
_compress_ctx = nb.types.ExternalFunction(
    "blosc_compress_ctx",
    nb.types.intc(
        nb.types.intc,  # clevel
        nb.types.intc,  # doshuffle
        nb.types.uintp,  # typesize
        nb.types.uintp,  # nbytes
        nb.types.uintp,  # src
        nb.types.uintp,  # dest
        nb.types.uintp,  # destsize
        nb.types.uintp,  # compressor name, NUL-terminated
        nb.types.uintp,  # blocksize
        nb.types.intc,  # numinternalthreads
    ),
)

#: Blosc's bound on a frame: the input plus its 16-byte header (BLOSC_MAX_OVERHEAD)
BLOSC_OVERHEAD = 16


@nb.njit(nogil=True, cache=True)
def _compress_chunks(src, nchunks, nbytes, delta, clevel, shuffle, typesize, cname, blocksize, scratch, dst, sizes):
    # chunk j: src[j * nbytes:(j + 1) * nbytes] (uint8), Delta'd into scratch (one chunk) first,
    # compressed into dst[j * (nbytes + 16):]; sizes[j] its frame's bytes (<= 0: Blosc failed)
    cap = nbytes + BLOSC_OVERHEAD
    for j in range(nchunks):
        body = src[j * nbytes : (j + 1) * nbytes]
        if delta:
            words = body.view(np.uint64)
            d = scratch[:nbytes].view(np.uint64)
            if words.shape[0]:
                d[0] = words[0]
            for i in range(1, words.shape[0]):
                d[i] = words[i] - words[i - 1]  # wraps as numcodecs' Delta on uint64
            body = scratch[:nbytes]
        sizes[j] = _compress_ctx(
            clevel,
            shuffle,
            typesize,
            nbytes,
            body.ctypes.data,
            dst[j * cap :].ctypes.data,
            cap,
            cname.ctypes.data,
            blocksize,
            1,
        )


@nb.njit(nogil=True, cache=True)
def _delta_chunks(words, chunk_len, out):
    # numcodecs' Delta on uint64, chunk by chunk (each chunk's first word kept)
    for i in range(words.shape[0]):
        out[i] = words[i] if i % chunk_len == 0 else words[i] - words[i - 1]


@nb.njit(nogil=True, cache=True)
def _frames(dst, cap, sizes, crcs, out):
    # frame j (sizes[j] bytes at dst[j * cap]) then its CRC32C, little-endian, back to back
    at = 0
    for j in range(sizes.shape[0]):
        s = sizes[j]
        out[at : at + s] = dst[j * cap : j * cap + s]
        c = crcs[j]
        for b in range(4):
            out[at + s + b] = np.uint8((c >> (8 * b)) & 0xFF)
        at += s + 4


class FrameBuffers:
    """Scratch of a shard writer kept from shard to shard: a fresh buffer a shard cost its page
    faults (gigabytes of them in an 86 M-nonzero index build)."""

    def __init__(self) -> None:
        self._held: dict[str, np.ndarray] = {}

    def take(self, name: str, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes of buffer ``name`` (uint8; its contents are the last user's)."""
        buf = self._held.get(name)
        if buf is None or buf.shape[0] < nbytes:
            buf = self._held[name] = np.empty(nbytes, dtype=np.uint8)
        return buf[:nbytes]


def _whole_chunks(data: np.ndarray, chunk_len: int) -> tuple[np.ndarray, int, int]:
    """``data`` contiguous, a chunk's bytes and the number of chunks; refused unless whole."""
    data = np.ascontiguousarray(data)
    n = data.shape[0] // chunk_len
    if n * chunk_len != data.shape[0]:
        raise ValueError(f"{data.shape[0]} elements are not whole chunks of {chunk_len}")
    return data, chunk_len * data.dtype.itemsize, n


def compress_chunks(
    data: np.ndarray, chunk_len: int, delta: bool, blosc: numcodecs.Blosc, buffers: FrameBuffers | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The Blosc frames of ``data`` (1-D, a whole number of ``chunk_len``-element chunks) chunk by
    chunk, with numcodecs' parameters (so numcodecs' and Zarr's bytes), after the Delta filter
    when ``delta`` (uint64): each frame as ``encoded_chunk`` returns it.

    Parameters
    ----------
    data : ndarray
        Little-endian elements, ``n * chunk_len`` of them.
    chunk_len : int
        Elements a chunk.
    delta : bool
        numcodecs' Delta on uint64 first, chunk by chunk.
    blosc : numcodecs.Blosc
        The codec whose parameters are used.
    buffers : FrameBuffers, optional
        Where the frames are written (valid until its next use), else new arrays.

    Returns
    -------
    frames : uint8 ndarray
        Frame ``j`` at ``frames[j * (chunk bytes + 16):]``.
    sizes : int64 ndarray (n,)
        Each frame's bytes.
    """
    data, nbytes, n = _whole_chunks(data, chunk_len)
    raw = data.view(np.uint8)
    buffers = buffers or FrameBuffers()
    dst = buffers.take("frames", n * (nbytes + BLOSC_OVERHEAD))
    scratch = buffers.take("delta", nbytes if delta else 0)
    sizes = np.zeros(n, dtype=np.int64)
    # numcodecs' choices: its typesize (else the element size), its shuffle (AUTOSHUFFLE: byte
    # shuffle but for 1-byte elements)
    typesize = int(getattr(blosc, "typesize", None) or data.dtype.itemsize)
    shuffle = int(blosc.shuffle)
    if shuffle == -1:
        shuffle = 2 if typesize == 1 else 1
    cname = np.frombuffer(blosc.cname.encode() + b"\0", dtype=np.uint8)
    _compress_chunks(
        raw, n, nbytes, delta, blosc.clevel, shuffle, typesize, cname, blosc.blocksize, scratch, dst, sizes
    )
    if np.any(sizes <= 0):
        raise RuntimeError(f"Blosc could not compress chunk {int(np.argmax(sizes <= 0))}")
    return dst, sizes


def framed_chunks(
    data: np.ndarray, chunk_len: int, delta: bool, blosc: numcodecs.Blosc, buffers: FrameBuffers | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a shard holds before its index: each chunk's Blosc frame (:func:`compress_chunks`)
    followed by its CRC32C (the readers' native checksum, on this thread), back to back (in
    ``buffers``, when given, valid until their next use).

    Returns
    -------
    payload : uint8 ndarray
        The frames and their checksums.
    crcs : int64 ndarray (n,)
        Each chunk's CRC32C.
    sizes : int64 ndarray (n,)
        Each chunk's stored bytes (its frame and checksum).
    """
    buffers = buffers or FrameBuffers()
    dst, sizes = compress_chunks(data, chunk_len, delta, blosc, buffers)
    cap = chunk_len * data.dtype.itemsize + BLOSC_OVERHEAD
    crcs = chunk_crcs_serial(dst, np.arange(sizes.shape[0], dtype=np.int64) * cap, sizes)
    payload = buffers.take("payload", int(sizes.sum()) + 4 * sizes.shape[0])
    _frames(dst, cap, sizes, crcs, payload)
    return payload, crcs, sizes + 4


def framed_raw_chunks(
    data: np.ndarray, chunk_len: int, delta: bool, buffers: FrameBuffers | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`framed_chunks` for an array stored without Blosc: each chunk's little-endian bytes
    (after the Delta filter when ``delta``, uint64) followed by its CRC32C, back to back. A
    Python call a chunk cost 20-30 ns an entry (5-8 s of an 86 M-nonzero build's values).

    Returns
    -------
    payload : uint8 ndarray
        The chunks and their checksums.
    crcs : int64 ndarray (n,)
        Each chunk's CRC32C.
    sizes : int64 ndarray (n,)
        Each chunk's stored bytes (its bytes and checksum).
    """
    data, nbytes, n = _whole_chunks(data, chunk_len)
    buffers = buffers or FrameBuffers()
    raw = data.view(np.uint8)
    if delta:
        d = buffers.take("delta", raw.shape[0]).view(np.uint64)
        _delta_chunks(data.view(np.uint64), chunk_len, d)
        raw = d.view(np.uint8)
    sizes = np.full(n, nbytes, dtype=np.int64)
    crcs = chunk_crcs_serial(raw, np.arange(n, dtype=np.int64) * nbytes, sizes)
    payload = buffers.take("payload", n * (nbytes + 4))
    _frames(raw, nbytes, sizes, crcs, payload)
    return payload, crcs, sizes + 4
