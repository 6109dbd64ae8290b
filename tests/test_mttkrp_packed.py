"""32-bit packed work items (kernels/mttkrp/packed.py) against dense einsum, orders 3-6."""

import importlib

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.partitions import plan_partitions
from tensorflow_ooc.execution.tasks import load_partition, mttkrp_partition
from tensorflow_ooc.kernels import StackedFactors
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items

packed = importlib.import_module("tensorflow_ooc.kernels.mttkrp.packed")


def _coords_of(pk, nmodes):
    """Each nonzero's indices decoded from its piece's word, mask and smallest index."""
    out = np.zeros((pk.index.shape[0], nmodes), dtype=np.int64)
    for p in range(pk.start.shape[0]):
        words = pk.index[pk.start[p] : pk.end[p]].astype(np.uint64)
        for m in range(nmodes):
            mask = int(pk.masks[p, m])
            shift = (mask & -mask).bit_length() - 1 if mask else 0
            out[pk.start[p] : pk.end[p], m] = pk.lo[p, m] + ((words & np.uint64(mask)) >> np.uint64(shift)).astype(
                np.int64
            )
    return out


@pytest.mark.parametrize("bits", [6, 32])
@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_pieces_hold_every_nonzero_in_their_bits(rng, monkeypatch, nmodes, bits):
    """Pieces cut the items in order, cover every nonzero once, stay inside one item, and each
    word decodes to the nonzero's indices within ``bits`` bits (6: most items are cut)."""
    monkeypatch.setattr(packed, "PACKED_BITS", bits)
    shape = tuple(int(s) for s in rng.integers(2, 60 if nmodes < 5 else 12, nmodes))
    coords, values = random_coo(rng, shape, 1500)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=300)
    items = tensor_items(t)
    pk = packed.pack_items(items, t.layout)
    assert pk.values is items.values
    assert pk.start[0] == 0 and pk.end[-1] == items.values.shape[0]
    assert np.array_equal(pk.start[1:], pk.end[:-1]) and (pk.end > pk.start).all()
    assert set(items.start) <= set(pk.start)  # no piece crosses an item boundary
    widths = np.array([[bin(int(x)).count("1") for x in row] for row in pk.masks])
    assert (widths.sum(axis=1) <= bits).all()
    if bits < 32:
        assert pk.start.shape[0] > items.nitems
    # the words against the items' own decoded indices
    ref = np.zeros_like(coords)
    for k in range(items.nitems):
        x = items.index[items.start[k] : items.end[k]]
        for m in range(nmodes):
            f = (x >> np.uint64(t.layout.field_shift[m])) & np.uint64(t.layout.field_mask[m])
            ref[items.start[k] : items.end[k], m] = items.base[k, m] + f.astype(np.int64)
    assert np.array_equal(_coords_of(pk, nmodes), ref)


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_partition_passes_on_packed_items_against_einsum(tmp_path, rng, monkeypatch, nmodes):
    """In-memory partitions with copies keep the packed form where a mode has no copy; passes
    with per-thread outputs of those modes run on it (1 and 2 threads, pieces cut small so that
    items split), fixed ranks 8 and 16, against dense einsum."""
    K = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")
    monkeypatch.setattr(K, "PARALLEL_MIN_ENTRIES", 1)
    monkeypatch.setattr(packed, "PACKED_BITS", 5)
    T = importlib.import_module("tensorflow_ooc.execution.tasks")
    used = []
    real = T.run_packed
    monkeypatch.setattr(T, "run_packed", lambda *a: used.append(a[2]) or real(*a))
    shape = tuple(int(s) for s in rng.integers(8, 40 if nmodes < 5 else 10, nmodes))
    coords, values = random_coo(rng, shape, 2000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", chunk_nnz=256)
    part = plan_partitions(store, 1)[0]
    data = load_partition(store.path, part, mode_copies=True, threads=2)
    assert data.packed is not None and data.packed.start.shape[0] > data.items.nitems
    for rank in (8, 16):
        factors = [rng.standard_normal((s, rank)) for s in shape]
        stacked = StackedFactors.from_list(factors, np.float64)
        for mode in range(nmodes):
            ref = dense_mttkrp(shape, coords, values, factors, mode)
            for threads in (1, 2):
                got = mttkrp_partition(data, stacked, mode, threads)
                full = np.zeros_like(ref)
                full[got.lo : got.lo + got.rows.shape[0]] = got.rows
                assert rel_err(full, ref) < 1e-12, (rank, mode, threads)
    # every mode without a mode-sorted copy ran on the packed items
    assert set(used) == set(range(nmodes)) - set(data.mode_items)


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_in_memory_tensor_passes_on_packed_items_against_einsum(rng, monkeypatch, nmodes):
    """``tfo.mttkrp`` on an in-memory tensor runs modes without a kept copy on the tensor's packed
    pieces ("auto" with per-thread outputs), 1 and 2 threads, ranks 8 and 16, pieces cut small."""
    monkeypatch.setattr(packed, "PACKED_BITS", 5)
    D = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")
    used = []
    real = D.run_packed
    monkeypatch.setattr(D, "run_packed", lambda *a: used.append(a[2]) or real(*a))
    shape = tuple(int(s) for s in rng.integers(8, 40 if nmodes < 5 else 10, nmodes))
    coords, values = random_coo(rng, shape, 2000)
    t = tfo.encode_coo(coords, values, shape, max_block_nnz=500)
    for rank in (8, 16):
        factors = [rng.standard_normal((s, rank)) for s in shape]
        for mode in range(nmodes):
            ref = dense_mttkrp(shape, coords, values, factors, mode)
            for threads in (1, 2):
                stats = {}
                got = tfo.mttkrp(t, factors, mode, threads=threads, stats=stats)
                assert rel_err(got, ref) < 1e-12, (rank, mode, threads)
                assert stats["items"] == tensor_items(t).nitems
    assert used and t.derived("packed_items", lambda: None).start.shape[0] > tensor_items(t).nitems
