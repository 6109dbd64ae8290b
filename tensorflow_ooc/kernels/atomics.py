"""Atomic float add for numba CPU kernels.

Numba has no CPU atomics for floats. ``atomic_add(flat, i, v)`` emits LLVM ``atomicrmw fadd``
(monotonic ordering: only the sum must be exact, nothing is ordered by it); on x86 LLVM lowers it
to a compare-and-swap loop, so concurrent adds to one element are never lost.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """``arr[idx] += val`` atomically; ``arr`` is a 1-D float32/float64 array, no bounds check."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype not in (types.float32, types.float64):
        return None
    sig = types.void(arr, types.intp, arr.dtype)

    def codegen(context, builder, signature, args):
        a, i, v = args
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, a)
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [i], wraparound=False)
        builder.atomic_rmw("fadd", ptr, v, "monotonic")
        return context.get_dummy_value()

    return sig, codegen
