"""The heavy-tailed generator: batch plans, :class:`HeavyTailedGenerator`, its streams and ``heavy_tailed``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .heavy_tailed_kernels import (
    VALUE_CODES,
    _dedupe_sorted,
    _deposit_masks,
    _draw_keys,
    _drop_columns,
    _inverse_cdf_table,
    _merge_distinct,
    _permute_ranks,
    _values_of_keys,
)
from .power_law import _as_skews, _rank_probabilities
from .presets import VALUE_KINDS

if TYPE_CHECKING:
    from ..format import BitLayout

DEFAULT_BATCH_NNZ = 1 << 22
MAX_AUTO_BATCH_NNZ = 1 << 23


def default_batch_nnz(nnz: int) -> int:
    """Batch size when none is given: nnz / 16 within [2**22, 2**23], a function of nnz alone (the
    tensor must not depend on memory settings). Each batch is a sorted run that conversion merges,
    and a merge costs one comparison per level of log2(runs); 8 M-nonzero batches hold about
    330 MB of working memory while they are drawn and sorted."""
    return int(min(MAX_AUTO_BATCH_NNZ, max(DEFAULT_BATCH_NNZ, -(-int(nnz) // 16))))


def _coprime_multiplier(length: int, rng: np.random.Generator) -> tuple[int, int]:
    """(a, b) so that r -> (a*r + b) mod length is a permutation of range(length)."""
    if length <= 1:
        return 1, 0
    while True:
        a = int(rng.integers(1, length))
        if math.gcd(a, length) == 1:
            return a, int(rng.integers(0, length))


@dataclass
class _Plan:
    """Everything a batch of the heavy-tailed generator needs (fixed by shape, nnz, skew, seed)."""

    layout: BitLayout
    skews: np.ndarray
    perm_a: np.ndarray
    perm_b: np.ndarray
    seed: np.random.SeedSequence
    part: int  # the mode whose rank ranges split the tensor into batches
    bounds: np.ndarray  # rank boundaries of the batches in that mode
    wants: np.ndarray  # nonzeros per batch
    value_stream: np.uint64
    inv_cdf: np.ndarray  # per mode, the rank inverse CDF at INV_CDF_KNOTS + 1 knots


def _plan(shape: Sequence[int], nnz: int, skew, seed, values: str, batch_nnz: int) -> _Plan:
    from ..format import BitLayout

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
    inv_cdf = np.stack([_inverse_cdf_table(L, sk) for L, sk in zip(shape, skews, strict=True)])
    return _Plan(
        layout,
        skews,
        np.array([a for a, _ in perms], dtype=np.uint64),
        np.array([b for _, b in perms], dtype=np.uint64),
        ss,
        p,
        bounds,
        wants,
        value_stream,
        inv_cdf,
    )


def _batch_keys(plan: _Plan, k: int) -> np.ndarray:
    """Sorted, distinct ALTO words (nwords, wants[k]) of batch k: ranks [bounds[k], bounds[k+1])
    of the partition mode, any rank of the others. Deterministic in (seed, k)."""
    from ..format import alto_words
    from ..format.radix_sort import sort_keys

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
        streams = np.random.SeedSequence(batch_seed.entropy, spawn_key=(*batch_seed.spawn_key, attempt)).generate_state(
            N, np.uint64
        )
        new = np.empty((layout.nwords, m), dtype=np.uint64)
        _draw_keys(
            streams,
            lengths,
            plan.inv_cdf,
            u_lo,
            u_hi,
            r_lo,
            r_hi,
            plan.perm_a,
            plan.perm_b,
            deposit,
            deposit_shift,
            layout.spread_tables,
            layout.mode_nbytes,
            new,
        )
        new = sort_keys(new, layout.total_bits)
        new = new[:, : _dedupe_sorted(new)]
        keys = new if drawn == 0 else _merge_distinct(keys, new)
        drawn += m
        if keys.shape[1] >= want:
            break
    else:
        if cap <= DENSE_BOX_CELLS:
            return dense()
        raise ValueError(
            f"could not draw {want} distinct cells of {cap} for shape {shape}: the power law "
            "concentrates too much mass; lower skew or nnz"
        )
    extra = keys.shape[1] - want
    if extra:
        # drop a uniform random subset of the surplus (the draws kept stay a fair sample)
        drop = np.sort(np.random.default_rng(batch_seed).choice(keys.shape[1], size=extra, replace=False))
        keys = keys[:, : _drop_columns(keys, drop)]
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

    def __init__(
        self,
        shape: Sequence[int],
        nnz: int,
        *,
        skew: float | Sequence[float] = 1.6,
        seed: int | np.random.SeedSequence | None = None,
        values: str = "uniform",
        batch_nnz: int | None = None,
    ) -> None:
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


def iter_heavy_tailed_alto(
    shape: Sequence[int],
    nnz: int,
    *,
    skew: float | Sequence[float] = 1.6,
    seed: int | np.random.SeedSequence | None = None,
    values: str = "uniform",
    batch_nnz: int | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream ``nnz`` distinct nonzeros of a heavy-tailed tensor as ``(ALTO words, values)``
    batches, each sorted; see :class:`HeavyTailedGenerator`."""
    return HeavyTailedGenerator(shape, nnz, skew=skew, seed=seed, values=values, batch_nnz=batch_nnz).runs()


def iter_heavy_tailed(
    shape: Sequence[int],
    nnz: int,
    *,
    skew: float | Sequence[float] = 1.6,
    seed: int | np.random.SeedSequence | None = None,
    values: str = "uniform",
    batch_nnz: int | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream ``nnz`` distinct nonzeros of a heavy-tailed sparse tensor in batches.

    Yields ``(coords int64 (n, nmodes) 0-based, values float64 (n,))``; no coordinate repeats
    across the whole stream, and each batch is in ALTO order. The same ``seed`` and ``batch_nnz``
    give the same tensor, whatever the thread count. See :func:`iter_heavy_tailed_alto`.
    """
    from ..format import coords_from_words

    gen = HeavyTailedGenerator(shape, nnz, skew=skew, seed=seed, values=values, batch_nnz=batch_nnz)
    for keys, vals in gen.runs():
        yield coords_from_words(keys, gen.layout), vals


def _draw_dense(rng, shape, skews, p, lo, hi, want) -> np.ndarray:
    """Weighted sampling without replacement over every cell of a small box."""
    ranges = [(lo, hi) if n == p else (0, L) for n, L in enumerate(shape)]
    weights = np.ones(1)
    for (a, b), L, sk in zip(ranges, shape, skews, strict=True):
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


def heavy_tailed(
    shape: Sequence[int],
    nnz: int,
    *,
    skew: float | Sequence[float] = 1.6,
    seed: int | None = None,
    values: str = "uniform",
) -> tuple[np.ndarray, np.ndarray]:
    """All nonzeros of :func:`iter_heavy_tailed` in memory: ``(coords, values)``."""
    parts = list(iter_heavy_tailed(shape, nnz, skew=skew, seed=seed, values=values))
    return np.concatenate([c for c, _ in parts]), np.concatenate([v for _, v in parts])
