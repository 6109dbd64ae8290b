"""Tensor completion: FastTuckerPlus SGD with held-out entries, and its results."""
