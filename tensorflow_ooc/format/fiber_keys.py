"""Fiber keys: a nonzero's indices in every mode but one, as one mixed-radix number.

The nonzeros of a mode-``m`` fiber share every index but the mode-``m`` one, so they share this
key; sorting by it puts each fiber in one run (the fiber index of a store, the in-memory index of
a partition, the hash join of a streamed sampled MTTKRP). When the product of the other modes'
lengths exceeds 2^63 the keys wrap (a hash); :func:`exact_keys` says whether they do not.
"""

from __future__ import annotations

import numba as nb
import numpy as np


def key_strides(shape: tuple[int, ...], mode: int) -> np.ndarray:
    """uint64 (N,) strides of the mixed-radix key over the modes other than ``mode`` (0 for it);
    products wrap modulo 2^64 where the key space is larger."""
    strides = np.zeros(len(shape), dtype=np.uint64)
    s = 1
    for m in range(len(shape) - 1, -1, -1):
        if m != mode:
            strides[m] = np.uint64(s % 2**64)
            s *= int(shape[m])
    return strides


def key_space(shape: tuple[int, ...], mode: int) -> int:
    """Cells of the modes other than ``mode`` (a Python int): exact keys lie in ``[0, key_space)``."""
    p = 1
    for m, s in enumerate(shape):
        if m != mode:
            p *= int(s)
    return p


def exact_keys(shape: tuple[int, ...], mode: int) -> bool:
    """Whether mode ``mode``'s keys are exact (the other modes' index space fits in 63 bits)."""
    return key_space(shape, mode) < 2**63


def sample_keys(coords: np.ndarray, shape: tuple[int, ...], mode: int) -> np.ndarray:
    """uint64 keys of sampled multi-indices ``coords`` (S, N); column ``mode`` is ignored."""
    strides = key_strides(shape, mode)
    return (np.asarray(coords, dtype=np.int64).astype(np.uint64) * strides[None, :]).sum(axis=1, dtype=np.uint64)


def distinct_sorted(keys: np.ndarray) -> np.ndarray:
    """The distinct values of ``keys`` (integers, their dtype kept), sorted: a sort (cheap on the
    samplers' key-ordered draws) and a comparison of neighbours, where ``np.unique``'s hash table
    cost 10 ms a call on a round's 65 k keys."""
    keys = np.sort(np.asarray(keys))
    if keys.shape[0] < 2:
        return keys
    keep = np.empty(keys.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


# --- a Bloom filter of the keys a fiber index holds: sampled fibers that hold no nonzero are
# most draws on sparse tensors (CP-ARLS-LEV on an 86 M planted tensor: 2 M matched of 65 k fibers
# a mode), and each cost the read of the chunk its key falls in; the filter skips nearly all

BLOOM_BITS_PER_KEY = 8
BLOOM_HASHES = 4


def bloom_words(distinct_keys: int) -> int:
    """uint64 words of a filter for ``distinct_keys`` keys: a power of two, at least 8 bits a key."""
    bits = max(64, BLOOM_BITS_PER_KEY * max(1, int(distinct_keys)))
    return 1 << max(0, (bits - 1).bit_length() - 6)


@nb.njit(inline="always")
def _mix(x):
    # splitmix64's finalizer: every bit of the key reaches every bit of the hash
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


# blocked: a key's bits lie in one 512-bit block, so a query reads one small piece of the filter
# instead of holding all of it (three whole filters of 512 MB at 500 M fibers a mode did not fit a
# 4 GB worker beside exact ALS's own peak)
BLOOM_BLOCK_WORDS = 8


@nb.njit(inline="always")
def _block_bit(g, j):
    # hash ``j`` of a key's bits in its block: 9 bits of its second hash ``g`` each
    return (g >> np.uint64(9 * j)) & np.uint64(511)


@nb.njit(nogil=True, cache=True)
def bloom_blocks(keys, nblocks):
    """The block of each key (uint64) in a blocked filter of ``nblocks`` blocks (a power of two)."""
    mask = np.uint64(nblocks - 1)
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        out[i] = np.int64(_mix(keys[i]) & mask)
    return out


@nb.njit(nogil=True, cache=True)
def blocked_insert(keys, words):
    """Set the bits of ``keys`` (uint64) in the blocked filter ``words`` (uint64, a power of two
    long, at least one block)."""
    mask = np.uint64(words.shape[0] // BLOOM_BLOCK_WORDS - 1)
    for i in range(keys.shape[0]):
        h = _mix(keys[i])
        base = np.int64(h & mask) * BLOOM_BLOCK_WORDS
        g = _mix(h)
        for j in range(BLOOM_HASHES):
            b = _block_bit(g, j)
            words[base + np.int64(b >> np.uint64(6))] |= np.uint64(1) << (b & np.uint64(63))


#: filter words a region of :func:`blocked_insert_by_region` spans: 256 KiB, in a core's L2 cache
BLOOM_REGION_WORDS = 1 << 15


@nb.njit(nogil=True, cache=True)
def blocked_insert_by_region(keys, words, scratch):
    """:func:`blocked_insert`, the same bits, with the keys' hashes first grouped by region of the
    filter (:data:`BLOOM_REGION_WORDS`) so each region's inserts hit the cache: inserting in key
    order writes a random cache line of the filter a key (86 M keys into 128 MB: 3.3 s, grouped
    by region 8 M at a time 1.6 s). ``scratch``: uint64, at least as long as ``keys``; it pays
    where ``keys`` number about half the filter's words or more."""
    nblocks = words.shape[0] // BLOOM_BLOCK_WORDS
    mask = np.uint64(nblocks - 1)
    region_blocks = min(nblocks, BLOOM_REGION_WORDS // BLOOM_BLOCK_WORDS)
    shift = np.uint64(0)
    while (1 << np.int64(shift)) < region_blocks:
        shift += np.uint64(1)
    nregions = nblocks // region_blocks
    at = np.zeros(nregions + 1, dtype=np.int64)
    n = keys.shape[0]
    for i in range(n):
        at[np.int64((_mix(keys[i]) & mask) >> shift) + 1] += 1
    for r in range(nregions):
        at[r + 1] += at[r]
    for i in range(n):
        h = _mix(keys[i])
        r = np.int64((h & mask) >> shift)
        scratch[at[r]] = h
        at[r] += 1
    for i in range(n):
        h = scratch[i]
        base = np.int64(h & mask) * BLOOM_BLOCK_WORDS
        g = _mix(h)
        for j in range(BLOOM_HASHES):
            b = _block_bit(g, j)
            words[base + np.int64(b >> np.uint64(6))] |= np.uint64(1) << (b & np.uint64(63))


def folded_filter(words: np.ndarray, nwords: int) -> np.ndarray:
    """A blocked filter of ``words`` (uint64, a power of two long) as the filter of ``nwords``
    words (a smaller power of two, at least one block) of the same keys: a key's block is the low
    bits of its hash and its bits in the block do not depend on the size, so the two halves OR'd
    together are the filter of half the size. In place: a view of the first ``nwords`` words."""
    if nwords > words.shape[0] or nwords < BLOOM_BLOCK_WORDS or nwords & (nwords - 1):
        raise ValueError(f"a filter of {words.shape[0]:,} words cannot fold to {nwords:,} words")
    while words.shape[0] > nwords:
        half = words.shape[0] // 2
        np.bitwise_or(words[:half], words[half:], out=words[:half])
        words = words[:half]
    return words


@nb.njit(nogil=True, cache=True)
def blocked_query(keys, words, slots):
    """Whether each key may be in a blocked filter (no false negatives), with key ``i``'s block at
    ``words[slots[i]:slots[i] + 8]`` (the blocks a query read, not the whole filter)."""
    out = np.empty(keys.shape[0], dtype=np.bool_)
    for i in range(keys.shape[0]):
        g = _mix(_mix(keys[i]))
        hit = True
        for j in range(BLOOM_HASHES):
            b = _block_bit(g, j)
            if (words[slots[i] + np.int64(b >> np.uint64(6))] >> (b & np.uint64(63))) & np.uint64(1) == 0:
                hit = False
                break
        out[i] = hit
    return out
