"""Traffic and time model of the GPU MTTKRP (pure numpy; no GPU and no numba-cuda needed).

For one target mode the model counts the bytes each variant moves and turns them into a time
with two bandwidths: the device memory (HBM) and the host link (PCIe). Variants are
``resident`` (the partition already lives on the device, decoded) or ``streamed`` (batches copied
from pinned host buffers and decoded on the device, :mod:`tensorflow_ooc.execution.device_stream`),
each with ``register`` or ``hierarchical`` conflict resolution (:mod:`.gpu`).

Device bytes of one mode's MTTKRP (``fi``: factor itemsize, ``vi``: value itemsize, ``R``: rank):

- **nonzeros**: ``nnz * (8 + vi)``: the BLCO index and the value, read once, coalesced;
- **factor rows**: ``N - 1`` rows of ``R * fi`` bytes per nonzero (rounded up to 32-byte
  sectors). ``cache_hit = 0`` is the no-cache worst case (every nonzero reads its rows from
  memory); ``cache_hit = 1`` the full-reuse best case (each factor row touched is read once);
  values in between interpolate linearly;
- **output**: one flush of ``R`` values per *segment* (a run of nonzeros with one target row in a
  warp's walk, see :func:`kernel_segments`).
  ``register``: every flush is ``R`` global atomic adds, ``segments * R * fi`` bytes.
  ``hierarchical``: flushes of rows inside the shared-memory stash cost no device-memory traffic
  (shared atomics, counted apart); the other flushes go to the block's global copy; when a block
  ends its touched stash rows are added to the copy (``block_rows * R * fi``); the merge then
  reads the ``K`` copies and reads and writes the output once (``(K + 2) * rows * R * fi``);
- **streamed only**: the host-to-device copy writes the batch into device memory
  (``nnz * (8 + vi)``) and the on-device decode reads and writes the index words (24 B per
  nonzero for Delta words: tile sums read 8, decode reads 8 and writes 8; 16 B for absolute
  words).

Link bytes: a streamed pass copies ``nnz * (8 + vi)`` bytes plus its tile tables over the host link
(overlapped with the kernels by the stream schedule). Both variants also move per call, serially:
the zeroed output (and, hierarchical, the zeroed ``K`` copies) up and the result down, as
``DeviceMTTKRP`` does today. Factors are uploaded once per model state, not per call; they are
reported (``factor_upload_bytes``) but not timed.

Time: ``device_s = device_bytes / bandwidth``; ``link_s = link_bytes / link``;
``predicted_s = max(device_s, link_s)`` (resident: ``device_s``) and
``predicted_call_s = predicted_s + setup_link_s``. The model is a bandwidth floor: it ignores
atomic contention (why hierarchical resolution exists for short modes), latency, occupancy, the
kernel launches and, for streaming, the host's chunk reads and decompression.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

H100_HBM_GBPS = 3350.0  # H100 SXM5, HBM3: the nominal peak
H100_LINK_GBPS = 55.0  # PCIe Gen5 x16: about 55 GB/s effective of 64 GB/s nominal per direction
SECTOR_BYTES = 32  # DRAM/L2 access granularity of NVIDIA GPUs
INDEX_BYTES = 8  # one uint64 BLCO index per nonzero
DEFAULT_TILE_NNZ = 32 * 8 * 4  # 32 lanes x DEFAULT_WARPS x DEFAULT_COARSEN (gpu)
DEFAULT_ITEM_NNZ = 1 << 16  # kernels.plan.ITEM_NNZ
DEFAULT_COPIES = 8  # kernels.mttkrp.gpu_plan.DEFAULT_COPIES
DEFAULT_SM_COUNT = 132  # H100 SXM
CONFLICTS = ("hierarchical", "register")
VARIANTS = tuple(f"{p}/{c}" for p in ("resident", "streamed") for c in CONFLICTS)


def stash_rows_for(nmodes: int, rank: int, itemsize: int) -> int:
    """Rows of the hierarchical kernel's shared-memory stash (:class:`.gpu.KernelConfig`)."""
    from .gpu import KernelConfig

    dtype = "float32" if itemsize == 4 else "float64"
    return KernelConfig.for_rank(nmodes, rank, "hierarchical", "intrinsics", dtype).stash_rows


def choose_conflict(rows: int, sm_count: int = DEFAULT_SM_COUNT) -> str:
    """The ``auto`` heuristic (:func:`.gpu_plan.choose_conflict`): hierarchical below the SM count."""
    return "hierarchical" if rows < sm_count else "register"


def _row_bytes(rank: int, itemsize: int, sector: int) -> int:
    raw = rank * itemsize
    return int(math.ceil(raw / sector) * sector) if sector > 1 else raw


def predict(
    shape: Sequence[int],
    nnz: int,
    rank: int,
    mode: int,
    segments: float,
    *,
    itemsize: int = 8,
    value_itemsize: int | None = None,
    conflict: str = "register",
    streamed: bool = False,
    cache_hit: float = 0.0,
    bandwidth_GBps: float = H100_HBM_GBPS,
    link_GBps: float = H100_LINK_GBPS,
    copies: int = DEFAULT_COPIES,
    rows: int | None = None,
    stash_rows: int | None = None,
    stash_segments: float | None = None,
    block_rows: float | None = None,
    tile_nnz: int = DEFAULT_TILE_NNZ,
    tiles: int | None = None,
    items: int | None = None,
    delta: bool = True,
    sector: int = SECTOR_BYTES,
) -> dict:
    """Bytes, atomics and predicted seconds of one mode's MTTKRP in one variant.

    Parameters
    ----------
    shape, nnz, rank, mode : the tensor and the target mode.
    segments : flushes of ``R`` values (target-row runs in the kernel's walk; :func:`kernel_segments`,
        or an estimate such as the ALTO-order row changes, :func:`segments_from_changes`).
    itemsize : factor and output itemsize (8 float64, 4 float32); ``value_itemsize`` defaults to it.
    conflict : "register" or "hierarchical"; ``streamed``: a streamed pass (else resident).
    cache_hit : 0 (no factor reuse from cache, worst case) .. 1 (each factor row read once).
    bandwidth_GBps, link_GBps : device memory and host link bandwidths, GB/s (1e9 B/s).
    copies : global output copies (hierarchical).
    rows : output rows (default the mode length).
    stash_rows : rows of the shared stash (default from the kernel configuration).
    stash_segments : segments whose row is inside the stash (default ``segments * min(1, stash/rows)``).
    block_rows : sum over thread blocks of the stash rows each touched (default: the upper bound
        ``min(stash_segments, tiles * min(stash_rows, rows))``).
    tiles, items : thread-block tiles and work items (default ``ceil(nnz / tile_nnz)``,
        ``ceil(nnz / 65536)``); only the tile tables of a streamed pass depend on them.
    delta : streamed batches hold Delta words (3 decode passes over the index) or absolute words.
    sector : bytes a factor row read is rounded up to (1: no rounding).
    """
    shape = tuple(int(s) for s in shape)
    N = len(shape)
    nnz, rank, mode = int(nnz), int(rank), int(mode)
    if N < 2:
        raise ValueError(f"need at least 2 modes, got shape {shape}")
    if not 0 <= mode < N:
        raise ValueError(f"mode {mode} is out of range for a {N}-mode tensor")
    if nnz < 0 or rank < 1:
        raise ValueError(f"need nnz >= 0 and rank >= 1, got nnz={nnz}, rank={rank}")
    if conflict not in CONFLICTS:
        raise ValueError(f"conflict must be one of {CONFLICTS}, got {conflict!r}")
    if not 0.0 <= cache_hit <= 1.0:
        raise ValueError(f"cache_hit must be in [0, 1], got {cache_hit}")
    if bandwidth_GBps <= 0 or link_GBps <= 0:
        raise ValueError("bandwidths must be positive")
    if itemsize not in (4, 8):
        raise ValueError(f"itemsize must be 4 or 8, got {itemsize}")
    segments = float(segments)
    if segments < 0 or (nnz and segments > nnz) or (nnz and segments < 1):
        raise ValueError(f"segments must be in [1, nnz] (got {segments} for nnz={nnz})")
    fi = int(itemsize)
    vi = int(value_itemsize or itemsize)
    rows = int(shape[mode] if rows is None else rows)
    out_row = rank * fi
    row_bytes = _row_bytes(rank, fi, sector)
    tiles = int(math.ceil(nnz / tile_nnz)) if tiles is None else int(tiles)
    items = int(math.ceil(nnz / DEFAULT_ITEM_NNZ)) if items is None else int(items)

    nz_bytes = nnz * (INDEX_BYTES + vi)
    factors_worst = nnz * (N - 1) * row_bytes
    factors_best = sum(min(shape[m], nnz) for m in range(N) if m != mode) * row_bytes
    factors = factors_worst - cache_hit * (factors_worst - factors_best)

    shared_atomics = 0.0
    merge = 0.0
    if conflict == "register":
        output = segments * out_row
        global_atomics = segments * rank
        k = 0
        stash = 0
    else:
        k = max(1, int(copies))
        stash = int(stash_rows_for(N, rank, fi) if stash_rows is None else stash_rows)
        in_stash = min(stash, rows)
        if stash_segments is None:
            stash_segments = segments * (min(1.0, stash / rows) if rows else 0.0)
        stash_segments = float(min(stash_segments, segments))
        if block_rows is None:
            block_rows = min(stash_segments, tiles * in_stash)
        block_rows = float(block_rows)
        direct = segments - stash_segments
        output = (direct + block_rows) * out_row
        global_atomics = (direct + block_rows) * rank
        shared_atomics = stash_segments * rank
        merge = (k + 2) * rows * out_row

    h2d_write = decode = link = 0.0
    if streamed:
        h2d_write = nz_bytes
        decode = nnz * (3 if delta else 2) * INDEX_BYTES
        link = nz_bytes + tiles * (16 + 8 * N) + items * 16 + 8
    setup_link = rows * out_row * (2 + k)  # zeroed output (and copies) up, result down

    def device(fb: float) -> float:
        return nz_bytes + fb + output + merge + h2d_write + decode

    bw, lk = bandwidth_GBps * 1e9, link_GBps * 1e9
    dev, dev_best, dev_worst = device(factors), device(factors_best), device(factors_worst)
    link_s = link / lk
    setup_link_s = setup_link / lk

    def total(d: float) -> float:
        return max(d / bw, link_s)

    pred = total(dev)
    return {
        "variant": f"{'streamed' if streamed else 'resident'}/{conflict}",
        "conflict": conflict,
        "streamed": bool(streamed),
        "shape": list(shape),
        "nnz": nnz,
        "rank": rank,
        "mode": mode,
        "rows": rows,
        "itemsize": fi,
        "value_itemsize": vi,
        "segments": segments,
        "segments_per_nnz": segments / nnz if nnz else 0.0,
        "cache_hit": float(cache_hit),
        "bandwidth_GBps": float(bandwidth_GBps),
        "link_GBps": float(link_GBps),
        "copies": k,
        "stash_rows": stash,
        "tiles": tiles,
        "bytes": {
            "nonzeros": nz_bytes,
            "factors": factors,
            "factors_best": factors_best,
            "factors_worst": factors_worst,
            "output": output,
            "merge": merge,
            "h2d_write": h2d_write,
            "decode": decode,
        },
        "device_bytes": dev,
        "device_bytes_best": dev_best,
        "device_bytes_worst": dev_worst,
        "bytes_per_nnz": dev / nnz if nnz else 0.0,
        "link_bytes": link,
        "setup_link_bytes": setup_link,
        "factor_upload_bytes": sum(shape) * out_row,
        "global_atomics": global_atomics,
        "shared_atomics": shared_atomics,
        "flops": 2.0 * nnz * rank * (N - 1),
        "device_s": dev / bw,
        "device_best_s": dev_best / bw,
        "device_worst_s": dev_worst / bw,
        "link_s": link_s,
        "setup_link_s": setup_link_s,
        "predicted_s": pred,
        "predicted_best_s": total(dev_best),
        "predicted_worst_s": total(dev_worst),
        "predicted_call_s": pred + setup_link_s,
        "bound": "link" if streamed and link_s > dev / bw else "device",
    }


def predict_all(
    shape: Sequence[int], nnz: int, rank: int, mode: int, segments: float, *, sm_count: int = DEFAULT_SM_COUNT, **kw
) -> dict:
    """:func:`predict` for the four variants, the ``auto`` choice, and the predicted streamed over
    in-memory throughput of the ``auto`` choice (``resident time / streamed time``, <= 1) in the
    best and the worst factor-reuse case."""
    out = {
        v: predict(shape, nnz, rank, mode, segments, conflict=v.split("/")[1], streamed=v.startswith("s"), **kw)
        for v in VARIANTS
    }
    rows = int(kw.get("rows") or shape[mode])
    auto = choose_conflict(rows, sm_count)
    res, st = out[f"resident/{auto}"], out[f"streamed/{auto}"]
    out["auto"] = auto
    for case in ("best", "worst"):
        t = st[f"predicted_{case}_s"]
        out[f"streamed_over_resident_{case}"] = res[f"predicted_{case}_s"] / t if t else 1.0
    return out


# --- segment counts from the data --------------------------------------------------------------


def segments_from_changes(changes: np.ndarray, mode: int) -> int:
    """Target-row changes in ALTO order summed over work items (``WorkItems.changes``): the flushes
    of a walk that never breaks a run except at item boundaries."""
    return int(np.asarray(changes)[:, mode].sum())


def item_keys(
    index: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    base: np.ndarray,
    shift: np.ndarray,
    mask: np.ndarray,
    mode: int,
) -> np.ndarray:
    """Mode-``mode`` coordinate of every nonzero position of ``index`` (-1 where no work item
    covers it), from re-encoded BLCO indices, the work items ``[start, end)`` and their block
    ``base`` (``WorkItems`` fields) and the layout's ``field_shift`` / ``field_mask``."""
    index = np.asarray(index)
    start = np.asarray(start, dtype=np.int64)
    n = np.asarray(end, dtype=np.int64) - start
    first = np.concatenate([[0], np.cumsum(n)])
    item = np.repeat(np.arange(start.shape[0], dtype=np.int64), n)
    pos = start[item] + (np.arange(int(first[-1]), dtype=np.int64) - first[:-1][item])
    field = (index[pos] >> np.uint64(int(shift[mode]))) & np.uint64(int(mask[mode]))
    keys = np.full(index.shape[0], -1, dtype=np.int64)
    keys[pos] = np.asarray(base, dtype=np.int64)[item, mode] + field.astype(np.int64)
    return keys


def kernel_segments(
    keys: np.ndarray,
    tile_start: np.ndarray,
    tile_end: np.ndarray,
    coarsen: int = 4,
    stash_rows: int = 0,
    tile_lo: np.ndarray | None = None,
    lanes: int = 32,
) -> dict:
    """Flushes of the GPU kernel for target rows ``keys`` (one per nonzero position), counted on
    the CPU exactly as :func:`.gpu.mttkrp_tiles` walks them.

    A tile ``[tile_start, tile_end)`` is split into 32-nonzero sub-tiles; warp ``w`` takes sub-tiles
    ``w * coarsen .. + coarsen``. In a sub-tile the nonzeros are reordered into groups of one row,
    groups ordered by their first lane; lane group ``g`` of the computing phase (``32 / lanes``
    groups, ``lanes`` = :func:`..gpu.launch.lanes_for` of the rank) walks reordered slots
    ``g * lanes .. (g + 1) * lanes - 1`` and flushes at every row change. Its accumulator carries to
    its slots of the warp's next sub-tile, so a run continuing there adds no flush. ``keys[i]`` is
    the target row of nonzero position ``i`` (:func:`item_keys`); tiles are those of
    :func:`.gpu_plan.device_tiles` (at most ``32 * warps * coarsen`` nonzeros).

    The hierarchical stash of a tile holds rows ``tile_lo[t] .. tile_lo[t] + stash_rows - 1`` (the
    kernel's window starts at the tile's smallest target row; ``tile_lo`` defaults to 0).

    Returns ``segments``, ``stash_segments`` (segments with their row inside the tile's stash
    window), ``block_rows`` (sum over tiles of the distinct window rows they touch) and ``tiles``.
    """
    keys = np.asarray(keys, dtype=np.int64)
    ts = np.asarray(tile_start, dtype=np.int64)
    te = np.asarray(tile_end, dtype=np.int64)
    n = te - ts
    T = int(ts.shape[0])
    if T == 0 or int(n.sum()) == 0:
        return {"segments": 0, "stash_segments": 0, "block_rows": 0, "tiles": T}
    lo = np.zeros(T, dtype=np.int64) if tile_lo is None else np.asarray(tile_lo, dtype=np.int64)
    G = 32 // int(lanes)
    first = np.concatenate([[0], np.cumsum(n)])
    tile = np.repeat(np.arange(T, dtype=np.int64), n)
    off = np.arange(int(first[-1]), dtype=np.int64) - first[:-1][tile]
    k = keys[ts[tile] + off]
    subs = max(1, -(-int(n.max()) // 32))
    sub = tile * subs + off // 32  # global sub-tile id, consecutive within a tile
    # the warp's reordering: rows by first occurrence, a row's nonzeros in lane order
    o1 = np.lexsort((off, k, sub))
    new_row = np.ones(o1.shape[0], dtype=bool)
    new_row[1:] = (sub[o1][1:] != sub[o1][:-1]) | (k[o1][1:] != k[o1][:-1])
    first_off = np.empty(o1.shape[0], dtype=np.int64)
    first_off[o1] = off[o1][new_row][np.cumsum(new_row) - 1]
    o2 = np.lexsort((off, first_off, sub))  # slot order within each sub-tile
    s2, k2 = sub[o2], k[o2]
    sub_first = np.ones(o2.shape[0], dtype=bool)
    sub_first[1:] = s2[1:] != s2[:-1]
    starts = np.flatnonzero(sub_first)
    slot = np.arange(o2.shape[0]) - starts[np.cumsum(sub_first) - 1]
    pair = s2 * G + slot // int(lanes)  # (sub-tile, lane group), ascending
    # flush units: runs of one row inside one (sub-tile, lane group)
    unit = np.ones(o2.shape[0], dtype=bool)
    unit[1:] = (pair[1:] != pair[:-1]) | (k2[1:] != k2[:-1])
    u_pair, u_key = pair[unit], k2[unit]
    p_first = np.ones(u_pair.shape[0], dtype=bool)
    p_first[1:] = u_pair[1:] != u_pair[:-1]
    p_last = np.ones(u_pair.shape[0], dtype=bool)
    p_last[:-1] = u_pair[1:] != u_pair[:-1]
    first_pair, first_key = u_pair[p_first], u_key[p_first]
    last_pair, last_key = u_pair[p_last], u_key[p_last]
    # a lane group's last run carries into its first run of the warp's next sub-tile
    last_sub = last_pair // G
    nxt = last_pair + G
    at = np.minimum(np.searchsorted(first_pair, nxt), max(first_pair.shape[0] - 1, 0))
    same_warp = ((last_sub % subs) // coarsen == ((last_sub + 1) % subs) // coarsen) & ((last_sub + 1) % subs != 0)
    merged = (first_pair[at] == nxt) & same_warp & (first_key[at] == last_key)
    segments = int(u_pair.shape[0]) - int(merged.sum())
    stash_segments = block_rows = 0
    if stash_rows > 0:
        in_u = (u_key - lo[u_pair // G // subs]) < stash_rows
        in_last = (last_key - lo[last_sub // subs]) < stash_rows
        stash_segments = int(in_u.sum()) - int((merged & in_last).sum())
        rel = k - lo[tile]
        sel = rel < stash_rows
        if sel.any():
            block_rows = int(np.unique(tile[sel] * (int(stash_rows)) + rel[sel]).shape[0])
    return {"segments": segments, "stash_segments": stash_segments, "block_rows": block_rows, "tiles": T}
