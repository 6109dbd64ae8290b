"""Memoized mode pairs (kernels/mttkrp/mode_pairs.py, execution/pair_tasks.py): both modes of a pair
against a dense einsum and the existing kernels at orders 3-5, the memo carried from a pair's first
mode to its second across an update inside one sweep task, the pair choice, and CP-ALS through them."""

import numpy as np
import pytest
from conftest import random_coo
from paired_stores import paired_store
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.partitions import plan_partitions
from tensorflow_ooc.kernels import StackedFactors, tensor_items
from tensorflow_ooc.kernels.mttkrp import mode_pairs as mp
from tensorflow_ooc.kernels.mttkrp.dispatch import numba_threads


def _tensor(rng, nmodes, nnz=3000):
    shape = tuple(int(s) for s in rng.integers(3, 14 if nmodes < 5 else 8, nmodes))
    coords, values = random_coo(rng, shape, nnz)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=500)
    return shape, coords, values, t


@pytest.mark.parametrize("nmodes,rank", [(n, r) for n in (3, 4, 5) for r in (8, 7)])
def test_both_modes_of_every_pair_match_einsum_and_the_kernels(rng, nmodes, rank):
    shape, coords, values, t = _tensor(rng, nmodes)
    c, v = mp.item_nonzeros(tensor_items(t), t.layout)
    F = StackedFactors.from_list([rng.standard_normal((s, rank)) for s in shape])
    for a in range(nmodes - 1):
        pair = mp.mode_pair(c, v, shape, a, a + 1, groups_max=1.0)
        assert pair.nnz == len(values) and np.all(np.diff(pair.rows_a) >= 0)
        Z = np.empty((pair.groups, rank))
        out_a, out_b = np.zeros((shape[a], rank)), np.zeros((shape[a + 1], rank))
        mp.pair_first(pair, F.data, F.offsets, Z, out_a)
        mp.pair_second(pair, F.data, F.offsets, Z, out_b)
        by_rows = np.zeros_like(out_b)
        mp.pair_second(pair, F.data, F.offsets, Z, by_rows, slices=False)
        in_slices = np.zeros_like(out_b)
        mp.pair_second(pair, F.data, F.offsets, Z, in_slices, slices=True)
        for m, out in ((a, out_a), (a + 1, out_b), (a + 1, by_rows), (a + 1, in_slices)):
            assert rel_err(out, dense_mttkrp(shape, coords, values, F.views, m)) < 1e-12
            assert rel_err(out, tfo.mttkrp(t, F, m)) < 1e-12


def test_other_indices_take_the_narrowest_type_and_every_type_matches_einsum(rng):
    assert mp.other_dtype([65536, 3]) == np.uint16 and mp.other_dtype([65537, 3]) == np.uint32
    assert mp.other_dtype([2**32 + 1]) == np.int64
    # mode 0 longer than 2**16: the pair (2, 3) keeps uint32 indices, the pair (1, 2) uint32, a
    # pair without mode 0 among its other modes uint16
    shape = (int(rng.integers(65_600, 70_000)), 4, 3, 3)
    coords, values = random_coo(rng, shape, 5000)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=500)
    c, v = mp.item_nonzeros(tensor_items(t), t.layout)
    F = StackedFactors.from_list([rng.standard_normal((s, 8)) for s in shape])
    for a, dtype in ((0, np.uint16), (1, np.uint32), (2, np.uint32)):
        pair = mp.mode_pair(c, v, shape, a, a + 1, groups_max=1.0)
        assert pair.other.dtype == dtype
        Z = np.empty((pair.groups, 8))
        out_a, out_b = np.zeros((shape[a], 8)), np.zeros((shape[a + 1], 8))
        mp.pair_first(pair, F.data, F.offsets, Z, out_a)
        mp.pair_second(pair, F.data, F.offsets, Z, out_b)
        for m, out in ((a, out_a), (a + 1, out_b)):
            assert rel_err(out, dense_mttkrp(shape, coords, values, F.views, m)) < 1e-12


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_the_wrap_pair_matches_einsum_and_is_chosen_where_it_adds_a_pair(rng, nmodes):
    shape, coords, values, t = _tensor(rng, nmodes)
    c, v = mp.item_nonzeros(tensor_items(t), t.layout)
    F = StackedFactors.from_list([rng.standard_normal((s, 8)) for s in shape])
    a, b = nmodes - 1, 0
    pair = mp.mode_pair(c, v, shape, a, b, groups_max=1.0)
    assert pair.wraps and np.all(np.diff(pair.rows_a) >= 0)
    Z = pair.memo(8, F.dtype)
    out_a, out_b = np.zeros((shape[a], 8)), np.zeros((shape[b], 8))
    mp.pair_first(pair, F.data, F.offsets, Z, out_a)
    pair.keep_memo(F)
    assert pair.memo_holds(F)
    F.views[b][...] = rng.standard_normal(F.views[b].shape)  # mode b's own rows may change
    F.views[a][...] = rng.standard_normal(F.views[a].shape)
    assert pair.memo_holds(F)
    mp.pair_second(pair, F.data, F.offsets, Z, out_b)
    assert rel_err(out_b, dense_mttkrp(shape, coords, values, F.views, b)) < 1e-12
    F.views[1][-1, 3] += 1.0  # another mode's may not
    assert not pair.memo_holds(F)
    with pytest.raises(ValueError, match="mode pair"):
        mp.mode_pair(c, v, shape, nmodes - 1, 1)

    # (i_0, i_N-1) from 100 joint values, (i_1, i_2) from 200: those pairs are few, the others
    # many; the wrap pair (N - 1, 0) adds a pair to the sweep's own
    nnz = 8000
    j1, j2 = rng.integers(0, 100, nnz), rng.integers(0, 200, nnz)
    cols = {0: j1, 1: j2 % 20, 2: j2 // 20, 3: rng.integers(0, 500, nnz), 4: j2}
    lengths = {0: 300, 1: 20, 2: 10, 3: 500, 4: 200}
    inner = [4] if nmodes == 3 else [1, 2] + ([3] if nmodes == 5 else [])
    coords = np.column_stack([cols[0]] + [cols[m] for m in inner] + [(j1 * 7919) % 1000])
    shape = tuple([300] + [lengths[m] for m in inner] + [1000])
    coords = np.unique(coords, axis=0)
    own = [] if nmodes == 3 else [(1, 2)]
    assert mp.choose_pairs(coords, shape) == own
    assert mp.choose_pairs(coords, shape, wrap=True) == own + [(nmodes - 1, 0)]
    # ... but not where its distinct pairs are more than WRAP_GROUPS_MAX of the nonzeros
    spread = coords.copy()
    spread[:, nmodes - 1] = rng.integers(0, 1000, len(spread))
    spread = np.unique(spread, axis=0)
    assert mp.pair_fraction(spread, shape, nmodes - 1, 0) > mp.WRAP_GROUPS_MAX
    assert mp.choose_pairs(spread, shape, wrap=True) == mp.choose_pairs(spread, shape)


def test_wrap_pair_replaces_one_where_it_saves_more_and_its_rows_stay_cached(rng):
    """Where (3, 0) only replaces (2, 3), it is taken at a known rank whose gathered rows (modes 1
    and 2) fit WRAP_TIE_ROWS_BYTES and where it has fewer distinct pairs; else (2, 3) stays."""
    nnz = 20_000
    shape = (50, 400, 300, 6)
    coords = np.column_stack(
        [rng.integers(0, 50, nnz), rng.integers(0, 400, nnz), rng.integers(0, 300, nnz), rng.integers(0, 6, nnz)]
    )
    coords = np.unique(coords, axis=0)
    f23, f30 = mp.pair_fraction(coords, shape, 2, 3), mp.pair_fraction(coords, shape, 3, 0)
    assert f30 < f23 <= mp.PAIR_GROUPS_MAX and f30 <= mp.WRAP_GROUPS_MAX
    assert mp.choose_pairs(coords, shape, wrap=True) == [(2, 3)]  # rank not known
    assert mp.choose_pairs(coords, shape, wrap=True, rank=8) == [(3, 0)]
    big = mp.WRAP_TIE_ROWS_BYTES // (8 * (400 + 300)) + 1
    assert mp.choose_pairs(coords, shape, wrap=True, rank=big) == [(2, 3)]
    assert mp.choose_pairs(coords, shape, rank=8) == [(2, 3)]  # no wrap asked
    # (2, 3) with fewer distinct pairs than the wrap keeps its place
    few = coords.copy()
    few[:, 2] %= 20
    few = np.unique(few, axis=0)
    assert mp.pair_fraction(few, shape, 2, 3) < mp.pair_fraction(few, shape, 3, 0)
    assert mp.choose_pairs(few, shape, wrap=True, rank=8) == [(2, 3)]


def test_results_do_not_depend_on_the_thread_count(rng):
    shape, coords, values, t = _tensor(rng, 4, 20_000)
    c, v = mp.item_nonzeros(tensor_items(t), t.layout)
    pair = mp.mode_pair(c, v, shape, 1, 2, groups_max=1.0)
    F = StackedFactors.from_list([rng.standard_normal((s, 16)) for s in shape])
    got = []
    for threads in (1, 2):
        with numba_threads(threads):
            Z = np.empty((pair.groups, 16))
            oa, ob, oc = np.zeros((shape[1], 16)), np.zeros((shape[2], 16)), np.zeros((shape[2], 16))
            mp.pair_first(pair, F.data, F.offsets, Z, oa)
            mp.pair_second(pair, F.data, F.offsets, Z, ob, slices=False)
            mp.pair_second(pair, F.data, F.offsets, Z, oc, slices=True)
            got.append((oa, ob, oc))
    for x, y in zip(*got):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("nmodes,rank", [(n, r) for n in (3, 4, 5, 6) for r in (8, 16)])
def test_a_mode_outside_a_pair_from_its_copy_matches_einsum_at_any_thread_count(rng, nmodes, rank):
    shape, coords, values, t = _tensor(rng, nmodes, 6000)
    c, v = mp.item_nonzeros(tensor_items(t), t.layout)
    F = StackedFactors.from_list([rng.standard_normal((s, rank)) for s in shape])
    a = int(rng.integers(0, nmodes - 1))
    pair = mp.mode_pair(c, v, shape, a, a + 1, groups_max=1.0)
    for m in pair.others:
        ref = dense_mttkrp(shape, coords, values, F.views, m)
        got = []
        for threads in (1, 2):
            with numba_threads(threads):
                out = np.zeros((shape[m], rank))
                mp.pair_other(pair, F.data, F.offsets, int(m), out)
                got.append(out)
        assert rel_err(got[0], ref) < 1e-12 and np.array_equal(got[0], got[1])
        # rows from out_lo only (a partition's share of the mode)
        lo = int(rng.integers(0, shape[m]))
        part = np.zeros((shape[m] - lo, rank))
        mp.pair_other(pair, F.data, F.offsets, int(m), part, lo)
        assert rel_err(part, ref[lo:]) < 1e-12


def test_a_mode_outside_the_pairs_runs_from_a_copy_only_where_it_fits(rng):
    shape, coords, values, t = _tensor(rng, 4, 6000)
    c, v = mp.item_nonzeros(tensor_items(t), t.layout)
    pair = mp.mode_pair(c, v, shape, 2, 3, groups_max=1.0)
    rows = shape[0]
    assert not mp.other_fits(pair, 2, rows, 8)  # a mode of the pair itself
    assert not mp.other_fits(pair, 0, rows, 12)  # a rank compiled at run time
    fits = mp.OTHER_SLICES * rows * mp.OTHER_NNZ_PER_ROW <= pair.nnz
    assert mp.other_fits(pair, 0, rows, 8) == fits
    assert not mp.other_fits(pair, 0, mp.OTHER_OUTPUT_BYTES_MAX // 64 + 1, 8)  # slice outputs too large


def test_distinct_pairs_counted_by_flags_or_by_sorting_agree(rng, monkeypatch):
    shape = (int(rng.integers(50, 300)), int(rng.integers(50, 300)), 9)
    coords, _ = random_coo(rng, shape, 4000)
    want = [np.unique(coords[:, [a, b]], axis=0).shape[0] / coords.shape[0] for a, b in ((0, 1), (1, 2), (2, 0))]
    flags = [mp.pair_fraction(coords, shape, a, b) for a, b in ((0, 1), (1, 2), (2, 0))]
    monkeypatch.setattr(mp, "PAIR_BITMAP_MAX", 0)  # 8 flags a nonzero at most: every pair here sorts
    monkeypatch.setattr(np, "count_nonzero", None)  # (and the flags are not counted)
    sorted_ = [mp.pair_fraction(coords[:20], shape, a, b) for a, b in ((0, 1), (1, 2), (2, 0))]
    assert flags == want
    assert sorted_ == [np.unique(coords[:20, [a, b]], axis=0).shape[0] / 20 for a, b in ((0, 1), (1, 2), (2, 0))]


def test_pairs_are_chosen_where_they_are_few(rng):
    # modes 2 and 3 take 6 distinct pairs over 4000 nonzeros; modes 0 and 1 are spread wide
    nnz = 4000
    combos = np.array([[0, 1], [3, 2], [5, 0], [1, 1], [7, 3], [2, 0]])
    pick = combos[rng.integers(0, len(combos), nnz)]
    coords = np.column_stack([rng.integers(0, 500, nnz), rng.integers(0, 400, nnz), pick])
    coords = np.unique(coords, axis=0)
    shape = (500, 400, 8, 4)
    assert mp.pair_fraction(coords, shape, 2, 3) == 6 / coords.shape[0]
    assert mp.choose_pairs(coords, shape) == [(2, 3)]
    values = rng.standard_normal(coords.shape[0])
    assert mp.mode_pair(coords, values, shape, 0, 1) is None  # too many pairs to pay
    assert mp.mode_pair(coords, values, shape, 2, 3).groups == 6
    assert mp.choose_pairs(coords[:, :2], shape[:2]) == []  # order 2: nothing to memoize
    with pytest.raises(ValueError, match="mode pair"):
        mp.mode_pair(coords, values, shape, 2, 1)


def _paired_store(rng, tmp_path, nmodes):
    """A store whose last two modes take few distinct pairs (so they are memoized)."""
    shape = (60, 150, 40, 7, 5)[:nmodes] if nmodes > 3 else (300, 9, 7)
    coords, values, store = paired_store(rng, tmp_path / f"p{nmodes}.zarr", shape, 30_000)
    return shape, coords, values, store


@pytest.mark.parametrize("nmodes,outside", [(n, o) for n in (3, 4, 5) for o in ("copies", "pairs")])
def test_partition_pairs_and_a_sweep_task_carry_the_memo(tmp_path, rng, monkeypatch, nmodes, outside):
    from tensorflow_ooc.execution import graph, pair_tasks
    from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition

    # the modes outside every pair: their mode-sorted copies, or a pair's copy (every small mode
    # fits once no nonzeros are asked a slice output row)
    others = []
    if outside == "pairs":
        monkeypatch.setattr(mp, "OTHER_NNZ_PER_ROW", 0)
        real_other = pair_tasks.pair_other
        monkeypatch.setattr(pair_tasks, "pair_other", lambda *a: others.append(a[3]) or real_other(*a))
    shape, coords, values, store = _paired_store(rng, tmp_path, nmodes)
    part = plan_partitions(store, 1, None)[0]
    data = load_partition(store.path, part, mode_copies=True, threads=2, mode_pairs=True)
    # orders 4 and 5 also have few (i_N-1, i_0): with (1, 2) and (2, 3) two pairs, one of them
    # across sweeps, where the sweep's own neighbours make one
    want = {3: [(1, 2)], 4: [(1, 2), (3, 0)], 5: [(2, 3), (4, 0)]}[nmodes]
    assert sorted({(p.a, p.b) for p in data.mode_pairs.values()}) == want
    for a, b in want:
        assert data.mode_pairs[a] is data.mode_pairs[b] and a not in data.mode_items and b not in data.mode_items
    R = 8
    F = StackedFactors.from_list([rng.standard_normal((s, R)) for s in shape])
    for m in range(nmodes):  # each mode as its own task (no memo)
        p = mttkrp_partition(data, F, m, threads=2)
        assert rel_err(p.rows, dense_mttkrp(shape, coords, values, F.views, m)[p.lo : p.lo + len(p.rows)]) < 1e-12
    outside_modes = [m for m in range(nmodes) if m not in data.mode_pairs]
    assert others == (outside_modes if outside == "pairs" else [])

    # a sweep task: each update replaces the mode's rows, as CP-ALS does; every mode's MTTKRP must
    # be the one of the factors as they are at its step
    firsts = []
    real_first = pair_tasks.pair_first
    monkeypatch.setattr(pair_tasks, "pair_first", lambda *args: firsts.append(args[4] is None) or real_first(*args))
    seen = []

    def update(state, partials, mode, *args):
        (p,) = partials
        ref = dense_mttkrp(shape, coords, values, state.views, mode)
        seen.append((mode, rel_err(p.rows, ref[p.lo : p.lo + len(p.rows)])))
        state.views[mode][...] = rng.standard_normal(state.views[mode].shape)
        return state

    steps = tuple((m, ()) for m in range(nmodes))
    for sweep in range(2):
        firsts.clear()
        graph._modes_then(update, data, F, steps, None, 2, 1 << 16, "cpu", None, 256 << 20, False)
        assert [m for m, _ in seen[sweep * nmodes :]] == list(range(nmodes)) and max(e for _, e in seen) < 1e-12
        # one memo pass a pair, its second mode read it (the wrap pair's from the task before:
        # the first sweep's from the modes' own tasks above, made from the same factors)
        assert firsts == [False] * len(want)
    if nmodes > 3:
        # another factor of modes 1 .. N - 2 than the wrap pair's memo was made from: mode 0 fills it again
        F.views[2][0] += 1.0
        firsts.clear()
        p = mttkrp_partition(data, F, 0, threads=2)
        assert firsts == [True]
        assert rel_err(p.rows, dense_mttkrp(shape, coords, values, F.views, 0)[p.lo : p.lo + len(p.rows)]) < 1e-12
        firsts.clear()
        mttkrp_partition(data, F, 0, threads=2)
        assert firsts == []  # ... and keeps what it made it from


def test_cp_als_in_memory_with_pairs_equals_streaming(tmp_path, rng, monkeypatch):
    from tensorflow_ooc.execution import graph, pair_tasks

    shape, coords, values, store = _paired_store(rng, tmp_path, 4)
    modes = []
    real = graph.pair_partition
    monkeypatch.setattr(graph, "pair_partition", lambda src, F, mode, *a: modes.append(mode) or real(src, F, mode, *a))
    firsts = []
    real_first = pair_tasks.pair_first
    monkeypatch.setattr(pair_tasks, "pair_first", lambda *args: firsts.append(args[4] is None) or real_first(*args))
    r = tfo.cp_als(store, 8, seed=3, max_iters=5, tol=0, execution="in-memory")
    assert r.params["memory_plan"]["mode_pairs"]
    # pairs (1, 2) and (3, 0): every mode ran through a memo; mode 0 filled its own only in the
    # first sweep, then read the one mode 3 made the sweep before
    assert modes == [0, 1, 2, 3] * 5
    assert firsts == [True] + [False, False] * 5
    s = tfo.cp_als(store, 8, seed=3, max_iters=5, tol=0, execution="streaming")
    assert not s.params["memory_plan"]["mode_pairs"]
    assert abs(r.fit - s.fit) < 1e-10
    for x, y in zip(r.factors, s.factors):
        np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-10)


def test_cp_als_with_a_mode_outside_the_pairs_from_a_pairs_copy_equals_streaming(tmp_path, rng, monkeypatch):
    from tensorflow_ooc.execution import pair_tasks

    shape, coords, values, store = _paired_store(rng, tmp_path, 5)  # pairs (2, 3) and (4, 0)
    monkeypatch.setattr(mp, "OTHER_NNZ_PER_ROW", 0)
    outside = []
    real = pair_tasks.pair_other
    monkeypatch.setattr(pair_tasks, "pair_other", lambda *a: outside.append(a[3]) or real(*a))
    r = tfo.cp_als(store, 8, seed=5, max_iters=4, tol=0, execution="in-memory")
    assert r.params["memory_plan"]["mode_pairs"] and outside == [1] * 4
    s = tfo.cp_als(store, 8, seed=5, max_iters=4, tol=0, execution="streaming")
    assert abs(r.fit - s.fit) < 1e-10
    for x, y in zip(r.factors, s.factors):
        np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-10)
