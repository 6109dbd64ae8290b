"""Where GPU code can run: numba-cuda present, a device (or the CUDA simulator), its properties.

Importing this module never fails: without numba-cuda ``cuda`` is None and :func:`gpu_unavailable`
says why. The GPU kernels import ``cuda`` from here, so the package and every CPU path work
without the ``gpu`` extra.
"""

from __future__ import annotations

import importlib.util
import os

import numba

try:  # numba-cuda provides numba.cuda; numba's own copy is deprecated and not used
    if importlib.util.find_spec("numba_cuda") is None:
        raise ImportError("numba-cuda is not installed")
    from numba import cuda
except ImportError as exc:  # pragma: no cover - exercised by the CPU-only install
    cuda = None
    _IMPORT_ERROR = str(exc)
else:
    _IMPORT_ERROR = ""

DEFAULT_SM_COUNT = 132  # H100 SXM; used when the simulator has no device attributes
DEFAULT_MEMORY_FRACTION = 0.8


def simulator_enabled() -> bool:
    """True when numba runs CUDA kernels in its Python simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return bool(numba.config.ENABLE_CUDASIM)


def gpu_unavailable() -> str:
    """Why GPU kernels cannot run in this process ("" when they can: a device or the simulator)."""
    if cuda is None:
        return f"{_IMPORT_ERROR}; install the gpu extra: pip install -e '.[gpu]'"
    if simulator_enabled():
        return ""
    try:
        if not cuda.is_available():
            return "numba-cuda found no CUDA device (no driver or no GPU visible)"
    except Exception as exc:  # a broken driver install raises instead of answering False
        return f"CUDA is not usable: {exc}"
    return ""


def require_gpu() -> None:
    reason = gpu_unavailable()
    if reason:
        raise RuntimeError(f"GPU execution requested but {reason}")


def sm_count() -> int:
    """Streaming multiprocessors of the current device (``DEFAULT_SM_COUNT`` in the simulator)."""
    if simulator_enabled():
        return int(os.environ.get("TFOOC_SIM_SM_COUNT", DEFAULT_SM_COUNT))
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def free_device_memory() -> int:
    """Free bytes on the current device (a large fixed figure in the simulator)."""
    if simulator_enabled():
        return 1 << 34
    free, _total = cuda.current_context().get_memory_info()
    return int(free)


def default_device_memory_limit() -> int:
    """``DEFAULT_MEMORY_FRACTION`` of the free device memory."""
    return int(DEFAULT_MEMORY_FRACTION * free_device_memory())


def visible_gpu_count() -> int:
    """Physical GPUs this process could use (0 in the simulator or without numba-cuda)."""
    if cuda is None or simulator_enabled():
        return 0
    try:
        return len(cuda.gpus) if cuda.is_available() else 0
    except Exception:
        return 0
