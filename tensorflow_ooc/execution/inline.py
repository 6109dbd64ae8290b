"""In-process execution of the same task graphs, for tensors too small to pay Dask's task cost.

A CP-ALS iteration on a 10^4-nonzero tensor needs a few milliseconds of kernels, while each Dask
task costs about a millisecond of scheduling, and an iteration has several per mode; even at
millions of nonzeros those hops are a tenth of an iteration. The embedded
default therefore runs small tensors through :class:`InlineClient`: it has the few ``Client``
methods the execution and decomposition layers use, and runs each submitted function at once in
the calling thread (the kernels are multi-threaded themselves). The functions and their order are
exactly those of the distributed graph; only the scheduler differs. A client or scheduler given by
the user always gets the distributed graph.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import psutil

INLINE_ADDRESS = "inline://this-process"
# The embedded default runs tensors up to this size in this process. An embedded LocalCluster
# adds about 20 ms of scheduling and transfers to every CP-ALS iteration (uber-shaped, 3.3 M
# nonzeros, rank 16, 2 cores: 7 % of the iteration outside MTTKRP against 1-2 % in this process);
# at 2^24 nonzeros an iteration takes about a second and that cost falls to about 2 %, so larger
# tensors keep the cluster (its dashboard, its worker memory limits and fault tolerance).
INLINE_MAX_NNZ = 1 << 24


class InlineFuture:
    """The result of a function :class:`InlineClient` already ran."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self) -> Any:
        return self._value

    def done(self) -> bool:
        return True


def _resolve(x: Any) -> Any:
    if isinstance(x, InlineFuture):
        return x.result()
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(v) for v in x)
    return x


class InlineClient:
    """Runs submitted functions immediately in this process (one "worker" with all cores)."""

    inline = True
    dashboard_link = None

    def submit(
        self,
        fn: Callable,
        *args: Any,
        pure: bool | None = None,
        key: str | None = None,
        resources: dict | None = None,
        workers: Any = None,
        allow_other_workers: bool | None = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> InlineFuture:
        return InlineFuture(fn(*_resolve(list(args)), **{k: _resolve(v) for k, v in kwargs.items()}))

    def scatter(self, data: Any, hash: bool = True, **kwargs: Any) -> Any:
        if isinstance(data, (list, tuple)):
            return type(data)(InlineFuture(v) for v in data)
        return InlineFuture(data)

    def run(self, fn: Callable, *args: Any, workers: Any = None, **kwargs: Any) -> dict:
        return {INLINE_ADDRESS: fn(*args, **kwargs)}

    def scheduler_info(self) -> dict:
        return {
            "workers": {
                INLINE_ADDRESS: {
                    "nthreads": 1,
                    "host": "localhost",
                    "resources": {},
                    "memory_limit": process_memory_limit(),
                }
            }
        }

    def close(self) -> None:
        pass


def process_memory_limit() -> int:
    """The memory this process may use: its Dask worker's memory limit when it is a worker's
    (a submitted run's driver runs its small decompositions inline, in the worker's process, which
    the nanny stops at that limit), else the host's RAM.

    Returns
    -------
    int
        Bytes.
    """
    # distributed is loaded in every worker process; where it is not, this is no worker
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            worker = distributed.get_worker()
        except Exception:  # not inside a worker's task (ValueError in distributed 2026)
            worker = None
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
        if limit:
            return int(limit)
    return int(psutil.virtual_memory().total)


def is_inline(client: Any) -> bool:
    return bool(getattr(client, "inline", False))
