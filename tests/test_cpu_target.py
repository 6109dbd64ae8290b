"""Numba's CPU target: 512-bit vectors on AVX-512 hosts, the user's own settings respected."""

import os
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

from tensorflow_ooc.cpu_target import (
    NARROW_VECTORS_FEATURE,
    WIDE_VECTORS_FEATURE,
    configure_numba_target,
    vector_width_features,
)

HOST_FEATURES = llvm.get_host_cpu_features().flatten()
HOST_AVX512 = "+avx512f" in HOST_FEATURES.split(",")


def test_wide_vectors_only_with_avx512():
    assert vector_width_features("+sse2,+avx2,-avx512f") is None
    assert vector_width_features("+sse2,+avx2,+avx512f") == f"+sse2,+avx2,+avx512f,{WIDE_VECTORS_FEATURE}"
    assert vector_width_features("+sse2,+avx2,+avx512f", 256) == f"+sse2,+avx2,+avx512f,{NARROW_VECTORS_FEATURE}"
    assert vector_width_features("+sse2,+avx2,-avx512f", 256) is None


def test_user_settings_are_left_alone_and_256_bits_can_be_asked_for():
    for env in (
        {"NUMBA_CPU_NAME": "generic"},
        {"NUMBA_CPU_FEATURES": "+sse2"},
        {"NUMBA_CPU_FEATURES": "+sse2", "TFOOC_CPU_VECTOR_BITS": "256"},
    ):
        environ = dict(env)
        assert configure_numba_target(environ) is None
        assert environ == env
    for env, feature in (({}, WIDE_VECTORS_FEATURE), ({"TFOOC_CPU_VECTOR_BITS": "256"}, NARROW_VECTORS_FEATURE)):
        environ = dict(env)
        got = configure_numba_target(environ)
        if HOST_AVX512:
            assert got == environ["NUMBA_CPU_FEATURES"] and got.endswith(feature)
        else:
            assert got is None and environ == env


_PROBE = """
import tensorflow_ooc, numba, numpy as np, os
@numba.njit
def scale(a, b, out):
    for i in range(a.shape[0]):
        out[i] = a[i] * b[i]
x = np.ones(64)
scale(x, x, x.copy())
asm = next(iter(scale.inspect_asm().values()))
print("zmm" if "zmm" in asm else "no-zmm", os.environ.get("NUMBA_CPU_FEATURES", "")[-16:])
"""


@pytest.mark.skipif(not HOST_AVX512, reason="the host has no AVX-512")
@pytest.mark.parametrize("bits", ["512", "256"])
def test_kernels_compile_to_the_chosen_width(bits):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env["TFOOC_CPU_VECTOR_BITS"] = bits
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == ("zmm" if bits == "512" else "no-zmm"), out
