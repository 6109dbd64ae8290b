"""Numba kernels: coordinates -> ALTO words, ALTO -> BLCO re-encoded index, index -> coordinates.

All kernels trust their inputs (no bounds checks): callers validate coordinates against the shape
before calling ``alto_words``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .bits import HAS_BMI2, pext
from .index_encoding import NO_PATCH_POSITIONS, NO_PATCH_WORDS
from .layout import BitLayout


@nb.njit(parallel=True, nogil=True, cache=True)
def _alto_words(coords, spread, mode_nbytes, out):
    n, nmodes = coords.shape
    nwords = out.shape[0]
    for i in nb.prange(n):
        for w in range(nwords):
            out[w, i] = 0
        for m in range(nmodes):
            c = coords[i, m]
            for j in range(mode_nbytes[m]):
                v = (c >> (8 * j)) & 255
                for w in range(nwords):
                    out[w, i] |= spread[m, j, v, w]


def alto_words(coords: np.ndarray, layout: BitLayout) -> np.ndarray:
    """ALTO linear index of each nonzero.

    Parameters
    ----------
    coords : int64 array (nnz, nmodes)
        0-based coordinates, already checked to lie inside ``layout.shape``.
    layout : BitLayout

    Returns
    -------
    uint64 array (nwords, nnz)
        Word 0 holds ALTO bits 0..63, word k bits 64k..64k+63.
    """
    coords = np.ascontiguousarray(coords, dtype=np.int64)
    out = np.empty((layout.nwords, coords.shape[0]), dtype=np.uint64)
    _alto_words(coords, layout.spread_tables, layout.mode_nbytes, out)
    return out


@nb.njit(parallel=True, nogil=True, cache=True)
def _reencode(alto_low, table, nbytes, out):
    for i in nb.prange(alto_low.shape[0]):
        a = alto_low[i]
        r = np.uint64(0)
        for j in range(nbytes):
            r |= table[j, (a >> np.uint64(8 * j)) & np.uint64(255)]
        out[i] = r


def reencode(alto_low: np.ndarray, layout: BitLayout) -> np.ndarray:
    """Re-encode low ALTO words into BLCO indices (one contiguous bit field per mode)."""
    out = np.empty(alto_low.shape[0], dtype=np.uint64)
    _reencode(np.ascontiguousarray(alto_low, dtype=np.uint64), layout.reencode_table, layout.index_nbytes, out)
    return out


@nb.njit(nogil=True, cache=True)
def _decode_alto_pext(alto, is_delta, ppos, pword, masks, shift, out):
    acc = np.uint64(0)
    seen = np.uint64(0)
    k = 0
    nxt = ppos[0] if ppos.shape[0] else -1
    for i in range(alto.shape[0]):
        if i == nxt:  # a delta32 patch: the whole word
            acc = pword[k]
            k += 1
            nxt = ppos[k] if k < ppos.shape[0] else -1
        elif is_delta:
            acc += alto[i]  # wraps like the Delta filter's uint64 differences
        else:
            acc = alto[i]
        seen |= acc
        r = np.uint64(0)
        for m in range(masks.shape[0]):
            r |= pext(acc, masks[m]) << np.uint64(shift[m])
        out[i] = r
    return seen


@nb.njit(nogil=True, cache=True)
def _decode_alto_table(alto, is_delta, ppos, pword, table, nbytes, out):
    acc = np.uint64(0)
    seen = np.uint64(0)
    k = 0
    nxt = ppos[0] if ppos.shape[0] else -1
    for i in range(alto.shape[0]):
        if i == nxt:
            acc = pword[k]
            k += 1
            nxt = ppos[k] if k < ppos.shape[0] else -1
        elif is_delta:
            acc += alto[i]
        else:
            acc = alto[i]
        seen |= acc
        r = np.uint64(0)
        for j in range(nbytes):
            r |= table[j, (acc >> np.uint64(8 * j)) & np.uint64(255)]
        out[i] = r
    return seen


def decode_alto(
    alto: np.ndarray,
    layout: BitLayout,
    out: np.ndarray,
    is_delta: bool = False,
    patches: tuple[np.ndarray, np.ndarray] | None = None,
) -> int:
    """Re-encode one chunk's low ALTO words into ``out``; with ``is_delta`` the input holds the
    stored differences and is summed on the way, in one pass: the Delta filter's (uint64, first
    value absolute) or ``delta32``'s (uint32), whose ``patches`` (chunk-relative positions,
    words; see :mod:`~tensorflow_ooc.format.index_encoding`) give the whole word where they are.

    One BMI2 ``pext`` per mode where the CPU has it, else the byte tables of ``reencode``.
    Single-threaded on purpose: it runs in a read-ahead thread beside the multi-threaded kernel.
    Returns the OR of all ALTO words, so callers can check that no bit beyond the layout's
    ``index_bits`` is set.
    """
    ppos, pword = patches if patches is not None else (NO_PATCH_POSITIONS, NO_PATCH_WORDS)
    if HAS_BMI2:
        return int(_decode_alto_pext(alto, bool(is_delta), ppos, pword, layout.pext_masks, layout.field_shift, out))
    return int(_decode_alto_table(alto, bool(is_delta), ppos, pword, layout.reencode_table, layout.index_nbytes, out))


@nb.njit(parallel=True, nogil=True, cache=True)
def _delinearize(index, base, shift, mask, out):
    nmodes = base.shape[0]
    for i in nb.prange(index.shape[0]):
        x = index[i]
        for m in range(nmodes):
            out[i, m] = base[m] + np.int64((x >> np.uint64(shift[m])) & mask[m])


def delinearize(index: np.ndarray, base: np.ndarray, layout: BitLayout, out: np.ndarray | None = None) -> np.ndarray:
    """Coordinates (nnz, nmodes) int64 of BLCO indices that share one block base."""
    if out is None:
        out = np.empty((index.shape[0], layout.nmodes), dtype=np.int64)
    _delinearize(index, np.asarray(base, dtype=np.int64), layout.field_shift, layout.field_mask, out)
    return out


@nb.njit(nogil=True, cache=True)
def _top_bits(words, total_bits, hi, nbits, out):
    """Bits [hi - nbits, hi) of each multi-word ALTO index, as an integer."""
    lo = hi - nbits
    for i in range(words.shape[1]):
        v = np.uint64(0)
        for p in range(hi - 1, lo - 1, -1):
            v = (v << np.uint64(1)) | ((words[p // 64, i] >> np.uint64(p % 64)) & np.uint64(1))
        out[i] = np.int64(v)


def top_bits(words: np.ndarray, layout: BitLayout, hi: int, nbits: int) -> np.ndarray:
    """Bucket id of each nonzero: ALTO bits [hi - nbits, hi), most significant first (nbits <= 62)."""
    out = np.empty(words.shape[1], dtype=np.int64)
    _top_bits(words, layout.total_bits, hi, nbits, out)
    return out


@nb.njit(parallel=True, nogil=True, cache=True)
def _add_key_base(keys, modes, levels, total_bits, coords):
    for i in nb.prange(keys.shape[1]):
        for p in range(64, total_bits):
            bit = (keys[p // 64, i] >> np.uint64(p % 64)) & np.uint64(1)
            coords[i, modes[p]] |= np.int64(bit) << levels[p]


def coords_from_words(keys: np.ndarray, layout: BitLayout) -> np.ndarray:
    """0-based coordinates (nnz, nmodes) of full ALTO words (nwords, nnz)."""
    coords = delinearize(reencode(keys[0], layout), np.zeros(layout.nmodes, np.int64), layout)
    if layout.nwords > 1:
        modes, levels = layout.alto_positions
        _add_key_base(np.ascontiguousarray(keys), modes, levels, layout.total_bits, coords)
    return coords


@nb.njit(parallel=True, nogil=True, cache=True)
def _piece_minmax(keys, table, nbytes, shift, mask, modes, levels, total_bits, piece_starts, mins, maxs):
    nmodes = shift.shape[0]
    for p in nb.prange(piece_starts.shape[0] - 1):
        c = np.empty(nmodes, dtype=np.int64)
        for m in range(nmodes):
            mins[p, m] = np.iinfo(np.int64).max
            maxs[p, m] = -1
        for i in range(piece_starts[p], piece_starts[p + 1]):
            a = keys[0, i]
            r = np.uint64(0)
            for j in range(nbytes):
                r |= table[j, (a >> np.uint64(8 * j)) & np.uint64(255)]
            for m in range(nmodes):
                c[m] = np.int64((r >> np.uint64(shift[m])) & mask[m])
            for q in range(64, total_bits):
                bit = (keys[q // 64, i] >> np.uint64(q % 64)) & np.uint64(1)
                c[modes[q]] |= np.int64(bit) << levels[q]
            for m in range(nmodes):
                if c[m] < mins[p, m]:
                    mins[p, m] = c[m]
                if c[m] > maxs[p, m]:
                    maxs[p, m] = c[m]


def chunk_minmax(keys: np.ndarray, layout: BitLayout, chunk_nnz: int) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk of ``chunk_nnz`` nonzeros, the smallest and largest index in every mode.

    Decodes on the fly (no coordinate array), in parallel over pieces of the chunks.
    """
    n = keys.shape[1]
    nchunks = -(-n // chunk_nnz)
    split = max(1, min(16, chunk_nnz // 65536))
    starts = sorted(
        {min(n, c * chunk_nnz + (s * chunk_nnz) // split) for c in range(nchunks) for s in range(split)} | {n}
    )
    piece_starts = np.array(starts, dtype=np.int64)
    npieces = piece_starts.shape[0] - 1
    mins = np.empty((npieces, layout.nmodes), dtype=np.int64)
    maxs = np.empty((npieces, layout.nmodes), dtype=np.int64)
    modes, levels = layout.alto_positions
    _piece_minmax(
        keys,
        layout.reencode_table,
        layout.index_nbytes,
        layout.field_shift,
        layout.field_mask,
        modes,
        levels,
        layout.total_bits,
        piece_starts,
        mins,
        maxs,
    )
    owner = piece_starts[:-1] // chunk_nnz
    cmin = np.full((nchunks, layout.nmodes), np.iinfo(np.int64).max, dtype=np.int64)
    cmax = np.full((nchunks, layout.nmodes), -1, dtype=np.int64)
    np.minimum.at(cmin, owner, mins)
    np.maximum.at(cmax, owner, maxs)
    return cmin, cmax


@nb.njit(parallel=True, nogil=True, cache=True)
def _field_minmax(index, shift, mask, pieces, mins, maxs):
    n = index.shape[0]
    nmodes = shift.shape[0]
    step = (n + pieces - 1) // pieces
    for p in nb.prange(pieces):
        for m in range(nmodes):
            mins[p, m] = np.iinfo(np.int64).max
            maxs[p, m] = -1
        for i in range(p * step, min(n, (p + 1) * step)):
            x = index[i]
            for m in range(nmodes):
                c = np.int64((x >> np.uint64(shift[m])) & mask[m])
                if c < mins[p, m]:
                    mins[p, m] = c
                if c > maxs[p, m]:
                    maxs[p, m] = c


def field_minmax(index: np.ndarray, layout: BitLayout) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest field value per mode of BLCO indices sharing one base."""
    pieces = max(1, min(16, index.shape[0] // 65536))
    mins = np.empty((pieces, layout.nmodes), dtype=np.int64)
    maxs = np.empty((pieces, layout.nmodes), dtype=np.int64)
    _field_minmax(index, layout.field_shift, layout.field_mask, pieces, mins, maxs)
    return mins.min(axis=0), maxs.max(axis=0)
