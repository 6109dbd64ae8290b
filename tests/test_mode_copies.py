"""A store's mode-sorted copies: streamed MTTKRP through them, their binding, and what keeps them."""

import json

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import CorruptStoreError
from tensorflow_ooc.execution.mode_copies_build import build_mode_copies
from tensorflow_ooc.execution.sorted_stream import copy_for, sorted_batches
from tensorflow_ooc.kernels import StackedFactors


def _store(rng, tmp_path, nmodes, name="t.zarr", compression="fast", nnz=3000):
    # short modes beside longer ones: several rows a run in the short ones, 1-2 in the long ones
    shape = tuple(int(s) for s in rng.integers(3, 9, nmodes))
    shape = shape[:-1] + (int(rng.integers(1000, 2000)),)
    coords, values = random_coo(rng, shape, nnz)
    store = tfo.convert((coords, values), tmp_path / name, shape=shape, chunk_nnz=512, compression=compression)
    return store, coords, values, shape


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_streamed_mttkrp_through_sorted_copies_matches_einsum(rng, tmp_path, nmodes):
    store, coords, values, shape = _store(rng, tmp_path, nmodes)
    store = build_mode_copies(store, "all")
    assert store.copy_modes() == list(range(nmodes))
    R = int(rng.choice([3, 8, 16]))
    factors = [rng.standard_normal((s, R)) for s in shape]
    for m in range(nmodes):
        copy = copy_for(store, m)
        # every mode of these tensors has runs of 4 or more (the short modes), but the long last
        # one: it streams its ALTO chunks whatever it keeps
        if m < nmodes - 1:
            assert copy is not None
            batches = list(sorted_batches(store, copy, 0, store.nchunks))
            assert len(batches) == store.nchunks > 1 and all(b.sorted_mode == m for b in batches)
            # each item's nonzeros sorted by the mode's row, and the chunk holding the store's
            for b in batches:
                for s, e in zip(b.start, b.end):
                    rows = (b.index[s:e] >> np.uint64(store.layout.field_shift[m])) & store.layout.field_mask[m]
                    assert np.all(np.diff(rows.astype(np.int64)) >= 0)
        for threads in (1, 2):
            got = tfo.mttkrp(store, StackedFactors.from_list(factors), m, threads=threads)
            assert rel_err(got, dense_mttkrp(shape, coords, values, factors, m)) < 1e-12


def test_a_store_with_copies_gives_the_results_of_one_without(rng, tmp_path, two_workers):
    store, coords, values, shape = _store(rng, tmp_path, 4, nnz=4000)
    plain = tfo.convert((coords, values), tmp_path / "plain.zarr", shape=shape, chunk_nnz=512)
    store = build_mode_copies(store, "all")
    R = 5
    init = [rng.random((s, R)) for s in shape]
    kw = dict(init=init, max_iters=4, tol=0, execution="streaming", partitions=2)
    with_copies = tfo.cp_als(store, R, client=two_workers, **kw)
    without = tfo.cp_als(plain, R, client=two_workers, **kw)
    # the short modes' copies always; the long mode's where its runs happen to be long enough
    read = [m for m in range(4) if copy_for(store, m) is not None]
    assert read[:3] == [0, 1, 2]
    assert with_copies.params["memory_plan"]["streamed_copies"] == read
    assert without.params["memory_plan"]["streamed_copies"] == []
    assert abs(with_copies.fit - without.fit) < 1e-10
    for a, b in zip(with_copies.factors, without.factors):
        assert rel_err(a, b) < 1e-9
    one = tfo.cp_als(store, R, **{**kw, "partitions": 1})
    assert abs(one.fit - with_copies.fit) < 1e-10


def test_an_edited_copy_is_refused(rng, tmp_path):
    store, *_ = _store(rng, tmp_path, 3)
    store = build_mode_copies(store, [0])
    root = tmp_path / "t.zarr" / "sorted"
    # a chunk's bytes changed: its CRC32C fails the first read
    chunk = root / "m0" / "index" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[8] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="CRC32C"):
        list(sorted_batches(store, copy_for(tfo.open_store(store.path), 0), 0, store.nchunks))
    # two chunks swapped (each its own CRC32C intact): refused by position
    build_mode_copies(store, [0])
    a, b = root / "m0" / "value" / "c" / "0", root / "m0" / "value" / "c" / "2"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    with pytest.raises(CorruptStoreError, match="does not belong"):
        list(sorted_batches(store, copy_for(tfo.open_store(store.path), 0), 0, store.nchunks))
    # the metadata edited: refused at open
    build_mode_copies(store, [0])
    meta_file = root / "zarr.json"
    meta = json.loads(meta_file.read_text())
    meta["attributes"]["mode_copies"]["modes"]["0"]["runs"] += 1
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(CorruptStoreError, match="edited"):
        tfo.open_store(store.path).mode_copies  # noqa: B018


def test_copies_of_another_store_are_refused(rng, tmp_path):
    store, coords, values, shape = _store(rng, tmp_path, 3)
    build_mode_copies(store, [0, 1])
    # the same nonzeros written again: another store id, so the copies moved over are not its own
    other = tfo.convert((coords, values), tmp_path / "o.zarr", shape=shape, chunk_nnz=512)
    (tmp_path / "t.zarr" / "sorted").rename(tmp_path / "o.zarr" / "sorted")
    with pytest.raises(CorruptStoreError, match="another store"):
        tfo.open_store(other.path).mode_copies  # noqa: B018


def test_auto_keeps_the_modes_whose_runs_pay_and_info_reports_them(rng, tmp_path):
    store, *_ = _store(rng, tmp_path, 3)
    store = build_mode_copies(store)
    # the short modes pay (runs of 4 and more); the long one (1000-2000 rows, 512-nonzero chunks) not
    assert store.copy_modes() == [0, 1]
    info = store.info()["mode_copies"]
    assert sorted(info) == ["0", "1"] and all(v["bytes_per_nnz"] >= 16 for v in info.values())
    assert all(v["mean_run"] >= 4 for v in info.values())


def test_rewrite_and_append_keep_or_drop_the_copies(rng, tmp_path):
    store, coords, values, shape = _store(rng, tmp_path, 3)
    store = build_mode_copies(store, [0, 2])
    new = tfo.rewrite(store, tmp_path / "r.zarr", compression="none")
    assert new.copy_modes() == [0, 2]
    factors = [rng.standard_normal((s, 4)) for s in shape]
    for m in (0, 2):
        assert rel_err(tfo.mttkrp(new, factors, m), dense_mttkrp(shape, coords, values, factors, m)) < 1e-12
    # the store written again in place (an appended version, overwrite): its copies go with it
    more, more_values = random_coo(rng, shape, 200)
    both = np.concatenate([coords, more]), np.concatenate([values, more_values])
    keep = np.unique(both[0], axis=0, return_index=True)[1]
    appended = tfo.convert((both[0][keep], both[1][keep]), store.path, shape=shape, chunk_nnz=512, overwrite=True)
    assert appended.copy_modes() == []
    assert tfo.rewrite(appended, tmp_path / "r2.zarr").copy_modes() == []


def test_the_cli_writes_reports_and_drops_the_copies(rng, tmp_path, capsys):
    from tensorflow_ooc.cli import main

    store, *_ = _store(rng, tmp_path, 3)
    assert main(["info", store.path]) == 0
    assert "mode copies  none" in capsys.readouterr().out
    assert main(["mode-copies", store.path, "--modes", "0,2"]) == 0
    assert "mode 0" in capsys.readouterr().out and tfo.open_store(store.path).copy_modes() == [0, 2]
    assert main(["info", store.path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["mode_copies"]
    assert sorted(info) == ["0", "2"]
    assert main(["mode-copies", store.path, "--drop"]) == 0
    assert tfo.open_store(store.path).copy_modes() == []
