"""Numba kernels of the heavy-tailed generator: counter hashes, rank permutations, ALTO draws, dedupe, values."""

from __future__ import annotations

import numba as nb
import numpy as np

from ..format.bits import pdep

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
def _draw_keys(
    streams, lengths, tables, u_lo, u_hi, r_lo, r_hi, perm_a, perm_b, deposit, deposit_shift, spread, mode_nbytes, out
):
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
                c = _draw_coord(
                    streams[n], ctr, lengths[n], tables[n], u_lo[n], u_hi[n], r_lo[n], r_hi[n], perm_a[n], perm_b[n]
                )
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
                c = _draw_coord(
                    streams[n], ctr, lengths[n], tables[n], u_lo[n], u_hi[n], r_lo[n], r_hi[n], perm_a[n], perm_b[n]
                )
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
        if kind == 0:  # multiples of 1e-6 in (0, 1]: exact round trip through 6-decimal text
            out[i] = np.float64(h % np.uint64(1_000_000) + np.uint64(1)) / 1e6
        elif kind == 1:  # geometric(0.35): 1, 2, 3, ... like event counts
            u = 1.0 - _unit(h)  # (0, 1]
            out[i] = max(1.0, np.ceil(np.log(u) / log_q))
        else:  # standard normal, Box-Muller
            u1 = 1.0 - _unit(h)
            u2 = _unit(_mix(h + _GOLDEN))
            out[i] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
