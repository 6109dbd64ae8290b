"""Synthetic sparse tensors: heavy-tailed supports shaped like real data, and planted low-rank CP.

Real tensors have a few huge slices and many tiny ones. Each mode's index is drawn from a power
law over a random permutation of the mode (rank ``r = floor(L * u**skew)``, ``u`` uniform), so
slice sizes are heavy tailed and popular indices are scattered over the mode, not packed at 0.
Generation streams in batches with no duplicate coordinates across batches: batch k owns a
disjoint range of ranks of the longest mode, so 10^9 nonzeros need only one batch in memory.

Every random number is a hash of (seed, batch, draw number), so draws run in parallel (numba
threads) and the tensor is the same for a seed whatever the thread count. Draws become ALTO words
at once; a batch is made distinct by sorting them, so batches come out in ALTO order, and
values are a hash of the cell, so a cell's value does not depend on the batch it falls in.

Examples
--------
>>> from tensorflow_ooc import synthetic
>>> coords, values = synthetic.heavy_tailed((50, 40, 30), 1000, seed=0)
>>> coords.shape, values.shape
((1000, 3), (1000,))
"""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numba as nb
import numpy as np

from .format.bits import pdep

if TYPE_CHECKING:
    from .format import BitLayout

PRESETS: dict[str, tuple[tuple[int, ...], int]] = {
    "uber": ((183, 24, 1140, 1717), 3_309_490),
    "nips": ((2482, 2862, 14036, 17), 3_101_609),
    "chicago": ((6186, 24, 77, 32), 5_330_673),
    "nell2": ((12092, 9184, 28818), 20_000_000),
    "vast": ((165427, 11374, 2), 26_021_854),
    "hypersparse": ((10_000_000, 100_000, 1000), 5_000_000),
    # FROSTT amazon-reviews (user x item x word): 65 index bits, so stores need block keys
    "amazon": ((4_821_207, 1_774_269, 1_805_187), 1_741_809_018),
}

VALUE_KINDS = ("uniform", "count", "normal")
DEFAULT_BATCH_NNZ = 1 << 22
MAX_AUTO_BATCH_NNZ = 1 << 23


def default_batch_nnz(nnz: int) -> int:
    """Batch size when none is given: nnz / 16 within [2**22, 2**23], a function of nnz alone (the
    tensor must not depend on memory settings). Each batch is a sorted run that conversion merges,
    and a merge costs one comparison per level of log2(runs); 8 M-nonzero batches hold about
    330 MB of working memory while they are drawn and sorted."""
    return int(min(MAX_AUTO_BATCH_NNZ, max(DEFAULT_BATCH_NNZ, -(-int(nnz) // 16))))


def _as_skews(skew: float | Sequence[float], nmodes: int) -> np.ndarray:
    s = np.full(nmodes, float(skew)) if np.isscalar(skew) else np.asarray(skew, dtype=np.float64)
    if s.shape != (nmodes,) or (s < 1).any():
        raise ValueError(f"skew must be >= 1 (1 = uniform), one value or one per mode; got {skew!r}")
    return s


def _coprime_multiplier(length: int, rng: np.random.Generator) -> tuple[int, int]:
    """(a, b) so that r -> (a*r + b) mod length is a permutation of range(length)."""
    if length <= 1:
        return 1, 0
    while True:
        a = int(rng.integers(1, length))
        if math.gcd(a, length) == 1:
            return a, int(rng.integers(0, length))


def _sample_ranks(rng, length: int, skew: float, n: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Power-law ranks in [lo, hi): P(rank < r) = (r / length) ** (1 / skew)."""
    hi = length if hi is None else hi
    u_lo, u_hi = (lo / length) ** (1 / skew), (hi / length) ** (1 / skew)
    u = rng.uniform(u_lo, u_hi, n)
    r = np.floor(length * u ** skew).astype(np.int64)
    return np.clip(r, lo, hi - 1)


# --- counter-based random numbers ---------------------------------------------------------------
# Every random number of the heavy-tailed generator is a hash of (stream, counter): the i-th draw
# of a batch is the same whichever thread computes it, so the tensor does not depend on the
# thread count, and the draw parallelises with no shared generator state (SplitMix64 output).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TWO53 = 1.0 / 9007199254740992.0


@nb.njit(inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always")
def _unit(h):
    """A uniform float in [0, 1) from the top 53 bits of a hash."""
    return np.float64(h >> np.uint64(11)) * _TWO53


@nb.njit(inline="always")
def _permute_one(r, a, b, length, inv_length):
    """(a * r + b) mod L for a, b, r < L."""
    if length <= np.uint64(1) << np.uint64(32):
        # a*r + b < 2**64: take the quotient from a float estimate (off by at most a few) and fix
        # the remainder up; a hardware 64-bit division costs several times more
        x = a * r + b
        q = np.uint64(np.float64(x) * inv_length)
        rem = np.int64(x - q * length)
        L = np.int64(length)
        while rem < 0:
            rem += L
        while rem >= L:
            rem -= L
        return np.uint64(rem)
    # longer modes (up to 2**63 - 1): double-and-add, so nothing overflows
    acc = np.uint64(0)
    x = a
    while r > np.uint64(0):
        if r & np.uint64(1):
            acc = (acc + x) % length
        x = (x + x) % length
        r >>= np.uint64(1)
    return (acc + b) % length


@nb.njit(nogil=True, cache=True)
def _permute_ranks(ranks, perm_a, perm_b, lengths):
    """Coordinates of rank tuples (n, nmodes), in place: each mode's permutation."""
    for i in range(ranks.shape[0]):
        for n in range(ranks.shape[1]):
            L = np.uint64(lengths[n])
            ranks[i, n] = np.int64(_permute_one(np.uint64(ranks[i, n]), perm_a[n], perm_b[n], L, 1.0 / np.float64(L)))


INV_CDF_KNOTS = 1 << 14


def _inverse_cdf_table(length: int, skew: float) -> np.ndarray:
    """L * q**skew at q = k / K, k = 0..K: the rank distribution's inverse CDF at K + 1 knots."""
    return float(length) * (np.arange(INV_CDF_KNOTS + 1) / INV_CDF_KNOTS) ** float(skew)


@nb.njit(inline="always")
def _draw_coord(stream, ctr, length, table, u_lo, u_hi, r_lo, r_hi, a, b):
    """One coordinate: a power-law rank in [r_lo, r_hi), P(rank < r) = (r / L) ** (1 / skew),
    mapped through the mode's permutation. The inverse CDF ``L * u**skew`` is interpolated
    linearly between 2**14 + 1 tabulated knots: a pow per draw cost more than everything else in
    the draw, and the table (128 KiB per mode, in cache) lands on the closed form's rank for all
    but about 0.2 % of draws, those one rank off."""
    u = u_lo + (u_hi - u_lo) * _unit(_mix(stream + ctr))
    t = u * (table.shape[0] - 1)
    k = min(np.int64(t), table.shape[0] - 2)
    x = table[k] + (t - k) * (table[k + 1] - table[k])
    r = min(max(np.int64(x), r_lo), r_hi - 1)
    return np.int64(_permute_one(np.uint64(r), a, b, np.uint64(length), 1.0 / np.float64(length)))


@nb.njit(parallel=True, nogil=True, cache=True)
def _draw_keys(streams, lengths, tables, u_lo, u_hi, r_lo, r_hi, perm_a, perm_b, deposit, deposit_shift, spread,
               mode_nbytes, out):
    """ALTO words of ``out.shape[1]`` draws (draw i uses counter i of every mode's stream)."""
    m = out.shape[1]
    nwords = out.shape[0]
    nmodes = lengths.shape[0]
    for i in nb.prange(m):
        ctr = np.uint64(i) * _GOLDEN
        if nwords <= 2:
            # the common case: each mode's bits go to their ALTO positions by one pdep per word
            w0 = np.uint64(0)
            w1 = np.uint64(0)
            for n in range(nmodes):
                c = _draw_coord(streams[n], ctr, lengths[n], tables[n], u_lo[n], u_hi[n], r_lo[n], r_hi[n],
                                perm_a[n], perm_b[n])
                w0 |= pdep(np.uint64(c), deposit[n, 0])
                if nwords == 2:
                    w1 |= pdep(np.uint64(c) >> np.uint64(deposit_shift[n]), deposit[n, 1])
            out[0, i] = w0
            if nwords == 2:
                out[1, i] = w1
        else:
            for w in range(nwords):
                out[w, i] = 0
            for n in range(nmodes):
                c = _draw_coord(streams[n], ctr, lengths[n], tables[n], u_lo[n], u_hi[n], r_lo[n], r_hi[n],
                                perm_a[n], perm_b[n])
                for j in range(mode_nbytes[n]):
                    v = (c >> (8 * j)) & 255
                    for w in range(nwords):
                        out[w, i] |= spread[n, j, v, w]


def _deposit_masks(layout) -> tuple[np.ndarray, np.ndarray]:
    """Per mode and ALTO word, the positions its bits occupy (pdep masks), and per mode how many
    of its bits word 0 holds (the shift before depositing into word 1)."""
    modes, _ = layout.alto_positions
    masks = np.zeros((layout.nmodes, max(2, layout.nwords)), dtype=np.uint64)
    for p, n in enumerate(modes):
        masks[n, p // 64] |= np.uint64(1) << np.uint64(p % 64)
    shift = np.array([bin(int(m)).count("1") for m in masks[:, 0]], dtype=np.int64)
    return masks, shift


@nb.njit(nogil=True, cache=True)
def _drop_columns(keys, drop):
    """Remove the columns listed (sorted, distinct) in ``drop``, in place; returns the new length."""
    nwords, n = keys.shape
    out = 0
    d = 0
    for i in range(n):
        if d < drop.shape[0] and drop[d] == i:
            d += 1
            continue
        for w in range(nwords):
            keys[w, out] = keys[w, i]
        out += 1
    return out


@nb.njit(nogil=True, cache=True)
def _dedupe_sorted(keys):
    """Compact sorted keys in place to their distinct values; returns how many there are."""
    nwords, n = keys.shape
    # read-only up to the first repeat (at FROSTT sizes there is usually none): no writes
    first = n
    for i in range(1, n):
        same = True
        for w in range(nwords):
            if keys[w, i] != keys[w, i - 1]:
                same = False
                break
        if same:
            first = i
            break
    out = first
    for i in range(first, n):
        same = True
        for w in range(nwords):
            if keys[w, out - 1] != keys[w, i]:
                same = False
                break
        if same:
            continue
        for w in range(nwords):
            keys[w, out] = keys[w, i]
        out += 1
    return out


@nb.njit(nogil=True, cache=True)
def _merge_distinct(a, b):
    """Distinct union of two sorted, distinct key arrays (nwords, n), sorted."""
    nwords = a.shape[0]
    out = np.empty((nwords, a.shape[1] + b.shape[1]), dtype=a.dtype)
    i = j = k = 0
    while i < a.shape[1] or j < b.shape[1]:
        if j == b.shape[1]:
            take, step_a, step_b = 0, 1, 0
        elif i == a.shape[1]:
            take, step_a, step_b = 1, 0, 1
        else:
            cmp = 0
            for w in range(nwords - 1, -1, -1):
                if a[w, i] != b[w, j]:
                    cmp = -1 if a[w, i] < b[w, j] else 1
                    break
            take = 0 if cmp <= 0 else 1
            step_a = 1 if cmp <= 0 else 0
            step_b = 1 if cmp >= 0 else 0
        for w in range(nwords):
            out[w, k] = a[w, i] if take == 0 else b[w, j]
        k += 1
        i += step_a
        j += step_b
    return out[:, :k]


VALUE_CODES = {"uniform": 0, "count": 1, "normal": 2}


@nb.njit(parallel=True, nogil=True, cache=True)
def _values_of_keys(keys, stream, kind, out):
    """Each nonzero's value, a hash of its coordinates (ALTO words): the same cell always gets the
    same value for a seed, whatever batch or order it comes in."""
    nwords, n = keys.shape
    log_q = np.log(0.65)
    for i in nb.prange(n):
        h = stream
        for w in range(nwords):
            h = _mix(h ^ keys[w, i]) + _GOLDEN
        h = _mix(h)
        if kind == 0:   # multiples of 1e-6 in (0, 1]: exact round trip through 6-decimal text
            out[i] = np.float64(h % np.uint64(1_000_000) + np.uint64(1)) / 1e6
        elif kind == 1:  # geometric(0.35): 1, 2, 3, ... like event counts
            u = 1.0 - _unit(h)            # (0, 1]
            out[i] = max(1.0, np.ceil(np.log(u) / log_q))
        else:           # standard normal, Box-Muller
            u1 = 1.0 - _unit(h)
            u2 = _unit(_mix(h + _GOLDEN))
            out[i] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@dataclass
class _Plan:
    """Everything a batch of the heavy-tailed generator needs (fixed by shape, nnz, skew, seed)."""

    layout: BitLayout
    skews: np.ndarray
    perm_a: np.ndarray
    perm_b: np.ndarray
    seed: np.random.SeedSequence
    part: int                 # the mode whose rank ranges split the tensor into batches
    bounds: np.ndarray        # rank boundaries of the batches in that mode
    wants: np.ndarray         # nonzeros per batch
    value_stream: np.uint64
    inv_cdf: np.ndarray       # per mode, the rank inverse CDF at INV_CDF_KNOTS + 1 knots


def _plan(shape: Sequence[int], nnz: int, skew, seed, values: str, batch_nnz: int) -> _Plan:
    from .format import BitLayout

    shape = tuple(int(s) for s in shape)
    N = len(shape)
    if nnz < 1:
        raise ValueError(f"nnz must be >= 1, got {nnz}")
    if nnz > math.prod(shape):
        raise ValueError(f"nnz={nnz} exceeds the {math.prod(shape)} cells of shape {shape}")
    if values not in VALUE_CODES:
        raise ValueError(f"values must be one of {VALUE_KINDS}, got {values!r}")
    layout = BitLayout(shape)
    skews = _as_skews(skew, N)
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    rng = np.random.default_rng(ss.spawn(1)[0])
    perms = [_coprime_multiplier(L, rng) for L in shape]
    p = int(np.argmax(shape))
    Lp = shape[p]
    nbatches = int(min(Lp, max(1, math.ceil(nnz / batch_nnz))))
    # rank boundaries of the partition mode with equal probability mass per batch
    bounds = np.unique(np.ceil(Lp * (np.arange(nbatches + 1) / nbatches) ** skews[p]).astype(np.int64))
    bounds[0], bounds[-1] = 0, Lp
    mass = (bounds / Lp) ** (1 / skews[p])
    cum = np.round(nnz * mass).astype(np.int64)
    other = math.prod(shape) // Lp
    caps = np.array([min(int(n) * other, 2**62) for n in np.diff(bounds)], dtype=np.int64)
    wants = _fit_capacity(np.diff(cum), caps)
    value_stream = ss.generate_state(1, np.uint64)[0]
    inv_cdf = np.stack([_inverse_cdf_table(L, sk) for L, sk in zip(shape, skews)])
    return _Plan(layout, skews, np.array([a for a, _ in perms], dtype=np.uint64),
                 np.array([b for _, b in perms], dtype=np.uint64), ss, p, bounds, wants, value_stream, inv_cdf)


def _batch_keys(plan: _Plan, k: int) -> np.ndarray:
    """Sorted, distinct ALTO words (nwords, wants[k]) of batch k: ranks [bounds[k], bounds[k+1])
    of the partition mode, any rank of the others. Deterministic in (seed, k)."""
    from .format import alto_words
    from .format.radix_sort import sort_keys

    layout, p = plan.layout, plan.part
    shape = layout.shape
    lo, hi, want = int(plan.bounds[k]), int(plan.bounds[k + 1]), int(plan.wants[k])
    cap = (hi - lo) * (math.prod(shape) // shape[p])
    batch_seed = np.random.SeedSequence(plan.seed.entropy, spawn_key=(*plan.seed.spawn_key, 1, k))
    def dense() -> np.ndarray:
        ranks = _draw_dense(np.random.default_rng(batch_seed), shape, plan.skews, p, lo, hi, want)
        _permute_ranks(ranks, plan.perm_a, plan.perm_b, np.array(shape, dtype=np.int64))
        return sort_keys(alto_words(ranks, layout), layout.total_bits)

    if want > cap // 4 and cap <= DENSE_BOX_CELLS:
        return dense()
    N = layout.nmodes
    lengths = np.array(shape, dtype=np.int64)
    r_lo = np.zeros(N, dtype=np.int64)
    r_hi = lengths.copy()
    r_lo[p], r_hi[p] = lo, hi
    u_lo = (r_lo / lengths) ** (1 / plan.skews)
    u_hi = (r_hi / lengths) ** (1 / plan.skews)
    deposit, deposit_shift = _deposit_masks(layout)
    keys = np.empty((layout.nwords, 0), dtype=np.uint64)
    drawn = 0
    for attempt in range(64):
        # draw what is missing: the first attempt exactly that (at FROSTT sizes almost no draw
        # repeats, and then no surplus has to be dropped), later ones inflated by the rate of
        # distinct draws seen so far
        rate = keys.shape[1] / drawn if drawn else 1.0
        m = want if drawn == 0 else int((want - keys.shape[1]) / max(rate, 0.02) * 1.002) + 64
        streams = np.random.SeedSequence(batch_seed.entropy, spawn_key=(*batch_seed.spawn_key, attempt)) \
            .generate_state(N, np.uint64)
        new = np.empty((layout.nwords, m), dtype=np.uint64)
        _draw_keys(streams, lengths, plan.inv_cdf, u_lo, u_hi, r_lo, r_hi, plan.perm_a, plan.perm_b, deposit,
                   deposit_shift, layout.spread_tables, layout.mode_nbytes, new)
        new = sort_keys(new, layout.total_bits)
        new = new[:, :_dedupe_sorted(new)]
        keys = new if drawn == 0 else _merge_distinct(keys, new)
        drawn += m
        if keys.shape[1] >= want:
            break
    else:
        if cap <= DENSE_BOX_CELLS:
            return dense()
        raise ValueError(f"could not draw {want} distinct cells of {cap} for shape {shape}: the power law "
                         "concentrates too much mass; lower skew or nnz")
    extra = keys.shape[1] - want
    if extra:
        # drop a uniform random subset of the surplus (the draws kept stay a fair sample)
        drop = np.sort(np.random.default_rng(batch_seed).choice(keys.shape[1], size=extra, replace=False))
        keys = keys[:, :_drop_columns(keys, drop)]
    return keys


class HeavyTailedGenerator:
    """A heavy-tailed tensor to stream: batches of sorted ALTO words, and values from the words.

    Parameters
    ----------
    shape : sequence of int
        Mode lengths (2 to 8 modes).
    nnz : int
        Distinct nonzeros in all.
    skew : float or sequence of float
        Power-law exponent per mode (1 = uniform).
    seed : int, SeedSequence or None
        The same seed and ``batch_nnz`` give the same tensor, whatever the thread count.
    values : {"uniform", "count", "normal"}
    batch_nnz : int, optional
        Nonzeros per batch (about; default :func:`default_batch_nnz`); memory is about 40 bytes
        per nonzero of one batch.

    Examples
    --------
    >>> g = HeavyTailedGenerator((50, 40, 30), 1000, seed=0)
    >>> sum(k.shape[1] for k, _ in g.runs())
    1000
    """

    def __init__(self, shape: Sequence[int], nnz: int, *, skew: float | Sequence[float] = 1.6,
                 seed: int | np.random.SeedSequence | None = None, values: str = "uniform",
                 batch_nnz: int | None = None) -> None:
        batch_nnz = default_batch_nnz(nnz) if batch_nnz is None else int(batch_nnz)
        self.plan = _plan(shape, int(nnz), skew, seed, values, batch_nnz)
        self.layout = self.plan.layout
        self.shape = self.layout.shape
        self.nnz = int(nnz)
        self.value_kind = values

    @property
    def nbatches(self) -> int:
        return int(np.count_nonzero(self.plan.wants))

    def runs(self, with_values: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Yield ``(keys, values)`` per batch: ``keys`` uint64 (nwords, n) are ALTO words of
        ``BitLayout(shape)``, sorted within the batch and distinct across the whole stream (batches
        own disjoint rank ranges of the longest mode); ``values`` float64 (n,), or None when
        ``with_values`` is False (get them later from :meth:`values_of`)."""
        for k in range(len(self.plan.wants)):
            if self.plan.wants[k] == 0:
                continue
            keys = _batch_keys(self.plan, k)
            yield keys, (self.values_of(keys) if with_values else None)

    def values_of(self, keys: np.ndarray) -> np.ndarray:
        """Values of the nonzeros with ALTO words ``keys`` (nwords, n): a hash of each cell."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(keys.shape[1], dtype=np.float64)
        _values_of_keys(keys, self.plan.value_stream, VALUE_CODES[self.value_kind], out)
        return out


def iter_heavy_tailed_alto(shape: Sequence[int], nnz: int, *, skew: float | Sequence[float] = 1.6,
                           seed: int | np.random.SeedSequence | None = None, values: str = "uniform",
                           batch_nnz: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream ``nnz`` distinct nonzeros of a heavy-tailed tensor as ``(ALTO words, values)``
    batches, each sorted; see :class:`HeavyTailedGenerator`."""
    return HeavyTailedGenerator(shape, nnz, skew=skew, seed=seed, values=values, batch_nnz=batch_nnz).runs()


def iter_heavy_tailed(shape: Sequence[int], nnz: int, *, skew: float | Sequence[float] = 1.6,
                      seed: int | np.random.SeedSequence | None = None, values: str = "uniform",
                      batch_nnz: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream ``nnz`` distinct nonzeros of a heavy-tailed sparse tensor in batches.

    Yields ``(coords int64 (n, nmodes) 0-based, values float64 (n,))``; no coordinate repeats
    across the whole stream, and each batch is in ALTO order. The same ``seed`` and ``batch_nnz``
    give the same tensor, whatever the thread count. See :func:`iter_heavy_tailed_alto`.
    """
    from .format import coords_from_words

    gen = HeavyTailedGenerator(shape, nnz, skew=skew, seed=seed, values=values, batch_nnz=batch_nnz)
    for keys, vals in gen.runs():
        yield coords_from_words(keys, gen.layout), vals


def _rank_probabilities(length: int, skew: float, lo: int, hi: int) -> np.ndarray:
    r = np.arange(lo, hi + 1, dtype=np.float64)
    cdf = (r / length) ** (1 / skew)
    return np.diff(cdf)


def _draw_dense(rng, shape, skews, p, lo, hi, want) -> np.ndarray:
    """Weighted sampling without replacement over every cell of a small box."""
    ranges = [(lo, hi) if n == p else (0, L) for n, L in enumerate(shape)]
    weights = np.ones(1)
    for (a, b), L, sk in zip(ranges, shape, skews):
        weights = np.multiply.outer(weights, _rank_probabilities(L, sk, a, b)).ravel()
    pick = rng.choice(weights.shape[0], size=want, replace=False, p=weights / weights.sum())
    coords = np.stack(np.unravel_index(np.sort(pick), [b - a for a, b in ranges]), axis=1).astype(np.int64)
    return coords + np.array([a for a, _ in ranges], dtype=np.int64)


DENSE_BOX_CELLS = 1 << 24


def _fit_capacity(wants: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Move counts from batches asked for more cells than they have to those with room.

    Near-dense tensors saturate the popular slices; the excess goes where there is space.
    """
    total = int(wants.sum())
    out = np.minimum(wants, caps).astype(np.int64)
    missing = total - int(out.sum())
    while missing > 0:
        room = caps - out
        share = np.minimum(np.floor(missing * room / room.sum()).astype(np.int64), room)
        if share.sum() == 0:
            share[np.flatnonzero(room > 0)[:missing]] = 1
        out += share
        missing = total - int(out.sum())
    return out


def heavy_tailed(shape: Sequence[int], nnz: int, *, skew: float | Sequence[float] = 1.6, seed: int | None = None,
                 values: str = "uniform") -> tuple[np.ndarray, np.ndarray]:
    """All nonzeros of :func:`iter_heavy_tailed` in memory: ``(coords, values)``."""
    parts = list(iter_heavy_tailed(shape, nnz, skew=skew, seed=seed, values=values))
    return np.concatenate([c for c, _ in parts]), np.concatenate([v for _, v in parts])


@dataclass
class PlantedCP:
    """A sparse tensor that is exactly a known CP model (plus optional noise on its nonzeros).

    ``values = sum_r weights[r] * prod_n factors[n][coords[:, n], r]`` (+ noise), and the model
    is zero everywhere else: every factor column has a sparse support.
    """

    coords: np.ndarray
    values: np.ndarray
    weights: np.ndarray
    factors: list[np.ndarray]
    noise: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)


def planted_cp(shape: Sequence[int], rank: int, nnz: int, *, noise: float = 0.0, seed: int | None = None,
               skew: float | Sequence[float] = 1.3) -> PlantedCP:
    """Planted rank-``rank`` CP tensor whose factors have sparse supports.

    Component r is the outer product of factor columns that are non-zero on ``s_n`` indices of
    mode n (drawn with the heavy-tailed preference ``skew``, values uniform in [0.5, 1.5)), sized so
    the components together hold about ``nnz`` nonzeros; overlapping components add. The sparse
    tensor is therefore exactly rank ``rank``. ``noise`` adds Gaussian noise with that standard
    deviation relative to the values' standard deviation, on the nonzeros only.
    """
    shape = tuple(int(x) for x in shape)
    N = len(shape)
    rng = np.random.default_rng(seed)
    skews = _as_skews(skew, N)
    per = max(1.0, nnz / rank)
    sizes = [1] * N
    # grow supports mode by mode (short modes saturate) until a component holds ~nnz/rank cells
    grew = True
    while grew:      # ends: every size is bounded by its mode's length
        grew = False
        for n in range(N):
            if sizes[n] < shape[n] and math.prod(sizes) * (sizes[n] + 1) / sizes[n] <= per:
                sizes[n] += 1
                grew = True
    factors = [np.zeros((L, rank)) for L in shape]
    boxes = []
    for r in range(rank):
        support = []
        for n, L in enumerate(shape):
            idx = np.unique(_sample_ranks(rng, L, skews[n], 4 * sizes[n] + 8))
            if idx.shape[0] < sizes[n]:
                rest = np.setdiff1d(rng.choice(L, size=min(L, 4 * sizes[n] + 8), replace=False), idx)
                idx = np.concatenate([idx, rest])
            idx = np.sort(rng.choice(idx, size=sizes[n], replace=False))
            factors[n][idx, r] = rng.uniform(0.5, 1.5, sizes[n])
            support.append(idx)
        boxes.append(support)
    weights = np.ones(rank)
    if math.prod(shape) < 2**62:
        # Fast path: each box's cells as C-order linear keys (their order is the rows' lexicographic
        # order), one 1-D unique, and each cell's value as the sum over the boxes covering it of
        # that component's outer-product value (a bincount); about 6x faster than a row-wise
        # unique and an (nnz x rank) product at uber size, and the same tensor.
        strides = [math.prod(shape[n + 1:]) for n in range(N)]
        keys, vals = [], []
        for r, support in enumerate(boxes):
            k = np.zeros(1, dtype=np.int64)
            v = np.full(1, weights[r])
            for n, idx in enumerate(support):
                k = (k[:, None] + idx[None, :].astype(np.int64) * strides[n]).ravel()
                v = (v[:, None] * factors[n][idx, r][None, :]).ravel()
            keys.append(k)
            vals.append(v)
        lin, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        values = np.bincount(inverse, weights=np.concatenate(vals), minlength=lin.shape[0])
        coords = np.empty((lin.shape[0], N), dtype=np.int64)
        rest = lin
        for n in range(N):
            coords[:, n], rest = np.divmod(rest, strides[n])
    else:
        grids = [np.meshgrid(*support, indexing="ij") for support in boxes]
        coords = np.unique(np.concatenate([np.stack([g.ravel() for g in gr], axis=1) for gr in grids]), axis=0)
        prod = np.ones((coords.shape[0], rank))
        for n, A in enumerate(factors):
            prod *= A[coords[:, n]]
        values = prod @ weights
    if noise > 0:
        values = values + noise * values.std() * rng.standard_normal(values.shape[0])
    return PlantedCP(coords, values, weights, factors, float(noise))


# --- writing .tns -----------------------------------------------------------------------------------

@nb.njit(nogil=True, cache=True)
def _write_int(buf, pos, v):
    if v == 0:
        buf[pos] = 48
        return pos + 1
    start = pos
    while v > 0:
        buf[pos] = 48 + v % 10
        v //= 10
        pos += 1
    i, j = start, pos - 1
    while i < j:
        buf[i], buf[j] = buf[j], buf[i]
        i += 1
        j -= 1
    return pos


@nb.njit(nogil=True, cache=True)
def _format_fixed(coords, offset, scaled, decimals, buf):
    """Lines 'i_1 ... i_N value' with value = scaled / 10**decimals (scaled >= 0)."""
    pos = 0
    div = 10 ** decimals
    for i in range(coords.shape[0]):
        for m in range(coords.shape[1]):
            pos = _write_int(buf, pos, coords[i, m] + offset)
            buf[pos] = 32
            pos += 1
        v = scaled[i]
        pos = _write_int(buf, pos, v // div)
        if decimals > 0:
            buf[pos] = 46
            pos += 1
            frac = v % div
            d = div // 10
            while d > 0:
                buf[pos] = 48 + (frac // d) % 10
                pos += 1
                d //= 10
        buf[pos] = 10
        pos += 1
    return pos


def format_tns(coords: np.ndarray, values: np.ndarray, one_based: bool = True) -> bytes:
    """Text lines for a batch of nonzeros. Exact: values parse back to the same float64."""
    offset = 1 if one_based else 0
    for decimals in (0, 6):
        scaled = np.round(values * 10**decimals)
        if (values >= 0).all() and (scaled / 10**decimals == values).all() and scaled.max(initial=0) < 2**62:
            cap = coords.shape[0] * (coords.shape[1] * 20 + 32)
            buf = np.empty(cap, dtype=np.uint8)
            n = _format_fixed(np.ascontiguousarray(coords), offset, scaled.astype(np.int64), decimals, buf)
            return buf[:n].tobytes()
    # general floats: shortest repr that round-trips
    idx = (coords + offset).astype(str)
    lines = [" ".join(row) + " " + repr(float(v)) for row, v in zip(idx.tolist(), values.tolist())]
    return ("\n".join(lines) + "\n").encode()


def write_tns(path: str | os.PathLike, batches, *, one_based: bool = True, header: str | None = None) -> int:
    """Write batches of ``(coords, values)`` to a ``.tns`` file (gzip if the name ends in ``.gz``).

    Returns the number of nonzeros written. The file appears under its final name only when
    complete (written to ``<path>.partial-<host>-<pid>``, then renamed); partial files of killed
    runs in the same folder are removed first (see :mod:`tensorflow_ooc.tempdirs`).
    """
    from .tempdirs import clean_stale, owner_suffix

    path = str(path)
    clean_stale(os.path.dirname(os.path.abspath(path)))  # what killed runs left here
    # host and pid in the name: if this process dies, the next run into this folder removes it
    tmp = f"{path}.partial-{owner_suffix()}"
    opener = gzip.open if path.endswith(".gz") else open
    total = piece = 0
    try:
        with opener(tmp, "wb") as f:
            if header:
                f.write(b"".join(b"# " + line.encode() + b"\n" for line in header.splitlines()))
            for coords, values in batches:
                text = format_tns(coords, values, one_based)
                piece = len(text)
                f.write(text)
                total += coords.shape[0]
        os.replace(tmp, path)
    except BaseException as exc:
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if os.path.exists(tmp):
            os.remove(tmp)
        from .disk import disk_full_error, is_disk_full

        if is_disk_full(exc):     # the file named; it needs at least what was written and the failed piece
            raise disk_full_error(exc, path, needed=written + piece) from exc
        raise
    return total


# --- planted dense tensors -------------------------------------------------------------------------

@dataclass
class PlantedDense:
    """A dense tensor that is a known rank-R CP model plus Gaussian noise.

    ``tensor = sum_r weights[r] * factors[0][:, r] o ... o factors[N-1][:, r] + E`` with
    ``||E|| = noise * ||model||`` (in expectation): ``noise=0.01`` is 1 % noise.
    """

    tensor: np.ndarray
    weights: np.ndarray
    factors: list[np.ndarray]
    noise: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)


def planted_dense_factors(shape: Sequence[int], rank: int, seed: int | None = None
                          ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Unit weights and standard normal factors (well conditioned with high probability)."""
    rng = np.random.default_rng(seed)
    return np.ones(rank), [rng.standard_normal((int(s), rank)) for s in shape]


def _dense_model(weights: np.ndarray, factors: Sequence[np.ndarray]) -> np.ndarray:
    letters = "abcdefgh"[: len(factors)]
    return np.einsum(",".join(f"{c}r" for c in letters) + ",r->" + letters, *factors, weights, optimize=True)


def _model_norm_sq(weights: np.ndarray, factors: Sequence[np.ndarray]) -> float:
    H = np.outer(weights, weights)
    for f in factors:
        H = H * (f.T @ f)
    return float(H.sum())


def planted_dense(shape: Sequence[int], rank: int, *, noise: float = 0.0, seed: int | None = None,
                  dtype: str = "float64") -> PlantedDense:
    """A planted rank-``rank`` dense tensor in memory (see :class:`PlantedDense`).

    Examples
    --------
    >>> p = planted_dense((4, 5, 6), 2, noise=0.01, seed=0)
    >>> p.tensor.shape, len(p.factors)
    ((4, 5, 6), 2)
    """
    weights, factors = planted_dense_factors(shape, rank, seed)
    X = _dense_model(weights, factors)
    if noise:
        rng = np.random.default_rng(None if seed is None else [int(seed), 1])
        sigma = noise * math.sqrt(_model_norm_sq(weights, factors) / X.size)
        X += sigma * rng.standard_normal(X.shape)
    return PlantedDense(X.astype(dtype, copy=False), weights, factors, float(noise))


def write_planted_dense(path: str | os.PathLike, shape: Sequence[int], rank: int, *, noise: float = 0.0,
                        seed: int | None = 0, chunks: Sequence[int] | None = None, dtype: str = "float64",
                        codec: str = "none", overwrite: bool = False, progress: bool = False
                        ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Write a planted rank-``rank`` dense tensor (:class:`PlantedDense`) to a Zarr v3 array at
    ``path``, one chunk at a time (an array larger than memory is fine), atomically for local
    paths. The array's ``tensorflow_ooc`` attributes record the planted model's parameters and the
    written tensor's ||X||^2. Returns the true ``(weights, factors)``.

    ``codec="none"`` stores chunks uncompressed: noisy float64 values shrink by about 4 % under
    Zarr's default zstd, whose decompression (about 0.3 GB/s a core) would then bound a streamed
    CP-ALS; ``codec="zstd"`` takes Zarr's default compressor.

    Examples
    --------
    >>> w, f = write_planted_dense("memory://doc-dense.zarr", (6, 7, 8), 2, noise=0.01)
    >>> import zarr; zarr.open_array("memory://doc-dense.zarr").shape
    (6, 7, 8)
    """
    import zarr

    from .errors import StoreExistsError
    from .store import paths

    shape = tuple(int(s) for s in shape)
    if codec not in ("none", "zstd"):
        raise ValueError(f"codec must be 'none' or 'zstd', got {codec!r}")
    if chunks is None:
        # at most 8 MiB chunks: whole trailing modes, the leading ones cut into equal pieces, so no
        # edge chunk is mostly padding (Zarr stores an edge chunk at the full chunk shape, and a
        # streamed pass reads it whole: 209 rows cut 168 + 41 read 1.6x the data, 105 + 104 do not)
        chunks, budget = [], (8 << 20) // np.dtype(dtype).itemsize
        for s in reversed(shape):
            c = max(1, min(s, budget))
            c = -(-s // -(-s // c))
            chunks.insert(0, c)
            budget = max(1, budget // c)
    chunks = tuple(int(c) for c in chunks)
    weights, factors = planted_dense_factors(shape, rank, seed)
    sigma = noise * math.sqrt(_model_norm_sq(weights, factors) / math.prod(shape)) if noise else 0.0
    final = str(path)
    from tqdm.auto import tqdm

    from .disk import disk_writes

    # a full disk: the staging array is removed (``staged``), the error names the array and its size
    with disk_writes(final, needed=math.prod(shape) * np.dtype(dtype).itemsize + (64 << 10)), \
            paths.staged(final, overwrite, StoreExistsError(f"{final}: exists; pass overwrite=True to replace it")
                         ) as staging:
        arr = zarr.create_array(staging, shape=shape, chunks=chunks, dtype=dtype, zarr_format=3, overwrite=True,
                                **({"compressors": None} if codec == "none" else {}))
        grid = [range(0, s, c) for s, c in zip(shape, chunks)]
        norm_sq = 0.0
        for k, origin in enumerate(tqdm(list(np.ndindex(*[len(g) for g in grid])), desc="generate", unit="chunk",
                                        disable=not progress, leave=False)):
            lo = [g[i] for g, i in zip(grid, origin)]
            sl = tuple(slice(l, min(s, l + c)) for l, s, c in zip(lo, shape, chunks))
            block = _dense_model(weights, [f[s] for f, s in zip(factors, sl)])
            if sigma:
                block += sigma * np.random.default_rng([0 if seed is None else int(seed), 2, k]).standard_normal(
                    block.shape)
            block = block.astype(dtype, copy=False)
            norm_sq += float(np.vdot(block, block))
            arr[sl] = block
        arr.attrs["tensorflow_ooc"] = {"kind": "planted-dense", "norm_sq": norm_sq,
                                       "planted": {"rank": int(rank), "noise": float(noise), "seed": seed},
                                       "codec": codec}
    return weights, factors


@dataclass
class PlantedFastTucker:
    """Observed entries of a known FastTucker model (seed 003): ``values = clean + noise`` with
    ``clean = sum_r prod_n (factors[n] @ core_factors[n])[coords[:, n], r]``; ``noise_std`` is the
    standard deviation of the added Gaussian noise."""

    coords: np.ndarray
    values: np.ndarray
    clean: np.ndarray
    factors: list[np.ndarray]
    core_factors: list[np.ndarray]
    noise_std: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)


def planted_fasttucker(shape: Sequence[int], ranks: int | Sequence[int], core_rank: int, nnz: int, *,
                       noise: float = 0.0, seed: int | None = None, decay: float = 1.0) -> PlantedFastTucker:
    """``nnz`` distinct entries, uniform over the tensor, of a random FastTucker model.

    Factors are standard normal, core factors normal with variance ``1 / J_n`` (so every
    ``C^(n) = A^(n) B^(n)`` has unit-variance entries) and the first scaled by ``1 / sqrt(R)``, so
    the values have about unit variance; with ``decay < 1`` component ``r`` of the Kruskal core is
    scaled by ``decay**r`` (a decaying spectrum, as real data have). ``noise`` adds Gaussian noise of
    that standard deviation relative to the clean values' standard deviation.

    Examples
    --------
    >>> from tensorflow_ooc import synthetic
    >>> p = synthetic.planted_fasttucker((30, 20, 10), 4, 4, 2000, noise=0.05, seed=0)
    >>> p.coords.shape, round(p.noise_std / p.clean.std(), 2)
    ((2000, 3), 0.05)
    """
    shape = tuple(int(x) for x in shape)
    N = len(shape)
    J = [int(ranks)] * N if np.ndim(ranks) == 0 else [int(j) for j in ranks]
    total = math.prod(shape)
    if not 0 < nnz <= total:
        raise ValueError(f"nnz must be in 1..{total} for shape {shape}, got {nnz}")
    rng = np.random.default_rng(seed)
    factors = [rng.standard_normal((L, j)) for L, j in zip(shape, J)]
    core = [rng.standard_normal((j, core_rank)) / math.sqrt(j) for j in J]
    core[0] /= math.sqrt(core_rank)
    core[0] *= float(decay) ** np.arange(core_rank)
    # distinct uniform entries: draw, drop repeats, top up (few rounds unless nnz ~ the whole tensor)
    if total < 2**62:
        keys = np.zeros(0, np.int64)
        while keys.shape[0] < nnz:
            keys = np.unique(np.concatenate([keys, rng.integers(0, total, size=int((nnz - keys.shape[0]) * 1.1) + 16)]))
        keys = rng.choice(keys, size=nnz, replace=False) if keys.shape[0] > nnz else keys
        coords = np.stack(np.unravel_index(keys, shape), axis=1).astype(np.int64)
    else:
        coords = np.zeros((0, N), np.int64)
        while coords.shape[0] < nnz:
            extra = np.stack([rng.integers(0, L, size=int((nnz - coords.shape[0]) * 1.1) + 16) for L in shape], axis=1)
            coords = np.unique(np.concatenate([coords, extra]), axis=0)
        coords = coords[rng.choice(coords.shape[0], size=nnz, replace=False)]
    coords = coords[rng.permutation(nnz)]
    prod = np.ones((nnz, core_rank))
    for n in range(N):
        prod *= (factors[n] @ core[n])[coords[:, n]]
    clean = prod.sum(axis=1)
    noise_std = float(noise * clean.std())
    values = clean + noise_std * rng.standard_normal(nnz)
    return PlantedFastTucker(coords, values, clean, factors, core, noise_std)
