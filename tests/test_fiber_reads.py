"""Sampled gathers through a store's fiber index in groups of chunks: the sums of the rows hit kept
apart (sparse) while they are few, moved to the whole mode's rows once too many, and equal to the
in-memory gather either way, in every mode of tensors of order 3 to 5."""

import numpy as np
import pytest
from conftest import random_coo

import tensorflow_ooc as tfo
import tensorflow_ooc.execution.fiber_reads as fr
from tensorflow_ooc.execution.partials import SPARSE_ROWS
from tensorflow_ooc.execution.stream import BatchBuffers, fill_batch
from tensorflow_ooc.format.fiber_keys import distinct_sorted
from tensorflow_ooc.kernels.sampling.fiber_gather import FiberIndex, sampled_mttkrp_items
from tensorflow_ooc.kernels.sampling.krp_sampler import SampleSet
from tensorflow_ooc.store.fiber_index import open_fiber_index
from tensorflow_ooc.store.scratch import ScratchBuffers
from tensorflow_ooc.store.shard_files import ShardError


def _draws(rng, coords, shape, mode, count, R):
    """Draws on nonzeros' fibers (some repeated) and on random cells, in random order."""
    hits = coords[rng.integers(0, coords.shape[0], count)]
    rand = np.stack([rng.integers(0, s, count) for s in shape], axis=1)
    s = np.concatenate([hits, rand, hits[: max(1, count // 4)]])
    s = s[rng.permutation(s.shape[0])]
    s[:, mode] = 0
    return SampleSet(mode, s, rng.random(s.shape[0]) + 0.5, rng.standard_normal((s.shape[0], R)), s.shape[0])


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_grouped_gathers_equal_the_in_memory_gather(tmp_path, rng, nmodes, monkeypatch):
    # one long mode, its fibers a few nonzeros each: a few draws hit under a quarter of its rows,
    # many more; the other modes' rows are few, and their draws hit more than a quarter
    long = int(rng.integers(0, nmodes))
    lo, hi = {3: (40, 70), 4: (12, 20), 5: (7, 11)}[nmodes]
    shape = [int(x) for x in rng.integers(lo, hi, nmodes)]
    shape[long] = int(rng.integers(600, 900))
    coords, values = random_coo(rng, shape, 8000)
    store = tfo.convert((coords, values), tmp_path / "s", shape=tuple(shape), chunk_nnz=512)
    tfo.build_fiber_index(store, "all", chunk_nnz=int(rng.choice([16, 32])))
    items = fill_batch(store, range(store.nchunks), BatchBuffers(store, store.nchunks), delta=False)
    R = int(rng.integers(1, 9))
    # groups of a few chunks each, so a gather adds several groups into one output
    monkeypatch.setattr(fr, "GATHER_ENTRIES", 128)
    seen = set()
    for mode in range(nmodes):
        for count in (6, 200) if mode == long else (200,):
            S = _draws(rng, coords, store.shape, mode, count, R)
            want = np.zeros((store.shape[mode], R))
            index = FiberIndex.build(items, store.layout, mode)
            sampled_mttkrp_items(items, store.layout, mode, S.coords, S.weighted_rows(), want, 0, index=index)
            got = fr.indexed_sampled_partial(str(store.path), S, mode, threads=int(rng.integers(1, 3)))
            full = np.zeros_like(want)
            got.add_into(full)
            # several groups add in turn: the same terms, summed in group order
            np.testing.assert_allclose(full, want, rtol=1e-12, atol=1e-12)
            hit = np.flatnonzero(np.abs(want).sum(axis=1) > 0)
            if got.index is not None:
                # the rows hit, sorted and distinct, and few enough to be kept apart
                assert np.array_equal(got.index, distinct_sorted(got.index))
                assert np.isin(hit, got.index).all() and got.index.shape[0] * SPARSE_ROWS <= store.shape[mode]
                assert got.rows.shape == (got.index.shape[0], R)
            else:
                assert hit.shape[0] * SPARSE_ROWS > store.shape[mode] or got.rows.shape[0] == store.shape[mode]
            seen.add(got.index is not None)
            assert (
                got.reads["nnz"] >= 1
                and got.reads["chunks_read"] > fr.GATHER_ENTRIES // store.fibers.mode(mode).chunk_nnz
            )  # more than one group's chunks
    assert seen == {True, False}  # both forms met


def test_hit_rows_move_to_the_whole_mode_when_too_many(rng):
    """Slots past a quarter of the mode: what earlier groups summed moves to the whole mode's rows."""
    nrows, R = int(rng.integers(40, 80)), 3
    acc = fr.HitRows(nrows, 10**6, R, np.float64)
    want = np.zeros((nrows, R))
    # small groups first, then one of half the mode's rows, so the slots pass a quarter whatever
    # the small groups drew
    groups = [rng.integers(0, nrows, int(rng.integers(2, 8))) for _ in range(6)]
    for rows in [*groups, rng.choice(nrows, nrows // 2, replace=False)]:
        rows = rows.astype(np.uint32)
        first = np.arange(rows.shape[0], dtype=np.int64)
        offsets = np.arange(rows.shape[0] + 1, dtype=np.int64)
        out, local = acc.slots(rows, first, offsets)
        add = rng.standard_normal((rows.shape[0], R))
        for e in range(rows.shape[0]):
            out[rows[e] if local is None else local[e]] += add[e]
            want[rows[e]] += add[e]
    lo, sums, index = acc.result()
    full = np.zeros_like(want)
    if index is None:
        full[lo : lo + sums.shape[0]] = sums
    else:
        full[index] = sums
    np.testing.assert_allclose(full, want, rtol=1e-13, atol=1e-13)
    assert index is None  # the last group alone holds half the mode's rows: past a quarter


def test_chunks_read_in_any_order_are_those_read_in_order(tmp_path, rng):
    shape = tuple(int(x) for x in rng.integers(8, 20, 3))
    store = tfo.convert(random_coo(rng, shape, 4000), tmp_path / "s", shape=shape, chunk_nnz=512)
    tfo.build_fiber_index(store, [0], chunk_nnz=16)
    m = open_fiber_index(tfo.open_store(store.path)).mode(0)
    for f in m._files:
        pick = np.unique(rng.choice(m.nchunks, m.nchunks // 2))
        perm = rng.permutation(pick.shape[0])
        C = f.chunk_len
        a = np.zeros(pick.shape[0] * C, dtype=f.dtype)
        b = np.zeros_like(a)
        crc_a, n_a = f.read_many(pick, a)
        crc_b, n_b = f.read_many(pick[perm], b)
        assert n_a == n_b and np.array_equal(crc_a[perm], crc_b)
        assert np.array_equal(a.reshape(-1, C)[perm], b.reshape(-1, C))
        with pytest.raises(ShardError, match="outside the array's chunks"):
            f.read_many(np.array([m.nchunks + int(rng.integers(0, 5))]), a)
    # reads of several groups through one set of reused buffers equal fresh reads
    scratch = ScratchBuffers()
    for _ in range(3):
        pick = np.unique(rng.choice(m.nchunks, int(rng.integers(1, m.nchunks))))
        fresh = m.read(pick)
        reused = m.read(pick, scratch)
        assert np.array_equal(fresh.keys, reused.keys) and np.array_equal(fresh.rows, reused.rows)
        assert np.array_equal(fresh.values, reused.values) and fresh.bytes_read == reused.bytes_read
    assert scratch.nbytes > 0


def test_distinct_sorted_is_numpys_unique(rng):
    for dtype in (np.uint64, np.int64):
        keys = rng.integers(0, int(rng.integers(1, 10**6)), int(rng.integers(0, 5000))).astype(dtype)
        got = distinct_sorted(keys)
        assert got.dtype == dtype and np.array_equal(got, np.unique(keys))


def test_the_fits_exact_pass_runs_after_the_gather(tmp_path, rng, two_workers):
    """A round that evaluates the fit runs the exact pass once its gathers are done, never beside
    them (together they shared the workers' cores, and the round's time kept part of the pass)."""
    from distributed import get_task_stream

    shape = tuple(int(x) for x in rng.integers(20, 40, 3))
    store = tfo.convert(random_coo(rng, shape, 6000), tmp_path / "s", shape=shape, chunk_nnz=512)
    tfo.build_fiber_index(store, "all", chunk_nnz=64)
    kw = dict(method="sts", samples=400, seed=int(rng.integers(1 << 30)), max_iters=3, fit_every=1, tol=0)
    with get_task_stream(client=two_workers) as ts:
        r = tfo.cp_als(store, 3, client=two_workers, execution="streaming", distribution="graph", **kw)
    assert set(r.params["sampled_reads"].values()) == {"index"}

    def spans(prefix):
        out = []
        for t in ts.data:
            if t["key"][0 if isinstance(t["key"], tuple) else slice(None)].startswith(prefix):
                out += [(s["start"], s["stop"]) for s in t["startstops"] if s["action"] == "compute"]
        return out

    gathers, exact = spans("indexed_sampled_partial"), spans("_gated")
    assert gathers and len(exact) >= 2  # the fit's pass of each sampled round, on both workers
    for a0, a1 in gathers:
        for b0, b1 in exact:
            assert a1 <= b0 or b1 <= a0  # never at once
    for b0, _ in exact:  # each pass follows a gather
        assert any(a1 <= b0 for _, a1 in gathers)


def test_read_entries_are_checked_in_one_pass(rng):
    """Rows past the mode, keys out of order or a chunk not starting at its recorded key are found
    wherever they are, a row outside first."""
    from tensorflow_ooc.store.fiber_index import _KEYS_OUT_OF_ORDER, _ROW_OUTSIDE, _entries_fault

    per, nchunks, length = int(rng.integers(2, 9)), int(rng.integers(3, 40)), 50
    n = per * nchunks - int(rng.integers(0, per))  # the last chunk short
    keys = np.sort(rng.integers(0, 10**6, n).astype(np.uint64))
    rows = rng.integers(0, length, n).astype(np.uint32)
    starts = np.arange(nchunks, dtype=np.int64) * per
    first = keys[starts].copy()
    assert _entries_fault(keys, rows, starts, first, length) == 0
    i = int(rng.integers(0, n))
    bad = rows.copy()
    bad[i] = length
    assert _entries_fault(keys, bad, starts, first, length) == _ROW_OUTSIDE
    j = int(rng.integers(1, n))
    swapped = keys.copy()
    swapped[j - 1], swapped[j] = keys[j] + np.uint64(1), keys[j - 1]
    assert _entries_fault(swapped, rows, starts, first, length) == _KEYS_OUT_OF_ORDER
    moved = first.copy()
    moved[int(rng.integers(0, nchunks))] += np.uint64(1)
    assert _entries_fault(keys, rows, starts, moved, length) == _KEYS_OUT_OF_ORDER
    assert _entries_fault(swapped, bad, starts, first, length) == _ROW_OUTSIDE
