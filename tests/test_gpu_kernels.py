"""GPU MTTKRP kernels against the CPU kernel and dense einsum.

Without a GPU these run in numba's CUDA simulator (conftest sets NUMBA_ENABLE_CUDASIM=1), which
runs one Python thread per CUDA thread: inputs are tiny and thread blocks are one warp.
"""

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.kernels.gpu.device import cuda, gpu_unavailable

pytestmark = pytest.mark.skipif(bool(gpu_unavailable()), reason=f"GPU kernels cannot run: {gpu_unavailable()}")

# one warp per block, two sub-tiles per warp: the smallest blocks that still coarsen
SMALL = dict(warps=1, coarsen=2, decode_threads=32, copies=3)


def opts(**kw):
    from tensorflow_ooc.execution import DeviceOptions

    return DeviceOptions(**{**SMALL, **kw})


def mttkrp_gpu(*args, **kw):
    from tensorflow_ooc.execution import mttkrp_gpu as run

    return run(*args, **kw)


# orders 3-5 x ranks 1, 8, 16, 33, each with one dtype (pairwise cover of float32/float64)
CASES = [
    (3, 1, "float64"),
    (3, 8, "float32"),
    (3, 16, "float64"),
    (3, 33, "float32"),
    (4, 1, "float32"),
    (4, 8, "float64"),
    (4, 16, "float32"),
    (4, 33, "float64"),
    (5, 1, "float64"),
    (5, 8, "float32"),
    (5, 16, "float64"),
    (5, 33, "float32"),
]


@pytest.mark.parametrize("nmodes,rank,dtype", CASES)
def test_both_conflict_modes_match_cpu_for_every_mode(rng, nmodes, rank, dtype):
    # one mode longer than the hierarchical stash (rows past it go to the block's global copy)
    shape = tuple(int(s) for s in rng.integers(2, 6, nmodes - 1)) + (300,)
    coords, values = random_coo(rng, shape, 50)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=30)
    factors = [rng.standard_normal((s, rank)).astype(dtype) for s in shape]
    tol = 1e-12 if dtype == "float64" else 2e-5
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, [f.astype(np.float64) for f in factors], mode)
        cpu = tfo.mttkrp(t, factors, mode)
        for conflict in ("hierarchical", "register"):
            stats = {}
            got = mttkrp_gpu(t, factors, mode, opts(conflict=conflict), stats)
            assert got.dtype == np.dtype(dtype) and got.shape == (shape[mode], rank)
            assert stats["conflict"] == conflict
            assert rel_err(got.astype(np.float64), ref) < tol, (mode, conflict)
            assert rel_err(got.astype(np.float64), cpu.astype(np.float64)) < tol, (mode, conflict)


def test_heuristic_short_and_long_target_modes(rng, monkeypatch):
    monkeypatch.setenv("TFOOC_SIM_SM_COUNT", "16")
    shape = (5, 40, 9)
    coords, values = random_coo(rng, shape, 60)
    t = tfo.encode_coo(coords, values, shape)
    factors = [rng.standard_normal((s, 4)) for s in shape]
    chosen = {}
    for mode in range(3):
        stats = {}
        got = mttkrp_gpu(t, factors, mode, opts(), stats)
        chosen[mode] = stats["conflict"]
        assert rel_err(got, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12
    # fewer rows than SMs -> hierarchical, else register-based (seed 001 section 5.3)
    assert chosen == {0: "hierarchical", 1: "register", 2: "hierarchical"}
    stats = {}
    mttkrp_gpu(t, factors, 1, opts(hierarchical_rows=100), stats)
    assert stats["conflict"] == "hierarchical"


def test_blocks_beyond_64_bits_in_memory_and_streamed(rng, tmp_path):
    shape = (1 << 22, 1 << 21, 1 << 22)  # 65 index bits: block keys
    assert tfo.BitLayout(shape).key_bits_total > 0
    coords, values = random_coo(rng, shape, 50)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=16)
    assert t.blocks.nblocks > 2
    store = tfo.convert((coords, values), tmp_path / "wide.zarr", shape=shape, chunk_nnz=32, max_block_nnz=16)
    factors = [rng.standard_normal((s, 2)) for s in shape]
    for mode in range(3):
        cpu = tfo.mttkrp(t, factors, mode)
        got = mttkrp_gpu(t, factors, mode, opts(conflict="register"))
        assert rel_err(got, cpu) < 1e-12
        streamed = mttkrp_gpu(store, factors, mode, opts(conflict="register"))
        assert rel_err(streamed, cpu) < 1e-12


def test_single_nonzero_and_empty_items(rng):
    from tensorflow_ooc.kernels import tensor_items
    from tensorflow_ooc.kernels.mttkrp.gpu_plan import device_tiles

    shape = (4, 5, 6)
    t = tfo.encode_coo(np.array([[3, 1, 5]]), np.array([2.5]), shape)
    factors = [rng.standard_normal((s, 3)) for s in shape]
    for mode in range(3):
        for conflict in ("hierarchical", "register"):
            got = mttkrp_gpu(t, factors, mode, opts(conflict=conflict))
            ref = np.zeros((shape[mode], 3))
            ref[[3, 1, 5][mode]] = 2.5 * np.prod([factors[m][[3, 1, 5][m]] for m in range(3) if m != mode], axis=0)
            assert rel_err(got, ref) < 1e-14
    # an empty work item gets no tile; the others keep theirs
    items = tensor_items(tfo.encode_coo(*random_coo(rng, shape, 50), shape))
    items.end[0] = items.start[0]
    tiles = device_tiles(items, 16)
    assert tiles.ntiles == sum(-(-int(n) // 16) for n in items.nnz)
    assert (tiles.item != 0).all() and (tiles.end > tiles.start).all()


def test_shared_exchange_helpers_match_their_definition(rng):
    """The simulator runs the shared-memory forms; their results are what the intrinsics return."""
    from tensorflow_ooc.kernels.gpu.warp_exchange import warp_exchange

    ex = warp_exchange("shared")
    match_any, shfl_idx, scan = ex.match_any, ex.shfl_idx, ex.inclusive_scan

    @cuda.jit
    def probe(keys, masks, scans, shuffled):
        lane = cuda.threadIdx.x
        scratch = cuda.shared.array(32, dtype=np.int64)
        masks[lane] = match_any(keys[lane], lane, scratch)
        scans[lane] = scan(keys[lane], lane, scratch)
        shuffled[lane] = shfl_idx(keys[lane], (lane * 7) % 32, lane, scratch)

    keys = rng.integers(0, 5, 32)
    masks, scans, shuffled = (np.zeros(32, np.int64) for _ in range(3))
    probe[1, 32](keys, masks, scans, shuffled)
    expect = [sum(1 << j for j in range(32) if keys[j] == keys[i]) for i in range(32)]
    assert masks.tolist() == expect
    assert scans.tolist() == np.cumsum(keys).tolist()
    assert shuffled.tolist() == [int(keys[(i * 7) % 32]) for i in range(32)]
