"""The GPU MTTKRP traffic model (pure CPU): hand-computed cases, monotonicity, segment counts."""

import math

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.kernels.mttkrp import gpu_model as gm
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items
from tensorflow_ooc.kernels.mttkrp.gpu_plan import device_tiles

SHAPE = (4, 5, 6)


def small(**kw):
    args = dict(shape=SHAPE, nnz=10, rank=4, mode=0, segments=3, bandwidth_GBps=1.0, link_GBps=1.0, tiles=1, items=1)
    args.update(kw)
    return gm.predict(
        args.pop("shape"), args.pop("nnz"), args.pop("rank"), args.pop("mode"), args.pop("segments"), **args
    )


# --- hand-computed cases ---------------------------------------------------------------------------


def test_resident_register_by_hand():
    p = small()
    # 10 nonzeros x (8 B index + 8 B value); rows of 4 x 8 B = 32 B, one sector
    assert p["bytes"]["nonzeros"] == 160
    assert p["bytes"]["factors_worst"] == 10 * 2 * 32  # two other modes per nonzero
    assert p["bytes"]["factors_best"] == (5 + 6) * 32  # each row of modes 1 and 2 once
    assert p["bytes"]["output"] == 3 * 4 * 8  # three flushes of R atomics
    assert p["bytes"]["merge"] == p["bytes"]["decode"] == p["bytes"]["h2d_write"] == 0
    assert p["device_bytes"] == p["device_bytes_worst"] == 160 + 640 + 96  # cache_hit defaults to 0
    assert p["device_bytes_best"] == 160 + 352 + 96
    assert p["global_atomics"] == 12 and p["shared_atomics"] == 0
    assert p["link_bytes"] == 0
    assert p["setup_link_bytes"] == 4 * 32 * 2  # zeroed output up, result down
    assert p["predicted_s"] == pytest.approx(896e-9)
    assert p["predicted_best_s"] == pytest.approx(608e-9)
    assert p["predicted_call_s"] == pytest.approx(896e-9 + 256e-9)
    assert p["variant"] == "resident/register" and p["bound"] == "device"
    assert p["bytes_per_nnz"] == pytest.approx(89.6)


def test_cache_hit_interpolates():
    p = small(cache_hit=0.5)
    assert p["bytes"]["factors"] == pytest.approx(640 - 0.5 * (640 - 352))
    assert p["device_bytes"] == pytest.approx(160 + 496 + 96)
    assert small(cache_hit=1.0)["device_bytes"] == small()["device_bytes_best"]


def test_resident_hierarchical_by_hand():
    p = small(conflict="hierarchical", copies=2, stash_rows=2, stash_segments=2, block_rows=1)
    # one segment past the stash (global copy), one stash row flushed at block end, merge of 2 copies
    assert p["bytes"]["output"] == (1 + 1) * 32
    assert p["bytes"]["merge"] == (2 + 2) * 4 * 32
    assert p["device_bytes"] == 160 + 640 + 64 + 512
    assert p["global_atomics"] == 8 and p["shared_atomics"] == 8
    assert p["setup_link_bytes"] == 4 * 32 * (2 + 2)  # output + 2 copies up, result down
    assert p["copies"] == 2 and p["stash_rows"] == 2


def test_hierarchical_defaults():
    # stash bigger than the mode: every segment lands in shared memory
    p = small(conflict="hierarchical", copies=1, stash_rows=64)
    assert p["shared_atomics"] == 3 * 4
    assert p["bytes"]["output"] == min(3, 1 * 4) * 32  # block_rows upper bound = stash segments
    # default stash from the kernel configuration
    assert small(conflict="hierarchical")["stash_rows"] == gm.stash_rows_for(3, 4, 8)


def test_streamed_register_by_hand():
    p = small(streamed=True)
    assert p["link_bytes"] == 160 + 1 * (16 + 8 * 3) + 1 * 16 + 8
    assert p["bytes"]["h2d_write"] == 160
    assert p["bytes"]["decode"] == 10 * 24
    assert p["device_bytes"] == 896 + 160 + 240
    assert p["predicted_s"] == pytest.approx(max(1296e-9, 224e-9))
    assert small(streamed=True, delta=False)["bytes"]["decode"] == 10 * 16


def test_sector_rounding_and_float32():
    assert small(rank=3)["bytes"]["factors_worst"] == 10 * 2 * 32  # 24 B rows read as 32
    assert small(rank=3, sector=1)["bytes"]["factors_worst"] == 10 * 2 * 24
    p = small(itemsize=4, rank=8)
    assert p["bytes"]["nonzeros"] == 10 * 12
    assert p["bytes"]["output"] == 3 * 8 * 4
    assert small(itemsize=4, value_itemsize=8, rank=8)["bytes"]["nonzeros"] == 160


def test_link_bound():
    p = small(streamed=True, link_GBps=1e-3)
    assert p["bound"] == "link"
    assert p["predicted_s"] == pytest.approx(p["link_s"]) == pytest.approx(224 / 1e6)


# --- monotonicity and ordering ---------------------------------------------------------------------


def random_case(rng):
    shape = tuple(int(x) for x in rng.integers(2, 5000, rng.integers(3, 6)))
    nnz = int(rng.integers(1, 10**7))
    mode = int(rng.integers(0, len(shape)))
    seg = float(rng.integers(1, nnz + 1))
    return shape, nnz, mode, seg


@pytest.mark.parametrize("conflict", gm.CONFLICTS)
def test_streamed_never_beats_resident(rng, conflict):
    for _ in range(50):
        shape, nnz, mode, seg = random_case(rng)
        R = int(rng.choice([1, 8, 16, 32, 64, 100]))
        kw = dict(
            conflict=conflict,
            cache_hit=float(rng.random()),
            itemsize=int(rng.choice([4, 8])),
            bandwidth_GBps=float(rng.uniform(100, 5000)),
            link_GBps=float(rng.uniform(5, 100)),
        )
        r = gm.predict(shape, nnz, R, mode, seg, **kw)
        s = gm.predict(shape, nnz, R, mode, seg, streamed=True, **kw)
        assert s["device_bytes"] > r["device_bytes"]
        assert s["predicted_s"] >= r["predicted_s"]
        assert s["link_bytes"] > 0 == r["link_bytes"]
        assert r["predicted_best_s"] <= r["predicted_s"] <= r["predicted_worst_s"]


@pytest.mark.parametrize("variant", gm.VARIANTS)
def test_monotone(variant):
    conflict, streamed = variant.split("/")[1], variant.startswith("streamed")
    # a fast link keeps streamed passes device-bound, so every device term shows in the time
    base = dict(conflict=conflict, streamed=streamed, copies=4, link_GBps=1e6)

    def t(nnz=10**6, rank=32, seg=2 * 10**5, **kw):
        return gm.predict((183, 24, 1140, 1717), nnz, rank, 2, seg, **{**base, **kw})["predicted_s"]

    assert t(nnz=2 * 10**6, seg=4 * 10**5) > t()  # more nonzeros
    assert t(rank=64) > t() > t(rank=16)  # wider rows
    assert t(cache_hit=0.0) > t(cache_hit=0.5) > t(cache_hit=1.0)  # more reuse
    assert t(bandwidth_GBps=1000) > t(bandwidth_GBps=3000)
    if conflict == "register":
        assert t(seg=4 * 10**5) > t()  # more flushes
    assert t(itemsize=8) > t(itemsize=4)
    if streamed:  # link-bound: never faster with a slower link
        assert t(link_GBps=10) > t(link_GBps=100) >= t()


def test_hierarchical_cheaper_for_short_modes():
    """Few rows and many segments: the stash absorbs the flushes, register pays R atomics each."""
    shape, nnz, R = (24, 1140, 1717), 10**6, 32
    h = gm.predict(shape, nnz, R, 0, nnz / 2, conflict="hierarchical")
    r = gm.predict(shape, nnz, R, 0, nnz / 2, conflict="register")
    assert h["device_bytes"] < r["device_bytes"]
    assert h["shared_atomics"] == pytest.approx(nnz / 2 * R)


def test_predict_all():
    out = gm.predict_all((183, 24, 1140, 1717), 10**6, 32, 1, 10**5)
    assert set(gm.VARIANTS) <= set(out)
    assert out["auto"] == "hierarchical"  # 24 rows < 132 SMs
    assert gm.predict_all((183, 24, 1140, 1717), 10**6, 32, 2, 10**5)["auto"] == "register"
    assert 0 < out["streamed_over_resident_best"] <= 1 and 0 < out["streamed_over_resident_worst"] <= 1


@pytest.mark.parametrize(
    "bad",
    [
        dict(mode=3),
        dict(rank=0),
        dict(cache_hit=1.5),
        dict(conflict="x"),
        dict(segments=11),
        dict(segments=0),
        dict(itemsize=2),
        dict(bandwidth_GBps=0),
    ],
)
def test_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        small(**bad)


def test_stash_rows_match_kernel_config():
    from tensorflow_ooc.kernels.mttkrp.gpu import KernelConfig

    for N, R, isz in [(3, 32, 8), (4, 32, 8), (4, 64, 4), (3, 16, 8)]:
        cfg = KernelConfig.for_rank(N, R, "hierarchical", "intrinsics", "float64" if isz == 8 else "float32")
        assert gm.stash_rows_for(N, R, isz) == cfg.stash_rows


# --- segment counts --------------------------------------------------------------------------------


def walk_reference(keys, ts, te, coarsen, stash_rows, lanes=32, tile_lo=None):
    """The kernel's walk, written out: per warp, per 32-nonzero sub-tile, rows reordered in
    first-lane order; lane group g walks reordered slots g*lanes .. (g+1)*lanes - 1 with its own
    accumulator, which carries from one sub-tile to the next."""
    seg = sseg = 0
    for t, (start, end) in enumerate(zip(ts.tolist(), te.tolist())):
        win = 0 if tile_lo is None else int(tile_lo[t])
        nsub = -(-(end - start) // 32)
        for w in range(-(-nsub // coarsen)):
            current = [-1] * (32 // lanes)
            for c in range(coarsen):
                first = start + (w * coarsen + c) * 32
                if first >= end:
                    break
                sub = keys[first : min(first + 32, end)].tolist()
                slots = [r for g in dict.fromkeys(sub) for r in sub if r == g]
                for i, row in enumerate(slots):
                    g = i // lanes
                    if row != current[g]:
                        seg += 1
                        sseg += row - win < stash_rows
                        current[g] = row
    return seg, sseg


def test_kernel_segments_by_hand():
    keys = np.array([5, 3] * 16 + [3] * 32, dtype=np.int64)
    ts, te = np.array([0]), np.array([64])
    # one warp, two sub-tiles: groups (5, 3) then (3): the second continues the first's last group
    r = gm.kernel_segments(keys, ts, te, coarsen=2, stash_rows=4)
    assert r == {"segments": 2, "stash_segments": 1, "block_rows": 1, "tiles": 1}
    # one sub-tile per warp: no carry
    assert gm.kernel_segments(keys, ts, te, coarsen=1, stash_rows=4)["segments"] == 3
    # a tile boundary breaks the carry too
    r = gm.kernel_segments(keys, np.array([0, 32]), np.array([32, 64]), coarsen=2, stash_rows=4)
    assert r["segments"] == 3 and r["stash_segments"] == 2 and r["block_rows"] == 2


@pytest.mark.parametrize("lanes", [32, 16, 8, 1])
@pytest.mark.parametrize("coarsen", [1, 2, 4])
def test_kernel_segments_match_walk(rng, coarsen, lanes):
    for _ in range(5):
        n = int(rng.integers(1, 3000))
        keys = np.sort(rng.integers(0, int(rng.integers(1, 50)), n))  # long runs
        keys = np.where(rng.random(n) < 0.2, rng.integers(0, 50, n), keys)  # broken here and there
        cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n, 5)]))
        tile = 32 * 2 * coarsen
        ts, te = [], []
        for a, b in zip(cuts[:-1], cuts[1:]):
            for s in range(a, b, tile):
                ts.append(s)
                te.append(min(b, s + tile))
        ts, te = np.array(ts), np.array(te)
        lo = np.array([keys[a:b].min() for a, b in zip(ts, te)])
        got = gm.kernel_segments(keys, ts, te, coarsen=coarsen, stash_rows=10, tile_lo=lo, lanes=lanes)
        assert (got["segments"], got["stash_segments"]) == walk_reference(keys, ts, te, coarsen, 10, lanes, lo)
        assert got["block_rows"] == sum(len(set(keys[a:b][keys[a:b] - w < 10].tolist())) for a, b, w in zip(ts, te, lo))


def test_item_keys_and_changes_on_a_tensor(rng):
    from tensorflow_ooc import synthetic

    shape = (30, 8, 50, 70)
    coords, values = synthetic.heavy_tailed(shape, 3000, seed=int(rng.integers(1 << 30)))
    t = tfo.encode_coo(coords, values, shape)
    items = tensor_items(t)
    alto_coords, _ = t.to_coo()
    lay = t.layout
    tiles = device_tiles(items, 1024)
    for mode in range(len(shape)):
        keys = gm.item_keys(items.index, items.start, items.end, items.base, lay.field_shift, lay.field_mask, mode)
        assert np.array_equal(keys, alto_coords[:, mode])
        changes = gm.segments_from_changes(items.changes, mode)
        ref = sum(1 + int((np.diff(keys[a:b]) != 0).sum()) for a, b in zip(items.start, items.end) if b > a)
        assert changes == ref
        seg = gm.kernel_segments(keys, tiles.start, tiles.end, coarsen=4)["segments"]
        assert seg == walk_reference(keys, tiles.start, tiles.end, 4, 0)[0]
        assert len(np.unique(keys)) <= seg <= t.nnz
        p = gm.predict(shape, t.nnz, 16, mode, seg)
        assert math.isfinite(p["predicted_s"]) and p["predicted_s"] > 0
