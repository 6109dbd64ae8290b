"""Numba kernels of the planted Poisson generator: guide tables, guided inverse-CDF draws, and
counting repeats among sorted ALTO words (one cell's events become one nonzero and its count)."""

from __future__ import annotations

import numba as nb
import numpy as np

#: entries of a factor column per guide-table bucket (a draw scans about this many after its lookup)
GUIDE_SPAN = 4


@nb.njit(nogil=True, cache=True)
def _build_guide(cdf, out):
    """``out[j]`` = the first ``i`` with ``cdf[i] > j * total / G`` (G = len(out), total = cdf[-1]):
    where the inverse CDF of ``u`` in bucket j starts its search. One linear walk."""
    G = out.shape[0]
    total = cdf[cdf.shape[0] - 1]
    i = 0
    last = cdf.shape[0] - 1
    for j in range(G):
        t = j * total / G
        while i < last and cdf[i] <= t:
            i += 1
        out[j] = i


def guide_table(cdf: np.ndarray) -> np.ndarray:
    """Guide tables (rows, ceil(L / GUIDE_SPAN)) of cumulative columns ``cdf`` (rows, L)."""
    rows, L = cdf.shape
    G = max(1, -(-L // GUIDE_SPAN))
    out = np.empty((rows, G), dtype=np.int32 if L < 2**31 else np.int64)
    for r in range(rows):
        _build_guide(cdf[r], out[r])
    return out


@nb.njit(inline="always")
def _guided_one(cdf, guide, x, first, last):
    """The first ``i`` with ``cdf[i] > x`` (the inverse CDF at ``x``), clipped to [first, last]:
    the guide table gives a start at most a bucket below, then a short forward scan."""
    G = guide.shape[0]
    j = min(np.int64(x / cdf[cdf.shape[0] - 1] * G), G - 1)
    i = np.int64(guide[max(j, 0)])
    while i > 0 and cdf[i - 1] > x:  # rounding put x in the bucket above
        i -= 1
    while i < last and cdf[i] <= x:
        i += 1
    return min(max(i, first), last)


@nb.njit(parallel=True, nogil=True, cache=True)
def _guided_draws_parallel(cdf, guide, u, first, last, out):
    for k in nb.prange(u.shape[0]):
        out[k] = _guided_one(cdf, guide, u[k], first, last)


@nb.njit(nogil=True, cache=True)
def _guided_draws_serial(cdf, guide, u, first, last, out):
    for k in range(u.shape[0]):
        out[k] = _guided_one(cdf, guide, u[k], first, last)


#: draws below this many run on one thread (a parallel launch costs more than they do)
PARALLEL_DRAWS = 1 << 16


def guided_draws(cdf: np.ndarray, guide: np.ndarray, u: np.ndarray, first: int, last: int, out: np.ndarray) -> None:
    """``out[k]`` = the inverse CDF of cumulative column ``cdf`` at ``u[k]`` (see :func:`guide_table`),
    clipped to [first, last]."""
    (_guided_draws_parallel if u.shape[0] >= PARALLEL_DRAWS else _guided_draws_serial)(cdf, guide, u, first, last, out)


@nb.njit(nogil=True, cache=True)
def _count_sorted(keys, counts):
    """Compact sorted keys (nwords, n) in place to their distinct values; ``counts`` (n,) receives
    how often each occurred. Returns how many there are."""
    nwords, n = keys.shape
    if n == 0:
        return 0
    out = 0
    counts[0] = 1
    for i in range(1, n):
        same = True
        for w in range(nwords):
            if keys[w, i] != keys[w, out]:
                same = False
                break
        if same:
            counts[out] += 1
            continue
        out += 1
        for w in range(nwords):
            keys[w, out] = keys[w, i]
        counts[out] = 1
    return out + 1


@nb.njit(nogil=True, cache=True)
def _merge_counts(a, ca, b, cb):
    """Union of two sorted, distinct key arrays (nwords, n) with their counts; a key in both gets
    the sum of its counts."""
    nwords = a.shape[0]
    out = np.empty((nwords, a.shape[1] + b.shape[1]), dtype=a.dtype)
    cout = np.empty(a.shape[1] + b.shape[1], dtype=ca.dtype)
    i = j = k = 0
    while i < a.shape[1] or j < b.shape[1]:
        if j == b.shape[1]:
            cmp = -1
        elif i == a.shape[1]:
            cmp = 1
        else:
            cmp = 0
            for w in range(nwords - 1, -1, -1):
                if a[w, i] != b[w, j]:
                    cmp = -1 if a[w, i] < b[w, j] else 1
                    break
        if cmp <= 0:
            for w in range(nwords):
                out[w, k] = a[w, i]
            cout[k] = ca[i]
            if cmp == 0:
                cout[k] += cb[j]
                j += 1
            i += 1
        else:
            for w in range(nwords):
                out[w, k] = b[w, j]
            cout[k] = cb[j]
            j += 1
        k += 1
    return out[:, :k], cout[:k]
