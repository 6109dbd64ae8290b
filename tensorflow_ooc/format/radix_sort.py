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
