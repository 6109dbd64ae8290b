"""A real Dask cluster as separate processes for the tests: ``dask scheduler`` (with the tfooc
monitoring preload) and ``dask worker`` processes under nannies, which restart a worker killed by
a signal, as a deployment does."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def until(predicate, timeout: float = 120.0, what: str = "condition", every: float = 0.1):
    """Poll ``predicate`` until it returns something true; that value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


@contextlib.contextmanager
def dask_processes(
    tmp: Path,
    storage: str,
    *,
    workers: int = 1,
    nthreads: int = 1,
    memory_limit: str = "2GiB",
    resources: str | None = None,
    env: dict | None = None,
) -> Iterator[dict]:
    """Start a scheduler and ``workers`` worker processes (each under a nanny); yields
    ``{"address", "base" (the dashboard URL), "logs"}``; everything stops after."""
    env = {**os.environ, **(env or {})}
    sched_file = tmp / "scheduler.json"
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as files:
        logs = {n: tmp / f"{n}.log" for n in ("scheduler", "worker")}
        out = {n: files.enter_context(open(p, "w")) for n, p in logs.items()}
        try:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0"]
                    + ["--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)]
                    + ["--preload", "tensorflow_ooc.monitoring", "--tfooc-storage", storage],
                    env=env,
                    stdout=out["scheduler"],
                    stderr=subprocess.STDOUT,
                )
            )
            info = until(lambda: sched_file.exists() and json.loads(sched_file.read_text() or "{}"), 60, "scheduler")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(sched_file)]
                    + ["--nworkers", str(workers), "--nthreads", str(nthreads), "--memory-limit", memory_limit]
                    + (["--resources", resources] if resources else [])
                    + ["--no-dashboard"],
                    env=env,
                    stdout=out["worker"],
                    stderr=subprocess.STDOUT,
                )
            )
            base = f"http://127.0.0.1:{info['services']['dashboard']}"
            until(lambda: json.loads(get(base + "/json/counts.json"))["workers"] >= workers, 90, "the workers")
            yield {"address": info["address"], "base": base, "logs": logs}
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
