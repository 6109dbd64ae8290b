"""What every task graph over a partitioned input shares: where its tasks run, and its partitions.

:class:`~.graph.MTTKRPGraph` (with its dense form, :class:`~.dense_graph.DenseMTTKRPGraph`) and
:class:`~.ttm_graph.TTMGraph` are :class:`PartitionedGraph`\\ s: the input is opened, the workers
that run partition tasks are found (:func:`place_tasks`, the GPU workers of a GPU run) and the
input is cut into partitions, once, here; each graph then plans its execution and submits its
own tasks. The fixed-order tree reduction they all use is :func:`tree_reduce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from distributed import Client, Future

from ..store import Store, open_store
from .cluster import resolve_device, scheduler_workers, worker_resources
from .partitions import plan_partitions

EXECUTION_MODES = ("auto", "streaming", "in-memory")
IN_MEMORY_FRACTION = 0.5
DEFAULT_SPLIT_EVERY = 4


def tree_reduce(
    client: Client, futures: list[Future], fn: Callable, split_every: int, last: bool = False
) -> list[Future]:
    """Tree reduction of ``futures`` by ``fn`` with fan-in ``split_every``, in a fixed order (so
    sums are reproducible), down to one future, or with ``last`` to the last level (at most
    ``split_every`` futures, for the consumer to combine)."""
    level = list(futures)
    while len(level) > (split_every if last else 1):
        level = [
            client.submit(fn, *level[i : i + split_every], pure=False)
            if len(level[i : i + split_every]) > 1
            else level[i]
            for i in range(0, len(level), split_every)
        ]
    return level


@dataclass(frozen=True)
class TaskPlacement:
    """Where a graph's partition tasks run (:func:`place_tasks`)."""

    device: str  # "cpu" or "gpu"
    gpu_workers: list[str]  # the GPU workers' addresses (empty on CPU)
    resources: dict[str, dict]  # per worker that runs partition tasks, its ``worker_resources`` entry
    submit_options: dict  # ``client.submit`` keywords that keep a partition task there (the graphs' ``placement``)

    @property
    def numba_threads(self) -> int:
        """Numba threads of one task: the fewest any of these workers allows."""
        return min(r["numba_threads"] for r in self.resources.values())

    @property
    def default_partitions(self) -> int:
        """One partition per Dask thread: every extra task per mode costs a scheduling hop, and a
        streaming task reads ahead inside itself, so more partitions buy nothing on one worker.
        On GPU workers one partition per GPU: a device runs one task's batches over its streams."""
        if self.device == "gpu":
            return len(self.gpu_workers)
        return sum(r["dask_threads"] for r in self.resources.values())

    @property
    def memory_limits(self) -> list[int]:
        """Per worker, its memory limit (0: none)."""
        return [r["memory_limit"] for r in self.resources.values()]

    @property
    def memory_budget(self) -> int | None:
        """The workers' memory limits together; None when any worker has none."""
        limits = self.memory_limits
        return sum(limits) if all(limits) else None

    @property
    def smallest_limit(self) -> int | None:
        """The smallest worker memory limit; None when any worker has none."""
        limits = self.memory_limits
        return min(limits) if all(limits) else None


def place_tasks(client: Client, device: str) -> TaskPlacement:
    """The workers that run partition tasks for ``device`` ("auto", "cpu" or "gpu"; see
    :func:`~.cluster.resolve_device`): every worker on CPU; on GPU the GPU workers, reached by a
    ``GPU`` resource when they all have one, else by their addresses."""
    res = worker_resources(client)
    if not res:
        raise RuntimeError("the Dask cluster has no workers")
    device, gpu_addrs = resolve_device(client, device)
    submit_options: dict = {}
    if device == "gpu":
        res = {a: r for a, r in res.items() if a in gpu_addrs}
        info = scheduler_workers(client)
        if all(info[a].get("resources", {}).get("GPU") for a in gpu_addrs):
            submit_options = {"resources": {"GPU": 1}}
        else:
            submit_options = {"workers": gpu_addrs, "allow_other_workers": False}
    return TaskPlacement(device, gpu_addrs, res, submit_options)


def fits_in_memory(decoded: int, budget: int | None) -> bool:
    """Whether ``decoded`` bytes of partitions take at most ``IN_MEMORY_FRACTION`` of ``budget``
    (``auto`` execution without a memory plan then holds them in memory)."""
    return budget is None or decoded <= IN_MEMORY_FRACTION * budget


class PartitionedGraph:
    """A task graph over one partitioned input on one Dask cluster: the input opened
    (``path``, ``store``), where its tasks run (``device``, ``placement``, ``resources``,
    ``numba_threads``) and its partitions (``n_parts`` asked, ``parts`` planned), resolved once.

    Subclasses open another input with :meth:`_open` and cut it with :meth:`_partitions`; the
    defaults are a BLCO store's. ``data`` holds the futures of partitions kept in worker memory
    (None: tasks read their partitions themselves, from :meth:`_source_ref`)."""

    def __init__(
        self,
        client: Client,
        path,
        *,
        execution: str,
        partitions: int | None,
        split_every: int,
        max_partition_nnz: int | None,
        device: str,
    ) -> None:
        if execution not in EXECUTION_MODES:
            raise ValueError(f"execution must be one of {EXECUTION_MODES}, got {execution!r}")
        self.client = client
        self.path, self.store = self._open(path)
        self.split_every = max(2, int(split_every))
        self.task_placement = place_tasks(client, device)
        self.device = self.task_placement.device
        self.placement: dict = self.task_placement.submit_options
        self.resources = self.task_placement.resources
        self.numba_threads = self.task_placement.numba_threads
        self.partitions_asked = partitions  # None: one per Dask thread (the graph may plan otherwise)
        self.max_partition_nnz = max_partition_nnz
        self.n_parts = partitions or self.task_placement.default_partitions
        self.parts: list = self._partitions(self.n_parts, max_partition_nnz)
        self.data: list[Future] | None = None

    def _open(self, path) -> tuple[str, object]:
        """The input's path and its opened form (here a BLCO store; see the dense graph); a store the
        caller opened is used as it is, not opened (and its chunk positions checked) again."""
        if isinstance(path, Store):
            return str(path.path), path
        return str(path), open_store(str(path))

    def _partitions(self, n_parts: int, max_partition_nnz: int | None) -> list:
        return plan_partitions(self.store, n_parts, max_partition_nnz)

    def _source_ref(self):
        """What a streaming partition task is given to read its partition from (the store path)."""
        return self.path

    def sources(self) -> Sequence:
        """What each partition task is given: its partition's future in worker memory, or
        ``(source, partition)`` to read it from."""
        if self.data is not None:
            return self.data
        ref = self._source_ref()
        return [(ref, p) for p in self.parts]
