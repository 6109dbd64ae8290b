"""The embedded cluster's workers: no statistical profiler taking the GIL every 10 ms from the kernels,
whatever Dask's configuration says (a setting of the embedded cluster only: a cluster the user
starts keeps its own)."""

from __future__ import annotations

import dask
import pytest
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


def _blas_threads_in_and_after_the_limit() -> tuple[list[int], list[int]]:
    from threadpoolctl import threadpool_info

    from tensorflow_ooc.blas_threads import one_blas_thread

    def counts():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    with one_blas_thread():
        inside = counts()
    return inside, counts()


def test_update_blas_runs_on_one_thread_inside_an_embedded_worker_task():
    """The update's BLAS limit holds in the embedded worker's task thread and is lifted after. A
    limit that did not hold there once made the embedded path 1.6x slower: threadpoolctl lets only
    one thread at a time set OpenBLAS's process-wide pool (docs/KERNELS.md)."""
    import scipy.linalg  # noqa: F401  (loads scipy's own BLAS, which the update also calls)
    from threadpoolctl import threadpool_info

    from tensorflow_ooc.blas_threads import one_blas_thread

    before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    if not before or min(before) < 2:
        pytest.skip(f"BLAS runs on {before} threads here: a limit to one cannot be seen")
    with one_blas_thread():  # the driver's thread limits first, as a run's driver does
        pass
    with get_client(scheduler="embedded", dashboard_address=None, device="cpu") as c:
        inside, after = c.submit(_blas_threads_in_and_after_the_limit, pure=False).result()
    assert inside == [1] * len(before), inside
    assert after == before, after
