"""Sampled MTTKRP (fiber gather) against brute-force references, in memory and streamed."""

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.stream import BatchBuffers, fill_batch, stream_batches
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items
from tensorflow_ooc.kernels.sampling.fiber_gather import (
    FiberIndex,
    SampleTable,
    _fiber_ranges,
    _row_cuts,
    _scatter_runs,
    exact_keys,
    sample_keys,
    sampled_mttkrp_items,
    stable_key_order,
)


def draw_samples(rng, coords, shape, mode, count):
    """Distinct multi-indices of the other modes: half from existing nonzeros, half random."""
    hits = coords[rng.integers(0, coords.shape[0], count // 2)]
    rand = np.stack([rng.integers(0, s, count - count // 2) for s in shape], axis=1)
    s = np.concatenate([hits, rand])
    s[:, mode] = 0
    return np.unique(s, axis=0)


def brute_force(coords, values, shape, mode, samples, Hw):
    """sum_s X[s with mode = i] * Hw[s], by comparing every nonzero with every sample."""
    out = np.zeros((shape[mode], Hw.shape[1]))
    others = [m for m in range(len(shape)) if m != mode]
    for s in range(samples.shape[0]):
        match = np.all(coords[:, others] == samples[s, others], axis=1)
        for i, v in zip(coords[match, mode], values[match]):
            out[i] += v * Hw[s]
    return out


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_sampled_mttkrp_in_memory_and_streamed(tmp_path, rng, nmodes):
    shape = tuple(int(s) for s in rng.integers(3, 14 if nmodes < 6 else 7, nmodes))
    coords, values = random_coo(rng, shape, 1500)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=256, max_block_nnz=100)
    tensor = tfo.encode_coo(coords, values, shape)
    bufs = BatchBuffers(store, store.nchunks)
    decoded = fill_batch(store, range(store.nchunks), bufs, delta=False)
    R = int(rng.choice([1, 5, 16]))
    for mode in range(nmodes):
        samples = draw_samples(rng, coords, shape, mode, 60)
        Hw = rng.standard_normal((samples.shape[0], R))
        want = brute_force(coords, values, shape, mode, samples, Hw)
        assert np.abs(want).sum() > 0  # some samples hit fibers
        # dense reference of the same quantity
        X = np.zeros(shape)
        X[tuple(coords.T)] = values
        dense = np.zeros_like(want)
        for s in range(samples.shape[0]):
            idx = list(samples[s])
            idx[mode] = slice(None)
            dense += np.outer(X[tuple(idx)], Hw[s])
        np.testing.assert_allclose(want, dense, rtol=1e-12, atol=1e-12)

        got_scan = np.zeros_like(want)
        sampled_mttkrp_items(tensor_items(tensor), tensor.layout, mode, samples, Hw, got_scan)
        index = FiberIndex.build(decoded, store.layout, mode)
        got_index = np.zeros_like(want)
        sampled_mttkrp_items(decoded, store.layout, mode, samples, Hw, got_index, index=index)
        got_stream = np.zeros_like(want)
        table = SampleTable.build(sample_keys(samples, shape, mode))
        for items in stream_batches(store, 0, store.nchunks, batch_nnz=512):
            sampled_mttkrp_items(items, store.layout, mode, samples, Hw, got_stream, table=table)
        # samples in another order than the samplers' (sorted) one: searched by bisection
        got_reversed = np.zeros_like(want)
        sampled_mttkrp_items(decoded, store.layout, mode, samples[::-1], Hw[::-1], got_reversed, index=index)
        for got in (got_scan, got_index, got_stream, got_reversed):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ordered", [True, False])
def test_fiber_ranges_against_searchsorted(rng, ordered):
    """Runs of many sample keys (several search blocks, hits and misses, runs of every length)
    in a sorted key array, against numpy's bisection."""
    keys = np.sort(rng.integers(0, 5000, 40000).astype(np.uint64))
    skeys = np.unique(rng.integers(0, 5100, 3000).astype(np.uint64))
    if not ordered:
        skeys = rng.permutation(skeys)
    offsets, first = _fiber_ranges(keys, skeys)
    lo, hi = np.searchsorted(keys, skeys, "left"), np.searchsorted(keys, skeys, "right")
    np.testing.assert_array_equal(first, lo)
    np.testing.assert_array_equal(np.diff(offsets), hi - lo)


def test_fibers_themselves_with_identity_rows(tmp_path, rng):
    """With Hw the identity, column s of the output is sample s's fiber."""
    shape = (9, 11, 7)
    coords, values = random_coo(rng, shape, 300)
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=64)
    samples = draw_samples(rng, coords, shape, 1, 20)
    out = np.zeros((shape[1], samples.shape[0]))
    for items in stream_batches(store, 0, store.nchunks):
        sampled_mttkrp_items(items, store.layout, 1, samples, np.eye(samples.shape[0]), out)
    for s in range(samples.shape[0]):
        np.testing.assert_array_equal(out[:, s], X[samples[s, 0], :, samples[s, 2]])


def test_wrapped_keys_are_verified(tmp_path, rng):
    """Other modes of 2^22 x 2^22 x 2^22: keys wrap modulo 2^64, so mode-1 indices 2^20 apart
    collide; hits must be checked against the sample's coordinates."""
    shape = (3, 1 << 22, 1 << 22, 1 << 22)
    assert not exact_keys(shape, 0)
    coords, values = random_coo(rng, shape, 400)
    coords[:, 1] %= 1 << 20  # room for a twin 2^20 above
    coords = np.unique(coords, axis=0)
    values = rng.standard_normal(coords.shape[0])
    real = coords[:30].copy()
    real[:, 0] = 0
    twins = real.copy()
    twins[:, 1] += 1 << 20  # the same keys as the real fibers, no nonzeros of their own
    assert (sample_keys(twins, shape, 0) == sample_keys(real, shape, 0)).all()
    samples = np.concatenate([twins, real])  # twins first: found first without the check
    Hw = rng.standard_normal((samples.shape[0], 3))
    want = brute_force(coords, values, shape, 0, samples, Hw)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=128)
    assert store.shape == shape
    got = np.zeros((shape[0], 3))
    for items in stream_batches(store, 0, store.nchunks):
        sampled_mttkrp_items(items, store.layout, 0, samples, Hw, got)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="63 bits"):
        bufs = BatchBuffers(store, store.nchunks)
        FiberIndex.build(fill_batch(store, range(store.nchunks), bufs, delta=False), store.layout, 0)


def test_bad_arguments(tmp_path, rng):
    shape = (5, 6, 7)
    coords, values = random_coo(rng, shape, 50)
    tensor = tfo.encode_coo(coords, values, shape)
    samples = draw_samples(rng, coords, shape, 0, 4)
    with pytest.raises(ValueError, match="Hw must be"):
        sampled_mttkrp_items(tensor_items(tensor), tensor.layout, 0, samples, np.ones((1, 2)), np.zeros((5, 2)))
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape)
    bufs = BatchBuffers(store, store.nchunks)
    index = FiberIndex.build(fill_batch(store, range(store.nchunks), bufs, delta=False), store.layout, 1)
    with pytest.raises(ValueError, match="for mode 1"):
        sampled_mttkrp_items(
            tensor_items(tensor), tensor.layout, 0, samples, np.ones((len(samples), 2)), np.zeros((5, 2)), index=index
        )


def test_sums_do_not_depend_on_the_thread_count(tmp_path, rng):
    import numba

    shape = (50, 40, 30)
    coords, values = random_coo(rng, shape, 20_000)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=2048)
    bufs = BatchBuffers(store, store.nchunks)
    decoded = fill_batch(store, range(store.nchunks), bufs, delta=False)
    index = FiberIndex.build(decoded, store.layout, 0)
    samples = draw_samples(rng, coords, shape, 0, 600)
    Hw = rng.standard_normal((samples.shape[0], 16))
    got = {}
    old = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            a, b = np.zeros((shape[0], 16)), np.zeros((shape[0], 16))
            sampled_mttkrp_items(decoded, store.layout, 0, samples, Hw, a, index=index)
            for items in stream_batches(store, 0, store.nchunks):
                sampled_mttkrp_items(items, store.layout, 0, samples, Hw, b)
            got[threads] = (a, b)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(got[1][0], got[2][0])
    np.testing.assert_array_equal(got[1][1], got[2][1])
    np.testing.assert_allclose(got[1][0], brute_force(coords, values, shape, 0, samples, Hw), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nrows", [37, 300000])
def test_index_scatter_does_not_depend_on_the_parts(rng, nrows):
    """The index's runs added into the output rows, each part into its own rows, give the sums of
    one sequential loop (samples in order, each fiber in index order) for any number of parts;
    the cuts balance the matches whether counted by row (few rows) or sorted (many)."""
    out_lo, R = 5, 3
    rows = rng.integers(out_lo, out_lo + nrows, 4000)
    vals = rng.standard_normal(4000)
    lengths = rng.integers(0, 40, 150)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    first = rng.integers(0, 4000 - 40, 150)
    Hw = rng.standard_normal((150, R))
    want = np.zeros((nrows, R))
    for s, f in enumerate(first):
        for e in range(f, f + lengths[s]):
            want[rows[e] - out_lo] += vals[e] * Hw[s]
    slot = np.arange(150)
    for parts, step in ((1, 1), (2, 1), (3, 1), (7, 1), (2, 16), (3, 7), (4, 1000)):
        # step: the cuts counted over every step-th sample's matches (1000: one sample, or none)
        cut = _row_cuts(rows, first, offsets, out_lo, nrows, parts, step)
        assert cut[0] == 0 and cut[-1] == nrows and np.all(np.diff(cut) >= 0)
        if step == 1 and parts <= 3:
            matched = np.concatenate([rows[f : f + n] for f, n in zip(first, lengths)]) - out_lo
            per_part = np.histogram(matched, bins=cut)[0]
            assert per_part.max() <= matched.shape[0] / parts + np.bincount(matched).max() + 1
        got = np.zeros((nrows, R))
        _scatter_runs(rows, vals, first, offsets, Hw, slot, got, out_lo, cut)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [50000, 300000])
@pytest.mark.parametrize("key_space", [1000, 2**62, 2**64])
def test_stable_key_order_is_the_stable_argsort(rng, key_space, n):
    """Keys joined with their positions (small key space; radix-sorted by one thread, or by
    several from 2^17 keys; two words where key and position need more than 64 bits): the
    stable order and the sorted keys, ties included."""
    keys = rng.integers(0, min(key_space, 2**62), n).astype(np.uint64)
    keys[rng.integers(0, n, n // 3)] = keys[0]  # ties
    order, sorted_keys = stable_key_order(keys, key_space)
    np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(sorted_keys, np.sort(keys))


WIDE, NARROW = (np.uint64, np.int64), (np.uint32, np.int32)


@pytest.mark.parametrize("n", [1, 2, 5000, 300000])
@pytest.mark.parametrize(
    "key_space, dtypes",
    # uint32 keys hold key spaces of at most 2^32 (index_key_dtype)
    [(7, WIDE), (1000, WIDE), (2**32, WIDE), (2**62, WIDE), (7, NARROW), (1000, NARROW), (2**32, NARROW)],
)
def test_sort_records_is_the_stable_sort(rng, key_space, n, dtypes):
    """Records bucketed by their keys' top bits, each bucket sorted in cache: the keys sorted, rows
    and values in the stable order (ties, a bucket of most records, one or several threads), in
    the arrays given; None only where a bucket's positions and the keys' low bits exceed a word."""
    from tensorflow_ooc.format.radix_sort import sort_records

    kdt, rdt = dtypes
    keys = rng.integers(0, key_space, n, dtype=np.uint64)
    keys[rng.integers(0, n, n // 3)] = keys[0]  # ties, and one heavy bucket
    keys = keys.astype(kdt)
    rows = rng.integers(0, 1 << 30, n).astype(rdt)
    values = rng.standard_normal(n)
    want = np.argsort(keys, kind="stable")
    want_k, want_r, want_v = keys[want], rows[want], values[want]
    got = sort_records(keys, key_space, rows, values)
    if got is None:
        assert key_space == 2**62 and n >= 5000  # 52-58 low key bits and a bucket of 2^11-2^17 positions
        return
    assert got[0] is keys and got[1] is rows and got[2] is values
    np.testing.assert_array_equal(keys, want_k)
    np.testing.assert_array_equal(rows, want_r)
    np.testing.assert_array_equal(values, want_v)


def test_fiber_index_keys_narrow_where_they_fit(tmp_path, rng):
    """Keys of at most 2^32 cells and rows below 2^31 are stored in 32 bits, the sums unchanged;
    wider key spaces keep 64-bit keys."""
    from tensorflow_ooc.kernels.sampling.fiber_gather import fiber_index_bytes, index_key_dtype

    assert index_key_dtype(2**32) == np.uint32 and index_key_dtype(2**32 + 1) == np.uint64
    shape = (int(rng.integers(40, 80)), 70000, 70000)  # mode 0's keys need 33 bits, the others' fewer
    coords = np.stack([rng.integers(0, s, 3000) for s in shape], axis=1)
    coords = np.unique(coords, axis=0)
    values = rng.standard_normal(coords.shape[0])
    store = tfo.convert((coords, values), tmp_path / "narrow.zarr", shape=shape)
    decoded = fill_batch(store, range(store.nchunks), BatchBuffers(store, store.nchunks), delta=False)
    for mode in range(3):
        index = FiberIndex.build(decoded, store.layout, mode)
        assert index.keys.dtype == (np.uint64 if mode == 0 else np.uint32) and index.rows.dtype == np.int32
        # what the memory plan counts is what was built: 20 / 16 bytes a nonzero here, and the fence
        assert fiber_index_bytes(shape, mode, coords.shape[0], 8) == index.nbytes
        keys = sample_keys(coords, shape, mode)
        order = np.argsort(keys, kind="stable")
        np.testing.assert_array_equal(index.keys, keys[order])
        samples = draw_samples(rng, coords, shape, mode, 200)
        Hw = rng.standard_normal((samples.shape[0], 3))
        got = np.zeros((shape[mode], 3))
        sampled_mttkrp_items(decoded, store.layout, mode, samples, Hw, got, index=index)
        np.testing.assert_allclose(got, brute_force(coords, values, shape, mode, samples, Hw), rtol=1e-12, atol=1e-12)
