"""Dense matrix-free MTTKRP (seed 002): ELEM, SLICE and TILE on CPU (numba) and GPU (numba.cuda
in the simulator) against np.einsum on fresh random inputs; the tile-width heuristic (Eq. 6) and
the performance model (Table III from Table II)."""

import logging

import numpy as np
import pytest

from tensorflow_ooc.errors import DenseArrayError, ShapeError, TfoocError
from tensorflow_ooc.kernels.dense.cpu import dense_mttkrp
from tensorflow_ooc.kernels.dense.tile import cpu_middle_cache, dense_tile_width, eq6_width

LETTERS = "abcdef"
CPU_VARIANTS = [("elem", None), ("slice", None), ("tile", None), ("tile", 1), ("tile", 2), ("tile", 3)]


class Exact(np.ndarray):
    """An einsum result that remembers the size of the terms it summed.

    Random signs make some outputs cancel to far below their terms, so a
    correct float64 sum can be off by more than 1e-12 of the output itself.
    Errors are measured against ``scale``, the largest sum of |terms|, which
    bounds the rounding error of any summation order.
    """

    scale = 0.0

    def __array_finalize__(self, obj):
        self.scale = getattr(obj, "scale", 0.0)


def reference(X, factors, mode):
    """Mode-``mode`` MTTKRP by np.einsum, in float64, with the scale of its terms."""
    d = X.ndim
    spec = LETTERS[:d] + "," + ",".join(LETTERS[m] + "z" for m in range(d) if m != mode) + "->" + LETTERS[mode] + "z"
    others = [np.asarray(factors[m], np.float64) for m in range(d) if m != mode]
    want = np.einsum(spec, np.asarray(X, np.float64), *others).view(Exact)
    want.scale = float(np.einsum(spec, np.abs(np.asarray(X, np.float64)), *map(np.abs, others)).max(initial=0.0))
    return want


def relerr(got, want):
    scale = max(float(np.abs(want).max(initial=0.0)), getattr(want, "scale", 0.0), 1e-300)
    return float(np.abs(np.asarray(got) - np.asarray(want)).max(initial=0.0) / scale)


def inputs(rng, shape, rank, dtype=np.float64, order="C"):
    X = np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)
    A = [np.ascontiguousarray(rng.standard_normal((s, rank)), dtype=dtype) for s in shape]
    return X, A


@pytest.mark.parametrize(
    "shape,rank", [((5, 4, 6), 7), ((4, 3, 5, 6), 33), ((3, 4, 2, 3, 5), 1), ((2, 3, 2, 2, 3, 2), 9)]
)
@pytest.mark.parametrize("order", ["C", "F"])
def test_every_variant_and_mode_matches_einsum(rng, shape, rank, order):
    X, A = inputs(rng, shape, rank, order=order)
    for mode in range(len(shape)):
        want = reference(X, A, mode)
        for variant, tile in CPU_VARIANTS:
            got = dense_mttkrp(X, A, mode, variant=variant, tile=tile)
            assert got.shape == (shape[mode], rank) and got.dtype == np.float64
            assert relerr(got, want) < 1e-12, (mode, variant, tile)


@pytest.mark.parametrize("shape,tile", [((7, 5, 9), 4), ((11, 3, 7, 5), 2), ((9, 10, 7), 6), ((5, 6, 7), 50)])
def test_widths_that_do_not_divide_the_modes(rng, shape, tile):
    X, A = inputs(rng, shape, 70)  # two 32-column chunks and an 8-column one
    for mode in range(len(shape)):
        assert relerr(dense_mttkrp(X, A, mode, tile=tile), reference(X, A, mode)) < 1e-12, mode


@pytest.mark.parametrize("shape", [(1, 5, 4), (5, 1, 1, 4), (3, 4, 1), (1, 1, 1)])
def test_one_element_modes(rng, shape):
    X, A = inputs(rng, shape, 7)
    for mode in range(len(shape)):
        want = reference(X, A, mode)
        for variant, tile in CPU_VARIANTS:
            assert relerr(dense_mttkrp(X, A, mode, variant=variant, tile=tile), want) < 1e-12, (mode, variant, tile)


def test_float32_blocks(rng):
    X, A = inputs(rng, (6, 5, 4, 7), 33, dtype=np.float32, order="F")
    for mode in range(4):
        want = reference(X, A, mode)
        for variant, tile in CPU_VARIANTS:
            got = dense_mttkrp(X, A, mode, variant=variant, tile=tile)
            assert got.dtype == np.float32
            assert relerr(got, want) < 1e-5, (mode, variant, tile)


def test_other_layouts_give_the_same_result(rng):
    X, A = inputs(rng, (4, 5, 6, 3), 5)
    want = [reference(X, A, m) for m in range(4)]
    # a contiguous permutation (no copy) and a strided view (copied first)
    P = np.ascontiguousarray(X.transpose(2, 0, 3, 1)).transpose(1, 3, 0, 2)
    big = np.zeros((8, 5, 6, 3))
    big[::2] = X
    for Y in (P, big[::2]):
        assert np.array_equal(Y, X)
        for m in range(4):
            assert relerr(dense_mttkrp(Y, A, m), want[m]) < 1e-12


@pytest.mark.parametrize("variant,tile", [("tile", None), ("tile", 2), ("slice", None), ("elem", None)])
def test_chunks_with_origin_accumulate_to_the_whole(rng, variant, tile):
    shape = (7, 6, 5, 4)
    X, A = inputs(rng, shape, 6)
    cuts = [(0, 3, 7), (0, 4, 6), (0, 2, 5), (0, 4)]
    for mode in range(4):
        G = np.zeros((shape[mode], 6))
        for i0, i1 in zip(cuts[0][:-1], cuts[0][1:]):
            for j0, j1 in zip(cuts[1][:-1], cuts[1][1:]):
                for k0, k1 in zip(cuts[2][:-1], cuts[2][1:]):
                    lo = (i0, j0, k0, 0)
                    hi = (i1, j1, k1, 4)
                    chunk = np.array(X[i0:i1, j0:j1, k0:k1], order="F" if (i0 + j0) % 2 else "C")
                    view = G[lo[mode] : hi[mode]]
                    back = dense_mttkrp(chunk, A, mode, origin=lo, out=view, variant=variant, tile=tile)
                    assert back is view
        assert relerr(G, reference(X, A, mode)) < 1e-12, mode


def test_out_that_is_not_contiguous_is_added_to(rng):
    X, A = inputs(rng, (4, 5, 6), 3)
    base = rng.standard_normal((5, 6))
    out = base.copy()[:, ::2]
    got = dense_mttkrp(X, A, 1, out=out)
    assert got is out
    assert relerr(out, base[:, ::2] + reference(X, A, 1)) < 1e-12


def test_bad_inputs_raise_clear_errors(rng):
    X, A = inputs(rng, (3, 4, 5), 2)
    cases = [
        (lambda: dense_mttkrp(np.zeros((3, 4)), A[:2], 0), DenseArrayError, "order 2"),
        (lambda: dense_mttkrp(np.zeros((2,) * 7), [np.zeros((2, 2))] * 7, 0), DenseArrayError, "order 7"),
        (lambda: dense_mttkrp(X.astype(np.int64), A, 0), DenseArrayError, "int64"),
        (lambda: dense_mttkrp(X, [a.astype(np.float32) for a in A], 0), DenseArrayError, "factor matrix 0"),
        (lambda: dense_mttkrp(X, A, 3), DenseArrayError, "mode"),
        (lambda: dense_mttkrp(X, A, 0, variant="gemm"), DenseArrayError, "variant"),
        (lambda: dense_mttkrp(X, A, 0, variant="slice", tile=3), DenseArrayError, "tile"),
        (lambda: dense_mttkrp(X, A, 0, tile=0), DenseArrayError, "tile width"),
        (lambda: dense_mttkrp(X, A[:2], 0), ShapeError, "3 factor matrices"),
        (lambda: dense_mttkrp(X, A, 0, origin=(0, 1, 0)), ShapeError, "factor matrix 1 has 4 rows"),
        (lambda: dense_mttkrp(X, A, 0, origin=(0, -1, 0)), ShapeError, "negative"),
        (lambda: dense_mttkrp(X, [A[0], A[1][:, :1], A[2]], 0), ShapeError, "columns"),
        (lambda: dense_mttkrp(X, [a[:, :0] for a in A], 0), ShapeError, "rank"),
        (lambda: dense_mttkrp(X, A, 0, out=np.zeros((4, 2))), ShapeError, "out must have shape"),
        (lambda: dense_mttkrp(X, A, 0, out=np.zeros((3, 2), np.float32)), DenseArrayError, "out has dtype"),
        (lambda: dense_mttkrp(X, [A[0], np.full_like(A[1], np.nan), A[2]], 0), DenseArrayError, "NaN"),
    ]
    for call, exc, words in cases:
        with pytest.raises(exc, match=words) as info:
            call()
        assert isinstance(info.value, TfoocError)


def test_tile_width_follows_eq6_and_is_logged(caplog):
    # the seed's 8480+: 2 MiB L2 per core, one tile per core; width 50 for order 4, capped at 12
    assert eq6_width(4, 8, 2 << 20, 1) == 50
    assert dense_tile_width((401, 201, 12, 501), 32, 8, cache_bytes=2 << 20, tiles_per_cache=1) == 12
    # the seed's H100: 256 KiB L1 per SM, 32 resident tiles: (65536 / 128) = 512 -> 8 (order 4), 4 (order 5)
    assert eq6_width(4, 8, 256 << 10, 32) == 8
    assert eq6_width(5, 8, 256 << 10, 32) == 4
    # modes of length one do not cap the width; the shortest longer mode does
    assert dense_tile_width((1, 300, 7, 300), 10, 8, cache_bytes=2 << 20, tiles_per_cache=1) == 7
    from tensorflow_ooc.kernels.dense import tile as dense_tile

    dense_tile._width.cache_clear()  # logged once per distinct call
    with caplog.at_level(logging.INFO, logger="tensorflow_ooc.kernels.dense.tile"):
        w = dense_tile_width((64, 64, 64), 16, 4)
        dense_tile_width((64, 64, 64), 16, 4)
    assert sum(f"dense TILE width {w}" in r.getMessage() for r in caplog.records) == 1
    # a GPU's middle level from its device attributes: an H100 (cc 9.0, 228 KiB shared memory per SM)
    from types import SimpleNamespace

    from tensorflow_ooc.kernels.dense.tile import gpu_middle_cache

    h100 = SimpleNamespace(
        MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=228 << 10, compute_capability=(9, 0), MAX_THREADS_PER_MULTIPROCESSOR=2048
    )
    assert gpu_middle_cache(h100) == (256 << 10, 32)
    assert dense_tile_width(SEED_B, 32, 8, *gpu_middle_cache(h100)) == 4
    size, sharing = cpu_middle_cache()
    assert size >= 64 << 10 and sharing >= 1
    assert 1 <= w <= 64


# --- performance model (seed 002, section IV-B) --------------------------------------------------

SEED_A = (401, 201, 12, 501)
SEED_B = (129, 129, 129, 12, 39)
# Table II: 10^12 tau_f, 1024^4 tau_m, l
TABLE_II = {"8480+": (2.28, 0.12, 8), "H100": (34.0, 3.35, 10)}
# Table III (R = 32, float64): T_0, T_0,LM, T_inf per tensor, device and variant
TABLE_III = {
    ("A", "8480+"): {"elem": (3.817, 1.349, 0.056), "slice": (2.877, 0.409, 0.056), "tile": (2.955, 0.487, 0.056)},
    ("B", "8480+"): {"elem": (9.876, 3.054, 0.130), "slice": (7.927, 1.105, 0.130), "tile": (8.414, 1.592, 0.130)},
    ("A", "H100"): {"elem": (0.138, 0.047, 0.003), "slice": (0.104, 0.013, 0.003), "tile": (0.110, 0.019, 0.003)},
    ("B", "H100"): {"elem": (0.356, 0.105, 0.007), "slice": (0.286, 0.035, 0.007), "tile": (0.304, 0.052, 0.007)},
}
# tile widths of Table III's TILE rows (Table IV's optimum on the GPU, the shortest mode / Eq. 6
# on the CPU); the table counts N / w tile sums (see kernels/dense/model.py)
TABLE_III_WIDTH = {("A", "8480+"): 12, ("B", "8480+"): 4, ("A", "H100"): 6, ("B", "H100"): 4}


def test_model_reproduces_table_iii_from_table_ii():
    from tensorflow_ooc.kernels.dense.model import Machine, predict_modes

    for (tensor, device), rows in TABLE_III.items():
        shape = SEED_A if tensor == "A" else SEED_B
        tf, tm, l = TABLE_II[device]
        machine = Machine(tau_f=tf * 1e12, tau_m=tm * 1024.0**4, l=l)
        N = float(np.prod(shape))
        for variant, printed in rows.items():
            items = None
            if variant == "tile":
                items = [N / TABLE_III_WIDTH[tensor, device]] * len(shape)
            got = predict_modes(shape, 32, 8, variant, machine, items_per_mode=items)
            for key, want in zip(("T_0", "T_0_lm", "T_inf"), printed):
                # half a unit of the printed digit, plus 1.5 %: the seed's CPU rows sit about
                # 0.0015 s below f / tau_f + m / tau_m with Table II's 2.28e12 flop/s
                tol = 0.0005 + 0.015 * want
                assert abs(got[key] - want) <= tol, (tensor, device, variant, key, got[key], want)


def test_model_terms_and_work_items():
    from tensorflow_ooc.kernels.dense.model import m_0, m_0_lm, m_inf, model_flops, work_items

    shape = (7, 5, 9)
    assert model_flops(shape, 4) == 7 * 5 * 9 * 4 * 3
    assert m_inf(shape, 4, 8) == 8 * (315 + 4 * 21)
    assert work_items(shape, 0, "elem") == 315
    assert work_items(shape, 1, "slice") == 5
    assert work_items(shape, 0, "tile", 4) == 7 * 2 * 3  # clipped tiles are counted
    assert m_0(shape, 4, 8, 315) > m_0_lm(shape, 4, 8, 315, 8) > m_inf(shape, 4, 8)
    # the CPU kernel's tiles span the innermost loop mode whole (mode 2 in C order, 0 in F order),
    # unless the target is the contiguous mode (slab kernel: tiles in every other mode)
    from tensorflow_ooc.kernels.dense.cpu import tile_items

    assert tile_items(shape, 0, 4) == 7 * 2
    assert tile_items(shape, 2, 4) == 9 * 2 * 2
    assert tile_items(shape, 2, 4, strides=(1, 7, 35)) == 9 * 2 and tile_items(shape, 1, 4, strides=(1, 7, 35)) == 5 * 3


def test_bandwidth_probe_measures_something_plausible():
    from tensorflow_ooc.kernels.dense.model import stream_triad

    bw = stream_triad(8 << 20, repeats=2)
    assert 1e8 < bw < 1e13


# --- GPU kernels in the CUDA simulator (tiny inputs: one Python thread per CUDA thread) ----------


def _gpu_reason():
    from tensorflow_ooc.kernels.gpu.device import gpu_unavailable

    return gpu_unavailable()


gpu = pytest.mark.skipif(bool(_gpu_reason()), reason=f"GPU kernels cannot run: {_gpu_reason()}")
GPU_VARIANTS = [("elem", None), ("slice", None), ("tile", None), ("tile", 1), ("tile", 2)]


@gpu
@pytest.mark.parametrize(
    "shape,rank,dtype,order",
    [
        ((3, 2, 4), 3, np.float64, "C"),
        ((2, 3, 1, 2), 5, np.float32, "F"),
        ((2, 2, 3, 1, 2), 1, np.float64, "F"),
        ((2, 3, 2), 130, np.float64, "C"),
    ],
)
def test_gpu_variants_match_einsum(rng, shape, rank, dtype, order):
    from tensorflow_ooc.kernels.dense.gpu import dense_mttkrp_gpu

    X, A = inputs(rng, shape, rank, dtype=dtype, order=order)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for mode in range(len(shape)):
        want = reference(X, A, mode)
        for variant, tile in GPU_VARIANTS:
            got = dense_mttkrp_gpu(X, A, mode, variant=variant, tile=tile)
            assert got.dtype == dtype and got.shape == (shape[mode], rank)
            assert relerr(got, want) < tol, (mode, variant, tile)


@gpu
def test_gpu_device_arrays_and_chunks_accumulate_on_the_device(rng):
    from tensorflow_ooc.kernels.dense.gpu import dense_mttkrp_gpu
    from tensorflow_ooc.kernels.gpu.device import cuda

    X, A = inputs(rng, (4, 3, 2), 4)
    dA = [cuda.to_device(a) for a in A]
    for mode in range(3):
        d_out = cuda.to_device(np.zeros((X.shape[mode], 4)))
        host_out = np.zeros((X.shape[mode], 4))
        for lo, hi in ((0, 1), (1, 4)):
            chunk = np.asfortranarray(X[lo:hi])
            origin = (lo, 0, 0)
            rows = slice(lo, hi) if mode == 0 else slice(None)
            back = dense_mttkrp_gpu(cuda.to_device(chunk), dA, mode, origin=origin, out=d_out[rows])
            assert back is not None
            dense_mttkrp_gpu(chunk, A, mode, origin=origin, out=host_out[rows], variant="slice")
        want = reference(X, A, mode)
        assert relerr(d_out.copy_to_host(), want) < 1e-12, mode
        assert relerr(host_out, want) < 1e-12, mode


@gpu
def test_gpu_bad_inputs_raise_before_launch(rng):
    from tensorflow_ooc.kernels.dense.gpu import dense_mttkrp_gpu

    X, A = inputs(rng, (3, 4, 5), 2)
    with pytest.raises(DenseArrayError, match="order 2"):
        dense_mttkrp_gpu(np.zeros((3, 4)), A[:2], 0)
    with pytest.raises(ShapeError, match="factor matrix 2 has 5 rows"):
        dense_mttkrp_gpu(X, A, 0, origin=(0, 0, 1))
    with pytest.raises(DenseArrayError, match="variant"):
        dense_mttkrp_gpu(X, A, 0, variant="gemm")


def test_contiguous_target_mode_in_several_slabs(rng):
    # R = 130 pads to 136 columns: slabs of 30 target rows, so a 40-long contiguous mode takes two
    from tensorflow_ooc.kernels.dense.cpu import slab_length

    assert slab_length(40, 136, 8) == 30
    for order, mode in (("C", 2), ("F", 0)):
        shape = (3, 4, 40) if order == "C" else (40, 4, 3)
        X, A = inputs(rng, shape, 130, order=order)
        want = reference(X, A, mode)
        for variant, tile in (("slice", None), ("tile", 2), ("tile", None)):
            assert relerr(dense_mttkrp(X, A, mode, variant=variant, tile=tile), want) < 1e-12, (order, variant)
