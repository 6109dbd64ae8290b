"""The streaming read path: chunk files, fused re-encoding, delta kernels, cached validation."""

import mmap

import numba as nb
import numpy as np
import pytest
import zarr
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.errors import CorruptStoreError
from tensorflow_ooc.execution import stream
from tensorflow_ooc.execution.stream import BatchBuffers, fill_batch, stream_batches
from tensorflow_ooc.format import BitLayout, alto_words, decode_alto, reencode
from tensorflow_ooc.format.bits import HAS_BMI2, _pext_bmi2, _pext_portable
from tensorflow_ooc.format.index_encoding import delta_words, encode_delta32
from tensorflow_ooc.format.linearize import _decode_alto_pext, _decode_alto_table
from tensorflow_ooc.kernels import StackedFactors, run_items
from tensorflow_ooc.store.chunk_files import ChunkFiles


def _is_mapped(array):
    """Whether ``array`` is a view of a memory-mapped file (``frombuffer`` keeps a memoryview)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(getattr(base, "obj", base), mmap.mmap)


def _random_shape(rng, nmodes):
    return tuple(int(s) for s in rng.integers(2, 300 if nmodes < 5 else 40, nmodes))


@nb.njit
def _pext_all(f, xs, masks, out):
    for i in range(xs.shape[0]):
        out[i] = f(xs[i], masks[i])


def _pext_reference(x, m):
    out, bit = 0, 0
    for p in range(64):
        if m >> p & 1:
            out |= (x >> p & 1) << bit
            bit += 1
    return out


def test_pext_portable_and_bmi2_agree_with_reference(rng):
    xs = rng.integers(0, 2**63, 200, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 200, dtype=np.uint64)
    masks = rng.integers(0, 2**63, 200, dtype=np.uint64)
    ref = np.array([_pext_reference(int(x), int(m)) for x, m in zip(xs, masks)], dtype=np.uint64)
    impls = [_pext_portable] + ([_pext_bmi2] if HAS_BMI2 else [])
    for impl in impls:
        got = np.empty_like(xs)
        _pext_all(nb.njit(lambda x, m: impl(x, m)), xs, masks, got)  # noqa: B023 (compiled and run in this iteration)
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
def test_decode_alto_equals_table_reencode(rng, nmodes):
    shape = _random_shape(rng, nmodes)
    layout = BitLayout(shape)
    coords, _ = random_coo(rng, shape, 2000)
    low = np.sort(alto_words(coords, layout)[0])
    want = reencode(low, layout)
    got = np.empty_like(low)
    bits = decode_alto(low, layout, got)
    np.testing.assert_array_equal(got, want)
    assert bits == int(np.bitwise_or.reduce(low))
    deltas = np.diff(low, prepend=np.uint64(0))  # the Delta filter's form, first value absolute
    got[:] = 0
    decode_alto(deltas, layout, got, is_delta=True)
    np.testing.assert_array_equal(got, want)
    # delta32 with patches: the chunk start, and words moved up by 2^32 past a random point
    # (both gap kinds; the fields decoded are the words' own)
    cut = int(rng.integers(1, low.shape[0]))
    jumped = low.copy()
    jumped[cut:] += np.uint64(1 << 33) if layout.index_bits <= 30 else np.uint64(0)
    diffs, ppos, pword = encode_delta32(jumped)
    assert ppos[0] == 0 and (cut in ppos) == (layout.index_bits <= 30)
    np.testing.assert_array_equal(delta_words(diffs, ppos, pword), jumped)
    want32 = reencode(jumped, layout)
    no_patch = (np.zeros(0, np.int64), np.zeros(0, np.uint64))
    for fn, args in (
        (_decode_alto_table, (layout.reencode_table, layout.index_nbytes)),
        (_decode_alto_pext, (layout.pext_masks, layout.field_shift)) if HAS_BMI2 else (None, None),
    ):
        if fn is not None:  # both implementations, whatever this CPU picks
            got[:] = 0
            fn(deltas, True, *no_patch, *args, got)
            np.testing.assert_array_equal(got, want)
            got[:] = 0
            fn(diffs, True, ppos, pword, *args, got)
            np.testing.assert_array_equal(got, want32)


@pytest.mark.parametrize("encoding", ["delta32", "delta64"])
@pytest.mark.parametrize("compression", ["fast", "small", "none"])
def test_chunk_files_match_zarr(tmp_path, rng, compression, encoding):
    shape = (50, 60, 70, 80)
    coords, values = random_coo(rng, shape, 5500)
    s = tfo.convert(
        (coords, values), tmp_path / "s.zarr", chunk_nnz=1000, compression=compression, index_encoding=encoding
    )
    assert s.info()["compression"] == compression and s.index_encoding == encoding
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    assert np.dtype(g["alto"].dtype) == np.dtype("<u4" if encoding == "delta32" else "<u8")
    for name in ("alto", "values"):
        files = ChunkFiles(g[name], delta=True if encoding == "delta32" and name == "alto" else None)
        assert files.fast
        out = np.empty(s.chunk_nnz, dtype=g[name].dtype)
        for c in range(s.nchunks):  # the last chunk is partial
            got = files.read(c, out)
            lo, hi = c * s.chunk_nnz, min(s.nnz, (c + 1) * s.chunk_nnz)
            if name == "alto":  # the words, whatever the encoding
                data = delta_words(got.data, *(s.chunk_patches(lo, hi) or ()))
                want = s._read_words(lo, hi)
            else:
                data, want = got.data, g[name][lo:hi]
            np.testing.assert_array_equal(data, want)
            assert got.is_delta == (name == "alto")


def test_values_codec_follows_the_data(tmp_path, rng):
    coords, _ = random_coo(rng, (40, 50, 60), 4000)
    floats, counts = rng.random(len(coords)), rng.integers(1, 5, len(coords)).astype(np.float64)
    a = tfo.convert((coords, floats), tmp_path / "a.zarr", chunk_nnz=1000)
    b = tfo.convert((coords, counts), tmp_path / "b.zarr", chunk_nnz=1000)
    # Zarr stores the last chunk whole: where its padding would add more than half the values'
    # bytes, they stay compressed
    c = tfo.convert((coords, floats), tmp_path / "c.zarr", chunk_nnz=7000)
    assert c.meta["values_shuffle"] != "none" and not c.values_mappable
    # random floats barely compress: stored as they are, and streamed mapped where they lie
    assert a.meta["values_shuffle"] == "none" and a.values_mappable and not a.mappable
    assert b.meta["values_shuffle"] == "shuffle" and not b.values_mappable  # counts do compress
    for s, v in ((a, floats), (b, counts)):
        got_c, got_v = s.to_coo()
        order = np.lexsort(coords.T[::-1])
        got = np.lexsort(got_c.T[::-1])
        np.testing.assert_array_equal(got_c[got], coords[order])
        np.testing.assert_array_equal(got_v[got], v[order])


def test_memory_url_store_streams(rng):
    shape = (20, 30, 40)
    coords, values = random_coo(rng, shape, 3000)
    s = tfo.convert((coords, values), f"memory://stream-{rng.integers(1 << 30)}", chunk_nnz=700)
    factors = [rng.standard_normal((n, 5)) for n in shape]
    F = StackedFactors.from_list(factors)
    for mode in range(3):
        out = np.zeros((shape[mode], 5))
        for items in stream_batches(s, 0, s.nchunks, batch_nnz=1400):
            run_items(items, s.layout, F, mode, out)
        assert rel_err(out, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12


@pytest.mark.parametrize("nmodes", [3, 4, 5, 6])
@pytest.mark.parametrize("delta", [True, False] if HAS_BMI2 else [False])
@pytest.mark.parametrize("read_ahead", [True, False])
@pytest.mark.parametrize("counts", [False, True])
def test_streamed_mttkrp_every_mode_against_einsum(tmp_path, rng, nmodes, delta, read_ahead, counts, monkeypatch):
    """Default ("fast") stores: random float values are stored raw and, with the delta kernels,
    mapped one chunk per batch while the index is decompressed; counts are compressed and
    decompressed into batches of several chunks."""
    monkeypatch.setattr(stream, "DELTA_KERNELS", delta)
    # at least 512 cells: the last 128-nonzero chunk pads the values by at most a quarter, so
    # random float values are stored uncompressed
    low = {3: 8, 4: 5, 5: 4, 6: 3}[nmodes]
    shape = tuple(int(s) for s in rng.integers(low, 13 if nmodes < 6 else 7, nmodes))
    coords, values = random_coo(rng, shape, 900)
    if counts:
        values = rng.integers(1, 4, values.shape[0]).astype(np.float64)
    s = tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=128, max_block_nnz=90)
    assert s.values_mappable != counts
    rank = int(rng.choice([3, 16, 32]))
    factors = [rng.standard_normal((n, rank)) for n in shape]
    F = StackedFactors.from_list(factors)
    for mode in range(nmodes):
        out = np.zeros((shape[mode], rank))
        batches = 0
        for items in stream_batches(s, 0, s.nchunks, batch_nnz=300, read_ahead=read_ahead):
            assert items.delta == delta
            assert _is_mapped(items.values) == (delta and not counts)
            run_items(items, s.layout, F, mode, out)
            batches += 1
        assert batches == (s.nchunks if delta and not counts else 1 + -(-(s.nchunks - 1) // 2))
        assert rel_err(out, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12, mode


@pytest.mark.skipif(not HAS_BMI2, reason="mapped chunks feed the delta kernels, which need BMI2")
@pytest.mark.parametrize("nmodes,map_chunks", [(3, True), (4, True), (5, True), (4, False)])
def test_mapped_raw_chunks_every_mode_against_einsum(tmp_path, rng, nmodes, map_chunks):
    """Compression "none": the first pass reads and validates each chunk, later passes map them
    (no copy, one batch per chunk), or copy them into batches without ``map_chunks``; all equal
    the dense reference."""
    shape = tuple(int(s) for s in rng.integers(2, 13, nmodes))
    while np.prod(shape) < 900:  # 900 nonzeros: a last chunk of 4 (11 x 7 x 5 left one of 1, copied not mapped)
        shape = tuple(int(s) for s in rng.integers(2, 13, nmodes))
    coords, values = random_coo(rng, shape, 900)
    s = tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=128, max_block_nnz=90, compression="none")
    rank = int(rng.choice([3, 16]))
    factors = [rng.standard_normal((n, rank)) for n in shape]
    F = StackedFactors.from_list(factors)
    for sweep in range(2):
        for mode in range(nmodes):
            out = np.zeros((shape[mode], rank))
            batches = 0
            for items in stream_batches(s, 0, s.nchunks, batch_nnz=128 if map_chunks else 300, map_chunks=map_chunks):
                assert _is_mapped(items.index) == (map_chunks and (sweep == 1 or mode > 0)), (sweep, mode)
                run_items(items, s.layout, F, mode, out)
                batches += 1
            # copied: the first batch is one chunk (nothing to overlap its read with), then two each
            assert batches == (s.nchunks if map_chunks else 1 + -(-(s.nchunks - 1) // 2))
            assert rel_err(out, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12, (sweep, mode)


def test_zarr_read_path_fallback(tmp_path, rng, monkeypatch):
    """Chains the fast reader does not know go through Zarr; results are the same."""
    shape = (30, 40, 50)
    coords, values = random_coo(rng, shape, 2500)
    s = tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=600)
    files = s._chunk_files
    for f in files:
        monkeypatch.setattr(f, "fast", False)
    factors = [rng.standard_normal((n, 4)) for n in shape]
    F = StackedFactors.from_list(factors)
    for delta in [True, False] if HAS_BMI2 else [False]:
        monkeypatch.setattr(stream, "DELTA_KERNELS", delta)
        stream.release_buffers()
        for mode in range(3):
            out = np.zeros((shape[mode], 4))
            for items in stream_batches(s, 0, s.nchunks):
                assert items.delta == delta
                run_items(items, s.layout, F, mode, out)
            assert rel_err(out, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12


def _store(tmp_path, rng):
    coords, values = random_coo(rng, (40, 50, 60), 3000)
    return tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=1000, max_block_nnz=700)


def test_damaged_chunk_fails_the_streaming_read(tmp_path, rng):
    s = _store(tmp_path, rng)
    path = tmp_path / "s.zarr" / "values" / "c" / "2"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    s = tfo.open_store(tmp_path / "s.zarr")
    with pytest.raises(CorruptStoreError, match="chunk 2.*CRC32C"):
        list(stream_batches(s, 0, s.nchunks))


def _rewrite_alto_chunk(store_path, c, words):
    """Replace a chunk of the index with other (valid, checksummed) low ALTO ``words`` (with its
    first word, hence its patches, unchanged), and record its new checksum in the position table
    too, as a tool rewriting the store consistently would: only the range validation stands
    between such a chunk and the kernels."""
    from tensorflow_ooc.store.chunk_files import ChunkFiles

    g = zarr.open_group(str(store_path), mode="r+")
    arr = g["alto"]
    n = arr.chunks[0]
    if np.dtype(arr.dtype) == np.uint32:  # delta32: the differences; the patches stay valid
        diffs, ppos, _ = encode_delta32(words)
        assert list(ppos) == [0]
        arr[c * n : c * n + words.shape[0]] = diffs
    else:
        arr[c * n : c * n + words.shape[0]] = words
    g["chunks/crc_alto"][c] = ChunkFiles(arr).stored_checksum(c)


def test_changed_chunk_is_validated_again(tmp_path, rng):
    """A chunk's profile is cached under its checksum: changed bytes are validated afresh, so a
    chunk rewritten with indices outside the range table never reaches the kernels."""
    s = _store(tmp_path, rng)
    stream.release_buffers()
    list(stream_batches(s, 0, s.nchunks))  # first pass: validated and cached
    words = s._read_words(1000, 2000)
    bigger = words.copy()
    bigger[-1] = np.uint64(int(words.max()) | ((1 << s.layout.index_bits) - 1))  # the largest index in range
    _rewrite_alto_chunk(tmp_path / "s.zarr", 1, np.sort(bigger))
    s = tfo.open_store(tmp_path / "s.zarr")
    with pytest.raises(CorruptStoreError, match="chunk 1"):
        list(stream_batches(s, 0, s.nchunks))


def test_batches_reuse_buffers_and_stay_valid(tmp_path, rng):
    shape = (30, 40, 50)
    coords, values = random_coo(rng, shape, 3000)
    s = tfo.convert((coords, values), tmp_path / "s.zarr", chunk_nnz=250)
    stream.release_buffers()
    a = [it.values.copy() for it in stream_batches(s, 0, s.nchunks, batch_nnz=500, read_ahead=True)]
    b = [it.values.copy() for it in stream_batches(s, 0, s.nchunks, batch_nnz=500, read_ahead=True)]
    assert len(stream._BUFFERS) == 2
    c = [it.values.copy() for it in stream_batches(s, 0, s.nchunks, batch_nnz=500, read_ahead=False)]
    for x, y, z in zip(a, b, c, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    np.testing.assert_array_equal(np.sort(np.concatenate(a)), np.sort(values))
    whole = fill_batch(s, range(s.nchunks), BatchBuffers(s, s.nchunks), delta=False)
    np.testing.assert_array_equal(np.sort(whole.values), np.sort(values))


def test_read_ahead_only_with_a_spare_core(monkeypatch):
    monkeypatch.setattr(stream.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert stream.read_ahead_pays(1) and not stream.read_ahead_pays(2)


def test_bad_compression_name(tmp_path, rng):
    coords, values = random_coo(rng, (5, 6, 7), 30)
    with pytest.raises(ValueError, match="compression must be one of"):
        tfo.convert((coords, values), tmp_path / "x.zarr", compression="gzip")
    assert not (tmp_path / "x.zarr").exists()


def test_batch_size_follows_worker_memory():
    from tensorflow_ooc.execution.stream import BATCH_NNZ, batch_nnz_for

    assert batch_nnz_for(None) == BATCH_NNZ == batch_nnz_for(64 << 30)
    small = 450 << 20
    assert 2 * 16 * batch_nnz_for(small) <= small / 8 and batch_nnz_for(small) > 1 << 20
