"""The fiber index build against the convert of the same tensor (issue 47: build <= 2x convert).

Converts a store's nonzeros into a fresh store under OUT, then times ``tfooc fiber-index`` of
that store in its own process (wall, CPU, peak RSS from ``/usr/bin/time``) under each memory
limit given, and prints one JSON line per build. The convert is either ``tfo.convert`` of the
nonzeros read into memory (``--convert memory``, the default), or, for a store larger than
memory, ``tfo.convert`` out of core of a ``BatchSource`` of its chunks read one at a time
(``--convert out-of-core --convert-memory-limit 4GiB``), in its own process, timed the same way.

    flock /tmp/tfooc-bench.lock python benchmarks/bench_fiber_index_build.py SRC OUT \\
        --memory-limit 4GiB --memory-limit default
    flock /tmp/tfooc-bench.lock python benchmarks/bench_fiber_index_build.py SRC OUT \\
        --convert out-of-core --convert-memory-limit 4GiB --memory-limit 4GiB

Use the bench lock: a build is tens of seconds of both cores (at 500 M nonzeros, tens of minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tensorflow_ooc as tfo


def _timed_convert(src: str, out: str) -> dict:
    store = tfo.open_store(src)
    coords, values = store.to_coo()
    t0, c0 = time.perf_counter(), time.process_time()
    tfo.convert((coords, values), out, shape=store.shape, overwrite=True, compression=store.meta["compression"])
    return {"convert_s": time.perf_counter() - t0, "convert_cpu_s": time.process_time() - c0, "nnz": store.nnz}


# the convert of a store's chunks, one at a time, out of core; prints its own seconds (the
# interpreter's start and imports left out, as for the build's log)
_OOC_CONVERT = """
import json, sys, time
import tensorflow_ooc as tfo
from tensorflow_ooc.ingest import BatchSource

src, out, limit = sys.argv[1:4]
store = tfo.open_store(src)
chunks = ((ch.coords(store.layout), ch.values) for ch in store.iter_chunks())
source = BatchSource(chunks, store.nmodes, store.shape, store.nnz, store.value_dtype, name=src)
t0 = time.perf_counter()
tfo.convert(source, out, overwrite=True, out_of_core=True, memory_limit=limit,
            compression=store.meta["compression"])
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def _timed_convert_ooc(src: str, out: str, memory_limit: str) -> dict:
    cmd = ["/usr/bin/time", "-f", "TIME %e %U %S %M", sys.executable, "-c", _OOC_CONVERT, src, out, memory_limit]
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if run.returncode:
        raise SystemExit(f"convert failed:\n{run.stderr[-4000:]}")
    wall, user, system, rss_kb = re.findall(r"TIME (\S+) (\S+) (\S+) (\S+)", run.stderr)[-1]
    return {
        "convert": f"out of core, {memory_limit}",
        "convert_s": json.loads(run.stdout.strip().splitlines()[-1])["seconds"],
        "convert_process_s": float(wall),
        "convert_cpu_s": float(user) + float(system),
        "convert_peak_rss_gb": int(rss_kb) * 1024 / 1e9,
        "nnz": tfo.open_store(out).nnz,
    }


def _timed_build(store: str, memory_limit: str) -> dict:
    cmd = [sys.executable, "-m", "tensorflow_ooc.cli", "fiber-index", store, "--overwrite"]
    if memory_limit != "default":
        cmd += ["--memory-limit", memory_limit]
    timed = ["/usr/bin/time", "-f", "TIME %e %U %S %M", *cmd]
    run = subprocess.run(timed, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if run.returncode:
        raise SystemExit(f"fiber-index failed:\n{run.stderr[-4000:]}")
    wall, user, system, rss_kb = re.findall(r"TIME (\S+) (\S+) (\S+) (\S+)", run.stderr)[-1]
    info = tfo.open_store(store).fibers.describe()
    return {
        "memory_limit": memory_limit,
        "build_s": float(wall),
        "build_cpu_s": float(user) + float(system),
        "peak_rss_gb": int(rss_kb) * 1024 / 1e9,
        "bytes_per_nnz": {m: round(d["bytes_per_nnz"], 2) for m, d in info.items()},
        "log": [line for line in run.stderr.splitlines() if "fiber index" in line][-9:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="a store whose nonzeros are converted again")
    ap.add_argument("out", help="a folder for the converted store (removed at the end unless --keep)")
    ap.add_argument("--memory-limit", action="append", default=None, help="build limit(s); 'default' for none")
    ap.add_argument("--convert", choices=("memory", "out-of-core"), default="memory")
    ap.add_argument("--convert-memory-limit", default="4GiB", help="--convert out-of-core: its memory limit")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    store = str(Path(args.out) / "converted.zarr")
    if args.convert == "memory":
        converted = _timed_convert(args.src, store)
    else:
        converted = _timed_convert_ooc(args.src, store, args.convert_memory_limit)
    row = {"src": args.src, "load": os.getloadavg(), **converted}
    print(json.dumps(row), flush=True)
    for limit in args.memory_limit or ["default"]:
        b = _timed_build(store, limit)
        print(json.dumps({**row, **b, "ratio": round(b["build_s"] / row["convert_s"], 2)}), flush=True)
    if not args.keep:
        shutil.rmtree(store)


if __name__ == "__main__":
    main()
