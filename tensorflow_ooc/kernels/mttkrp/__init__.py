"""Sparse MTTKRP on BLCO data, one family: the entry points (``dispatch``), CPU kernels (``cpu``,
``owned`` for rows spread too far for private accumulators), their GPU twins (``gpu``, with the
device-side decode ``decode_gpu`` and launch plans ``gpu_plan``), the conflict-resolution plan
(``plan``), mode-sorted work items (``mode_order``) and the GPU traffic model (``gpu_model``)."""

from .dispatch import ThreadOutputs, compile_kernels, mttkrp, numba_threads, run_items, tensor_items
from .plan import ConflictPlan, WorkItems, plan_conflicts, work_items

__all__ = [
    "ConflictPlan",
    "ThreadOutputs",
    "WorkItems",
    "compile_kernels",
    "mttkrp",
    "numba_threads",
    "plan_conflicts",
    "run_items",
    "tensor_items",
    "work_items",
]
