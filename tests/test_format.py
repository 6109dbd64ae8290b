"""BLCO encoding: round trips, ALTO order against an independent bit-interleaving reference, blocking."""

import numpy as np
import pytest
from conftest import random_coo, sort_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorflow_ooc.errors import DuplicateError, ShapeError
from tensorflow_ooc.format import BitLayout, alto_words, encode_coo
from tensorflow_ooc.format.linearize import chunk_minmax, coords_from_words


def reference_alto(coord, shape):
    """ALTO index from the definition: LSB level first, round-robin over modes with bits left."""
    bits = [(s - 1).bit_length() for s in shape]
    value, pos = 0, 0
    for level in range(max(bits)):
        for n in range(len(shape)):
            if level < bits[n]:
                value |= ((int(coord[n]) >> level) & 1) << pos
                pos += 1
    return value


mode_length = st.one_of(
    st.integers(1, 40),
    st.integers(1, 2**20),
    st.sampled_from([1, 2, 3, 7, 8, 9, 2**16, 2**16 + 1, 2**30, 2**31, 2**31 - 1, 2**33 + 5]),
)


@st.composite
def tensors(draw):
    nmodes = draw(st.integers(2, 8))
    shape = tuple(draw(mode_length) for _ in range(nmodes))
    nnz = draw(st.integers(1, 200))
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, nnz, seed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors(), st.integers(1, 64))
def test_round_trip_and_alto_order(t, max_block):
    shape, nnz, seed = t
    coords, values = random_coo(np.random.default_rng(seed), shape, nnz)
    blco = encode_coo(coords, values, shape, max_block_nnz=max_block)
    out_c, out_v = blco.to_coo()
    # decode(encode(c)) == c, values travel with their coordinates
    a, b = sort_rows(coords, values), sort_rows(out_c, out_v)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # stored order is ALTO order of the definition
    ref = [reference_alto(c, shape) for c in out_c]
    assert ref == sorted(ref)
    # blocks tile the nonzeros, respect max_block_nnz, and hold one key each
    blocks = blco.blocks
    assert blocks.start[0] == 0 and int(blocks.count.sum()) == coords.shape[0]
    assert (blocks.count <= max_block).all() and (blocks.count >= 1).all()
    layout = blco.layout
    for b in range(blocks.nblocks):
        s, e = blocks.start[b], blocks.start[b] + blocks.count[b]
        keys = {reference_alto(c, shape) >> 64 for c in out_c[s:e]}
        assert len(keys) == 1
        lo = blocks.base[b]
        hi = lo + (1 << layout.field_bits.astype(object))
        assert (out_c[s:e] >= lo).all() and (out_c[s:e] < np.array(hi, dtype=object)).all()


@pytest.mark.parametrize(
    "shape",
    [
        (2**31, 2**31, 2**30, 7),  # 95 bits
        (2**40, 2**40, 2**40),  # 120 bits
        (2**33, 2**33),  # 66 bits
        (3, 2**62, 5, 2**60),  # 126 bits, unequal
    ],
)
def test_shapes_beyond_64_bits(rng, shape):
    layout = BitLayout(shape)
    assert 65 <= layout.total_bits <= 127
    assert layout.index_bits == 64 and layout.key_bits.sum() == layout.total_bits - 64
    coords, values = random_coo(rng, shape, 3000)
    # cluster half of them so several nonzeros share blocks
    coords[: len(coords) // 2, :] //= 1 << 20
    coords, idx = np.unique(coords, axis=0, return_index=True)
    values = values[idx]
    blco = encode_coo(coords, values, shape, max_block_nnz=7)
    c, v = blco.to_coo()
    a, b = sort_rows(coords, values), sort_rows(c, v)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(coords_from_words(alto_words(coords, layout), layout), coords)
    # de-linearization is one shift and one mask per mode on top of the block base
    for blk in range(min(blco.blocks.nblocks, 50)):
        s = blco.blocks.start[blk]
        x = int(blco.index[s])
        for n in range(layout.nmodes):
            field = (x >> int(layout.field_shift[n])) & ((1 << int(layout.field_bits[n])) - 1)
            assert blco.blocks.base[blk, n] + field == c[s, n]


def test_single_nonzero_and_length_one_modes():
    for shape in [(1, 1), (1, 5, 1), (7, 1, 1, 1, 1, 1, 1, 3)]:
        coords = np.array([[s - 1 for s in shape]])
        blco = encode_coo(coords, np.array([2.5]), shape)
        c, v = blco.to_coo()
        assert np.array_equal(c, coords) and v.tolist() == [2.5]
        assert blco.blocks.nblocks == 1


def test_alto_range_spans_compact_interval(rng):
    """A contiguous run of the ALTO order covers a compact box in every mode at once."""
    shape = (512, 512, 512)
    coords, values = random_coo(rng, shape, 200_000)
    c, _ = encode_coo(coords, values, shape).to_coo()
    run = 2000
    spans = np.array([c[s : s + run].max(axis=0) - c[s : s + run].min(axis=0) + 1 for s in range(0, len(c) - run, run)])
    # 2000 of 200k nonzeros (1 %) of a 512^3 box: a compact sub-box has volume ~ 1 % of the cells,
    # so about 512 * 0.01**(1/3) ~ 110 per mode; a mode-major sort would span all 512 in two modes.
    assert np.median(spans.prod(axis=1)) < 0.05 * 512**3
    # ALTO runs cover aligned power-of-two boxes: a run that crosses a box edge in the mode with
    # the top bit spans 256 (half the mode), so the per-mode median is 128 or 256, never 512
    assert (np.median(spans, axis=0) <= 256).all()
    lex = sort_rows(coords, values)[0]
    lex_spans = np.array(
        [lex[s : s + run].max(axis=0) - lex[s : s + run].min(axis=0) + 1 for s in range(0, len(lex) - run, run)]
    )
    assert np.median(lex_spans[:, 1:], axis=0).min() > 500


def test_chunk_minmax_matches_decoded(rng):
    for shape in [(183, 24, 1140, 1717), (2**31, 2**31, 2**30, 7)]:
        layout = BitLayout(shape)
        coords, _ = random_coo(rng, shape, 50_000)
        keys = (
            np.sort(alto_words(coords, layout)[0]).reshape(1, -1) if layout.nwords == 1 else alto_words(coords, layout)
        )
        dec = coords_from_words(keys, layout)
        mn, mx = chunk_minmax(keys, layout, 4096)
        for k in range(mn.shape[0]):
            part = dec[k * 4096 : (k + 1) * 4096]
            assert np.array_equal(mn[k], part.min(axis=0)) and np.array_equal(mx[k], part.max(axis=0))


def test_duplicates_policies():
    coords = np.array([[1, 2, 3], [0, 0, 0], [1, 2, 3], [1, 2, 3]])
    values = np.array([1.0, 5.0, 2.0, 4.0])
    with pytest.raises(DuplicateError, match=r"\(1, 2, 3\)"):
        encode_coo(coords, values, (2, 3, 4))
    s = encode_coo(coords, values, (2, 3, 4), duplicates="sum").to_coo()
    assert dict(zip(map(tuple, s[0].tolist()), s[1].tolist())) == {(0, 0, 0): 5.0, (1, 2, 3): 7.0}
    last = encode_coo(coords, values, (2, 3, 4), duplicates="last").to_coo()
    assert dict(zip(map(tuple, last[0].tolist()), last[1].tolist())) == {(0, 0, 0): 5.0, (1, 2, 3): 4.0}


@pytest.mark.parametrize("shape", [(5,), (2,) * 9, (0, 3), (3, 2**63)])
def test_bad_shapes(shape):
    with pytest.raises(ShapeError):
        BitLayout(shape)
