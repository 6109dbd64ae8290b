"""Execution: Dask clusters, store partitions, and MTTKRP task graphs (streaming or in memory)."""

from .cluster import get_client, worker_resources
from .graph import EXECUTION_MODES, MTTKRPGraph
from .partitions import Partition, plan_partitions
from .tasks import Partial, PartitionData, combine, load_partition, mttkrp_partition

__all__ = ["EXECUTION_MODES", "MTTKRPGraph", "Partial", "Partition", "PartitionData", "combine", "get_client",
           "load_partition", "mttkrp_partition", "plan_partitions", "worker_resources"]
