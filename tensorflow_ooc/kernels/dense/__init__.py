"""Matrix-free dense MTTKRP (seed 002), one family: the CPU kernels (``cpu``: ELEM, SLICE, TILE),
their GPU twins (``gpu``), the shared input checks and block layout (``layout``), vector row sums
(``simd``), the tile-width heuristic (``tile``) and the performance model (``model``)."""

from .cpu import dense_mttkrp

__all__ = ["dense_mttkrp"]
