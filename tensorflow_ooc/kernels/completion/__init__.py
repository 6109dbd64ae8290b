"""Tensor completion kernels: FastTuckerPlus SGD on CPU and GPU (``fasttucker_cpu``,
``fasttucker_gpu``; seed 003) and rank-1 fits of residuals on observed entries
(``rank1_residual``)."""
