"""Kernels of the CP-ALS mode update: V^+ of the normal equations (``normal_equations``), the
column statistics of the normalization (``column_scale``), the HALS sweeps of nonnegative
CP-ALS (``hals``), and BLAS held to one thread around the update's products (``blas_threads``)."""
