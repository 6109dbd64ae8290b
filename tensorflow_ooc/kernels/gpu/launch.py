"""Launch helpers every GPU kernel family uses: lanes per nonzero for a rank, and zeroing device
arrays on a stream (outputs and copies are zeroed on the device, not copied over the link)."""

from __future__ import annotations

import numpy as np

from .device import cuda, simulator_enabled

_ZERO = None


def lanes_for(rank: int) -> int:
    """Lanes per nonzero in the computing phase: the next power of two >= R, at most 32."""
    lanes = 1
    while lanes < min(int(rank), 32):
        lanes *= 2
    return lanes


def zero_kernel(flat):
    """flat[:] = 0 on the device."""
    i = cuda.grid(1)
    if i < flat.shape[0]:
        flat[i] = 0


def zero_fill(array, stream=0) -> None:
    """Zero a C-contiguous device array on ``stream``."""
    global _ZERO
    if _ZERO is None:
        _ZERO = cuda.jit(zero_kernel)
    flat = array.reshape(array.size)
    if not flat.shape[0]:
        return
    if simulator_enabled():
        # the simulator runs a Python thread per CUDA thread: a grid over a 10^7-row output would
        # take hours there, while a host copy of zeros is instant (semantics are the same)
        flat.copy_to_device(np.zeros(flat.shape[0], dtype=flat.dtype), stream=stream)
        return
    _ZERO[(flat.shape[0] + 255) // 256, 256, stream](flat)
