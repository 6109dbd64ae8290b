"""Memoized mode pairs: a two-level dimension tree for the MTTKRPs of two modes a CP-ALS sweep
updates one after the other.

For modes ``a`` and ``b`` updated in turn, both MTTKRPs contract every *other* mode, and those
factors do not change between the two updates. With the nonzeros sorted by ``(i_a, i_b)``, one
pass forms, per distinct pair ``g``,

    Z[g, :] = sum over the pair's nonzeros  x * prod_{m != a, b} A_m[i_m, :]

and adds ``Z[g] * A_b[i_b(g)]`` into row ``i_a(g)`` of mode ``a``'s output; after mode ``a``'s update,
mode ``b``'s output is ``sum_g Z[g] * A_a[i_a(g)]`` into row ``i_b(g)``, a pass over the pairs alone.
Per nonzero the two modes then fetch N - 2 factor rows once instead of N - 1 rows twice: at
small ranks the kernels are bound by factor-row fetches, not arithmetic (issue 49: nips-shaped,
R8, one thread, a full kernel 23-25 ms for all modes, 6.8-7.1 without factor rows).

It pays where a pair's distinct ``(i_a, i_b)`` are few against the nonzeros (nips-shaped modes 2
and 3: 0.077 a nonzero): :data:`PAIR_GROUPS_MAX`. :func:`choose_pairs` picks disjoint pairs of
modes next to each other in the sweep's order where they pay; the other modes keep mode-sorted
copies (:mod:`.mode_order`). The last mode and the first are next to each other too, across
two sweeps (the *wrap* pair ``(N - 1, 0)``: no factor but theirs changes between the last mode's
update and the next sweep's first): taken where it adds a pair and has few pairs of its own
(:data:`WRAP_GROUPS_MAX`; gen-o5: ``(2, 3)`` and ``(4, 0)`` instead of ``(3, 4)``).
Its memo outlives the sweep's task, so it is kept with a copy of the factor rows it was made
from (:meth:`ModePair.keep_memo`), and used only while they are unchanged.

Each output row is added to by one thread, in a fixed order, so results do not depend on the
thread count. Kernels are written out per order and rank (fixed ranks of
:data:`~.cpu.SPECIALIZED_RANKS` keep the pair's sum in registers; other ranks sum into ``Z``'s row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from ...format import BitLayout
from ..factors import StackedFactors
from .cpu import SPECIALIZED_RANKS, SLPKernel, run_sum
from .plan import WorkItems

# a pair is memoized only where its distinct (i_a, i_b) are at most this share of the nonzeros
# (2 threads, bench_mode_pairs: 0.001-0.077 ran 0.42-0.88x the two kernels at R8-R64; 0.229 1.2-1.6x)
PAIR_GROUPS_MAX = 0.1
# the wrap pair (N - 1, 0) is taken only where its distinct pairs are at most this share (CP-ALS,
# 2 threads, with it against without: gen-o5's 0.006 ran 0.88x at R8 and 0.77x at R16; uber's 0.095
# 1.16x at R8 and 0.97x at R16, its pass over the nonzeros replacing two short mode-sorted passes)
WRAP_GROUPS_MAX = 0.02
# where the wrap pair only replaces one inside the sweep, it is taken if it saves more and the rows
# its pass gathers at random (the other modes' factors at the run's rank) stay within this many
# bytes, in the L2 (CP-ALS, 2 threads: nips' (3, 0) at R8, 1.0 MiB of rows, 13.5-14.5 against 15.6-15.7
# ms an iteration with (2, 3); at R16, 2.1 MiB, 22.5-22.9 against 21.5-22.3; R32 47-53 against 39)
WRAP_TIE_ROWS_BYTES = 3 << 19
# a short mode b's output from the memo in this many slices (a fixed number, so that sums do not
# depend on the thread count)
SECOND_SLICES = 8
# ... where mode b has at most one row per this many pairs and slice (the slices' outputs then
# hold at most 1/64 of the memo's bytes)
SLICE_PAIRS_PER_ROW = 8
# pair_fraction counts distinct pairs with a flag per possible pair up to this many pairs (or 8 a
# nonzero), else by sorting
PAIR_BITMAP_MAX = 1 << 26
# bytes a pair copy holds per distinct pair beside its memo row: ptr, both rows and the b order
PAIR_GROUP_BYTES = 32
# a mode outside the pairs runs from a pair's copy in this many slices (a fixed number: sums do
# not depend on the thread count), each with an output of the whole mode ...
OTHER_SLICES = 8
# ... where the pair has at least this many nonzeros per slice output row (zeroing and summing
# the slices then costs little against the pass) ...
OTHER_NNZ_PER_ROW = 32
# ... and a slice output takes at most this many bytes: its rows are added to in no order, and
# larger outputs ran slower than the mode-sorted copies (docs/KERNELS.md, "Memoized mode pairs")
OTHER_OUTPUT_BYTES_MAX = 128 << 10


@dataclass
class ModePair:
    """The nonzeros of a partition sorted by ``(i_a, i_b)``, for modes ``a`` then ``b`` updated in
    turn (``a < b``, or the wrap pair ``a = N - 1``, ``b = 0``).

    ``ptr[g] .. ptr[g + 1]`` are the nonzeros of pair ``g``, whose rows are ``rows_a[g]`` and
    ``rows_b[g]`` (global indices; ``rows_a`` ascending); ``other[i, j]`` is nonzero ``i``'s index
    in mode ``others[j]``. ``cuts_a``: the pairs where ``rows_a`` changes (and G); ``by_b``: the
    pairs ordered by ``rows_b`` (stably), ``cuts_b`` the positions in it where ``rows_b`` changes (and
    G): threads split at them, so no two add into one output row."""

    a: int
    b: int
    others: np.ndarray  # int64 (N - 2,)
    ptr: np.ndarray  # int64 (G + 1,)
    rows_a: np.ndarray  # int64 (G,)
    rows_b: np.ndarray  # int64 (G,)
    other: np.ndarray  # uint16, uint32 or int64 (nnz, N - 2): other_dtype of the other modes
    values: np.ndarray  # (nnz,)
    cuts_a: np.ndarray  # int64
    by_b: np.ndarray  # int64 (G,)
    cuts_b: np.ndarray  # int64

    def memo(self, rank: int, dtype) -> np.ndarray:
        """The pair's memo buffer (G, rank), made at the first use and kept: a fresh one per
        sweep page-faulted in every time (15 MiB at R8, nips-shaped). One task uses a partition's
        pairs at a time (a sweep, or a mode's own task)."""
        z = self.__dict__.get("_memo")
        if z is None or z.shape != (self.groups, rank) or z.dtype != np.dtype(dtype):
            z = self.__dict__["_memo"] = np.empty((self.groups, rank), dtype=dtype)
        return z

    def keep_memo(self, factors: StackedFactors) -> None:
        """Record that the kept memo (:meth:`memo`) was filled from the factors of the modes other
        than ``a`` and ``b`` as they are now (a copy of them: a memo that outlives a sweep's task is
        valid only while they are unchanged, :meth:`memo_holds`)."""
        self.__dict__["_made_from"] = [factors.views[m].copy() for m in self.others]

    def memo_holds(self, factors: StackedFactors) -> bool:
        """Whether the kept memo was filled (:meth:`keep_memo`) from the other modes' factors
        exactly as they are now, at its rank and dtype."""
        made = self.__dict__.get("_made_from")
        z = self.__dict__.get("_memo")
        if made is None or z is None or z.shape != (self.groups, factors.rank) or z.dtype != factors.dtype:
            return False
        return all(np.array_equal(factors.views[m], rows) for m, rows in zip(self.others, made))

    def forget_memo(self) -> None:
        """Mark the kept memo as made from nothing (it is about to be overwritten)."""
        self.__dict__.pop("_made_from", None)

    @property
    def wraps(self) -> bool:
        """Whether this is the wrap pair ``(N - 1, 0)``, whose modes are updated in two sweeps."""
        return self.a > self.b

    @property
    def groups(self) -> int:
        return int(self.rows_a.shape[0])

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])

    @property
    def nbytes(self) -> int:
        arrays = (self.ptr, self.rows_a, self.rows_b, self.other, self.values, self.cuts_a, self.by_b, self.cuts_b)
        return int(sum(x.nbytes for x in arrays))


@nb.njit(parallel=True, nogil=True, cache=True)
def _decode(index, start, end, base, shift, mask, coords):
    """Global coordinates of every nonzero of re-encoded items into ``coords`` (nnz, N), at the
    items' positions."""
    N = shift.shape[0]
    for k in nb.prange(start.shape[0]):
        for i in range(start[k], end[k]):
            x = index[i]
            for m in range(N):
                coords[i, m] = base[k, m] + np.int64((x >> np.uint64(shift[m])) & np.uint64(mask[m]))


def item_nonzeros(items: WorkItems, layout: BitLayout) -> tuple[np.ndarray, np.ndarray]:
    """Global coordinates (nnz, N) and values of the nonzeros of re-encoded (not Delta) items, in
    the items' order (positions no item covers are left out); int32 coordinates where every mode
    fits (they are made once, but beside the partition)."""
    if items.delta:
        raise ValueError("mode pairs are made of re-encoded items, not Delta-encoded chunks")
    n = int(items.end.max()) if items.nitems else 0
    dtype = np.int32 if max(layout.shape) < 2**31 else np.int64
    coords = np.zeros((n, layout.nmodes), dtype=dtype)
    _decode(items.index, items.start, items.end, items.base, layout.field_shift, layout.field_mask, coords)
    # items do not overlap: +1 where one starts, -1 where it ends
    edge = np.zeros(n + 1, dtype=np.int64)
    np.add.at(edge, items.start, 1)
    np.add.at(edge, items.end, -1)
    covered = np.cumsum(edge[:-1]) > 0
    if covered.all():
        return coords, items.values[:n]
    return coords[covered], items.values[:n][covered]


def _pair_key(coords: np.ndarray, shape: tuple[int, ...], a: int, b: int) -> np.ndarray:
    return coords[:, a].astype(np.int64) * np.int64(shape[b]) + coords[:, b]


def pair_fraction(coords: np.ndarray, shape: tuple[int, ...], a: int, b: int) -> float:
    """Distinct ``(i_a, i_b)`` of ``coords`` per nonzero."""
    nnz = coords.shape[0]
    if nnz == 0:
        return 1.0
    key = _pair_key(coords, shape, a, b)
    space = int(shape[a]) * int(shape[b])
    if space <= max(PAIR_BITMAP_MAX, 8 * nnz):
        # a flag per possible pair: one pass, where sorting the keys took 0.4 s a pair of modes
        # (uber-shaped, 3.3 M nonzeros; choose_pairs tries every neighbour pair)
        seen = np.zeros(space, dtype=np.bool_)
        seen[key] = True
        return float(np.count_nonzero(seen) / nnz)
    # sorted, then counted where the key changes: np.unique's hashing took 4.8 s on 4 M keys where
    # many repeat (gen-skewed's (0, 1)), the sort 0.04-0.3 s
    key.sort()
    return float((1 + int((key[1:] != key[:-1]).sum())) / nnz)


def _cuts(rows: np.ndarray) -> np.ndarray:
    """Positions where ``rows`` changes value, then its length."""
    change = np.flatnonzero(rows[1:] != rows[:-1]) + 1
    return np.concatenate([[0], change, [rows.shape[0]]]).astype(np.int64)


def other_dtype(lengths: list[int]) -> np.dtype:
    """The narrowest unsigned type that holds an index of every mode length in ``lengths``
    (int64 beyond uint32): the pass over the nonzeros streams these indices, and 2 bytes a mode
    instead of 4 cut its time by 11-13 % (nips- and gen-o4-shaped, R8, one thread)."""
    top = max(lengths, default=1)
    return np.dtype(np.uint16 if top <= 2**16 else np.uint32 if top <= 2**32 else np.int64)


def mode_pair(
    coords: np.ndarray, values: np.ndarray, shape: tuple[int, ...], a: int, b: int, groups_max: float = PAIR_GROUPS_MAX
) -> ModePair | None:
    """The nonzeros sorted by ``(i_a, i_b)`` (stably: each pair's nonzeros keep their order, ALTO's
    for work items), or None where the distinct pairs exceed ``groups_max`` of the nonzeros.

    Parameters
    ----------
    coords : int (nnz, N)
        Global coordinates (:func:`item_nonzeros`).
    values : (nnz,)
        Their values.
    shape : tuple of int
        The tensor's mode lengths.
    a, b : int
        The modes updated one after the other: ``a < b``, or ``N - 1`` and ``0`` (the wrap pair).
    groups_max : float
        The largest share of distinct pairs per nonzero worth a copy.
    """
    N = len(shape)
    if not (0 <= a < b < N or (a, b) == (N - 1, 0)) or N < 3:
        raise ValueError(
            f"a mode pair takes modes 0 <= a < b < N (or N - 1 and 0) of a tensor of order >= 3, got {(a, b)} of {N}"
        )
    if int(shape[a]) * int(shape[b]) >= 2**62:
        return None
    nnz = coords.shape[0]
    key = _pair_key(coords, shape, a, b)
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]])) if nnz else np.zeros(0, np.int64)
    if nnz == 0 or starts.shape[0] > groups_max * nnz:
        return None
    others = np.array([m for m in range(N) if m not in (a, b)], dtype=np.int64)
    dtype = other_dtype([shape[m] for m in others])
    other = np.ascontiguousarray(coords[order[:, None], others].astype(dtype, copy=False))
    rows_a = key[starts] // np.int64(shape[b])
    rows_b = key[starts] % np.int64(shape[b])
    by_b = np.argsort(rows_b, kind="stable").astype(np.int64)
    return ModePair(
        a,
        b,
        others,
        np.append(starts, nnz).astype(np.int64),
        rows_a,
        rows_b,
        other,
        np.ascontiguousarray(values[order]),
        _cuts(rows_a),
        by_b,
        _cuts(rows_b[by_b]),
    )


def _best_on_path(gain: list[float], lo: int, hi: int) -> tuple[float, list[int]]:
    """The disjoint neighbour pairs ``(m, m + 1)``, ``lo <= m < hi``, of largest total gain (only
    pairs with a gain), as their first modes."""
    best: dict[int, tuple[float, list[int]]] = {hi: (0.0, []), hi + 1: (0.0, [])}
    for m in range(hi - 1, lo - 1, -1):
        skip = best[m + 1]
        take = (gain[m] + best[m + 2][0], [m] + best[m + 2][1]) if gain[m] > 0 else (-1.0, [])
        best[m] = take if take[0] > skip[0] else skip
    return best[lo]


def choose_pairs(
    coords: np.ndarray,
    shape: tuple[int, ...],
    groups_max: float = PAIR_GROUPS_MAX,
    wrap: bool = False,
    rank: int | None = None,
) -> list[tuple[int, int]]:
    """Disjoint pairs ``(m, m + 1)`` (modes a sweep updates in turn) whose distinct pairs are at
    most ``groups_max`` of the nonzeros, chosen to save the most (each pair's saving taken as one
    less its share of distinct pairs); orders 3 to 5.

    ``wrap``: also the pair ``(N - 1, 0)`` (the last mode and the next sweep's first), where its
    distinct pairs are at most :data:`WRAP_GROUPS_MAX` of the nonzeros and it makes more pairs
    than the sweep's own neighbours do. Where it makes as many, it is taken only if it saves more
    and, at ``rank`` (None: not known, the pair inside the sweep is kept), the other modes' factor
    rows its pass gathers take at most :data:`WRAP_TIE_ROWS_BYTES`; else the pair inside the sweep
    is kept (it needs no copy of the factors beside its memo)."""
    N = len(shape)
    if not 3 <= N <= 5:
        return []
    edges = N if wrap else N - 1
    gain = [1.0 - pair_fraction(coords, shape, m, (m + 1) % N) for m in range(edges)]
    gain = [
        g if 1.0 - g <= (groups_max if m < N - 1 else min(groups_max, WRAP_GROUPS_MAX)) else 0.0
        for m, g in enumerate(gain)
    ]
    plain_gain, plain = _best_on_path(gain, 0, N - 1)
    if wrap and gain[N - 1] > 0:
        # with (N - 1, 0) taken, modes 1 .. N - 2 are left, a path
        inner_gain, inner = _best_on_path(gain, 1, N - 2)
        tie = (
            len(inner) + 1 == len(plain)
            and rank is not None
            and inner_gain + gain[N - 1] > plain_gain
            and sum(shape[1 : N - 1]) * rank * 8 <= WRAP_TIE_ROWS_BYTES  # the rows its pass gathers
        )
        if len(inner) + 1 > len(plain) or tie:
            return [(m, m + 1) for m in inner] + [(N - 1, 0)]
    return [(m, m + 1) for m in plain]


def _first_source(name: str, nothers: int, rank_const: int) -> str:
    """Source of the pass over the nonzeros: each pair's sum into ``Z`` and, with ``scatter``, its
    product with ``A_b`` into mode ``a``'s output. A fixed rank keeps the sum in registers (R
    scalars the SLP vectorizer packs); a run-time rank sums into ``Z``'s row."""
    RC = rank_const
    L: list[str] = []
    add = L.append
    add(f"def {name}(ptr, rows_a, rows_b, other, values, F, offs, others, b, Z, out, out_lo, cuts, bounds, scatter):")
    add(f"    R = {RC}" if RC else "    R = F.shape[1]")
    add("    RU = np.uint64(R)")
    add("    zero = F[0, 0] * 0")
    add("    Ff = F.reshape(F.size)")
    add("    Zf = Z.reshape(Z.size)")
    add("    Of = out.reshape(out.size)")
    add("    ob = np.uint64(offs[b])")
    for j in range(nothers):
        add(f"    c{j} = np.uint64(offs[others[{j}]])")
    add("    for t in nb.prange(bounds.shape[0] - 1):")
    add("        for g in range(cuts[bounds[t]], cuts[bounds[t + 1]]):")
    add("            zq = np.uint64(g) * RU")
    if RC:

        def body(pad: str, i: str, acc: str) -> None:
            add(f"{pad}v = values[{i}]")
            for j in range(nothers):
                add(f"{pad}q{j} = (c{j} + np.uint64(other[{i}, {j}])) * RU")
            for r in range(RC):
                add(f"{pad}{acc}{r} += v * " + " * ".join(f"Ff[q{j} + np.uint64({r})]" for j in range(nothers)))

        run_sum(add, "            ", RC, "ptr[g]", "ptr[g + 1]", body)
        for r in range(RC):
            add(f"            Zf[zq + np.uint64({r})] = a{r}")
    else:
        add("            for r in range(R):")
        add("                Zf[zq + np.uint64(r)] = zero")
        add("            for i in range(np.uint64(ptr[g]), np.uint64(ptr[g + 1])):")
        add("                v = values[i]")
        for j in range(nothers):
            add(f"                q{j} = (c{j} + np.uint64(other[i, {j}])) * RU")
        add("                for r in range(R):")
        add(
            "                    Zf[zq + np.uint64(r)] += v * "
            + " * ".join(f"Ff[q{j} + np.uint64(r)]" for j in range(nothers))
        )
    add("            if scatter:")
    add("                qb = (ob + np.uint64(rows_b[g])) * RU")
    add("                qo = np.uint64(rows_a[g] - out_lo) * RU")
    if RC:
        for r in range(RC):
            add(f"                Of[qo + np.uint64({r})] += a{r} * Ff[qb + np.uint64({r})]")
    else:
        add("                for r in range(R):")
        add("                    Of[qo + np.uint64(r)] += Zf[zq + np.uint64(r)] * Ff[qb + np.uint64(r)]")
    return "\n".join(L) + "\n"


def _second(rows_a, rows_b, by_b, Z, F, offs, a, out, out_lo, cuts, bounds):
    """Mode ``b``'s output from the memo: ``out[rows_b[g] - out_lo] += Z[g] * A_a[rows_a[g]]``,
    pairs in ``by_b`` order, thread ``t`` taking rows ``cuts[bounds[t]] .. cuts[bounds[t + 1]]``."""
    R = F.shape[1]
    oa = offs[a]
    for t in nb.prange(bounds.shape[0] - 1):
        for j in range(cuts[bounds[t]], cuts[bounds[t + 1]]):
            g = by_b[j]
            o = rows_b[g] - out_lo
            f = oa + rows_a[g]
            for r in range(R):
                out[o, r] += Z[g, r] * F[f, r]


second_pass = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True)(_second))


def _other_source(name: str, nothers: int, col: int, rank_const: int) -> str:
    """Source of a pass over the pair's nonzeros for mode ``others[col]``, a mode outside the pair:
    per pair ``g`` the product ``P = A_a[rows_a[g]] * A_b[rows_b[g]]`` once, then per nonzero
    ``x * P * prod_{j != col} A_{others[j]}[other[i, j]]`` added into row ``other[i, col]`` of slice
    ``s``'s output ``bufs[s]`` (pairs ``slices[s] .. slices[s + 1]``); the caller sums the slices in
    order. Fixed ranks only: the row products stay R scalars."""
    RC = rank_const
    L: list[str] = []
    add = L.append
    add(f"def {name}(ptr, rows_a, rows_b, other, values, F, offs, others, a, b, slices, bufs):")
    add(f"    RU = np.uint64({RC})")
    add("    Ff = F.reshape(F.size)")
    add("    oa = np.uint64(offs[a])")
    add("    ob = np.uint64(offs[b])")
    rest = [j for j in range(nothers) if j != col]
    for j in rest:
        add(f"    c{j} = np.uint64(offs[others[{j}]])")
    add("    for s in nb.prange(slices.shape[0] - 1):")
    add("        Bf = bufs[s].reshape(bufs[s].size)")
    add("        for g in range(slices[s], slices[s + 1]):")
    add("            qa = (oa + np.uint64(rows_a[g])) * RU")
    add("            qb = (ob + np.uint64(rows_b[g])) * RU")
    for r in range(RC):
        add(f"            p{r} = Ff[qa + np.uint64({r})] * Ff[qb + np.uint64({r})]")
    add("            for i in range(np.uint64(ptr[g]), np.uint64(ptr[g + 1])):")
    add("                v = values[i]")
    for j in rest:
        add(f"                q{j} = (c{j} + np.uint64(other[i, {j}])) * RU")
    add(f"                d = np.uint64(other[i, {col}]) * RU")
    # every product before any store (a store between loads of F may alias them: no SLP)
    for r in range(RC):
        add(f"                t{r} = " + " * ".join(["v", f"p{r}"] + [f"Ff[q{j} + np.uint64({r})]" for j in rest]))
    for r in range(RC):
        add(f"                Bf[d + np.uint64({r})] += t{r}")
    return "\n".join(L) + "\n"


_OTHER: dict[tuple[int, int, int], SLPKernel] = {}


def other_pass(nothers: int, col: int, rank: int) -> SLPKernel:
    """The compiled pass of :func:`_other_source` for ``nothers`` other modes, target column
    ``col`` and a rank of :data:`~.cpu.SPECIALIZED_RANKS`."""
    key = (nothers, col, rank)
    if key not in _OTHER:
        name = f"pair_other_o{nothers}_c{col}_r{rank}"
        scope = globals()
        exec(compile(_other_source(name, nothers, col, rank), __file__, "exec"), scope)
        _OTHER[key] = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True)(scope[name]))
    return _OTHER[key]


def other_fits(pair: ModePair, mode: int, rows: int, rank: int, itemsize: int = 8) -> bool:
    """Whether mode ``mode`` (outside the pair, rows ``0 .. rows - 1``) runs from the pair's copy
    (:func:`pair_other`): a fixed rank, a slice output of at most :data:`OTHER_OUTPUT_BYTES_MAX`,
    and enough nonzeros a slice output row."""
    return (
        rank in SPECIALIZED_RANKS
        and mode in pair.others
        and rows * rank * itemsize <= OTHER_OUTPUT_BYTES_MAX
        and OTHER_SLICES * rows * OTHER_NNZ_PER_ROW <= pair.nnz
    )


def pair_other(pair: ModePair, F: np.ndarray, offs: np.ndarray, mode: int, out: np.ndarray, out_lo: int = 0) -> None:
    """Add the MTTKRP of ``mode``, one of the pair's other modes, into ``out`` (rows ``out_lo ..``)
    from the pair's copy: the nonzeros the pair's first mode has just streamed, with one factor row
    fewer a nonzero (the pair's two rows are one product per pair). :data:`OTHER_SLICES` fixed
    slices of the pairs each add into an output of their own, summed in order, so sums do not
    depend on the thread count."""
    col = int(np.flatnonzero(pair.others == mode)[0])
    rows = out_lo + out.shape[0]
    cut = np.searchsorted(pair.ptr, np.linspace(0, pair.nnz, OTHER_SLICES + 1)).astype(np.int64)
    cut[0], cut[-1] = 0, pair.groups
    bufs = np.zeros((OTHER_SLICES, rows, F.shape[1]), dtype=F.dtype)
    other_pass(len(pair.others), col, F.shape[1])(
        pair.ptr, pair.rows_a, pair.rows_b, pair.other, pair.values, F, offs, pair.others, pair.a, pair.b, cut, bufs
    )
    sum_slices(bufs, out, int(out_lo))


def _second_slices(rows_a, rows_b, Z, F, offs, a, slices, bufs):
    """Mode ``b``'s output from the memo in the pairs' own order: slice ``s`` (pairs
    ``slices[s] .. slices[s + 1]``) adds into ``bufs[s]`` (rows of mode ``b`` from 0), reading ``Z``
    front to back; the caller sums the slices in order."""
    R = F.shape[1]
    oa = offs[a]
    for s in nb.prange(slices.shape[0] - 1):
        for g in range(slices[s], slices[s + 1]):
            o = rows_b[g]
            f = oa + rows_a[g]
            for r in range(R):
                bufs[s, o, r] += Z[g, r] * F[f, r]


def _sum_slices(bufs, out, out_lo):
    """``out[i - out_lo] += sum_s bufs[s, i]`` for the rows ``out`` holds, slices in order."""
    for i in nb.prange(out.shape[0]):
        for s in range(bufs.shape[0]):
            for r in range(out.shape[1]):
                out[i, r] += bufs[s, i + out_lo, r]


second_slices = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True)(_second_slices))
sum_slices = nb.njit(parallel=True, nogil=True, cache=True)(_sum_slices)

_FIRST: dict[tuple[int, int], SLPKernel] = {}


def first_pass(nothers: int, rank: int) -> SLPKernel:
    """The compiled pass over the nonzeros (see :func:`_first_source`) for ``nothers`` other
    modes and ``rank`` (fixed for :data:`~.cpu.SPECIALIZED_RANKS`, else at run time)."""
    rc = rank if rank in SPECIALIZED_RANKS else 0
    key = (nothers, rc)
    if key not in _FIRST:
        name = f"pair_first_o{nothers}_r{rc}"
        # compiled in this module's namespace under a unique name, so numba's disk cache keys it
        scope = globals()
        exec(compile(_first_source(name, nothers, rc), __file__, "exec"), scope)
        _FIRST[key] = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True)(scope[name]))
    return _FIRST[key]


def _thread_bounds(cuts: np.ndarray, weight: np.ndarray, threads: int) -> np.ndarray:
    """Indices into ``cuts`` splitting its segments into ``threads`` shares of about equal
    ``weight`` (cumulative, at each cut)."""
    total = weight[-1] - weight[0]
    targets = weight[0] + total * np.arange(1, threads) / threads
    inner = np.searchsorted(weight, targets, side="left")
    return np.unique(np.concatenate([[0], inner, [cuts.shape[0] - 1]])).astype(np.int64)


def pair_first(
    pair: ModePair, F: np.ndarray, offs: np.ndarray, Z: np.ndarray, out: np.ndarray | None, out_lo: int = 0
) -> None:
    """Fill the memo ``Z`` (G, R) of ``pair`` from the current factors and, with ``out``, add
    mode ``a``'s MTTKRP into ``out`` (rows ``out_lo ..``), on the caller's numba threads.

    Parameters
    ----------
    pair : ModePair
    F : (sum I_m, R) C array
        Stacked factors (rows of mode ``m`` from ``offs[m]``).
    offs : int64 (N,)
    Z : (G, R) C array of F's dtype
        Overwritten with the memo.
    out : (rows, R) C array, or None
        Mode ``a``'s output rows from ``out_lo``, added into; None: the memo alone.
    """
    R = F.shape[1]
    if Z.shape != (pair.groups, R) or Z.dtype != F.dtype:
        raise ValueError(f"the memo must be {F.dtype} of shape {(pair.groups, R)}, got {Z.dtype} {Z.shape}")
    scatter = out is not None
    if out is None:
        out = np.zeros((1, R), dtype=F.dtype)
    weight = pair.ptr[pair.cuts_a]
    bounds = _thread_bounds(pair.cuts_a, weight, nb.get_num_threads())
    first_pass(len(pair.others), R)(
        pair.ptr,
        pair.rows_a,
        pair.rows_b,
        pair.other,
        pair.values,
        F,
        offs,
        pair.others,
        pair.b,
        Z,
        out,
        int(out_lo),
        pair.cuts_a,
        bounds,
        scatter,
    )


def pair_second(
    pair: ModePair,
    F: np.ndarray,
    offs: np.ndarray,
    Z: np.ndarray,
    out: np.ndarray,
    out_lo: int = 0,
    slices: bool | None = None,
) -> None:
    """Add mode ``b``'s MTTKRP into ``out`` (rows ``out_lo ..``) from the memo ``Z`` that
    :func:`pair_first` filled with the factors of the modes other than ``a`` and ``b`` as they are now.

    ``slices``: read the memo front to back into :data:`SECOND_SLICES` slice outputs of mode ``b``,
    summed in order (True), or by mode ``b``'s rows, each row's pairs in turn (False); None: slices
    where mode ``b`` is short against the pairs (:data:`SLICE_PAIRS_PER_ROW`). Either gives sums
    that do not depend on the thread count."""
    nb_rows = int(pair.rows_b.max()) + 1 if pair.groups else 0
    if slices is None:
        slices = SECOND_SLICES * SLICE_PAIRS_PER_ROW * nb_rows <= pair.groups
    if slices:
        # by mode b's rows the reads of Z jump by about G / I_b rows each (nips-shaped mode 3:
        # 17 rows, 238 k pairs), in the pairs' own order they stream
        cut = np.linspace(0, pair.groups, SECOND_SLICES + 1).astype(np.int64)
        bufs = np.zeros((SECOND_SLICES, nb_rows, F.shape[1]), dtype=F.dtype)
        second_slices(pair.rows_a, pair.rows_b, Z, F, offs, pair.a, cut, bufs)
        sum_slices(bufs, out, int(out_lo))
        return
    bounds = _thread_bounds(pair.cuts_b, pair.cuts_b.astype(np.float64), nb.get_num_threads())
    second_pass(pair.rows_a, pair.rows_b, pair.by_b, Z, F, offs, pair.a, out, int(out_lo), pair.cuts_b, bounds)


def pair_bytes(nnz: int, nmodes: int, rank: int, itemsize: int, value_itemsize: int = 8) -> int:
    """The most one pair copy and its memo take for ``nnz`` nonzeros: the other modes' indices
    (at most 4 bytes each: :func:`other_dtype`) and the values per nonzero, and at most :data:`PAIR_GROUPS_MAX` of the
    nonzeros as pairs (their table and memo row)."""
    per_group = PAIR_GROUP_BYTES + rank * itemsize
    return int(nnz * ((nmodes - 2) * 4 + value_itemsize) + PAIR_GROUPS_MAX * nnz * per_group)
