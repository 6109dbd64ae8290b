"""STS-CP draws across the workers of an owner-computes run (seed 000, sections 4.4.1 and 4.7.2).

Each worker keeps a segment tree (:class:`~tensorflow_ooc.kernels.sampling.krp_sampler.RowTree`)
over the rows it owns of every mode, and knows every owner's Gram of its rows, ``G_k^(w)``
(all-gathered with the updated rows each mode). The owners are the top level of one tree over all
of a factor's rows: a draw's query ``q`` has mass ``q G_k^(w) q^T`` at owner ``w``, and the rest of
its walk is the owner's own tree. Only rows some nonzero touches have an owner, so only they are
drawn (a row no nonzero touches has an empty fiber, and is zero after its mode's first update).

A mode's ``J`` draws are shared out by rank: worker ``r`` coordinates draws ``r J / W`` up to
``(r + 1) J / W``. For each sampled mode a coordinator draws its draws' eigen-components (stage 1:
every worker has the Grams), picks each draw's owner from the owners' masses by inversion of the
draw's stage-2 uniform, and sends each owner the queries and rescaled uniforms of its draws; the
owner walks its tree and sends back the rows drawn and their values, which extend the draws'
histories. At the end the distinct draws (multi-indices, counts and Khatri-Rao rows) are
all-gathered, so every worker builds the same :class:`SampleSet`.

Per excluded mode that is ``2 (N - 1) + 1`` message rounds and ``O(J N R / W)`` words per worker
(Table 4.3's d-STS-CP, with the owners in place of the processor subtrees). The uniforms come
from one generator seeded by (run entropy, iteration, mode), the same on every worker, so a
resumed run on as many workers draws what the uninterrupted one drew.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...execution.owner_computes import WorkerState
from ...kernels.sampling.krp_sampler import (
    RowTree,
    SampleSet,
    build_tree,
    check_gram,
    conditional_eigenpairs,
    draw_components,
    draw_rows,
    khatri_rao_gram,
    leverage_sample_set,
    update_tree,
)

_BELOW_ONE = float(np.nextafter(1.0, 0.0))


@dataclass
class OwnerSampler:
    """A worker's part of the distributed sampler: per mode, the rows it owns (a compact copy,
    float64), their tree (None where it owns none), and every owner's Gram of its rows (W, R, R)."""

    rows: list[np.ndarray]
    trees: list[RowTree | None]
    owner_grams: list[np.ndarray]
    empty_sketches: dict[int, int] = field(default_factory=dict)

    def refresh(self, ws: WorkerState, mode: int, owner_grams: np.ndarray, changed: np.ndarray | None = None) -> None:
        """After mode ``mode``'s update: its owned rows' tree again, and the owners' new Grams.
        ``changed``: the positions among the owned rows that changed (a sketched update changes
        only the rows its sampled fibers hit and those the one before hit): only their leaves and
        the nodes above are recomputed (:func:`update_tree`, the same sums as a rebuild); None:
        the tree is built afresh."""
        tree, rows = self.trees[mode], self.rows[mode]
        if changed is None or tree is None or rows.shape[0] != tree.nrows:
            self.rows[mode], self.trees[mode] = _own_tree(ws, mode)
        else:
            plan = ws.plans[mode]
            if plan.span is None or ws.factors.views[mode].dtype != np.float64:  # a compact copy
                rows[changed] = ws.factors.views[mode][plan.owned[changed]]
            update_tree(tree, rows, changed)
        self.owner_grams[mode] = owner_grams


def _own_tree(ws: WorkerState, mode: int) -> tuple[np.ndarray, RowTree | None]:
    """The rows this worker owns of ``mode`` (a view of its factor where they are one range, as
    the modes the ALTO order splits are: no copy of a 4.8 M-row factor per update) and their tree."""
    span = ws.plans[mode].span
    view = ws.factors.views[mode]
    if span is not None and view.dtype == np.float64:
        rows = view[span[0] : span[1]]
    else:
        rows = np.ascontiguousarray(ws.owned_rows(mode)[1], dtype=np.float64)
    return rows, (build_tree(rows) if rows.shape[0] else None)


def start_sampler(ws: WorkerState, tag: Any) -> OwnerSampler:
    """Build this worker's trees and all-gather the owners' Grams (one message round; run by
    every worker of the run at the start of its first randomized iteration)."""
    N, W, me = ws.nmodes, ws.team.size, ws.team.rank
    built = [_own_tree(ws, k) for k in range(N)]
    mine = np.stack([r.T @ r for r, _ in built])  # (N, R, R)
    ws.team.send_many(tag, {k: mine for k in range(W) if k != me})
    everyone = [mine if k == me else np.asarray(ws.team.receive(tag, k)) for k in range(W)]
    return OwnerSampler(
        [r for r, _ in built], [t for _, t in built], [np.stack([g[k] for g in everyone]) for k in range(N)]
    )


def owner_sts_sample(ws: WorkerState, mode: int, J: int, seed: tuple, tag: Any) -> SampleSet:
    """``J`` rows of the Khatri-Rao product of every factor but ``mode``'s, drawn by their exact
    leverage scores across the run's workers (see the module docstring); the same
    :class:`SampleSet` on every worker. ``seed`` is (run entropy, iteration, mode)."""
    t0 = time.perf_counter()
    sp: OwnerSampler = ws.sampler
    N, R, W, me = ws.nmodes, ws.factors.rank, ws.team.size, ws.team.rank
    ks = [k for k in range(N) if k != mode]
    grams = [g.sum(axis=0) for g in sp.owner_grams]  # the Grams of the rows that have owners
    for k in ks:
        check_gram(grams[k], k)
    G, Gp = khatri_rao_gram([grams[k] for k in ks], ks)
    uniforms = np.random.default_rng(np.random.SeedSequence([int(s) for s in seed])).random((len(ks), J, 2))
    lo, hi = me * J // W, (me + 1) * J // W
    Hd, hid = np.ones((1, R)), np.zeros(hi - lo, dtype=np.int64)
    idx = np.zeros((hi - lo, N), dtype=np.int64)
    for pos, k in enumerate(ks):
        lam, V = conditional_eigenpairs(Gp, [grams[k2] for k2 in ks[pos + 1 :]])
        comp = draw_components(Hd, hid, lam, V, grams[k], uniforms[pos, lo:hi, 0])
        rows, values = _draw_from_owners(ws, k, Hd, hid, comp, V, uniforms[pos, lo:hi, 1], tag + (pos,))
        idx[:, k] = rows
        Hd, hid = _extend(Hd, hid, rows, values, ws.factors.shape[k])
    return _gather_draws(ws, mode, idx, Hd[hid], J, Gp, G, tag + ("S",), t0)


def _draw_from_owners(
    ws: WorkerState, k: int, Hd: np.ndarray, hid: np.ndarray, comp: np.ndarray, V: np.ndarray, x: np.ndarray, tag
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2 for this worker's draws of mode ``k``: the owner of each draw's row, then the row
    from that owner's tree (a request and a reply per other worker; this worker serves the
    others' requests between). Returns the global rows drawn and their values (J_w, R)."""
    sp: OwnerSampler = ws.sampler
    W, me, R = ws.team.size, ws.team.rank, Hd.shape[1]
    keys, _, inv = dedupe(hid * R + comp, Hd.shape[0] * R)
    Q = Hd[keys // R] * V.T[keys % R]  # the distinct queries h * V[:, u]
    masses = np.maximum(np.einsum("ka,wab,kb->kw", Q, sp.owner_grams[k], Q, optimize=True), 0.0)
    m = masses[inv]
    cum = np.cumsum(m, axis=1)
    total = cum[:, -1]
    if not np.all(total > 0):
        raise RuntimeError(f"leverage sampling of mode {k} broke down numerically (a query of zero mass)")
    y = x * total
    owner = np.minimum((y[:, None] >= cum).sum(axis=1), W - 1)
    # a target rounded up to the total goes to the last owner with mass
    last = W - 1 - np.argmax(m[:, ::-1] > 0, axis=1)
    owner = np.where(m[np.arange(m.shape[0]), owner] > 0, owner, last)
    mw = m[np.arange(m.shape[0]), owner]
    x2 = np.clip((y - (cum[np.arange(m.shape[0]), owner] - mw)) / mw, 0.0, _BELOW_ONE)
    requests, picks = {}, {}
    for w in range(W):
        sel = np.flatnonzero(owner == w)
        used, _, qrow = dedupe(inv[sel], Q.shape[0])
        requests[w], picks[w] = [Q[used], qrow, x2[sel]], sel
    ws.team.send_many(tag + ("q",), {w: r for w, r in requests.items() if w != me})
    replies = {me: _serve(ws, k, *requests[me])}
    for w in range(W):
        if w != me:
            ws.team.send_many(tag + ("r",), {w: _serve(ws, k, *ws.team.receive(tag + ("q",), w))})
    rows = np.empty(x.shape[0], dtype=np.int64)
    values = np.empty((x.shape[0], R))
    for w in range(W):
        ids, at, vals = replies[w] if w == me else ws.team.receive(tag + ("r",), w)
        rows[picks[w]] = np.asarray(ids)[np.asarray(at)]
        values[picks[w]] = np.asarray(vals)[np.asarray(at)]
    return rows, values


def _serve(ws: WorkerState, k: int, Q, qrow, x) -> list[np.ndarray]:
    """An owner's part of a draw: rows of its tree of mode ``k`` for the queries ``Q[qrow]`` and
    uniforms ``x``; returns the distinct rows (global ids), each draw's index into them, and their
    values."""
    sp: OwnerSampler = ws.sampler
    Q, qrow, x = np.asarray(Q), np.asarray(qrow), np.asarray(x)
    if qrow.shape[0] == 0:
        return [np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, Q.shape[1]))]
    if sp.trees[k] is None:  # masses here were positive, so this worker owns rows: never expected
        raise RuntimeError(f"draws of mode {k} were routed to worker {ws.team.rank}, which owns no rows of it")
    local = draw_rows(sp.rows[k], sp.trees[k], Q, qrow, x)
    distinct, _, at = dedupe(local, sp.rows[k].shape[0])
    return [ws.plans[k].owned[distinct], at, sp.rows[k][distinct]]


def _extend(
    Hd: np.ndarray, hid: np.ndarray, rows: np.ndarray, values: np.ndarray, nrows: int
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct histories after drawing ``rows`` (of ``nrows``) with ``values``:
    ``Hd[hid[j]] * values[j]``, as distinct vectors and each draw's index into them."""
    _, at, inv = dedupe(hid * nrows + rows, Hd.shape[0] * nrows)
    return Hd[hid[at]] * values[at], inv


def dedupe(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of ``keys`` (non-negative, below ``bound``), sorted; an occurrence of
    each; each key's index into them. By a mark per possible value where ``bound`` is at most a few
    times the keys (``np.unique`` sorts: 13 ms for 65536 keys against 1 ms, and a draw makes
    about 14 of these per mode), else by ``np.unique``."""
    keys = np.asarray(keys, dtype=np.int64)
    if bound <= 8 * keys.shape[0] + 4096:
        where = np.full(bound, -1, dtype=np.int64)
        where[keys] = np.arange(keys.shape[0])
        distinct = np.flatnonzero(where >= 0)
        slot = np.zeros(bound, dtype=np.int64)
        slot[distinct] = np.arange(distinct.shape[0])
        return distinct, where[distinct], slot[keys]
    distinct, at, inv = np.unique(keys, return_index=True, return_inverse=True)
    return distinct, at, inv.reshape(-1)


def _distinct(coords: np.ndarray, shape: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct rows of ``coords``, sorted lexicographically: (the rows, the first occurrence of
    each, each row's index into them)."""
    if math.prod(int(s) for s in shape) < 2**62:
        keys = np.ravel_multi_index(tuple(coords.T), tuple(int(s) for s in shape))
        _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    else:
        _, first, inv = np.unique(coords, axis=0, return_index=True, return_inverse=True)
    return coords[first], first, inv.reshape(-1)


def _gather_draws(
    ws: WorkerState, mode: int, idx: np.ndarray, krp: np.ndarray, J: int, Gp: np.ndarray, G: np.ndarray, tag, t0: float
) -> SampleSet:
    """All-gather every worker's distinct draws (multi-index, count, Khatri-Rao row) and merge
    them in rank order into the run's :class:`SampleSet` of ``J`` draws."""
    W, me = ws.team.size, ws.team.rank
    shape = ws.factors.shape
    coords, first, inv = _distinct(idx, shape)
    mine = [coords, np.bincount(inv, minlength=coords.shape[0]).astype(np.int64), krp[first]]
    ws.team.send_many(tag, {w: mine for w in range(W) if w != me})
    parts = [mine if w == me else [np.asarray(a) for a in ws.team.receive(tag, w)] for w in range(W)]
    allc = np.concatenate([p[0] for p in parts])
    counts_all = np.concatenate([p[1] for p in parts])
    rows_all = np.concatenate([p[2] for p in parts])
    coords, first, inv = _distinct(allc, shape)
    counts = np.bincount(inv, weights=counts_all, minlength=coords.shape[0]).astype(np.int64)
    out = leverage_sample_set(mode, coords, counts, np.ascontiguousarray(rows_all[first]), J, Gp, G)
    out.seconds = time.perf_counter() - t0
    return out
