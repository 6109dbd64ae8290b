"""CPU MTTKRP kernels on BLCO work items (seed 001 chapter 5, ALTO's CPU scheme).

A *work item* is a contiguous range of the ALTO order inside one block. Threads take whole items.
For target mode ``n`` every item either

- accumulates into a **private** buffer over its own row interval ``[lo_n, hi_n]`` of mode ``n``
  (no synchronisation), merged afterwards by a row-tiled pass that owns each output row once; or
- adds straight into the output with **atomic** float adds.

Consecutive nonzeros with the same target row can be summed in a local vector and written once
per run (BLCO's register-based resolution): always on the atomic path (one atomic per run instead
of per nonzero), and on the private path where the plan found runs long enough to pay for it.

Kernels are built per (number of modes, rank): both are compile-time constants, so the loop over
the other modes unrolls and the rank loop vectorizes into one fused multiply chain per nonzero.
Factor matrices come stacked in one array ``F`` (sum of mode lengths, R) with row offsets ``offs``.
Inputs are trusted: indices must decode inside the factor matrices (the store validates them).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numba as nb
import numpy as np

# used by the generated kernels, which run in this module's namespace (see _build)
from ...format.bits import HAS_BMI2, pext  # noqa: F401
from ..atomics import atomic_add  # noqa: F401
from ..prefetch import prefetch_row  # noqa: F401

# Kernels for factor matrices far larger than the caches prefetch the factor rows of the nonzero
# PREFETCH_DISTANCE ahead; where the factors fit the caches the extra decode only costs, so they
# are chosen above PREFETCH_MIN_BYTES (docs/KERNELS.md, "Measurements").
PREFETCH_DISTANCE = 16
PREFETCH_MIN_BYTES = 256 << 20

# Ranks compiled with the rank as a constant (common ones; others take the run-time rank).
# With SLP vectorization on, the constant form is faster at every rank measured: one process,
# uber-shaped, all modes, 1 thread, CPU seconds: R8 1.05x, R16 1.2x, R25 1.27x, R64 1.12x over
# the run-time rank; against the kernels before generation (array of rows, run-time rank except
# 32 and 64) 1.27x (R8), 1.49x (R16), 1.48x (R25), 1.31x (R32), 1.15x (R64). Above 32 the gain
# is small and the unrolled run kernel takes several times longer to compile, so 50 and 64 run
# the run-time form.
# 24 is also a width of the padded column groups (column_groups), like 8, 16 and 32.
SPECIALIZED_RANKS = (8, 10, 16, 20, 24, 25, 32)
# Other ranks run tiled kernels: R // RANK_TILE tiles of RANK_TILE columns at run time, then the
# R % RANK_TILE tail columns, each tile written out like a fixed rank (see _tiled_body).
RANK_TILE = 8


def _field(x: str, j: str, delta: bool) -> str:
    """Source of one mode's in-block index from word ``x``: a ``pext`` with that mode's mask
    (uint64 throughout, so the factor-row indices need no negative-index check).

    ``delta`` kernels extract from the ALTO word; the others from the re-encoded index, where a
    mode's field is contiguous, so the mask is the field mask shifted into place. One ``pext``
    replaces a shift and an ``and`` and keeps one value per mode in a register instead of two:
    one process, all modes, 1 thread, kernel CPU time against shift-and-mask: uber R16 1.14x,
    chicago R16 1.12x, nips R16 1.08x, uber/nips R32 1.05x. Without BMI2 (where ``pext`` is a
    loop) the re-encoded index is split by shift and mask."""
    return f"pext({x}, m{j})" if delta or HAS_BMI2 else f"(({x} >> s{j}) & m{j})"


def _other_modes(add, nmodes: int, delta: bool) -> None:
    """Source lines that hold each other mode's number ``o{j}``, field shift ``s{j}`` and mask
    ``m{j}`` in scalars, the modes in the order mode+1, mode+2, ... (mod N): a product does not
    care. With BMI2, a re-encoded index's masks are shifted into place for ``pext`` (a Delta
    item's ``pext`` masks already are)."""
    for j in range(1, nmodes):
        add(f"    o{j} = (mode + {j}) % {nmodes}")
        add(f"    s{j} = np.uint64(shift[o{j}]); m{j} = np.uint64(mask[o{j}])")
        if HAS_BMI2 and not delta:
            add(f"    m{j} = m{j} << s{j}")


def _source(
    name: str,
    kind: str,
    nmodes: int,
    rank_const: int,
    delta: bool,
    prefetch: bool,
    tail: int | None = None,
    poisson: bool = False,
) -> str:
    """Python source of one kernel (``kind`` "direct", "runs", "runs_atomic", "threads" or
    "runs_threads"), written out for its order so
    that each other mode's shift, mask and factor row is a scalar that stays in a register, and,
    for a fixed rank, the run accumulator is R scalars the SLP vectorizer packs into vector
    registers (an accumulator array lives in memory: a store-to-load chain per nonzero).

    ``tail`` (with ``rank_const`` 0): the rank is taken at run time as ``R // RANK_TILE`` tiles of
    ``RANK_TILE`` columns plus ``tail`` (= R % RANK_TILE) columns, each written out like a fixed
    rank (see :data:`RANK_TILE`).

    ``poisson``: CP-APR's Phi instead of the MTTKRP. Each nonzero's value becomes
    ``x / max(m, eps)`` (``eps`` a last argument), ``m = sum_r B[i_n, r] prod_{k != n} A_k[i_k, r]``
    the model value, with ``B`` the target mode's rows of ``F``: the Khatri-Rao row is formed once
    and serves both the model value and the sum (a separate model-value pass cost 1.5-3x the
    MTTKRP itself, uber-shaped R16)."""
    others = range(1, nmodes)
    PF = PREFETCH_DISTANCE if prefetch else 0
    RC = rank_const
    tiled = tail is not None
    if not RC and not tiled:
        raise ValueError("a kernel takes a fixed rank or a tail (tiled run-time rank)")
    L = []
    add = L.append
    if kind in ("direct", "runs"):
        add(
            f"def {name}(index, values, item_start, item_end, item_base, item_prev, item_lo, shift, mask, F, offs, "
            "mode, rank, todo, priv_row, priv_rows, priv_buf" + (", eps):" if poisson else "):")
        )
    elif kind in ("threads", "runs_threads"):
        add(
            f"def {name}(index, values, item_start, item_end, item_base, item_prev, item_lo, shift, mask, F, offs, "
            "mode, rank, todo, bounds, out, first, bufs, out_lo" + (", eps):" if poisson else "):")
        )
    else:
        add(
            f"def {name}(index, values, item_start, item_end, item_base, item_prev, item_lo, shift, mask, F, offs, "
            "mode, rank, todo, out_flat, out_lo" + (", eps):" if poisson else "):")
        )
    add(f"    R = {RC}" if RC else "    R = rank")
    if tiled:
        add("    RU = np.uint64(R)")
        add(f"    NT = R // {RANK_TILE}")
        add(f"    CT = np.uint64(NT * {RANK_TILE})")
    add("    st = np.uint64(shift[mode]); mt = np.uint64(mask[mode])")
    _other_modes(add, nmodes, delta)
    if HAS_BMI2 and not delta:
        add("    mt = mt << st")
    add("    zero = F[0, 0] * 0")
    # rows are addressed in 1-D views: row i starts at i * R, a shift or a constant multiply,
    # where a 2-D index multiplies by the run-time row stride and keeps each array's stride in a
    # register (the loop then ran out of registers and reloaded them from the stack; docs/KERNELS.md,
    # "Row addressing").
    add("    Ff = F.reshape(F.size)")
    if kind in ("direct", "runs"):
        add("    Pb = priv_buf.reshape(priv_buf.size)")
    if kind in ("threads", "runs_threads"):
        # thread g's contiguous share of the items adds into its own full-height buffer (the
        # first into ``out`` itself); the 2-space levels keep the item body below at 8 spaces
        add("    for g in nb.prange(bounds.shape[0] - 1):")
        add("      priv_buf = out if g == 0 else (first if g == 1 else bufs[g - 2])")
        add("      Pb = priv_buf.reshape(priv_buf.size)")
        add("      for t in range(bounds[g], bounds[g + 1]):")
        add("        k = todo[t]")
        add("        sr = np.uint64(item_base[k, mode] - out_lo)")
    elif kind == "runs_atomic":
        add("    for t in nb.prange(todo.shape[0]):")
        add("        k = todo[t]")
        # rows relative to the output block; uint64 wraps, so a negative offset plus the field
        # still lands on the right row
        add("        sr = np.uint64(item_base[k, mode] - out_lo)")
    else:
        add("    for t in nb.prange(todo.shape[0]):")
        add("        k = todo[t]")
        add("        first = priv_row[k]")
        add("        for j in range(first, first + priv_rows[k]):")
        add("            for r in range(R):")
        add("                priv_buf[j, r] = 0")
        add("        sr = np.uint64(first - item_lo[k, mode] + item_base[k, mode])")
    for j in others:
        add(f"        b{j} = np.uint64(item_base[k, o{j}] + offs[o{j}])")
    if poisson:
        add("        bt = np.uint64(item_base[k, mode] + offs[mode])")
    add("        word = item_prev[k]")
    add("        end = item_end[k]")
    if PF:
        add("        ahead = word")
        if delta:
            add(f"        for i in range(item_start[k], min(end, item_start[k] + {PF})):")
            add("            ahead += index[i]")
    if kind in ("runs", "runs_atomic", "runs_threads"):
        # no row is 2**64 - 1: the sentinel for "no run yet"
        add("        current = ~np.uint64(0)")
        if not tiled:
            for r in range(RC):
                add(f"        a{r} = zero")
        else:
            add("        acc = np.zeros(R, dtype=F.dtype)")
    if not PF:
        # an unsigned index: numba emits no negative-index fix-up for index[i] and values[i]
        add("        for i in range(np.uint64(item_start[k]), np.uint64(end)):")
    else:
        add("        for i in range(item_start[k], end):")
        add(f"            if i + {PF} < end:")
        if delta:
            add(f"                ahead += index[i + {PF}]")
            add("                xa = ahead")
        else:
            add(f"                xa = index[i + {PF}]")
        for j in others:
            add(f"                prefetch_row(F, np.int64(b{j} + {_field('xa', str(j), delta)}))")
        if kind == "threads":
            add(f"                prefetch_row(priv_buf, np.int64(sr + {_field('xa', 't', delta)}))")
    if delta:
        add("            word += index[i]")
        add("            x = word")
    else:
        add("            x = index[i]")
    if poisson:
        add(f"            ft = {_field('x', 't', delta)}")
        add("            d = sr + ft")
    else:
        add(f"            d = sr + {_field('x', 't', delta)}")
    for j in others:
        add(f"            r{j} = b{j} + {_field('x', str(j), delta)}")
    if not poisson:
        add("            v = values[i]")
    if tiled:
        for j in others:
            add(f"            q{j} = r{j} * RU")
        if poisson:
            _tiled_model_value(add, others, tail)
        _tiled_body(add, kind, others, tail)
        return "\n".join(L) + "\n"
    for j in others:
        add(f"            q{j} = r{j} * np.uint64({RC})")
    if poisson:
        # the Khatri-Rao row once, then the model value, then the weighted row
        add(f"            qt = (bt + ft) * np.uint64({RC})")
        for r in range(RC):
            add(f"            k{r} = " + " * ".join(f"Ff[q{j} + np.uint64({r})]" for j in others))
        for r in range(RC):
            add(f"            t{r} = Ff[qt + np.uint64({r})] * k{r}")
        add("            mv = " + _tree_sum([f"t{r}" for r in range(RC)]))
        add("            v = values[i] / max(mv, eps)")
        prod = lambda r: f"v * k{r}"  # noqa: E731
    else:
        prod = lambda r: " * ".join(["v"] + [f"Ff[q{j} + np.uint64({r})]" for j in others])  # noqa: E731
    if kind in ("direct", "threads"):
        # every product before any store: a store into priv_buf between two loads of F may
        # alias them, which kept SLP from vectorizing the unrolled rank loop (16 scalar
        # multiply-add-store chains at rank 16; docs/KERNELS.md)
        for r in range(RC):
            add(f"            p{r} = {prod(r)}")
        add(f"            dq = d * np.uint64({RC})")
        for r in range(RC):
            add(f"            Pb[dq + np.uint64({r})] += p{r}")
    else:
        add("            if d != current:")
        add("                if current != ~np.uint64(0):")
        _flush_source(add, "                    ", RC, kind == "runs_atomic")
        add("                current = d")
        for r in range(RC):
            add(f"            a{r} += {prod(r)}")
        add("        if current != ~np.uint64(0):")
        _flush_source(add, "            ", RC, kind == "runs_atomic")
    return "\n".join(L) + "\n"


# A run's sum of R <= RUN_SPLIT_RANK float64 columns is one vector register: one dependent add
# a nonzero. Two sums (even and odd nonzeros) halve that chain (docs/KERNELS.md, "Specialization").
RUN_SPLIT_RANK = 8


def run_sum(add, pad: str, RC: int, begin: str, end: str, body) -> None:
    """Source of a run's sum over nonzeros ``begin .. end`` into the accumulators ``a0 .. a{RC-1}``
    (set to zero here). ``body(pad, i, acc)`` writes one nonzero ``i``'s lines adding into
    ``acc0 ..``. At ranks up to :data:`RUN_SPLIT_RANK` even and odd nonzeros sum apart (``a`` and
    ``e``) and meet at the end, so the adds form two chains."""
    split = RC <= RUN_SPLIT_RANK
    for c in range(RC):
        add(f"{pad}a{c} = zero")
        if split:
            add(f"{pad}e{c} = zero")
    if not split:
        add(f"{pad}for i in range(np.uint64({begin}), np.uint64({end})):")
        body(pad + "    ", "i", "a")
        return
    add(f"{pad}i = np.uint64({begin})")
    add(f"{pad}stop = np.uint64({end})")
    add(f"{pad}while i + np.uint64(1) < stop:")
    body(pad + "    ", "i", "a")
    body(pad + "    ", "i + np.uint64(1)", "e")
    add(f"{pad}    i += np.uint64(2)")
    add(f"{pad}if i < stop:")
    body(pad + "    ", "i", "a")
    for c in range(RC):
        add(f"{pad}a{c} += e{c}")


def _table_source(name: str, nmodes: int, rank_const: int) -> str:
    """Python source of the ``table_threads`` kernel: ``runs_threads`` over a mode-sorted copy's
    run table (:attr:`~tensorflow_ooc.kernels.mttkrp.plan.WorkItems.runs`) instead of its items.
    A run's target row comes from the table, so the inner loop decodes only the other modes and
    has no row-change branch: one thread, kernel alone, against ``runs_threads`` on the same
    copies, R 8 / 16: uber-shaped 0.85 / 0.85, nips 0.92 / 0.97, chicago 0.81 / 0.83.

    Thread ``g`` takes runs ``bounds[g] .. bounds[g + 1]`` into its own output (``out``,
    ``first``, then ``bufs[g - 2]``), as ``runs_threads`` does with items."""
    RC = rank_const
    others = range(1, nmodes)
    L: list[str] = []
    add = L.append
    add(
        f"def {name}(ptr, rows, run_item, index, values, item_base, shift, mask, F, offs, mode, rank, bounds, "
        "out, first, bufs, out_lo):"
    )
    _other_modes(add, nmodes, False)
    add("    zero = F[0, 0] * 0")
    add("    Ff = F.reshape(F.size)")
    add("    for g in nb.prange(bounds.shape[0] - 1):")
    add("        priv_buf = out if g == 0 else (first if g == 1 else bufs[g - 2])")
    add("        Pb = priv_buf.reshape(priv_buf.size)")
    add("        for r in range(bounds[g], bounds[g + 1]):")
    add("            k = run_item[r]")
    for j in others:
        add(f"            b{j} = np.uint64(item_base[k, o{j}] + offs[o{j}])")

    def body(pad: str, i: str, acc: str) -> None:
        add(f"{pad}x = index[{i}]")
        for j in others:
            add(f"{pad}q{j} = (b{j} + {_field('x', str(j), False)}) * np.uint64({RC})")
        add(f"{pad}v = values[{i}]")
        for c in range(RC):
            add(f"{pad}{acc}{c} += v * " + " * ".join(f"Ff[q{j} + np.uint64({c})]" for j in others))

    run_sum(add, "            ", RC, "ptr[r]", "ptr[r + 1]", body)
    add(f"            cq = np.uint64(rows[r] - out_lo) * np.uint64({RC})")
    for c in range(RC):
        add(f"            Pb[cq + np.uint64({c})] += a{c}")
    return "\n".join(L) + "\n"


def _packed_source(name: str, nmodes: int, rank_const: int) -> str:
    """Python source of the ``packed_threads`` kernel: ``threads`` over 32-bit packed pieces
    (:mod:`~tensorflow_ooc.kernels.mttkrp.packed`). A piece's word holds each mode's offset from
    the piece's smallest index under the piece's own ``pext`` mask, so the masks and row bases are
    loaded once a piece; 12 bytes a nonzero stream in instead of 16.

    Thread ``g`` takes pieces ``bounds[g] .. bounds[g + 1]`` (in order) into its own output
    (``out``, ``first``, then ``bufs[g - 2]``), as ``threads`` does with items."""
    RC = rank_const
    others = range(1, nmodes)
    L: list[str] = []
    add = L.append
    add(
        f"def {name}(index, values, piece_start, piece_end, piece_lo, piece_mask, F, offs, mode, bounds, "
        "out, first, bufs, out_lo):"
    )
    for j in others:
        add(f"    o{j} = (mode + {j}) % {nmodes}")
    add("    Ff = F.reshape(F.size)")
    add("    for g in nb.prange(bounds.shape[0] - 1):")
    add("        priv_buf = out if g == 0 else (first if g == 1 else bufs[g - 2])")
    add("        Pb = priv_buf.reshape(priv_buf.size)")
    add("        for k in range(bounds[g], bounds[g + 1]):")
    add("            sr = np.uint64(piece_lo[k, mode] - out_lo)")
    add("            mt = piece_mask[k, mode]")
    for j in others:
        add(f"            b{j} = np.uint64(piece_lo[k, o{j}] + offs[o{j}]); m{j} = piece_mask[k, o{j}]")
    add("            for i in range(np.uint64(piece_start[k]), np.uint64(piece_end[k])):")
    add("                x = np.uint64(index[i])")
    add("                d = sr + pext(x, mt)")
    for j in others:
        add(f"                q{j} = (b{j} + pext(x, m{j})) * np.uint64({RC})")
    add("                v = values[i]")
    # every product before any store (see _source)
    for c in range(RC):
        add(f"                p{c} = v * " + " * ".join(f"Ff[q{j} + np.uint64({c})]" for j in others))
    add(f"                dq = d * np.uint64({RC})")
    for c in range(RC):
        add(f"                Pb[dq + np.uint64({c})] += p{c}")
    return "\n".join(L) + "\n"


def _tree_sum(terms: list[str]) -> str:
    """``terms`` summed as a balanced tree: written left to right, R adds form one dependent chain
    (numba compiles without reassociation), R times the add latency per nonzero. Uber-shaped,
    R16, CPU seconds of the four modes' Phi passes: 176 ms as a chain, against 65 ms for the
    MTTKRP."""
    while len(terms) > 1:
        h = len(terms) // 2
        # term r with term r + h: halves of the vector of terms, added as vectors
        terms = [f"({terms[r]} + {terms[r + h]})" for r in range(h)] + terms[2 * h :]
    return terms[0]


def _tiled_model_value(add, others: range, tail: int) -> None:
    """Poisson kernels at a run-time rank: the model value ``mv`` over every tile, then
    ``v = x / max(mv, eps)`` (the tiles' products are formed again by :func:`_tiled_body`)."""
    pad = "            "
    add(f"{pad}qt = (bt + ft) * RU")
    add(f"{pad}mv = zero")

    def term(col: str, r: int) -> str:
        return " * ".join(f"Ff[{q} + {col} + np.uint64({r})]" for q in ["qt"] + [f"q{j}" for j in others])

    add(f"{pad}for tt in range(NT):")
    add(f"{pad}    c = np.uint64(tt * {RANK_TILE})")
    add(f"{pad}    mv += " + _tree_sum([term("c", r) for r in range(RANK_TILE)]))
    if tail:
        add(f"{pad}mv += " + _tree_sum([term("CT", r) for r in range(tail)]))
    add(f"{pad}v = values[i] / max(mv, eps)")


def _tiled_body(add, kind: str, others: range, tail: int) -> None:
    """The per-nonzero body of a tiled kernel: per tile of ``RANK_TILE`` columns (and once for the
    ``tail`` columns after them) every product first, then the adds, as for a fixed rank, so
    each tile is a few vector multiply chains. Runs sum into ``acc`` (one array of R: R scalars
    would not stay in registers at a run-time rank) and flush at each new target row."""
    pad = "            "
    if kind in ("direct", "threads"):
        add(f"{pad}dq = d * RU")
    else:
        add(f"{pad}if d != current:")
        add(f"{pad}    if current != ~np.uint64(0):")
        _flush_source(add, pad + "        ", 0, kind == "runs_atomic")
        add(f"{pad}    current = d")

    def cols(n: int, col: str, inner: str) -> None:
        prod = lambda r: " * ".join(["v"] + [f"Ff[q{j} + {col} + np.uint64({r})]" for j in others])  # noqa: E731
        for r in range(n):
            add(f"{inner}p{r} = {prod(r)}")
        for r in range(n):
            if kind in ("direct", "threads"):
                add(f"{inner}Pb[dq + {col} + np.uint64({r})] += p{r}")
            else:
                add(f"{inner}acc[{col} + np.uint64({r})] += p{r}")

    add(f"{pad}for tt in range(NT):")
    add(f"{pad}    c = np.uint64(tt * {RANK_TILE})")
    cols(RANK_TILE, "c", pad + "    ")
    if tail:
        cols(tail, "CT", pad)
    if kind not in ("direct", "threads"):
        add("        if current != ~np.uint64(0):")
        _flush_source(add, "            ", 0, kind == "runs_atomic")


def _each_rank(add, pad: str, RC: int, fixed: str, loop: str) -> None:
    """One line per rank index for a fixed rank (``fixed`` with ``{r}`` filled in), else a loop
    over the run-time rank around ``loop``."""
    if RC:
        for r in range(RC):
            add(pad + fixed.format(r=r))
    else:
        add(f"{pad}for r in range(R):")
        add(f"{pad}    {loop}")


def _flush_source(add, pad: str, RC: int, atomic: bool) -> None:
    """Write one run's sum into the item's private rows, or (``atomic``) with atomic adds into the
    output, and reset it. The two are separate kernels: with both branches in one loop the
    atomic adds need the run's sum as R scalars, and LLVM then unpacked the vector accumulator
    into scalars at every nonzero (18 extra instructions each at rank 16)."""
    if not atomic:
        if RC:
            add(f"{pad}cq = current * np.uint64({RC})")
        _each_rank(add, pad, RC, "Pb[cq + np.uint64({r})] += a{r}", "priv_buf[current, r] += acc[r]")
    else:
        add(f"{pad}base = np.int64(current) * R")
        _each_rank(add, pad, RC, "atomic_add(out_flat, base + {r}, a{r})", "atomic_add(out_flat, base + r, acc[r])")
    _each_rank(add, pad, RC, "a{r} = zero", "acc[r] = 0")


def _build(
    nmodes: int,
    rank_const: int,
    delta: bool = False,
    prefetch: bool = False,
    tail: int | None = None,
    poisson: bool = False,
):
    """Kernels for ``nmodes`` modes; ``rank_const`` > 0 fixes the rank, 0 takes it at run time in
    tiles of ``RANK_TILE`` columns and ``tail`` more.

    ``delta`` kernels read streamed chunks as stored: Delta differences of the low ALTO words,
    summed along each item from ``item_prev`` and split into modes with one BMI2 ``pext`` per mode.
    That spares the reader a re-encoding pass per chunk and mode (about a third of its work).

    Four kernels, each over its own list of items: ``direct_items`` adds every nonzero straight
    into private rows; ``runs_items`` sums runs of one target row in registers first, then adds
    each run once into private rows; ``runs_atomic_items`` does so with atomic adds into
    ``out_flat``, the output rows ``out_lo ..`` of the target mode, row-major (runs are long in
    mode-sorted items, :mod:`~tensorflow_ooc.kernels.mttkrp.mode_order`); ``threads_items`` gives each thread a
    contiguous
    share of the items (``todo[bounds[g]:bounds[g + 1]]``, in ALTO order, so the rows of every mode
    keep the order's locality) and a whole output of its own: ``out`` for the first, ``first``
    for the second, ``bufs[g - 2]`` for the others (ALTO's per-thread outputs for long modes; the
    caller sums them). Keeping the hot loops apart keeps their bodies simple; numba loses
    vectorization when one prange body holds both.

    The source is generated per order (see ``_source``) and compiled with this file as its file
    name, in this module, under a name unique to the variant, so numba's on-disk cache keys each
    variant apart and drops them all when this file changes.

    Parameters (all kernels)
    -------------------------
    index : uint64 (nnz,)              re-encoded BLCO indices; for ``delta`` kernels the Delta
                                       differences of the low ALTO words
    values : float (nnz,)              nonzero values
    item_start, item_end : int64 (K,)  nonzero range of each work item
    item_base : int64 (K, N)           block base coordinates of each item
    item_prev : uint64 (K,)            ``delta`` kernels: the ALTO word before each item's first
                                       nonzero (0 where a chunk starts); ignored otherwise
    item_lo : int64 (K, N)             smallest index per mode inside each item
    shift : int64 (N,), mask : uint64 (N,)   BLCO field layout; ``delta`` kernels take the
                                       per-mode ``pext`` masks of the ALTO word in ``mask``
    F : float (sum_m I_m, R) C array   stacked factor matrices
    offs : int64 (N,)                  first row of each mode's factor in F
    mode : int                         target mode
    rank : int                         R (ignored when compiled for a fixed rank)
    todo : int64 (T,)                  the items to process
    priv_row, priv_rows : int64 (K,)   item k owns rows priv_row[k] .. + priv_rows[k] of priv_buf;
                                       index i of the target mode goes to row priv_row[k] + i - lo
    priv_buf : float (P, R)            private accumulators (zeroed here)
    out_flat : float (rows * R,)       ``runs_atomic``: the output block, row-major
    out_lo : int                       first target row held by ``out_flat`` (or ``out``)
    """
    tag = (
        f"n{nmodes}_r{rank_const}_d{int(bool(delta))}_p{int(bool(prefetch))}"
        + ("" if tail is None else f"_t{tail}")
        + ("_apr" if poisson else "")
    )
    # executed in this module's namespace: numba rebuilds a cached kernel's globals by importing
    # the module its function names
    scope = globals()
    kernels = []
    for kind in ("direct", "runs", "runs_atomic", "threads", "runs_threads"):
        name = f"{kind}_items_{tag}"
        code = compile(
            _source(name, kind, nmodes, rank_const, bool(delta), bool(prefetch), tail, bool(poisson)), __file__, "exec"
        )
        exec(code, scope)
        # Poisson kernels may reassociate (and contract to FMAs): the model value is then one
        # vector multiply and a horizontal sum; as written, R dependent adds per nonzero
        flags = {"fastmath": {"reassoc", "contract"}} if poisson else {}
        kernels.append(SLPKernel(nb.njit(parallel=True, nogil=True, cache=True, **flags)(scope[name])))
    # the run-table and packed kernels: fixed ranks of the MTTKRP (mode-sorted copies and packed
    # pieces are made from re-encoded in-memory items, never Delta ones)
    table = packed = None
    if rank_const and not delta and not poisson:
        name = f"table_threads_items_{tag}"
        exec(compile(_table_source(name, nmodes, rank_const), __file__, "exec"), scope)
        table = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True)(scope[name]))
        name = f"packed_threads_items_{tag}"
        exec(compile(_packed_source(name, nmodes, rank_const), __file__, "exec"), scope)
        packed = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True)(scope[name]))
    return ItemKernels(*kernels, table, packed)


class ItemKernels(NamedTuple):
    """The compiled item kernels of one order, rank, encoding, prefetch and Phi form, by conflict
    resolution (``table_threads`` and ``packed_threads`` None where they do not apply: run-time
    ranks, Delta items, Poisson)."""

    direct: SLPKernel
    runs: SLPKernel
    runs_atomic: SLPKernel
    threads: SLPKernel
    runs_threads: SLPKernel
    table_threads: SLPKernel | None
    packed_threads: SLPKernel | None = None


class SLPKernel:
    """A numba kernel compiled with LLVM's SLP vectorizer on (numba leaves it off by default).

    The fixed-rank kernels' per-rank scalars only become vector code through SLP: without it the
    rank-16 run accumulator compiles to 16 scalar multiply chains (about 2x slower here). The
    switch is numba's global setting, so it is turned on only while this kernel compiles (or
    loads from the cache) for a new argument type, under a lock.
    """

    _lock = threading.Lock()

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self._ready: set = set()

    def __call__(self, *args):
        key = tuple(a.dtype.char if isinstance(a, np.ndarray) else type(a) for a in args)
        if key not in self._ready:
            sig = tuple(nb.typeof(a) for a in args)
            with SLPKernel._lock:
                old = nb.core.config.SLP_VECTORIZE
                nb.core.config.SLP_VECTORIZE = 1
                try:
                    self.dispatcher.compile(sig)
                finally:
                    nb.core.config.SLP_VECTORIZE = old
            self._ready.add(key)
        return self.dispatcher(*args)


_KERNELS: dict[tuple, object] = {}


def kernel_variants() -> list[tuple]:
    """The kernel variants built in this process: (order, fixed rank or 0, delta, prefetch, tail)
    and, for CP-APR's Phi kernels, a sixth entry True."""
    return list(_KERNELS)


def kernel_for(
    nmodes: int, rank: int, delta: bool = False, prefetch: bool = False, poisson: bool = False
) -> ItemKernels:
    """The compiled :class:`ItemKernels` (``table_threads`` None where it does not apply: run-time
    ranks, Delta items, Poisson) for this order, rank and
    index encoding (fixed-rank code for ``SPECIALIZED_RANKS``); ``prefetch`` kernels prefetch
    factor rows ahead (for factors far larger than the caches); ``poisson`` kernels compute
    CP-APR's Phi (see ``_source``) and take ``eps`` as a last argument."""
    fixed = rank in SPECIALIZED_RANKS
    tail = None if fixed else rank % RANK_TILE
    key = (nmodes, rank if fixed else 0, bool(delta), bool(prefetch), tail) + ((True,) if poisson else ())
    if key not in _KERNELS:
        _KERNELS[key] = _build(*key)
    return _KERNELS[key]


def _merge_private(out, out_lo, private, priv_row, item_lo, item_hi, mode, priv_buf, tile):
    """Add every private accumulator into ``out``, which holds target rows ``out_lo ..``; each
    tile of rows is owned by one thread and items are added in a fixed order, so the result does
    not depend on the thread count."""
    nrows, R = out.shape
    ntiles = (nrows + tile - 1) // tile
    for t in nb.prange(ntiles):
        r0 = out_lo + t * tile
        r1 = min(out_lo + nrows, r0 + tile)
        for k in range(private.shape[0]):
            if not private[k]:
                continue
            lo = item_lo[k, mode]
            a = max(lo, r0)
            b = min(item_hi[k, mode] + 1, r1)
            for row in range(a, b):
                src = priv_row[k] + row - lo
                dst = row - out_lo
                for r in range(R):
                    out[dst, r] += priv_buf[src, r]


def _merge_thread_buffers(out, first, bufs):
    """``out += first + sum_g bufs[g]``, rows split over the threads (a fixed order of addition)."""
    nrows, R = out.shape
    for i in nb.prange(nrows):
        for r in range(R):
            out[i, r] += first[i, r]
        for g in range(bufs.shape[0]):
            for r in range(R):
                out[i, r] += bufs[g, i, r]


# each merge also on one thread, for small ones (threads_for): a parallel region there costs more
# than the adds, and under load a descheduled thread stalls it for milliseconds (a 128 x 16 output
# merged in 8 ms on average); every element is added to in the same order either way
merge_private = nb.njit(parallel=True, nogil=True, cache=True)(_merge_private)
merge_private_serial = nb.njit(nogil=True, cache=True)(_merge_private)
merge_thread_buffers = nb.njit(parallel=True, nogil=True, cache=True)(_merge_thread_buffers)
merge_thread_buffers_serial = nb.njit(nogil=True, cache=True)(_merge_thread_buffers)


@nb.njit(parallel=True, nogil=True, cache=True)
def item_profile(index, item_start, item_end, item_base, shift, mask, lo, hi, changes):
    """Per work item and mode: smallest and largest index, and how often consecutive nonzeros
    change that index (runs = nnz / changes). One decode pass, done once per tensor."""
    nmodes = shift.shape[0]
    for k in nb.prange(item_start.shape[0]):
        prev = np.full(nmodes, -1, dtype=np.int64)
        for m in range(nmodes):
            lo[k, m] = np.iinfo(np.int64).max
            hi[k, m] = -1
            changes[k, m] = 0
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            for m in range(nmodes):
                c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                if c < lo[k, m]:
                    lo[k, m] = c
                if c > hi[k, m]:
                    hi[k, m] = c
                if c != prev[m]:
                    changes[k, m] += 1
                    prev[m] = c
