"""Bit extraction for decoding ALTO words: BMI2 ``pext`` where the CPU has it, a portable loop
elsewhere.

``pext(x, mask)`` gathers the bits of ``x`` selected by ``mask`` into the low bits of the result,
in order. One ``pext`` per mode turns a low ALTO word into that mode's in-block index, which is
what re-encoding needs; on x86 with BMI2 it is one instruction.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _host_has_bmi2() -> bool:
    try:
        return bool(llvm.get_host_cpu_features().get("bmi2", False))
    except Exception:  # non-x86 hosts or an llvmlite without feature queries
        return False


HAS_BMI2 = _host_has_bmi2()


@intrinsic
def _pext_bmi2(typingctx, x, mask):
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(64)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.bmi.pext.64")
        return builder.call(fn, args)

    return sig, codegen


@nb.njit(inline="always")
def _pext_portable(x, mask):
    out = np.uint64(0)
    bit = np.uint64(1)
    m = mask
    while m:
        low = m & (~m + np.uint64(1))  # lowest set bit of the mask
        if x & low:
            out |= bit
        bit <<= np.uint64(1)
        m ^= low
    return out


pext = _pext_bmi2 if HAS_BMI2 else _pext_portable


@intrinsic
def _pdep_bmi2(typingctx, x, mask):
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(64)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.bmi.pdep.64")
        return builder.call(fn, args)

    return sig, codegen


@nb.njit(inline="always")
def _pdep_portable(x, mask):
    out = np.uint64(0)
    bit = np.uint64(1)
    m = mask
    while m:
        low = m & (~m + np.uint64(1))  # lowest set bit of the mask
        if x & bit:
            out |= low
        bit <<= np.uint64(1)
        m ^= low
    return out


# pdep(x, mask) scatters the low bits of x, in order, to the set bits of mask (the inverse of pext):
# one instruction places a mode's index bits at its ALTO positions.
pdep = _pdep_bmi2 if HAS_BMI2 else _pdep_portable
