"""A hash table of byte-string keys that numbers them in order of first appearance, kept across
batches: a table's keys are mapped to indices in one probe a row, without rebuilding a hash of
the keys seen so far for each batch (``pyarrow.compute.index_in`` does: 0.1 s a batch at 1 M
keys) and without a second pass over the table.

Keys are the bytes of each row: a string's UTF-8, or the little-endian value of an integer, date
or timestamp (8 or 4 bytes). A slot holds the hash's high bits, the key id, the key's length and
its first 16 bytes, so a lookup touches one cache line (random reads cost about 0.4 us each on the
benchmark machine: three of them a lookup made it 3x slower); the keys' bytes live in one
growing buffer with offsets.
Lookups of known keys run in parallel; the rows whose key is new are then numbered in row order on
one thread, so the numbering is the order of first appearance whatever the threads.
"""

from __future__ import annotations

import numba as nb
import numpy as np

EMPTY = np.int64(-1)
ID_MASK = np.int64(0xFFFFFFFF)


@nb.njit(inline="always")
def _hash(data, start, stop):
    """FNV-1a over data[start:stop], finished by a multiply-xorshift (so the high bits mix)."""
    h = np.uint64(0xCBF29CE484222325)
    for i in range(start, stop):
        h = (h ^ np.uint64(data[i])) * np.uint64(0x100000001B3)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


@nb.njit(inline="always")
def _prefix(data, s, e):
    """The first 16 bytes of data[s:e] as two little-endian words, zero-padded."""
    a = np.uint64(0)
    b = np.uint64(0)
    n = e - s
    for j in range(min(n, 8)):
        a |= np.uint64(data[s + j]) << np.uint64(8 * j)
    for j in range(8, min(n, 16)):
        b |= np.uint64(data[s + j]) << np.uint64(8 * (j - 8))
    return np.int64(a), np.int64(b)


@nb.njit(inline="always")
def _rest_same(data, s, e, kdata, ks):
    """Bytes past the first 16 of data[s:e] equal those of the key starting at kdata[ks]."""
    for j in range(16, e - s):
        if data[s + j] != kdata[ks + j]:
            return False
    return True


@nb.njit(inline="always")
def _find(data, s, e, h, slots, koff, kdata):
    """(slot, key id or -1) of the key data[s:e] with hash h. A slot is four words: (hash high
    32 bits << 32) | id, the key's length and its first 16 bytes, so a lookup reads one cache line
    (and the key's bytes only past 16)."""
    mask = slots.shape[0] - 1
    tag = np.int64(h >> np.uint64(32))
    n = e - s
    a, b = _prefix(data, s, e)
    p = np.int64(h) & mask
    while True:
        v = slots[p, 0]
        if v == -1:
            return p, -1
        if ((v >> 32) & 0xFFFFFFFF) == tag and slots[p, 1] == n and slots[p, 2] == a and slots[p, 3] == b:
            k = v & 0xFFFFFFFF
            if n <= 16 or _rest_same(data, s, e, kdata, koff[k]):
                return p, k
        p = (p + 1) & mask


@nb.njit(inline="always")
def _put(slots, p, h, k, data, s, e):
    a, b = _prefix(data, s, e)
    slots[p, 0] = (np.int64(h >> np.uint64(32)) << 32) | k
    slots[p, 1] = e - s
    slots[p, 2] = a
    slots[p, 3] = b


@nb.njit(parallel=True, nogil=True, cache=True)
def _probe(offsets, data, slots, koff, kdata, out, hashes):
    """Known keys' ids into out (-1 for new keys), and every row's hash."""
    n = out.shape[0]
    for i in nb.prange(n):
        s, e = offsets[i], offsets[i + 1]
        h = _hash(data, s, e)
        hashes[i] = h
        _, k = _find(data, s, e, h, slots, koff, kdata)
        out[i] = k


@nb.njit(nogil=True, cache=True)
def _insert(offsets, data, rows, hashes, slots, koff, kdata, nkeys, used, out):
    """Number the keys of ``rows`` (the rows the probe did not find, in row order) and write
    every such row's id. Stops early when the slots or the key buffers are full: returns
    (rows done, keys, bytes used)."""
    cap_keys = koff.shape[0] - 1
    limit = slots.shape[0] // 2
    for j in range(rows.shape[0]):
        i = rows[j]
        s, e = offsets[i], offsets[i + 1]
        h = hashes[i]
        p, k = _find(data, s, e, h, slots, koff, kdata)
        if k < 0:
            if nkeys >= limit or nkeys >= cap_keys or used + (e - s) > kdata.shape[0]:
                return j, nkeys, used
            k = nkeys
            kdata[used : used + (e - s)] = data[s:e]
            used += e - s
            koff[k + 1] = used
            _put(slots, p, h, k, data, s, e)
            nkeys += 1
        out[i] = k
    return rows.shape[0], nkeys, used


@nb.njit(nogil=True, cache=True)
def _rehash(slots, koff, kdata, nkeys):
    mask = slots.shape[0] - 1
    for k in range(nkeys):
        s, e = koff[k], koff[k + 1]
        h = _hash(kdata, s, e)
        p = np.int64(h) & mask
        while slots[p, 0] != -1:
            p = (p + 1) & mask
        _put(slots, p, h, k, kdata, s, e)


class KeyTable:
    """Byte-string keys -> ids in order of first appearance (see the module's doc)."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self.slots = np.full((2 * cap, 4), -1, dtype=np.int64)
        self.koff = np.zeros(cap + 1, dtype=np.int64)
        self.kdata = np.empty(16 * cap, dtype=np.uint8)
        self.nkeys = 0
        self.used = 0

    def __len__(self) -> int:
        return self.nkeys

    def _grow(self, need_bytes: int) -> None:
        if self.nkeys >= self.slots.shape[0] // 2 or self.nkeys >= self.koff.shape[0] - 1:
            cap = 2 * (self.koff.shape[0] - 1)
            koff = np.zeros(cap + 1, dtype=np.int64)
            koff[: self.nkeys + 1] = self.koff[: self.nkeys + 1]
            self.koff = koff
            self.slots = np.full((2 * cap, 4), -1, dtype=np.int64)
            _rehash(self.slots, self.koff, self.kdata, self.nkeys)
        if self.used + need_bytes > self.kdata.shape[0]:
            kdata = np.empty(max(2 * self.kdata.shape[0], self.used + need_bytes), dtype=np.uint8)
            kdata[: self.used] = self.kdata[: self.used]
            self.kdata = kdata

    def index(self, offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
        """The id of each row's key ``data[offsets[i]:offsets[i + 1]]``, numbering new keys."""
        n = offsets.shape[0] - 1
        out = np.empty(n, dtype=np.int64)
        hashes = np.empty(n, dtype=np.uint64)
        _probe(offsets, data, self.slots, self.koff, self.kdata, out, hashes)
        rows = np.flatnonzero(out < 0)
        while rows.shape[0]:
            done, self.nkeys, self.used = _insert(
                offsets, data, rows, hashes, self.slots, self.koff, self.kdata, self.nkeys, self.used, out
            )
            if done < rows.shape[0]:
                i = rows[done]
                self._grow(int(offsets[i + 1] - offsets[i]) + 1)
            rows = rows[done:]
        return out

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets int64 (nkeys + 1,), bytes) of the keys in id order."""
        return self.koff[: self.nkeys + 1], self.kdata[: self.used]
