"""CPU MTTKRP against independent references: dense einsum (small) and pyttb (sparse)."""

import gc
import string

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.kernels import plan_conflicts, tensor_items


def dense_mttkrp(shape, coords, values, factors, mode):
    X = np.zeros(shape)
    np.add.at(X, tuple(coords.T), values)
    letters = string.ascii_lowercase[: len(shape)]
    spec = letters + "," + ",".join(f"{letters[m]}z" for m in range(len(shape)) if m != mode) + f"->{letters[mode]}z"
    return np.einsum(spec, X, *[factors[m] for m in range(len(shape)) if m != mode])


def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


# rank 32 (compiled apart, like 16) on orders 3 and 4 only: each order's kernels at a fixed rank
# take CI 20-25 s to compile, and the generator is the one rank 16 checks on every order
@pytest.mark.parametrize("nmodes,rank", [(n, r) for n in (3, 4, 5, 6) for r in (1, 7, 16, 33, 64)] + [(3, 32), (4, 32)])
def test_every_mode_against_einsum(rng, nmodes, rank):
    shape = tuple(int(s) for s in rng.integers(2, 13 if nmodes < 6 else 7, nmodes))
    coords, values = random_coo(rng, shape, 800)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=300)
    factors = [rng.standard_normal((s, rank)) for s in shape]
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        for conflict in ("auto", "private", "atomic", "owned", "threads"):
            got = tfo.mttkrp(t, factors, mode, conflict=conflict)
            assert got.shape == (shape[mode], rank)
            assert rel_err(got, ref) < 1e-12, (mode, conflict)


# a fresh rank up to 128 each run (its tail R % RANK_TILE and its number of whole tiles), in
# memory and streamed (delta-coded chunks), orders 3-6; as padded column groups (small factors)
# and as tiled kernels over the whole rank (large factors). Four orders, not every tail each run:
# each tail's kernels take CI 10-20 s to compile
@pytest.mark.parametrize("nmodes,grouped", [(n, g) for g in (False, True) for n in (3, 4, 5, 6)])
def test_tiled_ranks_against_einsum(tmp_path, rng, monkeypatch, nmodes, grouped):
    import importlib

    from tensorflow_ooc.kernels.mttkrp.cpu import RANK_TILE, SPECIALIZED_RANKS

    groups = importlib.import_module("tensorflow_ooc.kernels.mttkrp.column_groups")
    if not grouped:
        monkeypatch.setattr(groups, "GROUP_MAX_FACTOR_BYTES", -1)
    used = []
    real = groups.column_block
    monkeypatch.setattr(
        importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch"),
        "column_block",
        lambda *a: used.append(a[1:]) or real(*a),
    )

    tail = int(rng.integers(RANK_TILE))  # a fresh tail (R % 8) and number of tiles every run
    ranks = [r for r in range(tail, 129, RANK_TILE) if r >= 1 and r not in SPECIALIZED_RANKS]
    rank = int(rng.choice(ranks))
    shape = tuple(int(s) for s in rng.integers(2, 11 if nmodes < 6 else 6, nmodes))
    coords, values = random_coo(rng, shape, 600)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=200)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", chunk_nnz=128)
    factors = [rng.standard_normal((s, rank)) for s in shape]
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        # in memory: atomic runs and per-thread outputs; streamed: private rows and runs (Delta-coded)
        for conflict in ("atomic", "threads"):
            assert rel_err(tfo.mttkrp(t, factors, mode, conflict=conflict), ref) < 1e-12, (rank, mode, conflict)
        assert rel_err(tfo.mttkrp(store, factors, mode), ref) < 1e-12, (rank, mode)
    if grouped:
        # groups of at most 32 columns, padded to a multiple of 8, covering every column once
        spans = sorted(set(used))
        assert [first for first, _, _ in spans] == list(range(0, rank, 32))
        assert sum(r for _, r, _ in spans) == rank and all(w % 8 == 0 and r <= w <= 32 for _, r, w in spans)
    else:
        assert not used


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_sparse_against_pyttb(tmp_path, rng, nmodes):
    import pyttb

    shape = tuple(int(s) for s in rng.integers(50, 3000, nmodes))
    coords, values = random_coo(rng, shape, 60_000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=16_384)
    X = pyttb.sptensor(coords, values.reshape(-1, 1), shape)
    for rank in (16, 33):
        factors = [rng.standard_normal((s, rank)) for s in shape]
        for mode in range(nmodes):
            ref = X.mttkrp(factors, mode)
            streamed = tfo.mttkrp(store, factors, mode)
            assert rel_err(streamed, ref) < 1e-12


def test_float32_factors(rng):
    shape = (40, 50, 60, 7)
    coords, values = random_coo(rng, shape, 20_000)
    t = tfo.encode_coo(coords, values, shape)
    f64 = [rng.standard_normal((s, 32)) for s in shape]
    f32 = [f.astype(np.float32) for f in f64]
    for mode in range(4):
        ref = dense_mttkrp(shape, coords, values, f64, mode)
        got = tfo.mttkrp(t, f32, mode)
        assert got.dtype == np.float32
        assert rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("shape", [(2048, 2048, 2048, 2048, 2048, 1500), (600,) * 8])
def test_beyond_64_bit_multiblock(rng, shape):
    """Shapes whose linear index needs more than 64 bits, with factor matrices that still fit."""
    import pyttb

    coords, values = random_coo(rng, shape, 30_000)
    coords[:15_000] //= 64  # a dense corner: blocks with many nonzeros, beside near-singleton blocks
    coords, idx = np.unique(coords, axis=0, return_index=True)
    values = values[idx]
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=1000)
    assert t.layout.total_bits > 64 and t.blocks.nblocks > 10
    X = pyttb.sptensor(coords, values.reshape(-1, 1), shape)
    factors = [rng.standard_normal((s, 16)) for s in shape]
    for mode in range(len(shape)):
        ref = X.mttkrp(factors, mode)
        for conflict in ("auto", "atomic"):
            assert rel_err(tfo.mttkrp(t, factors, mode, conflict=conflict), ref) < 1e-12


def test_results_identical_across_thread_counts(rng):
    shape = (300, 200, 100)
    coords, values = random_coo(rng, shape, 300_000)
    t = tfo.encode_coo(coords, values, shape)
    factors = [rng.standard_normal((s, 16)) for s in shape]
    for mode in range(3):
        one = tfo.mttkrp(t, factors, mode, threads=1, conflict="private")
        two = tfo.mttkrp(t, factors, mode, threads=2, conflict="private")
        assert np.array_equal(one, two)  # private path: fixed items, fixed merge order
        at = tfo.mttkrp(t, factors, mode, threads=2, conflict="atomic")
        assert rel_err(at, one) < 1e-12


def test_edge_cases(rng):
    # single nonzero, length-1 mode, empty slices
    t = tfo.encode_coo(np.array([[2, 0, 4]]), np.array([3.0]), (5, 1, 9))
    A = [rng.standard_normal((s, 8)) for s in (5, 1, 9)]
    M = tfo.mttkrp(t, A, 0)
    assert np.allclose(M[2], 3.0 * A[1][0] * A[2][4]) and np.count_nonzero(M[[0, 1, 3, 4]]) == 0
    M1 = tfo.mttkrp(t, A, 1)
    assert np.allclose(M1[0], 3.0 * A[0][2] * A[2][4])


def test_bad_factors(rng):
    t = tfo.encode_coo(np.array([[2, 0, 4]]), np.array([3.0]), (5, 1, 9))
    with pytest.raises(ValueError, match="rows"):
        tfo.mttkrp(t, [np.ones((5, 4)), np.ones((1, 4)), np.ones((8, 4))], 0)
    with pytest.raises(ValueError, match="common rank"):
        tfo.mttkrp(t, [np.ones((5, 4)), np.ones((1, 3)), np.ones((9, 4))], 0)
    with pytest.raises(ValueError, match="mode 3"):
        tfo.mttkrp(t, [np.ones((5, 4)), np.ones((1, 4)), np.ones((9, 4))], 3)
    with pytest.raises(ValueError, match="out must be"):
        tfo.mttkrp(t, [np.ones((5, 4)), np.ones((1, 4)), np.ones((9, 4))], 0, out=np.zeros((4, 4)))


def test_private_memory_is_bounded(rng):
    shape = (100_000, 50, 40)
    coords, values = random_coo(rng, shape, 200_000)
    t = tfo.encode_coo(coords, values, shape)
    items = tensor_items(t)
    full = plan_conflicts(items, 0, 32, 8, "private", max_private_bytes=1 << 40)
    bound = full.private_bytes // 4
    auto = plan_conflicts(items, 0, 32, 8, "auto", max_private_bytes=bound)
    assert auto.private_bytes <= bound and (~auto.private).any()
    with pytest.raises(MemoryError, match="over the"):
        plan_conflicts(items, 0, 32, 8, "private", max_private_bytes=bound)
    stats = {}
    factors = [rng.standard_normal((s, 32)) for s in shape]
    got = tfo.mttkrp(t, factors, 0, max_private_bytes=bound, stats=stats)
    assert stats["private_bytes"] <= bound and stats["atomic_items"] > 0
    ref = tfo.mttkrp(t, factors, 0, conflict="atomic")
    assert rel_err(got, ref) < 1e-12


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_prefetching_kernels_against_einsum(tmp_path, rng, monkeypatch, nmodes):
    # the prefetching kernels serve factors larger than the caches; force them on small ones
    import importlib

    K = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")
    cpu = importlib.import_module("tensorflow_ooc.kernels.mttkrp.cpu")
    monkeypatch.setattr(K, "PREFETCH_MIN_BYTES", -1)
    shape = tuple(int(rng.integers(3, 9)) for _ in range(nmodes))
    coords, values = random_coo(rng, shape, int(rng.integers(50, 400)))
    rank = int(rng.choice([3, 16, 32]))
    factors = [rng.standard_normal((s, rank)) for s in shape]
    tensor = tfo.encode_coo(coords, values, shape)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", chunk_nnz=64)  # several streamed batches
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        for conflict in ("auto", "private", "atomic", "owned", "threads"):
            assert rel_err(tfo.mttkrp(tensor, factors, mode, conflict=conflict), ref) < 1e-12
        assert rel_err(tfo.mttkrp(store, factors, mode), ref) < 1e-12
    assert any(key[3] for key in cpu._KERNELS)  # the prefetching kernels were the ones run


def _blocked_tensor_and_store(tmp_path, rng, nmodes):
    """A random tensor of several blocks and its store of several chunks, with random factors."""
    shape = tuple(int(rng.integers(5, 40 if nmodes < 5 else 9)) for _ in range(nmodes))
    coords, values = random_coo(rng, shape, int(rng.integers(300, 1500)))
    rank = int(rng.choice([2, 16, 32]))
    factors = [rng.standard_normal((s, rank)) for s in shape]
    tensor = tfo.encode_coo(coords, values, shape, max_block_nnz=250)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", chunk_nnz=128)
    return shape, coords, values, factors, tensor, store


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_per_thread_outputs_against_einsum(tmp_path, rng, monkeypatch, nmodes):
    """Per-thread whole outputs (ALTO's scheme for long modes): chosen by "auto" in the partition
    task, in memory and streamed (kept over the batches of a pass, merged once), and forced with
    conflict="threads" over a store's chunks; 1 and 2 threads."""
    import importlib

    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition
    from tensorflow_ooc.kernels import StackedFactors

    K = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")
    monkeypatch.setattr(K, "THREAD_OUTPUT_MIN_ROWS", 1)
    monkeypatch.setattr(K, "THREAD_OUTPUT_NNZ_PER_ROW", 0.0)
    shape, coords, values, factors, tensor, store = _blocked_tensor_and_store(tmp_path, rng, nmodes)
    stacked = StackedFactors.from_list(factors, np.float64)
    part = plan_partitions(store, 1)[0]
    used = []
    real = K.ThreadOutputs.buffers
    monkeypatch.setattr(K.ThreadOutputs, "buffers", lambda self: used.append(1) or real(self))
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        for threads in (1, 2):
            assert rel_err(tfo.mttkrp(tensor, factors, mode, conflict="threads", threads=threads), ref) < 1e-12
            assert rel_err(tfo.mttkrp(store, factors, mode, conflict="threads", threads=threads), ref) < 1e-12
            for source in (load_partition(store.path, part), (store.path, part)):
                got = mttkrp_partition(source, stacked, mode, threads, batch_nnz=256)
                full = np.zeros_like(ref)
                full[got.lo : got.lo + got.rows.shape[0]] = got.rows
                assert rel_err(full, ref) < 1e-12, (mode, threads, type(source))
    assert used  # the partition tasks took per-thread outputs


@pytest.mark.parametrize("nmodes", [3, 5])
def test_one_thread_adds_straight_into_its_output(tmp_path, rng, monkeypatch, nmodes):
    """One kernel thread needs no conflict resolution: "auto" plans every item without a private
    accumulator and adds into the output itself (nothing copied, zeroed or merged), in memory
    and streamed, and the memory plan carries no private rows or row-owned buckets for it."""
    import importlib

    from tensorflow_ooc.execution.memory_plan import candidates
    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition
    from tensorflow_ooc.kernels import StackedFactors

    K = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")
    shape, coords, values, factors, tensor, store = _blocked_tensor_and_store(tmp_path, rng, nmodes)
    stacked = StackedFactors.from_list(factors, np.float64)
    part = plan_partitions(store, 1)[0]
    strategies, copies = [], []
    real_plan, real_buffers = K.plan_conflicts, K.ThreadOutputs.buffers
    monkeypatch.setattr(K, "plan_conflicts", lambda *a, **k: strategies.append(a[4]) or real_plan(*a, **k))
    monkeypatch.setattr(K, "run_owned", lambda *a, **k: pytest.fail("one thread used row-owned tiles"))

    def buffers(self):
        first, rest = real_buffers(self)
        copies.append(first.size + rest.size)
        return first, rest

    monkeypatch.setattr(K.ThreadOutputs, "buffers", buffers)
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        assert rel_err(tfo.mttkrp(tensor, factors, mode, threads=1), ref) < 1e-12
        for source in (load_partition(store.path, part), (store.path, part)):
            got = mttkrp_partition(source, stacked, mode, 1, batch_nnz=256)
            full = np.zeros_like(ref)
            full[got.lo : got.lo + got.rows.shape[0]] = got.rows
            assert rel_err(full, ref) < 1e-12, (mode, type(source))
    assert strategies and set(strategies) == {"threads"}
    assert copies and set(copies) == {0}
    args = dict(shape=shape, rank=4, itemsize=8, worker_nnz=len(values), chunk_nnz=256, tasks=1)
    args.update(partitions_per_mode=1, workers=1, baseline=0, limit=None)
    for p in candidates(kernel_threads=1, **args):
        assert p.terms["private"] == 0 and p.terms["buckets"] == 0
    assert all(p.terms["private"] > 0 for p in candidates(kernel_threads=2, **args))


def test_memory_plan_offers_per_thread_outputs_first():
    """With two kernel threads each execution is first planned with a private bound that holds a
    second copy of the longest output; a limit too small for it falls back to the default bound."""
    from tensorflow_ooc.execution.memory_plan import candidates, choose
    from tensorflow_ooc.kernels.mttkrp.plan import DEFAULT_MAX_PRIVATE_BYTES

    shape = (4_000_000, 100_000, 50_000)
    args = dict(
        shape=shape,
        rank=16,
        itemsize=8,
        worker_nnz=50_000_000,
        chunk_nnz=1 << 20,
        tasks=1,
        partitions_per_mode=1,
        workers=1,
        baseline=300 << 20,
        execution="streaming",
    )
    roomy = 4_000_000 * 16 * 8
    plans = candidates(limit=None, kernel_threads=2, **args)
    assert plans[0].max_private_bytes == roomy and "per-thread outputs" in plans[0].name
    assert choose(plans, "t").max_private_bytes == roomy
    tight = candidates(limit=int(plans[0].peak / 0.7) - (64 << 20), kernel_threads=2, **args)
    assert choose(tight, "t").max_private_bytes == DEFAULT_MAX_PRIVATE_BYTES
    one_thread = candidates(limit=None, kernel_threads=1, **args)
    assert all(p.max_private_bytes <= DEFAULT_MAX_PRIVATE_BYTES for p in one_thread)


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_row_owned_tiles_against_einsum(tmp_path, rng, monkeypatch, nmodes):
    """Row-owned tiles (in place of atomics on long modes): in memory and streamed (Delta-coded
    words), several item groups and many tiles, same result for 1 and 2 threads."""
    import importlib

    owned = importlib.import_module("tensorflow_ooc.kernels.mttkrp.owned")
    monkeypatch.setattr(owned, "GROUP_NNZ", 97)  # several bucket groups
    monkeypatch.setattr(owned, "TILE_BYTES", 64)  # many small tiles
    shape, coords, values, factors, tensor, store = _blocked_tensor_and_store(tmp_path, rng, nmodes)
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        one = tfo.mttkrp(tensor, factors, mode, conflict="owned", threads=1)
        two = tfo.mttkrp(tensor, factors, mode, conflict="owned", threads=2)
        assert rel_err(one, ref) < 1e-12
        np.testing.assert_array_equal(one, two)  # the sum order does not follow the threads
        assert rel_err(tfo.mttkrp(store, factors, mode, conflict="owned"), ref) < 1e-12


def test_factor_storage_and_outputs_start_on_a_page(rng):
    """Factor stacks, their copies and MTTKRP outputs start on a page, so rows of rank 8/16/32
    float64 start on cache lines (NumPy's own arrays start 16 bytes past one); contents and shapes
    are those asked for, empty ones included."""
    from tensorflow_ooc.kernels import StackedFactors
    from tensorflow_ooc.kernels.factors import ALIGN_BYTES, aligned_copy, aligned_empty, aligned_zeros

    shape = tuple(int(s) for s in rng.integers(1, 40, size=3))
    factors = [rng.random((s, 16)) for s in shape]
    stacked = StackedFactors.from_list(factors)
    assert stacked.data.ctypes.data % ALIGN_BYTES == 0
    assert all(np.array_equal(v, f) for v, f in zip(stacked.views, factors))
    for dtype in (np.float64, np.float32, np.uint8):
        n = int(rng.integers(1, 50))
        z = aligned_zeros((n, 3), dtype)
        assert z.ctypes.data % ALIGN_BYTES == 0 and z.dtype == dtype and z.shape == (n, 3) and not z.any()
        assert z.flags.c_contiguous and aligned_empty(n, dtype).ctypes.data % ALIGN_BYTES == 0
        assert aligned_zeros((0, 3), dtype).shape == (0, 3) and aligned_empty(0, dtype).shape == (0,)
    c = aligned_copy(factors[0][::2])
    assert c.ctypes.data % ALIGN_BYTES == 0 and np.array_equal(c, factors[0][::2]) and c.flags.c_contiguous
    out = tfo.mttkrp(tfo.encode_coo(np.zeros((1, 3), dtype=np.int64), np.ones(1), shape), factors, 0)
    assert out.ctypes.data % ALIGN_BYTES == 0


def test_kept_output_buffer_is_handed_out_only_when_free(tmp_path, rng, monkeypatch, request):
    """A partition task's output comes from the process's kept buffer once nothing refers to the
    previous one, zeroed; while a partial still holds it, a fresh array; results stay exact. The
    garbage collector is off: a reference cycle that holds an output (an exception's frames
    caught below a task once held its caller's output) must not delay the reuse."""
    from tensorflow_ooc.execution import output_buffers
    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import mttkrp_partition
    from tensorflow_ooc.kernels import StackedFactors

    monkeypatch.setattr(output_buffers, "KEEP_MIN_BYTES", 0)
    output_buffers.release_outputs()
    shape, coords, values, factors, tensor, store = _blocked_tensor_and_store(tmp_path, rng, 3)
    stacked = StackedFactors.from_list(factors, np.float64)
    part = plan_partitions(store, 1)[0]

    def check(got, mode):
        full = np.zeros((shape[mode], factors[0].shape[1]))
        full[got.lo : got.lo + got.rows.shape[0]] = got.rows
        assert rel_err(full, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12

    # the mode of the most output rows first (the partition's row span, not the shape: a random
    # tensor may leave an end row of the longest mode empty): its buffer holds every other output
    modes = sorted(range(3), key=lambda m: -(part.row_hi[m] - part.row_lo[m]))
    # compiled first: numba's compilation of a fresh signature leaves reference cycles to its
    # arguments that only the collector frees (a clean checkout's first pass, not later passes)
    for mode in modes:
        mttkrp_partition((store.path, part), stacked, mode, 1, batch_nnz=256)
    output_buffers.release_outputs()
    gc.collect()
    gc.disable()
    request.addfinalizer(gc.enable)
    first = mttkrp_partition((store.path, part), stacked, modes[0], 1, batch_nnz=256)
    kept = output_buffers._KEPT[0].ctypes.data
    assert first.rows.ctypes.data == kept
    held = mttkrp_partition((store.path, part), stacked, modes[1], 1, batch_nnz=256)
    assert held.rows.ctypes.data != kept  # ``first`` still holds the kept buffer
    check(first, modes[0])
    check(held, modes[1])
    del first, held
    for mode in (modes[2], modes[0]):  # free again: reused, and zeroed each time
        got = mttkrp_partition((store.path, part), stacked, mode, 1, batch_nnz=256)
        assert got.rows.ctypes.data == kept
        check(got, mode)
        del got
    output_buffers.release_outputs()
    assert not output_buffers._KEPT
