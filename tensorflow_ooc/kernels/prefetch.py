"""Software prefetch for numba CPU kernels.

``prefetch_row(F, row)`` emits LLVM ``llvm.prefetch`` (read, high locality, data cache) for the
first cache line of row ``row`` of a C-contiguous 2-D array, and for its following lines up to the
row's length. MTTKRP on tensors whose factor matrices are far larger than the caches (modes of
millions of rows) waits on DRAM for each nonzero's factor rows; asking for the rows of a nonzero
some distance ahead overlaps those misses with the arithmetic of the nonzeros in between.
A prefetch never faults, so a row index past the array only wastes the hint; kernels still pass
only validated indices.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

CACHE_LINE = 64


@intrinsic
def prefetch_row(typingctx, arr, row):
    """Prefetch row ``row`` of the C-contiguous 2-D float array ``arr`` into the data cache."""
    if not isinstance(arr, types.Array) or arr.ndim != 2 or arr.layout != "C":
        return None
    sig = types.void(arr, types.intp)

    def codegen(context, builder, signature, args):
        a, r = args
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, a)
        zero = context.get_constant(types.intp, 0)
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [r, zero], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        base = builder.bitcast(ptr, i8p)
        itemsize = context.get_abi_sizeof(context.get_data_type(aty.dtype))
        ncols = builder.extract_value(ary.shape, 1)
        # one hint per cache line of the row: rank 16 in float64 is two lines
        nbytes = builder.mul(ncols, context.get_constant(types.intp, itemsize))
        with cgutils.for_range_slice(builder, zero, nbytes, context.get_constant(types.intp, CACHE_LINE)) as (off, _):
            builder.call(
                fn,
                [
                    builder.gep(base, [off]),
                    ir.Constant(ir.IntType(32), 0),
                    ir.Constant(ir.IntType(32), 3),
                    ir.Constant(ir.IntType(32), 1),
                ],
            )
        return context.get_dummy_value()

    return sig, codegen
