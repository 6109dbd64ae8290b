"""Many inner chunks of one sharded array decoded at once, in native code on the calling numba
threads: a sampled round reads tens of thousands of small chunks, and a Python call per chunk
(ranged read, checks, numcodecs' Blosc wrapper) cost about 12 us a chunk an array, more than the
decoding itself (docs/FORMAT.md, "Fiber index", has the measurements).

Blosc's re-entrant ``blosc_decompress_ctx`` is the one numcodecs links in; each chunk's header is
checked against its stored length and the decoded size before Blosc sees it, and the chunk's
CRC32C has been checked by then, so only the bytes written for that chunk are decoded.
"""

from __future__ import annotations

import ctypes

import crc32c as _crc32c_package
import crc32c._crc32c as _crc32c_native
import numba as nb
import numpy as np
from numcodecs import blosc as _numcodecs_blosc

_lib = ctypes.CDLL(_numcodecs_blosc.__file__)
_decompress_ctx = _lib.blosc_decompress_ctx
_decompress_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_decompress_ctx.restype = ctypes.c_int

_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64]
_pread.restype = ctypes.c_ssize_t

# the crc32c package's own C routine (SSE4.2 where the CPU has it, else its slicing-by-8)
_crc_lib = ctypes.CDLL(_crc32c_native.__file__)
_crc = _crc_lib._crc32c_hw_adler if _crc32c_package.hardware_based else _crc_lib._crc32c_sw_slicing_by_8
_crc.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
_crc.restype = ctypes.c_uint32

BLOSC_HEADER = 16

#: per-chunk results of :func:`decode_chunks`
OK, BAD_HEADER, BAD_BLOSC = 0, 1, 2


@nb.njit(inline="always")
def _u32(buf: np.ndarray, at: int) -> int:
    return (
        np.int64(buf[at]) | (np.int64(buf[at + 1]) << 8) | (np.int64(buf[at + 2]) << 16) | (np.int64(buf[at + 3]) << 24)
    )


@nb.njit(parallel=True, nogil=True)
def decode_chunks(
    buf: np.ndarray, pos: np.ndarray, body: np.ndarray, out: np.ndarray, nbytes: int, raw: bool
) -> np.ndarray:
    """Decode chunk ``j`` (``body[j]`` bytes of ``buf`` (uint8) from ``pos[j]``: Blosc frames, or
    the bytes themselves when ``raw``) into ``out[j * nbytes:(j + 1) * nbytes]`` (uint8). Returns
    per chunk :data:`OK`, :data:`BAD_HEADER` (a frame whose header disagrees with its length or
    the chunk's size) or :data:`BAD_BLOSC`."""
    n = pos.shape[0]
    status = np.zeros(n, dtype=np.int8)
    for j in nb.prange(n):
        at, length = pos[j], body[j]
        dst = out[j * nbytes : (j + 1) * nbytes]
        if raw:
            if length != nbytes:
                status[j] = BAD_HEADER
            else:
                dst[:] = buf[at : at + nbytes]
            continue
        if length < BLOSC_HEADER or _u32(buf, at + 4) != nbytes or _u32(buf, at + 12) != length:
            status[j] = BAD_HEADER
            continue
        got = _decompress_ctx(buf[at:].ctypes.data, dst.ctypes.data, nbytes, 1)
        if got != nbytes:
            status[j] = BAD_BLOSC
    return status


@nb.njit(parallel=True, nogil=True)
def pread_ranges(fds: np.ndarray, start: np.ndarray, end: np.ndarray, at: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """Read byte range ``[start[i], end[i])`` of open file ``fds[i]`` into ``buf[at[i]:]`` (uint8)
    by ``pread`` calls on the calling numba threads: a round's tens of thousands of small ranges
    cost a Python call each otherwise. Returns the bytes read per range (short or -1 on error)."""
    n = start.shape[0]
    got = np.zeros(n, dtype=np.int64)
    for i in nb.prange(n):
        want = end[i] - start[i]
        done = 0
        while done < want:  # pread may return less than asked (a signal): read the rest
            r = _pread(fds[i], buf[at[i] + done :].ctypes.data, want - done, start[i] + done)
            if r <= 0:
                break
            done += r
        got[i] = done if done == want or done > 0 else -1
    return got


def _chunk_crcs(buf: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The CRC32C of ``buf[pos[j]:pos[j] + length[j]]`` (uint8) for every ``j`` (int64): a
    Python call a chunk cost more than the checksum."""
    n = pos.shape[0]
    out = np.empty(n, dtype=np.int64)
    for j in nb.prange(n):
        out[j] = np.int64(_crc(np.uint32(0xFFFFFFFF), buf[pos[j] :].ctypes.data, length[j]) ^ np.uint32(0xFFFFFFFF))
    return out


#: on the calling numba threads (reads), and on one (a build's writer thread runs no parallel kernel)
chunk_crcs = nb.njit(parallel=True, nogil=True)(_chunk_crcs)
chunk_crcs_serial = nb.njit(nogil=True)(_chunk_crcs)


@nb.njit(parallel=True, nogil=True)
def undelta_chunks(keys: np.ndarray, n: int, per: int) -> None:
    """Running sums of each of the first ``n`` slots of ``per`` entries of ``keys`` (uint64): the
    Delta filter undone chunk by chunk."""
    for j in nb.prange(n):
        base = j * per
        acc = np.uint64(0)
        for i in range(per):
            acc += keys[base + i]
            keys[base + i] = acc
