"""Mode-sorted work items (kernels/mttkrp/mode_order.py): a stable sort of each item by one mode's index,
and MTTKRP on them (the runs kernels) against a dense einsum, every mode, orders 3-6."""

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.kernels import StackedFactors, tensor_items
from tensorflow_ooc.kernels.mttkrp import mode_order
from tensorflow_ooc.kernels.mttkrp.cpu import kernel_for
from tensorflow_ooc.kernels.mttkrp.dispatch import ThreadOutputs, numba_threads, run_items
from tensorflow_ooc.kernels.mttkrp.mode_order import mode_sorted
from tensorflow_ooc.kernels.mttkrp.plan import RUN_LENGTH_MIN


def _field(index, layout, mode):
    return (index >> np.uint64(layout.field_shift[mode])) & np.uint64(layout.field_mask[mode])


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_each_item_is_stably_sorted_by_the_mode(rng, nmodes):
    shape = tuple(int(s) for s in rng.integers(3, 40 if nmodes < 5 else 9, nmodes))
    coords, values = random_coo(rng, shape, 3000)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=700)
    items = tensor_items(t)
    for mode in range(nmodes):
        s = mode_sorted(items, t.layout, mode, run_min=0)
        assert s.sorted_mode == mode and s.nitems == items.nitems
        np.testing.assert_array_equal(s.lo, items.lo)
        np.testing.assert_array_equal(s.hi, items.hi)
        for a, b in zip(items.start.tolist(), items.end.tolist()):
            order = np.argsort(_field(items.index[a:b], t.layout, mode), kind="stable")
            np.testing.assert_array_equal(s.index[a:b], items.index[a:b][order])
            np.testing.assert_array_equal(s.values[a:b], items.values[a:b][order])
        # a run per distinct target row and item
        fields = _field(s.index, t.layout, mode)
        for k, (a, b) in enumerate(zip(items.start.tolist(), items.end.tolist())):
            assert s.changes[k, mode] == np.unique(fields[a:b]).size
        # the run table: every run one item's one target row, back to back, covering the item
        ptr, rows, run_item = _forced_table(s, t.layout, mode)
        assert ptr[0] == items.start[0] and ptr[-1] == items.end[-1] and (np.diff(ptr) > 0).all()
        assert rows.size == s.changes[:, mode].sum()
        for r in range(rows.size):
            k = run_item[r]
            assert items.start[k] <= ptr[r] < ptr[r + 1] <= items.end[k]
            absolute = fields[ptr[r] : ptr[r + 1]].astype(np.int64) + items.base[k, mode]
            assert (absolute == rows[r]).all()


def _forced_table(items, layout, mode):
    """The run table of a mode-sorted copy however many runs it has (tests' copies have many)."""
    old = mode_order.RUN_TABLE_MAX_FRACTION
    mode_order.RUN_TABLE_MAX_FRACTION = 1.0
    try:
        return mode_order.run_table(items, layout, mode)
    finally:
        mode_order.RUN_TABLE_MAX_FRACTION = old


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
@pytest.mark.parametrize("rank", [1, 7, 16, 33])
def test_mttkrp_on_sorted_items_against_einsum(rng, nmodes, rank):
    shape = tuple(int(s) for s in rng.integers(2, 13 if nmodes < 6 else 7, nmodes))
    coords, values = random_coo(rng, shape, 1500)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=500)
    factors = [rng.standard_normal((s, rank)) for s in shape]
    stacked = StackedFactors.from_list(factors)
    for mode in range(nmodes):
        ref = dense_mttkrp(shape, coords, values, factors, mode)
        s = mode_sorted(tensor_items(t), t.layout, mode, run_min=0)
        for conflict in ("auto", "private", "atomic"):
            out = np.zeros((shape[mode], rank))
            plan = run_items(s, t.layout, stacked, mode, out, conflict=conflict)
            # sorted items sum runs, except an item whose runs are too short to pay (a small last item)
            long = s.nnz >= RUN_LENGTH_MIN * np.maximum(s.changes[:, mode], 1)
            assert long.any() and plan.runs[long].all(), (mode, conflict, s.nnz, s.changes[:, mode])
            assert rel_err(out, ref) < 1e-12, (mode, conflict)
        # runs into per-thread whole outputs, 1-3 threads: over the items (runs_threads kernel)
        # and over the copy's run table (table_threads, fixed and padded ranks)
        table = _forced_table(s, t.layout, mode)
        for s.runs in (None, table):
            for threads in (1, 2, 3):
                with numba_threads(threads):
                    out = np.zeros((shape[mode], rank))
                    shared = ThreadOutputs(out, threads)
                    plan = run_items(s, t.layout, stacked, mode, out, thread_outputs=shared)
                    shared.merge()
                assert not plan.private.any()
                assert rel_err(out, ref) < 1e-12, (mode, threads, s.runs is None)
    if rank == 16:  # a fixed rank: the table kernel ran
        assert kernel_for(nmodes, 16).table_threads._ready


def test_public_mttkrp_keeps_copies_only_where_runs_pay(rng):
    """Mode 0 is long (runs of about one nonzero), modes 1 and 2 short: only they get copies, and
    every mode's result still equals the reference."""
    shape = (20_000, 4, 5)
    coords, values = random_coo(rng, shape, 20_000)
    t = tfo.encode_coo(coords, values, shape)
    factors = [rng.standard_normal((s, 16)) for s in shape]
    for mode in range(3):
        got = tfo.mttkrp(t, factors, mode)
        assert rel_err(got, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12
    assert tensor_items(t, 0) is tensor_items(t)  # no copy kept for the long mode
    assert tensor_items(t, 1).sorted_mode == 1 and tensor_items(t, 2).sorted_mode == 2


def test_sorted_items_take_per_thread_outputs_only_where_they_move_less(rng):
    from tensorflow_ooc.kernels.mttkrp.plan import work_items

    shape = (50, 6, 7)
    coords, values = random_coo(rng, shape, 2100)
    t = tfo.encode_coo(coords, values, shape)
    s = mode_sorted(tensor_items(t), t.layout, 0, run_min=0)
    out = np.zeros((50, 16))
    with numba_threads(2):
        # one item spanning the mode's 50 rows: its private rows (50) are fewer than 2 copies (100)
        assert ThreadOutputs.for_sorted(out, s, 0, 1 << 30) is None
        # the same nonzeros cut into many items: their intervals add up past two whole outputs
        b = t.blocks
        small = work_items(t.index, t.values, b.start, b.start + b.count, b.base, t.layout, item_nnz=64)
        shared = ThreadOutputs.for_sorted(out, mode_sorted(small, t.layout, 0, run_min=0), 0, 1 << 30)
        assert shared is not None and shared.threads == 2
        assert ThreadOutputs.for_sorted(out, mode_sorted(small, t.layout, 0, run_min=0), 0, 0) is None  # bound


def test_in_memory_items_in_alto_order_take_per_thread_outputs_at_any_length(rng):
    """Decoded in-memory items without a copy for the mode (runs too short for one) add into
    per-thread outputs however short the output; a streamed pass (items not known) keeps the
    length bar; either way the MTTKRP equals the dense reference, 1-3 threads."""
    from tensorflow_ooc.kernels.mttkrp.dispatch import THREAD_OUTPUT_MIN_ROWS

    shape = (300, 40, 3)
    coords, values = random_coo(rng, shape, 6000)
    t = tfo.encode_coo(coords, values, shape)
    factors = [rng.standard_normal((s, 8)) for s in shape]
    assert tensor_items(t, 0) is tensor_items(t)  # runs of 1-2 nonzeros: no copy
    out = np.zeros((shape[0], 8))
    assert shape[0] < THREAD_OUTPUT_MIN_ROWS
    with numba_threads(2):
        shared = ThreadOutputs.for_items(out, tensor_items(t), 0, 6000, 1 << 30)
        assert shared is not None and shared.threads == 2
        assert ThreadOutputs.for_items(out, None, 0, 6000, 1 << 30) is None  # streamed
        assert ThreadOutputs.for_items(out, tensor_items(t), 0, 6000, 0) is None  # over the byte bound
    ref = dense_mttkrp(shape, coords, values, factors, 0)
    for threads in (1, 2, 3):
        assert rel_err(tfo.mttkrp(t, factors, 0, threads=threads), ref) < 1e-12


def test_partition_with_mode_copies_matches_without(tmp_path, rng):
    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition

    shape = (30, 8, 400, 6)
    coords, values = random_coo(rng, shape, 30_000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=4096)
    part = plan_partitions(store, 1, None)[0]
    plain = load_partition(store.path, part)
    copies = load_partition(store.path, part, mode_copies=True, threads=2)
    assert not plain.mode_items and set(copies.mode_items) <= set(range(4)) and copies.mode_items
    assert copies.nbytes > plain.nbytes
    factors = StackedFactors.from_list([rng.standard_normal((s, 16)) for s in shape])
    for mode in range(4):
        a = mttkrp_partition(plain, factors, mode, threads=2)
        b = mttkrp_partition(copies, factors, mode, threads=2)
        ref = dense_mttkrp(shape, coords, values, factors.views, mode)
        assert rel_err(a.rows, ref[a.lo : a.lo + a.rows.shape[0]]) < 1e-12
        assert rel_err(b.rows, ref[b.lo : b.lo + b.rows.shape[0]]) < 1e-12


def test_cp_als_in_memory_uses_mode_copies(tmp_path, rng):
    shape = (40, 6, 300)
    coords, values = random_coo(rng, shape, 20_000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=4096)
    r = tfo.cp_als(store, 5, seed=1, max_iters=6, tol=0, execution="in-memory")
    assert r.params["memory_plan"]["mode_copies"]
    s = tfo.cp_als(store, 5, seed=1, max_iters=6, tol=0, execution="streaming")
    assert not s.params["memory_plan"]["mode_copies"]
    assert abs(r.fit - s.fit) < 1e-10
    for a, b in zip(r.factors, s.factors):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def test_an_in_memory_tensor_keeps_what_the_kernels_derive_from_it(rng, monkeypatch):
    import importlib

    from tensorflow_ooc.kernels.ttm import as_layouts

    dispatch = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")  # the package's name is a function
    shape = (20, 30, 40)
    coords, values = random_coo(rng, shape, 2000)
    t = tfo.encode_coo(coords, values, shape)
    monkeypatch.setattr(dispatch, "copies_fit", lambda items, nmodes: True)
    items = tensor_items(t)
    assert tensor_items(t) is items and as_layouts(t) is as_layouts(t)
    copy = tensor_items(t, 1)
    assert copy is not items and copy.sorted_mode == 1 and tensor_items(t, 1) is copy
    # kept in the tensor's own declared field: nothing else is set on it from outside
    assert set(vars(t)) == {"layout", "index", "values", "blocks", "_derived"}


def test_small_modes_read_the_alto_order_where_a_larger_mode_does(tmp_path, rng, monkeypatch):
    """A long mode whose runs are too short for a copy reads the ALTO-ordered items; the small
    modes then read them too (no copy), and every mode's result equals the reference."""
    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition

    shape = (3000, 300, 6)
    coords, values = random_coo(rng, shape, 6000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=2048)
    part = plan_partitions(store, 1, None)[0]
    data = load_partition(store.path, part, mode_copies=True, threads=2)
    assert not data.mode_items
    # alone, the 6-row mode's runs pay for a copy
    assert mode_sorted(data.items, store.layout, 2) is not None
    factors = StackedFactors.from_list([rng.standard_normal((s, 16)) for s in shape])
    for mode in range(3):
        got = mttkrp_partition(data, factors, mode, threads=2)
        ref = dense_mttkrp(shape, coords, values, factors.views, mode)
        assert rel_err(got.rows, ref[got.lo : got.lo + got.rows.shape[0]]) < 1e-12
    # modes of at most ALTO_ORDER_ROWS_MAX rows, or whose output fits ALTO_ORDER_OUTPUT_BYTES (at
    # the rank, or at ALTO_ORDER_RANK), are copied after the others
    rows = mode_order.ALTO_ORDER_OUTPUT_BYTES // (8 * mode_order.ALTO_ORDER_RANK)
    top = mode_order.ALTO_ORDER_ROWS_MAX
    assert rows <= top
    assert mode_order.copy_order((30, 8, 400, 6), [0, 1, 2, 3]) == ([], [0, 1, 2, 3])
    assert mode_order.copy_order((top + 1, 300, top + 1), [0, 1, 2]) == ([0, 2], [1])
    assert mode_order.copy_order((top + 1, 300, top + 1), [1, 2]) == ([2], [1])
    assert mode_order.copy_order((top, 2 * top), [0, 1], 8) == ([], [0, 1])
    assert mode_order.copy_order((top, 2 * top), [0, 1], 100) == ([1], [0])
    assert mode_order.copy_order((top + 1, 2 * top), [0, 1], 32) == ([0, 1], [])
    # at rank 10 the 1500-row mode is small and reads the ALTO order with the 2000-row one (no
    # copy: short runs); at rank 64 it is large and keeps the copy its runs pay for
    shape = (2000, 1500, 4)
    coords, values = random_coo(rng, shape, 300_000)
    store = tfo.convert((coords, values), tmp_path / "u.zarr", shape=shape, chunk_nnz=1 << 17)
    part = plan_partitions(store, 1, None)[0]
    for rank, kept in ((10, []), (64, [1])):
        assert sorted(load_partition(store.path, part, mode_copies=True, threads=2, rank=rank).mode_items) == kept
    # a CP-ALS in memory passes its rank to the load (a rank other tests compile for)
    import tensorflow_ooc.execution.graph as graph

    load, ranks = graph.load_partition, []
    monkeypatch.setattr(graph, "load_partition", lambda *a: ranks.append(a[7]) or load(*a))
    tfo.cp_als(store, 4, seed=1, max_iters=2, tol=0, execution="in-memory")
    assert ranks == [4]
