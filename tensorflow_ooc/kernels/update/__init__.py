"""Kernels of the CP-ALS mode update: V^+ of the normal equations (``normal_equations``) and the
column statistics of the normalization (``column_scale``)."""
