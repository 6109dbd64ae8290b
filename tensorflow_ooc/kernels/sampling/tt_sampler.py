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
drawn by a walk down the Khatri-Rao sampler's :class:`~.krp_sampler.RowTree` over those rows
(Corollary 5.3.3, the walk of Algorithm 6: left child's mass from its Gram, the right one's the
parent's minus it) and a scan of the leaf reached, then divided by ``R_{k-1}``:
``O(R_k^2 log(I_k R_{k-1} / R_k))`` a draw.

Each draw walks on its own (:func:`_walk_draws`, parallel over blocks of draws, a few draws
walked together level by level so their independent steps overlap): at TT ranks the node matrices
are tiny (R_k = 4 .. 12), and the batched walk of :func:`~.krp_sampler.draw_rows` (matrix products
over the draws at a node, made for CP ranks of 16 .. 50) spent its time in per-node BLAS calls and
group bookkeeping. A node's mass ``h^T M h`` is one dot product of the node's upper triangle
(off-diagonal entries doubled, :attr:`CoreTree.packed`) with ``h``'s, formed once per draw:
``R(R+1)/2`` multiply-adds instead of ``R^2 + R``; a leaf's rows are kept transposed
(:attr:`CoreTree.leaves`) so its scan vectorizes over the rows. Each draw keeps its own history
(no search for repeated ones: the ``np.unique`` calls that found them cost more than the
histories). 65536 draws of one nell2-shaped core (28818 rows), one thread: 12 / 22 / 29 ms at
R = 4 / 8 / 12, against 35 / 39 / 51 ms for the batched walk (the same draws for the same
uniforms).

The core drawn second sees at most one history per slice and column of the first; where those
times its rows are few a draw, each history's row masses are summed once and its draws found by
bisection of their running sums (:func:`_grouped_draws`, the walk's inverse CDF in one level).

The first core drawn has no history: marginalized over ``r`` its slices have probability
``||A_{j-1}[:, t, :]||_F^2 / R_{j-1}``, drawn by inverse CDF (the slice masses' cumulative sums are
kept beside the tree), then ``r`` given the slice from its column masses: no walks (and no tree:
a core's :class:`~.krp_sampler.RowTree` is built on its first walk).

The right chain is the mirror image: the cores after ``j`` transposed (``A_k[a, i, b] ->
A_k[b, i, a]``) and reversed are a left-orthonormal chain whose rows are ``Rt(t)^T``.

Each draw's history is kept at unit norm (its scale does not change the next core's
distribution; without it the norms shrink by the chain's factors and can underflow). A draw reads
only its own uniforms, so the draws do not depend on the thread count.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from ...blas_threads import one_blas_thread
from .krp_sampler import RowTree, SampleSet, _draw_row_for_query, _pick, build_tree, unique_rows

SIDES = ("left", "right")

_BELOW_ONE = float(np.nextafter(1.0, 0.0))

# Draws per block of the draw kernels' parallel loop (scratch allocated once a block).
_DRAW_BLOCK = 1024

# Draws walked together, level by level (:func:`_descend_lanes`): 32 measured as good as 16 or 64.
_WALK_LANES = 32

# The core drawn second in a chain is drawn from its histories' whole row masses
# (:func:`_grouped_draws`) where the histories (at most the first core's slices times columns)
# times its rows are at most this many rows a draw (the break-even in docs/KERNELS.md).
GROUPED_ROWS = 16

# Groups of draws a block of :func:`_grouped_draws`'s parallel loop (scratch allocated once a block).
_GROUP_BLOCK = 64


# ---------------------------------------------------------------------------------------------
# cores and trees


def check_cores(cores: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The cores as float64 arrays (views where they are; the kernels read slice-major copies or
    views, :func:`oriented_slices`); ValueError unless they form a tensor train: ``N >= 1`` 3-D
    cores ``(R_{k-1}, I_k, R_k)`` with matching ranks, ``R_0 = R_N = 1``, every size positive."""
    out = [np.asarray(c, dtype=np.float64) for c in cores]
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


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")


def oriented_slices(core: np.ndarray, side: str) -> np.ndarray:
    """The core's slices as the sampler reads them, a float64 C array ``(I, R_a, R_b)``: slice ``t``
    is ``core[:, t, :]`` for ``"left"`` and ``core[:, t, :].T`` (that of :func:`mirrored`) for
    ``"right"``. A view where the core is one already (a :class:`~tensorflow_ooc.kernels.tt.cores.TTCores`
    core's ``"left"`` slices), else a copy."""
    _check_side(side)
    c = core if side == "left" else mirrored(core)
    return np.ascontiguousarray(c.transpose(1, 0, 2), dtype=np.float64)


def slice_rows(core: np.ndarray, side: str) -> np.ndarray:
    """The matrix whose rows the sampler draws from a ``side`` core: slice-major, so slice ``t``
    owns a block of consecutive rows.

    ``"left"``: ``(I R_{k-1}, R_k)``, row ``t R_{k-1} + a`` = ``core[a, t, :]`` (for a left-orthonormal
    core its columns are orthonormal). ``"right"``: ``(I R_k, R_{k-1})``, row ``t R_k + b`` =
    ``core[:, t, b]`` (the left rows of :func:`mirrored`)."""
    s = oriented_slices(core, side)
    return s.reshape(s.shape[0] * s.shape[1], s.shape[2])


def packed_grams(grams: np.ndarray) -> np.ndarray:
    """Symmetric matrices ``grams`` (n, R, R) as their upper triangles row by row (n, R(R+1)/2),
    the off-diagonal entries doubled: ``q^T M q`` is then the dot product of a row with the packed
    ``q_a q_b`` (:func:`_outer_packed`)."""
    out = np.empty((grams.shape[0], grams.shape[1] * (grams.shape[1] + 1) // 2))
    _pack_upper(grams, out)
    return out


@nb.njit(nogil=True, cache=True)
def _pack_upper(grams, out):
    """:func:`packed_grams` into ``out`` (a loop: NumPy's fancy indexing and product took 1-2.6 ms
    for the 1-4 k nodes of a nell2-shaped core's tree)."""
    R = grams.shape[1]
    for v in range(grams.shape[0]):
        p = 0
        for a in range(R):
            out[v, p] = grams[v, a, a]
            p += 1
            for b in range(a + 1, R):
                out[v, p] = grams[v, a, b] * 2.0
                p += 1


def leaf_columns(rows: np.ndarray, P: int, F: int) -> np.ndarray:
    """The rows of each of ``P`` leaves of ``F`` rows, transposed: ``(P, R, F)``, ``out[l, :, i]`` =
    ``rows[l F + i]``, zero past the last row. A leaf's row masses ``(rows[i] . h)^2`` are then
    ``R`` multiply-adds of contiguous length-``F`` vectors, vectorized over the rows, where one dot
    product a row vectorized over ``R`` = 4..12 columns badly (a nell2-shaped leaf scan of 27 rows
    at R = 12: 180 ns a draw, about 40 % of the walk)."""
    out = np.empty((P, rows.shape[1], F))
    _transpose_leaves(np.ascontiguousarray(rows, dtype=np.float64), out)
    return out


@nb.njit(nogil=True, cache=True)
def _transpose_leaves(rows, out):
    """:func:`leaf_columns` into ``out`` (P, R, F), zero past the last row (a loop: NumPy's
    transposing copy of 28818 x 8 rows took 1.5 ms)."""
    I = rows.shape[0]
    P, R, F = out.shape
    for leaf in range(P):
        for a in range(R):
            for i in range(F):
                t = leaf * F + i
                out[leaf, a, i] = rows[t, a] if t < I else 0.0


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
        :func:`slice_rows` of the core for ``side``: the matrix the tree is built on.
    colmass : float64 (I_k, R_b)
        ``colmass[t, b]``: the squared norm of column ``b`` of slice ``t`` (rows ``t R_a ..`` of
        ``rows``). The first core drawn has no history: its slice is drawn from the row sums by
        inverse CDF (``cdf``), then the column given the slice.
    cdf : float64 (I_k,)
        Cumulative squared Frobenius norms of the core's slices.
    leaf_rows : int or None
        Passed to :func:`~.krp_sampler.build_tree` when the tree is built.

    The :class:`~.krp_sampler.RowTree` over ``rows`` (:attr:`tree`), its packed node Grams
    (:attr:`packed`) and its leaves' rows transposed (:attr:`leaves`) are built on first use: a core
    drawn first in its chain needs none of them.
    """

    side: str
    shape: tuple[int, int, int]
    rows: np.ndarray
    colmass: np.ndarray
    cdf: np.ndarray
    leaf_rows: int | None = None
    _walked: tuple[RowTree, np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def slices(self) -> np.ndarray:
        """``rows`` as the slices ``(I_k, R_a, R_b)`` (a view)."""
        return self.rows.reshape(self.shape[1], -1, self.rows.shape[1])

    def _walk_structure(self) -> tuple[RowTree, np.ndarray, np.ndarray]:
        if self._walked is None:
            tree = build_tree(self.rows, self.leaf_rows)
            self._walked = (tree, packed_grams(tree.grams), leaf_columns(self.rows, tree.nleaves, tree.leaf_rows))
        return self._walked

    def build_walks(self) -> None:
        """Build :attr:`tree`, :attr:`packed` and :attr:`leaves` now (else on the first walk)."""
        self._walk_structure()

    @property
    def tree(self) -> RowTree:
        """Segment tree of partial Gram matrices over ``rows`` (walked for draws with a history)."""
        return self._walk_structure()[0]

    @property
    def packed(self) -> np.ndarray:
        """The tree's node Grams packed for the walk (:func:`packed_grams`)."""
        return self._walk_structure()[1]

    @property
    def leaves(self) -> np.ndarray:
        """The rows of each leaf of the tree, transposed (:func:`leaf_columns`)."""
        return self._walk_structure()[2]

    @property
    def nbytes(self) -> int:
        n = self.rows.nbytes + self.colmass.nbytes + self.cdf.nbytes
        if self._walked is not None:
            n += self._walked[0].nbytes + self._walked[1].nbytes + self._walked[2].nbytes
        return int(n)


def build_core_tree(core: np.ndarray, side: str, leaf_rows: int | None = None) -> CoreTree:
    """Build a core's :class:`CoreTree`; rebuild it whenever the core changes.

    Cost ``O(I_k R_a R_b)`` here, and ``O(I_k R_a R_b^2)`` for the tree on its first walk
    (``R_a, R_b`` = ``R_{k-1}, R_k`` for ``"left"``, swapped for ``"right"``: the tree's partial Grams
    are ``R_b x R_b`` over ``I_k R_a`` rows), memory about two and a half times the core's
    (:func:`~.krp_sampler.build_tree`'s default leaves hold ``2 R_b`` to ``4 R_b`` rows, so the tree
    is no larger than the rows it covers, and its packed copy about half that).

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
    # a copy where the slices are the core's own (a tree never changes with its core); the right
    # side's are one already (a second copy of a nell2-shaped middle core: 1-2 ms an update)
    sq = oriented_slices(core, side)
    if np.may_share_memory(sq, core):
        sq = sq.copy()
    colmass = np.einsum("tab,tab->tb", sq, sq)
    rows = sq.reshape(sq.shape[0] * sq.shape[1], sq.shape[2])
    shape = tuple(int(s) for s in core.shape)
    return CoreTree(side, shape, rows, colmass, np.cumsum(colmass.sum(axis=1)), leaf_rows)


def chain_trees(
    cores: Sequence[np.ndarray],
    j: int,
    leaf_rows: int | None = None,
    cache: dict[tuple[int, str], CoreTree] | None = None,
) -> list[CoreTree | None]:
    """The trees both chains of target core ``j`` use: ``"left"`` trees of the cores before ``j``,
    ``"right"`` trees of those after it, None at ``j``. ``O(sum_k I_k R_{k-1} R_k max(R_{k-1}, R_k))``;
    ``leaf_rows`` as for :func:`build_core_tree`.

    In a sweep only the cores an update changed need new trees; the others keep theirs while their
    side and values are unchanged. ``cache`` holds such trees by ``(core, side)``: those found there
    are used, the others built and stored there (the caller drops a core's entries when it changes
    the core)."""
    cores = check_cores(cores)
    j = _check_target(cores, j)
    out: list[CoreTree | None] = []
    for k, c in enumerate(cores):
        side = "left" if k < j else "right"
        tr = None if k == j or cache is None else cache.get((k, side))
        if tr is None and k != j:
            tr = build_core_tree(c, side, leaf_rows)
            if cache is not None:
                cache[(k, side)] = tr
        out.append(tr)
    return out


# ---------------------------------------------------------------------------------------------
# kernels


@nb.njit(parallel=True, nogil=True, cache=True)
def _times_slices(v, slices, t, out):
    """``out[d] = v[d] @ slices[t[d]]`` (a row vector through the slice of each draw; ``slices``
    (I, R_a, R_b), :func:`oriented_slices`)."""
    _, Ra, Rb = slices.shape
    for d in nb.prange(t.shape[0]):
        for b in range(Rb):
            out[d, b] = 0.0
        for a in range(Ra):
            x = v[d, a]
            for b in range(Rb):
                out[d, b] += x * slices[t[d], a, b]


@nb.njit(nogil=True, cache=True)
def _guide_table(cdf, K):
    """``g[k]``: the first ``i`` with ``cdf[i] > (k / K) cdf[-1]`` (at most ``len(cdf) - 1``), a start
    for the inverse-CDF search of a uniform in ``[k / K, (k + 1) / K)`` (Chen's guide table)."""
    n = cdf.shape[0]
    total = cdf[n - 1]
    g = np.empty(K, dtype=np.int64)
    i = 0
    for k in range(K):
        edge = (k / K) * total
        while i < n - 1 and cdf[i] <= edge:
            i += 1
        g[k] = i
    return g


@nb.njit(nogil=True, cache=True)
def _search_right(cdf, target, i):
    """``np.searchsorted(cdf, target, side="right")`` (``cdf`` nondecreasing), searched from ``i``:
    exact from any start, a few steps from a guide table's."""
    while i > 0 and cdf[i - 1] > target:
        i -= 1
    while i < cdf.shape[0] and cdf[i] <= target:
        i += 1
    return i


@nb.njit(parallel=True, nogil=True, cache=True)
def _first_draws(cdf, colmass, slices, last, x, t, r, H):
    """Draws from the first core of a left chain (no history): the slice ``t[d]`` from the marginal
    (cumulative slice masses ``cdf``) by inverse CDF with ``x[d, 0]``, then the column ``r[d]`` given
    the slice (masses ``colmass[t]``) with ``x[d, 1]``, and the history they start, ``H[d]`` =
    ``slices[t[d], :, r[d]]`` at unit norm (in the same pass; none where ``H`` has no rows, a chain
    of one core). Slices and columns of zero mass are never drawn: the search finds the first cdf
    above the target (``side="right"``), so slices whose cdf equals the one before are skipped, and
    a target rounded up to the total goes to the last slice (``last``) or column with mass.

    The search starts from a guide table of ``len(cdf)`` buckets: a bisection of the 28818 slices of
    a nell2-shaped core cost 140 ns a draw in branch misses (9 ms for 65536)."""
    total = cdf[cdf.shape[0] - 1]
    K = cdf.shape[0]
    guide = _guide_table(cdf, K)
    Ra, Rb = slices.shape[1], slices.shape[2]
    hist = H.shape[0] > 0
    for d in nb.prange(x.shape[0]):
        target0 = x[d, 0] * total
        s = min(_search_right(cdf, target0, guide[min(int(x[d, 0] * K), K - 1)]), last)
        acc = 0.0
        lastcol = Rb - 1
        for b in range(Rb):
            acc += colmass[s, b]
        for b in range(Rb - 1, -1, -1):
            if colmass[s, b] > 0.0:
                lastcol = b
                break
        target = x[d, 1] * acc
        c = 0
        cum = 0.0
        for b in range(Rb):
            cum += colmass[s, b]
            if cum <= target:
                c += 1
        c = min(c, lastcol)
        t[d] = s
        r[d] = c
        if hist:
            nrm = 0.0
            for a in range(Ra):
                v = slices[s, a, c]
                H[d, a] = v
                nrm += v * v
            inv = 1.0 / np.sqrt(nrm)
            for a in range(Ra):
                H[d, a] *= inv


@nb.njit(nogil=True, cache=True)
def _next_history(slices, t, h, out):
    """``out = slices[t] @ h`` at unit norm (the history through one more core; its scale does not
    matter to the draws)."""
    Ra, Rb = slices.shape[1], slices.shape[2]
    nrm = 0.0
    for a in range(Ra):
        s = 0.0
        for b in range(Rb):
            s += slices[t, a, b] * h[b]
        out[a] = s
        nrm += s * s
    if nrm > 0.0:
        inv = 1.0 / np.sqrt(nrm)
        for a in range(Ra):
            out[a] *= inv


@nb.njit(nogil=True, cache=True)
def _outer_packed(h, qq):
    """``qq``: the products ``h[a] h[b]``, ``a <= b``, in :func:`packed_grams` order."""
    R = h.shape[0]
    p = 0
    for a in range(R):
        ha = h[a]
        for b in range(a, R):
            qq[p] = ha * h[b]
            p += 1


@nb.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _packed_mass(G, qq):
    """``q^T M q`` from ``M``'s packed row ``G`` and ``q``'s packed products ``qq``; vectorized (the
    summation order is the compiled kernel's, the same for every call and thread)."""
    s = 0.0
    for p in range(qq.shape[0]):
        s += G[p] * qq[p]
    return s


@nb.njit(nogil=True, cache=True)
def _descend_lanes(packed, P, nvalid, qq, m, x, v, lo, ok):
    """The walks of a few draws (lanes) from the root of a :class:`~.krp_sampler.RowTree` to a leaf,
    level by level (Algorithm 6): only left children's masses are computed, the right one's is the
    parent's minus it (clamped at 0), a child of zero mass is never entered, and the uniform is
    rescaled at each level so it keeps its precision relative to the node.

    Parameters
    ----------
    packed : float64 (2P-1, R(R+1)/2)   the tree's node Grams, :func:`packed_grams`
    P : int                             leaves (a power of two)
    nvalid : int                        leaves ``>= nvalid`` are padding (zero mass)
    qq : float64 (B, R(R+1)/2)          each lane's query, packed (:func:`_outer_packed`)
    m : float64 (B,)                    each lane's root mass (then the mass of its node)
    x : float64 (B,)                    each lane's uniform in [0, 1), rescaled in place to a position
                                        inside the mass of the leaf reached
    v, lo : int64 (B,)                  outputs: the node reached (root 0 in) and its first leaf
    ok : bool (B,)                      False where a walk broke down in rounding (zero root mass in,
                                        or both children of zero mass); such lanes end anywhere

    The lanes' walks are independent, and each level's decision is arithmetic (selects, no
    branch): a walk waits on its node's mass at every level, and with one draw at a time the
    half-mispredicted left/right branch serialized the levels (nell2-shaped, 65536 draws at
    R = 4: 20 ms one at a time, 13 ms in lanes of 32; the same decisions).
    """
    B = m.shape[0]
    width = P
    while width > 1:
        half = width >> 1
        for b in range(B):
            left = 2 * v[b] + 1
            mL = max(_packed_mass(packed[left], qq[b]), 0.0)
            mR = max(m[b] - mL, 0.0) if lo[b] + half < nvalid else 0.0
            tot = mL + mR
            ok[b] = ok[b] & (tot > 0.0)
            y = x[b] * tot
            # into the left child unless it has no mass, or the target passes it and the right has some
            right = (not mL > 0.0) | ((not y < mL) & (mR > 0.0))
            mc = mR if right else mL
            mc = mc if mc > 0.0 else 1.0  # a broken-down walk (ok False) goes on harmlessly
            xn = (y - (mL if right else 0.0)) / mc
            m[b] = mc
            v[b] = left + right
            lo[b] += half * right
            x[b] = min(max(xn, 0.0), _BELOW_ONE)
        width = half


@nb.njit(nogil=True, cache=True)
def _scan_leaf(cols, n, h, x, q, lo):
    """The row ``lo + i`` (``i < n``) of a leaf drawn with probability ``~ (row_i . h)^2`` by inversion
    of ``x`` (:func:`~.krp_sampler._pick`), the leaf's rows transposed in ``cols`` (R, F)
    (:func:`leaf_columns`); -1 where its total is zero. ``q`` (F,) is scratch."""
    F = cols.shape[1]
    for i in range(F):
        q[i] = 0.0
    for a in range(h.shape[0]):
        ha = h[a]
        c = cols[a]
        for i in range(F):
            q[i] += c[i] * ha
    for i in range(n):
        q[i] = q[i] * q[i]
    return _pick(q[:n], x, lo)


@nb.njit(parallel=True, nogil=True, cache=True)
def _walk_draws(rows, leaves, packed, grams, P, F, slices, H, x, t, Hn):
    """``t[d]``: the slice of the row of ``rows`` (I, R) drawn with probability ``~ (rows[i] . H[d])^2``
    with the uniform ``x[d]`` (``rows`` the slices ``slices`` (I / R_a, R_a, R) stacked, so the row's
    slice is ``row // R_a``), by the walk of the tree (``packed`` node Grams, ``P`` leaves of ``F``
    rows, their rows transposed in ``leaves``) and the scan of the leaf reached; ``Hn[d]`` the
    history through that slice (:func:`_next_history`) unless ``Hn`` has no rows. A draw whose walk
    broke down in rounding is drawn again by the careful walk (both children's masses from their
    own Grams ``grams``, the same uniform). Returns the number of draws where that broke down too
    (not expected for finite cores; their ``t`` is 0). Blocks of draws in parallel, each walked in
    lanes (:func:`_descend_lanes`); a draw reads only its own history and uniform, so the draws do
    not depend on the thread count."""
    J = H.shape[0]
    I = rows.shape[0]
    Ra = slices.shape[1]
    nvalid = (I + F - 1) // F
    n = packed.shape[1]
    nextc = Hn.shape[0] > 0
    nblk = (J + _DRAW_BLOCK - 1) // _DRAW_BLOCK
    bad = 0
    for blk in nb.prange(nblk):
        qq = np.empty((_WALK_LANES, n))
        m = np.empty(_WALK_LANES)
        xs = np.empty(_WALK_LANES)
        v = np.empty(_WALK_LANES, dtype=np.int64)
        lo = np.empty(_WALK_LANES, dtype=np.int64)
        ok = np.empty(_WALK_LANES, dtype=np.bool_)
        q = np.empty(F)
        for d0 in range(blk * _DRAW_BLOCK, min(J, (blk + 1) * _DRAW_BLOCK), _WALK_LANES):
            B = min(J - d0, _WALK_LANES)
            for b in range(B):
                _outer_packed(H[d0 + b], qq[b])
                m[b] = _packed_mass(packed[0], qq[b])
                ok[b] = m[b] > 0.0
                xs[b] = x[d0 + b]
                v[b] = 0
                lo[b] = 0
            _descend_lanes(packed, P, nvalid, qq[:B], m[:B], xs[:B], v[:B], lo[:B], ok[:B])
            for b in range(B):
                d = d0 + b
                row = -1
                first = lo[b] * F
                if ok[b] and first < I:
                    row = _scan_leaf(leaves[lo[b]], min(F, I - first), H[d], xs[b], q, first)
                if row < 0:
                    row = _draw_row_for_query(rows, grams, P, F, H[d], x[d])
                if row < 0:
                    bad += 1
                    row = 0
                t[d] = row // Ra
                if nextc:
                    _next_history(slices, t[d], H[d], Hn[d])
    return bad


@nb.njit(nogil=True, cache=True)
def _sort_by_key(keys, nkeys):
    """Draws ordered by key (a counting sort, stable) and the start of each key's run (nkeys + 1)."""
    starts = np.zeros(nkeys + 1, dtype=np.int64)
    for d in range(keys.shape[0]):
        starts[keys[d] + 1] += 1
    for k in range(nkeys):
        starts[k + 1] += starts[k]
    pos = starts[:nkeys].copy()
    order = np.empty(keys.shape[0], dtype=np.int64)
    for d in range(keys.shape[0]):
        order[pos[keys[d]]] = d
        pos[keys[d]] += 1
    return order, starts


@nb.njit(parallel=True, nogil=True, cache=True)
def _grouped_draws(leaves, I, slices, H, keys, nkeys, x, t, Hn):
    """:func:`_walk_draws` for draws whose histories are one of few: draws with equal ``keys`` (ids
    below ``nkeys``) have equal histories ``H`` (the first core's slice and column). Each distinct
    history's masses ``(row . h)^2`` of all ``I`` rows (their leaves' transposed rows ``leaves``,
    vectorized over a leaf's rows) are summed once, and each of its draws is the first row whose
    running sum passes ``x[d]`` times the total (a branchless bisection): the walk's inverse CDF of
    the same uniform in one level, the same rows but where rounding differs. Returns the number of
    draws whose history has no mass (not expected for orthonormal cores; their ``t`` is 0). Blocks
    of groups in parallel; a draw reads only its history and uniform, so the draws do not depend
    on the thread count."""
    P, Rb, F = leaves.shape
    Ra = slices.shape[1]
    nextc = Hn.shape[0] > 0
    order, starts = _sort_by_key(keys, nkeys)
    groups = np.flatnonzero(starts[1:] > starts[:-1])
    G = groups.shape[0]
    nblk = (G + _GROUP_BLOCK - 1) // _GROUP_BLOCK
    bad = 0
    for blk in nb.prange(nblk):
        cum = np.empty(P * F)
        for gi in range(blk * _GROUP_BLOCK, min(G, (blk + 1) * _GROUP_BLOCK)):
            g = groups[gi]
            h = H[order[starts[g]]]
            for leaf in range(P):
                base = leaf * F
                for i in range(F):
                    cum[base + i] = 0.0
                for a in range(Rb):
                    ha = h[a]
                    for i in range(F):
                        cum[base + i] += leaves[leaf, a, i] * ha
            lastrow = -1
            acc = 0.0
            for i in range(I):
                q = cum[i] * cum[i]
                if q > 0.0:
                    lastrow = i
                acc += q
                cum[i] = acc
            if not acc > 0.0:
                bad += starts[g + 1] - starts[g]
            for p in range(starts[g], starts[g + 1]):
                d = order[p]
                row = 0
                if acc > 0.0:
                    target = x[d] * acc
                    lo = 0
                    span = I
                    while span > 1:  # the first row whose running sum exceeds the target
                        half = span >> 1
                        lo = lo + half if cum[lo + half - 1] <= target else lo
                        span -= half
                    row = min(lo, lastrow)
                t[d] = row // Ra
                if nextc:
                    _next_history(slices, t[d], H[d], Hn[d])
    return bad


@nb.njit(parallel=True, nogil=True, cache=True)
def _run_packs(L, Rt, w, starts, PL, MR):
    """Per run ``g`` of rows with one left factor (rows ``starts[g] .. starts[g + 1] - 1``):
    ``PL[g]`` the packed products of ``L[starts[g]]`` (:func:`_outer_packed`) and ``MR[g]`` the sum
    of ``w[s]`` times those of ``Rt[s]`` over the run (each run summed in order by one thread)."""
    Rb = Rt.shape[1]
    for g in nb.prange(starts.shape[0] - 1):
        _outer_packed(L[starts[g]], PL[g])
        m = MR[g]
        for p in range(m.shape[0]):
            m[p] = 0.0
        for s in range(starts[g], starts[g + 1]):
            ws = w[s]
            p = 0
            for b in range(Rb):
                x = ws * Rt[s, b]
                for b2 in range(b, Rb):
                    m[p] += x * Rt[s, b2]
                    p += 1


@nb.njit(nogil=True, cache=True)
def _packed_index(a, b, R):
    """Position of ``(min(a, b), max(a, b))`` in an upper triangle packed row by row."""
    if a > b:
        a, b = b, a
    return a * (2 * R - a + 1) // 2 + b - a


@nb.njit(nogil=True, cache=True)
def _unpack_kron(Gpk, Ra, Rb, G):
    """``G[a Rb + b, a2 Rb + b2] = Gpk[packed (a, a2), packed (b, b2)]``."""
    for a in range(Ra):
        for a2 in range(Ra):
            pa = _packed_index(a, a2, Ra)
            for b in range(Rb):
                for b2 in range(Rb):
                    G[a * Rb + b, a2 * Rb + b2] = Gpk[pa, _packed_index(b, b2, Rb)]


# ---------------------------------------------------------------------------------------------
# draws


def _chain_rows(slices: Sequence[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Rows ``chain[0][0, i_0, :] @ chain[1][:, i_1, :] @ ...`` of a left chain (its cores'
    :func:`oriented_slices`) at the multi-indices ``idx`` (S, len(chain)), in that order."""
    v = np.ones((idx.shape[0], 1))
    for k, s in enumerate(slices):
        out = np.empty((idx.shape[0], s.shape[2]))
        _times_slices(v, s, np.ascontiguousarray(idx[:, k], dtype=np.int64), out)
        v = out
    return v


def _draw_chain(trees: Sequence[CoreTree], count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` rows of a left-orthonormal chain (the cores whose left :class:`CoreTree` are
    ``trees``, ``R_a = 1`` for the first) drawn by squared row norm, cores from the last to the
    first: int64 (count, len(trees)) indices. The last core only uses its ``colmass`` and ``cdf``.

    The uniforms: ``(count, 2)`` for the last core, then ``count`` for each core before it. Each
    core's draws are one kernel (the slices and the histories they lead to in the same pass), the
    indices written in place: no NumPy passes between the cores. The core drawn second sees at
    most one history per slice and column of the first: where that bound times its rows is at most
    :data:`GROUPED_ROWS` rows a draw, each history's row masses are summed once
    (:func:`_grouped_draws`) instead of walked for every draw."""
    m = len(trees)
    idx = np.empty((m, count), dtype=np.int64)
    first = trees[m - 1]
    if not first.cdf[-1] > 0.0:
        raise ValueError("the core drawn first is zero: the chain has no rows of positive norm")
    last = int(np.flatnonzero(np.diff(first.cdf, prepend=0.0) > 0.0)[-1])
    fs = first.slices
    r = np.empty(count, dtype=np.int64)
    H = np.empty((count if m > 1 else 0, fs.shape[1]))
    _first_draws(first.cdf, first.colmass, fs, last, rng.random((count, 2)), idx[m - 1], r, H)
    for k in range(m - 2, -1, -1):
        tr = trees[k]
        x = rng.random(count)
        Hn = np.empty((count if k > 0 else 0, tr.slices.shape[1]))
        nkeys = fs.shape[0] * fs.shape[2]
        # (the keys' counting sort costs a pass over all keys: not for far more keys than draws)
        if k == m - 2 and nkeys <= 4 * count and min(nkeys, count) * tr.rows.shape[0] <= GROUPED_ROWS * count:
            keys = idx[m - 1] * fs.shape[2] + r
            bad = _grouped_draws(tr.leaves, tr.rows.shape[0], tr.slices, H, keys, nkeys, x, idx[k], Hn)
        else:
            tree = tr.tree
            bad = _walk_draws(
                tr.rows, tr.leaves, tr.packed, tree.grams, tree.nleaves, tree.leaf_rows, tr.slices, H, x, idx[k], Hn
            )
        if bad:
            raise RuntimeError(f"leverage sampling broke down numerically ({bad} of {count} draws)")
        H = Hn
    return idx.T


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


def _left_trees(cores, j, trees) -> list[CoreTree]:
    """The left chain of target core ``j`` as trees: cores ``0 .. j-1``."""
    return _side_trees(cores, range(j), "left", trees)


def _right_trees(cores, j, trees) -> list[CoreTree]:
    """The right chain of target core ``j`` as a left chain of trees: cores ``N-1 .. j+1``, mirrored."""
    return _side_trees(cores, range(len(cores) - 1, j, -1), "right", trees)


def _left_draws(ts: Sequence[CoreTree], count: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (count, j) of :func:`draw_left_chain` (``ts``: :func:`_left_trees`)."""
    if not ts:
        return np.zeros((count, 0), dtype=np.int64)
    return _draw_chain(ts, count, rng)


def _right_draws(ts: Sequence[CoreTree], count: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (count, N-1-j) of :func:`draw_right_chain`, in mode order (``ts``: :func:`_right_trees`)."""
    if not ts:
        return np.zeros((count, 0), dtype=np.int64)
    return np.ascontiguousarray(_draw_chain(ts, count, rng)[:, ::-1])


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
    idx = _check_indices(indices, [c.shape[1] for c in cores[:j]])
    return _chain_rows([oriented_slices(c, "left") for c in cores[:j]], idx)


def right_chain_rows(cores: Sequence[np.ndarray], j: int, indices: np.ndarray) -> np.ndarray:
    """Rows ``Rt(t)^T`` (S, R_j) of the right chain of target core ``j``, ``Rt(t) = A_{j+1}[:, t_{j+1}, :]
    @ ... @ A_{N-1}[:, t_{N-1}, :]``, at multi-indices ``indices`` (S, N-1-j) (modes ``j+1 ..``);
    for ``j = N-1``, ones (S, 1)."""
    cores = check_cores(cores)
    j = _check_target(cores, j)
    indices = _check_indices(indices, [c.shape[1] for c in cores[j + 1 :]])
    return _chain_rows([oriented_slices(c, "right") for c in cores[:j:-1]], indices[:, ::-1])


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
    ts = _left_trees(cores, j, trees)
    idx = _left_draws(ts, _check_count(count), rng)
    rows = _chain_rows([t.slices for t in ts], idx)
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
    ts = _right_trees(cores, j, trees)
    idx = _right_draws(ts, _check_count(count), rng)
    rows = _chain_rows([t.slices for t in ts], idx[:, ::-1])
    return idx, np.einsum("sr,sr->s", rows, rows) / rows.shape[1]


def design_rows(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Rows ``kron(L(s), Rt(t))`` (S, R_{j-1} R_j) of the design ``A_{<j} (x) A_{>j}^T``: entry
    ``a R_j + b`` is ``L[a] Rt[b]``, so the model value ``X[s, i, t]`` is the row times
    ``core_j[:, i, :].ravel()``."""
    # the width named: a partition that matched no sample has zero rows, and -1 cannot be solved for
    return (left[:, :, None] * right[:, None, :]).reshape(left.shape[0], left.shape[1] * right.shape[1])


def kron_gram(left: np.ndarray, right: np.ndarray, weights: np.ndarray, left_coords: np.ndarray) -> np.ndarray:
    """``sum_s weights[s] d_s^T d_s`` for the design rows ``d_s = kron(left[s], right[s])``
    (:func:`design_rows`), without forming them: ``sum_g kron(L_g L_g^T, sum_{s in g} w_s Rt_s Rt_s^T)``
    over runs ``g`` of rows with equal ``left_coords`` (S, j) (the left multi-indices: one left row
    per run), both factors symmetric and packed (:func:`packed_grams`'s order), so one product of
    ``(runs, R_a(R_a+1)/2)^T (runs, R_b(R_b+1)/2)`` on one BLAS thread.

    Sample sets are sorted by multi-index, so the runs are the distinct left multi-indices (at most
    ``I_0`` for ``j = 1``; one for ``j = 0``). 65536 nell2-shaped rows of core 1 (12 k runs), one
    thread: 28 / 97 ms for the dense product of the design rows at R = 8 / 12, 8 / 16 ms this way.
    Exactly symmetric."""
    S, Ra = left.shape
    Rb = right.shape[1]
    if S == 0:
        return np.zeros((Ra * Rb, Ra * Rb))
    # no left modes (j = 0): no row starts a new run, so one run
    starts = np.flatnonzero(np.r_[True, np.any(left_coords[1:] != left_coords[:-1], axis=1), True])
    PL = np.empty((starts.shape[0] - 1, Ra * (Ra + 1) // 2))
    MR = np.empty((starts.shape[0] - 1, Rb * (Rb + 1) // 2))
    _run_packs(
        np.ascontiguousarray(left, dtype=np.float64),
        np.ascontiguousarray(right, dtype=np.float64),
        np.ascontiguousarray(weights, dtype=np.float64),
        starts.astype(np.int64),
        PL,
        MR,
    )
    with one_blas_thread():
        Gpk = PL.T @ MR
    G = np.empty((Ra * Rb, Ra * Rb))
    _unpack_kron(Gpk, Ra, Rb, G)
    return G


class CoreSampleSet(SampleSet):
    """A :class:`~.krp_sampler.SampleSet` of TT design rows kept as the chain rows they are made of:
    ``rows`` (S, R_{j-1} R_j) is formed on request (:func:`design_rows`), the Gram and the weighted
    rows of a gather come from the factors.

    Attributes
    ----------
    left : float64 (S, R_{j-1})
        ``L(s)`` of each sample (ones (S, 1) for ``j = 0``).
    right : float64 (S, R_j)
        ``Rt(t)^T`` of each sample (ones (S, 1) for ``j = N-1``).

    Forming the 65536 design rows at R = 12 (75 MB) took 19 ms, and as many again to weight them for
    the gather, which reads only those of the samples whose fibers hold nonzeros (11-33 k of 50-60 k
    on the nell2-shaped tensor); the set a task hands the partitions is about
    ``R_{j-1} R_j / (R_{j-1} + R_j)`` times smaller.
    """

    def __init__(
        self,
        mode: int,
        coords: np.ndarray,
        weights: np.ndarray,
        left: np.ndarray,
        right: np.ndarray,
        draws: int,
        counts: np.ndarray,
        probs: np.ndarray,
    ) -> None:
        self.mode = mode
        self.coords = coords
        self.weights = weights
        self.left = left
        self.right = right
        self.draws = draws
        self.counts = counts
        self.probs = probs
        self.deterministic = np.zeros(coords.shape[0], dtype=bool)

    @property
    def rows(self) -> np.ndarray:
        """The design rows (S, R_{j-1} R_j), formed on each request."""
        return design_rows(self.left, self.right)

    @property
    def ncols(self) -> int:
        return int(self.left.shape[1] * self.right.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float64)

    def weighted_rows(self, which: np.ndarray | None = None) -> np.ndarray:
        """``weights[s] * rows[s]`` of the samples ``which`` (all by default), formed from the factors."""
        if which is None:
            return design_rows(self.weights[:, None] * self.left, self.right)
        return design_rows(self.weights[which, None] * self.left[which], self.right[which])

    def gram(self) -> np.ndarray:
        """The sketched Gram ``rows^T diag(weights) rows`` from the chain rows (:func:`kron_gram`)."""
        return kron_gram(self.left, self.right, self.weights, self.coords[:, : self.mode])


def draw_core_samples(
    cores: Sequence[np.ndarray],
    j: int,
    count: int,
    rng: np.random.Generator,
    trees: Sequence[CoreTree | None] | None = None,
) -> CoreSampleSet:
    """Draw ``count`` rows of the design ``A_{<j} (x) A_{>j}^T`` of core ``j`` by their leverage
    scores (left and right multi-indices drawn independently), merged into a :class:`CoreSampleSet`.

    Parameters
    ----------
    cores, j, count, rng
        As for :func:`draw_left_chain` (cores before ``j`` left-, after ``j`` right-orthonormal).
    trees : sequence of N CoreTree or None, optional
        Left trees before ``j``, right trees after it (:func:`chain_trees`).

    Returns
    -------
    CoreSampleSet
        ``coords`` (S, N): distinct multi-indices (column ``j`` is 0), sorted; ``rows`` (S,
        R_{j-1} R_j): their design rows (:func:`design_rows`) and ``left``, ``right`` their factors;
        ``probs``: ``p_s p_t``; ``weights``: ``counts / (count p_s p_t)``, the squares of the
        sketch's row weights ``1 / sqrt(J p)`` summed over repeated draws, so
        ``rows^T diag(weights) rows`` is the sketched Gram (``I`` in expectation).
    """
    cores = check_cores(cores)
    j = _check_target(cores, j)
    count = _check_count(count)
    lt = _left_trees(cores, j, trees)
    rt = _right_trees(cores, j, trees)
    left = _left_draws(lt, count, rng)
    right = _right_draws(rt, count, rng)
    coords, counts = unique_rows(np.concatenate([left, np.zeros((count, 1), dtype=np.int64), right], axis=1))
    L = _chain_rows([t.slices for t in lt], coords[:, :j])
    Rt = _chain_rows([t.slices for t in rt], coords[:, :j:-1])
    probs = np.einsum("sr,sr->s", L, L) * np.einsum("sr,sr->s", Rt, Rt) / (L.shape[1] * Rt.shape[1])
    if not np.all(probs > 0):
        raise RuntimeError("a drawn design row has zero norm (the chains are not orthonormal, or broke down)")
    return CoreSampleSet(j, coords, counts / (count * probs), L, Rt, count, counts, probs)
