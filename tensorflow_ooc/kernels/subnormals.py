"""Subnormal float arithmetic flushed to zero on the calling thread, for the length of a block.

x86 processors take a microcode assist of about a hundred cycles for each multiply or add whose
input or result is subnormal (below 2.2e-308 in float64). CP-APR's multiplicative updates drive
factor entries toward 0 geometrically, so after a few outer iterations their products underflow:
on the 10 k-nonzero binary tensors of issue 49 the MU kernel spent half to four fifths of its
time in these assists (docs/KERNELS.md, "CP-APR MU: subnormals"). ``subnormals_flushed()`` sets the
thread's MXCSR flush-to-zero and denormals-are-zero bits, and restores the register on leaving.
It acts on this thread only (MXCSR is per thread): code that hands work to other threads enters
it on each, and starts no thread inside it (a new thread inherits the register). Elsewhere than
x86-64 it does nothing.
"""

from __future__ import annotations

import platform
from contextlib import contextmanager
from typing import Iterator

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["FLUSHES", "subnormals_flushed"]

# MXCSR bits: FTZ (results below the normal range become 0), DAZ (such inputs read as 0)
FTZ_DAZ = np.uint32((1 << 15) | (1 << 6))
FLUSHES = platform.machine().lower() in ("x86_64", "amd64")


def _mxcsr_call(builder, name: str, slot) -> None:
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    builder.call(fn, [builder.bitcast(slot, ir.IntType(8).as_pointer())])


@intrinsic
def _read_mxcsr(typingctx):
    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
        return builder.load(slot)

    return types.uint32(), codegen


@intrinsic
def _write_mxcsr(typingctx, value):
    if value != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.store(args[0], slot)
        _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
        return context.get_dummy_value()

    return types.void(types.uint32), codegen


@nb.njit(nogil=True, cache=True)
def _flush_on() -> int:
    old = _read_mxcsr()
    _write_mxcsr(np.uint32(old | FTZ_DAZ))
    return old


@nb.njit(nogil=True, cache=True)
def _restore(old: int) -> None:
    _write_mxcsr(np.uint32(old))


@contextmanager
def subnormals_flushed() -> Iterator[None]:
    """Within the block, on this thread, subnormal inputs read as 0 and subnormal results become
    0 (x86-64; elsewhere nothing changes)."""
    if not FLUSHES:
        yield
        return
    old = _flush_on()
    try:
        yield
    finally:
        _restore(old)
