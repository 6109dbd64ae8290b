"""Parallel k-way merge of sorted runs of ALTO words (with optional values).

Sources that deliver sorted runs (the synthetic generator sorts each batch to make it distinct)
need a merge, not a sort: a merge moves each nonzero once, a radix sort of 65-bit keys seven
times. The output is split into parts by splitter keys sampled from every run; each part is a
k-way heap merge on its own thread, so the result does not depend on the thread count. Equal keys
come out in run order (a stable merge), which the ``"last"`` duplicate policy relies on.
"""

from __future__ import annotations

import numba as nb
import numpy as np

SAMPLES_PER_RUN = 64


@nb.njit(inline="always")
def _less(keys, a, ra, b, rb):
    """Key at column a (run ra) before key at column b (run rb): words high to low, then run."""
    for w in range(keys.shape[0] - 1, -1, -1):
        if keys[w, a] != keys[w, b]:
            return keys[w, a] < keys[w, b]
    return ra < rb


@nb.njit(nogil=True, cache=True)
def _lower_bound(keys, lo, hi, split, w_split):
    """First column in [lo, hi) whose key is >= the splitter key ``split`` (nwords,)."""
    nwords = keys.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        less = False
        for w in range(nwords - 1, -1, -1):
            if keys[w, mid] != split[w, w_split]:
                less = keys[w, mid] < split[w, w_split]
                break
        if less:
            lo = mid + 1
        else:
            hi = mid
    return lo


@nb.njit(nogil=True, cache=True)
def _sift_down(keys, heap, pos, size, i):
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        best = left
        right = left + 1
        if right < size and _less(keys, pos[heap[right]], heap[right], pos[heap[left]], heap[left]):
            best = right
        if _less(keys, pos[heap[best]], heap[best], pos[heap[i]], heap[i]):
            heap[i], heap[best] = heap[best], heap[i]
            i = best
        else:
            return


_DONE = np.uint64(0xFFFFFFFFFFFFFFFF)


@nb.njit(inline="always")
def _beats(h1, h0, a, b):
    """Run a's head comes before run b's: key words, then run index. An exhausted run's head is
    (max, max), which no key of at most two words with fewer than 128 bits reaches."""
    if h1[a] != h1[b]:
        return h1[a] < h1[b]
    if h0[a] != h0[b]:
        return h0[a] < h0[b]
    return a < b


@nb.njit(nogil=True, cache=True)
def _merge_two_word(keys, values, has_values, pos, end, o, keys_out, values_out):
    """Loser-tree merge of runs whose keys have one or two words, head keys cached per run:
    one comparison per tree level and output nonzero, instead of a heap's two."""
    nruns = pos.shape[0]
    two = keys.shape[0] == 2
    size = 1
    while size < nruns:
        size *= 2
    h0 = np.full(size, _DONE, dtype=np.uint64)
    h1 = np.full(size, _DONE, dtype=np.uint64)
    for r in range(nruns):
        if pos[r] < end[r]:
            h0[r] = keys[0, pos[r]]
            h1[r] = keys[1, pos[r]] if two else 0
    # tree[i] holds the loser of the match at node i; winners climb (built bottom-up)
    tree = np.empty(size, dtype=np.int64)
    winner = np.empty(2 * size, dtype=np.int64)
    for r in range(size):
        winner[size + r] = r
    for i in range(size - 1, 0, -1):
        a, b = winner[2 * i], winner[2 * i + 1]
        if _beats(h1, h0, a, b):
            winner[i], tree[i] = a, b
        else:
            winner[i], tree[i] = b, a
    w = winner[1] if size > 1 else 0
    while h1[w] != _DONE:
        c = pos[w]
        keys_out[0, o] = h0[w]
        if two:
            keys_out[1, o] = h1[w]
        if has_values:
            values_out[o] = values[c]
        o += 1
        c += 1
        pos[w] = c
        if c < end[w]:
            h0[w] = keys[0, c]
            h1[w] = keys[1, c] if two else 0
        else:
            h0[w] = _DONE
            h1[w] = _DONE
        node = (w + size) >> 1
        while node >= 1:
            t = tree[node]
            if _beats(h1, h0, t, w):
                tree[node] = w
                w = t
            node >>= 1
    return o


@nb.njit(parallel=True, nogil=True, cache=True)
def _merge_parts(keys, values, has_values, cuts, out_start, keys_out, values_out, sentinel_ok):
    """cuts[p, r]: first column of run r in part p (cuts[P, r] = end of run r)."""
    nparts = cuts.shape[0] - 1
    nruns = cuts.shape[1]
    nwords = keys.shape[0]
    for p in nb.prange(nparts):
        pos = cuts[p].copy()
        end = cuts[p + 1].copy()
        if nwords == 1 or (nwords == 2 and sentinel_ok):
            _merge_two_word(keys, values, has_values, pos, end, out_start[p], keys_out, values_out)
            continue
        heap = np.empty(nruns, dtype=np.int64)
        size = 0
        for r in range(nruns):
            if pos[r] < end[r]:
                heap[size] = r
                size += 1
        for i in range(size // 2 - 1, -1, -1):
            _sift_down(keys, heap, pos, size, i)
        o = out_start[p]
        while size > 0:
            r = heap[0]
            c = pos[r]
            for w in range(nwords):
                keys_out[w, o] = keys[w, c]
            if has_values:
                values_out[o] = values[c]
            o += 1
            pos[r] = c + 1
            if pos[r] == end[r]:
                size -= 1
                heap[0] = heap[size]
            _sift_down(keys, heap, pos, size, 0)


@nb.njit(parallel=True, nogil=True, cache=True)
def _cut_runs(keys, bounds, splits, cuts):
    nruns = bounds.shape[0] - 1
    nsplit = splits.shape[1]
    for r in nb.prange(nruns):
        cuts[0, r] = bounds[r]
        cuts[nsplit + 1, r] = bounds[r + 1]
        lo = bounds[r]
        for s in range(nsplit):
            lo = _lower_bound(keys, lo, bounds[r + 1], splits, s)
            cuts[s + 1, r] = lo


def merge_runs(
    keys: np.ndarray, bounds: np.ndarray, values: np.ndarray | None = None, parts: int | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Merge sorted runs into one sorted sequence.

    Parameters
    ----------
    keys : uint64 array (nwords, n)
        The runs side by side; run r is ``keys[:, bounds[r]:bounds[r + 1]]``, sorted ascending.
    bounds : int64 array (nruns + 1,)
        Run boundaries, ``bounds[0] = 0`` and ``bounds[-1] = n``.
    values : array (n,), optional
        Carried along with the keys.
    parts : int, optional
        Independent pieces of the output (default: 4 per numba thread, for load balance).

    Returns
    -------
    (keys, values) merged; equal keys keep run order. ``values`` is None when none were given.

    Examples
    --------
    >>> k = np.array([[1, 4, 9, 2, 3, 10]], dtype=np.uint64)
    >>> merge_runs(k, np.array([0, 3, 6]))[0].tolist()
    [[1, 2, 3, 4, 9, 10]]
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    n = keys.shape[1]
    if bounds[0] != 0 or bounds[-1] != n or (np.diff(bounds) < 0).any():
        raise ValueError(f"run bounds must rise from 0 to {n}, got {bounds.tolist()}")
    nruns = bounds.shape[0] - 1
    has_values = values is not None
    vals = values if has_values else np.empty(0, dtype=np.float64)
    if nruns <= 1 or n <= 1:
        return keys, values
    if parts is None:
        parts = 4 * nb.get_num_threads() if n >= (1 << 16) else 1
    # splitters: keys sampled evenly from every run, weighted by run length, at equal mass
    lengths = np.diff(bounds)
    sample_cols, weights = [], []
    for r in range(nruns):
        if lengths[r]:
            cnt = min(SAMPLES_PER_RUN, int(lengths[r]))
            cols = bounds[r] + (np.arange(1, cnt + 1) * lengths[r]) // (cnt + 1)
            sample_cols.append(cols)
            weights.append(np.full(cnt, lengths[r] / cnt))
    cols = np.concatenate(sample_cols)
    w = np.concatenate(weights)
    order = np.lexsort(keys[:, cols])  # last row (highest word) is the primary key
    cum = np.cumsum(w[order])
    picks = np.searchsorted(cum, np.arange(1, parts) * (n / parts))
    picks = np.unique(picks[picks < cols.shape[0]])
    splits = np.ascontiguousarray(keys[:, cols[order[picks]]])
    if splits.shape[1]:
        # identical splitters would make empty parts; keep distinct ones
        keep = np.ones(splits.shape[1], dtype=bool)
        keep[1:] = (splits[:, 1:] != splits[:, :-1]).any(axis=0)
        splits = np.ascontiguousarray(splits[:, keep])
    cuts = np.empty((splits.shape[1] + 2, nruns), dtype=np.int64)
    _cut_runs(keys, bounds, splits, cuts)
    sizes = (cuts[1:] - cuts[:-1]).sum(axis=1)
    out_start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    keys_out = np.empty_like(keys)
    values_out = np.empty_like(vals) if has_values else vals
    # the loser tree marks exhausted runs with the all-ones key in the top word
    sentinel_ok = keys.shape[0] == 1 or (keys.shape[0] == 2 and int(keys[1].max()) != int(_DONE))
    _merge_parts(keys, vals, has_values, cuts, out_start, keys_out, values_out, sentinel_ok)
    return keys_out, (values_out if has_values else None)
