"""CP-APR's Phi on the GPU: the MTTKRP kernels' Poisson form against a dense NumPy reference and
the CPU kernels' fused form, and its hardware form compiled to PTX and assembled without spills.

Without a GPU the kernels run in numba's CUDA simulator (conftest sets NUMBA_ENABLE_CUDASIM=1):
tiny tensors, one warp per thread block."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.execution import DeviceOptions
from tensorflow_ooc.execution.partitions import plan_partitions
from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition
from tensorflow_ooc.kernels import StackedFactors
from tensorflow_ooc.kernels.gpu.device import cuda, gpu_unavailable
from tensorflow_ooc.kernels.ptx_report import find_ptxas

needs_gpu = pytest.mark.skipif(bool(gpu_unavailable()), reason=f"GPU kernels cannot run: {gpu_unavailable()}")
# one warp per block, two sub-tiles per warp (as tests/test_gpu_kernels.py)
SMALL = dict(warps=1, coarsen=2, decode_threads=32, copies=2)
LETTERS = "abcdef"


def dense_phi(shape, coords, values, factors, mode, eps):
    """``(X ./ max(M, eps))_(n)`` times the Khatri-Rao product of the other factors, densely: ``M``
    the model (all factors, unit weights), the quotient taken at the nonzeros only."""
    N = len(shape)
    idx = LETTERS[:N]
    M = np.einsum(",".join(f"{c}r" for c in idx) + "->" + idx, *factors)
    W = np.zeros(shape)
    at = tuple(coords.T)
    W[at] = values / np.maximum(M[at], eps)
    others = [m for m in range(N) if m != mode]
    spec = idx + "," + ",".join(f"{idx[m]}r" for m in others) + f"->{idx[mode]}r"
    return np.einsum(spec, W, *[factors[m] for m in others])


def counts(rng, shape, nnz):
    """``nnz`` distinct coordinates with count values 1..5."""
    cells = rng.permutation(int(np.prod(shape)))[:nnz]
    return np.stack(np.unravel_index(cells, shape), axis=1).astype(np.int64), rng.integers(1, 6, nnz).astype(np.float64)


@needs_gpu
@pytest.mark.parametrize(
    "shape,rank,dtype",
    [((5, 4, 6), 8, "float64"), ((3, 4, 2, 5), 3, "float32"), ((2, 3, 2, 2, 3, 2), 2, "float64")],
)
def test_phi_on_gpu_matches_dense_and_cpu_every_mode(tmp_path, rng, shape, rank, dtype):
    """``mttkrp_partition(..., device="gpu", poisson_eps=)`` on every mode, the conflict
    resolutions taking turns (each launch costs seconds in the simulator), on a resident
    partition and once streamed; one row of each factor is zero, so some model values fall under
    ``eps`` and the floor is taken. The CPU reference runs in float64 (its kernels compiled once
    for the float64 cases of tests/test_cp_apr.py)."""
    coords, values = counts(rng, shape, 60)
    store = tfo.convert((coords, values), str(tmp_path / "x.zarr"), shape=shape, chunk_nnz=32)
    part = plan_partitions(store, 1)[0]
    factors = [rng.random((s, rank)).astype(dtype) for s in shape]
    for f in factors:
        f[rng.integers(f.shape[0])] = 0
    stacked = StackedFactors.from_list(factors, np.dtype(dtype))
    exact = StackedFactors.from_list(factors, np.float64)
    eps = 1e-3
    cpu_data = load_partition(store.path, part)
    rtol = 1e-12 if dtype == "float64" else 1e-5
    opts = {c: DeviceOptions(**SMALL, conflict=c) for c in ("hierarchical", "register")}
    resident = load_partition(store.path, part, device="gpu", device_options=opts["register"])
    for mode in range(len(shape)):
        ref = dense_phi(shape, coords, values, exact.views, mode, eps)
        cpu = mttkrp_partition(cpu_data, exact, mode, poisson_eps=eps)
        rows = slice(cpu.lo, cpu.lo + cpu.rows.shape[0])
        np.testing.assert_allclose(cpu.rows, ref[rows], rtol=1e-12, atol=0)
        conflict = ("hierarchical", "register")[mode % 2]
        sources = [resident] + ([(store.path, part)] if mode == 1 else [])
        for source in sources:
            got = mttkrp_partition(source, stacked, mode, device="gpu", device_options=opts[conflict], poisson_eps=eps)
            assert got.rows.dtype == np.dtype(dtype) and got.lo == cpu.lo and got.rows.shape == cpu.rows.shape
            np.testing.assert_allclose(got.rows, ref[rows], rtol=rtol, atol=0, err_msg=f"{mode} {conflict}")
            np.testing.assert_allclose(got.rows, cpu.rows, rtol=rtol, atol=0, err_msg=f"{mode} {conflict}")


def test_kernel_config_keeps_the_plain_variant_apart():
    """A Poisson variant is its own compiled kernel (an ``eps`` argument, a float exchange scratch
    in the shared-memory form); the plain variant's configuration is as before."""
    from tensorflow_ooc.kernels.mttkrp.gpu import KernelConfig

    plain = KernelConfig.for_rank(3, 8, "hierarchical", "shared", "float64")
    phi = KernelConfig.for_rank(3, 8, "hierarchical", "shared", "float64", poisson=True)
    assert not plain.poisson and phi.poisson and plain != phi
    assert plain == KernelConfig(3, 1, "hierarchical", "shared", "float64", lanes=8)
    assert phi.phase_shared_bytes == plain.phase_shared_bytes + plain.threads * 8
    assert phi.shared_bytes <= 48 * 1024
    same = KernelConfig.for_rank(3, 8, "hierarchical", "intrinsics", "float64")
    assert (
        KernelConfig.for_rank(3, 8, "hierarchical", "intrinsics", "float64", poisson=True).stash_rows == same.stash_rows
    )


# the Poisson variants compiled for the hardware: (order, rank, conflict, exchange, dtype); the
# shared exchange is the simulator's form. The first one's plain twin is compiled beside it.
PTX_CONFIGS = [
    (3, 32, "register", "intrinsics", "float64"),
    (4, 8, "hierarchical", "intrinsics", "float32"),
    (3, 16, "hierarchical", "shared", "float64"),
]
PTX_SCRIPT = """
import json, re, sys
from numba import cuda
from tensorflow_ooc.kernels.mttkrp.gpu import KernelConfig, kernel_source, ptx_signature
from tensorflow_ooc.kernels.ptx_report import CCS, INTRINSICS, _ptxas, find_ptxas

rows = []
configs = json.loads(sys.argv[2])
for k, (n, rank, conflict, exchange, dtype) in enumerate(configs):
    for poisson in (True, False) if k == 0 else (True,):
        cfg = KernelConfig.for_rank(n, rank, conflict, exchange, dtype, poisson=poisson)
        ptx, _ = cuda.compile_ptx(kernel_source(cfg), ptx_signature(cfg), cc=min(CCS))  # as ptx_report
        for cc in CCS if poisson else CCS[:1]:
            row = dict(config=[n, rank, conflict, exchange, dtype], poisson=poisson, cc=f"{cc[0]}.{cc[1]}")
            row["intrinsics"] = sorted(k for k, pat in INTRINSICS.items() if re.search(pat, ptx))
            row["divides"] = bool(re.search(r"\\bdiv\\.(rn|full|approx)\\.f(32|64)", ptx))
            row.update(_ptxas(find_ptxas(), ptx, cc))
            rows.append(row)
open(sys.argv[1], "w").write(json.dumps(rows))
"""


@pytest.mark.skipif(cuda is None, reason="numba-cuda is not installed (pip install -e '.[gpu]')")
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (pip install nvidia-cuda-nvcc-cu12)")
def test_poisson_kernels_assemble_without_spills(tmp_path):
    """The Poisson form's hardware PTX assembles for cc 8.0 and 9.0 with no spills (the bound of
    tests/test_gpu_ptx.py), with the warp intrinsics and atomics of its exchange form and the
    divide by ``max(m, eps)``, which the plain kernel does not have. (Registers are printed: with
    -s they go beside the plain kernels' from ``python -m tensorflow_ooc.kernels.ptx_report``.)"""
    out = tmp_path / "ptx.json"
    # a separate process: this one may run the CUDA simulator, which cannot compile PTX
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    res = subprocess.run(
        [sys.executable, "-c", PTX_SCRIPT, str(out), json.dumps(PTX_CONFIGS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    rows = json.loads(out.read_text())
    poisson = [r for r in rows if r["poisson"]]
    assert len(poisson) == 2 * len(PTX_CONFIGS) and {r["cc"] for r in poisson} == {"8.0", "9.0"}
    for r in rows:
        print(r)
        assert "error" not in r, r
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
        assert 0 < r["registers"] <= 255, r
        assert r["smem_bytes"] <= 48 * 1024, r
        assert {"atom", "red"} & set(r["intrinsics"]), r
        if r["config"][3] == "intrinsics":
            assert {"shfl", "match"} <= set(r["intrinsics"]), r
        else:  # the shared-memory form (the simulator's) has no warp intrinsics
            assert not {"shfl", "match", "vote"} & set(r["intrinsics"]), r
        assert r["divides"] == r["poisson"], r


@needs_gpu
def test_cp_apr_mu_on_gpu_equals_cpu(tmp_path, rng):
    """CP-APR's multiplicative updates with Phi on the GPU (streamed): the CPU run's result."""
    shape = (5, 4, 6)
    coords, values = counts(rng, shape, 50)
    store = tfo.convert((coords, values), tmp_path / "apr.zarr", shape=shape, chunk_nnz=32)
    init = [rng.random((s, 3)) for s in shape]
    kw = dict(init=init, max_iters=2, max_inner_iters=2)
    cpu = tfo.cp_apr(store, 3, **kw)
    gpu = tfo.cp_apr(store, 3, device="gpu", device_options=DeviceOptions(**SMALL), **kw)
    assert gpu.params["device"] == "gpu"
    assert gpu.loglik == pytest.approx(cpu.loglik, rel=1e-10)
    for a, b in zip(gpu.factors, cpu.factors):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="pdnr"):
        tfo.cp_apr(store, 3, algorithm="pdnr", device="gpu")
