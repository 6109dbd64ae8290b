"""Many inner chunks of one sharded array encoded at once, in native code on numba's threads: the
write twin of :mod:`.shard_decode`.

A fiber index writes about 250 small (1024-entry) chunks a shard and array; numcodecs' Blosc
wrapper, the Delta filter and the bytes objects around them cost about 12 us a chunk in Python
(8.4 s of a 114 s build of an 86 M-nonzero index). Here Blosc's re-entrant ``blosc_compress_ctx``
(the one numcodecs links in, called with numcodecs' parameters, so the bytes are the ones Zarr
writes: a test compares them) compresses every chunk of a shard in one parallel loop.
"""

from __future__ import annotations

import ctypes

import numba as nb
import numcodecs
import numpy as np
from numcodecs import blosc as _numcodecs_blosc

_lib = ctypes.CDLL(_numcodecs_blosc.__file__)
_compress_ctx = _lib.blosc_compress_ctx
_compress_ctx.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,  # the compressor's name, NUL-terminated
    ctypes.c_size_t,
    ctypes.c_int,
]
_compress_ctx.restype = ctypes.c_int

#: Blosc's bound on a frame: the input plus its 16-byte header (BLOSC_MAX_OVERHEAD)
BLOSC_OVERHEAD = 16


@nb.njit(nogil=True, cache=True)
def _compress_chunks(src, nchunks, nbytes, delta, clevel, shuffle, typesize, cname, blocksize, scratch, dst, sizes):
    # chunk j: src[j * nbytes:(j + 1) * nbytes] (uint8), Delta'd into scratch first when asked,
    # compressed into dst[j * (nbytes + 16):]; sizes[j] its frame's bytes (<= 0: Blosc failed)
    cap = nbytes + BLOSC_OVERHEAD
    for j in range(nchunks):
        body = src[j * nbytes : (j + 1) * nbytes]
        if delta:
            words = body.view(np.uint64)
            d = scratch[j * nbytes : (j + 1) * nbytes].view(np.uint64)
            if words.shape[0]:
                d[0] = words[0]
            for i in range(1, words.shape[0]):
                d[i] = words[i] - words[i - 1]  # wraps as numcodecs' Delta on uint64
            body = scratch[j * nbytes : (j + 1) * nbytes]
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


def compress_chunks(data: np.ndarray, chunk_len: int, delta: bool, blosc: numcodecs.Blosc) -> list[memoryview]:
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

    Returns
    -------
    list of memoryview
        One frame a chunk, views into one buffer.
    """
    data = np.ascontiguousarray(data)
    nbytes = chunk_len * data.dtype.itemsize
    n = data.shape[0] // chunk_len
    if n * chunk_len != data.shape[0]:
        raise ValueError(f"{data.shape[0]} elements are not whole chunks of {chunk_len}")
    raw = data.view(np.uint8)
    cap = nbytes + BLOSC_OVERHEAD
    dst = np.empty(n * cap, dtype=np.uint8)
    scratch = np.empty(raw.shape[0] if delta else 0, dtype=np.uint8)
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
    view = memoryview(dst)
    return [view[j * cap : j * cap + s] for j, s in enumerate(sizes.tolist())]
