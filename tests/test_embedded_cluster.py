"""The embedded cluster's workers: no statistical profiler taking the GIL every 10 ms from the kernels,
whatever Dask's configuration says (a setting of the embedded cluster only: a cluster the user
starts keeps its own)."""

from __future__ import annotations

import dask
from distributed import Client, LocalCluster

from tensorflow_ooc.execution.cluster import get_client


def _profiling(dask_worker=None) -> bool:
    return "profile" in dask_worker.periodic_callbacks


def test_embedded_workers_do_not_sample_stacks():
    # (the test session turns the profiler off for every worker: conftest.py; here it is on)
    with dask.config.set({"distributed.worker.profile.enabled": True}):
        with get_client(scheduler="embedded", dashboard_address=None, device="cpu") as c:
            assert list(c.run(_profiling).values()) == [False]
        with (
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc,
            Client(lc) as c,
        ):
            assert list(c.run(_profiling).values()) == [True]
