"""Building the fiber index: one decode of the store for every mode (entries in memory or spilled)
equals a build of each mode alone, heavy key ranges are split under the budget, the native shard
encoder writes the bytes numcodecs writes, and the build stays under its memory limit."""

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.format.fiber_keys import blocked_insert, bloom_words, key_strides
from tensorflow_ooc.ingest import fiber_index_build
from tensorflow_ooc.ingest.fiber_index_build import ENTRY_BYTES, RUN_BYTES, plan_rounds
from tensorflow_ooc.ingest.fiber_partitions import PARTITION_ENTRIES, FiberPartitions
from tensorflow_ooc.store.chunk_files import _crc32c as crc32c
from tensorflow_ooc.store.shard_encode import framed_chunks, framed_raw_chunks
from tensorflow_ooc.store.writer import encoded_chunk

ARRAYS = ("key", "row", "value", "first", "crc", "size", "bloom", "bloom_crc")


def _arrays(store_path, mode):
    group = zarr.open_group(str(Path(store_path) / "fibers" / f"m{mode}"), mode="r")
    return {name: group[name][...] for name in ARRAYS}


def _meta(store_path, mode):
    meta = json.loads((Path(store_path) / "fibers" / "zarr.json").read_text())["attributes"]["fiber_index"]
    return {k: v for k, v in meta["modes"][str(mode)].items() if k not in ("build_seconds", "arrays_checksum")}


def _spill_folders(path):
    return sorted(p.name for p in Path(path).parent.iterdir() if p.name.startswith(".fiber-index-spill"))


@pytest.mark.parametrize("codec", ["lz4hc", "lz4", "zstd", "noshuffle"])
def test_native_frames_equal_numcodecs(rng, codec):
    C = int(rng.choice([64, 1024]))
    n = int(rng.integers(1, 40))
    if codec == "lz4hc":
        data, delta = np.sort(rng.integers(0, 2**45, n * C, dtype=np.uint64)), True
        blosc = numcodecs.Blosc("lz4hc", 3, 1, 1 << 20, typesize=8)
    elif codec == "lz4":
        data, delta = rng.integers(0, 5000, n * C).astype(np.uint32), False
        blosc = numcodecs.Blosc("lz4", 5, 1, 1 << 20, typesize=4)
    elif codec == "zstd":
        data, delta = rng.standard_normal(n * C).round(1), False
        blosc = numcodecs.Blosc("zstd", 3, 1, 1 << 20, typesize=8)
    else:
        data, delta = rng.random(n * C), False
        blosc = numcodecs.Blosc("lz4", 5, 0, 1 << 20)
    payload, crcs, sizes = framed_chunks(data, C, delta, blosc)
    at = 0
    for j in range(n):
        want = encoded_chunk(data[j * C : (j + 1) * C], delta, blosc)
        want += int(crc32c(want)).to_bytes(4, "little")
        assert payload[at : at + sizes[j]].tobytes() == want
        assert crcs[j] == crc32c(want[:-4])
        at += sizes[j]
    assert at == payload.shape[0]


@pytest.mark.parametrize("delta", [False, True])
def test_native_raw_frames_equal_the_chunks_bytes(rng, delta):
    """Chunks stored without Blosc: each chunk's bytes (Delta'd per chunk when asked) and its
    CRC32C, as Zarr's chain writes them."""
    C = int(rng.choice([128, 1024]))
    n = int(rng.integers(1, 40))
    data = np.sort(rng.integers(0, 2**45, n * C, dtype=np.uint64)) if delta else rng.random(n * C)
    payload, crcs, sizes = framed_raw_chunks(data, C, delta)
    at = 0
    for j in range(n):
        want = encoded_chunk(data[j * C : (j + 1) * C], delta, None)
        want += int(crc32c(want)).to_bytes(4, "little")
        assert payload[at : at + sizes[j]].tobytes() == want
        assert crcs[j] == crc32c(want[:-4])
        at += sizes[j]
    assert at == payload.shape[0]


def _heavy_tensor(rng):
    # most nonzeros in one slice of mode 1: mode 0's keys (i1 * n2 + i2) crowd one key range
    shape = (int(rng.integers(30, 60)), int(rng.integers(30, 60)), int(rng.integers(30, 60)))
    coords, values = random_coo(rng, shape, 6000)
    coords[:4500, 1] = 0
    coords, first = np.unique(coords, axis=0, return_index=True)
    perm = rng.permutation(coords.shape[0])
    return coords[perm], values[first][perm], shape


def _heavy_store(tmp_path, rng, name):
    coords, values, shape = _heavy_tensor(rng)
    return tfo.convert((coords, values), tmp_path / name, shape=shape, chunk_nnz=1024)


def test_one_pass_build_equals_each_mode_built_alone(tmp_path, rng, caplog, monkeypatch):
    """All modes from one decode (in memory, spilled under a small budget with heavy key ranges
    split, one read of the store a mode, or some held and some spilled in one read) write the
    same arrays, tables and filters as each mode built on its own."""
    chunk_nnz = [64, 256, None][int(rng.integers(3))]  # None: chosen per mode, the same under any budget
    coords, values, shape = _heavy_tensor(rng)
    store, spilled, rounds, mixed, *alone = (
        tfo.convert((coords, values), tmp_path / name, shape=shape, chunk_nnz=1024)
        for name in ("all", "spilled", "rounds", "mixed", "alone0", "alone1", "alone2")
    )
    tfo.build_fiber_index(store, "all", chunk_nnz=chunk_nnz)
    for m, s in enumerate(alone):
        tfo.build_fiber_index(s, [m], chunk_nnz=chunk_nnz)
    # about 300 entries a sort: partitions spilled to files, the crowded one split by key range
    assert [(h, sp) for h, sp, _ in plan_rounds(spilled, [0, 1, 2], 112 * 300)] == [([], [0, 1, 2])]
    tfo.build_fiber_index(spilled, "all", chunk_nnz=chunk_nnz, memory_limit=112 * 300)
    # room for one mode's entries beside a partition's sort: one read of the store a mode
    one = PARTITION_ENTRIES * (ENTRY_BYTES + RUN_BYTES) + FiberPartitions.held_bytes(rounds, [0])
    one += 2 * rounds.nnz + 2 * rounds.chunk_nnz * (8 * 3 + 32)  # the filter and two chunks decoded
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tensorflow_ooc.ingest.fiber_index_build"):
        tfo.build_fiber_index(rounds, "all", chunk_nnz=chunk_nnz, memory_limit=one + rounds.nnz * 4)
    assert [r.args[2] for r in caplog.records if "store read" in r.getMessage()] == [[0], [1], [2]]
    # mode 1 held while modes 0 and 2 are spilled, in one read
    monkeypatch.setattr(fiber_index_build, "plan_rounds", lambda src, modes, budget: [([1], [0, 2], 400)])
    tfo.build_fiber_index(mixed, "all", chunk_nnz=chunk_nnz)
    assert _spill_folders(tmp_path / "x") == []  # the spill folders are gone
    coords, values = store.to_coo()
    for m in range(3):
        want = _arrays(store.path, m)
        for other in (alone[m].path, spilled.path, rounds.path, mixed.path):
            got = _arrays(other, m)
            for name in ARRAYS:
                assert np.array_equal(got[name], want[name]), (m, name)
            assert _meta(other, m) == _meta(store.path, m)
        # against a sort of to_coo: keys, rows, values, each fiber in store order
        keys = (coords.astype(np.uint64) * key_strides(store.shape, m)).sum(axis=1, dtype=np.uint64)
        order = np.argsort(keys, kind="stable")
        assert np.array_equal(want["key"], keys[order])
        assert np.array_equal(want["row"], coords[order, m])
        assert np.array_equal(want["value"], values[order])
        # the filter holds exactly the bits of the distinct keys
        distinct = np.unique(keys)
        words = np.zeros(max(64, bloom_words(distinct.shape[0])), dtype=np.uint64)
        blocked_insert(distinct, words)
        assert np.array_equal(want["bloom"], words)
        assert _meta(store.path, m)["fibers"] == distinct.shape[0]


def test_a_failed_build_leaves_no_spill_and_no_index(tmp_path, rng, monkeypatch):
    store = _heavy_store(tmp_path, rng, "s")
    from tensorflow_ooc.store import fiber_index

    def refuse(self, *a, **k):
        raise OSError("injected write failure")

    monkeypatch.setattr(fiber_index.ModeIndexWriter, "finish", refuse)
    with pytest.raises(OSError, match="injected"):
        tfo.build_fiber_index(store, "all", memory_limit=112 * 300)
    assert _spill_folders(tmp_path / "x") == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert tfo.open_store(store.path).fibers is None


_PEAK = textwrap.dedent(
    """
    import gc, json, sys
    import tensorflow_ooc as tfo
    from tensorflow_ooc.ingest.memory import trim

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    small, big, limit = sys.argv[1], sys.argv[2], sys.argv[3]
    tfo.build_fiber_index(small, "all", memory_limit=limit)  # compiled and loaded before the baseline
    store = tfo.open_store(big)
    gc.collect()
    trim()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from here
    before = rss("VmRSS:")
    tfo.build_fiber_index(store, "all", memory_limit=limit)
    print(json.dumps({"grew": rss("VmHWM:") - before}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS")
def test_the_build_stays_under_its_memory_limit(tmp_path, rng):
    """1 M nonzeros of 3 modes: 60 MB of entries held; under a 24 MB limit they are spilled and
    the process grows by about the limit, not by the entries."""
    shape = tuple(int(s) for s in rng.integers(200, 400, 3))
    coords = np.stack([rng.integers(0, s, 1_000_000) for s in shape], axis=1)
    coords = np.unique(coords, axis=0)
    coords = coords[rng.permutation(coords.shape[0])]
    values = rng.standard_normal(coords.shape[0])
    tfo.convert((coords, values), tmp_path / "big", shape=shape, chunk_nnz=1 << 16)
    tfo.convert((coords[:5000], values[:5000]), tmp_path / "small", shape=shape, chunk_nnz=1 << 16)
    limit = 24 << 20
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(tmp_path / "small"), str(tmp_path / "big"), str(limit)],
        capture_output=True,
        text=True,
        check=True,
    )
    grew = json.loads(out.stdout.strip().splitlines()[-1])["grew"]
    # the entries are 60 MB; past the limit the build holds fixed costs the plan does not count
    # (thread stacks, the spill and read-ahead threads' buffers, allocator arenas): 27-31 MiB
    # measured before the read-ahead, 29-32 after, so 12 MiB of slack, not 8 (a CI failure at 32.0)
    assert grew < limit + (12 << 20), f"the build grew by {grew / 2**20:.1f} MiB under a {limit >> 20} MiB limit"
    index = tfo.open_store(tmp_path / "big").fibers
    assert index is not None and index.modes == [0, 1, 2]
    assert _spill_folders(tmp_path / "x") == []


@pytest.mark.parametrize("span", [1000, 2**40, 2**60])
def test_sorting_a_partition_carries_rows_and_values_stably(rng, span):
    """Keys in [lo, lo + span) with ties: sorted with their rows and values as a stable argsort
    orders them (one word of key and position, or two past 64 bits)."""
    from tensorflow_ooc.format.radix_sort import stable_sort_by_key

    n = int(rng.integers(1000, 300000))
    lo = int(rng.integers(0, 2**62 - span))
    keys = (lo + rng.integers(0, span, n)).astype(np.uint64)
    keys[rng.integers(0, n, n // 3)] = keys[0]
    rows = rng.integers(0, 2**32, n).astype(np.uint32)
    values = rng.standard_normal(n)
    got = stable_sort_by_key(keys, lo, lo + span, rows, values)
    order = np.argsort(keys, kind="stable")
    for g, want in zip(got, (keys[order], rows[order], values[order])):
        assert g.dtype == want.dtype and np.array_equal(g, want)
    # into buffers a build reuses: longer than the run, holding an earlier run's entries
    extra = int(rng.integers(0, 1000))
    out = tuple(rng.integers(0, 2**32, n + extra).astype(a.dtype) for a in (keys, rows, values))
    scratch = rng.integers(0, 2**63, 3 * n + extra, dtype=np.uint64)
    again = stable_sort_by_key(keys, lo, lo + span, rows, values, out, scratch)
    for g, want in zip(again, got):
        assert g.dtype == want.dtype and np.array_equal(g, want)


@pytest.mark.parametrize("words", [64, 2**12, 2**17])
def test_the_filter_grouped_by_region_holds_the_bits_of_key_order_inserts(rng, words):
    """Inserting keys grouped by region of the filter (several groups, as a build reads them
    back) sets exactly the bits inserting them one by one does, in filters smaller and larger
    than a region."""
    from tensorflow_ooc.format.fiber_keys import blocked_insert_by_region

    keys = np.unique(rng.integers(0, 2**50, int(rng.integers(words // 4, words * 2)), dtype=np.uint64))
    want = np.zeros(words, dtype=np.uint64)
    blocked_insert(keys, want)
    got = np.zeros(words, dtype=np.uint64)
    group = int(rng.integers(1, keys.shape[0] + 1))
    scratch = np.empty(group, dtype=np.uint64)
    for at in range(0, keys.shape[0], group):
        blocked_insert_by_region(keys[at : at + group], got, scratch)
    assert np.count_nonzero(want) > 0
    assert np.array_equal(got, want)


@pytest.mark.parametrize("words", [64, 2**12, 2**17])
def test_a_folded_filter_is_the_filter_of_its_size(rng, words):
    """A filter filled at a larger size (a build sizes it for a fiber a nonzero) and folded holds
    exactly the bits of the keys inserted at the folded size; a fold that cannot be is refused."""
    from tensorflow_ooc.format.fiber_keys import folded_filter

    keys = np.unique(rng.integers(0, 2**50, int(rng.integers(words // 4, words * 2)), dtype=np.uint64))
    want = np.zeros(words, dtype=np.uint64)
    blocked_insert(keys, want)
    big = np.zeros(words << int(rng.integers(0, 6)), dtype=np.uint64)
    blocked_insert(keys, big)
    got = folded_filter(big, words)
    assert np.count_nonzero(want) > 0
    assert got.shape == want.shape and np.array_equal(got, want)
    for bad in (words * 2 * big.shape[0], 4, words + 8):
        with pytest.raises(ValueError, match="cannot fold"):
            folded_filter(np.zeros(words, dtype=np.uint64), bad)
