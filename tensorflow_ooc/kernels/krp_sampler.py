"""Exact leverage-score sampling of Khatri-Rao product rows: STS-CP (seed 000, chapter 3).

Randomized CP-ALS solves the mode-``j`` least-squares problem on a few rows of its design matrix
``A``, the Khatri-Rao product of all factors except ``U_j``. Drawing rows with probability
proportional to their leverage scores ``l_s = a_s pinv(A^T A) a_s^T`` needs only ``O(R / (eps delta))``
rows for a ``(1 + eps)``-accurate solve, but ``A`` has ``prod I_k`` rows and is never formed.

STS-CP draws the multi-index one mode at a time, each conditioned on the rows already drawn
(Theorem 3.3.1): with ``h`` the Hadamard product of the rows drawn so far and
``G_>k = pinv(G) * (Hadamard product of the Grams of the modes after k)``, row ``t`` of ``U_k`` has
probability proportional to ``(h * U_k[t]) G_>k (h * U_k[t])^T``. Writing ``G_>k = V diag(lam) V^T``
splits that into a mixture of rank-one distributions, drawn in two stages:

1. the eigen-component ``u``, from a small tree over the rows of ``sqrt(lam) V^T`` weighted by ``G_k``;
2. the row ``t``, from the factor's :class:`RowTree` (partial Gram matrices of row segments) with the
   query vector ``h * V[:, u]``, by a walk down the tree and a scan of the rows of one leaf.

Each draw costs ``O(R^2 log I_k)`` per mode. The trees hold about ``I R`` floats per factor and are
rebuilt (:func:`build_tree`, ``O(I R^2)``) whenever the factor changes.

:class:`SampleSet`, the result type, is shared with the CP-ARLS-LEV sampler in ``arls_lev``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

# Eigenvalues of a Gram matrix at or below PINV_RTOL times the largest count as zero in the
# pseudo-inverses here. Where a Gram is exactly singular (a factor with fewer rows than columns,
# collinear columns, a rank-deficient product) rounding leaves eigenvalues of up to about 1e-15 of
# the largest, more for long factors and Hadamard products of several Grams; numpy's default
# cutoff (R * eps, about 1e-15) leaves no margin, and noise that passes it becomes a huge spurious
# leverage score. 1e-12 keeps a wide margin and still resolves condition numbers of A up to 1e6.
PINV_RTOL = 1e-12

_BELOW_ONE = float(np.nextafter(1.0, 0.0))

# Samples per parallel work item of the draw kernel: enough to amortize the scratch allocations.
_BLOCK = 64


@dataclass
class SampleSet:
    """Distinct sampled rows of the Khatri-Rao product of all factors except ``mode``, for a
    sketched least-squares solve of mode ``mode``.

    Attributes
    ----------
    mode : int
        The excluded (target) mode ``j``.
    coords : int64 (S, N)
        Distinct sampled multi-indices, column ``mode`` set to 0, sorted lexicographically.
    weights : float64 (S,)
        Sketch weight of each distinct row, ``counts[s] / (J * probs[s])`` (duplicates merged).
        Hybrid CP-ARLS-LEV: deterministic rows weigh 1, random rows
        ``counts[s] * (1 - p_det) / (J_rand * probs[s])``.
    rows : float64 (S, R)
        The Khatri-Rao row of each sample: Hadamard product of ``U_k[coords[s, k]]`` over
        ``k != mode``.
    draws : int
        ``J``, the number of draws made (before merging duplicates); for hybrid CP-ARLS-LEV the
        deterministic rows count as one draw each.
    counts : int64 (S,), optional
        How often each distinct row was drawn (1 for deterministic rows); sums to ``draws``.
    probs : float64 (S,), optional
        Probability of each row under the sampling distribution (before any hybrid restriction).
    deterministic : bool (S,), optional
        Rows included deterministically (hybrid CP-ARLS-LEV); all False otherwise.
    """

    mode: int
    coords: np.ndarray
    weights: np.ndarray
    rows: np.ndarray
    draws: int
    counts: np.ndarray | None = None
    probs: np.ndarray | None = None
    deterministic: np.ndarray | None = None

    def gram(self) -> np.ndarray:
        """The sketched Gram matrix ``sum_s weights[s] rows[s]^T rows[s]`` (R, R); its expectation
        over the draws is ``A^T A``."""
        return (self.rows * self.weights[:, None]).T @ self.rows

    def __len__(self) -> int:
        return int(self.coords.shape[0])


@dataclass
class RowTree:
    """Segment tree of partial Gram matrices over the rows of one factor ``U`` (I, R) (Lemma 3.3.2
    with ``Y`` all-ones).

    A complete binary tree with ``nleaves`` (a power of two) leaves in heap layout: node 0 is the
    root, node ``v`` has children ``2v+1`` and ``2v+2``, leaf ``l`` is node ``nleaves - 1 + l`` and
    holds rows ``l * leaf_rows`` up to ``min((l + 1) * leaf_rows, nrows)`` (none for padded leaves).

    Attributes
    ----------
    grams : float64 (2 * nleaves - 1, R, R)
        ``grams[v] = sum of U[i]^T U[i]`` over the rows ``i`` below node ``v``.
    leaf_rows : int
        Rows per leaf ``F``.
    nleaves : int
        Leaves ``P``.
    nrows : int
        Rows ``I`` of the factor.
    """

    grams: np.ndarray
    leaf_rows: int
    nleaves: int
    nrows: int

    @property
    def gram(self) -> np.ndarray:
        """``U^T U`` (the root)."""
        return self.grams[0]

    @property
    def rank(self) -> int:
        return int(self.grams.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.grams.nbytes)


# ---------------------------------------------------------------------------------------------
# kernels


@nb.njit(parallel=True, nogil=True, cache=True)
def _leaf_grams(U, F, P, grams):
    """Partial Gram matrix of every leaf.

    Parameters
    ----------
    U : float64 (I, R) C array      the factor
    F : int                         rows per leaf
    P : int                         leaves; leaf ``l`` is node ``P - 1 + l`` and holds rows
                                    ``l F .. min((l+1) F, I) - 1``
    grams : float64 (2P-1, R, R)    output; only the leaf nodes are written

    Each leaf adds the outer product of every row (an axpy of length R per row entry). The full
    square costs twice the flops of a triangle but its fixed-length rows vectorize: 1.8x faster
    measured (10^6 x 16). It is exactly symmetric, as ``x_a x_b`` and ``x_b x_a`` are summed in the
    same order. Leaves are independent, so the result does not depend on the thread count.
    """
    I, R = U.shape
    for leaf in nb.prange(P):
        G = grams[P - 1 + leaf]
        for a in range(R):
            for b in range(R):
                G[a, b] = 0.0
        lo = min(leaf * F, I)
        hi = min(lo + F, I)
        for i in range(lo, hi):
            for a in range(R):
                x = U[i, a]
                for b in range(R):
                    G[a, b] += x * U[i, b]


@nb.njit(parallel=True, nogil=True, cache=True)
def _internal_grams(grams, P):
    """Fill the internal nodes bottom-up: ``grams[v] = grams[2v+1] + grams[2v+2]``."""
    R = grams.shape[1]
    width = P // 2
    while width >= 1:
        first = width - 1
        for o in nb.prange(width):
            v = first + o
            for a in range(R):
                for b in range(R):
                    grams[v, a, b] = grams[2 * v + 1, a, b] + grams[2 * v + 2, a, b]
        width //= 2


@nb.njit(nogil=True, cache=True)
def _quad(M, q, t):
    """``q^T M q`` for a symmetric ``M`` (R, R); ``t`` (R,) is scratch.

    Formed as ``t = M q`` by rows of ``M`` (``M[b, :] * q[b]`` added into ``t``: contiguous and
    vectorizable without reassociating a reduction), then one length-R dot product.
    """
    R = q.shape[0]
    for a in range(R):
        t[a] = 0.0
    for b in range(R):
        qb = q[b]
        for a in range(R):
            t[a] += M[b, a] * qb
    s = 0.0
    for a in range(R):
        s += q[a] * t[a]
    return s


@nb.njit(nogil=True, cache=True)
def _descend(nodes, P, nvalid, q, mass, x, t, careful):
    """Walk from the root to a leaf of a tree of node matrices by inversion sampling.

    Parameters
    ----------
    nodes : float64 (2P-1, R, R)   node matrices (heap layout); a node's mass is ``q^T nodes[v] q``
    P : int                        leaves (a power of two)
    nvalid : int                   leaves ``>= nvalid`` are padding (zero mass)
    q : float64 (R,)               query vector
    mass : float                   the root's mass, > 0
    x : float                      uniform draw in [0, 1)
    t : float64 (R,)               scratch
    careful : bool                 compute the right child's mass from its own matrix instead of
                                   parent minus left (twice the work, no cancellation)

    Returns
    -------
    (leaf, x) : the leaf reached (-1 when every child had zero mass, a rounding breakdown) and
    the draw rescaled to a uniform position inside that leaf's mass.

    Only left children are evaluated; the right mass is the parent's minus the left one, clamped
    at 0. A child of zero mass is never entered, and the uniform is rescaled at each level so it
    keeps its full precision relative to the current node.
    """
    v = 0
    lo = 0
    width = P
    m = mass
    while width > 1:
        half = width >> 1
        left = 2 * v + 1
        mL = max(_quad(nodes[left], q, t), 0.0)
        if lo + half >= nvalid:
            mR = 0.0
        elif careful:
            mR = _quad(nodes[left + 1], q, t)
        else:
            mR = m - mL
        mR = max(mR, 0.0)
        tot = mL + mR
        if not tot > 0.0:
            return -1, 0.0
        y = x * tot
        if mL > 0.0 and (y < mL or not mR > 0.0):
            x = y / mL
            v = left
            m = mL
        else:
            x = (y - mL) / mR
            v = left + 1
            lo += half
            m = mR
        x = min(max(x, 0.0), _BELOW_ONE)
        width = half
    return lo, x


@nb.njit(nogil=True, cache=True)
def _draw_row(U, grams, P, F, E, P1, lam, V, hj, d1, d2, t, ht, q, careful):
    """One two-stage draw of a row of ``U`` for the history vector ``hj``; -1 on a breakdown.

    Stage 1 draws the eigen-component ``u`` of ``G_>k`` from the tree ``E`` (``P1`` leaves, one per
    component); stage 2 draws the row from the factor's tree with query ``hj * V[:, u]`` and scans
    ``q_i = (U[i] . htilde)^2`` over the rows of the leaf reached.
    """
    I, R = U.shape
    C = _quad(E[0], hj, t)
    if not C > 0.0:
        return -1
    u, x = _descend(E, P1, R, hj, C, d1, t, careful)
    if u < 0 or not lam[u] > 0.0:
        return -1
    for a in range(R):
        ht[a] = hj[a] * V[a, u]
    m2 = _quad(grams[0], ht, t)
    if not m2 > 0.0:
        return -1
    nvalid = (I + F - 1) // F
    leaf, x = _descend(grams, P, nvalid, ht, m2, d2, t, careful)
    if leaf < 0:
        return -1
    lo = leaf * F
    hi = min(lo + F, I)
    total = 0.0
    for i in range(lo, hi):
        s = 0.0
        for a in range(R):
            s += U[i, a] * ht[a]
        q[i - lo] = s * s
        total += s * s
    if not total > 0.0:
        return -1
    # the walk's rescaled uniform locates the draw inside this leaf's own total, so rounding in
    # the node masses cannot push it past the last row
    target = x * total
    acc = 0.0
    last = -1
    for i in range(lo, hi):
        qi = q[i - lo]
        if qi > 0.0:
            last = i
            acc += qi
            if acc > target:
                return i
    return last


@nb.njit(parallel=True, nogil=True, cache=True)
def _sts_draw_mode(U, grams, P, F, E, P1, lam, V, h, uniforms, out):
    """All draws of one sampled mode (the memory-saving loop order of Algorithm 6).

    Parameters
    ----------
    U : float64 (I, R) C array           factor of this mode
    grams, P, F                          its :class:`RowTree` (node Grams, leaves, rows per leaf)
    E : float64 (2*P1-1, R, R)           stage-1 tree: node ``v`` holds
                                         ``(sum over components u below v of lam_u V[:,u] V[:,u]^T) * G_k``
    P1 : int                             stage-1 leaves (power of two >= R; leaf u is component u)
    lam : float64 (R,), V : float64 (R, R)   eigenpairs of ``G_>k`` (lam clipped at 0)
    h : float64 (J, R)                   history vectors; row ``j`` is multiplied by the row drawn
    uniforms : float64 (J, 2)            pre-drawn uniforms (stage 1, stage 2) of every sample
    out : int64 (J,)                     row drawn for each sample, -1 where both the fast and the
                                         careful walk broke down (rounding; not expected)

    Samples are independent and read only their own uniforms, so the result is the same for any
    thread count.
    """
    J, R = h.shape
    nblocks = (J + _BLOCK - 1) // _BLOCK
    for blk in nb.prange(nblocks):
        t = np.empty(R)
        ht = np.empty(R)
        q = np.empty(F)
        for j in range(blk * _BLOCK, min(J, (blk + 1) * _BLOCK)):
            hj = h[j]
            row = _draw_row(U, grams, P, F, E, P1, lam, V, hj, uniforms[j, 0], uniforms[j, 1], t, ht, q, False)
            if row < 0:
                row = _draw_row(U, grams, P, F, E, P1, lam, V, hj, uniforms[j, 0], uniforms[j, 1], t, ht, q, True)
            out[j] = row
            if row >= 0:
                for a in range(R):
                    hj[a] *= U[row, a]


@nb.njit(parallel=True, nogil=True, cache=True)
def row_quadforms(X, M, out):
    """``out[i] = X[i] M X[i]^T`` for a symmetric ``M`` (R, R), rows in parallel, no (I, R)
    temporary (leverage scores of a tall factor: ``M = pinv(U^T U)``)."""
    I, R = X.shape
    nblocks = (I + 1023) // 1024
    for blk in nb.prange(nblocks):
        t = np.empty(R)
        for i in range(blk * 1024, min(I, (blk + 1) * 1024)):
            out[i] = _quad(M, X[i], t)


# ---------------------------------------------------------------------------------------------
# shared numpy helpers (also used by arls_lev)


def psd_pinv(G: np.ndarray, rtol: float = PINV_RTOL) -> tuple[np.ndarray, int]:
    """Pseudo-inverse of a symmetric positive semidefinite ``G`` and its numerical rank.

    Eigenvalues at or below ``rtol`` times the largest count as zero (see :data:`PINV_RTOL`).
    """
    lam, V = np.linalg.eigh((G + G.T) / 2)
    top = lam.max() if lam.size else 0.0
    if not top > 0.0:
        return np.zeros_like(G), 0
    keep = lam > rtol * top
    Vk = V[:, keep]
    Gp = (Vk / lam[keep]) @ Vk.T
    return (Gp + Gp.T) / 2, int(keep.sum())


def check_factors(factors: Sequence[Any], exclude: Any, J: Any) -> tuple[list[np.ndarray], int, int]:
    """Validate the common sampler arguments.

    Returns
    -------
    (factors, exclude, J) : factors as float64 C arrays of one rank, and the checked integers.
    """
    factors = list(factors)
    N = len(factors)
    if N < 2:
        raise ValueError(f"need at least 2 factors to sample a Khatri-Rao product, got {N}")
    try:
        exclude = operator.index(exclude)
        J = operator.index(J)
    except TypeError as e:
        raise ValueError(f"exclude and J must be integers: {e}") from None
    if not 0 <= exclude < N:
        raise ValueError(f"exclude={exclude} is out of range for {N} factors")
    if J < 1:
        raise ValueError(f"J must be at least 1, got {J}")
    out = []
    for k, f in enumerate(factors):
        f = np.ascontiguousarray(f, dtype=np.float64)
        if f.ndim != 2:
            raise ValueError(f"factor of mode {k} must be 2-D, got shape {f.shape}")
        out.append(f)
    ranks = [f.shape[1] for f in out]
    if len(set(ranks)) != 1:
        raise ValueError(f"factors have mismatched ranks (columns) {ranks}")
    if ranks[0] < 1:
        raise ValueError("factors must have at least one column")
    for k, f in enumerate(out):
        if k != exclude and f.shape[0] < 1:
            raise ValueError(f"factor of mode {k} has no rows: the Khatri-Rao product is empty")
    return out, exclude, J


def check_gram(G: np.ndarray, mode: int) -> None:
    """Reject a factor that is entirely zero (or not finite), which makes the product zero."""
    if not np.all(np.isfinite(G)):
        raise ValueError(f"factor of mode {mode} has non-finite entries")
    if not np.any(np.diag(G) > 0):
        raise ValueError(f"factor of mode {mode} is entirely zero: the Khatri-Rao product is zero")


def unique_rows(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of an int array (J, N), sorted lexicographically, and how often each occurs.

    Same result as ``np.unique(idx, axis=0, return_counts=True)``, several times faster (a
    ``lexsort`` of the columns instead of a sort of row-sized byte strings).
    """
    if idx.shape[0] == 0:
        return idx.copy(), np.zeros(0, dtype=np.int64)
    order = np.lexsort(idx.T[::-1])
    s = idx[order]
    new = np.ones(s.shape[0], dtype=bool)
    new[1:] = np.any(s[1:] != s[:-1], axis=1)
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, s.shape[0])).astype(np.int64)
    return s[starts], counts


def krp_rows(factors: Sequence[np.ndarray], coords: np.ndarray, exclude: int) -> np.ndarray:
    """Rows of the Khatri-Rao product at ``coords`` (S, N): Hadamard products over ``k != exclude``
    in increasing ``k`` (the order the draw kernels multiply in)."""
    rows = np.ones((coords.shape[0], factors[0].shape[1]))
    for k, f in enumerate(factors):
        if k != exclude:
            rows *= f[coords[:, k]]
    return rows


# ---------------------------------------------------------------------------------------------
# public API


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def build_tree(U: np.ndarray, leaf_rows: int | None = None) -> RowTree:
    """Build the :class:`RowTree` of a factor in ``O(I R^2)`` (Algorithm 7, ``Y`` all-ones).

    Parameters
    ----------
    U : (I, R) array
        The factor (converted to float64).
    leaf_rows : int, optional
        Rows per leaf. By default the leaf count is the power of two that puts ``ceil(I / P)`` in
        about ``[2R, 4R)``, so the tree holds at most about ``I R`` floats, no more than ``U``
        (one leaf when ``I < 4R``). A given value is a maximum: the leaves are then the next power
        of two of ``ceil(I / leaf_rows)`` and the rows are spread evenly over them.

    Returns
    -------
    RowTree
    """
    U = np.ascontiguousarray(U, dtype=np.float64)
    if U.ndim != 2:
        raise ValueError(f"factor must be 2-D, got shape {U.shape}")
    I, R = U.shape
    if I < 1 or R < 1:
        raise ValueError(f"factor must have at least one row and one column, got shape {U.shape}")
    if leaf_rows is None:
        P = 1
        while 2 * P * 2 * R <= I:
            P *= 2
    else:
        leaf_rows = operator.index(leaf_rows)
        if leaf_rows < 1:
            raise ValueError(f"leaf_rows must be at least 1, got {leaf_rows}")
        P = _pow2_at_least(-(-I // leaf_rows))
    F = -(-I // P)
    grams = np.empty((2 * P - 1, R, R))
    _leaf_grams(U, F, P, grams)
    _internal_grams(grams, P)
    return RowTree(grams=grams, leaf_rows=int(F), nleaves=int(P), nrows=int(I))


def _eigen_tree(lam: np.ndarray, V: np.ndarray, Gk: np.ndarray) -> tuple[np.ndarray, int]:
    """Stage-1 tree (Algorithm 7 with ``U = sqrt(lam) V^T``, ``F = 1``, ``Y = G_k`` baked in): leaf
    ``u`` holds ``lam_u (V[:,u] V[:,u]^T) * G_k``, internal nodes the sums of their children."""
    R = lam.shape[0]
    P1 = _pow2_at_least(R)
    E = np.zeros((2 * P1 - 1, R, R))
    E[P1 - 1:P1 - 1 + R] = np.einsum("u,au,bu->uab", lam, V, V) * Gk
    width = P1 // 2
    while width >= 1:
        v = np.arange(width - 1, 2 * width - 1)
        E[v] = E[2 * v + 1] + E[2 * v + 2]
        width //= 2
    return E, P1


def sts_sample(factors: Sequence[np.ndarray], trees: Sequence[RowTree | None] | None, exclude: int, J: int,
               seed: Any = None) -> SampleSet:
    """Draw ``J`` rows of the Khatri-Rao product of all factors except ``exclude`` from its exact
    leverage-score distribution (STS-CP, Algorithm 6, memory-saving loop order).

    Parameters
    ----------
    factors : sequence of (I_k, R) arrays
        All ``N >= 2`` factor matrices (``factors[exclude]`` only fixes ``N`` and ``R``).
    trees : sequence of RowTree or None, or None
        ``trees[k] = build_tree(factors[k])`` for the sampled modes, current with the factor (rebuild
        it after the factor changes). ``None`` entries of sampled modes (all, for ``trees=None``)
        are built here and thrown away; ``trees[exclude]`` is not used.
    exclude : int
        The target mode ``j``.
    J : int
        Number of draws.
    seed : int, None, numpy SeedSequence or Generator
        Source of the uniforms; with a fixed seed the result is identical for any thread count.

    Returns
    -------
    SampleSet
        Distinct rows with weights ``counts / (J p_s)``, ``p_s = h_s pinv(G) h_s^T / trace(pinv(G) G)``
        the exact normalized leverage score of row ``h_s``.

    Raises
    ------
    ValueError
        Bad arguments, a tree that does not fit its factor, a sampled factor that is entirely zero
        (or not finite), or a zero Khatri-Rao product.
    RuntimeError
        A draw broke down in rounding (a zero-mass walk even when recomputing both children's
        masses; not expected for finite factors).
    """
    factors, exclude, J = check_factors(factors, exclude, J)
    N = len(factors)
    R = factors[0].shape[1]
    trees = [None] * N if trees is None else list(trees)
    if len(trees) != N:
        raise ValueError(f"got {len(trees)} trees for {N} factors")
    ks = [k for k in range(N) if k != exclude]
    for k in ks:
        if trees[k] is None:
            trees[k] = build_tree(factors[k])
        tree = trees[k]
        if tree.nrows != factors[k].shape[0] or tree.rank != R:
            raise ValueError(f"tree of mode {k} was built for a ({tree.nrows}, {tree.rank}) factor, "
                             f"the factor is {factors[k].shape}")
        check_gram(tree.gram, k)

    G = np.ones((R, R))
    for k in ks:
        G *= trees[k].gram
    Gp, rank = psd_pinv(G)
    if rank == 0:
        raise ValueError(f"the Khatri-Rao product of modes {ks} is zero (no row has nonzero leverage)")

    rng = np.random.default_rng(seed)
    h = np.ones((J, R))
    idx = np.zeros((J, N), dtype=np.int64)
    out = np.empty(J, dtype=np.int64)
    for pos, k in enumerate(ks):
        after = np.ones((R, R))
        for k2 in ks[pos + 1:]:
            after *= trees[k2].gram
        lam, V = np.linalg.eigh(Gp * after)
        lam = np.maximum(lam, 0.0)
        V = np.ascontiguousarray(V)
        E, P1 = _eigen_tree(lam, V, trees[k].gram)
        uniforms = rng.random((J, 2))
        tree = trees[k]
        _sts_draw_mode(factors[k], tree.grams, tree.nleaves, tree.leaf_rows, E, P1, lam, V, h, uniforms, out)
        if np.any(out < 0):
            raise RuntimeError(f"leverage sampling of mode {k} broke down numerically "
                               f"({int(np.sum(out < 0))} of {J} draws)")
        idx[:, k] = out

    coords, counts = unique_rows(idx)
    rows = krp_rows(factors, coords, exclude)
    probs = np.empty(coords.shape[0])
    row_quadforms(rows, Gp, probs)
    probs /= np.sum(Gp * G)
    if not np.all(probs > 0):
        raise RuntimeError("a drawn row has zero leverage score (numerical breakdown)")
    return SampleSet(mode=exclude, coords=coords, weights=counts / (J * probs), rows=rows, draws=J,
                     counts=counts, probs=probs,
                     deterministic=np.zeros(coords.shape[0], dtype=bool))
