"""Kernels of the CP-ALS mode update: V^+ of the normal equations (``normal_equations``), the
column statistics of the normalization (``column_scale``), the HALS sweeps of nonnegative
CP-ALS (``hals``) and the large products' row blocks over the kernel threads (``row_split``)."""
