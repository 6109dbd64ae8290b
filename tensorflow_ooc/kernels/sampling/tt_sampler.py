"""Leverage-score sampling of orthonormal tensor-train core chains (seed 000, section 5.3).

The least-squares problem of TT-ALS for core ``j`` has the design ``A_{<j} (x) A_{>j}^T``: rows
indexed by a left multi-index ``s`` (modes ``0 .. j-1``) and a right one ``t`` (modes
``j+1 .. N-1``). With the cores before ``j`` left-orthonormal and those after it right-orthonormal
both chain matricizations are orthonormal, so a row's leverage score is its squared norm
``||L(s)||^2 ||Rt(t)||^2`` and ``s`` and ``t`` are drawn independently, each with probability
``||row||^2 / R`` (``R`` the chain's rank at core ``j``).

The left chain is drawn from core ``j-1`` down to core 0 (Algorithm 16). A uniform column ``r`` of
``A_{<j}`` starts the history vector ``h = e_r``; core ``k`` then draws its slice ``t`` with
probability ``||A_k[:, t, :] h||^2 / ||h||^2`` (equation 5.3) and updates ``h <- A_k[:, t, :] h``.
Lemma 5.3.2: marginalized over ``r`` this is the squared-row-norm distribution (Lemma 5.3.1's
history matrix replaced by one column of it, so a step costs matrix-vector products).

The slice mass is the sum of ``R_{k-1}`` consecutive entries of ``(A_k^L h)^2`` with ``A_k^L`` the
core's slice-major matricization (row ``t R_{k-1} + a`` = ``A_k[a, t, :]``): a row of ``A_k^L`` is
drawn by the Khatri-Rao sampler's :class:`~.krp_sampler.RowTree` walk (Corollary 5.3.3;
:func:`~.krp_sampler.draw_rows`, batched over all draws level by level, draws of one history
sharing their products) and divided by ``R_{k-1}``: ``O(R_k^2 log(I_k R_{k-1} / R_k))`` a draw.

The first core drawn has no history: marginalized over ``r`` its slices have probability
``||A_{j-1}[:, t, :]||_F^2 / R_{j-1}``, drawn by inverse CDF (the slice masses' cumulative sums are
kept beside the tree), then ``r`` given the slice from its column masses: no walks.

The right chain is the mirror image: the cores after ``j`` transposed (``A_k[a, i, b] ->
A_k[b, i, a]``) and reversed are a left-orthonormal chain whose rows are ``Rt(t)^T``.

Draws repeat histories (a core's slices are drawn over and over), so each draw's history is an
index into the distinct histories, kept at unit norm (their scale does not change the next
core's distribution; without it the norms shrink by the chain's factors and can underflow).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numba as nb
import numpy as np

from .krp_sampler import RowTree, SampleSet, build_tree, draw_rows, unique_rows

SIDES = ("left", "right")


# ---------------------------------------------------------------------------------------------
# cores and trees


def check_cores(cores: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The cores as float64 C arrays; ValueError unless they form a tensor train: ``N >= 1``
    3-D cores ``(R_{k-1}, I_k, R_k)`` with matching ranks, ``R_0 = R_N = 1``, every size positive."""
    out = [np.ascontiguousarray(c, dtype=np.float64) for c in cores]
    if not out:
        raise ValueError("a tensor train needs at least one core")
    for k, c in enumerate(out):
        if c.ndim != 3 or min(c.shape) < 1:
            raise ValueError(f"core {k} must be a non-empty 3-D (R_prev, I, R_next) array, got shape {c.shape}")
        if k > 0 and c.shape[0] != out[k - 1].shape[2]:
            raise ValueError(f"core {k} has left rank {c.shape[0]}, core {k - 1} right rank {out[k - 1].shape[2]}")
    if out[0].shape[0] != 1 or out[-1].shape[2] != 1:
        raise ValueError(f"the outer ranks must be 1, got R_0 = {out[0].shape[0]}, R_N = {out[-1].shape[2]}")
    return out


def _check_target(cores: Sequence[np.ndarray], j: int) -> int:
    try:
        j = operator.index(j)
    except TypeError as e:
        raise ValueError(f"the core index j must be an integer: {e}") from None
    if not 0 <= j < len(cores):
        raise ValueError(f"core index j={j} is out of range for {len(cores)} cores")
    return j


def _check_count(count: int) -> int:
    try:
        count = operator.index(count)
    except TypeError as e:
        raise ValueError(f"count must be an integer: {e}") from None
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    return count


def mirrored(core: np.ndarray) -> np.ndarray:
    """A core with its rank axes swapped, ``(R_k, I_k, R_{k-1})``: a right-orthonormal core becomes a
    left-orthonormal one (a view)."""
    return core.transpose(2, 1, 0)


def _mirrored_chain(cores: Sequence[np.ndarray], j: int) -> list[np.ndarray]:
    """The right chain of target core ``j`` as a left chain: cores ``N-1 .. j+1`` mirrored, as C
    arrays (the kernels read a slice's rows contiguously)."""
    return [np.ascontiguousarray(mirrored(cores[k])) for k in range(len(cores) - 1, j, -1)]


def slice_rows(core: np.ndarray, side: str) -> np.ndarray:
    """The matrix whose rows the sampler draws from a ``side`` core: slice-major, so slice ``t``
    owns a block of consecutive rows.

    ``"left"``: ``(I R_{k-1}, R_k)``, row ``t R_{k-1} + a`` = ``core[a, t, :]`` (for a left-orthonormal
    core its columns are orthonormal). ``"right"``: ``(I R_k, R_{k-1})``, row ``t R_k + b`` =
    ``core[:, t, b]`` (the left rows of :func:`mirrored`)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    c = core if side == "left" else mirrored(core)
    Ra, I, Rb = c.shape
    return np.ascontiguousarray(c.transpose(1, 0, 2).reshape(I * Ra, Rb), dtype=np.float64)


@dataclass
class CoreTree:
    """The sampling structure of one orthonormal core (Algorithm 15, one core).

    Attributes
    ----------
    side : str
        ``"left"`` (for a left-orthonormal core, sampled in the chain left of the target core) or
        ``"right"`` (right-orthonormal, right of it).
    shape : tuple of int
        The core's shape ``(R_{k-1}, I_k, R_k)`` when built.
    rows : float64 (I_k R_a, R_b)
        :func:`slice_rows` of the core for ``side``: the matrix the tree was built on.
    tree : RowTree
        Segment tree of partial Gram matrices over ``rows`` (walked for draws with a history).
    colmass : float64 (I_k, R_b)
        ``colmass[t, b]``: the squared norm of column ``b`` of slice ``t`` (rows ``t R_a ..`` of
        ``rows``). The first core drawn has no history: its slice is drawn from the row sums by
        inverse CDF (``cdf``), then the column given the slice.
    cdf : float64 (I_k,)
        Cumulative squared Frobenius norms of the core's slices.
    """

    side: str
    shape: tuple[int, int, int]
    rows: np.ndarray
    tree: RowTree
    colmass: np.ndarray
    cdf: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.tree.nbytes + self.colmass.nbytes + self.cdf.nbytes)


def build_core_tree(core: np.ndarray, side: str, leaf_rows: int | None = None) -> CoreTree:
    """Build a core's :class:`CoreTree`; rebuild it whenever the core changes.

    Cost ``O(I_k R_a R_b^2)`` (``R_a, R_b`` = ``R_{k-1}, R_k`` for ``"left"``, swapped for
    ``"right"``: the tree's partial Grams are ``R_b x R_b`` over ``I_k R_a`` rows), memory about
    twice the core's (:func:`~.krp_sampler.build_tree`'s default leaves hold ``2 R_b`` to ``4 R_b``
    rows, so the tree is no larger than the rows it covers).

    Parameters
    ----------
    core : (R_{k-1}, I_k, R_k) array
    side : "left" or "right"
    leaf_rows : int, optional
        Passed to :func:`~.krp_sampler.build_tree`.
    """
    core = np.asarray(core, dtype=np.float64)
    if core.ndim != 3 or min(core.shape) < 1:
        raise ValueError(f"a core must be a non-empty 3-D array, got shape {core.shape}")
    rows = slice_rows(core, side)
    Rb = rows.shape[1]
    sq = rows.reshape(core.shape[1], -1, Rb)
    colmass = np.einsum("tab,tab->tb", sq, sq)
    tree = build_tree(rows, leaf_rows)
    return CoreTree(side, tuple(int(s) for s in core.shape), rows, tree, colmass, np.cumsum(colmass.sum(axis=1)))


def chain_trees(cores: Sequence[np.ndarray], j: int, leaf_rows: int | None = None) -> list[CoreTree | None]:
    """The trees both chains of target core ``j`` use: ``"left"`` trees of the cores before ``j``,
    ``"right"`` trees of those after it, None at ``j``. ``O(sum_k I_k R_{k-1} R_k max(R_{k-1}, R_k))``;
    ``leaf_rows`` as for :func:`build_core_tree`.

    In a sweep only the core just updated (and orthonormalized) needs a new tree; the others keep
    theirs while their side and values are unchanged."""
    cores = check_cores(cores)
    j = _check_target(cores, j)
    return [
        None if k == j else build_core_tree(c, "left" if k < j else "right", leaf_rows) for k, c in enumerate(cores)
    ]


# ---------------------------------------------------------------------------------------------
# kernels


@nb.njit(parallel=True, nogil=True, cache=True)
def _times_slices(v, core, t, out):
    """``out[d] = v[d] @ core[:, t[d], :]`` (a row vector through the slice of each draw)."""
    Ra, _, Rb = core.shape
    for d in nb.prange(t.shape[0]):
        for b in range(Rb):
            out[d, b] = 0.0
        for a in range(Ra):
            x = v[d, a]
            for b in range(Rb):
                out[d, b] += x * core[a, t[d], b]


@nb.njit(parallel=True, nogil=True, cache=True)
def _slices_times(core, t, h, out):
    """``out[d] = core[:, t[d], :] @ h[d]``, scaled to unit norm (the history through one more
    core; its scale does not matter to the draws)."""
    Ra, _, Rb = core.shape
    for d in nb.prange(t.shape[0]):
        nrm = 0.0
        for a in range(Ra):
            s = 0.0
            for b in range(Rb):
                s += core[a, t[d], b] * h[d, b]
            out[d, a] = s
            nrm += s * s
        if nrm > 0.0:
            inv = 1.0 / np.sqrt(nrm)
            for a in range(Ra):
                out[d, a] *= inv


def _chain_rows(chain: Sequence[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Rows ``chain[0][0, i_0, :] @ chain[1][:, i_1, :] @ ...`` of a left chain at the multi-indices
    ``idx`` (S, len(chain)), in that order (left to right)."""
    v = np.ones((idx.shape[0], 1))
    for k, c in enumerate(chain):
        out = np.empty((idx.shape[0], c.shape[2]))
        _times_slices(v, c, np.ascontiguousarray(idx[:, k], dtype=np.int64), out)
        v = out
    return v


# ---------------------------------------------------------------------------------------------
# draws


def _first_core(colmass: np.ndarray, cdf: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draws from the first core of a left chain (no history; its :class:`CoreTree`'s ``colmass``
    and ``cdf``): the slice ``t`` from the marginal by inverse CDF with ``x[:, 0]``, then the column
    ``r`` given ``t`` (mass ``colmass[t, r] = ||core[:, t, r]||^2``) with ``x[:, 1]``. Slices and
    columns of zero mass are never drawn."""
    total = cdf[-1]
    if not total > 0.0:
        raise ValueError("the core drawn first is zero: the chain has no rows of positive norm")
    mass = np.diff(cdf, prepend=0.0)
    last = int(np.flatnonzero(mass > 0.0)[-1])
    # side="right" skips slices of zero mass (their cdf equals the previous one's); a target
    # rounded up to the total lands past the end and goes to the last slice with mass
    t = np.minimum(np.searchsorted(cdf, x[:, 0] * total, side="right"), last)
    ut, inv = _distinct(t)
    cm = colmass[ut]  # (distinct slices, R_b)
    cum = np.cumsum(cm, axis=1)
    lastcol = cm.shape[1] - 1 - np.argmax(cm[:, ::-1] > 0.0, axis=1)
    target = x[:, 1] * cum[inv, -1]
    r = np.minimum(np.sum(cum[inv] <= target[:, None], axis=1), lastcol[inv])
    return t.astype(np.int64), r.astype(np.int64)


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (sorted) and each key's index into them."""
    u, inv = np.unique(keys, return_inverse=True)
    return u, inv.reshape(-1).astype(np.int64)


def _draw_chain(chain: Sequence[np.ndarray], trees: Sequence[CoreTree], count: int, rng: np.random.Generator):
    """``count`` rows of the left-orthonormal chain ``chain`` (cores ``(R_a, I, R_b)``, ``R_a = 1``
    for ``chain[0]``) drawn by squared row norm, cores from the last to the first: int64
    (count, len(chain)) indices. ``trees[k]`` is the left tree of ``chain[k]``; the last core only
    uses its ``colmass`` and ``cdf``."""
    m = len(chain)
    idx = np.empty((count, m), dtype=np.int64)
    last = chain[m - 1]
    t, r = _first_core(trees[m - 1].colmass, trees[m - 1].cdf, rng.random((count, 2)))
    idx[:, m - 1] = t
    if m == 1:
        return idx
    Rb = last.shape[2]
    pairs, hid = _distinct(t * Rb + r)
    Hd = np.ascontiguousarray(last[:, pairs // Rb, pairs % Rb].T)  # (distinct, R_a): h = A[:, t, r]
    Hd /= np.linalg.norm(Hd, axis=1, keepdims=True)
    for k in range(m - 2, -1, -1):
        core = chain[k]
        Ra, I, _ = core.shape
        row = draw_rows(trees[k].rows, trees[k].tree, Hd, hid, rng.random(count))
        t = row // Ra
        idx[:, k] = t
        if k > 0:
            pairs, hid = _distinct(hid * I + t)
            H = np.empty((pairs.shape[0], Ra))
            _slices_times(core, pairs % I, np.ascontiguousarray(Hd[pairs // I]), H)
            Hd = H
    return idx


def _side_trees(
    cores: Sequence[np.ndarray], ks: Sequence[int], side: str, trees: Sequence[CoreTree | None] | None
) -> list[CoreTree]:
    """The ``side`` trees of cores ``ks``: the given ones (checked against the cores' shapes and
    side), built for missing entries."""
    if trees is not None and len(trees) != len(cores):
        raise ValueError(f"got {len(trees)} trees for {len(cores)} cores")
    out = []
    for k in ks:
        tr = None if trees is None else trees[k]
        if tr is None:
            tr = build_core_tree(cores[k], side)
        elif tr.side != side or tr.shape != cores[k].shape:
            raise ValueError(
                f"the tree of core {k} was built as a {tr.side} tree of a {tr.shape} core; "
                f"a {side} tree of a {cores[k].shape} core is needed"
            )
        out.append(tr)
    return out


def _left_draws(cores, j, count, rng, trees) -> np.ndarray:
    """Indices (count, j) of :func:`draw_left_chain` (checked arguments)."""
    if j == 0:
        return np.zeros((count, 0), dtype=np.int64)
    return _draw_chain(cores[:j], _side_trees(cores, range(j), "left", trees), count, rng)


def _right_draws(cores, j, count, rng, trees) -> np.ndarray:
    """Indices (count, N-1-j) of :func:`draw_right_chain`, in mode order (checked arguments)."""
    N = len(cores)
    if j == N - 1:
        return np.zeros((count, 0), dtype=np.int64)
    ts = _side_trees(cores, range(N - 1, j, -1), "right", trees)
    return np.ascontiguousarray(_draw_chain(_mirrored_chain(cores, j), ts, count, rng)[:, ::-1])


def _check_indices(indices: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    """``indices`` as int64 (S, len(dims)); ValueError for another shape or an index out of range
    (the kernels do not check bounds)."""
    idx = np.asarray(indices)
    if idx.ndim != 2 or idx.shape[1] != len(dims) or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"indices must be an integer (S, {len(dims)}) array, got {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (np.any(idx < 0) or np.any(idx >= np.asarray(dims, dtype=np.int64))):
        raise ValueError(f"indices out of range for mode lengths {list(dims)}")
    return idx


def left_chain_rows(cores: Sequence[np.ndarray], j: int, indices: np.ndarray) -> np.ndarray:
    """Rows ``L(s) = A_0[:, s_0, :] @ ... @ A_{j-1}[:, s_{j-1}, :]`` (S, R_{j-1}) of the left chain
    of target core ``j`` at multi-indices ``indices`` (S, j); for ``j = 0``, ones (S, 1)."""
    cores = check_cores(cores)
    j = _check_target(cores, j)
    return _chain_rows(cores[:j], _check_indices(indices, [c.shape[1] for c in cores[:j]]))


def right_chain_rows(cores: Sequence[np.ndarray], j: int, indices: np.ndarray) -> np.ndarray:
    """Rows ``Rt(t)^T`` (S, R_j) of the right chain of target core ``j``, ``Rt(t) = A_{j+1}[:, t_{j+1}, :]
    @ ... @ A_{N-1}[:, t_{N-1}, :]``, at multi-indices ``indices`` (S, N-1-j) (modes ``j+1 ..``);
    for ``j = N-1``, ones (S, 1)."""
    cores = check_cores(cores)
    j = _check_target(cores, j)
    indices = _check_indices(indices, [c.shape[1] for c in cores[j + 1 :]])
    return _chain_rows(_mirrored_chain(cores, j), indices[:, ::-1])


def draw_left_chain(
    cores: Sequence[np.ndarray],
    j: int,
    count: int,
    rng: np.random.Generator,
    trees: Sequence[CoreTree | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``count`` rows of the left chain matricization ``A_{<j}`` of target core ``j`` with
    probability ``||L(s)||^2 / R_{j-1}`` (their leverage scores over ``R_{j-1}``).

    Parameters
    ----------
    cores : sequence of N float64 (R_{k-1}, I_k, R_k) arrays
        The tensor train; cores ``0 .. j-1`` must be left-orthonormal (``reshape(R_{k-1} I_k, R_k)``
        has orthonormal columns: not checked, the draws assume it).
    j : int
        The target core (0-based); ``j = 0`` has an empty left chain.
    count : int
        Number of draws ``J``.
    rng : numpy Generator
        Source of the uniforms (the same draws for any thread count).
    trees : sequence of N CoreTree or None, optional
        ``"left"`` :class:`CoreTree` of cores ``< j`` (e.g. from :func:`chain_trees`), current with
        their cores; missing ones are built here (``O(I R^3)`` each) and thrown away.

    Returns
    -------
    indices : int64 (count, j)
        Column ``k``: the index of mode ``k``.
    probs : float64 (count,)
        Each draw's probability ``||L(s)||^2 / R_{j-1}`` (ones for ``j = 0``).

    Cost per draw ``O(sum_k R_k^2 log(I_k R_{k-1} / R_k))`` (core ``j-1`` by inverse CDF:
    ``O(log I + R_{j-1})``), plus ``O(sum_k R_{k-1} R_k)`` for the histories and the probabilities.
    """
    cores = check_cores(cores)
    j = _check_target(cores, j)
    idx = _left_draws(cores, j, _check_count(count), rng, trees)
    rows = _chain_rows(cores[:j], idx)
    return idx, np.einsum("sr,sr->s", rows, rows) / rows.shape[1]


def draw_right_chain(
    cores: Sequence[np.ndarray],
    j: int,
    count: int,
    rng: np.random.Generator,
    trees: Sequence[CoreTree | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``count`` rows of the right chain ``A_{>j}^T`` of target core ``j`` with probability
    ``||Rt(t)||^2 / R_j``: the mirror of :func:`draw_left_chain` (cores ``N-1`` down to ``j+1``
    transposed, drawn from core ``j+1`` outwards).

    Parameters
    ----------
    cores, j, count, rng
        As for :func:`draw_left_chain`; cores ``j+1 .. N-1`` must be right-orthonormal
        (``reshape(R_{k-1}, I_k R_k)`` has orthonormal rows).
    trees : sequence of N CoreTree or None, optional
        ``"right"`` :class:`CoreTree` of cores ``> j``; missing ones are built here.

    Returns
    -------
    indices : int64 (count, N-1-j)
        Column ``c``: the index of mode ``j+1+c``.
    probs : float64 (count,)
        ``||Rt(t)||^2 / R_j`` (ones for ``j = N-1``).
    """
    cores = check_cores(cores)
    j = _check_target(cores, j)
    idx = _right_draws(cores, j, _check_count(count), rng, trees)
    rows = _chain_rows(_mirrored_chain(cores, j), idx[:, ::-1])
    return idx, np.einsum("sr,sr->s", rows, rows) / rows.shape[1]


def design_rows(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Rows ``kron(L(s), Rt(t))`` (S, R_{j-1} R_j) of the design ``A_{<j} (x) A_{>j}^T``: entry
    ``a R_j + b`` is ``L[a] Rt[b]``, so the model value ``X[s, i, t]`` is the row times
    ``core_j[:, i, :].ravel()``."""
    return (left[:, :, None] * right[:, None, :]).reshape(left.shape[0], -1)


def draw_core_samples(
    cores: Sequence[np.ndarray],
    j: int,
    count: int,
    rng: np.random.Generator,
    trees: Sequence[CoreTree | None] | None = None,
) -> SampleSet:
    """Draw ``count`` rows of the design ``A_{<j} (x) A_{>j}^T`` of core ``j`` by their leverage
    scores (left and right multi-indices drawn independently), merged into a :class:`SampleSet`.

    Parameters
    ----------
    cores, j, count, rng
        As for :func:`draw_left_chain` (cores before ``j`` left-, after ``j`` right-orthonormal).
    trees : sequence of N CoreTree or None, optional
        Left trees before ``j``, right trees after it (:func:`chain_trees`).

    Returns
    -------
    SampleSet
        ``coords`` (S, N): distinct multi-indices (column ``j`` is 0), sorted; ``rows`` (S,
        R_{j-1} R_j): their design rows (:func:`design_rows`); ``probs``: ``p_s p_t``; ``weights``:
        ``counts / (count p_s p_t)``, the squares of the sketch's row weights ``1 / sqrt(J p)``
        summed over repeated draws, so ``rows^T diag(weights) rows`` is the sketched Gram (``I`` in
        expectation).
    """
    cores = check_cores(cores)
    j = _check_target(cores, j)
    count = _check_count(count)
    left = _left_draws(cores, j, count, rng, trees)
    right = _right_draws(cores, j, count, rng, trees)
    coords, counts = unique_rows(np.concatenate([left, np.zeros((count, 1), dtype=np.int64), right], axis=1))
    L = _chain_rows(cores[:j], coords[:, :j])
    Rt = _chain_rows(_mirrored_chain(cores, j), coords[:, :j:-1])
    probs = np.einsum("sr,sr->s", L, L) * np.einsum("sr,sr->s", Rt, Rt) / (L.shape[1] * Rt.shape[1])
    if not np.all(probs > 0):
        raise RuntimeError("a drawn design row has zero norm (the chains are not orthonormal, or broke down)")
    return SampleSet(
        mode=j,
        coords=coords,
        weights=counts / (count * probs),
        rows=design_rows(L, Rt),
        draws=count,
        counts=counts,
        probs=probs,
        deterministic=np.zeros(coords.shape[0], dtype=bool),
    )
