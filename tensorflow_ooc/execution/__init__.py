"""Execution: Dask clusters, store partitions, and MTTKRP task graphs (streaming or in memory)."""

from .cluster import DEVICES, get_client, gpu_workers, resolve_device, worker_resources
from .device_stream import DeviceOptions, StreamSchedule, mttkrp_gpu
from .graph import EXECUTION_MODES, MTTKRPGraph
from .partials import Partial
from .partitions import Partition, plan_partitions
from .tasks import PartitionData, combine, load_partition, mttkrp_partition

__all__ = [
    "DEVICES",
    "DeviceOptions",
    "StreamSchedule",
    "mttkrp_gpu",
    "gpu_workers",
    "resolve_device",
    "EXECUTION_MODES",
    "MTTKRPGraph",
    "Partial",
    "Partition",
    "PartitionData",
    "combine",
    "get_client",
    "load_partition",
    "mttkrp_partition",
    "plan_partitions",
    "worker_resources",
]
