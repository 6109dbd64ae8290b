"""Parallel, stable LSD radix sort of multi-word ALTO indices, carrying values along.

Only the bits the layout actually uses are sorted, and passes whose digit is constant are skipped:
for an uber-shaped tensor (35 bits) that is three or four passes over the data.
"""

from __future__ import annotations

import numba as nb
import numpy as np

DIGIT_BITS = 11


@nb.njit(parallel=True, nogil=True, cache=True)
def _histogram(keys, word, shift, mask, nthreads, hist):
    n = keys.shape[1]
    step = (n + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        lo = t * step
        hi = min(n, lo + step)
        for i in range(lo, hi):
            hist[t, (keys[word, i] >> shift) & mask] += 1


@nb.njit(parallel=True, nogil=True, cache=True)
def _scatter(keys, values, word, shift, mask, nthreads, offsets, keys_out, values_out):
    n = keys.shape[1]
    nwords = keys.shape[0]
    step = (n + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        lo = t * step
        hi = min(n, lo + step)
        for i in range(lo, hi):
            d = (keys[word, i] >> shift) & mask
            pos = offsets[t, d]
            offsets[t, d] = pos + 1
            for w in range(nwords):
                keys_out[w, pos] = keys[w, i]
            values_out[pos] = values[i]


def sort_alto(keys: np.ndarray, values: np.ndarray, total_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort nonzeros by their ALTO index, stably.

    Parameters
    ----------
    keys : uint64 array (nwords, nnz)
        ALTO words, word 0 least significant.
    values : array (nnz,)
    total_bits : int
        Bits of the ALTO index that may be non-zero.

    Returns
    -------
    (keys, values) sorted; equal keys keep their input order (``duplicates="last"`` relies on it).
    The inputs may be reused as scratch space.
    """
    n = keys.shape[1]
    if n <= 1 or total_bits == 0:
        return keys, values
    nthreads = max(1, min(nb.get_num_threads(), n // 65536 or 1))
    src_k, src_v = keys, values
    dst_k, dst_v = np.empty_like(keys), np.empty_like(values)
    for word in range(keys.shape[0]):
        bits = min(64, total_bits - 64 * word)
        if bits <= 0:
            break
        npasses = -(-bits // DIGIT_BITS)
        digit = -(-bits // npasses)
        for p in range(npasses):
            shift = p * digit
            width = min(digit, bits - shift)
            mask = np.uint64((1 << width) - 1)
            hist = np.zeros((nthreads, 1 << width), dtype=np.int64)
            _histogram(src_k, word, np.uint64(shift), mask, nthreads, hist)
            totals = hist.sum(axis=0)
            if totals.max() == n:
                continue  # every key has the same digit here: nothing to move
            # offsets[t, d] = start of digit d + items of digit d in threads before t
            starts = np.concatenate([[0], np.cumsum(totals)[:-1]])
            offsets = starts[None, :] + np.cumsum(hist, axis=0) - hist
            _scatter(src_k, src_v, word, np.uint64(shift), mask, nthreads, offsets, dst_k, dst_v)
            src_k, dst_k = dst_k, src_k
            src_v, dst_v = dst_v, src_v
    return src_k, src_v


@nb.njit(parallel=True, nogil=True, cache=True)
def _scatter_keys(keys, word, shift, mask, nthreads, offsets, keys_out):
    n = keys.shape[1]
    nwords = keys.shape[0]
    step = (n + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        lo = t * step
        hi = min(n, lo + step)
        for i in range(lo, hi):
            d = (keys[word, i] >> shift) & mask
            pos = offsets[t, d]
            offsets[t, d] = pos + 1
            for w in range(nwords):
                keys_out[w, pos] = keys[w, i]


MSD_MAX_BITS = 16


@nb.njit(parallel=True, nogil=True, cache=True)
def _msd_digit(keys, lowb, nthreads, digit, hist):
    """digit[i] = ALTO bits [lowb, total_bits) of key i (lowb >= total_bits - 64), with per-thread counts."""
    n = keys.shape[1]
    two = keys.shape[0] == 2
    step = (n + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        for i in range(t * step, min(n, (t + 1) * step)):
            if two:
                hi = keys[1, i] << np.uint64(64 - lowb) if lowb > 0 else keys[1, i]
                d = hi | (keys[0, i] >> np.uint64(lowb)) if lowb < 64 else hi
            else:
                d = keys[0, i] >> np.uint64(lowb)
            digit[i] = np.int64(d)
            hist[t, digit[i]] += 1


@nb.njit(parallel=True, nogil=True, cache=True)
def _msd_scatter(keys, digit, nthreads, offsets, low_out):
    n = keys.shape[1]
    step = (n + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        for i in range(t * step, min(n, (t + 1) * step)):
            d = digit[i]
            low_out[offsets[t, d]] = keys[0, i]
            offsets[t, d] += 1


@nb.njit(nogil=True, cache=True)
def _byte_passes(src, dst, count, lo, hi):
    """Stable LSD counting passes over ``src`` (uint64, at least one key) on bits ``lo .. hi - 1``
    a byte at a time, ``dst`` (as long) the other buffer, ``count`` 256 slots; a byte the same in
    every key is skipped. Returns whichever of the two buffers holds the sorted keys."""
    n = src.shape[0]
    for shift in range(lo, hi, 8):
        sh = np.uint64(shift)
        for d in range(256):
            count[d] = 0
        for i in range(n):
            count[(src[i] >> sh) & np.uint64(255)] += 1
        if count[(src[0] >> sh) & np.uint64(255)] == n:
            continue
        total = 0
        for d in range(256):
            c = count[d]
            count[d] = total
            total += c
        for i in range(n):
            d = (src[i] >> sh) & np.uint64(255)
            dst[count[d]] = src[i]
            count[d] += 1
        src, dst = dst, src
    return src


@nb.njit(nogil=True, cache=True)
def _sort_small(a, tmp, count, nbits):
    """Sort ``a`` (uint64, a few hundred keys, in cache) on its low ``nbits`` bits, in place:
    byte-wise LSD radix, skipping bytes that are the same in every key; insertion sort when tiny."""
    n = a.shape[0]
    if n < 32:
        for i in range(1, n):
            x = a[i]
            j = i - 1
            while j >= 0 and a[j] > x:
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = x
        return
    src = _byte_passes(a, tmp[:n], count, 0, nbits)
    if src.ctypes.data != a.ctypes.data:
        a[:] = src


@nb.njit(parallel=True, nogil=True, cache=True)
def _sort_digit_runs(low, starts, groups, lowb, out):
    """Sort each digit's run of low words and rebuild the full words (the digit fixes the rest)."""
    two = out.shape[0] == 2
    for g in nb.prange(groups.shape[0] - 1):
        longest = 0
        for d in range(groups[g], groups[g + 1]):
            longest = max(longest, starts[d + 1] - starts[d])
        tmp = np.empty(longest, dtype=np.uint64)
        count = np.empty(256, dtype=np.int64)
        for d in range(groups[g], groups[g + 1]):
            s, e = starts[d], starts[d + 1]
            if e - s > 1:
                _sort_small(low[s:e], tmp, count, lowb)
            for i in range(s, e):
                out[0, i] = low[i]
                if two:
                    out[1, i] = np.uint64(d) >> np.uint64(64 - lowb) if lowb > 0 else np.uint64(d)


def _sort_keys_msd(keys: np.ndarray, total_bits: int, nthreads: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """One MSD pass on the top bits (all of word 1), then each digit's run sorted in cache
    (``scratch``: 2n uint64 words for the digits and the low words, else new arrays)."""
    n = keys.shape[1]
    # digit runs of about 512 keys (4 KiB) are sorted in L1 cache
    bits = int(min(MSD_MAX_BITS, max(total_bits - 64, 1, int(np.log2(max(n, 1) / 512)))))
    bits = min(bits, total_bits)
    lowb = total_bits - bits
    if scratch is None:
        scratch = np.empty(2 * n, dtype=np.uint64)
    digit = scratch[:n].view(np.int64)
    hist = np.zeros((nthreads, 1 << bits), dtype=np.int64)
    _msd_digit(keys, lowb, nthreads, digit, hist)
    totals = hist.sum(axis=0)
    starts = np.zeros((1 << bits) + 1, dtype=np.int64)
    np.cumsum(totals, out=starts[1:])
    offsets = starts[None, :-1] + np.cumsum(hist, axis=0) - hist
    low = scratch[n : 2 * n]
    _msd_scatter(keys, digit, nthreads, offsets, low)
    del digit
    # groups of digits with about equal work per thread (heavy tails make digit runs uneven)
    parts = max(1, 4 * nthreads)
    groups = np.unique(np.searchsorted(starts, np.linspace(0, n, parts + 1), side="left").clip(0, 1 << bits))
    groups[0], groups[-1] = 0, 1 << bits
    _sort_digit_runs(low, starts, groups, lowb, keys)
    return keys


def sort_keys(keys: np.ndarray, total_bits: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """Sort multi-word ALTO indices alone (no values), ascending; the input may be reused as scratch.

    Parameters
    ----------
    keys : uint64 array (nwords, n)
        Word 0 least significant.
    total_bits : int
        Bits that may be non-zero.
    scratch : uint64 array, optional
        At least 2n words the sort of one- or two-word keys of at most 80 bits works in (else
        it allocates them): a caller sorting many runs maps them once.

    Returns
    -------
    The sorted keys (``keys`` itself or a new array).
    """
    n = keys.shape[1]
    if n <= 1 or total_bits == 0:
        return keys
    nthreads = max(1, min(nb.get_num_threads(), n // 65536 or 1))
    if keys.shape[0] <= 2 and total_bits <= 64 + MSD_MAX_BITS:
        return _sort_keys_msd(keys, total_bits, nthreads, None if scratch is None else scratch[: 2 * n])
    src, dst = keys, np.empty_like(keys)
    for word in range(keys.shape[0]):
        bits = min(64, total_bits - 64 * word)
        if bits <= 0:
            break
        npasses = -(-bits // DIGIT_BITS)
        digit = -(-bits // npasses)
        for p in range(npasses):
            shift = p * digit
            width = min(digit, bits - shift)
            mask = np.uint64((1 << width) - 1)
            hist = np.zeros((nthreads, 1 << width), dtype=np.int64)
            _histogram(src, word, np.uint64(shift), mask, nthreads, hist)
            totals = hist.sum(axis=0)
            if totals.max() == n:
                continue  # constant digit
            starts = np.concatenate([[0], np.cumsum(totals)[:-1]])
            offsets = starts[None, :] + np.cumsum(hist, axis=0) - hist
            _scatter_keys(src, word, np.uint64(shift), mask, nthreads, offsets, dst)
            src, dst = dst, src
    return src


def stable_key_order(keys: np.ndarray, key_space: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.argsort(keys, kind="stable")`` for uint64 ``keys`` below ``key_space``, and the keys in
    that order.

    Each key is joined with its position below it (one word, or two where they need more than
    64 bits together) and the joined words sorted by value: they are distinct, so their order is
    the stable order of the keys. They are sorted by the store's parallel radix sort
    (:func:`~tensorflow_ooc.format.radix_sort.sort_keys`, in the words' buffer, with 16 bytes a word
    of scratch: the index's build still peaks at about 56 bytes a nonzero, in the gather after it).
    Joined words of 3.3 M keys of 24 bits, 2 threads: 0.03 s against 0.195 s for numpy's sort,
    20 M of 30 bits 0.20 s against 1.59 s (numpy's stable argsort of 20 M nell2-shaped keys took
    2.6 s)."""
    n = keys.shape[0]
    pbits = max(1, (n - 1).bit_length())
    total_bits = (max(1, key_space) - 1).bit_length() + pbits
    if total_bits > 64:
        # two words, as an ALTO index of two words: numpy's stable argsort of 10 M Amazon-shaped
        # keys (42 bits) took 1.4 s of a 25 s fiber index build
        wide = sort_keys(_join_positions_wide(keys, pbits), total_bits)
        return _split_positions_wide(wide, pbits)
    joined = _join_positions(keys, pbits)
    joined = sort_keys(joined[None, :], total_bits)[0]
    return _split_positions(joined, pbits)


@nb.njit(parallel=True, nogil=True, cache=True)
def _join_positions(keys, pbits):
    out = np.empty(keys.shape[0], dtype=np.uint64)
    for i in nb.prange(keys.shape[0]):
        out[i] = (keys[i] << np.uint64(pbits)) | np.uint64(i)
    return out


@nb.njit(parallel=True, nogil=True, cache=True)
def _split_positions(joined, pbits):
    order = np.empty(joined.shape[0], dtype=np.int64)
    keys = np.empty(joined.shape[0], dtype=np.uint64)
    mask = np.uint64((1 << pbits) - 1)
    for i in nb.prange(joined.shape[0]):
        order[i] = np.int64(joined[i] & mask)
        keys[i] = joined[i] >> np.uint64(pbits)
    return order, keys


@nb.njit(parallel=True, nogil=True, cache=True)
def _join_positions_wide(keys, pbits):
    # (key << pbits) | position as 128 bits: word 0 the low half
    out = np.empty((2, keys.shape[0]), dtype=np.uint64)
    up = np.uint64(64 - pbits)
    for i in nb.prange(keys.shape[0]):
        out[0, i] = (keys[i] << np.uint64(pbits)) | np.uint64(i)
        out[1, i] = keys[i] >> up
    return out


@nb.njit(parallel=True, nogil=True, cache=True)
def _split_positions_wide(wide, pbits):
    n = wide.shape[1]
    order = np.empty(n, dtype=np.int64)
    keys = np.empty(n, dtype=np.uint64)
    mask = np.uint64((1 << pbits) - 1)
    up = np.uint64(64 - pbits)
    for i in nb.prange(n):
        order[i] = np.int64(wide[0, i] & mask)
        keys[i] = (wide[0, i] >> np.uint64(pbits)) | (wide[1, i] << up)
    return order, keys


def stable_sort_by_key(
    keys: np.ndarray,
    lo: int,
    hi: int,
    rows: np.ndarray,
    values: np.ndarray,
    out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    scratch: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``keys`` (uint64, in ``[lo, hi)``) sorted stably, with ``rows`` and ``values`` in the same
    order: :func:`stable_key_order` on the keys relative to ``lo`` (fewer bits), with the
    positions' split and the gathers of rows and values fused into one parallel pass where
    key and position fit one word.

    Parameters
    ----------
    out : (keys, rows, values) arrays, optional
        Where the sorted entries go (their first n elements; dtypes of the inputs), else new
        arrays. A build sorting many runs reuses them: fresh arrays cost their pages' faults.
    scratch : uint64 array, optional
        At least 3n words the sort works in, else new arrays (as ``out``).

    Returns
    -------
    (keys, rows, values): views of ``out``, or new arrays.
    """
    n = keys.shape[0]
    pbits = max(1, (n - 1).bit_length())
    total_bits = (max(1, hi - lo) - 1).bit_length() + pbits
    if total_bits > 64:
        order, out = stable_key_order(keys - np.uint64(lo), hi - lo)
        out += np.uint64(lo)
        return out, rows[order], values[order]
    joined = np.empty(n, dtype=np.uint64) if scratch is None else scratch[:n]
    _join_positions_from(keys, np.uint64(lo), pbits, joined)
    joined = sort_keys(joined[None, :], total_bits, None if scratch is None else scratch[n : 3 * n])[0]
    if out is None:
        out = (np.empty(n, dtype=np.uint64), np.empty(n, dtype=rows.dtype), np.empty(n, dtype=values.dtype))
    k_out, r_out, v_out = (a[:n] for a in out)
    _split_gather(joined, pbits, np.uint64(lo), rows, values, k_out, r_out, v_out)
    return k_out, r_out, v_out


@nb.njit(parallel=True, nogil=True, cache=True)
def _join_positions_from(keys, lo, pbits, out):
    for i in nb.prange(keys.shape[0]):
        out[i] = ((keys[i] - lo) << np.uint64(pbits)) | np.uint64(i)


@nb.njit(parallel=True, nogil=True, cache=True)
def _split_gather(joined, pbits, lo, rows, values, k_out, r_out, v_out):
    mask = np.uint64((1 << pbits) - 1)
    for i in nb.prange(joined.shape[0]):
        j = np.int64(joined[i] & mask)
        k_out[i] = (joined[i] >> np.uint64(pbits)) + lo
        r_out[i] = rows[j]
        v_out[i] = values[j]


# --- records sorted by key, stably, in buckets: the fiber index's build ---------------------------

#: entries per bucket aimed at by :func:`sort_records` (its buckets are sorted in cache)
RECORD_BUCKET = 512
#: top-bit buckets of :func:`sort_records`, at most (2^16 write positions per thread already spill
#: the first-level caches; more buckets only add histogram traffic)
RECORD_BUCKET_BITS = 16


@nb.njit(parallel=True, nogil=True, cache=True)
def _record_hist(keys, lowb, nthreads, hist):
    n = keys.shape[0]
    step = (n + nthreads - 1) // nthreads
    sh = np.uint64(lowb)
    for t in nb.prange(nthreads):
        for i in range(t * step, min(n, (t + 1) * step)):
            hist[t, np.uint64(keys[i]) >> sh] += 1


@nb.njit(parallel=True, nogil=True, cache=True)
def _record_scatter(keys, rows, values, lowb, nthreads, offsets, k_out, r_out, v_out):
    """Every record to its bucket (the key's top bits), in input order within a bucket."""
    n = keys.shape[0]
    step = (n + nthreads - 1) // nthreads
    sh = np.uint64(lowb)
    for t in nb.prange(nthreads):
        for i in range(t * step, min(n, (t + 1) * step)):
            d = np.uint64(keys[i]) >> sh
            pos = offsets[t, d]
            offsets[t, d] = pos + 1
            k_out[pos] = keys[i]
            r_out[pos] = rows[i]
            v_out[pos] = values[i]


@nb.njit(nogil=True, cache=True)
def _bucket_order(keys, s, e, lowb, pbits, w, tmp, count):
    """The records ``s .. e - 1`` of one bucket in key order, stably: ``w[:e - s]`` their positions
    in the bucket. Each is the key's low ``lowb`` bits above its position (``pbits`` bits), sorted
    byte by byte (LSD, counting) on the key's bits only: the positions are in order already, and
    each pass keeps the order of equal bytes, so equal keys stay in input order."""
    n = e - s
    lowmask = (np.uint64(1) << np.uint64(lowb)) - np.uint64(1)
    for j in range(n):
        w[j] = ((np.uint64(keys[s + j]) & lowmask) << np.uint64(pbits)) | np.uint64(j)
    return _byte_passes(w[:n], tmp[:n], count, pbits, pbits + lowb)


@nb.njit(parallel=True, nogil=True, cache=True)
def _sort_buckets(k_in, r_in, v_in, starts, groups, lowb, pbits, k_out, r_out, v_out):
    """Each bucket's records sorted by key (:func:`_bucket_order`) into the outputs, groups of
    buckets in parallel."""
    pmask = (np.uint64(1) << np.uint64(pbits)) - np.uint64(1)
    for g in nb.prange(groups.shape[0] - 1):
        longest = 1
        for b in range(groups[g], groups[g + 1]):
            longest = max(longest, starts[b + 1] - starts[b])
        w = np.empty(longest, dtype=np.uint64)
        tmp = np.empty(longest, dtype=np.uint64)
        count = np.empty(256, dtype=np.int64)
        for b in range(groups[g], groups[g + 1]):
            s, e = starts[b], starts[b + 1]
            if e - s == 0:
                continue
            order = _bucket_order(k_in, s, e, lowb, pbits, w, tmp, count)
            for j in range(e - s):
                p = s + np.int64(order[j] & pmask)
                k_out[s + j] = k_in[p]
                r_out[s + j] = r_in[p]
                v_out[s + j] = v_in[p]


def sort_records(
    keys: np.ndarray, key_space: int, rows: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``keys`` (unsigned, below ``key_space``) sorted stably, ``rows`` and ``values`` carried along:
    the arrays themselves, rewritten (one scratch copy of each, 2x their bytes at the peak).

    One pass counts the keys' top bits (about :data:`RECORD_BUCKET` records a bucket), one moves
    every record to its bucket in input order, and each bucket is then sorted in cache on the key's
    remaining bits (:func:`_bucket_order`) and written back. The sort of joined key-position words
    and gather of rows and values after it (:func:`stable_key_order`) read and wrote each record
    about three times as often, the gather at random. None where a bucket's positions and the key's
    low bits do not fit one word (then sort as :func:`stable_key_order` does).
    """
    n = keys.shape[0]
    kbits = max(1, (max(1, int(key_space)) - 1).bit_length())
    if n <= 1:
        return keys, rows, values
    bbits = min(kbits, RECORD_BUCKET_BITS, max(1, (n // RECORD_BUCKET).bit_length()))
    lowb = kbits - bbits
    nthreads = max(1, min(nb.get_num_threads(), n // 65536 or 1))
    hist = np.zeros((nthreads, 1 << bbits), dtype=np.int64)
    _record_hist(keys, lowb, nthreads, hist)
    totals = hist.sum(axis=0)
    pbits = max(1, (int(totals.max()) - 1).bit_length())
    if lowb + pbits > 64:
        return None
    starts = np.zeros((1 << bbits) + 1, dtype=np.int64)
    np.cumsum(totals, out=starts[1:])
    offsets = starts[None, :-1] + np.cumsum(hist, axis=0) - hist
    k_tmp, r_tmp, v_tmp = np.empty_like(keys), np.empty_like(rows), np.empty_like(values)
    _record_scatter(keys, rows, values, lowb, nthreads, offsets, k_tmp, r_tmp, v_tmp)
    # groups of buckets with about equal records per thread (heavy tails make buckets uneven)
    cuts = np.searchsorted(starts, np.linspace(0, n, max(2, 4 * nthreads) + 1)[1:-1], side="left")
    groups = np.unique(np.concatenate([[0], cuts.clip(0, 1 << bbits), [1 << bbits]])).astype(np.int64)
    _sort_buckets(k_tmp, r_tmp, v_tmp, starts, groups, lowb, pbits, keys, rows, values)
    return keys, rows, values
