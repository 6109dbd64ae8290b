"""How a store's ALTO index is stored: 32-bit in-chunk differences with patches, or 64-bit ones.

Streaming MTTKRP decompresses every index chunk once per mode, so its decode speed is throughput.
Nonzeros sorted in ALTO order are close together: on uber- and nips-shaped tensors every gap
between neighbours fits in 32 bits. Stored as 32-bit differences, a 2^20-nonzero uber-shaped
chunk decodes (byte shuffle + lz4) in 0.64 ms against 2.50 ms for the 64-bit differences of
format version 1, at the same 2.0 bytes per nonzero: lz4 spent the difference expanding runs of
zero high bytes.

``delta32`` (format version 2): element ``i`` of a chunk holds ``w[i] - w[i-1]`` where that
lies in ``[0, 2^32)``. Every other position -- the chunk's first nonzero, a gap of 2^32 or more,
a block whose key changes the low word downwards -- is a *patch*: its element is 0 and its whole
64-bit word is kept in the store's patch table (position, word). Readers cut work items at
patches, so a kernel that sums differences from an item's first word never crosses one.

``delta64`` (format version 1, and version 2 where patches would be common): the numcodecs Delta
filter's 64-bit differences, first value absolute. Hypersparse tensors (Amazon-shaped: 98 % of
gaps are 2^32 or more) keep it: their gaps need about 5 bytes each whatever the encoding.
"""

from __future__ import annotations

import numba as nb
import numpy as np

DELTA32 = "delta32"
DELTA64 = "delta64"
ENCODINGS = (DELTA32, DELTA64)
# above this fraction of patches (16 bytes each in the table, read whole at open) a store keeps
# 64-bit differences; 1/256 adds at most 1/16 byte per nonzero
PATCH_MAX_FRACTION = 1 / 256

NO_PATCH_POSITIONS = np.zeros(0, dtype=np.int64)
NO_PATCH_WORDS = np.zeros(0, dtype=np.uint64)


@nb.njit(nogil=True, cache=True)
def _count_wide_gaps(words):
    count = 0
    for i in range(1, words.shape[0]):
        if words[i] - words[i - 1] >= np.uint64(1 << 32):  # wraps when the word goes down
            count += 1
    return count


def patch_fraction(words: np.ndarray) -> float:
    """The fraction of ``words`` (one chunk's low ALTO words, in order) that ``delta32`` would
    store as patches for their gaps (the chunk's first word, always a patch, not counted)."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    return _count_wide_gaps(words) / max(1, words.shape[0])


@nb.njit(nogil=True, cache=True)
def _encode_delta32(words, out, pos, word):
    n = words.shape[0]
    k = 0
    for i in range(n):
        d = words[i] - words[i - 1] if i else np.uint64(1 << 32)
        if d >= np.uint64(1 << 32):
            out[i] = 0
            pos[k] = i
            word[k] = words[i]
            k += 1
        else:
            out[i] = np.uint32(d)
    return k


def encode_delta32(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One chunk's low ALTO words as ``delta32``.

    Parameters
    ----------
    words : uint64 (n,)
        Low ALTO words of the chunk's nonzeros, in stored order.

    Returns
    -------
    diffs : uint32 (n,)
        Differences to the previous word, 0 at patches.
    positions : int64 (p,)
        Patches, relative to the chunk's first nonzero (0 always among them when n > 0).
    patch_words : uint64 (p,)
        The words at the patches.
    """
    words = np.ascontiguousarray(words, dtype=np.uint64)
    n = words.shape[0]
    out = np.empty(n, dtype=np.uint32)
    pos = np.empty(n, dtype=np.int64)
    word = np.empty(n, dtype=np.uint64)
    k = _encode_delta32(words, out, pos, word)
    return out, pos[:k].copy(), word[:k].copy()


@nb.njit(nogil=True, cache=True)
def _delta_words(diffs, pos, word, out):
    acc = np.uint64(0)
    k = 0
    nxt = pos[0] if pos.shape[0] else -1
    for i in range(diffs.shape[0]):
        if i == nxt:
            acc = word[k]
            k += 1
            nxt = pos[k] if k < pos.shape[0] else -1
        else:
            acc += diffs[i]  # wraps like the Delta filter's uint64 differences
        out[i] = acc


def delta_words(
    diffs: np.ndarray,
    positions: np.ndarray = NO_PATCH_POSITIONS,
    patch_words: np.ndarray = NO_PATCH_WORDS,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Low ALTO words of one chunk from its stored differences: ``delta32`` (uint32, with its
    patches) or ``delta64`` (uint64, first value absolute, no patches)."""
    if out is None:
        out = np.empty(diffs.shape[0], dtype=np.uint64)
    _delta_words(diffs, np.asarray(positions, dtype=np.int64), np.asarray(patch_words, dtype=np.uint64), out)
    return out


def split_at_patches(segments: np.ndarray, bases: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block segments ``(block, lo, hi)`` of a chunk (int64 (s, 3), chunk-relative, with their
    ``bases`` (s, N)), each cut where a patch falls strictly inside it, so that no work item made
    from them spans a patch."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0 or segments.shape[0] == 0:
        return segments, bases
    lo, hi = segments[:, 1], segments[:, 2]
    first = np.searchsorted(positions, lo, side="right")
    last = np.searchsorted(positions, hi, side="left")
    cuts = last - first
    if not cuts.any():
        return segments, bases
    reps = cuts + 1
    seg = np.repeat(segments, reps, axis=0)
    out_bases = np.repeat(bases, reps, axis=0)
    inner = np.concatenate([positions[a:b] for a, b in zip(first, last)]).astype(np.int64)
    # within each run of pieces of one segment: starts are lo then the cuts, ends the cuts then hi
    head = np.cumsum(reps) - reps
    is_head = np.zeros(seg.shape[0], dtype=bool)
    is_head[head] = True
    starts = seg[:, 1].copy()
    starts[~is_head] = inner
    ends = seg[:, 2].copy()
    is_tail = np.roll(is_head, -1)
    ends[~is_tail] = inner
    seg[:, 1], seg[:, 2] = starts, ends
    return seg, out_bases
