"""Synthetic sparse tensors: heavy-tailed supports shaped like real data, and planted low-rank CP.

Real tensors have a few huge slices and many tiny ones. Each mode's index is drawn from a power
law over a random permutation of the mode (rank ``r = floor(L * u**skew)``, ``u`` uniform), so
slice sizes are heavy tailed and popular indices are scattered over the mode, not packed at 0.
Generation streams in batches with no duplicate coordinates across batches: batch k owns a
disjoint range of ranks of the longest mode, so 10^8 nonzeros need only one batch in memory.

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
from typing import Iterator, Sequence

import numba as nb
import numpy as np

PRESETS: dict[str, tuple[tuple[int, ...], int]] = {
    "uber": ((183, 24, 1140, 1717), 3_309_490),
    "nips": ((2482, 2862, 14036, 17), 3_101_609),
    "chicago": ((6186, 24, 77, 32), 5_330_673),
    "nell2": ((12092, 9184, 28818), 20_000_000),
    "vast": ((165427, 11374, 2), 26_021_854),
    "hypersparse": ((10_000_000, 100_000, 1000), 5_000_000),
}

VALUE_KINDS = ("uniform", "count", "normal")
DEFAULT_BATCH_NNZ = 1 << 22


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


@nb.njit(nogil=True, cache=True)
def _permute(ranks, a, b, length, out):
    L = np.uint64(length)
    one = np.uint64(1)
    for i in range(ranks.shape[0]):
        # (a * r) mod L by double-and-add in uint64: lengths reach 2**63 - 1, products would overflow
        r = np.uint64(ranks[i])
        acc = np.uint64(0)
        x = np.uint64(a)
        while r > 0:
            if r & one:
                acc = (acc + x) % L
            x = (x + x) % L
            r >>= one
        out[i] = np.int64((acc + np.uint64(b)) % L)


def _sample_ranks(rng, length: int, skew: float, n: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Power-law ranks in [lo, hi): P(rank < r) = (r / length) ** (1 / skew)."""
    hi = length if hi is None else hi
    u_lo, u_hi = (lo / length) ** (1 / skew), (hi / length) ** (1 / skew)
    u = rng.uniform(u_lo, u_hi, n)
    r = np.floor(length * u ** skew).astype(np.int64)
    return np.clip(r, lo, hi - 1)


def _values(rng, kind: str, n: int) -> np.ndarray:
    if kind == "uniform":  # multiples of 1e-6 in (0, 1]: exact round trip through 6-decimal text
        return rng.integers(1, 1_000_001, n) / 1e6
    if kind == "count":
        return rng.geometric(0.35, n).astype(np.float64)
    if kind == "normal":
        return rng.standard_normal(n)
    raise ValueError(f"values must be one of {VALUE_KINDS}, got {kind!r}")


def _unique_rows(coords: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Indices of the first occurrence of each distinct row."""
    if math.prod(shape) < 2**63:
        key = np.zeros(coords.shape[0], dtype=np.int64)
        for n, L in enumerate(shape):
            key = key * L + coords[:, n]
        _, first = np.unique(key, return_index=True)
    else:
        _, first = np.unique(coords, axis=0, return_index=True)
    return np.sort(first)


def iter_heavy_tailed(shape: Sequence[int], nnz: int, *, skew: float | Sequence[float] = 1.6,
                      seed: int | None = None, values: str = "uniform",
                      batch_nnz: int = DEFAULT_BATCH_NNZ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream ``nnz`` distinct nonzeros of a heavy-tailed sparse tensor in batches.

    Yields ``(coords int64 (n, nmodes) 0-based, values float64 (n,))``; no coordinate repeats
    across the whole stream. The same ``seed`` and ``batch_nnz`` give the same tensor.
    """
    shape = tuple(int(s) for s in shape)
    N = len(shape)
    if nnz < 1:
        raise ValueError(f"nnz must be >= 1, got {nnz}")
    if nnz > math.prod(shape):
        raise ValueError(f"nnz={nnz} exceeds the {math.prod(shape)} cells of shape {shape}")
    skews = _as_skews(skew, N)
    rng = np.random.default_rng(seed)
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
    for k in range(len(bounds) - 1):
        want = int(wants[k])
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        if want == 0:
            continue
        cap = (hi - lo) * other
        coords = _draw_unique(rng, shape, skews, p, lo, hi, want, cap)
        for n, (a, b) in enumerate(perms):
            _permute(coords[:, n].copy(), a, b, shape[n], coords[:, n])
        yield coords, _values(rng, values, want)


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


def _draw_unique(rng, shape, skews, p, lo, hi, want, cap) -> np.ndarray:
    N = len(shape)
    if want > cap // 4 and cap <= DENSE_BOX_CELLS:
        return _draw_dense(rng, shape, skews, p, lo, hi, want)
    got = np.zeros((0, N), dtype=np.int64)
    for _ in range(64):
        m = int((want - got.shape[0]) * 1.25) + 16
        draw = np.empty((m, N), dtype=np.int64)
        for n in range(N):
            draw[:, n] = _sample_ranks(rng, shape[n], skews[n], m, *((lo, hi) if n == p else (0, shape[n])))
        got = np.concatenate([got, draw])
        got = got[_unique_rows(got, shape)]
        if got.shape[0] >= want:
            pick = np.sort(rng.choice(got.shape[0], size=want, replace=False))
            return got[pick]
    if cap <= DENSE_BOX_CELLS:
        return _draw_dense(rng, shape, skews, p, lo, hi, want)
    raise ValueError(f"could not draw {want} distinct cells of {cap} for shape {shape}: the power law "
                     "concentrates too much mass; lower skew or nnz")


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
    for _ in range(64):
        grew = False
        for n in range(N):
            if sizes[n] < shape[n] and math.prod(sizes) * (sizes[n] + 1) / sizes[n] <= per:
                sizes[n] += 1
                grew = True
        if not grew:
            break
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
    complete (written to a temporary name, then renamed).
    """
    path = str(path)
    tmp = f"{path}.partial-{os.getpid()}"
    opener = gzip.open if path.endswith(".gz") else open
    total = 0
    try:
        with opener(tmp, "wb") as f:
            if header:
                f.write(b"".join(b"# " + line.encode() + b"\n" for line in header.splitlines()))
            for coords, values in batches:
                f.write(format_tns(coords, values, one_based))
                total += coords.shape[0]
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return total
