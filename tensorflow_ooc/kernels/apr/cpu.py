"""CPU kernels of CP-APR (Poisson CP) on BLCO work items: model values at the nonzeros, and the
row terms of the damped Newton method (Chi & Kolda 2012; Hansen, Plantenga & Kolda 2015).

CP-APR never forms the model: every quantity it needs is a sum over the nonzeros of terms in the
model value ``m = sum_r lam_r prod_n A_n[i_n, r]`` and the Khatri-Rao row of the other modes.

- :func:`model_values` writes, per nonzero, ``w = x / max(m, eps)`` and sums ``x log m`` and
  ``x m`` per work item (the log-likelihood and the inner product <X, M> of the least-squares fit).
  The multiplicative update's ``Phi = X_(n) ./ max(M_(n), eps) Pi`` is then an MTTKRP whose values
  are ``w``: it runs on the MTTKRP kernels (:mod:`~tensorflow_ooc.kernels.mttkrp`), with their
  conflict resolution and memory plan, instead of a second copy of them.
- :func:`newton_terms` adds, per target row, the gradient term ``phi``, the Hessian
  ``sum x / max(v^2, eps) pi pi^T`` (upper triangle, row-major) and ``sum x log v`` of the row
  subproblem, ``v = b . pi`` with ``b`` the row of the mode's factor. A nonzero whose ``pi`` is zero
  (the other modes' rows share no positive component) has model value 0 whatever ``b`` is: it is
  counted and left out (pyttb keeps it, and the row's objective is then infinite).
- :func:`candidate_terms` adds, per target row and line-search candidate ``c_k``, ``sum x log(c_k . pi)``:
  all of a row's backtracking steps in one pass.

``model_values`` is generated per (order, rank) like the MTTKRP kernels, so the loops over the
modes and a fixed rank unroll; the Newton kernels take the rank at run time (their cost is the
R^2 Hessian, not the decode). Indices are trusted (the store validates them).
"""

from __future__ import annotations

import numba as nb
import numpy as np

# used by the generated kernels, which run in this module's namespace (see _build_model_values)
from ...format.bits import HAS_BMI2, pext  # noqa: F401
from ..mttkrp.cpu import SLPKernel
from ..mttkrp.plan import thread_shares

# ranks compiled as constants (the rank loop unrolls); others run the same source with the rank
# read at run time
FIXED_RANKS = (4, 8, 10, 16, 20, 24, 25, 32)


def _decode_lines(add, pad: str, nmodes: int, delta: bool) -> None:
    """Source lines that set ``c{m}`` (the factor row of mode m in the stacked factors, times R)."""
    if delta:
        add(f"{pad}word += index[i]")
        add(f"{pad}x = word")
    else:
        add(f"{pad}x = index[i]")
    for m in range(nmodes):
        field = f"pext(x, m{m})" if delta or HAS_BMI2 else f"((x >> s{m}) & m{m})"
        add(f"{pad}c{m} = (b{m} + {field}) * RU")


def _model_values_source(name: str, nmodes: int, rank_const: int, delta: bool, sums: bool) -> str:
    L: list[str] = []
    add = L.append
    add(
        f"def {name}(index, values, item_start, item_end, item_base, item_prev, shift, mask, F, offs, lam, eps, "
        "rank, w, item_ll, item_xm):"
    )
    add(f"    R = {rank_const}" if rank_const else "    R = rank")
    add("    RU = np.uint64(R)")
    for m in range(nmodes):
        add(f"    s{m} = np.uint64(shift[{m}]); m{m} = np.uint64(mask[{m}])")
        if HAS_BMI2 and not delta:
            add(f"    m{m} = m{m} << s{m}")
    add("    Ff = F.reshape(F.size)")
    add("    for k in nb.prange(item_start.shape[0]):")
    for m in range(nmodes):
        add(f"        b{m} = np.uint64(item_base[k, {m}] + offs[{m}])")
    add("        word = item_prev[k]")
    add("        ll = 0.0")
    add("        xm = 0.0")
    add("        for i in range(item_start[k], item_end[k]):")
    _decode_lines(add, "            ", nmodes, delta)
    prod = lambda r: " * ".join([f"lam[{r}]"] + [f"Ff[c{m} + np.uint64({r})]" for m in range(nmodes)])  # noqa: E731
    if rank_const:
        for r in range(rank_const):
            add(f"            p{r} = {prod(r)}")
        add("            v = " + " + ".join(f"p{r}" for r in range(rank_const)))
    else:
        add("            v = 0.0")
        add("            for r in range(R):")
        add("                v += " + " * ".join(["lam[r]"] + [f"Ff[c{m} + np.uint64(r)]" for m in range(nmodes)]))
    add("            xv = values[i]")
    if sums:
        # the logarithm costs more than the rest of the nonzero's work: only the log-likelihood
        # pass (once per outer iteration) takes it, not the multiplicative update's passes
        add("            ll += xv * np.log(v)")
        add("            xm += xv * v")
    else:
        add("            w[i] = xv / max(v, eps)")
    add("        item_ll[k] = ll")
    add("        item_xm[k] = xm")
    return "\n".join(L) + "\n"


_MODEL_VALUES: dict[tuple[int, int, bool, bool], object] = {}


def model_values_kernel(nmodes: int, rank: int, delta: bool, sums: bool):
    """The compiled model-value kernel for this order, rank and index encoding.

    Parameters (of the kernel)
    --------------------------
    index : uint64 (nnz,)             re-encoded BLCO indices, or (``delta``) Delta differences of
                                      the low ALTO words
    values : float (nnz,)             the nonzeros' values (counts)
    item_start, item_end : int64 (K,) nonzero range of each work item
    item_base : int64 (K, N)          block base coordinates of each item
    item_prev : uint64 (K,)           ``delta``: the ALTO word before each item
    shift : int64 (N,), mask : uint64 (N,)   the field layout (``delta``: the ``pext`` masks)
    F : float (sum I_m, R) C array    stacked factor matrices; offs : int64 (N,) their first rows
    lam : float (R,)                  column weights multiplied into the model
    eps : float                       floor of the model value in ``w``
    rank : int                        R (ignored for a fixed rank)
    w : float (nnz,)                  out (without ``sums``): x / max(m, eps)
    item_ll, item_xm : float64 (K,)   out (with ``sums``): per item, sum x log m and sum x m
    """
    fixed = rank if rank in FIXED_RANKS else 0
    key = (int(nmodes), fixed, bool(delta), bool(sums))
    if key not in _MODEL_VALUES:
        name = f"model_values_n{key[0]}_r{key[1]}_d{int(key[2])}_s{int(key[3])}"
        code = compile(_model_values_source(name, *key), __file__, "exec")
        scope = globals()
        exec(code, scope)
        # compiled with LLVM's SLP vectorizer on, as the MTTKRP kernels (their fixed-rank
        # products become vector code only through it)
        _MODEL_VALUES[key] = SLPKernel(nb.njit(parallel=True, nogil=True, cache=True, fastmath=True)(scope[name]))
    return _MODEL_VALUES[key]


def model_values(
    items, layout, factors, lam: np.ndarray, eps: float, w: np.ndarray | None = None
) -> tuple[float, float]:
    """Under the model of ``factors`` (a :class:`~tensorflow_ooc.kernels.StackedFactors`) with
    column weights ``lam``, for the nonzeros of ``items`` (a
    :class:`~tensorflow_ooc.kernels.mttkrp.plan.WorkItems`): with ``w``, write ``w = x / max(m, eps)``
    and return zeros; without, return ``(sum x log m, sum x m)``, summed per item then over items
    in order (so the sums do not depend on the thread count)."""
    K = items.nitems
    ll = np.zeros(K)
    xm = np.zeros(K)
    if K:
        kernel = model_values_kernel(layout.nmodes, factors.rank, items.delta, w is None)
        if w is None:
            w = np.empty(0, dtype=factors.dtype)
        kernel(
            *items.kernel_args(layout),
            factors.data,
            factors.offsets,
            np.ascontiguousarray(lam, dtype=factors.dtype),
            float(eps),
            factors.rank,
            w,
            ll,
            xm,
        )
    return float(ll.sum()), float(xm.sum())


@nb.njit(inline="always")
def _coord(x, word, m, base, shift, mask, delta):
    if delta:
        return base + np.int64(pext(word, np.uint64(mask[m])))
    return base + np.int64((x >> np.uint64(shift[m])) & np.uint64(mask[m]))


@nb.njit(inline="always")
def _row_and_pi(x, word, k, item_base, shift, mask, delta, F, offs, mode, row_lo, active, rows, pi):
    """The factor rows of nonzero ``x`` (``word``: its ALTO word for delta items) into ``rows``
    and its Khatri-Rao row of the modes other than ``mode`` into ``pi``; returns its row in the
    block (``- row_lo``), or -1 where it lies outside the block or its row is inactive (``pi`` is
    then not formed)."""
    for m in range(rows.shape[0]):
        rows[m] = offs[m] + _coord(x, word, m, item_base[k, m], shift, mask, delta)
    d = rows[mode] - offs[mode] - row_lo
    if d < 0 or d >= active.shape[0] or not active[d]:
        return -1
    for r in range(pi.shape[0]):
        pi[r] = 1.0
    for m in range(rows.shape[0]):
        if m != mode:
            for r in range(pi.shape[0]):
                pi[r] *= F[rows[m], r]
    return d


@nb.njit(inline="always")
def _all_zero(pi):
    for r in range(pi.shape[0]):
        if pi[r] != 0.0:
            return False
    return True


@nb.njit(parallel=True, nogil=True, cache=True)
def _newton_terms(
    index, values, item_start, item_end, item_base, item_prev, shift, mask, delta, F, offs, mode, row_lo, active,
    eps, bounds, todo, bufs,
):  # fmt: skip
    N = shift.shape[0]
    R = F.shape[1]
    for g in nb.prange(bounds.shape[0] - 1):
        out = bufs[g]
        pi = np.empty(R)
        rows = np.empty(N, dtype=np.int64)
        for t in range(bounds[g], bounds[g + 1]):
            k = todo[t]
            word = item_prev[k]
            for i in range(item_start[k], item_end[k]):
                x = index[i]
                if delta:
                    word += x
                d = _row_and_pi(x, word, k, item_base, shift, mask, delta, F, offs, mode, row_lo, active, rows, pi)
                if d < 0:
                    continue
                if _all_zero(pi):
                    # no component is positive on every other mode: no value of the row gives this
                    # nonzero a model value above 0; it is left out of the row's problem, counted
                    out[d, out.shape[1] - 2] += 1.0
                    out[d, out.shape[1] - 1] += 1.0
                    continue
                v = 0.0
                for r in range(R):
                    v += F[rows[mode], r] * pi[r]
                xv = values[i]
                a = xv / max(v, eps)
                u = xv / max(v * v, eps)
                for r in range(R):
                    out[d, r] += a * pi[r]
                q = R
                for r in range(R):
                    ur = u * pi[r]
                    for s in range(r, R):
                        out[d, q] += ur * pi[s]
                        q += 1
                out[d, q] += xv * np.log(v)
                out[d, q + 1] += 1.0


@nb.njit(parallel=True, nogil=True, cache=True)
def _candidate_terms(
    index, values, item_start, item_end, item_base, item_prev, shift, mask, delta, F, offs, mode, row_lo, active,
    cand, bounds, todo, bufs,
):  # fmt: skip
    N = shift.shape[0]
    R = F.shape[1]
    K = cand.shape[1]
    for g in nb.prange(bounds.shape[0] - 1):
        out = bufs[g]
        pi = np.empty(R)
        rows = np.empty(N, dtype=np.int64)
        for t in range(bounds[g], bounds[g + 1]):
            k = todo[t]
            word = item_prev[k]
            for i in range(item_start[k], item_end[k]):
                x = index[i]
                if delta:
                    word += x
                d = _row_and_pi(x, word, k, item_base, shift, mask, delta, F, offs, mode, row_lo, active, rows, pi)
                if d < 0 or _all_zero(pi):  # left out of the row's problem (see _newton_terms)
                    continue
                xv = values[i]
                for c in range(K):
                    v = 0.0
                    for r in range(R):
                        v += cand[d, c, r] * pi[r]
                    out[d, c] += xv * np.log(v)


def hessian_width(rank: int) -> int:
    """Columns of a row's Newton terms: R (phi), R (R + 1) / 2 (Hessian, upper triangle, row by
    row), sum x log v, the row's nonzero count, and its count of nonzeros whose Khatri-Rao row is
    zero (left out of phi, the Hessian and sum x log v)."""
    return rank + rank * (rank + 1) // 2 + 3


def newton_terms(items, layout, factors, mode: int, row_lo: int, active: np.ndarray, eps: float, out: np.ndarray):
    """Add the Newton row terms (see the module docstring) of ``items`` into ``out`` (rows
    ``row_lo .. row_lo + len(active) - 1`` of mode ``mode``, width :func:`hessian_width`); nonzeros
    of other rows or of rows whose ``active`` flag is False are skipped."""
    _row_pass(_newton_terms, items, layout, factors, mode, row_lo, active, float(eps), out)


def candidate_terms(items, layout, factors, mode: int, row_lo: int, active: np.ndarray, cand: np.ndarray, out):
    """Add ``sum x log(cand[row, k] . pi)`` per row and candidate ``k`` into ``out`` (rows ×
    candidates), for the active rows ``row_lo ..`` of mode ``mode``."""
    _row_pass(_candidate_terms, items, layout, factors, mode, row_lo, active, cand, out)


def _row_pass(kernel, items, layout, factors, mode, row_lo, active, extra, out) -> None:
    if items.nitems == 0:
        return
    T = max(1, min(nb.get_num_threads(), items.nitems))
    bounds, todo = thread_shares(items, T)
    bufs = np.zeros((T,) + out.shape, dtype=out.dtype)
    kernel(
        *items.kernel_args(layout),
        bool(items.delta),
        factors.data,
        factors.offsets,
        int(mode),
        int(row_lo),
        np.ascontiguousarray(active, dtype=np.bool_),
        extra,
        bounds,
        todo,
        bufs,
    )
    out += bufs.sum(axis=0)


# factors of at most this many entries are updated on one thread: waking numba's threads costs
# more than the work (and, on a loaded machine, a scheduler slice per parallel region)
SERIAL_MAX_ENTRIES = 1 << 16


def mu_multiply(A: np.ndarray, phi: np.ndarray) -> None:
    """``A *= Phi`` (the multiplicative update), rows on numba's threads for large factors:
    NumPy's one-thread in-place multiply of an Amazon-shaped mode (4.8 M x 16) reads and writes
    1.2 GB on one core.

    A : float (I, R), written; phi : float (I, R)."""
    (_mu_multiply_one if A.size <= SERIAL_MAX_ENTRIES else _mu_multiply_threads)(A, phi)


def mu_kkt(A: np.ndarray, phi: np.ndarray, positive: np.ndarray) -> float:
    """``max |min(A, 1 - Phi)|`` (the multiplicative update's KKT violation) and, into
    ``positive``, where ``Phi > 0``: one pass, no temporaries of the factor's size (an
    Amazon-shaped mode's are 600 MB at rank 16).

    A, phi : float (I, R); positive : bool (I, R), written."""
    return (_mu_kkt_one if A.size <= SERIAL_MAX_ENTRIES else _mu_kkt_threads)(A, phi, positive)


def mu_kappa_fix(A: np.ndarray, positive: np.ndarray, kappa: float, kappa_tol: float) -> bool:
    """MU's complementary-slackness fix: ``A += kappa`` where ``positive`` (Phi > 0) and
    ``A < kappa_tol``; whether any entry moved. One pass, no temporaries (on one thread for small
    factors, as :func:`mu_kkt`).

    A : float (I, R), written; positive : bool (I, R)."""
    if A.size <= SERIAL_MAX_ENTRIES:
        return bool(_mu_kappa_fix_one(A, positive, float(kappa), float(kappa_tol)))
    V = positive & (A < kappa_tol)
    if not V.any():
        return False
    A[V] += kappa
    return True


@nb.njit(nogil=True, cache=True)
def _mu_kappa_fix_one(A, positive, kappa, kappa_tol):
    moved = False
    rows, R = A.shape
    for i in range(rows):
        for r in range(R):
            if positive[i, r] and A[i, r] < kappa_tol:
                A[i, r] += kappa
                moved = True
    return moved


def _mu_multiply(A, phi):
    rows, R = A.shape
    for i in nb.prange(rows):
        for r in range(R):
            A[i, r] = A[i, r] * phi[i, r]


def _mu_kkt(A, phi, positive):
    rows, R = A.shape
    worst = np.zeros(rows)
    for i in nb.prange(rows):
        w = 0.0
        for r in range(R):
            p = phi[i, r]
            positive[i, r] = p > 0
            v = abs(min(A[i, r], 1.0 - p))
            if v > w:
                w = v
        worst[i] = w
    return worst.max() if rows else 0.0


# each body compiled for threads and for one (small factors: no parallel region to wake)
_mu_multiply_threads = nb.njit(parallel=True, nogil=True, cache=True)(_mu_multiply)
_mu_multiply_one = nb.njit(nogil=True, cache=True)(_mu_multiply)
_mu_kkt_threads = nb.njit(parallel=True, nogil=True, cache=True)(_mu_kkt)
_mu_kkt_one = nb.njit(nogil=True, cache=True)(_mu_kkt)
