"""CPU kernel of exact TT-ALS: a core's least-squares right-hand side, summed over the nonzeros.

With the cores left of ``j`` left-orthonormal and those right of it right-orthonormal, the
least-squares update of core ``j`` (seed 000, Proposition 5.2.2) is the contraction

    Y_j[a, i, b] = sum over nonzeros x with i_j = i of  x * L[a] * Rt[b],

``L = core_0[:, i_0, :] @ ... @ core_{j-1}[:, i_{j-1}, :]`` (a 1 x R_{j-1} row) and
``Rt = core_{j+1}[:, i_{j+1}, :] @ ... @ core_{N-1}[:, i_{N-1}, :]`` (an R_j x 1 column). Each
nonzero costs two chains of small vector-matrix products and one rank-one update of its slice
of ``Y_j``; the dense unfolding of the tensor is never formed.

:func:`residual_sums` evaluates the train at the nonzeros (the whole chain, a 1 x 1 product):
where every cell is stored, ``sum (x - t)^2`` is the squared error without the cancellation of
``||X||^2 - ||Y_j||^2`` (whose rounding bounds ``1 - fit`` below by about ``sqrt(eps)``, 1e-8).

The kernels decode BLCO work items themselves (as :mod:`~tensorflow_ooc.kernels.apr.cpu` does):
plain re-encoded indices (one shift and mask per mode) or, for streamed chunks, Delta
differences of the low ALTO words (``pext``). Indices are trusted (the store validates them).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...format.bits import pext
from ..mttkrp.plan import thread_shares
from .cores import TTCores
from .specialized import contraction_kernel, residual_kernel, right_slices

# private per-thread copies of the output are made only while all of them fit in this many bytes
# (a long mode at rank 16 has 2 KiB of output per row); beyond it fewer threads share the pass
MAX_PRIVATE_BYTES = 256 << 20
# calls over at least this many nonzeros run the kernel generated for the train's ranks and the
# core (:mod:`.specialized`, 2-10 x faster, the same bits), compiled once per ranks and core
# (1.5-9 s); smaller ones (tests, tiny partitions) keep the run-time-rank kernel
SPECIALIZE_MIN_NNZ = 1 << 17


@nb.njit(inline="always")
def _coord(x, word, m, base, shift, mask, delta):
    if delta:
        return base + np.int64(pext(word, np.uint64(mask[m])))
    return base + np.int64((x >> np.uint64(shift[m])) & np.uint64(mask[m]))


@nb.njit(inline="always")
def _decode(x, word, k, item_base, shift, mask, delta, rows):
    """The coordinates of nonzero ``x`` (``word``: its ALTO word for delta items) into ``rows``."""
    for m in range(rows.shape[0]):
        rows[m] = _coord(x, word, m, item_base[k, m], shift, mask, delta)


@nb.njit(inline="always")
def _left_chain(data, offsets, ranks, rows, upto, left, tmp):
    """``left[:R_upto] = core_0[:, i_0, :] @ ... @ core_{upto-1}[:, i_{upto-1}, :]`` (a row)."""
    left[0] = 1.0
    for m in range(upto):
        r0 = ranks[m]
        r1 = ranks[m + 1]
        s = offsets[m] + rows[m] * r0 * r1  # slice core_m[:, i_m, :], row-major (r0, r1)
        for b in range(r1):
            tmp[b] = 0.0
        for a in range(r0):
            la = left[a]
            for b in range(r1):
                tmp[b] += la * data[s + a * r1 + b]
        for b in range(r1):
            left[b] = tmp[b]


@nb.njit(inline="always")
def _right_chain(data, offsets, ranks, rows, after, right, tmp):
    """``right[:R_after] = core_{after+1}[:, i, :] @ ... @ core_{N-1}[:, i_{N-1}, :]`` (a column)."""
    right[0] = 1.0
    for m in range(rows.shape[0] - 1, after, -1):
        r0 = ranks[m]
        r1 = ranks[m + 1]
        s = offsets[m] + rows[m] * r0 * r1
        for a in range(r0):
            acc = 0.0
            for b in range(r1):
                acc += data[s + a * r1 + b] * right[b]
            tmp[a] = acc
        for a in range(r0):
            right[a] = tmp[a]


@nb.njit(parallel=True, nogil=True, cache=True)
def _core_contraction(
    index, values, item_start, item_end, item_base, item_prev, shift, mask, delta, data, offsets, ranks, mode,
    row_lo, bounds, todo, bufs,
):  # fmt: skip
    N = shift.shape[0]
    Ra = ranks[mode]
    Rb = ranks[mode + 1]
    rmax = 1
    for r in ranks:
        rmax = max(rmax, r)
    for g in nb.prange(bounds.shape[0] - 1):
        out = bufs[g]
        rows = np.empty(N, dtype=np.int64)
        left = np.empty(rmax)
        right = np.empty(rmax)
        tmp = np.empty(rmax)
        for t in range(bounds[g], bounds[g + 1]):
            k = todo[t]
            word = item_prev[k]
            for i in range(item_start[k], item_end[k]):
                x = index[i]
                if delta:
                    word += x
                _decode(x, word, k, item_base, shift, mask, delta, rows)
                d = rows[mode] - row_lo
                if d < 0 or d >= out.shape[0]:
                    continue
                _left_chain(data, offsets, ranks, rows, mode, left, tmp)  # L: 1 x R_{j-1}
                _right_chain(data, offsets, ranks, rows, mode, right, tmp)  # Rt: R_j x 1
                xv = values[i]
                for a in range(Ra):
                    xl = xv * left[a]
                    for b in range(Rb):
                        out[d, a * Rb + b] += xl * right[b]


@nb.njit(parallel=True, nogil=True, cache=True)
def _residual_sums(
    index, values, item_start, item_end, item_base, item_prev, shift, mask, delta, data, offsets, ranks, item_res,
    item_model,
):  # fmt: skip
    N = shift.shape[0]
    rmax = 1
    for r in ranks:
        rmax = max(rmax, r)
    for k in nb.prange(item_start.shape[0]):
        rows = np.empty(N, dtype=np.int64)
        left = np.empty(rmax)
        tmp = np.empty(rmax)
        word = item_prev[k]
        res = 0.0
        mod = 0.0
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            if delta:
                word += x
            _decode(x, word, k, item_base, shift, mask, delta, rows)
            _left_chain(data, offsets, ranks, rows, N, left, tmp)  # the whole chain: T[i] (1 x 1)
            e = values[i] - left[0]
            res += e * e
            mod += left[0] * left[0]
        item_res[k] = res
        item_model[k] = mod


def core_contraction(
    items,
    layout,
    cores: TTCores,
    mode: int,
    row_lo: int,
    out: np.ndarray,
    right: np.ndarray | None = None,
    specialize: bool | None = None,
) -> None:
    """Add the nonzeros' share of ``Y_mode`` (see the module docstring) into ``out``.

    Parameters
    ----------
    items : WorkItems
        A batch of BLCO work items (:class:`~tensorflow_ooc.kernels.mttkrp.plan.WorkItems`),
        decoded in memory or streamed (``items.delta``).
    layout : BitLayout
        The store's field layout (shifts and masks, or ``pext`` masks for delta items).
    cores : TTCores
        The tensor train; cores other than ``mode`` are read (``mode``'s own is not).
    mode : int
        j, the core whose right-hand side is formed.
    row_lo : int
        First index of mode ``j`` that ``out`` holds.
    out : float64 (rows, R_{j-1} * R_j), C array
        Row ``i - row_lo`` receives ``Y_j[:, i, :]`` (row-major ``(R_{j-1}, R_j)``), added to what
        it holds; nonzeros whose mode-``j`` index falls outside the rows are skipped.
    right : float64 array, optional
        :func:`~tensorflow_ooc.kernels.tt.specialized.right_slices` of ``cores`` for ``mode``, made
        once by a caller that makes several calls (made here when needed and not given).
    specialize : bool, optional
        Run the kernel generated for these ranks and this core
        (:mod:`~tensorflow_ooc.kernels.tt.specialized`); by default where the items hold at least
        :data:`SPECIALIZE_MIN_NNZ` nonzeros. The sums are the same bits either way.

    The items are shared out to the numba threads in contiguous shares of about equal nonzeros,
    each adding into its own zeroed copy of ``out`` (fewer threads when the copies would exceed
    :data:`MAX_PRIVATE_BYTES`); the copies are summed in thread order, so a pass gives the same
    bits on every run with the same thread count.
    """
    if items.nitems == 0:
        return
    T = max(1, min(nb.get_num_threads(), items.nitems, MAX_PRIVATE_BYTES // max(1, out.nbytes)))
    bounds, todo = thread_shares(items, T)
    bufs = out[None] if T == 1 else np.zeros((T,) + out.shape)
    if specialize is None:
        specialize = int((items.end - items.start).sum()) >= SPECIALIZE_MIN_NNZ
    if specialize:
        right = right_slices(cores, mode) if right is None else right
        kernel = contraction_kernel(cores.ranks, mode, bool(items.delta))
        kernel(*items.kernel_args(layout), cores.data, right, cores.offsets, int(row_lo), bounds, todo, bufs)
    else:
        _core_contraction(
            *items.kernel_args(layout),
            bool(items.delta),
            cores.data,
            cores.offsets,
            cores.ranks,
            int(mode),
            int(row_lo),
            bounds,
            todo,
            bufs,
        )
    if T > 1:
        out += bufs.sum(axis=0)


def residual_sums(items, layout, cores: TTCores, specialize: bool | None = None) -> tuple[float, float]:
    """``(sum (x - t)^2, sum t^2)`` over the nonzeros of ``items``, ``t`` the train's value there:
    summed per work item, then over the items in order (the sums do not depend on the thread
    count). Where every cell of the tensor is stored, the first is ``||X - T||^2`` itself, free of
    the cancellation in ``||X||^2 - ||Y_j||^2``. ``specialize``: as for :func:`core_contraction`
    (the kernel generated for the train's ranks, the same bits)."""
    K = items.nitems
    res = np.zeros(K)
    mod = np.zeros(K)
    if K:
        if specialize is None:
            specialize = int((items.end - items.start).sum()) >= SPECIALIZE_MIN_NNZ
        if specialize:
            kernel = residual_kernel(cores.ranks, bool(items.delta))
            kernel(*items.kernel_args(layout), cores.data, cores.offsets, res, mod)
        else:
            args = (bool(items.delta), cores.data, cores.offsets, cores.ranks, res, mod)
            _residual_sums(*items.kernel_args(layout), *args)
    return float(res.sum()), float(mod.sum())
