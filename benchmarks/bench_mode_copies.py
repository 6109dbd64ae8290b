"""Streamed MTTKRP from a store's mode-sorted copies against its ALTO-ordered chunks and in memory.

    python benchmarks/bench_mode_copies.py --stores UBER.zarr NIPS.zarr --ranks 8 16 --threads 2 --repeat 15

Per store and rank, all-mode MTTKRP (factors one ``StackedFactors``, as CP-ALS keeps them), the
three ways interleaved round by round (load from other processes falls on all alike): in memory
(``tfo.mttkrp`` of the store's nonzeros encoded in memory: mode-sorted copies with run tables),
streamed from the store's copies (``tfo.mttkrp(store, ...)``) and streamed from its ALTO chunks
(``mode_copies=False``). ``--cpu-time``: CPU seconds of the process instead of wall seconds.
Prints best and median milliseconds and each stream's share of in-memory
throughput (best against best); the store is given its copies first where it has none
(``tfooc mode-copies``, reported with their bytes a nonzero). ``--pages 4k`` / ``2m``: each copy
file's page cache dropped and faulted back on 4 KiB pages (and the reader's drops turned off) or
in 2 MiB folios before the store is timed (docs/KERNELS.md, "2 MiB pages"); default: as found.
JSON to ``benchmarks/results/mode-copies-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import time
from pathlib import Path

import numpy as np

import tensorflow_ooc as tfo
from tensorflow_ooc.kernels import compile_kernels
from tensorflow_ooc.store import huge_pages

CLOCK = time.perf_counter


def _time(fn) -> float:
    t0 = CLOCK()
    fn()
    return CLOCK() - t0


def settle_pages(path: str, pages: str) -> None:
    """Drop each copy file's cached pages and fault them back through a mapping, advised
    ``MADV_HUGEPAGE`` (``2m``: 2 MiB folios) or not (``4k``)."""
    for f in sorted(Path(path, "sorted").glob("m*/*/c/*")):
        if f.parent.parent.name == "crc" or f.stat().st_size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if pages == "2m":
            huge_pages.advise(mm)
        int(np.frombuffer(mm, dtype=np.uint8)[:: mmap.PAGESIZE].sum())
        mm.close()


def bench_store(path: str, ranks: list[int], threads: int, repeat: int, pages: str = "as-is") -> list[dict]:
    store = tfo.open_store(path)
    if not store.copy_modes():
        store = tfo.build_mode_copies(store)
    if pages != "as-is":
        huge_pages.DROP_SMALL_PAGES = pages != "4k"
        settle_pages(store.path, pages)
    copies = store.info()["mode_copies"]
    coords, values = store.to_coo()
    tensor = tfo.encode_coo(coords, values, store.shape)
    N = store.nmodes
    rows = []
    for R in ranks:
        rng = np.random.default_rng(R)
        F = tfo.StackedFactors.from_list([rng.random((s, R)) for s in store.shape])
        ways = {
            "memory": lambda F=F: [tfo.mttkrp(tensor, F, n, threads=threads) for n in range(N)],
            "copies": lambda F=F: [tfo.mttkrp(store, F, n, threads=threads) for n in range(N)],
            "alto": lambda F=F: [tfo.mttkrp(store, F, n, threads=threads, mode_copies=False) for n in range(N)],
        }
        ref = ways["memory"]()
        for name in ("copies", "alto"):  # the same result every way
            got = ways[name]()
            err = max(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300) for a, b in zip(got, ref))
            assert err < 1e-10, (name, err)
        times: dict[str, list[float]] = {k: [] for k in ways}
        load = [os.getloadavg()[0]]
        for _ in range(repeat):
            for k, fn in ways.items():
                times[k].append(_time(fn))
        load.append(os.getloadavg()[0])
        best = {k: min(v) for k, v in times.items()}
        row = {
            "store": path,
            "rank": R,
            "threads": threads,
            "clock": CLOCK.__name__,
            "best_s": best,
            "median_s": {k: float(np.median(v)) for k, v in times.items()},
            "copies_vs_memory": best["memory"] / best["copies"],
            "alto_vs_memory": best["memory"] / best["alto"],
            "copy_modes": store.copy_modes(),
            "copy_bytes_per_nnz": {m: d["bytes_per_nnz"] for m, d in copies.items()},
            "load": load,
            "pages": pages,
        }
        rows.append(row)
        print(
            f"{Path(path).name[:24]:<24} R{R:<3} memory {best['memory'] * 1e3:7.2f} ms  copies "
            f"{best['copies'] * 1e3:7.2f} ({row['copies_vs_memory']:4.0%})  alto {best['alto'] * 1e3:7.2f} "
            f"({row['alto_vs_memory']:4.0%})  medians {row['median_s']['memory'] * 1e3:.2f} / "
            f"{row['median_s']['copies'] * 1e3:.2f} / {row['median_s']['alto'] * 1e3:.2f}  load "
            f"{load[0]:.1f}-{load[1]:.1f}",
            flush=True,
        )
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", nargs="+", required=True)
    ap.add_argument("--ranks", nargs="+", type=int, default=[8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the process's CPU seconds instead of wall seconds (with --threads 1: the kernels' own cost, "
        "far less moved by other processes on a shared machine than wall time)",
    )
    ap.add_argument("--pages", choices=["as-is", "4k", "2m"], default="as-is")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    print(f"kernels compiled or loaded in {compile_kernels(4, args.ranks):.1f} s")
    rows = [r for s in args.stores for r in bench_store(s, args.ranks, args.threads, args.repeat, args.pages)]
    out = Path(__file__).parent / "results" / f"mode-copies-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
