"""Dask clients: the embedded default (an in-process LocalCluster) or an existing scheduler.

Threads are shared out so that numba threads x Dask threads <= cores on every worker: kernels are
multi-threaded themselves, so each worker runs one task at a time and gives it all its cores.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import dask
from distributed import Client, LocalCluster

from ..limits import SLOT_RESOURCE  # the embedded workers' slots (see workflow.admission)
from .inline import InlineClient

log = logging.getLogger(__name__)


def numba_threads_for(worker_threads: int, worker_cores: int) -> int:
    """Numba threads per task so that tasks x numba threads <= cores."""
    return max(1, worker_cores // max(1, worker_threads))


DEVICES = ("auto", "cpu", "gpu")


def _gpu_probe() -> dict:
    """Run on a worker: can it run GPU kernels, and does it have a physical GPU?"""
    from ..kernels.gpu.device import gpu_unavailable, visible_gpu_count

    return {"reason": gpu_unavailable(), "physical": visible_gpu_count()}


def gpu_workers(client: Client, physical: bool = False) -> tuple[list[str], dict[str, str]]:
    """Workers that can run the GPU kernels (``physical``: on a real GPU, not the simulator), and
    for the others why not."""
    probes = client.run(_gpu_probe)
    ok = [a for a, p in probes.items() if not p["reason"] and (p["physical"] > 0 or not physical)]
    why = {a: p["reason"] or "no physical GPU (CUDA simulator)" for a, p in probes.items() if a not in ok}
    return sorted(ok), why


def resolve_device(client: Client, device: str) -> tuple[str, list[str]]:
    """``device`` ("auto", "cpu" or "gpu") made concrete for this cluster, with the GPU workers.
    ``auto`` takes GPU workers when the cluster has real GPUs; ``gpu`` also accepts the CUDA
    simulator and raises, naming each worker's reason, when no worker can run GPU kernels."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return "cpu", []
    workers, why = gpu_workers(client, physical=(device == "auto"))
    if workers:
        return "gpu", workers
    if device == "gpu":
        raise RuntimeError(
            "device='gpu' but no Dask worker can run GPU kernels: " + "; ".join(f"{a}: {r}" for a, r in why.items())
        )
    return "cpu", []


def _embedded_gpu_cluster(memory_limit, dashboard_address):
    """A LocalCUDACluster (one worker per visible GPU, each with a ``GPU`` resource) when GPUs are
    visible and dask-cuda is installed; else None."""
    from ..kernels.gpu.device import visible_gpu_count

    if visible_gpu_count() == 0:
        return None
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        log.info("GPUs are visible but dask-cuda is not installed: using the CPU cluster (pip install '.[gpu]')")
        return None
    return LocalCUDACluster(
        memory_limit=memory_limit, dashboard_address=dashboard_address, resources={"GPU": 1, SLOT_RESOURCE: 1}
    )


@contextmanager
def get_client(
    client: Client | None = None,
    scheduler: str | None = None,
    *,
    processes: bool = False,
    n_workers: int | None = None,
    memory_limit: int | str | None = "auto",
    dashboard_address: str | None = ":8787",
    device: str = "auto",
) -> Iterator[Client]:
    """The client to use: the one given, one connected to ``scheduler``, or a new embedded cluster.

    ``scheduler`` may also be "embedded" (the in-process LocalCluster, whatever the tensor) or
    "inline" (:class:`~tensorflow_ooc.execution.inline.InlineClient`: the same functions run at once
    in this process, no Dask; what ``cp_als`` picks by itself for small tensors).

    The embedded cluster is sized to the machine and logs its dashboard link; it is closed on exit.
    With ``device`` "auto" or "gpu" it is a LocalCUDACluster when GPUs are visible and dask-cuda
    is installed (one worker per GPU), else the CPU LocalCluster.
    """
    if client is not None:
        yield client
        return
    if scheduler == "inline":
        log.info(
            "running in this process without Dask (small tensor, or scheduler='inline'; "
            "scheduler='embedded' starts the local Dask cluster and its dashboard)"
        )
        yield InlineClient()
        return
    if scheduler and scheduler != "embedded":
        c = Client(scheduler)
        log.info("connected to scheduler %s (dashboard %s)", scheduler, c.dashboard_link)
        _monitor(c)
        try:
            yield c
        finally:
            c.close()
        return
    with dask.config.set(EMBEDDED_CONFIG):
        cluster = _embedded_cluster(processes, n_workers, memory_limit, dashboard_address, device)
    c = Client(cluster)
    log.info("embedded Dask cluster: %d worker(s), dashboard at %s", len(cluster.workers), c.dashboard_link)
    _monitor(c)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


#: The embedded workers' Dask settings. No statistical profiler: it samples every thread's stack
#: every 10 ms under the GIL, on the cores the kernels use (vast-shaped 26 M, rank 16, 2 cores:
#: about 3 % of a CP-ALS iteration on the in-process worker and on 2 process workers); the tfooc
#: page reports the runs instead.
EMBEDDED_CONFIG = {"distributed.worker.profile.enabled": False}


def _embedded_cluster(processes: bool, n_workers: int | None, memory_limit, dashboard_address, device: str):
    """The embedded cluster: GPU workers where usable, else one in-process worker of one thread or
    (``processes``) ``n_workers`` one-thread worker processes."""
    cores = os.cpu_count() or 1
    gpu_cluster = _embedded_gpu_cluster(memory_limit, dashboard_address) if device in ("auto", "gpu") else None
    if gpu_cluster is not None:
        cluster = gpu_cluster
    elif processes:
        n = n_workers or min(2, cores)
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            memory_limit=memory_limit,
            dashboard_address=dashboard_address,
            resources={SLOT_RESOURCE: 1},
        )
    else:
        cluster = LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            memory_limit=memory_limit,
            dashboard_address=dashboard_address,
            resources={SLOT_RESOURCE: 1},
        )
    return cluster


#: Called with the client of every embedded cluster started here, and by ``tfooc submit`` with
#: its client and storage root (``hook(client, storage=root)``). The monitoring stage, a layer
#: above, adds its dashboard page and metrics through it (registered by the package root), so
#: execution and workflow never import it.
ON_CLIENT: list[Callable[..., object]] = []


def _monitor(client: Client) -> None:
    """Run the embedded-cluster hooks (the tfooc page and metrics on the scheduler's dashboard)."""
    for hook in ON_CLIENT:
        hook(client)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one (a worker pinned
    with taskset, or limited by a container's cpuset), else every core."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this OS
        return os.cpu_count() or 1


def scheduler_workers(client: Client) -> dict:
    """The scheduler's workers (address -> info), asked of the scheduler itself.

    ``Client.scheduler_info()`` returns the client's cached identity, which the client's periodic
    refresh (every 2 s, without per-worker information in distributed 2026.8) can overwrite
    between the call's own refresh and its return: an empty worker list on a cluster that has
    workers (CI: "the Dask cluster has no workers" on a one-worker in-process cluster)."""
    if not isinstance(client, Client) or client.asynchronous:  # the inline scheduler's, or async
        return client.scheduler_info()["workers"]
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def in_this_process(addresses: Iterable[str]) -> bool:
    """Whether every one of these workers runs in this process (an in-process ``LocalCluster``,
    such as the embedded default: ``inproc://`` addresses carrying this process's id). Such a
    worker is never lost alone: it goes with the driver.

    Parameters
    ----------
    addresses : iterable of str
        Worker addresses.

    Returns
    -------
    bool
        False for no addresses.
    """
    found = list(addresses)
    pid = str(os.getpid())
    return bool(found) and all(a.startswith("inproc://") and a.split("/")[-2] == pid for a in found)


def worker_resources(client: Client) -> dict:
    """Per worker: Dask threads, memory limit and the numba threads each of its tasks may use.

    Workers on one host share its cores: numba threads = host cores // Dask threads on that host.
    """
    info = scheduler_workers(client)
    cores = client.run(usable_cores)
    host_threads: dict[str, int] = {}
    for addr, w in info.items():
        host = w.get("host") or addr.rsplit(":", 1)[0]
        host_threads[host] = host_threads.get(host, 0) + int(w.get("nthreads", 1))
    out = {}
    for addr, w in info.items():
        host = w.get("host") or addr.rsplit(":", 1)[0]
        out[addr] = {
            "dask_threads": int(w.get("nthreads", 1)),
            "memory_limit": int(w.get("memory_limit") or 0),
            "numba_threads": numba_threads_for(host_threads[host], int(cores.get(addr) or 1)),
        }
    return out
