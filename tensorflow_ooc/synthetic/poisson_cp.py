"""Planted Poisson CP tensors (count data for CP-APR): :class:`PlantedPoissonGenerator` streams
them, ``planted_poisson`` holds one in memory as a :class:`PlantedPoisson`.

The model (Chi & Kolda's Poisson CP): nonnegative factors ``A_n`` whose columns sum to 1 and
weights ``lam``; cell ``i`` has intensity ``m_i = sum_r lam_r prod_n A_n[i_n, r]`` and count
``x_i ~ Poisson(m_i)``, independently; the tensor's nonzeros are the cells with ``x_i > 0``.
Column ``r`` of ``A_n`` is ``w_n * g`` normalized, with ``g`` Gamma(``concentration``) draws
(below 1: a few large entries and many near zero, so components are distinct) and ``w_n`` the
power law of the heavy-tailed generator over a random permutation of the mode (``skew``; 1 =
uniform), so slice sizes are heavy tailed like real data's. ``lam_r`` is component r's expected
total count.

Sampling: instead of visiting every cell, the generator draws the model's events. The total
count is Poisson(sum lam); each event picks component r with probability ``lam_r / sum lam``
and then each mode's index from column r of ``A_n``. Counting the events per cell gives exactly
independent ``Poisson(m_i)`` counts (Poisson splitting), in time proportional to the nonzeros,
not to the cells. Batches own disjoint index ranges of the longest mode (so no cell repeats
across batches) of about equal expected events; a batch's events per component are Poisson of
the component's mass in that range, so batches are independent draws and are made in bounded
memory: 10^8 nonzeros need one batch at a time. ``sum lam`` is chosen so the expected number of
nonzeros, ``sum_i (1 - exp(-m_i))``, is ``nnz``: estimated without summing over the cells from a
pilot sample of cells drawn from the model, ``E_{i ~ m / sum m}[(1 - exp(-m_i)) / (m_i / sum m)]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .poisson_kernels import _count_sorted, _merge_counts, guide_table, guided_draws
from .power_law import _as_skews, _rank_probabilities

#: cells drawn from the model to estimate the expected nonzeros as a function of ``sum lam``
PILOT_DRAWS = 1 << 17
#: largest expected events per requested nonzero (a model this dense costs more than it gives)
MAX_EVENTS_PER_NONZERO = 64


@dataclass
class PlantedPoisson:
    """Counts drawn from a known Poisson CP model (see :mod:`~tensorflow_ooc.synthetic.poisson_cp`).

    ``values[k] ~ Poisson(m)`` at ``coords[k]``, ``m = sum_r weights[r] * prod_n
    factors[n][coords[k, n], r]``; every cell not listed drew 0. Factor columns sum to 1, so
    ``weights[r]`` is component r's expected total count and ``weights.sum()`` the tensor's.
    """

    coords: np.ndarray  # int64 (nnz, nmodes), 0-based
    values: np.ndarray  # float64 counts >= 1
    weights: np.ndarray
    factors: list[np.ndarray]
    expected_nnz: float  # sum over all cells of P(count > 0), as estimated when lam was chosen
    skew: np.ndarray = field(repr=False)
    concentration: float = 0.5

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)

    def intensity(self, coords: np.ndarray | None = None) -> np.ndarray:
        """The model's intensity ``m`` at ``coords`` (default: the nonzeros)."""
        return _intensity(self.weights, self.factors, self.coords if coords is None else coords)


def _intensity(weights: np.ndarray, factors: Sequence[np.ndarray], coords: np.ndarray, piece: int = 1 << 16):
    coords = np.asarray(coords)
    out = np.empty(coords.shape[0], dtype=np.float64)
    for s in range(0, coords.shape[0], piece):
        c = coords[s : s + piece]
        prod = np.ones((c.shape[0], weights.shape[0]))
        for n, A in enumerate(factors):
            prod *= A[c[:, n]]
        out[s : s + piece] = prod @ weights
    return out


class PlantedPoissonGenerator:
    """A planted Poisson CP tensor to stream: the true model at once, the counts batch by batch.

    Parameters
    ----------
    shape : sequence of int
        Mode lengths (2 or more modes).
    rank : int
        Components of the model.
    nnz : int
        Expected nonzeros (cells with a count of at least 1); the draw gives about that many
        (within a few sqrt(nnz), plus about 1 % for the estimate of ``sum lam``).
    seed : int, SeedSequence or None
        The same seed gives the same model; the same seed and ``batch_nnz`` the same counts,
        whatever the thread count.
    skew : float or sequence of float
        Power-law exponent of each mode's slice popularity (1 = uniform).
    concentration : float
        Gamma shape of the factor entries before normalization (below 1: sparse-ish columns).
    batch_nnz : int, optional
        Expected events per batch (default as the heavy-tailed generator's batches, a function of
        ``nnz`` alone); a batch takes about (8 * nmodes + 32) bytes per event while it is drawn.
        Besides, the factors are dense: about 20 bytes per entry (``rank * sum(shape)`` entries)
        for them, their cumulative copy and its guide tables.

    Attributes
    ----------
    weights : ndarray (rank,)
        ``lam``: each component's expected total count.
    factors : list of ndarray (L_n, rank)
        Nonnegative, each column summing to 1.
    expected_nnz : float
        The estimate of the expected nonzeros that ``lam`` was scaled to (about ``nnz``).

    Examples
    --------
    >>> g = PlantedPoissonGenerator((50, 40, 30), 3, 2000, seed=0)
    >>> coords, counts = next(g.batches())
    >>> bool((counts >= 1).all() and (counts == counts.round()).all())
    True
    """

    def __init__(
        self,
        shape: Sequence[int],
        rank: int,
        nnz: int,
        *,
        seed: int | np.random.SeedSequence | None = None,
        skew: float | Sequence[float] = 1.3,
        concentration: float = 0.5,
        batch_nnz: int | None = None,
    ) -> None:
        from ..format import BitLayout
        from .heavy_tailed_generator import default_batch_nnz

        shape = tuple(int(s) for s in shape)
        N = len(shape)
        if N < 2 or any(s < 1 for s in shape):
            raise ValueError(f"shape must have 2 or more modes of length >= 1, got {shape}")
        rank, nnz = int(rank), int(nnz)
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if nnz < 1:
            raise ValueError(f"nnz must be >= 1, got {nnz}")
        cells = math.prod(shape)
        if nnz > cells / 2:
            raise ValueError(
                f"nnz={nnz} is more than half of the {cells} cells of shape {shape}: a Poisson "
                "model that dense repeats most of its draws; lower nnz"
            )
        concentration = float(concentration)
        if not (math.isfinite(concentration) and concentration > 0):
            raise ValueError(
                f"concentration (the factors' gamma shape) must be a finite number > 0, got {concentration}"
            )
        self.shape = shape
        self.rank = rank
        self.nnz = nnz
        self.skew = _as_skews(skew, N)
        self.concentration = concentration
        self.batch_nnz = default_batch_nnz(nnz) if batch_nnz is None else int(batch_nnz)
        if self.batch_nnz < 1:
            raise ValueError(f"batch_nnz must be >= 1, got {batch_nnz}")
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        self._seed = ss

        rng = self._rng(0)
        self.factors = []
        for L, sk in zip(shape, self.skew, strict=True):
            popularity = rng.permutation(_rank_probabilities(L, float(sk), 0, L))
            A = popularity[:, None] * rng.gamma(concentration, size=(L, rank))
            sums = A.sum(axis=0)
            if not (sums > 0).all():
                raise ValueError(
                    f"a factor column of a mode of length {L} is all zero (its gamma draws underflow); "
                    f"raise concentration (got {concentration})"
                )
            self.factors.append(A / sums)
        share = rng.uniform(0.5, 1.5, rank)
        share /= share.sum()
        # per mode and component, the cumulative column (rows of a (rank, L) array) and its guide
        # table: an index is drawn by inverting the column's CDF at a uniform
        self._cdf = [np.cumsum(A.T, axis=1) for A in self.factors]
        self._guide = [guide_table(c) for c in self._cdf]
        self.layout = BitLayout(shape)

        total, self.expected_nnz = self._scale(share)
        self.weights = total * share
        self._plan_batches()

    # --- construction ----------------------------------------------------------------------------

    def _rng(self, *key: int) -> np.random.Generator:
        ss = self._seed
        return np.random.default_rng(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 7, *key)))

    def _scale(self, share: np.ndarray) -> tuple[float, float]:
        """``sum lam`` whose expected nonzeros are ``nnz``, and that estimate.

        With ``p_i = m_i / sum lam`` (the model normalized), expected nonzeros are
        ``f(S) = sum_i (1 - exp(-S p_i)) = E_{i ~ p}[(1 - exp(-S p_i)) / p_i]``: a mean over cells
        drawn from the model, increasing in S, at most S. It is solved for ``f(S) = nnz``."""
        rng = self._rng(1)
        comp = np.sort(rng.choice(self.rank, size=PILOT_DRAWS, p=share))
        counts = np.bincount(comp, minlength=self.rank)
        coords = self._draw(rng, counts)
        p = _intensity(share, self.factors, coords)
        p = np.maximum(p, np.finfo(np.float64).tiny)

        def f(S: float) -> float:
            return float(np.mean(-np.expm1(-S * p) / p))

        lo, hi = float(self.nnz), 2.0 * self.nnz
        while f(hi) < self.nnz:
            lo, hi = hi, 2 * hi
            if hi > MAX_EVENTS_PER_NONZERO * self.nnz:
                raise ValueError(
                    f"nnz={self.nnz} is too dense for this model on shape {self.shape}: over "
                    f"{MAX_EVENTS_PER_NONZERO} counts per nonzero would be needed (popular cells "
                    f"draw counts again and again); lower nnz, skew or raise concentration"
                )
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if f(mid) < self.nnz else (lo, mid)
            if hi / lo < 1 + 1e-9:
                break
        return hi, f(hi)

    def _plan_batches(self) -> None:
        """Index ranges of the longest mode ``part`` with about ``batch_nnz`` expected events each
        (a row heavier than that is a batch of its own, drawn in pieces), and each batch's
        expected events per component."""
        p = int(np.argmax(self.shape))
        self.part = p
        Lp = self.shape[p]
        at = np.concatenate([np.zeros((self.rank, 1)), self._cdf[p]], axis=1)  # at[r, i] = sum A_p[:i, r]
        cum = at[:, 1:].T @ self.weights
        total = float(cum[-1])
        nb = max(1, min(Lp, math.ceil(total / self.batch_nnz)))
        cuts = np.searchsorted(cum, total * np.arange(1, nb) / nb, side="right") + 1
        self.bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, Lp), [Lp]])).astype(np.int64)
        self._mass = (at[:, self.bounds[1:]] - at[:, self.bounds[:-1]]).T * self.weights

    # --- drawing ---------------------------------------------------------------------------------

    def _draw(
        self, rng: np.random.Generator, counts: np.ndarray, mode: int = -1, lo: int = 0, hi: int = 0
    ) -> np.ndarray:
        """Coordinates (sum(counts), nmodes) of ``counts[r]`` events of component r each, grouped
        by component; mode ``mode``'s index in [lo, hi) (default: no mode restricted). The
        uniforms come from ``rng`` in one order, so the draw does not depend on the thread count."""
        total = int(counts.sum())
        coords = np.empty((total, len(self.shape)), dtype=np.int64)
        start = 0
        for r, k in enumerate(counts):
            k = int(k)
            if k == 0:
                continue
            for n, (cdf, guide) in enumerate(zip(self._cdf, self._guide, strict=True)):
                col = cdf[r]
                if n == mode:
                    a, b = (col[lo - 1] if lo > 0 else 0.0), col[hi - 1]
                    first, last = lo, hi - 1
                else:
                    a, b = 0.0, col[-1]
                    first, last = 0, col.shape[0] - 1
                u = rng.random(k)
                u *= b - a
                u += a
                guided_draws(col, guide[r], u, first, last, coords[start : start + k, n])
            start += k
        return coords

    @property
    def nbatches(self) -> int:
        return int(self.bounds.shape[0] - 1)

    def batch_keys(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``k``: its cells' ALTO words (nwords, n) of ``BitLayout(shape)``, ascending and
        distinct, and their counts (float64, each >= 1). The batch owns indices
        ``bounds[k]:bounds[k + 1]`` of mode ``part``, so no cell repeats across batches; it
        depends on the seed and k alone."""
        from ..format import alto_words
        from ..format.radix_sort import sort_keys

        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        rng = self._rng(2, k)
        pending = rng.poisson(self._mass[k])
        layout = self.layout
        keys = np.empty((layout.nwords, 0), dtype=np.uint64)
        counts = np.empty(0, dtype=np.int64)
        piece = 2 * self.batch_nnz
        while pending.sum() > 0:
            # at most ``piece`` events at once: a batch of one heavy row is drawn in pieces,
            # each reduced to its distinct cells before the next
            take = np.minimum(pending, np.maximum(0, piece - np.concatenate([[0], np.cumsum(pending)[:-1]])))
            pending = pending - take
            words = sort_keys(alto_words(self._draw(rng, take, self.part, lo, hi), layout), layout.total_bits)
            n_events = np.empty(words.shape[1], dtype=np.int64)
            d = _count_sorted(words, n_events)
            words, n_events = words[:, :d], n_events[:d]
            keys, counts = (words, n_events) if counts.size == 0 else _merge_counts(keys, counts, words, n_events)
        return np.ascontiguousarray(keys), counts.astype(np.float64)

    def runs(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield :meth:`batch_keys` per non-empty batch: sorted runs of ALTO words with their
        counts, which conversion merges instead of sorting (see ``AltoRunSource``)."""
        for k in range(self.nbatches):
            keys, counts = self.batch_keys(k)
            if counts.shape[0]:
                yield keys, counts

    def batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(coords int64 (n, nmodes) 0-based, counts float64 (n,))`` per non-empty batch:
        every cell with a count of at least 1, each once in the whole stream, in ALTO order within
        its batch."""
        from ..format import coords_from_words

        for keys, counts in self.runs():
            yield coords_from_words(keys, self.layout), counts

    def intensity(self, coords: np.ndarray) -> np.ndarray:
        """The model's intensity ``m`` at ``coords`` (n, nmodes)."""
        return _intensity(self.weights, self.factors, coords)


def planted_poisson(
    shape: Sequence[int],
    rank: int,
    nnz: int,
    *,
    seed: int | np.random.SeedSequence | None = None,
    skew: float | Sequence[float] = 1.3,
    concentration: float = 0.5,
    batch_nnz: int | None = None,
) -> PlantedPoisson:
    """Counts drawn from a planted rank-``rank`` Poisson CP model, about ``nnz`` nonzeros, in memory.

    See :class:`PlantedPoissonGenerator` for the parameters (stream it for large tensors) and
    :mod:`~tensorflow_ooc.synthetic.poisson_cp` for the model.

    Examples
    --------
    >>> p = planted_poisson((40, 30, 20), 4, 1500, seed=0)
    >>> p.coords.shape[1], len(p.factors), bool(np.allclose(p.factors[0].sum(axis=0), 1))
    (3, 3, True)
    """
    gen = PlantedPoissonGenerator(
        shape, rank, nnz, seed=seed, skew=skew, concentration=concentration, batch_nnz=batch_nnz
    )
    parts = list(gen.batches())
    N = len(gen.shape)
    coords = np.concatenate([c for c, _ in parts]) if parts else np.empty((0, N), dtype=np.int64)
    values = np.concatenate([v for _, v in parts]) if parts else np.empty(0)
    return PlantedPoisson(coords, values, gen.weights, gen.factors, gen.expected_nnz, gen.skew, gen.concentration)
