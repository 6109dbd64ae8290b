"""CPU sparse TTM kernels on a :class:`~tensorflow_ooc.kernels.ttm.layout.ModeLayout` (seed 004).

Three families, as in the seed:

- ``coo``: the nonzeros in fiber order split into equal-nonzero parts, one per work item; a part
  sums its fibers' rows and writes the fibers it holds whole, the (at most two) fibers it shares
  with its neighbours go to carry slots added afterwards. Balanced by nonzeros whatever the fiber
  lengths (PASTA's COO kernel without atomics; the fallback).
- ``csr``: the layout *is* the CSR unfolding (fibers x product-mode index): ``scipy.sparse`` SpMM.
- ``fiber``: one work item per non-empty fiber, its row summed in place. Balanced by fibers: the
  best when fibers are many and alike, the worst when a few fibers hold most nonzeros.

:func:`tree_accumulate` applies the rest of a TTM chain (see :mod:`tensorflow_ooc.kernels.ttm.chain`).
Inputs are trusted: the orchestration validates shapes and indices before these run.
"""

from __future__ import annotations

import numba as nb
import numpy as np

# nonzeros per COO part at the least, and parts per thread (several, so a slow part evens out)
COO_MIN_PART = 4096
COO_PARTS_PER_THREAD = 8


@nb.njit(parallel=True, cache=True)
def fiber_ttm(fiber_ptr, cols, vals, U, out):
    """``out[f] = sum_k vals[k] * U[cols[k]]`` over fiber ``f``'s nonzeros, one fiber per iteration.

    fiber_ptr: int64 (F + 1); cols: int64 (nnz) rows of U; vals: (nnz); U: (I, R); out: (F, R).
    """
    F = fiber_ptr.shape[0] - 1
    R = U.shape[1]
    for f in nb.prange(F):
        row = out[f]
        for r in range(R):
            row[r] = 0.0
        for k in range(fiber_ptr[f], fiber_ptr[f + 1]):
            v = vals[k]
            u = U[cols[k]]
            for r in range(R):
                row[r] += v * u[r]


@nb.njit(parallel=True, cache=True)
def coo_segment_ttm(fiber_ptr, cols, vals, U, parts, out, carry_fiber, carry_val):
    """Segmented sum over equal-nonzero parts ``parts[p]:parts[p + 1]`` (int64, P + 1).

    ``out`` (F, R) must be zero. carry_fiber: int64 (P, 2), carry_val: (P, 2, R) scratch.
    """
    P = parts.shape[0] - 1
    R = U.shape[1]
    for p in nb.prange(P):
        a = parts[p]
        b = parts[p + 1]
        carry_fiber[p, 0] = -1
        carry_fiber[p, 1] = -1
        if a >= b:
            continue
        acc = np.empty(R, dtype=out.dtype)
        f = np.searchsorted(fiber_ptr, a, side="right") - 1
        k = a
        while k < b:
            end = min(fiber_ptr[f + 1], b)
            for r in range(R):
                acc[r] = 0.0
            for j in range(k, end):
                v = vals[j]
                u = U[cols[j]]
                for r in range(R):
                    acc[r] += v * u[r]
            if fiber_ptr[f] < a:
                slot = 0
            elif fiber_ptr[f + 1] > b:
                slot = 1
            else:
                slot = -1
            if slot < 0:
                for r in range(R):
                    out[f, r] = acc[r]
            else:
                carry_fiber[p, slot] = f
                for r in range(R):
                    carry_val[p, slot, r] = acc[r]
            k = end
            f += 1
    for p in range(P):
        for s in range(2):
            f = carry_fiber[p, s]
            if f >= 0:
                for r in range(R):
                    out[f, r] += carry_val[p, s, r]


def coo_parts(nnz: int, threads: int) -> np.ndarray:
    """Equal-nonzero part boundaries for :func:`coo_segment_ttm`."""
    nparts = max(1, min(threads * COO_PARTS_PER_THREAD, -(-nnz // COO_MIN_PART)))
    return np.linspace(0, nnz, nparts + 1).round().astype(np.int64)


def run_coo(fiber_ptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, U: np.ndarray, out: np.ndarray) -> None:
    parts = coo_parts(vals.shape[0], nb.get_num_threads())
    P, R = parts.shape[0] - 1, U.shape[1]
    out[...] = 0
    coo_segment_ttm(
        fiber_ptr, cols, vals, U, parts, out, np.empty((P, 2), dtype=np.int64), np.empty((P, 2, R), dtype=out.dtype)
    )


def spmm(layout, U: np.ndarray, vals: np.ndarray | None = None) -> np.ndarray:
    """The unfolding (``scipy.sparse`` CSR, built once per layout) times ``U``; ``vals`` replaces
    the layout's values (another dtype) for this call."""
    if vals is None or vals is layout.vals:
        mat = layout.csr()
    else:
        import scipy.sparse as sp

        mat = sp.csr_matrix((vals, layout.cols, layout.fiber_ptr), shape=(layout.nfibers, layout.shape[layout.mode]))
    return np.ascontiguousarray(mat @ U)


@nb.njit(inline="always")
def _fold(acc, lo, size_next, u, R, child):
    """acc[lo + a * size_next + b] += u[a] * acc[child + b]: a finished subtree into its parent."""
    for a in range(R):
        ua = u[a]
        base = lo + a * size_next
        for b in range(size_next):
            acc[base + b] += ua * acc[child + b]


@nb.njit(parallel=True, cache=True)
def tree_accumulate(slice_ptr, fiber_index, rows, factors, offsets, ranks, cols, column_of, out):
    """The rest of a TTM chain over the fibers of a first TTM, one slice (or piece of one) per
    work item.

    A slice's fibers are sorted by the coordinates of levels ``0 .. K-1`` (the modes
    ``fiber_index[:, cols[j]]``, each with factor rows ``factors[offsets[j] + i * ranks[j] ...]``).
    Walking them in order is a depth-first walk of the slice's CSF tree: ``acc_j`` sums the
    finished subtrees below the current level-``j`` prefix, and when level ``j``'s coordinate
    changes its subtree is folded into the parent as ``U_j[c_j] (x) acc_{j+1}``. Each tree node is
    folded once, so shared prefixes are multiplied once, not once per fiber (hypersparse slices,
    where every fiber is its own path, cost the same as a per-fiber Kronecker product).

    slice_ptr: int64 (S + 1) fiber ranges of the work items; fiber_index: int64 (F, N - 1);
    rows: (F, R0) first-TTM rows;
    factors: flat; offsets, ranks, cols: int64 (K,); column_of: int64 (prod ranks * R0,), the
    accumulator position (C order over level 0, ..., level K-1, the first TTM's column) of each
    output column, so the output is written in the caller's column order at no extra pass;
    out: (S, prod ranks * R0).
    """
    S = slice_ptr.shape[0] - 1
    K = ranks.shape[0]
    R0 = rows.shape[1]
    size = np.empty(K + 1, dtype=np.int64)
    lo = np.empty(K + 1, dtype=np.int64)
    size[K] = R0
    for j in range(K - 1, -1, -1):
        size[j] = ranks[j] * size[j + 1]
    total = 0
    for j in range(K + 1):
        lo[j] = total
        total += size[j]
    for s in nb.prange(S):
        acc = np.zeros(total, dtype=out.dtype)
        f0 = slice_ptr[s]
        f1 = slice_ptr[s + 1]
        for f in range(f0, f1):
            if f > f0:
                d = 0
                while d < K - 1 and fiber_index[f, cols[d]] == fiber_index[f - 1, cols[d]]:
                    d += 1
                for j in range(K - 1, d - 1, -1):
                    u = factors[offsets[j] + fiber_index[f - 1, cols[j]] * ranks[j] :]
                    _fold(acc, lo[j], size[j + 1], u, ranks[j], lo[j + 1])
                    if j + 1 < K:
                        for b in range(size[j + 1]):
                            acc[lo[j + 1] + b] = 0.0
            for r in range(R0):
                acc[lo[K] + r] = rows[f, r]
        for j in range(K - 1, -1, -1):
            u = factors[offsets[j] + fiber_index[f1 - 1, cols[j]] * ranks[j] :]
            _fold(acc, lo[j], size[j + 1], u, ranks[j], lo[j + 1])
        for q in range(size[0]):
            out[s, q] = acc[column_of[q]]
