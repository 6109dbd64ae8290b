"""Tensor-train kernels: the cores in one array (:mod:`.cores`) and the exact TT-ALS contraction
of a core's least-squares right-hand side at the nonzeros, and the residual there (:mod:`.cpu`)."""

from .cores import TTCores
from .cpu import core_contraction, residual_sums

__all__ = ["TTCores", "core_contraction", "residual_sums"]
