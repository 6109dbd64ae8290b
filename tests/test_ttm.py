"""Sparse TTM and TTM chains (seed 004) against dense np.tensordot on small tensors."""

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import IndexRangeError, NonFiniteValueError, ShapeError, TfoocError
from tensorflow_ooc.kernels.gpu.device import gpu_unavailable
from tensorflow_ooc.kernels.ttm import cpu as ttm_cpu
from tensorflow_ooc.kernels.ttm.chain import KERNELS, TTMLayouts, ttm_chain_coo
from tensorflow_ooc.kernels.ttm.layout import merge, merge_many
from tensorflow_ooc.kernels.ttm.select import FEATURES, features, load_tree, predict, select_kernel


def dense_of(shape, coords, values):
    X = np.zeros(shape)
    np.add.at(X, tuple(coords.T), values)
    return X


def dense_ttm(X, U, mode):
    return np.moveaxis(np.tensordot(X, U, axes=([mode], [0])), -1, mode)


def dense_chain(X, mats, skip):
    for m, U in enumerate(mats):
        if m != skip:
            X = dense_ttm(X, U, m)
    return X


def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


def check_semi_sparse(Y, dense_modes):
    """Index rows distinct, lexicographically sorted, inside the shape; block width right."""
    assert Y.dense_modes == tuple(dense_modes)
    sparse = [m for m in range(len(Y.shape)) if m not in dense_modes]
    assert Y.index.shape == (Y.block.shape[0], len(sparse)) and Y.index.dtype == np.int64
    assert Y.block.shape[1] == int(np.prod([Y.shape[m] for m in dense_modes]))
    if Y.index.shape[0] > 1:
        order = np.lexsort(Y.index.T[::-1])
        assert (order == np.arange(order.size)).all()
        assert (np.diff(Y.index, axis=0) != 0).any(axis=1).all()
    for c, m in enumerate(sparse):
        assert (Y.index[:, c] >= 0).all() and (Y.index[:, c] < Y.shape[m]).all()


@pytest.fixture
def small_parts(monkeypatch):
    """COO parts of a few nonzeros, so fibers straddle parts and the carries are exercised."""
    monkeypatch.setattr(ttm_cpu, "COO_MIN_PART", 3)


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_every_kernel_every_mode_against_tensordot(rng, small_parts, nmodes):
    shape = tuple(int(s) for s in rng.integers(2, 9 if nmodes < 5 else 6, nmodes))
    coords, values = random_coo(rng, shape, 300)
    X = dense_of(shape, coords, values)
    layouts = TTMLayouts(coords, values, shape)
    for mode in range(nmodes):
        R = int(rng.integers(1, 7))
        U = rng.standard_normal((shape[mode], R))
        ref = dense_ttm(X, U, mode)
        nonempty = np.unique(np.delete(coords, mode, axis=1), axis=0)
        for kernel in KERNELS:
            Y = tfo.ttm(layouts, U, mode, kernel=kernel)
            check_semi_sparse(Y, (mode,))
            assert Y.shape == ref.shape
            assert (Y.index == nonempty).all(), "rows must be exactly the non-empty fibers"
            assert rel_err(Y.to_dense(), ref) < 1e-12, (mode, kernel)


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_chain_every_skip_against_tensordot(rng, small_parts, nmodes):
    shape = tuple(int(s) for s in rng.integers(2, 8 if nmodes < 5 else 6, nmodes))
    coords, values = random_coo(rng, shape, 250)
    X = dense_of(shape, coords, values)
    mats = [rng.standard_normal((s, int(rng.integers(1, 4)))) for s in shape]
    layouts = TTMLayouts(coords, values, shape)
    for skip in range(nmodes):
        ref = dense_chain(X, mats, skip)
        for kernel in (None,) + KERNELS:
            Y = tfo.ttm_chain(layouts, [None if m == skip else U for m, U in enumerate(mats)], skip, kernel=kernel)
            check_semi_sparse(Y, [m for m in range(nmodes) if m != skip])
            assert (Y.index[:, 0] == np.unique(coords[:, skip])).all()
            assert rel_err(Y.to_dense(), ref) < 1e-12, (skip, kernel)


def test_layouts_are_sorted_once_and_reused(rng):
    shape = (6, 7, 8)
    coords, values = random_coo(rng, shape, 120)
    t = tfo.encode_coo(coords, values, shape)
    U = rng.standard_normal((7, 3))
    first, again = {}, {}
    a = tfo.ttm(t, U, 1, stats=first)
    b = tfo.ttm(t, U, 1, stats=again)
    assert first["layouts_built"] == 1 and first["layout_seconds"] > 0
    assert again["layouts_built"] == 0 and again["layout_seconds"] == 0
    assert again["kernel"] in KERNELS and again["nnz"] == 120 and again["fibers"] == a.nfibers
    assert rel_err(b.to_dense(), dense_ttm(dense_of(shape, coords, values), U, 1)) < 1e-12
    mats = [rng.standard_normal((s, 2)) for s in shape]
    tfo.ttm_chain(t, mats, 0, stats=first)
    tfo.ttm_chain(t, mats, 0, stats=again)
    assert first["layouts_built"] == 1 and again["layouts_built"] == 0 and again["chain_seconds"] > 0


def test_edge_cases(rng):
    # a single nonzero, a mode of length 1
    shape = (5, 1, 9)
    coords, values = np.array([[2, 0, 4]]), np.array([3.0])
    X = dense_of(shape, coords, values)
    mats = [rng.standard_normal((s, 4)) for s in shape]
    for mode in range(3):
        for kernel in KERNELS:
            Y = tfo.ttm((coords, values, shape), mats[mode], mode, kernel=kernel)
            assert Y.nfibers == 1 and rel_err(Y.to_dense(), dense_ttm(X, mats[mode], mode)) < 1e-12
        Yc = tfo.ttm_chain((coords, values, shape), mats, mode)
        assert Yc.nfibers == 1 and rel_err(Yc.to_dense(), dense_chain(X, mats, mode)) < 1e-12
    # no nonzeros at all: empty results of the right shapes
    empty = (np.zeros((0, 3), dtype=np.int64), np.zeros(0), shape)
    for kernel in KERNELS:
        Y = tfo.ttm(empty, mats[2], 2, kernel=kernel)
        assert Y.block.shape == (0, 4) and Y.index.shape == (0, 2) and not Y.to_dense().any()
    Yc = tfo.ttm_chain(empty, mats, 1)
    assert Yc.block.shape == (0, 16) and Yc.to_dense().shape == (4, 1, 4)


def test_heavy_fiber_and_many_empty_fibers(rng, small_parts):
    # one fiber holds most nonzeros (COO parts fall inside it), the rest are singletons
    shape = (3, 4, 400)
    long = np.stack([np.zeros(300, int), np.ones(300, int), rng.permutation(400)[:300]], axis=1)
    short = np.array([[2, 3, 5], [1, 0, 7], [0, 2, 399]])
    coords = np.concatenate([long, short])
    values = rng.standard_normal(coords.shape[0])
    X = dense_of(shape, coords, values)
    U = rng.standard_normal((400, 5))
    for kernel in KERNELS:
        Y = tfo.ttm((coords, values, shape), U, 2, kernel=kernel)
        assert Y.nfibers == 4 and rel_err(Y.to_dense(), dense_ttm(X, U, 2)) < 1e-12


def test_float32_and_mixed_dtypes(rng):
    shape = (5, 6, 7)
    coords, values = random_coo(rng, shape, 80)
    X = dense_of(shape, coords, values)
    U = rng.standard_normal((6, 4))
    Y = tfo.ttm((coords, values.astype(np.float32), shape), U.astype(np.float32), 1)
    assert Y.block.dtype == np.float32 and rel_err(Y.to_dense(), dense_ttm(X, U, 1)) < 1e-5
    Y = tfo.ttm((coords, values.astype(np.float32), shape), U, 1)
    assert Y.block.dtype == np.float64
    mats = [rng.standard_normal((s, 2)).astype(np.float32) for s in shape]
    mats[2] = mats[2].astype(np.float64)
    assert tfo.ttm_chain((coords, values, shape), mats, 0).block.dtype == np.float64


def test_store_equals_in_memory(tmp_path, rng):
    shape = (9, 11, 7, 5)
    coords, values = random_coo(rng, shape, 1500)
    # chunks of 256 nonzeros: fibers and slices are split over chunks and merged
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=256)
    assert store.nchunks > 3
    layouts = TTMLayouts(coords, values, shape)
    mats = [rng.standard_normal((s, 3)) for s in shape]
    for mode in range(4):
        stats = {}
        got = tfo.ttm(store, mats[mode], mode, stats=stats)
        want = tfo.ttm(layouts, mats[mode], mode)
        assert stats["parts"] == store.nchunks and stats["merge_seconds"] >= 0
        assert (got.index == want.index).all() and rel_err(got.block, want.block) < 1e-12
        got = tfo.ttm_chain(store, mats, mode)
        want = tfo.ttm_chain(layouts, mats, mode)
        assert (got.index == want.index).all() and rel_err(got.block, want.block) < 1e-12


def test_merge_of_partitions_equals_the_whole(rng):
    shape = (8, 6, 5)
    coords, values = random_coo(rng, shape, 200)
    mats = [rng.standard_normal((s, 2)) for s in shape]
    halves = np.array_split(rng.permutation(200), 3)
    for skip in range(3):
        whole = tfo.ttm_chain((coords, values, shape), mats, skip)
        parts = [ttm_chain_coo(coords[h], values[h], shape, mats, skip) for h in halves]
        merged = merge(merge(parts[0], parts[1]), parts[2])
        assert (merged.index == whole.index).all() and rel_err(merged.block, whole.block) < 1e-12
        assert rel_err(merge_many(parts).block, whole.block) < 1e-12
    with pytest.raises(ShapeError, match="cannot merge"):
        merge(tfo.ttm_chain((coords, values, shape), mats, 0), tfo.ttm_chain((coords, values, shape), mats, 1))


def test_selector_choice_is_a_kernel_and_does_not_change_the_result(rng):
    shape = (30, 4, 50, 3)
    coords, values = random_coo(rng, shape, 900)
    layouts = TTMLayouts(coords, values, shape)
    for mode in range(4):
        U = rng.standard_normal((shape[mode], 16))
        lay = layouts.layout(mode)
        feats = features(lay, 16)
        assert tuple(feats) == FEATURES and all(np.isfinite(v) for v in feats.values())
        assert feats["nnz"] == 900 and feats["rows_x_cols"] == lay.nfibers * shape[mode]
        lengths = np.diff(lay.fiber_ptr)
        assert feats["load_imbalance"] == lengths.max() / lengths.min()
        chosen = select_kernel(lay, 16)
        assert chosen in KERNELS
        stats = {}
        default = tfo.ttm(layouts, U, mode, stats=stats)
        assert stats["kernel"] == chosen
        for kernel in KERNELS:
            assert rel_err(tfo.ttm(layouts, U, mode, kernel=kernel).block, default.block) < 1e-12


def test_shipped_tree_loads_and_predicts():
    tree = load_tree()
    assert tree is not None, "tensorflow_ooc/kernels/ttm/ttm_selector.json is not shipped"
    assert set(tree["classes"]) <= set(KERNELS) and tree["features"] == list(FEATURES)
    assert 0 <= tree["training"]["cv_accuracy"] <= 1
    assert load_tree(device="gpu") is not None  # the GPU's own tree, or the CPU's where none was trained
    leaves = [i for i, left in enumerate(tree["left"]) if left == -1]
    assert leaves and all(tree["right"][i] == -1 for i in leaves)
    # every leaf is reachable: a feature vector at each side of each split
    base = {name: 1.0 for name in FEATURES}
    assert predict(tree, base) in KERNELS
    for node, f in enumerate(tree["feature"]):
        if tree["left"][node] != -1:
            for delta in (-1e-9, 1e-9):
                feats = dict(base)
                feats[FEATURES[f]] = tree["threshold"][node] + delta
                assert predict(tree, feats) in KERNELS


def test_bad_inputs_raise_clearly(rng):
    shape = (5, 6, 7)
    coords, values = random_coo(rng, shape, 40)
    X = (coords, values, shape)
    with pytest.raises(ShapeError, match="has 5 rows but mode 1 of the tensor has length 6"):
        tfo.ttm(X, np.ones((5, 3)), 1)
    with pytest.raises(ShapeError, match="mode 3 is out of range"):
        tfo.ttm(X, np.ones((5, 3)), 3)
    with pytest.raises(ShapeError, match="mode -1 is out of range"):
        tfo.ttm(X, np.ones((7, 3)), -1)
    with pytest.raises(ShapeError, match="2-D"):
        tfo.ttm(X, np.ones(7), 2)
    bad = np.ones((7, 3))
    bad[4, 1] = np.nan
    with pytest.raises(NonFiniteValueError, match=r"entry \(4, 1\)"):
        tfo.ttm(X, bad, 2)
    nan_values = values.copy()
    nan_values[3] = np.nan
    with pytest.raises(NonFiniteValueError, match="nonzero 3"):
        tfo.ttm((coords, nan_values, shape), np.ones((7, 3)), 2)
    outside = coords.copy()
    outside[0, 2] = 7
    with pytest.raises(IndexRangeError, match="mode 2 index 7"):
        tfo.ttm((outside, values, shape), np.ones((7, 3)), 2)
    mats = [np.ones((s, 2)) for s in shape]
    with pytest.raises(ShapeError, match="skip 3 is out of range"):
        tfo.ttm_chain(X, mats, 3)
    with pytest.raises(ShapeError, match="expected 3 matrices"):
        tfo.ttm_chain(X, mats[:2], 0)
    with pytest.raises(ShapeError, match=r"matrices\[2\] has 6 rows"):
        tfo.ttm_chain(X, [None, np.ones((6, 2)), np.ones((6, 2))], 0)
    with pytest.raises(ValueError, match="kernel must be one of"):
        tfo.ttm(X, np.ones((7, 3)), 2, kernel="dense")
    with pytest.raises(TypeError, match="tensor must be"):
        tfo.ttm(np.zeros(shape), np.ones((7, 3)), 2)
    assert issubclass(ShapeError, TfoocError) and issubclass(NonFiniteValueError, TfoocError)


@pytest.mark.skipif(bool(gpu_unavailable()), reason=f"GPU kernels cannot run: {gpu_unavailable()}")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_kernels_match_cpu(rng, dtype):
    # tiny: the simulator runs one Python thread per CUDA thread
    shape = (4, 3, 5)
    coords, values = random_coo(rng, shape, 14)
    layouts = TTMLayouts(coords, values.astype(dtype), shape)
    X = dense_of(shape, coords, values.astype(dtype).astype(np.float64))
    tol = 1e-12 if dtype == "float64" else 1e-5
    for mode, R in ((0, 3), (2, 5)):
        U = rng.standard_normal((shape[mode], R)).astype(dtype)
        ref = dense_ttm(X, U.astype(np.float64), mode)
        for kernel in ("fiber", "coo"):
            Y = tfo.ttm(layouts, U, mode, kernel=kernel, device="gpu")
            assert Y.block.dtype == np.dtype(dtype)
            assert rel_err(Y.to_dense().astype(np.float64), ref) < tol, (mode, kernel)
    mats = [rng.standard_normal((s, 2)).astype(dtype) for s in shape]
    Yc = tfo.ttm_chain(layouts, mats, 1, kernel="fiber", device="gpu")
    assert rel_err(Yc.to_dense().astype(np.float64), dense_chain(X, [m.astype(np.float64) for m in mats], 1)) < tol


def test_chain_splits_large_slices(rng, monkeypatch):
    # two slices of hundreds of fibers each, cut into pieces of 8 fibers: pieces are summed per slice
    from tensorflow_ooc.kernels.ttm import chain as ttm_module

    monkeypatch.setattr(ttm_module, "CHAIN_MIN_PIECE", 8)
    shape = (2, 9, 10, 11)
    coords, values = random_coo(rng, shape, 700)
    slice_ptr = np.array([0, 300, 600])
    work = ttm_module.split_slices(slice_ptr, 2)
    assert work.shape[0] > 5 and set(slice_ptr) <= set(work)
    X = dense_of(shape, coords, values)
    mats = [rng.standard_normal((s, 3)) for s in shape]
    for skip in range(4):
        Y = tfo.ttm_chain((coords, values, shape), mats, skip)
        assert rel_err(Y.to_dense(), dense_chain(X, mats, skip)) < 1e-12


@pytest.mark.skipif(bool(gpu_unavailable()), reason=f"GPU kernels cannot run: {gpu_unavailable()}")
def test_gpu_selector_pick_without_cupy_falls_back(rng, monkeypatch):
    from tensorflow_ooc.kernels.ttm import chain as ttm_module
    from tensorflow_ooc.kernels.ttm import gpu as ttm_gpu

    monkeypatch.setattr(ttm_module, "select_kernel", lambda layout, rank, device="cpu": "csr")
    monkeypatch.setattr(ttm_gpu, "cupy_available", lambda: False)
    shape = (3, 4, 2)
    coords, values = random_coo(rng, shape, 6)
    U = rng.standard_normal((4, 2))
    stats = {}
    Y = tfo.ttm((coords, values, shape), U, 1, device="gpu", stats=stats)
    assert stats["kernel"] == "coo"
    assert rel_err(Y.to_dense(), dense_ttm(dense_of(shape, coords, values), U, 1)) < 1e-12
    with pytest.raises(RuntimeError, match="needs CuPy"):
        tfo.ttm((coords, values, shape), U, 1, device="gpu", kernel="csr")
