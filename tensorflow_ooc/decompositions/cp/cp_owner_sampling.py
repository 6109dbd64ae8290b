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

**Spread modes.** A sketched update leaves a factor zero but in the rows its sampled fibers'
nonzeros hit (a few hundred of 4.8 M on the 86 M Amazon-shaped store). Where each owner has at
most :data:`~tensorflow_ooc.execution.partials.SPREAD_ROWS` of them, the owners send them to every
worker with the updated rows (:meth:`~tensorflow_ooc.execution.owner_computes.WorkerState.all_gather`),
and every worker keeps the same copy, sorted by row, with its tree (:class:`Spread`): that mode's
draws walk the copy where they are made, with no request to an owner, and the owned-row tree is
left out of date (built again if the mode is ever drawn through its owners). The copy holds the
rows that are not zero, so it depends on the factor alone: :func:`start_sampler` spreads the same
modes from a checkpoint's factors, and a resumed run still draws what the uninterrupted one drew.
In steady rounds a mode's draws then take one message round (the all-gather of the draws).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...execution.owner_computes import SparseRows, WorkerState
from ...execution.partials import SPREAD_ROWS
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
class Spread:
    """Every row of a mode's factor that is not zero, held by every worker alike (a sketched
    update's rows, spread by :meth:`~tensorflow_ooc.execution.owner_computes.WorkerState.all_gather`):
    their row numbers (sorted), the rows (float64) and their tree."""

    ids: np.ndarray
    rows: np.ndarray
    tree: RowTree


@dataclass
class OwnerSampler:
    """A worker's part of the distributed sampler: per mode, the rows it owns (a compact copy,
    float64), their tree (None where it owns none), and every owner's Gram of its rows (W, R, R);
    per mode whose factor every worker holds whole (:class:`Spread`), that, and the modes whose
    owned-row tree is out of date (drawn through the spread rows, it is not kept up). A mode
    whose update every worker summed and solved itself keeps its whole Gram as one "owner's"
    (only their sum is read for a spread mode)."""

    rows: list[np.ndarray]
    trees: list[RowTree | None]
    owner_grams: list[np.ndarray]
    empty_sketches: dict[int, int] = field(default_factory=dict)
    spread: dict[int, Spread] = field(default_factory=dict)
    stale: set = field(default_factory=set)
    spread_limit: int = SPREAD_ROWS

    def refresh(
        self,
        ws: WorkerState,
        mode: int,
        owner_grams: np.ndarray,
        changed: np.ndarray | None = None,
        spread: Spread | None = None,
    ) -> None:
        """After mode ``mode``'s update: its owned rows' tree again, and the owners' new Grams.
        ``changed``: the positions among the owned rows that changed (a sketched update changes
        only the rows its sampled fibers hit and those the one before hit): only their leaves and
        the nodes above are recomputed (:func:`update_tree`, the same sums as a rebuild); None:
        the tree is built afresh. ``spread``: every worker holds the mode's rows that are not
        zero, and draws them there: the owned-row tree is left out of date until a draw needs it."""
        self.owner_grams[mode] = owner_grams
        if spread is not None:  # the owned-row tree is freed, built again if a draw needs it
            self.spread[mode] = spread
            self.stale.add(mode)
            self.rows[mode], self.trees[mode] = self.rows[mode][:0], None
            return
        self.spread.pop(mode, None)
        tree, rows = self.trees[mode], self.rows[mode]
        if mode in self.stale or changed is None or tree is None or rows.shape[0] != tree.nrows:
            self.rows[mode], self.trees[mode] = _own_tree(ws, mode)
            self.stale.discard(mode)
        else:
            plan = ws.plans[mode]
            if plan.span is None or ws.factors.views[mode].dtype != np.float64:  # a compact copy
                rows[changed] = ws.factors.views[mode][plan.owned[changed]]
            update_tree(tree, rows, changed)


def spread_rows(
    ws: WorkerState, mode: int, rows: SparseRows, received: dict, others: dict, scale: np.ndarray
) -> Spread | None:
    """The mode's rows that are not zero after a sketched update, from this worker's updated
    rows ``rows``, the rows received from each rank that this worker touches (``received``) and
    those it does not (``others``, see :meth:`~WorkerState.all_gather`), all times ``scale``: the
    same on every worker. None where some rank had too many rows to spread them."""
    sp: OwnerSampler = ws.sampler
    if rows.hit.shape[0] > sp.spread_limit or len(others) != ws.team.size - 1:
        return None
    if any(o is None for o in others.values()):
        return None
    plan = ws.plans[mode]
    ids, vals = [plan.owned[rows.hit]], [rows.rows * scale]
    for k, (pos, rr) in received.items():
        ids.append(plan.send[k][np.asarray(pos)])
        vals.append(np.asarray(rr) * scale)
    for more_ids, more in others.values():
        ids.append(np.asarray(more_ids))
        vals.append(np.asarray(more) * scale)
    return _spread(ids, vals, rows.rows.shape[1])


def spread_of(ids: np.ndarray, rows: np.ndarray) -> Spread | None:
    """The :class:`Spread` of a mode whose new rows ``rows`` (numbered ``ids``, scaled) every
    worker summed and solved itself (:meth:`~WorkerState.sum_everywhere`)."""
    return _spread([ids], [rows], rows.shape[1])


def _spread(ids: list[np.ndarray], vals: list[np.ndarray], R: int) -> Spread | None:
    """The :class:`Spread` of the rows ``vals`` (numbered ``ids``, distinct over all parts): sorted
    by row number, rows of zeros left out, so it depends on the factor alone (a run resumed from a
    checkpoint spreads what the uninterrupted one did); None where no row is left."""
    at = np.concatenate([np.asarray(i, dtype=np.int64).reshape(-1) for i in ids])
    values = np.concatenate([np.asarray(v).reshape(-1, R) for v in vals])
    order = np.argsort(at)  # row numbers are distinct: one owner each
    at, values = at[order], values[order]
    live = values.any(axis=1)
    if not live.any():
        return None
    values = np.ascontiguousarray(values[live], dtype=np.float64)
    return Spread(at[live], values, build_tree(values))


def _own_rows(ws: WorkerState, mode: int) -> np.ndarray:
    """The rows this worker owns of ``mode``, float64: a view of its factor where they are one
    range, as the modes the ALTO order splits are (no copy of a 4.8 M-row factor per update)."""
    span = ws.plans[mode].span
    view = ws.factors.views[mode]
    if span is not None and view.dtype == np.float64:
        return view[span[0] : span[1]]
    return np.ascontiguousarray(ws.owned_rows(mode)[1], dtype=np.float64)


def _own_tree(ws: WorkerState, mode: int, rows: np.ndarray | None = None) -> tuple[np.ndarray, RowTree | None]:
    """The rows this worker owns of ``mode`` (:func:`_own_rows`, unless given) and their tree."""
    rows = _own_rows(ws, mode) if rows is None else rows
    return rows, (build_tree(rows) if rows.shape[0] else None)


def start_sampler(ws: WorkerState, tag: Any, spread_limit: int = SPREAD_ROWS) -> OwnerSampler:
    """Build this worker's trees and all-gather the owners' Grams, and the rows that are not zero
    of every mode whose owners each hold at most ``spread_limit`` of them (those modes are drawn
    through the spread rows, :class:`Spread`; one message round; run by every worker of the run
    at the start of its first randomized iteration, or of a resumed run's)."""
    N, W, me = ws.nmodes, ws.team.size, ws.team.rank
    owned = [_own_rows(ws, k) for k in range(N)]
    grams = np.stack([r.T @ r for r in owned])  # (N, R, R)
    nonzero = [np.flatnonzero(r.any(axis=1)) for r in owned]
    offer = [
        [ws.plans[k].owned[nz], owned[k][nz]] if nz.shape[0] <= spread_limit else None for k, nz in enumerate(nonzero)
    ]
    mine = [grams, offer]
    ws.team.send_many(tag, {k: mine for k in range(W) if k != me})
    everyone = [mine if k == me else ws.team.receive(tag, k) for k in range(W)]
    sp = OwnerSampler(
        [np.zeros((0, ws.factors.rank))] * N,
        [None] * N,
        [np.stack([np.asarray(g[0])[k] for g in everyone]) for k in range(N)],
        spread_limit=spread_limit,
    )
    for k in range(N):
        parts = [g[1][k] for g in everyone]
        spread = None
        if all(p is not None for p in parts):
            spread = _spread([p[0] for p in parts], [p[1] for p in parts], ws.factors.rank)
        if spread is not None:
            sp.spread[k] = spread
            sp.stale.add(k)  # the owned-row tree is built if a draw ever needs it
        else:
            sp.rows[k], sp.trees[k] = _own_tree(ws, k, owned[k])
    return sp


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
        if k in sp.spread:  # every worker holds the rows: no owner is asked
            rows, values = _draw_from_spread(sp.spread[k], Hd, hid, comp, V, uniforms[pos, lo:hi, 1])
        else:
            if k in sp.stale:
                sp.rows[k], sp.trees[k] = _own_tree(ws, k)
                sp.stale.discard(k)
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
    if sp.owner_grams[k].shape[0] != W:  # summed and solved everywhere, and no row is left
        raise RuntimeError(f"draws of mode {k} have no owners' Grams to route them by (a zero factor?)")
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
            got = ws.team.receive(tag + ("q",), w)
            ws.team.send_many(tag + ("r",), {w: _serve(ws, k, *got)})
    rows = np.empty(x.shape[0], dtype=np.int64)
    values = np.empty((x.shape[0], R))
    for w in range(W):
        ids, at, vals = replies[w] if w == me else ws.team.receive(tag + ("r",), w)
        rows[picks[w]] = np.asarray(ids)[np.asarray(at)]
        values[picks[w]] = np.asarray(vals)[np.asarray(at)]
    return rows, values


def _draw_from_spread(
    spread: Spread, Hd: np.ndarray, hid: np.ndarray, comp: np.ndarray, V: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2 for this worker's draws of a mode every worker holds (:class:`Spread`): each draw's
    row from the spread rows' tree. Returns the global rows drawn and their values (J_w, R)."""
    R = Hd.shape[1]
    keys, _, inv = dedupe(hid * R + comp, Hd.shape[0] * R)
    local = draw_rows(spread.rows, spread.tree, Hd[keys // R] * V.T[keys % R], inv, x)
    return spread.ids[local], spread.rows[local]


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
