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
rebuilt (:func:`build_tree`, ``O(I R^2)``) whenever the factor changes. The first mode drawn has
no history, so its draws share one distribution: it is computed for every row at once
(``O(I R^2)``, :func:`marginal_mode`) and drawn by inverse CDF, without walks.

Draws repeat rows (65536 draws on nell2-shaped factors hold about 2 k distinct rows of a mode), so
each draw's history is an index into the distinct histories: stage 1 is computed once per history
for all components (:func:`_components_by_history`) where that is cheaper than the walks, and
draws of one query share its products in the walks and leaf scans.

All draws of a mode walk the trees together, level by level (:func:`_walk`): the draws at one node
are a contiguous group, and the masses ``q^T M_v q`` of a group come from matrix products (the
group's query rows times the node matrix) instead of one matrix-vector product per draw, so each
node matrix is read once per chunk of draws and the arithmetic runs at matrix-product speed.
Per draw the decisions are those of Algorithm 6, so the draws for a seed are those of a walk one
draw at a time up to rounding in the masses. 65536 draws on nell2-shaped factors, 2 cores:
4.4x faster than one draw at a time at R = 50, 2.4x at R = 25, 1.9x at R = 16 (per draw the same
flops; the products run several times faster than matrix-vector products, and read each node
once per chunk).

:class:`SampleSet`, the result type, is shared with the CP-ARLS-LEV sampler in ``arls_lev``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from ...blas_threads import one_blas_thread
from ...format.radix_sort import sort_keys

# Eigenvalues of a Gram matrix at or below PINV_RTOL times the largest count as zero in the
# pseudo-inverses here. Where a Gram is exactly singular (a factor with fewer rows than columns,
# collinear columns, a rank-deficient product) rounding leaves eigenvalues of up to about 1e-15 of
# the largest, more for long factors and Hadamard products of several Grams; numpy's default
# cutoff (R * eps, about 1e-15) leaves no margin, and noise that passes it becomes a huge spurious
# leverage score. 1e-12 keeps a wide margin and still resolves condition numbers of A up to 1e6.
PINV_RTOL = 1e-12

_BELOW_ONE = float(np.nextafter(1.0, 0.0))

# Stage 1 (the eigen-component) is drawn from each distinct history's whole distribution
# (2 R^3 flops a history) where D R <= STAGE1_BY_HISTORY J (log2 P1 + 1), D distinct histories,
# else by J walks of the stage-1 tree (about 2 R^2 (log2 P1 + 1) flops a draw).
STAGE1_BY_HISTORY = 1.0

# Draws per matrix product of the batched walk (at most; fewer where R is large, see
# _DRAW_GEMM_MNK): enough for the product to run near the speed of a large one.
_CHUNK = 256

# OpenBLAS runs a gemm of m * n * k at or below this on the calling thread alone (interface/gemm.c:
# SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD, 65536 * 4): the products of row_quadforms stay
# at or below it, so each runs on one thread with a fixed per-element arithmetic.
_GEMM_SERIAL_MNK = 262144

# Largest product of the draw kernels (_walk, _scan_leaves). sts_sample runs them with BLAS
# limited to one thread, so they may exceed OpenBLAS's threshold; 4x it: 104 -> 256 draws a
# product at R = 50, walks 1.4x faster.
_DRAW_GEMM_MNK = 1 << 20


# Default leaf size of build_tree: ceil(I / P) rows in [_LEAF_RANKS R, 2 _LEAF_RANKS R), a tree
# of at most about I R floats (the factor's own size). Factors above LARGE_FACTOR_BYTES take leaves
# 4x longer, a tree of about I R / 4 floats: on a worker with a bounded memory the trees of an
# Amazon-shaped model (8.4 M rows) would otherwise add 1 GiB, and leaf sizes from 0.5 R to 8 R
# measured within a few percent of each other in draw time.
_LEAF_RANKS = 2.0
_LARGE_LEAF_RANKS = 8.0
LARGE_FACTOR_BYTES = 64 << 20


def tree_nbytes(rows: int, rank: int) -> int:
    """Bytes of the default :class:`RowTree` of a (rows, rank) factor (an upper bound)."""
    lr = _LARGE_LEAF_RANKS if rows * rank * 8 > LARGE_FACTOR_BYTES else _LEAF_RANKS
    P = 1
    while 2 * P * lr * rank <= rows:
        P *= 2
    return (2 * P - 1) * rank * rank * 8


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

    @property
    def ncols(self) -> int:
        """Columns of the rows (``R``)."""
        return int(self.rows.shape[1])

    @property
    def dtype(self) -> np.dtype:
        """The rows' dtype."""
        return self.rows.dtype

    def weighted_rows(self, which: np.ndarray | None = None) -> np.ndarray:
        """``weights[s] * rows[s]`` (the rows a sampled MTTKRP adds) of the samples ``which`` (all by
        default), a new (len(which), R) array."""
        if which is None:
            return self.weights[:, None] * self.rows
        return self.weights[which, None] * self.rows[which]

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

    def node_gram(self, v: int) -> np.ndarray:
        """The Gram matrix (R, R) of node ``v``: the sum of ``U[i]^T U[i]`` over the rows below it."""
        return self.grams[v]

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
    same order. Leaves are independent, so the result does not depend on the thread count. Zero
    entries are skipped: a randomized CP-ALS factor is zero but in the rows its sampled fibers'
    nonzeros hit (4.8 M x 16 with 1 % of its rows not zero: 0.10 s, against 0.24 s for a dense
    one, one thread).
    """
    for leaf in nb.prange(P):
        _leaf_gram(U, F, P, leaf, grams)


@nb.njit(inline="always")
def _leaf_gram(U, F, P, leaf, grams):
    """Leaf ``leaf``'s partial Gram matrix into ``grams[P - 1 + leaf]`` (see :func:`_leaf_grams`)."""
    I, R = U.shape
    G = grams[P - 1 + leaf]
    for a in range(R):
        for b in range(R):
            G[a, b] = 0.0
    lo = min(leaf * F, I)
    hi = min(lo + F, I)
    for i in range(lo, hi):
        for a in range(R):
            x = U[i, a]
            if x == 0.0:  # adds nothing: STS-CP's factors are zero but where sampled fibers hit
                continue
            for b in range(R):
                G[a, b] += x * U[i, b]


@nb.njit(parallel=True, nogil=True, cache=True)
def _leaf_grams_at(U, F, P, leaves, grams):
    """:func:`_leaf_grams` for the leaves ``leaves`` (int64, distinct) only."""
    for k in nb.prange(leaves.shape[0]):
        _leaf_gram(U, F, P, leaves[k], grams)


@nb.njit(nogil=True, cache=True)
def _ancestor_grams(grams, leaves, P):
    """Recompute the internal nodes above the (sorted, distinct) ``leaves``, level by level, as
    :func:`_internal_grams` sums them."""
    R = grams.shape[1]
    nodes = leaves + (P - 1)
    n = nodes.shape[0]
    while n > 0 and nodes[0] > 0:
        m = 0
        for k in range(n):  # sorted children give sorted parents: drop repeats in place
            v = (nodes[k] - 1) // 2
            if m == 0 or nodes[m - 1] != v:
                nodes[m] = v
                m += 1
        n = m
        for k in range(n):
            v = nodes[k]
            for a in range(R):
                for b in range(R):
                    grams[v, a, b] = grams[2 * v + 1, a, b] + grams[2 * v + 2, a, b]


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


@nb.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _rowdot(a, b):
    """``sum a[k] b[k]``, vectorized: the summation order is the compiler's (fixed in the compiled
    kernel, so the same for every call and every thread)."""
    s = 0.0
    for k in range(a.shape[0]):
        s += a[k] * b[k]
    return s


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


# --- one draw at a time: the careful walk, for the draws whose batched walk broke down


@nb.njit(nogil=True, cache=True)
def _descend(nodes, P, nvalid, q, x, t):
    """Walk from the root to a leaf of a tree of node matrices by inversion sampling, computing
    both children's masses from their own matrices (no cancellation in ``parent - left``).

    Parameters
    ----------
    nodes : float64 (2P-1, R, R)   node matrices (heap layout); a node's mass is ``q^T nodes[v] q``
    P : int                        leaves (a power of two)
    nvalid : int                   leaves ``>= nvalid`` are padding (zero mass)
    q : float64 (R,)               query vector (of positive mass at the root)
    x : float                      uniform draw in [0, 1)
    t : float64 (R,)               scratch

    Returns
    -------
    (leaf, x) : the leaf reached (-1 when every child had zero mass, a rounding breakdown) and
    the draw rescaled to a uniform position inside that leaf's mass.
    """
    v = 0
    lo = 0
    width = P
    while width > 1:
        half = width >> 1
        left = 2 * v + 1
        mL = max(_quad(nodes[left], q, t), 0.0)
        mR = 0.0 if lo + half >= nvalid else max(_quad(nodes[left + 1], q, t), 0.0)
        tot = mL + mR
        if not tot > 0.0:
            return -1, 0.0
        y = x * tot
        if mL > 0.0 and (y < mL or not mR > 0.0):
            x = y / mL
            v = left
        else:
            x = (y - mL) / mR
            v = left + 1
            lo += half
        x = min(max(x, 0.0), _BELOW_ONE)
        width = half
    return lo, x


@nb.njit(nogil=True, cache=True)
def _draw_row_careful(U, grams, P, F, E, P1, lam, V, hj, d1, d2):
    """One two-stage draw of a row of ``U`` for the history vector ``hj`` with the careful walk;
    -1 on a breakdown. Stage 1 draws the eigen-component ``u`` of ``G_>k`` from the tree ``E``
    (``P1`` leaves, one per component); stage 2 draws the row from the factor's tree with query
    ``hj * V[:, u]`` and scans ``q_i = (U[i] . htilde)^2`` over the rows of the leaf reached.
    """
    I, R = U.shape
    t = np.empty(R)
    C = _quad(E[0], hj, t)
    if not C > 0.0:
        return -1
    u, x = _descend(E, P1, R, hj, d1, t)
    if u < 0 or not lam[u] > 0.0:
        return -1
    ht = np.empty(R)
    for a in range(R):
        ht[a] = hj[a] * V[a, u]
    return _draw_row_for_query(U, grams, P, F, ht, d2)


@nb.njit(nogil=True, cache=True)
def _draw_row_for_query(U, grams, P, F, ht, d2):
    """Stage 2 of :func:`_draw_row_careful`: the row of ``U`` drawn for the query ``ht`` with the
    uniform ``d2`` by the careful walk; -1 on a breakdown."""
    I, R = U.shape
    t = np.empty(R)
    m2 = _quad(grams[0], ht, t)
    if not m2 > 0.0:
        return -1
    leaf, x = _descend(grams, P, (I + F - 1) // F, ht, d2, t)
    if leaf < 0:
        return -1
    lo = leaf * F
    hi = min(lo + F, I)
    q = np.empty(hi - lo)
    for i in range(lo, hi):
        s = 0.0
        for a in range(R):
            s += U[i, a] * ht[a]
        q[i - lo] = s * s
    return _pick(q, x, lo)


@nb.njit(nogil=True, cache=True)
def _pick(q, x, lo):
    """Inversion sampling inside a leaf: the first row ``lo + r`` where the running sum of the
    masses ``q`` passes ``x`` times their total (the last row of positive mass if rounding never
    lets it pass); -1 if the total is zero.

    The walk's rescaled uniform locates the draw inside this leaf's own total, so rounding in
    the node masses cannot push it past the last row."""
    total = 0.0
    for r in range(q.shape[0]):
        total += q[r]
    if not total > 0.0:
        return -1
    target = x * total
    acc = 0.0
    last = -1
    for r in range(q.shape[0]):
        if q[r] > 0.0:
            last = lo + r
            acc += q[r]
            if acc > target:
                return last
    return last


# --- all draws of a mode at once: level by level, the draws at one node in matrix products


@nb.njit(nogil=True, cache=True)
def _split_groups(gstart, gend, ng, ch):
    """Chunks of at most ``ch`` positions covering each group ``[gstart[g], gend[g])``, ``g < ng``:
    (chunk starts, chunk ends, group of each chunk)."""
    count = 0
    for g in range(ng):
        count += (gend[g] - gstart[g] + ch - 1) // ch
    cs = np.empty(count, dtype=np.int64)
    ce = np.empty(count, dtype=np.int64)
    cg = np.empty(count, dtype=np.int64)
    c = 0
    for g in range(ng):
        for s in range(gstart[g], gend[g], ch):
            cs[c] = s
            ce[c] = min(s + ch, gend[g])
            cg[c] = g
            c += 1
    return cs, ce, cg


@nb.njit(nogil=True, cache=True)
def _split_plan(gstart, ng, cs, ce, cg, nleft, lpos, rpos, glefts):
    """Where the left and right draws of each chunk go when every group splits stably into its
    children's groups, lefts first: from ``lpos[c]`` and ``rpos[c]``. ``glefts[g]``: the lefts of
    group ``g``."""
    for g in range(ng):
        glefts[g] = 0
    for c in range(cs.shape[0]):
        glefts[cg[c]] += nleft[c]
    lp = 0
    rp = 0
    for c in range(cs.shape[0]):
        g = cg[c]
        if c == 0 or cg[c - 1] != g:
            lp = gstart[g]
            rp = gstart[g] + glefts[g]
        lpos[c] = lp
        rpos[c] = rp
        lp += nleft[c]
        rp += ce[c] - cs[c] - nleft[c]


@nb.njit(nogil=True, cache=True)
def _move_chunk(src, dst, s, e, right, lp, rp):
    """Stable split of ``src[s:e]`` into ``dst``: the lefts from ``lp`` on, the rights from ``rp``."""
    for p in range(s, e):
        if right[p]:
            dst[rp] = src[p]
            rp += 1
        else:
            dst[lp] = src[p]
            lp += 1


@nb.njit(nogil=True, cache=True)
def _child_groups(gnode, gstart, gend, ng, glefts, tmp):
    """Replace the groups by the non-empty groups of their children (in node order, so still
    sorted); returns their number. ``tmp`` (3, capacity) is scratch."""
    ng2 = 0
    for g in range(ng):
        nl = glefts[g]
        if nl > 0:
            tmp[0, ng2] = 2 * gnode[g] + 1
            tmp[1, ng2] = gstart[g]
            tmp[2, ng2] = gstart[g] + nl
            ng2 += 1
        if nl < gend[g] - gstart[g]:
            tmp[0, ng2] = 2 * gnode[g] + 2
            tmp[1, ng2] = gstart[g] + nl
            tmp[2, ng2] = gend[g]
            ng2 += 1
    gnode[:ng2] = tmp[0, :ng2]
    gstart[:ng2] = tmp[1, :ng2]
    gend[:ng2] = tmp[2, :ng2]
    return ng2


@nb.njit(nogil=True, cache=True)
def _chunk_queries(src, s, n, Q, qrow, scale, which, buf, slot):
    """The distinct query vectors ``Q[qrow[j]] * scale[which[j]]`` of the draws ``j = src[s + i]``,
    ``i < n`` (draws of one query adjacent), into ``buf[:nu]``; ``slot[i]``: the row of draw ``i``'s
    query. Returns ``nu``."""
    R = Q.shape[1]
    nu = 0
    pq = -1
    pw = -1
    for i in range(n):
        j = src[s + i]
        q = qrow[j]
        w = which[j]
        if nu == 0 or q != pq or w != pw:
            sc = scale[w]
            for a in range(R):
                buf[nu, a] = Q[q, a] * sc[a]
            nu += 1
            pq = q
            pw = w
        slot[i] = nu - 1
    return nu


@nb.njit(parallel=True, nogil=True, cache=True)
def _walk(nodes, P, nvalid, Q, qrow, scale, which, order, x, fail, perm, gnode, gstart, gend):
    """Walk every draw from the root of a tree of node matrices to a leaf by inversion sampling,
    all draws level by level.

    Parameters
    ----------
    nodes : float64 (2P-1, R, R)   node matrices (heap layout); a node's mass for draw ``j`` is
                                   ``q_j nodes[v] q_j^T``
    P : int                        leaves (a power of two)
    nvalid : int                   leaves ``>= nvalid`` are padding (zero mass)
    Q, qrow, scale, which          the query vector of draw ``j`` is
                                   ``q_j = Q[qrow[j]] * scale[which[j]]`` (float64 (D, R), int64
                                   (J,), float64 (K, R), int64 (J,)); formed where it is read, so
                                   the (J, R) queries are never stored
    order : int64 (J,)             the draws in an order where draws of one query (equal ``qrow``
                                   and ``which``) are adjacent
    x : float64 (J,)               uniform of every draw in [0, 1); rescaled in place to a uniform
                                   position inside the mass of the leaf reached
    fail : bool (J,)               set where the walk broke down (zero root mass, or both children
                                   of zero mass in rounding); such draws end at an arbitrary leaf
    perm : int64 (J,)              output: the draws ordered by the leaf reached (stable)
    gnode, gstart, gend : int64 (at least min(J, P),)   output: the leaves reached (node ids,
                                   increasing) and their draws ``perm[gstart[g]:gend[g]]``

    Returns
    -------
    ng : the number of leaves reached (entries of ``gnode, gstart, gend`` filled).

    Per draw this is the walk of Algorithm 6: only left children are evaluated, the right mass
    is the parent's minus the left one (clamped at 0), a child of zero mass is never entered, and
    the uniform is rescaled at each level so it keeps its full precision relative to the node.

    The draws at one node are a contiguous group of the current order, so the masses of its left
    child come from matrix products (query rows times the child's matrix, then row-wise dots),
    one per chunk of at most ``ch`` draws, the chunks in parallel: a product reuses the node's
    matrix over the chunk, where one draw at a time reads a node matrix per level from memory
    and evaluates it with matrix-vector arithmetic. Each group then splits stably into its
    children's groups. The chunks depend only on the groups, and every product runs on one BLAS
    thread (sts_sample limits BLAS to one; its per-element arithmetic fixed), so the result does
    not depend on the thread count.

    Draws of one query stay adjacent inside a group (the splits are stable), so a chunk's product
    has one row per distinct query (:func:`_chunk_queries`): leverage draws repeat histories (on
    nell2-shaped factors 65536 draws have about 11 k distinct queries), and the draws of a query
    share its masses at every node they share.
    """
    J = qrow.shape[0]
    R = Q.shape[1]
    ch = max(1, min(_CHUNK, _DRAW_GEMM_MNK // (R * R)))
    m = np.zeros(J)  # zeros: pages touched here, not first by parallel threads (contention)
    right = np.zeros(J, dtype=np.bool_)
    perms = np.zeros((2, J), dtype=np.int64)  # the order at this level and at the next
    perms[0, :] = order
    k = 0
    tmp = np.empty((3, gnode.shape[0]), dtype=np.int64)
    ng = 1
    gnode[0] = 0
    gstart[0] = 0
    gend[0] = J

    # root masses: with the first level's products (the root's matrix beside its left child's),
    # alone where the root is the only leaf
    M0 = np.empty((R, 2 * R)) if P > 1 else np.empty((R, R))
    M0[:, :R] = nodes[0]
    if P > 1:
        M0[:, R:] = nodes[1]
    cs, ce, cg = _split_groups(gstart, gend, ng if P == 1 else 0, ch)
    for c in nb.prange(cs.shape[0]):
        s0 = cs[c]
        n0 = ce[c] - s0
        buf0 = np.empty((n0, R))
        slot0 = np.empty(n0, dtype=np.int64)
        nu0 = _chunk_queries(perms[0], s0, n0, Q, qrow, scale, which, buf0, slot0)
        T0 = np.empty((nu0, R))
        np.dot(buf0[:nu0], M0, T0)
        for i in range(n0):
            j0 = perms[0, s0 + i]
            m[j0] = _rowdot(T0[slot0[i]], buf0[slot0[i]])
            if not m[j0] > 0.0:
                fail[j0] = True

    width = P
    first = 0  # node id of the first node at the current depth
    while width > 1:
        half = width >> 1
        # the first level's products have 2R columns
        cs, ce, cg = _split_groups(gstart, gend, ng, ch if first > 0 else max(1, ch // 2))
        nc = cs.shape[0]
        nleft = np.empty(nc, dtype=np.int64)
        src = perms[k]
        dst = perms[1 - k]
        for c in nb.prange(nc):
            v = gnode[cg[c]]
            padded_right = (v - first) * width + half >= nvalid
            root = first == 0
            off = R if root else 0
            s1 = cs[c]
            n1 = ce[c] - s1
            buf = np.empty((n1, R))
            slot = np.empty(n1, dtype=np.int64)
            nu = _chunk_queries(src, s1, n1, Q, qrow, scale, which, buf, slot)
            T = np.empty((nu, off + R))
            np.dot(buf[:nu], M0 if root else nodes[2 * v + 1], T)
            mroot = np.empty(nu)
            mleft = np.empty(nu)
            for u in range(nu):
                if root:
                    mroot[u] = _rowdot(T[u, :R], buf[u])
                mleft[u] = max(_rowdot(T[u, off:], buf[u]), 0.0)
            nl = 0
            for i in range(n1):
                j1 = src[s1 + i]
                if root:
                    m[j1] = mroot[slot[i]]
                    if not m[j1] > 0.0:
                        fail[j1] = True
                go_right = False
                if not fail[j1]:
                    mL = mleft[slot[i]]
                    mR = 0.0 if padded_right else max(m[j1] - mL, 0.0)
                    tot = mL + mR
                    if not tot > 0.0:
                        fail[j1] = True
                    else:
                        y = x[j1] * tot
                        if mL > 0.0 and (y < mL or not mR > 0.0):
                            xn = y / mL
                            m[j1] = mL
                        else:
                            xn = (y - mL) / mR
                            m[j1] = mR
                            go_right = True
                        x[j1] = min(max(xn, 0.0), _BELOW_ONE)
                right[s1 + i] = go_right
                if not go_right:
                    nl += 1
            nleft[c] = nl
        lpos = np.empty(nc, dtype=np.int64)
        rpos = np.empty(nc, dtype=np.int64)
        glefts = np.empty(ng, dtype=np.int64)
        _split_plan(gstart, ng, cs, ce, cg, nleft, lpos, rpos, glefts)
        for c in nb.prange(nc):
            _move_chunk(src, dst, cs[c], ce[c], right, lpos[c], rpos[c])
        ng = _child_groups(gnode, gstart, gend, ng, glefts, tmp)
        k = 1 - k
        first = 2 * first + 1
        width = half
    perm[:] = perms[k]
    return ng


@nb.njit(parallel=True, nogil=True, cache=True)
def _scan_leaves(U, P, F, Q, qrow, scale, which, x, fail, perm, gnode, gstart, gend, ng, out):
    """The row of every draw inside the leaf its walk reached (:func:`_pick` over
    ``q_i = (U[i] . Q[qrow[j]] * scale[which[j]])^2``); -1 for failed draws and leaves of zero total.

    The dot products of the distinct queries at a leaf with its rows are one matrix product per
    chunk of draws (on one BLAS thread, as in :func:`_walk`)."""
    I, R = U.shape
    ch = max(1, min(_CHUNK, _DRAW_GEMM_MNK // (R * F)))
    cs, ce, cg = _split_groups(gstart, gend, ng, ch)
    for c in nb.prange(cs.shape[0]):
        lo = min((gnode[cg[c]] - (P - 1)) * F, I)
        hi = min(lo + F, I)
        s = cs[c]
        n = ce[c] - s
        if hi <= lo:
            for i in range(n):
                out[perm[s + i]] = -1
            continue
        buf = np.empty((n, R))
        slot = np.empty(n, dtype=np.int64)
        nu = _chunk_queries(perm, s, n, Q, qrow, scale, which, buf, slot)
        S = np.empty((nu, hi - lo))
        np.dot(buf[:nu], U[lo:hi].T, S)
        for u in range(nu):
            Su = S[u]
            for r in range(hi - lo):
                Su[r] = Su[r] * Su[r]
        for i in range(n):
            j = perm[s + i]
            if fail[j]:
                out[j] = -1
                continue
            out[j] = _pick(S[slot[i]], x[j], lo)


@nb.njit(nogil=True, cache=True)
def _components(P1, ng, perm, gnode, gstart, gend, comp):
    """``comp[j]``: the stage-1 leaf (eigen-component) draw ``j`` reached."""
    for g in range(ng):
        for p in range(gstart[g], gend[g]):
            comp[perm[p]] = gnode[g] - (P1 - 1)


@nb.njit(nogil=True, cache=True)
def _failed(out):
    """Indices of the negative entries of ``out``."""
    n = 0
    for j in range(out.shape[0]):
        if out[j] < 0:
            n += 1
    bad = np.empty(n, dtype=np.int64)
    n = 0
    for j in range(out.shape[0]):
        if out[j] < 0:
            bad[n] = j
            n += 1
    return bad


@nb.njit(parallel=True, nogil=True, cache=True)
def _components_by_history(Hd, lam, V, Gk, hid, x, comp, fail):
    """Stage 1 from each distinct history's whole component distribution: for history ``h``,
    ``p(u) ~ lam_u (h * V[:, u]) G_k (h * V[:, u])^T`` for every ``u`` at once (``Y = diag(h) V``,
    then ``lam * colsum(Y * (G_k Y))``, ``2 R^3`` flops), then every draw ``j`` by inversion of
    its history's masses with ``x[j]`` (:func:`_pick`); ``fail[j]`` where they are all zero.

    Draws repeat histories (65536 nell2-shaped draws have about 2 k distinct first rows), and
    one history's distribution then costs less than walking the stage-1 tree for its draws."""
    D, R = Hd.shape
    masses = np.empty((D, R))
    for d in nb.prange(D):
        Y = np.empty((R, R))
        T = np.empty((R, R))
        for a in range(R):
            ha = Hd[d, a]
            for u in range(R):
                Y[a, u] = ha * V[a, u]
        np.dot(Gk, Y, T)
        for u in range(R):
            masses[d, u] = 0.0
        for a in range(R):
            for u in range(R):
                masses[d, u] += Y[a, u] * T[a, u]
        for u in range(R):
            masses[d, u] = max(lam[u] * masses[d, u], 0.0)
    for j in nb.prange(hid.shape[0]):
        u = _pick(masses[hid[j]], x[j], 0)
        if u < 0:
            fail[j] = True
            comp[j] = 0
        else:
            comp[j] = u


@nb.njit(parallel=True, nogil=True, cache=True)
def _sts_draw_mode(U, grams, P, F, E, P1, lam, V, Hd, hid, by_history, uniforms, out):
    """All draws of one sampled mode (the memory-saving loop order of Algorithm 6).

    Parameters
    ----------
    U : float64 (I, R) C array           factor of this mode
    grams, P, F                          its :class:`RowTree` (node Grams, leaves, rows per leaf)
    E : float64 (2*P1-1, R, R)           stage-1 tree: node ``v`` holds
                                         ``(sum over components u below v of lam_u V[:,u] V[:,u]^T) * G_k``
    P1 : int                             stage-1 leaves (power of two >= R; leaf u is component u)
    lam : float64 (R,), V : float64 (R, R)   eigenpairs of ``G_>k`` (lam clipped at 0)
    Hd : float64 (D, R)                  the distinct history vectors (Hadamard products of the rows
                                         drawn so far)
    hid : int64 (J,)                     the history of each draw
    by_history : bool                    stage 1 from each history's whole component distribution
                                         (:func:`_components_by_history`), else by walking ``E``
    uniforms : float64 (J, 2)            pre-drawn uniforms (stage 1, stage 2) of every sample
    out : int64 (J,)                     row drawn for each sample, -1 where both the fast and the
                                         careful walk broke down (rounding; not expected)

    Stage 1 draws every sample's eigen-component ``u`` of ``G_>k``; stage 2 its row from the
    factor's tree with query ``Hd[hid[j]] * V[:, u]``, then inside the leaf reached
    (:func:`_walk`, :func:`_scan_leaves`), draws of one query sharing its products. Samples whose
    walk broke down in rounding are drawn again, one at a time, with the careful walk (both
    children's masses from their own matrices) and the same uniforms. Samples read only their
    own uniforms, so the result is the same for any thread count.
    """
    J = hid.shape[0]
    comp = np.zeros(J, dtype=np.int64)
    fail = np.zeros(J, dtype=np.bool_)
    _stage1(E, P1, lam, V, grams[0], Hd, hid, by_history, uniforms[:, 0], comp, fail)
    for j in nb.prange(J):
        if not lam[comp[j]] > 0.0:
            fail[j] = True
    # stage 2: the query of draw j is Hd[hid[j]] * V[:, comp[j]]
    VT = np.ascontiguousarray(V.T)
    x = np.empty(J)
    x[:] = uniforms[:, 1]
    _stage2(U, grams, P, F, Hd, hid, VT, comp, x, fail, out)
    bad = _failed(out)
    for b in nb.prange(bad.shape[0]):
        jb = bad[b]
        out[jb] = _draw_row_careful(U, grams, P, F, E, P1, lam, V, Hd[hid[jb]], uniforms[jb, 0], uniforms[jb, 1])


@nb.njit(parallel=True, nogil=True, cache=True)
def _stage1(E, P1, lam, V, Gk, Hd, hid, by_history, x1, comp, fail):
    """Stage 1 of :func:`_sts_draw_mode`: ``comp[j]``, the eigen-component of draw ``j`` (from its
    history's whole distribution, or by walking ``E`` with the uniform ``x1[j]``); ``fail[j]``
    where the walk broke down."""
    J = hid.shape[0]
    R = Hd.shape[1]
    if by_history:
        _components_by_history(Hd, lam, V, Gk, hid, x1, comp, fail)
        return
    x = np.empty(J)
    x[:] = x1
    perm = np.zeros(J, dtype=np.int64)
    cap = max(1, min(J, P1))
    gnode = np.empty(cap, dtype=np.int64)
    gstart = np.empty(cap, dtype=np.int64)
    gend = np.empty(cap, dtype=np.int64)
    ng = _walk(
        E, P1, R, Hd, hid, np.ones((1, R)), comp, np.argsort(hid, kind="mergesort"), x, fail, perm, gnode, gstart, gend
    )
    _components(P1, ng, perm, gnode, gstart, gend, comp)


@nb.njit(parallel=True, nogil=True, cache=True)
def _stage2(U, grams, P, F, Q, qrow, scale, which, x, fail, out):
    """Stage 2 of :func:`_sts_draw_mode`: ``out[j]``, the row of ``U`` drawn for the query
    ``Q[qrow[j]] * scale[which[j]]`` with the uniform ``x[j]`` (overwritten), by the batched walk
    of the factor's tree and the scan of the leaf reached; -1 where it broke down (or ``fail[j]``)."""
    J = qrow.shape[0]
    I = U.shape[0]
    perm = np.zeros(J, dtype=np.int64)
    cap = max(1, min(J, P))
    gnode = np.empty(cap, dtype=np.int64)
    gstart = np.empty(cap, dtype=np.int64)
    gend = np.empty(cap, dtype=np.int64)
    key = np.empty(J, dtype=np.int64)
    for j in nb.prange(J):
        key[j] = qrow[j] * scale.shape[0] + which[j]
    ng = _walk(
        grams,
        P,
        (I + F - 1) // F,
        Q,
        qrow,
        scale,
        which,
        np.argsort(key, kind="mergesort"),
        x,
        fail,
        perm,
        gnode,
        gstart,
        gend,
    )
    _scan_leaves(U, P, F, Q, qrow, scale, which, x, fail, perm, gnode, gstart, gend, ng, out)


@nb.njit(parallel=True, nogil=True, cache=True)
def row_quadforms(X, M, out):
    """``out[i] = X[i] M X[i]^T`` for a symmetric ``M`` (R, R), rows in parallel chunks, each a
    matrix product under OpenBLAS's threading threshold (so the result does not depend on the
    thread count), no (I, R) temporary (leverage scores of a tall factor: ``M = pinv(U^T U)``)."""
    I, R = X.shape
    ch = max(1, min(_CHUNK, _GEMM_SERIAL_MNK // (R * R)))
    nblocks = (I + ch - 1) // ch
    for blk in nb.prange(nblocks):
        lo = blk * ch
        hi = min(I, lo + ch)
        T = np.empty((hi - lo, R))
        np.dot(X[lo:hi], M, T)
        for i in range(lo, hi):
            out[i] = _rowdot(T[i - lo], X[i])


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

    Same result as ``np.unique(idx, axis=0, return_counts=True)``, many times faster: rows of
    non-negative entries whose mixed-radix code (radix ``max + 1`` per column) fits in int64 are
    sorted as those codes, by the store's radix sort (:func:`~tensorflow_ooc.format.radix_sort.sort_keys`:
    numpy's sort of 65536 int64 codes took 2.9 ms here, where it does not run vectorized), others
    by a ``lexsort`` of the columns (12 ms) instead of a sort of row-sized byte strings. 65536 x 3
    (uber-shaped columns): 8.4 ms before, with numpy's sort and ``max(axis=0)``. Where the code and
    the row's position fit in 63 bits together, each key carries the position below the code, so a
    distinct row is copied from its first occurrence (:func:`_code_runs`) instead of decoded: 65536
    x 4 rows, one thread, 3.6 -> 1.6 ms (NumPy's ``divmod`` of the codes alone took 1.1-1.8).
    """
    if idx.shape[0] == 0:
        return idx.copy(), np.zeros(0, dtype=np.int64)
    N = idx.shape[1]
    if N > 0 and np.issubdtype(idx.dtype, np.signedinteger):
        lo, hi = _column_ranges(idx)
        dims = [int(h) + 1 for h in hi]
        if lo.min() >= 0 and math.prod(dims) <= np.iinfo(np.int64).max:
            strides = np.array([math.prod(dims[k + 1 :]) for k in range(N)], dtype=np.int64)
            code_bits = max(1, (math.prod(dims) - 1).bit_length())
            pos_bits = max(1, (idx.shape[0] - 1).bit_length())
            if code_bits + pos_bits <= 63:
                keys = np.empty(idx.shape[0], dtype=np.int64)
                _row_codes(idx, strides, pos_bits, keys)
                keys = sort_keys(keys.view(np.uint64)[None, :], code_bits + pos_bits)[0].view(np.int64)
                return _code_runs(keys, pos_bits, idx)
            keys = np.empty(idx.shape[0], dtype=np.int64)
            _row_codes(idx, strides, 0, keys)
            # the codes lie in [0, prod(dims)): their bits as unsigned words, sorted in place
            keys = sort_keys(keys.view(np.uint64)[None, :], code_bits)[0].view(np.int64)
            new = np.empty(keys.shape[0], dtype=bool)
            new[0] = True
            np.not_equal(keys[1:], keys[:-1], out=new[1:])
            starts = np.flatnonzero(new)
            counts = np.diff(np.append(starts, keys.shape[0])).astype(np.int64)
            rest = keys[starts]
            out = np.empty((starts.shape[0], N), dtype=idx.dtype)
            for k in range(N):
                out[:, k], rest = np.divmod(rest, strides[k])
            return out, counts
    order = np.lexsort(idx.T[::-1])
    s = idx[order]
    new = np.ones(s.shape[0], dtype=bool)
    new[1:] = np.any(s[1:] != s[:-1], axis=1)
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, s.shape[0])).astype(np.int64)
    return s[starts], counts


@nb.njit(nogil=True, cache=True)
def _column_ranges(idx):
    """Each column's minimum and maximum, in one pass over the rows (``max(axis=0)`` over a tall,
    narrow array is slow, docs/KERNELS.md)."""
    N = idx.shape[1]
    lo = np.empty(N, dtype=np.int64)
    hi = np.empty(N, dtype=np.int64)
    for k in range(N):
        lo[k] = idx[0, k]
        hi[k] = idx[0, k]
    for s in range(1, idx.shape[0]):
        for k in range(N):
            v = idx[s, k]
            lo[k] = min(lo[k], v)
            hi[k] = max(hi[k], v)
    return lo, hi


@nb.njit(nogil=True, cache=True)
def _row_codes(idx, strides, pos_bits, keys):
    """``keys[s]``: row ``s``'s mixed-radix code (``sum_k idx[s, k] strides[k]``) shifted left by
    ``pos_bits``, with ``s`` in the bits below (none where ``pos_bits`` is 0)."""
    for s in range(idx.shape[0]):
        c = 0
        for k in range(idx.shape[1]):
            c += idx[s, k] * strides[k]
        keys[s] = (c << pos_bits) | (s if pos_bits > 0 else 0)


@nb.njit(nogil=True, cache=True)
def _code_runs(keys, pos_bits, idx):
    """The distinct rows of ``idx`` and their counts from ``keys`` (:func:`_row_codes` with positions,
    sorted): a row is copied from the position its run's first key holds."""
    n = keys.shape[0]
    S = 1
    for i in range(1, n):
        if (keys[i] >> pos_bits) != (keys[i - 1] >> pos_bits):
            S += 1
    out = np.empty((S, idx.shape[1]), dtype=idx.dtype)
    counts = np.zeros(S, dtype=np.int64)
    mask = (np.int64(1) << pos_bits) - 1
    g = -1
    prev = np.int64(-1)
    for i in range(n):
        c = keys[i] >> pos_bits
        if c != prev:
            g += 1
            r = keys[i] & mask
            for k in range(idx.shape[1]):
                out[g, k] = idx[r, k]
            prev = c
        counts[g] += 1
    return out, counts


@nb.njit(parallel=True, nogil=True, cache=True)
def _krp_rows(fs, cols, coords, rows):
    """``rows[s] = fs[0][coords[s, cols[0]]] * fs[1][coords[s, cols[1]]] * ...`` (from 1.0, in
    the order of ``fs``)."""
    S, R = rows.shape
    for s in nb.prange(S):
        for a in range(R):
            rows[s, a] = 1.0
        for t in range(len(fs)):
            f = fs[t]
            i = coords[s, cols[t]]
            for a in range(R):
                rows[s, a] *= f[i, a]


def krp_rows(factors: Sequence[np.ndarray], coords: np.ndarray, exclude: int) -> np.ndarray:
    """Rows of the Khatri-Rao product at ``coords`` (S, N): Hadamard products over ``k != exclude``
    in increasing ``k`` (the order the draw kernels multiply in)."""
    ks = [k for k in range(len(factors)) if k != exclude]
    if not ks:
        return np.ones((coords.shape[0], factors[0].shape[1]))
    # np.ones touches the fresh pages on this thread: first touches from parallel threads contend
    rows = np.ones((coords.shape[0], factors[0].shape[1]))
    fs = tuple(np.ascontiguousarray(factors[k], dtype=np.float64) for k in ks)
    _krp_rows(fs, np.array(ks, dtype=np.int64), np.ascontiguousarray(coords, dtype=np.int64), rows)
    return rows


# ---------------------------------------------------------------------------------------------
# public API


def marginal_mode(rows: Sequence[int], leaves: Sequence[int], J: int) -> int | None:
    """Which of the sampled modes (by position) to draw first from its whole marginal, or None.

    The first mode drawn has no history (``h = 1``): every draw has the same distribution,
    ``p(t) ~ U[t] G_> U[t]^T``, which one matrix product over the factor gives for every row
    (``I R^2``) where the tree walks cost ``J R^2`` per level. The mode that saves the most walk
    work goes first; none where every factor is longer than the draws' walks (a factor of
    millions of rows against a few thousand draws)."""
    saving = [J * (int(P).bit_length() + 1) - int(I) for I, P in zip(rows, leaves)]
    best = int(np.argmax(saving))
    return best if saving[best] > 0 else None


def _draw_marginal(U: np.ndarray, M: np.ndarray, uniforms: np.ndarray, out: np.ndarray) -> None:
    """Draw ``out[j]`` from ``p(t) ~ U[t] M U[t]^T`` (``M`` symmetric PSD) by inverse CDF with
    ``uniforms[j]``; rows of zero mass are never drawn."""
    mass = np.empty(U.shape[0])
    row_quadforms(U, M, mass)
    np.maximum(mass, 0.0, out=mass)
    cdf = np.cumsum(mass)
    if not cdf[-1] > 0.0:
        raise RuntimeError("leverage sampling of a mode broke down numerically (zero total mass)")
    # side="right" skips rows whose mass is zero (their cdf equals the previous row's); a target
    # rounded up to the total lands past the end and goes to the last row with mass
    last = int(np.flatnonzero(mass > 0.0)[-1])
    np.minimum(np.searchsorted(cdf, uniforms * cdf[-1], side="right"), last, out=out)


def _extend_histories(
    Hd: np.ndarray, hid: np.ndarray, U: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct histories after drawing ``rows`` of ``U``: ``Hd[hid[j]] * U[rows[j]]`` for every
    draw ``j``, as distinct vectors and each draw's index into them."""
    I = U.shape[0]
    if hid.shape[0] * I < 2**62:
        pairs, inv = np.unique(hid * I + rows, return_inverse=True)
        old, new = pairs // I, pairs % I
    else:
        pairs, inv = np.unique(np.stack([hid, rows], axis=1), axis=0, return_inverse=True)
        old, new = pairs[:, 0], pairs[:, 1]
    return Hd[old] * U[new], inv.reshape(-1).astype(np.int64)


def khatri_rao_gram(grams: Sequence[np.ndarray], ks: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``G``, the Gram of the Khatri-Rao product of modes ``ks`` (the Hadamard product of their
    Grams ``grams``), and its pseudo-inverse; ValueError where the product is zero."""
    G = np.ones_like(grams[0])
    for g in grams:
        G *= g
    Gp, rank = psd_pinv(G)
    if rank == 0:
        raise ValueError(f"the Khatri-Rao product of modes {list(ks)} is zero (no row has nonzero leverage)")
    return G, Gp


def conditional_eigenpairs(Gp: np.ndarray, later: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The eigenpairs of ``G_>k = Gp * (Hadamard product of the Grams ``later``, the modes drawn
    after k)``, eigenvalues clipped at 0, vectors C-contiguous: what a mode's draws condition on."""
    after = np.ones_like(Gp)
    for g in later:
        after *= g
    lam, V = np.linalg.eigh(Gp * after)
    return np.maximum(lam, 0.0), np.ascontiguousarray(V)


def _stage1_by_history(Hd: np.ndarray, J: int, P1: int) -> bool:
    """Stage 1 from each distinct history's distribution rather than by walks (see
    :data:`STAGE1_BY_HISTORY`)."""
    return Hd.shape[0] * Hd.shape[1] <= STAGE1_BY_HISTORY * J * int(P1).bit_length()


def draw_components(
    Hd: np.ndarray, hid: np.ndarray, lam: np.ndarray, V: np.ndarray, Gk: np.ndarray, x1: np.ndarray
) -> np.ndarray:
    """Stage 1 of STS-CP for the draws of one sampled mode: the eigen-component of ``G_>k``
    (eigenpairs ``lam``, ``V``) of each draw, whose history is ``Hd[hid[j]]``, with the uniforms
    ``x1`` (``Gk`` the mode's Gram). The same decisions as :func:`sts_sample` makes; raises
    RuntimeError where every component had zero mass (a numerical breakdown)."""
    J = hid.shape[0]
    E, P1 = _eigen_tree(lam, V, Gk)
    comp = np.zeros(J, dtype=np.int64)
    fail = np.zeros(J, dtype=np.bool_)
    by_history = _stage1_by_history(Hd, J, P1)
    _stage1(E, P1, lam, V, np.ascontiguousarray(Gk), Hd, hid, by_history, np.ascontiguousarray(x1), comp, fail)
    fail |= ~(lam[comp] > 0.0)
    if fail.any():
        raise RuntimeError(f"leverage sampling broke down numerically in stage 1 ({int(fail.sum())} of {J} draws)")
    return comp


def draw_rows(U: np.ndarray, tree: RowTree, Q: np.ndarray, qrow: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Stage 2 of STS-CP: for each draw ``j`` the row of ``U`` drawn with probability proportional
    to ``(U[i] . Q[qrow[j]])^2`` by inversion of the uniform ``x[j]`` (the factor's ``tree`` walked,
    then the leaf scanned; draws that break down in rounding are drawn again by the careful walk).
    Raises RuntimeError where even that broke down."""
    J = qrow.shape[0]
    out = np.empty(J, dtype=np.int64)
    if J == 0:
        return out
    U = np.ascontiguousarray(U, dtype=np.float64)
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    qrow = np.ascontiguousarray(qrow, dtype=np.int64)
    R = U.shape[1]
    xs = np.array(x, dtype=np.float64)
    with one_blas_thread():
        _stage2(
            U,
            tree.grams,
            tree.nleaves,
            tree.leaf_rows,
            Q,
            qrow,
            np.ones((1, R)),
            np.zeros(J, dtype=np.int64),
            xs,
            np.zeros(J, dtype=np.bool_),
            out,
        )
    for j in np.flatnonzero(out < 0):
        out[j] = _draw_row_for_query(U, tree.grams, tree.nleaves, tree.leaf_rows, Q[qrow[j]], float(x[j]))
    if np.any(out < 0):
        raise RuntimeError(f"leverage sampling broke down numerically ({int(np.sum(out < 0))} of {J} draws)")
    return out


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
        lr = _LARGE_LEAF_RANKS if I * R * 8 > LARGE_FACTOR_BYTES else _LEAF_RANKS
        P = 1
        while 2 * P * lr * R <= I:
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


def update_tree(tree: RowTree, U: np.ndarray, rows: np.ndarray) -> RowTree:
    """``tree`` (of ``U`` before the rows ``rows`` changed) brought up to date in place: the leaves
    holding ``rows`` and the nodes above them are recomputed, the same sums as :func:`build_tree`
    of ``U`` with the tree's leaves. Returns ``tree``.

    Parameters
    ----------
    tree : RowTree
        The factor's tree, built with :func:`build_tree`.
    U : (I, R) float64 C array
        The factor now.
    rows : int array
        Every row that changed (any order; repeats allowed).
    """
    if U.shape != (tree.nrows, tree.rank) or U.dtype != np.float64 or not U.flags.c_contiguous:
        raise ValueError(f"factor of shape {U.shape} ({U.dtype}) for a tree of {tree.nrows} x {tree.rank} float64 rows")
    rows = np.asarray(rows, dtype=np.int64)
    if rows.shape[0] and (rows.min() < 0 or rows.max() >= tree.nrows):
        raise ValueError(f"rows outside the factor's {tree.nrows}")
    leaves = np.unique(rows // tree.leaf_rows)
    _leaf_grams_at(U, tree.leaf_rows, tree.nleaves, leaves, tree.grams)
    _ancestor_grams(tree.grams, leaves, tree.nleaves)
    return tree


def _eigen_tree(lam: np.ndarray, V: np.ndarray, Gk: np.ndarray) -> tuple[np.ndarray, int]:
    """Stage-1 tree (Algorithm 7 with ``U = sqrt(lam) V^T``, ``F = 1``, ``Y = G_k`` baked in): leaf
    ``u`` holds ``lam_u (V[:,u] V[:,u]^T) * G_k``, internal nodes the sums of their children."""
    R = lam.shape[0]
    P1 = _pow2_at_least(R)
    E = np.zeros((2 * P1 - 1, R, R))
    E[P1 - 1 : P1 - 1 + R] = np.einsum("u,au,bu->uab", lam, V, V) * Gk
    width = P1 // 2
    while width >= 1:
        v = np.arange(width - 1, 2 * width - 1)
        E[v] = E[2 * v + 1] + E[2 * v + 2]
        width //= 2
    return E, P1


def sts_sample(
    factors: Sequence[np.ndarray],
    trees: Sequence[RowTree | None] | None,
    exclude: int,
    J: int,
    seed: Any = None,
    marginal: bool = True,
) -> SampleSet:
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
    marginal : bool
        Draw the mode chosen by :func:`marginal_mode` first, from its marginal over all rows
        (same distribution, no tree walks); False walks the trees for every mode.

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
            raise ValueError(
                f"tree of mode {k} was built for a ({tree.nrows}, {tree.rank}) factor, the factor is {factors[k].shape}"
            )
        check_gram(tree.gram, k)

    # the dense algebra here is R x R: one BLAS thread (threads left spinning by a threaded call
    # take a core from the draw kernel that follows: 1.6x its time at R = 50 on 2 cores)
    with one_blas_thread():
        G, Gp = khatri_rao_gram([trees[k].gram for k in ks], ks)

        rng = np.random.default_rng(seed)
        # the history of every draw (the Hadamard product of its rows drawn so far) as an index
        # into the distinct histories: draws repeat rows, and draws of one history share work
        Hd = np.ones((1, R))
        hid = np.zeros(J, dtype=np.int64)
        idx = np.zeros((J, N), dtype=np.int64)
        out = np.empty(J, dtype=np.int64)
        first = (
            marginal_mode([factors[k].shape[0] for k in ks], [trees[k].nleaves for k in ks], J) if marginal else None
        )
        if first is not None:
            ks = [ks[first]] + ks[:first] + ks[first + 1 :]
        for pos, k in enumerate(ks):
            lam, V = conditional_eigenpairs(Gp, [trees[k2].gram for k2 in ks[pos + 1 :]])
            if pos == 0 and first is not None:
                _draw_marginal(factors[k], (V * lam) @ V.T, rng.random(J), out)
            else:
                E, P1 = _eigen_tree(lam, V, trees[k].gram)
                uniforms = rng.random((J, 2))
                tree = trees[k]
                by_history = _stage1_by_history(Hd, J, P1)
                _sts_draw_mode(
                    factors[k],
                    tree.grams,
                    tree.nleaves,
                    tree.leaf_rows,
                    E,
                    P1,
                    lam,
                    V,
                    Hd,
                    hid,
                    by_history,
                    uniforms,
                    out,
                )
                if np.any(out < 0):
                    raise RuntimeError(
                        f"leverage sampling of mode {k} broke down numerically ({int(np.sum(out < 0))} of {J} draws)"
                    )
            idx[:, k] = out
            if pos + 1 < len(ks):
                Hd, hid = _extend_histories(Hd, hid, factors[k], out)

        coords, counts = unique_rows(idx)
        return leverage_sample_set(exclude, coords, counts, krp_rows(factors, coords, exclude), J, Gp, G)


def leverage_sample_set(
    mode: int, coords: np.ndarray, counts: np.ndarray, rows: np.ndarray, J: int, Gp: np.ndarray, G: np.ndarray
) -> SampleSet:
    """The :class:`SampleSet` of ``J`` draws by exact leverage scores: distinct multi-indices
    ``coords``, how often each was drawn and their Khatri-Rao ``rows``; the probability of a row
    ``h`` is ``h Gp h^T / trace(Gp G)`` (``G`` the product's Gram, ``Gp`` its pseudo-inverse)."""
    probs = np.empty(coords.shape[0])
    row_quadforms(rows, Gp, probs)
    probs /= np.sum(Gp * G)
    if not np.all(probs > 0):
        raise RuntimeError("a drawn row has zero leverage score (numerical breakdown)")
    return SampleSet(
        mode=mode,
        coords=coords,
        weights=counts / (J * probs),
        rows=rows,
        draws=J,
        counts=counts,
        probs=probs,
        deterministic=np.zeros(coords.shape[0], dtype=bool),
    )
