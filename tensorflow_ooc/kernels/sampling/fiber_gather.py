"""Sampled MTTKRP: the mode-j fibers of sampled Khatri-Rao rows, gathered from BLCO work items.

The sketched least-squares solve of mode ``j`` (seed 000, section 3.3.3) keeps only the rows of
``mat(X, j)^T`` named by the sampled multi-indices ``s`` of the other modes: each is the fiber
``X[s_0, .., :, .., s_{N-1}]``. Its right-hand side is the *sampled MTTKRP*

    Mtilde[i, :] = sum_s  X[s with mode j = i] * Hw[s, :],    Hw[s] = weight_s * KRP row_s,

so fibers never need to be formed: every nonzero whose other coordinates equal a sample adds its
value times that sample's row into its mode-j row. Two ways to find those nonzeros:

- **scan** (streamed chunks, the hash join): a pass over the work items, each nonzero's other
  coordinates looked up in an open-addressing hash table of the sample keys. O(nnz) probes, but no
  factor rows are read, so a pass costs a fraction of an MTTKRP (two passes over a batch: count,
  then fill, so the matches land in a deterministic order).
- **index** (decoded partitions kept in memory): once per partition and mode, the nonzeros' keys
  sorted with their mode-j row and value (:class:`FiberIndex`); each sample then finds its fiber
  by a search (through every 64th key, samples in key order, :func:`_fenced_ranges`):
  O(S log nnz + fiber nonzeros) per solve at most, independent of the tensor's size.

Either way every output row sums its matches in one fixed order (sample by sample, each fiber in
order): the scan's matches are sorted by row stably and summed row by row (:func:`_rows_times`),
the index's runs added sample by sample, each thread into its own range of rows
(:func:`_scatter_runs`). Results are the same for any thread count.

A key is the mixed-radix number of a nonzero's coordinates in the other modes. When the product of
the other modes' lengths exceeds 2^63 the keys wrap (a hash); the scan then checks a hit's
coordinates against the sample's, and the index is not used (:func:`exact_keys`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba as nb
import numpy as np

from ...format import BitLayout
from ...format.bits import pext
from ...format.fiber_keys import exact_keys, key_space, key_strides, sample_keys
from ...format.radix_sort import sort_records, stable_key_order
from ..mttkrp.plan import WorkItems
from ..prefetch import prefetch_row

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)

# Every FENCE-th key of a FiberIndex is kept apart (1/64 of the keys: a search's first steps stay in
# the cache), and the key block a sample's run starts in is prefetched this many samples ahead.
FENCE = 64
_PREFETCH_SAMPLES = 8

# Matches per part of the index's scatter (each part reads every match's row, so parts pay only
# where they have many to add).
_PART_MATCHES = 1 << 16
# the parts' row cuts are counted over about this many samples' matches: counting all of them is
# a sequential pass over every match, and a subset balances the parts as well (docs/KERNELS.md)
_CUT_SAMPLES = 1 << 12
#: matches whose rows set the cuts, at most, where the output's rows are many
_CUT_MATCHES = 1 << 16
# the scatter asks for an output row this many matches ahead, where a row spans several lines
_SCATTER_AHEAD = 4
# the scatter asks for the first lines of the run this many samples ahead (each run starts at a
# random place of the index: nell2-shaped end cores, 1.7 M matches in 9-16 k runs, 7.2-9.2 ms ->
# 6.3-8.2 ms, one thread)
_RUNS_AHEAD = 4
_LINE_BYTES = 64


@dataclass
class SampleTable:
    """Open-addressing hash table (linear probing, load <= 1/2) of distinct sample keys.

    ``slot_key[h]`` / ``slot_id[h]``: the key and sample number stored in slot ``h`` (-1: empty)."""

    slot_key: np.ndarray  # uint64 (T,), T a power of two
    slot_id: np.ndarray  # int64 (T,)
    shift: int  # 64 - log2(T): a key's home slot is (key * mult) >> shift

    @classmethod
    def build(cls, keys: np.ndarray) -> SampleTable:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        bits = max(4, int(2 * max(1, keys.shape[0]) - 1).bit_length())
        slot_key = np.zeros(1 << bits, dtype=np.uint64)
        slot_id = np.full(1 << bits, -1, dtype=np.int64)
        _fill_table(keys, slot_key, slot_id, 64 - bits)
        return cls(slot_key, slot_id, 64 - bits)


@nb.njit(cache=True)
def _home(key, shift):
    return np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))


@nb.njit(cache=True)
def _fill_table(keys, slot_key, slot_id, shift):
    mask = slot_key.shape[0] - 1
    for s in range(keys.shape[0]):
        h = _home(keys[s], shift)
        while slot_id[h] >= 0:
            h = (h + 1) & mask
        slot_key[h] = keys[s]
        slot_id[h] = s


@nb.njit(nogil=True, cache=True)
def _probe(key, c, mode, verify, slot_key, slot_id, table_shift, sample_coords):
    """The sample whose key (and, with ``verify``, coordinates) a nonzero's match, or -1."""
    tmask = slot_key.shape[0] - 1
    h = _home(key, table_shift)
    while slot_id[h] >= 0:
        if slot_key[h] == key:
            sid = slot_id[h]
            if verify:
                for m in range(c.shape[0]):
                    if m != mode and c[m] != sample_coords[sid, m]:
                        sid = -1
            if sid >= 0:
                return sid
        h = (h + 1) & tmask
    return -1


@nb.njit(parallel=True, nogil=True, cache=True)
def scan_matches(
    index,
    values,
    item_start,
    item_end,
    item_base,
    item_prev,
    shift,
    mask,
    delta,
    mode,
    strides,
    verify,
    slot_key,
    slot_id,
    table_shift,
    sample_coords,
    offsets,
    m_row,
    m_sid,
    m_val,
):
    """Find the nonzeros of work items that lie in a sampled fiber, by hash lookup of their key.

    With ``offsets`` None-like (length 0) it only counts; else writes the matches of item ``k``
    to positions ``offsets[k] ..`` of ``m_row`` (mode-``mode`` index), ``m_sid`` (sample) and
    ``m_val`` (value), in the items' order: a deterministic list, whatever the thread count.

    Parameters
    ----------
    index, values, item_start, item_end, item_base, item_prev : the work items (see
        :class:`~tensorflow_ooc.kernels.mttkrp.plan.WorkItems`); with ``delta`` the index holds Delta
        differences of ALTO words, split into modes with ``pext`` by ``mask``, else BLCO fields
        ``(x >> shift[m]) & mask[m]``
    mode : int                   target mode j
    strides : uint64 (N,)        key strides (:func:`key_strides`)
    verify : bool                compare a hit's coordinates with ``sample_coords`` (wrapped keys)
    slot_key, slot_id, table_shift : the :class:`SampleTable`
    sample_coords : int64 (S, N) the samples' multi-indices
    offsets : int64 (K + 1,) or (0,)   first match position of each item (counting pass: empty)
    m_row, m_sid, m_val : outputs (filling pass)

    Returns int64 (K,): matches per item.
    """
    N = item_base.shape[1]
    K = item_start.shape[0]
    counts = np.zeros(K, dtype=np.int64)
    fill = offsets.shape[0] > 0
    for k in nb.prange(K):
        c = np.empty(N, dtype=np.int64)
        word = item_prev[k]
        pos = offsets[k] if fill else 0
        n = 0
        for i in range(item_start[k], item_end[k]):
            if delta:
                word += index[i]
                x = word
            else:
                x = index[i]
            key = np.uint64(0)
            for m in range(N):
                if delta:
                    c[m] = item_base[k, m] + np.int64(pext(x, mask[m]))
                else:
                    c[m] = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                key += np.uint64(c[m]) * strides[m]
            sid = _probe(key, c, mode, verify, slot_key, slot_id, table_shift, sample_coords)
            if sid >= 0:
                if fill:
                    m_row[pos + n] = c[mode]
                    m_sid[pos + n] = sid
                    m_val[pos + n] = values[i]
                n += 1
        counts[k] = n
    return counts


@nb.njit(nogil=True, cache=True)
def _lower_bound(keys, key, lo, hi):
    """The first ``i`` in ``lo .. hi - 1`` with ``keys[i] >= key`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@nb.njit(nogil=True, cache=True)
def _gallop(a, key, pos):
    """The first ``i >= pos`` with ``a[i] >= key`` (``len(a)`` if none) in the sorted ``a``, every
    entry before ``pos`` smaller than ``key``: doubling steps, then bisection inside the last (a
    search from a nearby position stays within a few cache lines)."""
    n = a.shape[0]
    step = 1
    while pos + step <= n and a[pos + step - 1] < key:
        step *= 2
    return _lower_bound(a, key, pos + step // 2, min(pos + step, n))


@nb.njit(nogil=True, cache=True)
def _run_at(keys, key, pos):
    """``(lo, hi)``: the run of ``key`` in the sorted ``keys``, searched from ``pos`` on (every key
    before ``pos`` is smaller; keys below 2^63, as exact keys are)."""
    lo = _gallop(keys, key, pos)
    return lo, _gallop(keys, key + np.uint64(1), lo)


@nb.njit(parallel=True, nogil=True, cache=True)
def _fiber_ranges(keys, skeys):
    """int64 (S + 1,) match offsets and (S,) first positions of each sample's run in ``keys``.

    Sample keys in strictly increasing order (the samplers' lexicographic order) are searched in blocks,
    each sample from the end of the one before: fibers of nearby samples lie close together in the
    index, so most searches stay within a few cache lines. Any other order: a bisection each."""
    S = skeys.shape[0]
    first = np.empty(S, dtype=np.int64)
    count = np.empty(S, dtype=np.int64)
    ordered = True
    for s in range(1, S):
        if skeys[s] <= skeys[s - 1]:
            ordered = False
            break
    block = 1024
    for blk in nb.prange((S + block - 1) // block):
        pos = 0
        for s in range(blk * block, min(S, (blk + 1) * block)):
            if ordered and s > blk * block:
                lo, hi = _run_at(keys, skeys[s], pos)
            else:
                lo = np.searchsorted(keys, skeys[s], side="left")
                hi = np.searchsorted(keys, skeys[s], side="right")
            first[s] = lo
            count[s] = hi - lo
            pos = hi
    offsets = np.zeros(S + 1, dtype=np.int64)
    for s in range(S):
        offsets[s + 1] = offsets[s] + count[s]
    return offsets, first


@nb.njit(parallel=True, nogil=True, cache=True)
def _fenced_ranges(keys, blocks, fence, skeys):
    """:func:`_fiber_ranges` through the fence ``fence = keys[::FENCE]`` (``blocks``: ``keys`` as rows
    of ``FENCE``, whole ones only): the same offsets and first positions.

    A sample's fence position (the fence is 1/64 of the keys, cached) names the one block of keys
    its run starts in; the positions of all samples come first, then each block is prefetched a
    few samples before it is searched, so the cache misses of consecutive samples overlap. The
    search from the previous sample took 12-17 ms for 50-60 k samples in nell2's 20 M keys, mostly
    waiting on memory; this way 6-8 ms. Unordered sample keys: :func:`_fiber_ranges`."""
    S = skeys.shape[0]
    n = keys.shape[0]
    for s in range(1, S):
        if skeys[s] <= skeys[s - 1]:
            return _fiber_ranges(keys, skeys)
    at = np.empty(S, dtype=np.int64)
    first = np.empty(S, dtype=np.int64)
    count = np.empty(S, dtype=np.int64)
    block = 1024
    nblk = (S + block - 1) // block
    for blk in nb.prange(nblk):
        pos = 0
        for s in range(blk * block, min(S, (blk + 1) * block)):
            pos = _gallop(fence, skeys[s], pos)
            at[s] = pos
    for blk in nb.prange(nblk):
        lo_s = blk * block
        hi_s = min(S, lo_s + block)
        for s in range(lo_s, min(hi_s, lo_s + _PREFETCH_SAMPLES)):
            if 0 < at[s] <= blocks.shape[0]:
                prefetch_row(blocks, at[s] - 1)
        for s in range(lo_s, hi_s):
            ahead = s + _PREFETCH_SAMPLES
            if ahead < hi_s and 0 < at[ahead] <= blocks.shape[0]:
                prefetch_row(blocks, at[ahead] - 1)
            key = skeys[s]
            # keys[(f - 1) FENCE] < key <= keys[f FENCE]: the run starts in between
            f = at[s]
            lo = _lower_bound(keys, key, max(0, (f - 1) * FENCE), min(n, f * FENCE + 1))
            first[s] = lo
            count[s] = _gallop(keys, key + np.uint64(1), lo) - lo
    offsets = np.zeros(S + 1, dtype=np.int64)
    for s in range(S):
        offsets[s + 1] = offsets[s] + count[s]
    return offsets, first


@nb.njit(nogil=True, cache=True)
def _row_cuts(rows, first, offsets, out_lo, nrows, parts, step=1):
    """``parts + 1`` output-row boundaries cutting the matches of a :class:`FiberIndex` lookup
    (sample ``s``'s at ``first[s] ..``, ``offsets`` their counts' prefix sums) into parts of about
    equal match counts, counted over every ``step``-th sample's matches (the cuts only balance the
    parts: a row's sum does not depend on its part). Where the output has many rows, the rows of
    at most :data:`_CUT_MATCHES` of those matches are sorted instead of counted into a histogram
    of every row (a gather in groups into a 4.8 M-row output spent 1.6 s of 6.5 in histograms)."""
    M = 0
    for s in range(0, first.shape[0], step):
        M += offsets[s + 1] - offsets[s]
    cut = np.full(parts + 1, nrows, dtype=np.int64)
    cut[0] = 0
    if nrows > 4 * _CUT_MATCHES:
        every = max(1, M // _CUT_MATCHES)
        got = np.empty(M // every + 1, dtype=np.int64)
        k = 0
        e_all = 0
        for s in range(0, first.shape[0], step):
            for e in range(first[s], first[s] + offsets[s + 1] - offsets[s]):
                if e_all % every == 0:
                    got[k] = rows[e] - out_lo
                    k += 1
                e_all += 1
        got = np.sort(got[:k])
        for c in range(1, parts):
            if k:
                cut[c] = got[(k * c) // parts]
        return cut
    hist = np.zeros(nrows, dtype=np.int64)
    for s in range(0, first.shape[0], step):
        for e in range(first[s], first[s] + offsets[s + 1] - offsets[s]):
            hist[rows[e] - out_lo] += 1
    c = 1
    acc = 0
    for i in range(nrows):
        acc += hist[i]
        while c < parts and acc * parts >= M * c:
            cut[c] = i + 1
            c += 1
    return cut


@nb.njit(parallel=True, nogil=True, cache=True)
def _scatter_runs(rows, vals, first, offsets, Hw, slot, out, out_lo, cut):
    """``out[rows[e] - out_lo] += vals[e] * Hw[slot[s]]`` for every match ``e`` of every sample ``s``
    (its run ``first[s] ..`` of ``offsets[s + 1] - offsets[s]`` index entries): samples in order,
    each fiber in index order, so every row's sum is that of one sequential loop.

    Part ``c`` (in parallel) adds into the output rows ``cut[c] .. cut[c + 1] - 1`` only, reading
    every match's row: which part a row falls in does not change its sum, so the result does not
    depend on the parts (the thread count). The counting sort by row this replaced (then a sum row
    by row, the same order and sums) took 3-5x as long, one thread: 4.3-4.5 M nell2-shaped matches
    at 4 columns, 100-140 ms against 22-24 ms; 1.2 M at 144 columns, 130-240 ms against 35-45 ms."""
    S = first.shape[0]
    R = out.shape[1]
    # rows of several cache lines are asked for a few matches ahead (the TT middle core's 64
    # columns, 1 M nell2-shaped matches: 19 -> 12 ms); a row of one line gains nothing
    ahead = _SCATTER_AHEAD if R * out.itemsize > _LINE_BYTES else 0
    # each run starts at a random place of the index: its first lines asked for a few runs ahead
    run_rows = rows.reshape((rows.shape[0], 1))
    run_vals = vals.reshape((vals.shape[0], 1))
    # rows addressed by unsigned offsets into the flat output: no negative-index wrap per match
    flat = out.reshape(-1)
    width = np.uint64(R)
    for c in nb.prange(cut.shape[0] - 1):
        lo = cut[c]
        hi = cut[c + 1]
        # one part holding every row (a gather on one thread): no row test per match (1.7 M
        # matches in 12 k runs into 28818 rows of 8 columns, one thread, load 6: 8.2-9.2 -> 7.3-8.6
        # ns a match; packed runs into a cached output 6.4 -> 3.8)
        whole = lo <= 0 and hi >= out.shape[0]
        for s in range(S):
            if s + _RUNS_AHEAD < S and first[s + _RUNS_AHEAD] < rows.shape[0]:
                prefetch_row(run_rows, first[s + _RUNS_AHEAD])
                prefetch_row(run_vals, first[s + _RUNS_AHEAD])
            n = offsets[s + 1] - offsets[s]
            if n == 0:
                continue
            h = Hw[slot[s]]
            end = first[s] + n
            for e in range(first[s], end):
                if ahead and e + ahead < end:
                    prefetch_row(out, rows[e + ahead] - out_lo)
                i = rows[e] - out_lo
                if whole or (i >= lo and i < hi):
                    v = vals[e]
                    base = np.uint64(i) * width
                    for r in range(R):
                        flat[base + np.uint64(r)] += v * h[r]


@nb.njit(parallel=True, nogil=True, cache=True)
def _rows_times(start, sid, val, Hw, out):
    """``out[i] += sum val[p] * Hw[sid[p]]`` over ``p`` in ``start[i] .. start[i + 1] - 1``, each
    row by one thread in that order."""
    R = out.shape[1]
    for i in nb.prange(out.shape[0]):
        for p in range(start[i], start[i + 1]):
            v = val[p]
            h = Hw[sid[p]]
            for r in range(R):
                out[i, r] += v * h[r]


@nb.njit(nogil=True, cache=True)
def _row_sorted_matches(m_row, m_sid, m_val, out_lo, nrows):
    """A match list sorted by its mode-``j`` row, stably (a sequential counting sort): ``(start,
    sid, val)`` as :func:`_row_sorted_runs` gives them, each row's matches in list order.

    Parameters
    ----------
    m_row : int64 (M,)      mode-j index of each match (inside ``out_lo .. out_lo + nrows - 1``)
    m_sid : int64 (M,)      its sample
    m_val : float (M,)      its value
    """
    M = m_row.shape[0]
    start = np.zeros(nrows + 1, dtype=np.int64)
    for e in range(M):
        start[m_row[e] - out_lo + 1] += 1
    for i in range(nrows):
        start[i + 1] += start[i]
    sid = np.empty(M, dtype=np.int64)
    val = np.empty(M, dtype=m_val.dtype)
    nxt = start[:-1].copy()
    for e in range(M):
        i = m_row[e] - out_lo
        sid[nxt[i]] = m_sid[e]
        val[nxt[i]] = m_val[e]
        nxt[i] += 1
    return start, sid, val


@nb.njit(parallel=True, nogil=True, cache=True)
def _index_entries(index, values, item_start, item_end, item_base, shift, mask, mode, strides, keys, rows, vals):
    """Key, mode-``mode`` row and value of every nonzero of (non-delta) work items, in place."""
    N = item_base.shape[1]
    for k in nb.prange(item_start.shape[0]):
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            key = np.uint64(0)
            for m in range(N):
                c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                if m == mode:
                    rows[i] = c
                else:
                    key += np.uint64(c) * strides[m]
            keys[i] = key
            vals[i] = values[i]


@dataclass
class FiberIndex:
    """A partition's nonzeros sorted by their key in the modes other than ``mode``: the fiber of a
    sampled multi-index is one contiguous run, found by binary search. 24 bytes a nonzero, 16 where
    keys fit 32 bits (:func:`index_key_dtype`) and rows 31 (float64 values)."""

    mode: int
    keys: np.ndarray  # uint32 or uint64 (nnz,), sorted
    rows: np.ndarray  # int32 or int64 (nnz,): the nonzero's index in ``mode``
    vals: np.ndarray  # (nnz,) values
    # every FENCE-th key (:func:`_fenced_ranges`), or None (searched without)
    fence: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        fence = 0 if self.fence is None else self.fence.nbytes
        return int(self.keys.nbytes + self.rows.nbytes + self.vals.nbytes + fence)

    def ranges(self, skeys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The runs of the sample keys ``skeys``: int64 (S + 1,) match offsets and (S,) first
        positions in ``keys`` (:func:`_fiber_ranges`)."""
        if self.fence is not None and self.keys.shape[0] >= FENCE:
            blocks = self.keys[: self.keys.shape[0] // FENCE * FENCE].reshape(-1, FENCE)
            return _fenced_ranges(self.keys, blocks, self.fence, skeys)
        return _fiber_ranges(self.keys, skeys)

    @classmethod
    def build(cls, items: WorkItems, layout: BitLayout, mode: int) -> FiberIndex:
        """Index decoded (non-delta) work items for ``mode``; needs :func:`exact_keys`."""
        if items.delta:
            raise ValueError("a fiber index is built from decoded partitions, not Delta-encoded batches")
        if not exact_keys(layout.shape, mode):
            raise ValueError(f"mode {mode}: the other modes' index space exceeds 63 bits; use the scan")
        nnz = items.index.shape[0]
        space = key_space(layout.shape, mode)
        keys = np.zeros(nnz, dtype=index_key_dtype(space))
        rows = np.zeros(nnz, dtype=index_row_dtype(layout.shape[mode]))
        vals = np.zeros(nnz, dtype=items.values.dtype)
        _index_entries(
            items.index,
            items.values,
            items.start,
            items.end,
            items.base,
            layout.field_shift,
            layout.field_mask,
            mode,
            key_strides(layout.shape, mode),
            keys,
            rows,
            vals,
        )
        if sort_records(keys, space, rows, vals) is None:  # keys and bucket positions over 64 bits
            order, keys = stable_key_order(keys.astype(np.uint64), space)
            _gather_pair(rows, vals, order)
        return cls(mode, keys, rows, vals, np.ascontiguousarray(keys[::FENCE]))


def index_key_dtype(space: int) -> type:
    """The narrowest unsigned integer that holds keys below ``space``: uint32 up to 2^32 cells of the
    other modes (nell2-shaped: 1.1-3.5e8), else uint64. Narrow keys halve the bytes a fiber search
    and the index's sort read."""
    return np.uint32 if space <= 1 << 32 else np.uint64


def index_row_dtype(length: int) -> type:
    """The integer a :class:`FiberIndex` keeps its mode rows in: int32 up to 2^31 rows, else int64."""
    return np.int32 if int(length) <= 1 << 31 else np.int64


def fiber_index_bytes(shape: tuple[int, ...], mode: int, nnz: int, value_itemsize: int) -> int:
    """Bytes the mode-``mode`` :class:`FiberIndex` of ``nnz`` nonzeros holds (keys, rows, values and
    fence, as :meth:`FiberIndex.build` makes them): 16 a nonzero where keys fit 32 bits and rows 31
    (float64 values), up to 24; 0 where the keys wrap (no index is built, the gather scans)."""
    if not exact_keys(shape, mode):
        return 0
    key = np.dtype(index_key_dtype(key_space(shape, mode))).itemsize
    row = np.dtype(index_row_dtype(shape[mode])).itemsize
    nnz = int(nnz)
    return nnz * (key + row + int(value_itemsize)) + -(-nnz // FENCE) * key


@nb.njit(parallel=True, nogil=True, cache=True)
def _gather_pair(a, b, order):
    """``a[:] = a[order]; b[:] = b[order]`` (one parallel pass, through copies)."""
    a0 = a.copy()
    b0 = b.copy()
    for i in nb.prange(order.shape[0]):
        a[i] = a0[order[i]]
        b[i] = b0[order[i]]


def sampled_mttkrp_items(
    items: WorkItems,
    layout: BitLayout,
    mode: int,
    coords: np.ndarray,
    Hw: np.ndarray | Callable[[np.ndarray], np.ndarray],
    out: np.ndarray,
    out_lo: int = 0,
    table: SampleTable | None = None,
    index: FiberIndex | None = None,
) -> None:
    """Add the sampled MTTKRP of ``items`` for samples ``coords`` (S, N) with weighted rows ``Hw``
    (S, R) into ``out`` (rows ``out_lo ..`` of mode ``mode``): through ``index`` when given (it must
    be for ``mode``), else by scanning with the hash ``table`` of the samples' keys (built here when
    not given). ``coords`` must be valid indices (the samplers draw them from the factors' rows).

    ``Hw`` may instead be a function that returns the weighted rows of the samples it is given
    (sorted distinct int64 sample numbers, e.g.
    :meth:`~tensorflow_ooc.kernels.sampling.krp_sampler.SampleSet.weighted_rows`): it is then asked
    only for the samples whose fibers meet a nonzero here. On a sparse tensor many sampled fibers
    are empty (of 65536 TT draws on the nell2-shaped tensor, 11-33 k distinct fibers hold nonzeros
    after a sweep, 3 k at random cores), and forming every weighted row at 144 columns took 19 ms.
    The sums are the same either way."""
    R = out.shape[1]
    rows_of = Hw if callable(Hw) else None
    if rows_of is None:
        if Hw.shape != (coords.shape[0], R):
            raise ValueError(f"Hw must be (samples, R) = {(coords.shape[0], R)}, got {Hw.shape}")
        Hw = np.ascontiguousarray(Hw, dtype=out.dtype)
    if coords.shape[0] == 0 or items.nitems == 0:
        return
    if index is not None:
        if index.mode != mode:
            raise ValueError(f"the fiber index is for mode {index.mode}, not {mode}")
        index_gather(index, sample_keys(coords, layout.shape, mode), Hw, out, out_lo)
        return
    if table is None:
        table = SampleTable.build(sample_keys(coords, layout.shape, mode))
    coords = np.ascontiguousarray(coords, dtype=np.int64)
    args = (
        *items.kernel_args(layout),
        items.delta,
        mode,
        key_strides(layout.shape, mode),
        not exact_keys(layout.shape, mode),
        table.slot_key,
        table.slot_id,
        table.shift,
        coords,
    )
    empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=items.values.dtype)
    counts = scan_matches(*args, np.zeros(0, dtype=np.int64), empty_i, empty_i, empty_f)
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    m_row, m_sid, m_val = _match_buffers(int(offsets[-1]), items.values.dtype)
    scan_matches(*args, offsets, m_row, m_sid, m_val)
    start, sid, val = _row_sorted_matches(m_row, m_sid, m_val, out_lo, out.shape[0])
    if rows_of is not None:  # the rows of the matched samples only
        used, sid = _compact_ids(sid, coords.shape[0])
        Hw = _asked_rows(rows_of, used, out)
    # each row summed by one thread in its sorted order: the same sums for any thread count
    _rows_times(start, sid, val, Hw, out)


def _asked_rows(rows_of: Callable[[np.ndarray], np.ndarray], used: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The weighted rows of the samples ``used`` from ``rows_of``, as ``out``'s dtype (checked)."""
    Hw = np.ascontiguousarray(rows_of(used), dtype=out.dtype)
    if Hw.shape != (used.shape[0], out.shape[1]):
        raise ValueError(f"Hw gave rows of shape {Hw.shape} for {used.shape[0]} samples; R = {out.shape[1]}")
    return Hw


@nb.njit(nogil=True, cache=True)
def assign_row_slots(rows, first, offsets, slot_of, hit, n, local):
    """Give every row the runs' matches hit a slot of a compact output, in order of first hit.

    Parameters
    ----------
    rows : int (E,)          mode row of each index entry
    first, offsets : int64   the runs of :meth:`FiberIndex.ranges`
    slot_of : int (nrows,)   each row's slot, -1 where none yet; updated
    hit : int64 (cap,)       the row of each slot; slots ``n ..`` written
    n : int                  slots given so far (by earlier groups of the same output)
    local : int64 (E,)       ``local[e]``: the slot of ``rows[e]`` for every matched entry ``e``

    Returns the slots given in all, and False where the matches hit more rows than ``hit`` holds
    (it is then full, and ``local`` incomplete). Groups of one gather share ``slot_of`` and
    ``hit``, so their sums land in one output of the rows hit only, whatever the span of rows
    between them."""
    cap = hit.shape[0]
    for s in range(first.shape[0]):
        for e in range(first[s], first[s] + offsets[s + 1] - offsets[s]):
            r = rows[e]
            k = slot_of[r]
            if k < 0:
                if n == cap:
                    return n, False
                k = n
                slot_of[r] = n
                hit[n] = r
                n += 1
            local[e] = k
    return n, True


def index_gather(
    index: FiberIndex,
    skeys: np.ndarray,
    Hw: np.ndarray | Callable[[np.ndarray], np.ndarray],
    out: np.ndarray,
    out_lo: int,
    runs: tuple[np.ndarray, np.ndarray] | None = None,
    out_rows: np.ndarray | None = None,
) -> None:
    """The index path of :func:`sampled_mttkrp_items`: each sample's fiber found by its key
    ``skeys[s]`` and added in (:func:`_scatter_runs`); a callable ``Hw`` is asked for the rows of
    the samples whose fibers hold nonzeros only. ``runs``: the keys' ``(offsets, first)`` from
    :meth:`FiberIndex.ranges` where the caller has them. ``out_rows``: each entry's row of ``out``
    in place of the index's rows (the ``local`` of :func:`assign_row_slots`: ``out`` then holds
    the hit rows only, with ``out_lo`` 0)."""
    rows = index.rows if out_rows is None else out_rows
    offsets, first = index.ranges(skeys) if runs is None else runs
    if callable(Hw):
        used = np.flatnonzero(offsets[1:] > offsets[:-1])
        Hw = _asked_rows(Hw, used, out)
        slot = np.zeros(skeys.shape[0], dtype=np.int64)
        slot[used] = np.arange(used.shape[0])
    else:
        slot = np.arange(skeys.shape[0], dtype=np.int64)
    # every part reads every match: parts only where each has many to add (and no more than threads)
    parts = max(1, min(nb.get_num_threads(), int(offsets[-1]) // _PART_MATCHES))
    cut = np.array([0, out.shape[0]], dtype=np.int64)
    if parts > 1:
        step = max(1, skeys.shape[0] // _CUT_SAMPLES)
        cut = _row_cuts(rows, first, offsets, out_lo, out.shape[0], parts, step)
    _scatter_runs(rows, index.vals, first, offsets, Hw, slot, out, out_lo, cut)


@nb.njit(nogil=True, cache=True)
def _compact_ids(sid, S):
    """The distinct sample numbers in ``sid`` (sorted) and ``sid`` as positions among them."""
    seen = np.zeros(S, dtype=np.bool_)
    for e in range(sid.shape[0]):
        seen[sid[e]] = True
    pos = np.empty(S, dtype=np.int64)
    n = 0
    for s in range(S):
        pos[s] = n
        n += seen[s]
    used = np.empty(n, dtype=np.int64)
    for s in range(S):
        if seen[s]:
            used[pos[s]] = s
    out = np.empty_like(sid)
    for e in range(sid.shape[0]):
        out[e] = pos[sid[e]]
    return used, out


def _match_buffers(n: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=dtype)
