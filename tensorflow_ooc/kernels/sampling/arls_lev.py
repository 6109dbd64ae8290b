"""CP-ARLS-LEV: Khatri-Rao row sampling by the product of the factors' leverage scores (Larsen and
Kolda; seed 000 sections 3.6.9 and 4.7.1).

Each sampled mode ``k`` gets the distribution ``p_k(i) = l_k(i) / sum(l_k)`` of the leverage scores
``l_k(i) = U_k[i] pinv(U_k^T U_k) U_k[i]^T`` of its factor, and a Khatri-Rao row ``s`` (one index per
sampled mode) has probability ``p_s = prod_k p_k(s_k)``: the indices are drawn independently,
each by inverse CDF. This approximates the exact leverage scores of the product (see
``krp_sampler`` for exact sampling) and needs more draws as the rank and order grow.

The *hybrid* variant includes every row with ``p_s >= tau`` (``tau = 1/J`` by default)
deterministically with weight 1 and draws the other ``J_rand = J - n_det`` rows from the
distribution restricted to the rest, weighting them by ``count (1 - p_det) / (J_rand p_s)``; the
heavy rows then cannot be drawn over and over. Both pieces are exact (no rejection loop):

- the heavy rows are enumerated by a depth-first search over the modes with each mode's
  probabilities sorted in decreasing order, pruned where the partial product times the maxima of
  the remaining modes falls below ``tau``; every node it expands leads to a heavy row, so the work
  is ``O(n_det N)``.
- the restricted draws walk a trie of the heavy rows' prefixes: at a trie node, the next index is
  one of its children (with the mass of their non-heavy completions) or any other index of the
  mode (with its own probability; found by a binary search on the mode's CDF minus the children's
  mass), after which the remaining indices are unconstrained. This stays fast where the heavy rows
  hold almost all the mass, where rejecting heavy draws would take ``1 / (1 - p_det)`` tries each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numba as nb
import numpy as np

from .krp_sampler import (
    SampleSet,
    check_factors,
    check_gram,
    krp_rows,
    psd_pinv,
    row_quadforms,
    unique_rows,
)

# Remaining mass below which the hybrid sampler treats the heavy rows as covering everything
# (J_rand = 0): 1 - p_det is then rounding noise of the sum, not rows to draw.
REST_ATOL = 1e-12

# The pruning test of the heavy-row search is loosened by this relative margin so that a row
# whose probability equals tau is not lost to rounding in the bound; inclusion itself compares
# the row's probability with tau exactly.
_PRUNE_SLACK = 1e-12

_BLOCK = 256


# ---------------------------------------------------------------------------------------------
# kernels


@nb.njit(nogil=True, cache=True)
def _heavy_rows(P, poff, order, ooff, maxrest, tau, out, outp):
    """Every multi-index of probability ``>= tau`` under the product distribution.

    Parameters
    ----------
    P : float64 (sum I_l,)         the sampled modes' probability vectors, concatenated
    poff : int64 (n+1,)            mode ``l`` occupies ``P[poff[l]:poff[l+1]]``
    order, ooff : int64            mode ``l``'s candidate indices by decreasing probability are
                                   ``order[ooff[l]:ooff[l+1]]`` (at least those that can reach tau)
    maxrest : float64 (n+1,)       ``maxrest[l]`` = product of the largest probabilities of modes
                                   ``l..n-1``; ``maxrest[n] = 1``
    tau : float                    threshold
    out : int64 (cap, n)           found multi-indices (indices within each mode)
    outp : float64 (cap,)          their probabilities, multiplied in mode order

    Returns
    -------
    int : the number found, or -1 if there are more than ``cap``.
    """
    n = poff.shape[0] - 1
    cap = out.shape[0]
    pos = np.zeros(n, dtype=np.int64)
    cur = np.zeros(n, dtype=np.int64)
    prod = np.ones(n + 1)
    count = 0
    level = 0
    i = 0
    pr = 0.0
    bound = tau * (1.0 - _PRUNE_SLACK)
    while level >= 0:
        done = pos[level] >= ooff[level + 1] - ooff[level]
        if not done:
            i = order[ooff[level] + pos[level]]
            pr = prod[level] * P[poff[level] + i]
            # indices come by decreasing probability: once the best completion misses tau, so
            # do those of all later indices of this mode
            done = pr * maxrest[level + 1] < bound
        if done:
            level -= 1
            if level >= 0:
                pos[level] += 1
            continue
        cur[level] = i
        if level == n - 1:
            if pr >= tau:
                if count == cap:
                    return -1
                for m in range(n):
                    out[count, m] = cur[m]
                outp[count] = pr
                count += 1
            pos[level] += 1
        else:
            prod[level + 1] = pr
            level += 1
            pos[level] = 0
    return count


@nb.njit(nogil=True, cache=True)
def _segment_cumsum(x, starts, out):
    """Inclusive cumulative sums of ``x`` restarting where ``starts`` is True (each segment summed
    from zero, so small segments keep their precision)."""
    acc = 0.0
    for i in range(x.shape[0]):
        if starts[i]:
            acc = 0.0
        acc += x[i]
        out[i] = acc


@nb.njit(nogil=True, cache=True)
def _upper_bound(a, lo, hi, v):
    """First index in ``[lo, hi)`` with ``a[i] > v`` (``hi`` if none); ``a`` sorted there."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] > v:
            hi = mid
        else:
            lo = mid + 1
    return lo


@nb.njit(nogil=True, cache=True)
def _free_index(c, p, y, val, pcum, lo, hi):
    """The index ``x`` of one mode drawn among those that are not trie children ``val[lo:hi]``.

    ``c`` is the mode's inclusive CDF, ``p`` its probabilities, ``pcum[lo:hi]`` the inclusive
    cumulative probabilities of the children (sorted by index), ``y`` a position in
    ``[0, free mass)``. The CDF of the free indices is ``c(x) - (mass of children <= x)``, which is
    monotone, so the smallest ``x`` where it exceeds ``y`` is found by bisection; that ``x`` is never
    a child (the free CDF is flat across children). Returns -1 only if no free index of positive
    probability exists.
    """
    I = c.shape[0]
    a = 0
    b = I - 1
    while a < b:
        mid = (a + b) >> 1
        k = _upper_bound(val, lo, hi, mid)
        rc = pcum[k - 1] if k > lo else 0.0
        if c[mid] - rc > y:
            b = mid
        else:
            a = mid + 1
    # rounding in the subtraction can land on a child or a zero-probability index: take the
    # nearest valid one (not expected in practice)
    for step in range(2 * I):
        x = a + (step >> 1) + 1 if step & 1 else a - (step >> 1)
        if 0 <= x < I and p[x] > 0.0:
            k = _upper_bound(val, lo, hi, x)
            if not (k > lo and val[k - 1] == x):
                return x
    return -1


@nb.njit(parallel=True, nogil=True, cache=True)
def _draw_restricted(P, cdf, poff, val, clo, chi, wcum, pcum, nfree, constrained, uniforms, out):
    """Draws from the product distribution restricted to rows outside the heavy set.

    Parameters
    ----------
    P, cdf : float64 (sum I_l,)        per-mode probabilities and inclusive CDFs, concatenated
    poff : int64 (n+1,)                mode offsets into ``P`` and ``cdf``
    val : int64 (T,)                   trie node ``v``'s index at its depth (root, node 0: unused)
    clo, chi : int64 (T,)              children of node ``v`` are nodes ``clo[v]..chi[v]-1``, sorted by
                                       ``val``; none for the leaves (complete heavy rows)
    wcum : float64 (T,)                inclusive cumulative weight among siblings, the weight of a
                                       child being ``p(val) * (1 - mass of its heavy completions)``
    pcum : float64 (T,)                inclusive cumulative ``p(val)`` among siblings
    nfree : int64 (T,)                 positive-probability indices of the next mode that are not
                                       children of ``v`` (0: no free mass at all)
    constrained : bool                 False when there are no heavy rows (plain product draws)
    uniforms : float64 (J, n)          pre-drawn uniforms, one per sample and mode
    out : int64 (J, n)                 drawn indices; ``out[j, 0] = -1`` marks a draw that broke
                                       down in rounding (redrawn by the caller)
    """
    J, n = uniforms.shape
    nblocks = (J + _BLOCK - 1) // _BLOCK
    for blk in nb.prange(nblocks):
        for j in range(blk * _BLOCK, min(J, (blk + 1) * _BLOCK)):
            node = 0
            inside = constrained
            ok = True
            for level in range(n):
                off = poff[level]
                size = poff[level + 1] - off
                c = cdf[off : off + size]
                p = P[off : off + size]
                u = uniforms[j, level]
                if not inside:
                    x = _free_index(c, p, u * c[size - 1], val, pcum, 0, 0)
                else:
                    lo = clo[node]
                    hi = chi[node]
                    sw = wcum[hi - 1]
                    free = 0.0
                    if nfree[node] > 0:
                        free = max(c[size - 1] - pcum[hi - 1], 0.0)
                    total = sw + free
                    if not total > 0.0:
                        ok = False
                        break
                    y = u * total
                    if y < sw:
                        g = _upper_bound(wcum, lo, hi, y)
                        if g >= hi:
                            g = hi - 1
                        x = val[g]
                        node = g
                    else:
                        x = _free_index(c, p, min(y - sw, free), val, pcum, lo, hi)
                        inside = False
                if x < 0:
                    ok = False
                    break
                out[j, level] = x
            if not ok:
                out[j, 0] = -1


# ---------------------------------------------------------------------------------------------
# numpy orchestration


def leverage_probabilities(U: np.ndarray, mode: int = 0, gram: np.ndarray | None = None) -> np.ndarray:
    """Leverage scores of the rows of ``U`` normalized to a distribution (float64 (I,)).

    ``l(i) = U[i] pinv(U^T U) U[i]^T`` (rounding negatives clipped to 0); they sum to the rank.
    ``mode`` only names the factor in errors; ``gram`` is ``U^T U`` if already known.
    """
    U = np.ascontiguousarray(U, dtype=np.float64)
    G = U.T @ U if gram is None else gram
    check_gram(G, mode)
    Gp, _ = psd_pinv(G)
    lev = np.empty(U.shape[0])
    row_quadforms(U, Gp, lev)
    np.maximum(lev, 0.0, out=lev)
    return lev / lev.sum()


def _trie(D: np.ndarray, probs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Prefix trie of the heavy rows ``D`` (n_det, n), lexicographically sorted, in BFS node order
    (node 0 the root, then each depth's distinct prefixes in order)."""
    ndet, n = D.shape
    # suffix[:, d] = prod_{m >= d} p_m(D[:, m]): the conditional mass of a heavy row below depth d
    suffix = np.ones((ndet, n + 1))
    for m in range(n - 1, -1, -1):
        suffix[:, m] = probs[m][D[:, m]] * suffix[:, m + 1]
    vals, parents, weights, pvals, lo_nodes = [np.array([-1])], [np.array([-1])], [np.zeros(1)], [np.zeros(1)], [0]
    starts = np.zeros(ndet, dtype=bool)
    starts[0] = True
    prev_starts = np.array([0])
    count = 1
    for d in range(1, n + 1):
        col = D[:, d - 1]
        starts = starts.copy()
        starts[1:] |= col[1:] != col[:-1]
        gs = np.flatnonzero(starts)
        v = col[gs]
        parent = lo_nodes[-1] + np.searchsorted(prev_starts, gs, side="right") - 1
        below = np.add.reduceat(suffix[:, d], gs)
        pv = probs[d - 1][v]
        vals.append(v)
        parents.append(parent)
        pvals.append(pv)
        weights.append(pv * np.maximum(1.0 - below, 0.0))
        lo_nodes.append(count)
        count += gs.size
        prev_starts = gs
    val = np.concatenate(vals).astype(np.int64)
    parent = np.concatenate(parents).astype(np.int64)
    nodes = np.arange(count)
    # children of each node are contiguous (BFS order of sorted prefixes)
    clo = np.searchsorted(parent, nodes, side="left").astype(np.int64)
    chi = np.searchsorted(parent, nodes, side="right").astype(np.int64)
    first = np.ones(count, dtype=bool)
    first[1:] = parent[1:] != parent[:-1]
    wcum = np.empty(count)
    pcum = np.empty(count)
    _segment_cumsum(np.concatenate(weights), first, wcum)
    _segment_cumsum(np.concatenate(pvals), first, pcum)
    depth = np.searchsorted(np.array(lo_nodes), nodes, side="right") - 1
    npos = np.array([int(np.count_nonzero(p > 0)) for p in probs] + [0])
    nfree = (npos[depth] - (chi - clo)).astype(np.int64)
    return {"val": val, "clo": clo, "chi": chi, "wcum": wcum, "pcum": pcum, "nfree": nfree}


def _restricted_draws(probs: list[np.ndarray], D: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` multi-indices (count, n) from the product distribution restricted to rows not in
    ``D`` (all rows when ``D`` is empty)."""
    n = len(probs)
    P = np.concatenate(probs)
    cdf = np.concatenate([np.cumsum(p) for p in probs])
    poff = np.concatenate([[0], np.cumsum([p.size for p in probs])]).astype(np.int64)
    if D.shape[0]:
        t = _trie(D, probs)
    else:
        none = np.zeros(1, dtype=np.int64)
        t = {"val": none - 1, "clo": none, "chi": none, "wcum": np.zeros(1), "pcum": np.zeros(1), "nfree": none}
    out = np.empty((count, n), dtype=np.int64)
    todo = np.arange(count)
    for _ in range(8):
        part = np.empty((todo.size, n), dtype=np.int64)
        _draw_restricted(
            P,
            cdf,
            poff,
            t["val"],
            t["clo"],
            t["chi"],
            t["wcum"],
            t["pcum"],
            t["nfree"],
            D.shape[0] > 0,
            rng.random((todo.size, n)),
            part,
        )
        out[todo] = part
        todo = todo[part[:, 0] < 0]
        if not todo.size:
            return out
    raise RuntimeError(f"restricted leverage sampling broke down numerically ({todo.size} of {count} draws)")


def _heavy(probs: list[np.ndarray], tau: float, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Heavy rows (p >= tau) sorted lexicographically, and their probabilities."""
    n = len(probs)
    P = np.concatenate(probs)
    poff = np.concatenate([[0], np.cumsum([p.size for p in probs])]).astype(np.int64)
    maxes = np.array([p.max() for p in probs])
    maxrest = np.append(np.cumprod(maxes[::-1])[::-1], 1.0)
    # only indices that reach tau with the other modes at their maxima can be in a heavy row, so
    # only those are sorted (not whole modes of millions of rows)
    order = []
    for m, p in enumerate(probs):
        others = np.prod(np.delete(maxes, m))
        cand = np.flatnonzero(p * others >= tau * (1.0 - _PRUNE_SLACK))
        order.append(cand[np.argsort(-p[cand], kind="stable")])
    ooff = np.concatenate([[0], np.cumsum([o.size for o in order])]).astype(np.int64)
    out = np.empty((cap, n), dtype=np.int64)
    outp = np.empty(cap)
    found = _heavy_rows(P, poff, np.concatenate(order).astype(np.int64), ooff, maxrest, float(tau), out, outp)
    if found < 0:
        raise ValueError(f"more than {cap} rows have probability >= tau={tau}: raise tau or J")
    D, pD = out[:found], outp[:found]
    s = np.lexsort(D.T[::-1])
    return D[s], pD[s]


def _row_probs(probs: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Product probabilities of multi-indices (S, n), multiplied in mode order like the search."""
    p = np.ones(idx.shape[0])
    for m, pm in enumerate(probs):
        p *= pm[idx[:, m]]
    return p


def arls_lev_sample(
    factors: Sequence[np.ndarray],
    exclude: int,
    J: int,
    seed: Any = None,
    hybrid: bool = False,
    tau: float | None = None,
) -> SampleSet:
    """Draw rows of the Khatri-Rao product of all factors except ``exclude`` by CP-ARLS-LEV.

    Parameters
    ----------
    factors : sequence of (I_k, R) arrays
        All ``N >= 2`` factor matrices (``factors[exclude]`` only fixes ``N`` and ``R``).
    exclude : int
        The target mode ``j``.
    J : int
        Number of draws (hybrid: deterministic plus random rows).
    seed : int, None, numpy SeedSequence or Generator
        Source of the uniforms; with a fixed seed the result is identical for any thread count.
    hybrid : bool
        Include every row with probability ``>= tau`` deterministically (weight 1) and draw the
        remaining ``J - n_det`` from the other rows.
    tau : float, optional
        Hybrid threshold, ``1/J`` by default (Larsen and Kolda's choice); at most ``J`` rows may
        reach it.

    Returns
    -------
    SampleSet
        Random rows weigh ``counts / (J p_s)`` (hybrid: ``counts (1 - p_det) / (J_rand p_s)``) with
        ``p_s`` the product of the per-mode normalized leverage scores (``probs``);
        ``deterministic`` marks the heavy rows. ``draws = n_det + J_rand``, which is ``J`` unless
        the heavy rows hold all the mass (then no random rows are drawn).

    Raises
    ------
    ValueError
        Bad arguments, a sampled factor that is entirely zero (or not finite), a zero Khatri-Rao
        product, or more than ``J`` rows reaching ``tau``.
    """
    factors, exclude, J = check_factors(factors, exclude, J)
    N = len(factors)
    R = factors[0].shape[1]
    ks = [k for k in range(N) if k != exclude]
    grams = [factors[k].T @ factors[k] for k in ks]
    probs = [leverage_probabilities(factors[k], k, g) for k, g in zip(ks, grams)]
    G = np.ones((R, R))
    for g in grams:
        G *= g
    if psd_pinv(G)[1] == 0:
        raise ValueError(f"the Khatri-Rao product of modes {ks} is zero (no row has nonzero leverage)")
    if tau is None:
        tau = 1.0 / J
    elif not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    rng = np.random.default_rng(seed)
    n = len(ks)

    if hybrid:
        D, pD = _heavy(probs, tau, J)
    else:
        D, pD = np.zeros((0, n), dtype=np.int64), np.zeros(0)
    ndet = D.shape[0]
    rest = 1.0 - math.fsum(pD.tolist()) if ndet else 1.0
    jrand = J - ndet if rest > REST_ATOL else 0

    parts_idx, parts_w, parts_c, parts_p, parts_det = [], [], [], [], []
    if ndet:
        parts_idx.append(D)
        parts_w.append(np.ones(ndet))
        parts_c.append(np.ones(ndet, dtype=np.int64))
        parts_p.append(pD)
        parts_det.append(np.ones(ndet, dtype=bool))
    if jrand:
        drawn = _restricted_draws(probs, D, jrand, rng)
        uniq, counts = unique_rows(drawn)
        p = _row_probs(probs, uniq)
        parts_idx.append(uniq)
        parts_w.append(counts * rest / (jrand * p))
        parts_c.append(counts)
        parts_p.append(p)
        parts_det.append(np.zeros(uniq.shape[0], dtype=bool))
    sub = np.concatenate(parts_idx)
    s = np.lexsort(sub.T[::-1])
    coords = np.zeros((sub.shape[0], N), dtype=np.int64)
    coords[:, ks] = sub[s]
    return SampleSet(
        mode=exclude,
        coords=coords,
        weights=np.concatenate(parts_w)[s],
        rows=krp_rows(factors, coords, exclude),
        draws=int(ndet + jrand),
        counts=np.concatenate(parts_c)[s],
        probs=np.concatenate(parts_p)[s],
        deterministic=np.concatenate(parts_det)[s],
    )
