"""GPU MTTKRP benchmark: in-memory (resident) vs streamed, hierarchical vs register, against a model.

    python benchmarks/bench_gpu.py                            # uber + nell2 shapes, rank 32, on the GPU
    python benchmarks/bench_gpu.py --tensor uber --rank 16 32 --check
    python benchmarks/bench_gpu.py --tensor nell2 --streams 4 --device-memory-limit 512M
    python benchmarks/bench_gpu.py --model-only               # predictions only: no GPU needed, fast
    python benchmarks/bench_gpu.py --model-only --sample-nnz 0   # count segments on the full tensors

On a GPU, per tensor, rank and target mode it measures the mode's MTTKRP
- resident: the tensor uploaded and decoded on the device once (``resident_batch``), then
  ``mttkrp_resident`` per mode: the whole call (output allocation, kernel, merge, copy back) and the
  kernels alone (CUDA events around the MTTKRP launch and, hierarchical, the merge);
- streamed: ``mttkrp_stream`` from the store over --streams CUDA streams with a device memory limit
  small enough to force several batches per stream (or --device-memory-limit);
each with conflict resolution forced to 'hierarchical', forced to 'register', and 'auto'. Times are
the best of --repeats after one warm-up call per variant; the warm-up calls (numba JIT of the
kernels, first chunk reads) are reported separately. In the same run it measures the device copy
bandwidth (device-to-device copy of a 512 MiB buffer, read + write counted) and the host link
(pinned host-to-device copy), both timed with CUDA events. Reported: effective GB/s of the kernels
(the model's minimal device traffic, factor rows read once, over the kernel time) against the
copy bandwidth, link GB/s of the streamed pass against the pinned copy, the in-memory over streamed
throughput ratio per mode (streamed throughput / in-memory throughput, seed 001 figure 6.3), the
model's prediction, and with --check the largest error against the CPU ``tfo.mttkrp``.

The model (tensorflow_ooc/kernels/mttkrp/gpu_model.py) counts bytes per variant: index (8 B) + value per
nonzero; N - 1 factor rows of R x itemsize per nonzero, from no reuse (worst) to each row read
once (best); R atomics per output flush (segment) for register-based resolution, stash flushes and
the K-copy merge for hierarchical; for streaming the host-to-device copy, its decode passes and the
link transfer. Predicted time = max(device bytes / bandwidth, link bytes / link) (+ the serial
output transfers in 'call' times). Segments are counted on the CPU from the data exactly as the
kernel walks the tiles; the ALTO-order row changes (WorkItems.changes) are reported beside them.

Without a GPU (no numba-cuda, no device, or the CUDA simulator, whose timings mean nothing) it
says so ("no GPU: timings not measured"), prints the model's predictions for an H100-class device
(defaults: --bandwidth 3350 GB/s, H100 SXM HBM3; --link 55 GB/s, effective PCIe Gen5 x16), writes
the JSON and exits 0. Nothing in it is a measurement. To stay fast it counts segments on a sample
of --sample-nnz nonzeros of the same shape (default 1,000,000) and applies the sample's segments
per nonzero to the modelled --nnz (default: the preset's); denser tensors have longer runs, so
this over-estimates segments (atomics) for the full tensor. --sample-nnz 0 uses all nonzeros.

Writes JSON to --json or benchmarks/results/gpu-<time>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels import StackedFactors  # noqa: E402
from tensorflow_ooc.kernels.gpu.device import gpu_unavailable, simulator_enabled  # noqa: E402
from tensorflow_ooc.kernels.gpu.launch import lanes_for  # noqa: E402
from tensorflow_ooc.kernels.mttkrp import gpu_model as gm  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.gpu import DEFAULT_COARSEN, DEFAULT_WARPS  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.gpu_plan import DEFAULT_COPIES, device_tiles  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DEFAULT_TENSORS = ("uber", "nell2")
CONFLICTS = ("hierarchical", "register", "auto")
DEFAULT_SAMPLE_NNZ = 1_000_000
COPY_BYTES = 512 << 20
TILE_NNZ = 32 * DEFAULT_WARPS * DEFAULT_COARSEN


def parse_bytes(text: str) -> int:
    """'268435456', '256M', '256MiB', '2G' -> bytes (binary multiples)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def no_gpu_reason() -> str:
    reason = gpu_unavailable()
    if not reason and simulator_enabled():
        reason = "the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): its timings mean nothing"
    return reason


# --- the data and its segment counts (CPU) -------------------------------------------------------------


def make_tensor(name: str, nnz: int, dtype: np.dtype, seed: int = 11):
    shape, _ = synthetic.PRESETS[name]
    coords, _ = synthetic.heavy_tailed(shape, nnz, seed=seed)
    values = np.random.default_rng(seed + 1).random(len(coords)).astype(dtype)
    return shape, coords, values


def segment_profile(tensor, ranks, itemsize: int) -> dict:
    """Per (rank, mode): the kernel's flushes (:func:`gpu_model.kernel_segments`), those inside the
    hierarchical stash, the stash rows flushed per block, and the ALTO-order row changes."""
    items = tensor_items(tensor)
    lay = tensor.layout
    tiles = device_tiles(items, TILE_NNZ)
    out = {}
    for mode in range(lay.nmodes):
        keys = gm.item_keys(items.index, items.start, items.end, items.base, lay.field_shift, lay.field_mask, mode)
        changes = gm.segments_from_changes(items.changes, mode)
        for R in ranks:
            stash = gm.stash_rows_for(lay.nmodes, R, itemsize)
            k = gm.kernel_segments(
                keys,
                tiles.start,
                tiles.end,
                coarsen=DEFAULT_COARSEN,
                stash_rows=stash,
                tile_lo=tiles.lo[:, mode],
                lanes=lanes_for(R),
            )
            out[(R, mode)] = {
                **k,
                "alto_changes": changes,
                "stash_rows": stash,
                "items": items.nitems,
                "sample_nnz": tensor.nnz,
            }
    return out


def model_for(
    shape,
    nnz: int,
    R: int,
    mode: int,
    prof: dict,
    itemsize: int,
    bw: float,
    link: float,
    sm: int,
    copies: int = DEFAULT_COPIES,
) -> dict:
    """The model's four variants for one mode, the sample's counts scaled to ``nnz``."""
    scale = nnz / prof["sample_nnz"]
    seg = min(float(nnz), max(1.0, prof["segments"] * scale))
    kw = dict(
        itemsize=itemsize,
        bandwidth_GBps=bw,
        link_GBps=link,
        copies=copies,
        stash_rows=prof["stash_rows"],
        stash_segments=min(seg, prof["stash_segments"] * scale),
        block_rows=prof["block_rows"] * scale,
        tile_nnz=TILE_NNZ,
    )
    if scale == 1:
        kw.update(tiles=prof["tiles"], items=prof["items"])
    pred = gm.predict_all(shape, nnz, R, mode, seg, sm_count=sm, **kw)
    pred["alto_changes_per_nnz"] = prof["alto_changes"] / prof["sample_nnz"]
    return pred


# --- model-only output ---------------------------------------------------------------------------------

MODEL_HEADER = (
    f"{'tensor':<8}{'R':>4}{'mode':>5}{'rows':>7}{'auto':>6}{'seg/nz':>8}{'chg/nz':>8}{'B/nz':>11}"
    f"{'res-hier ms':>14}{'res-reg ms':>14}{'str-hier ms':>14}{'str-reg ms':>14}{'str/res':>11}"
)


def _short(conflict: str) -> str:
    return {"hierarchical": "hier", "register": "reg"}.get(conflict, conflict)


def _ms(p: dict) -> str:
    return f"{p['predicted_best_s'] * 1e3:.2f}/{p['predicted_worst_s'] * 1e3:.2f}"


def print_model_row(name: str, R: int, mode: int, pred: dict) -> None:
    auto = pred["auto"]
    r = pred[f"resident/{auto}"]
    bpn = f"{r['device_bytes_best'] / r['nnz']:.0f}/{r['device_bytes_worst'] / r['nnz']:.0f}"
    print(
        f"{name:<8}{R:>4}{mode:>5}{r['rows']:>7}{_short(auto):>6}{r['segments_per_nnz']:>8.3f}"
        f"{pred['alto_changes_per_nnz']:>8.3f}{bpn:>11}"
        f"{_ms(pred['resident/hierarchical']):>14}{_ms(pred['resident/register']):>14}"
        f"{_ms(pred['streamed/hierarchical']):>14}{_ms(pred['streamed/register']):>14}"
        f"{pred['streamed_over_resident_best']:>6.2f}/{pred['streamed_over_resident_worst']:.2f}",
        flush=True,
    )


def run_model_only(args, itemsize: int, reason: str) -> dict:
    bw = args.bandwidth or gm.H100_HBM_GBPS
    link = args.link or gm.H100_LINK_GBPS
    sm = gm.DEFAULT_SM_COUNT
    print(
        f"model: device {bw:g} GB/s, link {link:g} GB/s, {sm} SMs for the auto heuristic, "
        f"{np.dtype(args.dtype).name}; predictions only, nothing here is measured"
    )
    print(
        "ms: predicted best/worst (factor rows read once / every nonzero reads its rows); B/nz: device bytes per "
        "nonzero, resident, auto; seg/nz: kernel flushes per nonzero; chg/nz: ALTO-order row changes; "
        "str/res: streamed over in-memory throughput, auto, best/worst"
    )
    print(MODEL_HEADER)
    rows = []
    for name in args.tensor:
        shape, preset_nnz = synthetic.PRESETS[name]
        nnz = args.nnz or preset_nnz
        sample = nnz if args.sample_nnz == 0 else min(nnz, args.sample_nnz)
        t0 = time.perf_counter()
        shape, coords, values = make_tensor(name, sample, np.dtype(args.dtype))
        tensor = tfo.encode_coo(coords, values, shape)
        prof = segment_profile(tensor, args.rank, itemsize)
        prof_s = time.perf_counter() - t0
        for R in args.rank:
            for mode in range(len(shape)):
                pred = model_for(shape, nnz, R, mode, prof[(R, mode)], itemsize, bw, link, sm)
                print_model_row(name, R, mode, pred)
                rows.append(
                    {
                        "tensor": name,
                        "shape": list(shape),
                        "nnz": nnz,
                        "sample_nnz": sample,
                        "rank": R,
                        "mode": mode,
                        "profile": prof[(R, mode)],
                        "profile_s": prof_s,
                        "predicted": pred,
                        "measured": None,
                    }
                )
    return {
        "gpu": False,
        "reason": reason,
        "bandwidth_GBps": bw,
        "link_GBps": link,
        "sm_count": sm,
        "bandwidth_source": "--bandwidth" if args.bandwidth else "default (H100 SXM HBM3)",
        "link_source": "--link" if args.link else "default (PCIe Gen5 x16, effective)",
        "rows": rows,
    }


# --- measurements (GPU only) ---------------------------------------------------------------------------


def copy_bandwidth(repeats: int, nbytes: int = COPY_BYTES) -> dict:
    """Device-to-device copy (read + write counted) and pinned host<->device copies, CUDA events."""
    from tensorflow_ooc.kernels.gpu.device import cuda

    n = nbytes // 8
    src = cuda.to_device(np.ones(n))
    dst = cuda.device_array(n, dtype=np.float64)
    host = cuda.pinned_array(n, dtype=np.float64)
    host[:] = 1.0
    s = cuda.stream()
    e0, e1 = cuda.event(), cuda.event()

    def best(fn) -> float:
        fn()
        s.synchronize()
        t = float("inf")
        for _ in range(max(1, repeats)):
            e0.record(s)
            fn()
            e1.record(s)
            e1.synchronize()
            t = min(t, e0.elapsed_time(e1) / 1e3)
        return t

    d2d = best(lambda: dst.copy_to_device(src, stream=s))
    h2d = best(lambda: dst.copy_to_device(host, stream=s))
    d2h = best(lambda: dst.copy_to_host(host, stream=s))
    dev = cuda.get_current_device()
    name = getattr(dev, "name", "unknown")
    name = name.decode() if isinstance(name, bytes) else str(name)
    return {
        "device": name,
        "compute_capability": list(getattr(dev, "compute_capability", ())),
        "copy_bytes": nbytes,
        "d2d_GBps": 2 * nbytes / d2d / 1e9,
        "h2d_pinned_GBps": nbytes / h2d / 1e9,
        "d2h_pinned_GBps": nbytes / d2h / 1e9,
    }


def _wall(fn) -> tuple[float, object]:
    from tensorflow_ooc.kernels.gpu.device import cuda

    cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    cuda.synchronize()
    return time.perf_counter() - t0, out


def kernel_seconds(batch, layout, F, mode: int, rows: int, opts, repeats: int) -> float:
    """Best CUDA-event time of the MTTKRP launch (+ the copies' merge, hierarchical) on a resident batch."""
    from tensorflow_ooc.execution.device_stream import DeviceMTTKRP
    from tensorflow_ooc.kernels.gpu.device import cuda
    from tensorflow_ooc.kernels.mttkrp.gpu import merge_kernel

    e0, e1 = cuda.event(), cuda.event()
    best = float("inf")
    for _ in range(max(1, repeats)):
        run = DeviceMTTKRP(layout, F, mode, 0, rows, opts)  # fresh zeroed output and copies
        cuda.synchronize()
        e0.record(batch.stream)
        run.launch(batch)
        if run.conflict == "hierarchical":
            n = rows * F.rank
            merge_kernel()[(n + 255) // 256, 256, batch.stream](run.copies, run.out)
        e1.record(batch.stream)
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3)
    return best


def stream_limit(store, rows: int, R: int, streams: int, batches: int) -> int:
    """A device memory limit that leaves room for about ``batches`` batches over ``streams`` buffer
    sets (the fixed part as ``device_stream.plan_batches`` counts it)."""
    per_chunk = store.chunk_nnz * (8 + store.value_dtype.itemsize)
    fixed = (sum(store.shape) + rows * (1 + DEFAULT_COPIES)) * R * 8
    S = max(1, min(streams, store.nchunks))
    per = max(1, store.nchunks // max(1, batches))
    return int(fixed + S * per * per_chunk + per_chunk // 2)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (elementwise relative error is meaningless near zero entries)."""
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    return float(np.abs(got.astype(np.float64) - ref).max() / scale) if scale else float(np.abs(got).max())


def measure_tensor(name: str, args, machine: dict, itemsize: int, workdir: Path) -> list[dict]:
    from tensorflow_ooc.execution.device_stream import (
        DeviceOptions,
        mttkrp_resident,
        mttkrp_stream,
        plan_batches,
        resident_batch,
    )
    from tensorflow_ooc.kernels.gpu.device import sm_count

    dtype = np.dtype(args.dtype)
    nnz = args.nnz or synthetic.PRESETS[name][1]
    t0 = time.perf_counter()
    shape, coords, values = make_tensor(name, nnz, dtype)
    gen_s = time.perf_counter() - t0
    tensor = tfo.encode_coo(coords, values, shape)
    t0 = time.perf_counter()
    store = tfo.convert(
        (coords, values), workdir / f"{name}.zarr", shape=shape, chunk_nnz=args.chunk_nnz, overwrite=True
    )
    convert_s = time.perf_counter() - t0
    del coords
    t0 = time.perf_counter()
    prof = segment_profile(tensor, args.rank, itemsize)
    prof_s = time.perf_counter() - t0
    bw = args.bandwidth or machine["d2d_GBps"]
    link = args.link or machine["h2d_pinned_GBps"]
    sm = sm_count()
    base_opts = DeviceOptions(streams=args.streams)
    # the resident tensor: uploaded and decoded once; the first build includes the decode kernels' JIT
    first_load_s, batch = _wall(lambda: resident_batch(store, 0, store.nchunks, base_opts, TILE_NNZ))
    del batch
    load_s, batch = _wall(lambda: resident_batch(store, 0, store.nchunks, base_opts, TILE_NNZ))
    print(
        f"{name}: shape {shape}, {tensor.nnz:,} nnz, {store.nchunks} chunks of {store.chunk_nnz:,}; generate "
        f"{gen_s:.1f} s, convert {convert_s:.1f} s, segment counts {prof_s:.1f} s, resident load {load_s:.3f} s "
        f"(first, with decode JIT: {first_load_s:.2f} s)",
        flush=True,
    )
    rows_out = []
    for R in args.rank:
        rng = np.random.default_rng(R)
        F = StackedFactors(shape, R, dtype)
        for v in F.views:
            v[...] = rng.random(v.shape)
        F64 = StackedFactors(shape, R, np.float64, data=F.data.astype(np.float64))
        for mode in range(len(shape)):
            rows = shape[mode]
            ref = tfo.mttkrp(tensor, F64, mode) if args.check else None
            limit = args.device_memory_limit or stream_limit(store, rows, R, args.streams, args.stream_batches)
            row = {
                "tensor": name,
                "shape": list(shape),
                "nnz": tensor.nnz,
                "rank": R,
                "mode": mode,
                "rows": rows,
                "dtype": dtype.name,
                "chunks": store.nchunks,
                "chunk_nnz": store.chunk_nnz,
                "stream_device_memory_limit": limit,
                "resident_load_s": load_s,
                "resident_first_load_s": first_load_s,
                "variants": {},
            }
            for conflict in CONFLICTS:
                v = row["variants"][conflict] = {}
                opts = DeviceOptions(conflict=conflict, streams=args.streams)
                try:
                    st: dict = {}
                    resident = functools.partial(mttkrp_resident, batch, store.layout, F, mode, 0, rows, opts, st)
                    v["resident_first_call_s"], _ = _wall(resident)
                    calls = []
                    for _ in range(args.repeats):
                        t, got = _wall(resident)
                        calls.append(t)
                    v["resident_call_s"] = min(calls)
                    v["resident_kernel_s"] = kernel_seconds(batch, store.layout, F, mode, rows, opts, args.repeats)
                    v["conflict_used"] = st.get("conflict")
                    v["resident_copies"] = st.get("copies")
                    if ref is not None:
                        v["resident_max_rel_err"] = rel_error(got, ref)
                except Exception as exc:  # one variant failing must not hide the others
                    v["resident_error"] = repr(exc)
                sopts = DeviceOptions(conflict=conflict, streams=args.streams, device_memory_limit=limit)
                try:
                    per, S = plan_batches(store, 0, store.nchunks, rows, F, mode, sopts)
                    v["stream_plan"] = {"chunks_per_batch": per, "streams": S, "batches": -(-store.nchunks // per)}
                    st = {}
                    streamed = functools.partial(mttkrp_stream, store, 0, store.nchunks, F, mode, 0, rows, sopts, st)
                    v["stream_first_call_s"], _ = _wall(streamed)
                    calls = []
                    for _ in range(args.repeats):
                        t, got = _wall(streamed)
                        calls.append(t)
                    v["stream_s"] = min(calls)
                    v["stream_stats"] = dict(st)
                    if ref is not None:
                        v["stream_max_rel_err"] = rel_error(got, ref)
                except Exception as exc:
                    v["stream_error"] = repr(exc)
            pred = model_for(shape, tensor.nnz, R, mode, prof[(R, mode)], itemsize, bw, link, sm)
            row["predicted"] = pred
            row["profile"] = prof[(R, mode)]
            derive(row, machine)
            rows_out.append(row)
            print_gpu_row(row)
    return rows_out


def derive(row: dict, machine: dict) -> None:
    """Effective bandwidths, ratios and model comparisons from the measured times."""
    pred = row["predicted"]
    for conflict, v in row["variants"].items():
        used = v.get("conflict_used") or (conflict if conflict != "auto" else pred["auto"])
        res, st = pred[f"resident/{used}"], pred[f"streamed/{used}"]
        if "resident_kernel_s" in v:
            v["kernel_GBps"] = res["device_bytes_best"] / v["resident_kernel_s"] / 1e9
            v["kernel_pct_copy_bw"] = 100 * v["kernel_GBps"] / machine["d2d_GBps"]
            v["kernel_over_model_best"] = v["resident_kernel_s"] / res["predicted_best_s"]
        if "stream_s" in v:
            v["stream_link_GBps"] = st["link_bytes"] / v["stream_s"] / 1e9
            v["stream_pct_link"] = 100 * v["stream_link_GBps"] / machine["h2d_pinned_GBps"]
            v["stream_over_model_best"] = v["stream_s"] / (st["predicted_best_s"] + st["setup_link_s"])
        if "stream_s" in v and "resident_call_s" in v:
            v["streamed_over_resident_throughput"] = v["resident_call_s"] / v["stream_s"]
    errs = [x for v in row["variants"].values() for k, x in v.items() if k.endswith("max_rel_err")]
    row["max_rel_err"] = max(errs) if errs else None


GPU_HEADER = (
    f"{'tensor':<8}{'R':>4}{'mode':>5}{'rows':>7}{'auto':>6}"
    f"{'res-h ms':>10}{'res-r ms':>10}{'res-a ms':>10}{'kern-a ms':>10}{'GB/s':>7}{'%cp':>5}"
    f"{'str-h ms':>10}{'str-r ms':>10}{'str-a ms':>10}{'link%':>6}{'str/res':>8}"
    f"{'model ms':>10}{'xmodel':>8}{'maxrelerr':>10}"
)


def print_gpu_row(r: dict) -> None:
    V = r["variants"]

    def ms(conflict: str, key: str) -> str:
        x = V[conflict].get(key)
        return f"{x * 1e3:>10.3f}" if x is not None else f"{'err':>10}"

    a = V["auto"]
    auto = a.get("conflict_used") or r["predicted"]["auto"]
    gbs = f"{a['kernel_GBps']:>7.0f}{a['kernel_pct_copy_bw']:>5.0f}" if "kernel_GBps" in a else f"{'-':>7}{'-':>5}"
    lk = f"{a['stream_pct_link']:>6.0f}" if "stream_pct_link" in a else f"{'-':>6}"
    sr = a.get("streamed_over_resident_throughput")
    ratio = f"{sr:>8.2f}" if sr is not None else f"{'-':>8}"
    model = r["predicted"][f"resident/{auto}"]["predicted_best_s"]
    xm = f"{a['kernel_over_model_best']:>8.1f}" if "kernel_over_model_best" in a else f"{'-':>8}"
    err = f"{r['max_rel_err']:>10.1e}" if r.get("max_rel_err") is not None else f"{'-':>10}"
    print(
        f"{r['tensor']:<8}{r['rank']:>4}{r['mode']:>5}{r['rows']:>7}{_short(auto):>6}"
        f"{ms('hierarchical', 'resident_call_s')}{ms('register', 'resident_call_s')}{ms('auto', 'resident_call_s')}"
        f"{ms('auto', 'resident_kernel_s')}{gbs}"
        f"{ms('hierarchical', 'stream_s')}{ms('register', 'stream_s')}{ms('auto', 'stream_s')}{lk}{ratio}"
        f"{model * 1e3:>10.3f}{xm}{err}",
        flush=True,
    )


def run_gpu(args, itemsize: int) -> dict:
    from tensorflow_ooc.kernels.gpu.device import sm_count

    machine = copy_bandwidth(args.repeats)
    machine.update(sm_count=sm_count(), cpus=os.cpu_count(), python=platform.python_version())
    print(
        f"device: {machine['device']} (cc {machine['compute_capability']}, {machine['sm_count']} SMs); measured "
        f"copy {machine['d2d_GBps']:.0f} GB/s device-to-device (read + write), "
        f"{machine['h2d_pinned_GBps']:.1f} GB/s pinned host-to-device, {machine['d2h_pinned_GBps']:.1f} GB/s back"
    )
    bw = args.bandwidth or machine["d2d_GBps"]
    link = args.link or machine["h2d_pinned_GBps"]
    print(
        f"model: device {bw:.0f} GB/s ({'--bandwidth' if args.bandwidth else 'measured copy'}), link {link:.1f} GB/s "
        f"({'--link' if args.link else 'measured pinned copy'})"
    )
    print(
        "res-*: in-memory call (output alloc + kernel + merge + copy back), best of --repeats; kern-a: kernels "
        "only (CUDA events), auto; GB/s, %cp: minimal model traffic / kern-a, and % of the copy bandwidth; "
        "str-*: streamed call; link%: streamed link bytes / time, % of the pinned copy; str/res: streamed / "
        "in-memory throughput (auto); model ms: predicted kernels, best case; xmodel: kern-a / model"
    )
    print(GPU_HEADER)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for name in args.tensor:
            rows += measure_tensor(name, args, machine, itemsize, Path(tmp))
    return {"gpu": True, "machine": machine, "bandwidth_GBps": bw, "link_GBps": link, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tensor",
        "--tensors",
        nargs="+",
        default=list(DEFAULT_TENSORS),
        choices=sorted(synthetic.PRESETS),
        help="synthetic shapes (default: uber nell2)",
    )
    ap.add_argument("--rank", "--ranks", nargs="+", type=int, default=[32], help="ranks (default 32)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"], help="factor and value dtype")
    ap.add_argument(
        "--repeats",
        type=lambda s: max(1, int(s)),
        default=5,
        help="timed calls per measurement; the best is kept (default 5)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="compare every GPU result with the CPU tfo.mttkrp (float64 reference): max |gpu - cpu| / "
        "max |cpu| per mode",
    )
    ap.add_argument("--streams", type=int, default=8, help="CUDA streams for the streamed runs (default 8)")
    ap.add_argument(
        "--device-memory-limit",
        type=parse_bytes,
        default=None,
        metavar="BYTES",
        help="device memory limit of the streamed runs, e.g. 512M (default: per mode, just enough for "
        "--stream-batches batches over the streams, so every pass streams)",
    )
    ap.add_argument(
        "--stream-batches",
        type=int,
        default=16,
        help="batches per streamed pass the default limit aims at (default 16)",
    )
    ap.add_argument("--chunk-nnz", type=int, default=1 << 18, help="nonzeros per stored chunk (default 262144)")
    ap.add_argument(
        "--nnz",
        type=int,
        default=None,
        help="nonzeros of each tensor: generated and measured on a GPU, modelled with --model-only "
        "(default: the preset's, uber 3,309,490, nell2 20,000,000)",
    )
    ap.add_argument(
        "--sample-nnz",
        type=int,
        default=DEFAULT_SAMPLE_NNZ,
        help="--model-only: nonzeros generated to count segments, scaled to --nnz; 0: all "
        f"(default {DEFAULT_SAMPLE_NNZ:,}; an upper estimate of the full tensor's segments)",
    )
    ap.add_argument("--model-only", action="store_true", help="print the model's predictions only; no GPU needed")
    ap.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        metavar="GB/s",
        help=f"device memory bandwidth for the model (default: the copy bandwidth measured on the GPU; "
        f"without one {gm.H100_HBM_GBPS:g} GB/s, H100 SXM HBM3)",
    )
    ap.add_argument(
        "--link",
        type=float,
        default=None,
        metavar="GB/s",
        help=f"host link bandwidth for the model (default: the pinned copy measured on the GPU; without "
        f"one {gm.H100_LINK_GBPS:g} GB/s, PCIe Gen5 x16 effective)",
    )
    ap.add_argument("--json", type=Path, default=None, help="output path (default benchmarks/results/gpu-<time>.json)")
    ap.add_argument("--workdir", default=None, help="directory for the temporary stores (default: the system tmp)")
    args = ap.parse_args(argv)
    itemsize = np.dtype(args.dtype).itemsize
    reason = no_gpu_reason()
    if reason:
        print(f"no GPU: timings not measured ({reason})")
        if args.check:
            print("--check needs a GPU: skipped")
    if reason or args.model_only:
        out = run_model_only(args, itemsize, reason)
    else:
        out = run_gpu(args, itemsize)
    out.update(
        args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    path = args.json or RESULTS / f"gpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=_jsonable))
    print(f"JSON: {path}")
    return 0


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


if __name__ == "__main__":
    sys.exit(main())
