"""GPU sparse TTM kernels on a :class:`~tensorflow_ooc.kernels.ttm.layout.ModeLayout` (seed 004).

- ``fiber``: the seed's listing 2, one work item per non-empty fiber. A thread block holds
  ``rows`` fibers x ``lanes`` threads (``lanes`` = the next power of two >= R, at most 32); a
  fiber's lanes stride over the R columns, so each factor row read is coalesced, and each
  thread keeps its column's sum in a register and writes it once (no atomics).
- ``coo``: PASTA's COO kernel, one thread per (nonzero, column) in fiber order, atomic adds into
  the output row of the nonzero's fiber: balanced by nonzeros whatever the fiber lengths.
- ``csr``: the unfolding handed to ``cupyx.scipy.sparse`` (cuSPARSE SpMM), where CuPy is installed.

The layout's arrays are copied to the device once and kept in the layout's cache, like the sort
itself. Inputs are trusted (validated by :mod:`tensorflow_ooc.kernels.ttm.chain`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..gpu.device import cuda, require_gpu
from ..gpu.launch import lanes_for, zero_fill

FIBER_BLOCK_THREADS = 256
COO_BLOCK_THREADS = 256


def make_fiber_kernel(dtype: str):
    """The fiber kernel for ``dtype`` ("float64" or "float32": the register sum's type)."""
    DT = np.float32 if dtype == "float32" else np.float64

    def fiber_ttm_kernel(fiber_ptr, cols, vals, U, out):
        """out[f, r] = sum over fiber f's nonzeros k of vals[k] * U[cols[k], r].

        fiber_ptr: int64 (F + 1); cols: int64 (nnz); vals: float (nnz); U: float (I, R); out: float
        (F, R). Block (lanes, rows): threadIdx.y picks the block's fiber, threadIdx.x the column.
        """
        f = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        if f >= out.shape[0]:
            return
        R = U.shape[1]
        start = fiber_ptr[f]
        end = fiber_ptr[f + 1]
        for r in range(cuda.threadIdx.x, R, cuda.blockDim.x):
            acc = DT(0)
            for k in range(start, end):
                acc += vals[k] * U[cols[k], r]
            out[f, r] = acc

    return fiber_ttm_kernel


def coo_ttm_kernel(fiber_of, cols, vals, U, out):
    """out[fiber_of[k], r] += vals[k] * U[cols[k], r], one thread per (k, r), atomically.

    fiber_of: int64 (nnz) fiber of each sorted nonzero; out must be zero.
    """
    e = cuda.grid(1)
    R = U.shape[1]
    k = e // R
    if k >= vals.shape[0]:
        return
    r = e - k * R
    cuda.atomic.add(out, (fiber_of[k], r), vals[k] * U[cols[k], r])


_JITTED: dict[str, Any] = {}


def _kernel(name: str, dtype: str):
    key = f"{name} {dtype}"
    if key not in _JITTED:
        _JITTED[key] = cuda.jit(make_fiber_kernel(dtype) if name == "fiber" else coo_ttm_kernel)
    return _JITTED[key]


def ptx_variants() -> list[tuple[str, object, object]]:
    """(name, function, signature) of the TTM kernels for :mod:`tensorflow_ooc.kernels.ptx_report`."""
    from numba import float32, float64, int64, types

    a1 = lambda t: types.Array(t, 1, "C")  # noqa: E731
    a2 = lambda t: types.Array(t, 2, "C")  # noqa: E731
    out = []
    for ft in (float64, float32):
        sig = types.void(a1(int64), a1(int64), a1(ft), a2(ft), a2(ft))
        out.append((f"ttm fiber {ft}", make_fiber_kernel(str(ft)), sig))
        out.append((f"ttm coo {ft}", coo_ttm_kernel, sig))
    return out


def _device_layout(layout) -> dict:
    dev = layout.cache.get("device")
    if dev is None:
        fiber_of = np.repeat(np.arange(layout.nfibers, dtype=np.int64), np.diff(layout.fiber_ptr))
        dev = layout.cache["device"] = {
            "fiber_ptr": cuda.to_device(layout.fiber_ptr),
            "cols": cuda.to_device(layout.cols),
            "vals": cuda.to_device(layout.vals),
            "fiber_of": cuda.to_device(fiber_of),
        }
    return dev


def cupy_available() -> bool:
    try:
        import cupy  # noqa: F401
        import cupyx.scipy.sparse  # noqa: F401
    except Exception:
        return False
    return True


def run_gpu(kernel: str, layout, U: np.ndarray, out: np.ndarray) -> None:
    """Mode-``layout.mode`` TTM with ``kernel`` on the GPU (or the simulator); result into ``out``."""
    require_gpu()
    if kernel == "csr":
        if not cupy_available():
            raise RuntimeError("the GPU csr TTM kernel needs CuPy (pip install -e '.[gpu]')")
        import cupy as cp
        import cupyx.scipy.sparse as csp

        mat = layout.cache.get("cupy_csr")
        if mat is None:
            mat = layout.cache["cupy_csr"] = csp.csr_matrix(
                (cp.asarray(layout.vals), cp.asarray(layout.cols), cp.asarray(layout.fiber_ptr)),
                shape=(layout.nfibers, layout.shape[layout.mode]),
            )
        out[...] = cp.asnumpy(mat @ cp.asarray(U))
        return
    F, R = out.shape
    if F == 0 or R == 0:
        return
    dev = _device_layout(layout)
    d_U = cuda.to_device(np.ascontiguousarray(U, dtype=out.dtype))
    d_out = cuda.device_array(out.shape, dtype=out.dtype)
    if kernel == "fiber":
        lanes = lanes_for(R)
        rows = FIBER_BLOCK_THREADS // lanes
        _kernel("fiber", str(out.dtype))[(F + rows - 1) // rows, (lanes, rows)](
            dev["fiber_ptr"], dev["cols"], dev["vals"], d_U, d_out
        )
    elif kernel == "coo":
        zero_fill(d_out)
        n = layout.nnz * R
        _kernel("coo", str(out.dtype))[(n + COO_BLOCK_THREADS - 1) // COO_BLOCK_THREADS, COO_BLOCK_THREADS](
            dev["fiber_of"], dev["cols"], dev["vals"], d_U, d_out
        )
    else:
        raise ValueError(f"unknown GPU TTM kernel {kernel!r}")
    d_out.copy_to_host(out)
