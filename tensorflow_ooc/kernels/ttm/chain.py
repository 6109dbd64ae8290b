"""Sparse tensor times matrix (TTM) and TTM chains with a kernel chosen by tensor features (seed 004).

Convention: ``U`` of ``I_n x R`` and ``Y = X x_n U`` means
``Y[..., r, ...] = sum_{i_n} X[..., i_n, ...] U[i_n, r]`` (Kolda's ``X x_n U^T``). The result is
a :class:`SemiSparse`: only the non-empty mode-``n`` fibers of ``X`` get a row.

Orchestration only: validation, layouts (sorted once per mode and kept, see
:class:`TTMLayouts`), kernel choice (:mod:`.select`) and streaming of stores; the kernels
are in :mod:`.cpu` and :mod:`.gpu`.

TTM chains
----------
``ttm_chain(X, U, skip)`` multiplies every mode but ``skip``; the result is dense in all those
modes and sparse only in ``skip``: one row of ``prod R_m`` per non-empty slice of ``skip``. The
first multiplication is a sparse TTM, by the mode ``m0`` whose removal leaves the fewest fibers
(estimated as the longest mode), on a layout whose fibers are grouped by their ``skip`` slice.
The remaining modes are applied by :func:`~.cpu.tree_accumulate`, one slice per work item
(a slice's fibers are contiguous, so no two work items write one row): it walks the slice's
fibers in sorted order as a CSF tree and folds each finished subtree into its parent as
``U_m[i_m] (x) subtree sum``, so a coordinate prefix shared by many fibers is multiplied once.
Memory stays semi-sparse: the first result (fibers x ``R_m0``), the output (slices x
``prod R_m``) and per thread one accumulator per tree level, never an intermediate of
fibers x ``R_m0 R_m1``. The work is at most ``2 nnz R_m0 + ~2 F prod R_m`` (every fiber its own
path, as in hypersparse tensors), and falls with every level's compression; the per-nonzero
Kronecker form would cost ``~2 nnz prod R_m``.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence, Union

import numba as nb
import numpy as np

from ...errors import NonFiniteValueError, ShapeError
from ...format import BLCOTensor
from ...store import Store
from ..mttkrp.dispatch import numba_threads
from .cpu import fiber_ttm, run_coo, spmm, tree_accumulate
from .layout import ModeLayout, SemiSparse, TTMLayouts, merge, merge_many
from .select import FALLBACK, KERNELS, select_kernel

DEVICES = ("cpu", "gpu")
# chain work items: pieces per thread, and the fewest fibers worth a piece of their own
CHAIN_PIECES_PER_THREAD = 4
CHAIN_MIN_PIECE = 256

TensorLike = Union[TTMLayouts, BLCOTensor, Store, tuple]


def as_layouts(tensor: TensorLike) -> TTMLayouts:
    """The :class:`TTMLayouts` of an in-memory tensor: itself, kept on a BLCO tensor, or new for
    a ``(coords, values, shape)`` tuple (validated)."""
    if isinstance(tensor, TTMLayouts):
        return tensor
    if isinstance(tensor, BLCOTensor):
        return tensor.derived("ttm_layouts", lambda: TTMLayouts(*tensor.to_coo(), tensor.shape))
    if isinstance(tensor, tuple) and len(tensor) == 3:
        return TTMLayouts(*tensor)
    raise TypeError(
        "tensor must be a Store, a BLCOTensor, a TTMLayouts or a (coords, values, shape) tuple, "
        f"got {type(tensor).__name__}"
    )


def check_matrix(matrix: np.ndarray, shape: Sequence[int], mode: int, name: str = "matrix") -> np.ndarray:
    """Validate ``matrix`` for mode ``mode`` of ``shape`` before the unchecked kernels see it."""
    N = len(shape)
    if not isinstance(mode, (int, np.integer)) or not 0 <= mode < N:
        raise ShapeError(f"mode {mode} is out of range for a {N}-mode tensor of shape {tuple(shape)}")
    U = np.asarray(matrix)
    if U.ndim != 2:
        raise ShapeError(f"{name} must be 2-D (I_{mode} x R), got shape {U.shape}")
    if U.shape[0] != shape[mode]:
        raise ShapeError(f"{name} has {U.shape[0]} rows but mode {mode} of the tensor has length {shape[mode]}")
    if U.shape[1] < 1:
        raise ShapeError(f"{name} has no columns")
    if U.dtype not in (np.float32, np.float64):
        U = U.astype(np.float64)
    if not np.isfinite(U).all():
        i, r = np.argwhere(~np.isfinite(U))[0]
        raise NonFiniteValueError(f"{name} entry ({i}, {r}) is {U[i, r]}: not finite")
    return np.ascontiguousarray(U)


def _check_kernel(kernel: str | None, device: str) -> None:
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None (the selector), got {kernel!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")


def _store_parts(store: Store) -> Iterable[TTMLayouts]:
    """A store's chunks as in-memory tensors (the store validated their indices on read)."""
    for chunk in store.iter_chunks():
        yield TTMLayouts(chunk.coords(store.layout), chunk.values, store.shape, validate=False)


def run_kernel(layout: ModeLayout, U: np.ndarray, kernel: str, device: str = "cpu") -> np.ndarray:
    """The (F, R) rows of ``layout``'s TTM by ``U`` with ``kernel``."""
    dtype = np.result_type(layout.vals.dtype, U.dtype)
    U = U if U.dtype == dtype else U.astype(dtype)
    if device == "cpu" and kernel == "csr" and layout.nfibers and layout.vals.dtype == dtype:
        return spmm(layout, U)  # the library's own result: no copy into a second buffer
    out = np.empty((layout.nfibers, U.shape[1]), dtype=dtype)
    if out.size == 0:
        return out
    vals = layout.vals if layout.vals.dtype == dtype else layout.vals.astype(dtype)
    if device == "gpu":
        from .gpu import run_gpu

        run_gpu(kernel, layout, U, out)
    elif kernel == "fiber":
        fiber_ttm(layout.fiber_ptr, layout.cols, vals, U, out)
    elif kernel == "coo":
        run_coo(layout.fiber_ptr, layout.cols, vals, U, out)
    else:
        out[...] = spmm(layout, U, vals)
    return out


def _layout_and_kernel(
    layouts: TTMLayouts, mode: int, order: Sequence[int] | None, R: int, kernel: str | None, device: str, stats: dict
) -> tuple[ModeLayout, str]:
    cached = layouts.cached(mode, order)
    lay = layouts.layout(mode, order)
    stats["layout_seconds"] += 0.0 if cached else lay.sort_seconds
    stats["layouts_built"] += 0 if cached else 1
    t0 = time.perf_counter()
    chosen = select_kernel(lay, R, device=device) if kernel is None else kernel
    if kernel is None and device == "gpu" and chosen == "csr":
        from .gpu import cupy_available

        if not cupy_available():  # the selector's pick needs CuPy: the fallback kernel instead
            chosen = FALLBACK
    stats["select_seconds"] += time.perf_counter() - t0
    stats["kernels"].add(chosen)
    return lay, chosen


def _new_stats() -> dict:
    return {
        "layout_seconds": 0.0,
        "layouts_built": 0,
        "select_seconds": 0.0,
        "kernel_seconds": 0.0,
        "chain_seconds": 0.0,
        "merge_seconds": 0.0,
        "kernels": set(),
        "nnz": 0,
        "fibers": 0,
        "parts": 0,
    }


def _finish_stats(stats: dict | None, acc: dict) -> None:
    if stats is not None:
        acc["kernel"] = ",".join(sorted(acc.pop("kernels"))) or None
        stats.update(acc)


def _ttm_one(layouts: TTMLayouts, U: np.ndarray, mode: int, kernel: str | None, device: str, acc: dict) -> SemiSparse:
    lay, chosen = _layout_and_kernel(layouts, mode, None, U.shape[1], kernel, device, acc)
    t0 = time.perf_counter()
    block = run_kernel(lay, U, chosen, device)
    acc["kernel_seconds"] += time.perf_counter() - t0
    acc["nnz"] += lay.nnz
    acc["fibers"] += lay.nfibers
    acc["parts"] += 1
    shape = tuple(U.shape[1] if m == mode else s for m, s in enumerate(layouts.shape))
    return SemiSparse(shape, (mode,), lay.fiber_index, block)


def ttm(
    tensor: TensorLike,
    matrix: np.ndarray,
    mode: int,
    *,
    kernel: str | None = None,
    device: str = "cpu",
    threads: int | None = None,
    stats: dict | None = None,
) -> SemiSparse:
    """Mode-``mode`` sparse TTM: ``Y[..., r, ...] = sum_i X[..., i, ...] matrix[i, r]``.

    Parameters
    ----------
    tensor : Store, BLCOTensor, TTMLayouts or (coords, values, shape)
        A store is streamed chunk by chunk (each chunk's result merged into the total); an
        in-memory tensor keeps its sorted layout for ``mode`` between calls (a tuple is
        wrapped anew each call: keep a :class:`TTMLayouts` to reuse the sort).
    matrix : (I_mode, R) float array
    mode : int
    kernel : {"coo", "csr", "fiber"}, optional
        Overrides the decision tree's choice (:mod:`tensorflow_ooc.kernels.ttm.select`).
    device : {"cpu", "gpu"}
        ``gpu`` runs the kernel with numba.cuda (``coo``, ``fiber``) or cuSPARSE through CuPy
        (``csr``); the result comes back to the host.
    threads : int, optional
        Numba threads for this call.
    stats : dict, optional
        Filled with ``layout_seconds`` (sorting, only when a layout was built by this call),
        ``layouts_built``, ``select_seconds``, ``kernel_seconds``, ``kernel`` (the kernels run),
        ``nnz``, ``fibers``, ``parts`` and ``merge_seconds`` (stores).

    Returns
    -------
    SemiSparse
        Dense in ``mode`` (length R), rows for the non-empty mode-``mode`` fibers. For an
        in-memory tensor ``index`` is the kept layout's fiber table itself (read-only).

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> X = (np.array([[0, 1, 2], [1, 1, 0]]), np.array([2.0, 3.0]), (2, 2, 3))
    >>> Y = tfo.ttm(X, np.ones((3, 4)), 2)
    >>> Y.index, Y.block[:, 0]
    (array([[0, 1],
           [1, 1]]), array([2., 3.]))
    """
    _check_kernel(kernel, device)
    if not isinstance(tensor, Store):
        tensor = as_layouts(tensor)
    shape = tensor.shape
    U = check_matrix(matrix, shape, mode)
    acc = _new_stats()
    with numba_threads(threads):
        if isinstance(tensor, Store):
            parts = [_ttm_one(p, U, mode, kernel, device, acc) for p in _store_parts(tensor)]
            t0 = time.perf_counter()
            result = merge_many(parts) if parts else _empty(shape, (mode,), {mode: U.shape[1]}, U.dtype)
            acc["merge_seconds"] += time.perf_counter() - t0
        else:
            result = _ttm_one(tensor, U, mode, kernel, device, acc)
    _finish_stats(stats, acc)
    return result


def _empty(shape: Sequence[int], dense: tuple[int, ...], ranks: dict[int, int], dtype) -> SemiSparse:
    out_shape = tuple(ranks.get(m, s) for m, s in enumerate(shape))
    width = int(np.prod([ranks[m] for m in dense]))
    return SemiSparse(
        out_shape, dense, np.zeros((0, len(shape) - len(dense)), dtype=np.int64), np.zeros((0, width), dtype=dtype)
    )


def chain_first_mode(shape: Sequence[int], skip: int) -> int:
    """The mode a chain multiplies first: the longest other than ``skip`` (the last such on ties),
    whose removal tends to merge the most nonzeros into one fiber."""
    others = [m for m in range(len(shape)) if m != skip]
    return max(others, key=lambda m: (shape[m], m))


def chain_order(shape: Sequence[int], skip: int) -> tuple[int, ...]:
    """The fiber order of the chain's layout: ``skip``, then the remaining modes shortest first
    (the levels of each slice's CSF tree; short modes on top share the most prefixes)."""
    first = chain_first_mode(shape, skip)
    rest = sorted((m for m in range(len(shape)) if m not in (skip, first)), key=lambda m: (shape[m], m))
    return (skip, *rest)


def split_slices(slice_ptr: np.ndarray, threads: int) -> np.ndarray:
    """Fiber boundaries of the chain's work items: the slices, the large ones cut into pieces of
    about ``F / (threads * CHAIN_PIECES_PER_THREAD)`` fibers, so a mode of few slices (two in a
    vast-shaped tensor) still keeps every thread busy. The tree walk is linear in its fibers, so
    a piece's partial sum is added to its slice's row afterwards."""
    F = int(slice_ptr[-1])
    piece = max(CHAIN_MIN_PIECE, -(-F // max(1, threads * CHAIN_PIECES_PER_THREAD)))
    if slice_ptr.shape[0] < 2 or int(np.diff(slice_ptr).max()) <= piece:
        return slice_ptr
    return np.union1d(slice_ptr, np.arange(0, F, piece, dtype=np.int64))


def _chain_one(
    layouts: TTMLayouts, mats: dict[int, np.ndarray], skip: int, kernel: str | None, device: str, acc: dict
) -> SemiSparse:
    shape = layouts.shape
    first = chain_first_mode(shape, skip)
    lay, chosen = _layout_and_kernel(
        layouts, first, chain_order(shape, skip), mats[first].shape[1], kernel, device, acc
    )
    t0 = time.perf_counter()
    rows = run_kernel(lay, mats[first], chosen, device)
    acc["kernel_seconds"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    dense = tuple(m for m in range(len(shape)) if m != skip)
    levels = list(lay.order[1:])  # the layout's sort order after ``skip``: the tree's levels
    other = lay.other_modes
    dtype = rows.dtype
    ranks = np.array([mats[m].shape[1] for m in levels], dtype=np.int64)
    flat = [mats[m].astype(dtype, copy=False).ravel() for m in levels]
    offsets = np.concatenate([[0], np.cumsum([f.shape[0] for f in flat])[:-1]]).astype(np.int64)[: len(levels)]
    cols = np.array([other.index(m) for m in levels], dtype=np.int64)
    slice_ptr = lay.slice_ptr()
    S = slice_ptr.shape[0] - 1
    R0 = mats[first].shape[1]
    work_ptr = split_slices(slice_ptr, nb.get_num_threads())
    # the tree sums in (levels..., first) order; the output's columns are in increasing mode order
    axes = levels + [first]
    column_of = (
        np.arange(int(np.prod(ranks)) * R0, dtype=np.int64)
        .reshape(tuple(ranks) + (R0,))
        .transpose([axes.index(m) for m in dense])
        .ravel()
    )
    out = np.empty((work_ptr.shape[0] - 1, column_of.shape[0]), dtype=dtype)
    if S:
        tree_accumulate(
            work_ptr,
            lay.fiber_index,
            rows,
            np.concatenate(flat) if flat else np.zeros(0, dtype),
            offsets,
            ranks,
            cols,
            column_of,
            out,
        )
        if work_ptr.shape[0] != slice_ptr.shape[0]:
            out = np.add.reduceat(out, np.searchsorted(work_ptr, slice_ptr[:-1]), axis=0)
    index = lay.fiber_index[slice_ptr[:-1], other.index(skip)].reshape(-1, 1)
    acc["chain_seconds"] += time.perf_counter() - t0
    acc["nnz"] += lay.nnz
    acc["fibers"] += lay.nfibers
    acc["parts"] += 1
    out_shape = tuple(shape[m] if m == skip else mats[m].shape[1] for m in range(len(shape)))
    return SemiSparse(out_shape, dense, index, out)


def ttm_chain(
    tensor: TensorLike,
    matrices: Sequence[np.ndarray | None],
    skip: int,
    *,
    kernel: str | None = None,
    device: str = "cpu",
    threads: int | None = None,
    stats: dict | None = None,
) -> SemiSparse:
    """``Y = X x_{m != skip} U_m``: every mode but ``skip`` multiplied, as in HOOI.

    Parameters
    ----------
    tensor : Store, BLCOTensor, TTMLayouts or (coords, values, shape)
        As for :func:`ttm`; an in-memory tensor keeps one layout per ``skip``.
    matrices : sequence of N (I_m x R_m) arrays
        ``matrices[skip]`` is not read (may be None).
    skip : int
        The mode left unmultiplied.
    kernel, device, threads, stats
        As for :func:`ttm`; ``kernel`` and ``device`` apply to the first (sparse) multiplication,
        ``stats`` also holds ``chain_seconds`` (the remaining modes).

    Returns
    -------
    SemiSparse
        ``index`` (S, 1): the non-empty slices ``i_skip``; ``block`` (S, prod_{m != skip} R_m),
        C order over the other modes in increasing order.

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> X = (np.array([[0, 1, 2], [1, 1, 0]]), np.array([2.0, 3.0]), (2, 2, 3))
    >>> Y = tfo.ttm_chain(X, [None, np.ones((2, 2)), np.ones((3, 2))], skip=0)
    >>> Y.index[:, 0], Y.block.shape
    (array([0, 1]), (2, 4))
    """
    _check_kernel(kernel, device)
    if not isinstance(tensor, Store):
        tensor = as_layouts(tensor)
    shape = tensor.shape
    N = len(shape)
    if not isinstance(skip, (int, np.integer)) or not 0 <= skip < N:
        raise ShapeError(f"skip {skip} is out of range for a {N}-mode tensor of shape {tuple(shape)}")
    if len(matrices) != N:
        raise ShapeError(f"expected {N} matrices (one per mode, matrices[{skip}] unused), got {len(matrices)}")
    mats = {m: check_matrix(matrices[m], shape, m, f"matrices[{m}]") for m in range(N) if m != skip}
    dtypes = {U.dtype for U in mats.values()}
    if len(dtypes) > 1:
        mats = {m: U.astype(np.float64) for m, U in mats.items()}
    acc = _new_stats()
    with numba_threads(threads):
        if isinstance(tensor, Store):
            parts = [_chain_one(p, mats, skip, kernel, device, acc) for p in _store_parts(tensor)]
            t0 = time.perf_counter()
            dense = tuple(m for m in range(N) if m != skip)
            result = (
                merge_many(parts)
                if parts
                else _empty(shape, dense, {m: U.shape[1] for m, U in mats.items()}, next(iter(mats.values())).dtype)
            )
            acc["merge_seconds"] += time.perf_counter() - t0
        else:
            result = _chain_one(tensor, mats, skip, kernel, device, acc)
    _finish_stats(stats, acc)
    return result


def ttm_chain_coo(
    coords: np.ndarray,
    values: np.ndarray,
    shape: Sequence[int],
    matrices: Sequence[np.ndarray | None],
    skip: int,
    **kwargs,
) -> SemiSparse:
    """:func:`ttm_chain` of plain COO arrays (e.g. one Dask partition's nonzeros); for repeated
    calls on the same nonzeros build a :class:`TTMLayouts` once and pass it instead."""
    return ttm_chain(TTMLayouts(coords, values, shape), matrices, skip, **kwargs)


def compile_ttm_kernels() -> float:
    """Compile (or load from the on-disk cache) the CPU TTM kernels; the seconds spent."""
    t0 = time.perf_counter()
    X = TTMLayouts(np.array([[0, 1, 2], [1, 0, 1]]), np.array([1.0, 2.0]), (2, 2, 3))
    for kernel in KERNELS:
        ttm(X, np.ones((3, 2)), 2, kernel=kernel)
    ttm_chain(X, [None, np.ones((2, 2)), np.ones((3, 2))], 0)
    return time.perf_counter() - t0


__all__ = [
    "KERNELS",
    "SemiSparse",
    "TTMLayouts",
    "as_layouts",
    "chain_first_mode",
    "chain_order",
    "check_matrix",
    "compile_ttm_kernels",
    "merge",
    "merge_many",
    "run_kernel",
    "ttm",
    "ttm_chain",
    "ttm_chain_coo",
]
