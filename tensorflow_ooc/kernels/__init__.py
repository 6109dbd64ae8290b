"""Compute kernels: CPU MTTKRP on BLCO work items with conflict resolution."""

from .factors import StackedFactors
from .mttkrp.dispatch import compile_kernels, mttkrp, run_items, tensor_items
from .mttkrp.plan import ConflictPlan, WorkItems, plan_conflicts, work_items

__all__ = [
    "ConflictPlan",
    "StackedFactors",
    "WorkItems",
    "compile_kernels",
    "mttkrp",
    "plan_conflicts",
    "run_items",
    "tensor_items",
    "work_items",
]
