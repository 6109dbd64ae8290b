"""Numba's CPU target: let LLVM use 512-bit vectors on CPUs with AVX-512.

LLVM tunes Intel AVX-512 CPUs (Skylake-X through Sapphire Rapids) with ``prefer-256-bit``: it
vectorizes with ymm registers only, because early AVX-512 parts lowered their clock for zmm code.
The MTTKRP kernels are bound by instruction count, not clock: a rank-16 float64 row is two zmm
registers against four ymm, and the uber-shaped all-mode MTTKRP runs 25-30 % faster with zmm
(docs/KERNELS.md). Numba reads its target features once, from ``NUMBA_CPU_FEATURES``,
when its first kernel compiles, so this must run before any kernel is compiled; the package
imports it first. Worker processes inherit the environment variable.

AMD's Zen 4/5 tuning already vectorizes with zmm; there the setting changes nothing.
``TFOOC_CPU_VECTOR_BITS=256`` asks for 256-bit vectors instead (``+prefer-256-bit``, on every
AVX-512 host). Left alone when the user has set ``NUMBA_CPU_NAME`` or ``NUMBA_CPU_FEATURES``
(their choice, e.g. a portable cache) or when the host has no AVX-512.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

WIDE_VECTORS_FEATURE = "-prefer-256-bit"
NARROW_VECTORS_FEATURE = "+prefer-256-bit"


def vector_width_features(host_features: str, bits: int = 512) -> str | None:
    """The feature string for ``bits``-wide vectors (512: lift the 256-bit preference; 256: ask
    for it), or None where it has no effect (no AVX-512).

    ``host_features`` is LLVM's comma-separated ``+name``/``-name`` list for the host CPU.
    """
    if "+avx512f" not in host_features.split(","):
        return None
    return f"{host_features},{WIDE_VECTORS_FEATURE if bits == 512 else NARROW_VECTORS_FEATURE}"


def configure_numba_target(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set ``NUMBA_CPU_FEATURES`` for 512-bit vectors (256-bit with ``TFOOC_CPU_VECTOR_BITS=256``)
    on AVX-512 hosts; return what was set.

    A no-op (returns None) under the conditions in the module docstring.
    """
    if environ.get("NUMBA_CPU_NAME") or environ.get("NUMBA_CPU_FEATURES"):
        return None
    bits = 256 if environ.get("TFOOC_CPU_VECTOR_BITS", "512").strip() == "256" else 512
    try:
        import llvmlite.binding as llvm

        host = llvm.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 - an llvmlite that cannot say leaves numba's defaults
        return None
    features = vector_width_features(host, bits)
    if features is None:
        return None
    environ["NUMBA_CPU_FEATURES"] = features
    if "numba" in sys.modules:
        # numba was imported before us: re-read the setting; it holds if nothing has compiled yet.
        from numba.core import config

        config.reload_config()
    log.debug("numba target: %d-bit vectors (%s)", bits, features.rsplit(",", 1)[-1])
    return features
