"""Exact TT-ALS contraction kernels written out for one train's ranks and one core.

:func:`~tensorflow_ooc.kernels.tt.cpu.core_contraction` reads the ranks at run time: every chain
step and the rank-one update are loops of unknown length over memory arrays, with signed
indices (a negative-index fix-up on every load), so nothing vectorizes. The kernels here are
generated per (order, ranks ``R_0 .. R_N``, core ``j``, index encoding) and compiled once (numba's
cache keeps them across processes):

- **unrolled** (where the chains and the update have at most :data:`UNROLL_MAX_TERMS` products):
  every chain entry is a named scalar, each chain step is written out as ``t_b = l_0 G[0, b] +
  l_1 G[1, b] + ...``, and LLVM's SLP vectorizer packs the independent ``t_b`` into vector
  registers (as the fixed-rank MTTKRP kernels are, :class:`~tensorflow_ooc.kernels.mttkrp.cpu.SLPKernel`).
  The right chain reads each slice transposed (:func:`right_slices`), so that its step is the
  same row-times-matrix form.
- **looped** (larger ranks): the run-time kernel's loops with the ranks as constants and
  unsigned indices, which LLVM unrolls and vectorizes itself; compile time stays flat in the rank.

Both add the same products in the same order as the run-time kernel (no reassociation, no
fused multiply-add), so their sums are bit for bit the run-time kernel's: a streamed pass, a
partitioned one and a resumed run give the bits an in-memory one gives.

Measured (uber-shaped planted store, 3.3 M nonzeros, 4 modes, one thread, the four cores' passes
summed): run-time kernel against unrolled 10.4 x faster at R 4, 5.6 x at R 8, 5.1 x at R 12;
looped 2.4 x (R 8) and 2.1 x (R 12). Unrolled kernels took 1.5 s (R 4), 3.6 s (R 8) and 8-9 s
(R 12, 312 products) each to compile, about 28 ms a product, hence the bound; looped ones 1.5-2.5 s.
"""

from __future__ import annotations

import threading

import numba as nb
import numpy as np

# used by the generated kernels, which run in this module's namespace (see _build)
from ...format.bits import pext  # noqa: F401
from ..mttkrp.cpu import SLPKernel
from .cores import TTCores

# products per nonzero (chain steps and the rank-one update) up to which the kernel is unrolled:
# about 28 ms of compile time each (R 12 on 4 modes: 312 products, 9 s), compiled once
UNROLL_MAX_TERMS = 400

_KERNELS: dict[tuple, object] = {}
_LOCK = threading.Lock()


def _u(v) -> str:
    return f"np.uint64({v})"


def chain_terms(ranks: tuple[int, ...], mode: int) -> int:
    """Products per nonzero of core ``mode``'s contraction: the chain steps and the update."""
    N = len(ranks) - 1
    steps = sum(ranks[m] * ranks[m + 1] for m in range(1, mode)) + sum(
        ranks[m] * ranks[m + 1] for m in range(mode + 1, N - 1)
    )
    return steps + ranks[mode] * ranks[mode + 1]


def _field(m: int, delta: bool) -> str:
    return f"pext(word, m{m})" if delta else f"((x >> s{m}) & m{m})"


def _header(add, name: str, N: int, mode: int, delta: bool) -> None:
    add(
        f"def {name}(index, values, item_start, item_end, item_base, item_prev, shift, mask, data, data_t, offsets, "
        "row_lo, bounds, todo, bufs):"
    )
    for m in range(N):
        add(f"    s{m} = np.uint64(shift[{m}]); m{m} = np.uint64(mask[{m}]); c{m} = np.uint64(offsets[{m}])")
    add("    nrows = np.uint64(bufs.shape[1])")
    add("    lo = np.uint64(row_lo)")
    add("    for g in nb.prange(bounds.shape[0] - 1):")
    add("        Of = bufs[g].reshape(bufs[g].size)")
    add("        for t in range(bounds[g], bounds[g + 1]):")
    add("            k = todo[t]")
    for m in range(N):
        add(f"            b{m} = np.uint64(item_base[k, {m}])")
    add("            word = item_prev[k]")
    add("            for i in range(np.uint64(item_start[k]), np.uint64(item_end[k])):")
    add("                x = index[i]")
    if delta:
        add("                word += x")
    # rows of other partitions or batches are skipped (uint64: a row below lo wraps above nrows)
    add(f"                d = b{mode} + {_field(mode, delta)} - lo")
    add("                if d >= nrows:")
    add("                    continue")


def _unrolled_body(add, N: int, ranks: tuple[int, ...], j: int, delta: bool) -> None:
    P = "                "
    if j > 0:
        r1 = ranks[1]
        add(f"{P}p = c0 + (b0 + {_field(0, delta)}) * {_u(r1)}")
        for b in range(r1):
            add(f"{P}l{b} = data[p + {_u(b)}]")
        for m in range(1, j):
            r0, r1 = ranks[m], ranks[m + 1]
            add(f"{P}p = c{m} + (b{m} + {_field(m, delta)}) * {_u(r0 * r1)}")
            for b in range(r1):
                add(f"{P}t{b} = " + " + ".join(f"l{a} * data[p + {_u(a * r1 + b)}]" for a in range(r0)))
            for b in range(r1):
                add(f"{P}l{b} = t{b}")
    if j < N - 1:
        m = N - 1
        add(f"{P}p = c{m} + (b{m} + {_field(m, delta)}) * {_u(ranks[m])}")
        for a in range(ranks[m]):
            add(f"{P}r{a} = data[p + {_u(a)}]")
        for m in range(N - 2, j, -1):
            r0, r1 = ranks[m], ranks[m + 1]
            # data_t holds each slice transposed, (r1, r0) row-major: column a of the slice is
            # contiguous, and the step is a row times a matrix like the left chain's
            add(f"{P}p = c{m} + (b{m} + {_field(m, delta)}) * {_u(r0 * r1)}")
            for a in range(r0):
                add(f"{P}u{a} = " + " + ".join(f"data_t[p + {_u(b * r0 + a)}] * r{b}" for b in range(r1)))
            for a in range(r0):
                add(f"{P}r{a} = u{a}")
    RA, RB = ranks[j], ranks[j + 1]
    add(f"{P}xv = values[i]")
    add(f"{P}q = d * {_u(RA * RB)}")
    if j == 0:
        for b in range(RB):
            add(f"{P}Of[q + {_u(b)}] += xv * r{b}")
    elif j == N - 1:
        for a in range(RA):
            add(f"{P}Of[q + {_u(a)}] += xv * l{a}")
    else:
        for a in range(RA):
            add(f"{P}xl = xv * l{a}")
            for b in range(RB):
                add(f"{P}Of[q + {_u(a * RB + b)}] += xl * r{b}")


def _looped_body(add, N: int, ranks: tuple[int, ...], j: int, delta: bool) -> None:
    P = "                "
    if j > 0:
        add(f"{P}p = c0 + (b0 + {_field(0, delta)}) * {_u(ranks[1])}")
        add(f"{P}for b in range({_u(ranks[1])}):")
        add(f"{P}    left[b] = data[p + b]")
        for m in range(1, j):
            r0, r1 = ranks[m], ranks[m + 1]
            add(f"{P}p = c{m} + (b{m} + {_field(m, delta)}) * {_u(r0 * r1)}")
            add(f"{P}for b in range({_u(r1)}):")
            add(f"{P}    tmp[b] = 0.0")
            add(f"{P}for a in range({_u(r0)}):")
            add(f"{P}    la = left[a]")
            add(f"{P}    for b in range({_u(r1)}):")
            add(f"{P}        tmp[b] += la * data[p + a * {_u(r1)} + b]")
            add(f"{P}for b in range({_u(r1)}):")
            add(f"{P}    left[b] = tmp[b]")
    if j < N - 1:
        m = N - 1
        add(f"{P}p = c{m} + (b{m} + {_field(m, delta)}) * {_u(ranks[m])}")
        add(f"{P}for a in range({_u(ranks[m])}):")
        add(f"{P}    right[a] = data[p + a]")
        for m in range(N - 2, j, -1):
            r0, r1 = ranks[m], ranks[m + 1]
            add(f"{P}p = c{m} + (b{m} + {_field(m, delta)}) * {_u(r0 * r1)}")
            add(f"{P}for a in range({_u(r0)}):")
            add(f"{P}    acc = 0.0")
            add(f"{P}    for b in range({_u(r1)}):")
            add(f"{P}        acc += data[p + a * {_u(r1)} + b] * right[b]")
            add(f"{P}    tmp[a] = acc")
            add(f"{P}for a in range({_u(r0)}):")
            add(f"{P}    right[a] = tmp[a]")
    RA, RB = ranks[j], ranks[j + 1]
    add(f"{P}xv = values[i]")
    add(f"{P}q = d * {_u(RA * RB)}")
    add(f"{P}for a in range({_u(RA)}):")
    add(f"{P}    xl = xv * left[a]" if j > 0 else f"{P}    xl = xv")
    add(f"{P}    for b in range({_u(RB)}):")
    add(f"{P}        Of[q + a * {_u(RB)} + b] += xl * right[b]" if j < N - 1 else f"{P}        Of[q + a] += xl")


def contraction_source(name: str, ranks: tuple[int, ...], mode: int, delta: bool, unrolled: bool) -> str:
    """Python source of core ``mode``'s contraction kernel for a train of ``ranks`` (R_0 .. R_N);
    the arguments are :func:`~tensorflow_ooc.kernels.tt.cpu._core_contraction`'s, with ``data_t``
    (:func:`right_slices`) after ``data`` and no ``delta`` flag, ranks or mode (all compiled in)."""
    N = len(ranks) - 1
    L: list[str] = []
    add = L.append
    _header(add, name, N, mode, delta)
    if unrolled:
        _unrolled_body(add, N, ranks, mode, delta)
    else:
        # per-thread chain buffers, made before the thread's item loop
        rmax = max(ranks)
        at = L.index("        for t in range(bounds[g], bounds[g + 1]):")
        L.insert(at, f"        left = np.empty({rmax}); right = np.empty({rmax}); tmp = np.empty({rmax})")
        _looped_body(add, N, ranks, mode, delta)
    return "\n".join(L) + "\n"


def residual_source(name: str, ranks: tuple[int, ...], delta: bool, unrolled: bool) -> str:
    """Python source of the residual kernel for a train of ``ranks``: the arguments and sums of
    :func:`~tensorflow_ooc.kernels.tt.cpu._residual_sums` (each item's ``sum (x - t)^2`` and
    ``sum t^2``, ``t`` the whole chain at the nonzero), the chain written as in the contraction."""
    N = len(ranks) - 1
    L: list[str] = []
    add = L.append
    add(
        f"def {name}(index, values, item_start, item_end, item_base, item_prev, shift, mask, data, offsets, "
        "item_res, item_model):"
    )
    for m in range(N):
        add(f"    s{m} = np.uint64(shift[{m}]); m{m} = np.uint64(mask[{m}]); c{m} = np.uint64(offsets[{m}])")
    add("    for k in nb.prange(item_start.shape[0]):")
    if not unrolled:
        rmax = max(ranks)
        add(f"        left = np.empty({rmax}); tmp = np.empty({rmax})")
    for m in range(N):
        add(f"        b{m} = np.uint64(item_base[k, {m}])")
    add("        word = item_prev[k]")
    add("        res = 0.0")
    add("        mod = 0.0")
    add("        for i in range(np.uint64(item_start[k]), np.uint64(item_end[k])):")
    add("            x = index[i]")
    if delta:
        add("            word += x")
    lines: list[str] = []
    # the left chain through every core: the contraction's left chain with core N as its "mode"
    (_unrolled_body if unrolled else _looped_body)(lines.append, N + 1, ranks + (1,), N, delta)
    body = [ln[4:] for ln in lines]  # the contraction body is one level deeper
    cut = next(n for n, ln in enumerate(body) if ln.strip().startswith("xv = values[i]"))
    L.extend(body[:cut])
    add("            t = l0" if unrolled else "            t = left[0]")
    add("            e = values[i] - t")
    add("            res += e * e")
    add("            mod += t * t")
    add("        item_res[k] = res")
    add("        item_model[k] = mod")
    return "\n".join(L) + "\n"


def residual_kernel(ranks, delta: bool):
    """The compiled residual kernel for a train of ``ranks``, built on first use (unrolled where
    the chain has at most :data:`UNROLL_MAX_TERMS` products)."""
    ranks = tuple(int(r) for r in ranks)
    N = len(ranks) - 1
    unrolled = sum(ranks[m] * ranks[m + 1] for m in range(1, N)) <= UNROLL_MAX_TERMS
    key = (ranks, "residual", bool(delta), unrolled)
    with _LOCK:
        if key not in _KERNELS:
            tag = "_".join(map(str, ranks))
            name = f"tt_residual_{'unrolled' if unrolled else 'looped'}_r{tag}_d{int(bool(delta))}"
            scope = globals()
            exec(compile(residual_source(name, ranks, delta, unrolled), __file__, "exec"), scope)
            jit = nb.njit(parallel=True, nogil=True, cache=True)(scope[name])
            _KERNELS[key] = SLPKernel(jit) if unrolled else jit
        return _KERNELS[key]


def contraction_kernel(ranks, mode: int, delta: bool):
    """The compiled kernel for core ``mode`` of a train of ``ranks`` (R_0 .. R_N), built on first
    use: unrolled where :func:`chain_terms` is at most :data:`UNROLL_MAX_TERMS`, else looped."""
    ranks = tuple(int(r) for r in ranks)
    unrolled = chain_terms(ranks, mode) <= UNROLL_MAX_TERMS
    key = (ranks, int(mode), bool(delta), unrolled)
    with _LOCK:
        if key not in _KERNELS:
            tag = "_".join(map(str, ranks))
            name = f"tt_{'unrolled' if unrolled else 'looped'}_r{tag}_m{mode}_d{int(bool(delta))}"
            # compiled with this file as its file name, in this module, under a name unique to
            # the variant: numba's on-disk cache keys each variant apart (as the MTTKRP kernels)
            scope = globals()
            exec(compile(contraction_source(name, ranks, mode, delta, unrolled), __file__, "exec"), scope)
            jit = nb.njit(parallel=True, nogil=True, cache=True)(scope[name])
            _KERNELS[key] = SLPKernel(jit) if unrolled else jit
        return _KERNELS[key]


def kernel_variants() -> list[tuple]:
    """The kernels built in this process: (ranks, mode or "residual", delta, unrolled)."""
    return list(_KERNELS)


def right_slices(cores: TTCores, mode: int) -> np.ndarray:
    """``cores.data`` with the slices of the cores right of ``mode`` (all but the last, whose
    slices are columns) transposed to ``(R_k, R_{k-1})``, as the unrolled kernels' right chain
    reads them; the other cores' blocks are left as they are."""
    out = cores.data.copy()
    for k in range(mode + 1, cores.nmodes - 1):
        lo, hi = int(cores.offsets[k]), int(cores.offsets[k + 1])
        out[lo:hi] = cores.slices[k].transpose(0, 2, 1).ravel()
    return out
