"""Sparse tensor times matrix (seed 004), one family: TTM and TTM chains (``chain``), the CPU and
GPU kernels (``cpu``, ``gpu``), the per-mode sorted layouts and semi-sparse results (``layout``)
and the kernel selector (``select``, with its fitted tree ``ttm_selector.json``)."""

from .chain import (
    KERNELS,
    SemiSparse,
    TTMLayouts,
    as_layouts,
    chain_first_mode,
    chain_order,
    check_matrix,
    compile_ttm_kernels,
    run_kernel,
    split_slices,
    ttm,
    ttm_chain,
    ttm_chain_coo,
)

__all__ = [
    "KERNELS",
    "SemiSparse",
    "TTMLayouts",
    "as_layouts",
    "chain_first_mode",
    "chain_order",
    "check_matrix",
    "compile_ttm_kernels",
    "run_kernel",
    "split_slices",
    "ttm",
    "ttm_chain",
    "ttm_chain_coo",
]
