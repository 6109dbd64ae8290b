"""Vector row sums for the dense CPU MTTKRP (LLVM IR intrinsics for numba kernels).

``row_dot8(x, start, step, count, f, fstart, fstep, t)`` sets

    t[c] = sum over q < count of  x[start + q * step] * f[fstart + q * fstep + c],   c = 0..7

with the eight sums in one ``<8 x float>`` vector register and four independent accumulators
(sums of elements q = 0, 4, 8, ..; 1, 5, ..; ..), one broadcast, one unaligned vector load and one
fused multiply-add per element. ``row_dot32`` does the same for 32 columns (four vectors, one
broadcast of ``x[..]`` for four factor loads). ``axpy_rows`` is the slab kernel's update
``acc[j, :] += x[start + j] * p`` with ``p`` kept in registers. Written as numba code, the same loop stays scalar:
LLVM neither
keeps an accumulator array in registers (numba arrays may alias) nor vectorizes eight scalar
accumulators (measured 4-6x slower). The inner-mode factor rows are contiguous (row-major
factors), the tensor elements strided by ``step``. Indices are trusted (no bounds checks).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

WIDTH = 8


def _make_row_dot(nvec: int, unroll: int):
    """The intrinsic for ``nvec`` vectors of 8 columns, ``unroll`` elements per loop step (each with
    its own ``nvec`` accumulators, so ``nvec * unroll`` independent FMA chains)."""
    cols = WIDTH * nvec

    @intrinsic
    def row_dot(typingctx, x, start, step, count, f, fstart, fstep, t):
        arrays = (x, f, t)
        if not all(isinstance(a, types.Array) and a.ndim == 1 for a in arrays):
            return None
        if x.dtype not in (types.float32, types.float64) or f.dtype != x.dtype or t.dtype != x.dtype:
            return None
        sig = types.void(x, types.intp, types.intp, types.intp, f, types.intp, types.intp, t)

        def codegen(context, builder, signature, args):
            xv, start_, step_, count_, fv, fstart_, fstep_, tv = args
            xa = context.make_array(signature.args[0])(context, builder, xv)
            fa = context.make_array(signature.args[4])(context, builder, fv)
            ta = context.make_array(signature.args[7])(context, builder, tv)
            dt = context.get_data_type(signature.args[0].dtype)
            itemsize = context.get_abi_sizeof(dt)
            vec = ir.VectorType(dt, WIDTH)
            vptr = vec.as_pointer()
            intp = context.get_value_type(types.intp)
            i32 = ir.IntType(32)
            zero = ir.Constant(intp, 0)
            one = ir.Constant(intp, 1)
            zero_vec = ir.Constant(vec, [ir.Constant(dt, 0.0)] * WIDTH)
            splat = ir.Constant(ir.VectorType(i32, WIDTH), [ir.Constant(i32, 0)] * WIDTH)
            undef = ir.Constant(vec, ir.Undefined)
            suffix = "v8f64" if itemsize == 8 else "v8f32"
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.{suffix}"
            )
            accs = [[cgutils.alloca_once_value(builder, zero_vec) for _ in range(nvec)] for _ in range(unroll)]

            def add_term(q, acc_row):
                xi = builder.add(start_, builder.mul(q, step_))
                y = builder.load(builder.gep(xa.data, [xi]))
                yv = builder.shuffle_vector(builder.insert_element(undef, y, ir.Constant(i32, 0)), undef, splat)
                fi = builder.add(fstart_, builder.mul(q, fstep_))
                for v, acc in enumerate(acc_row):
                    ptr = builder.gep(fa.data, [builder.add(fi, ir.Constant(intp, WIDTH * v))])
                    fl = builder.load(builder.bitcast(ptr, vptr), align=itemsize)
                    builder.store(builder.call(fma, [yv, fl, builder.load(acc)]), acc)

            k = ir.Constant(intp, unroll)
            main = builder.sub(count_, builder.srem(count_, k))
            with cgutils.for_range_slice(builder, zero, main, k, intp=intp) as (q, _):
                for j, acc_row in enumerate(accs):
                    add_term(builder.add(q, ir.Constant(intp, j)), acc_row)
            with cgutils.for_range_slice(builder, main, count_, one, intp=intp) as (q, _):
                add_term(q, accs[0])
            for v in range(nvec):
                total = builder.load(accs[0][v])
                for j in range(1, unroll):
                    total = builder.fadd(total, builder.load(accs[j][v]))
                ptr = builder.gep(ta.data, [ir.Constant(intp, WIDTH * v)])
                builder.store(total, builder.bitcast(ptr, vptr), align=itemsize)
            return context.get_dummy_value()

        return sig, codegen

    row_dot.__doc__ = (
        f"t[0:{cols}] = sum_q x[start + q*step] * f[fstart + q*fstep : +{cols}]; 1-D float arrays "
        "of one dtype, no bounds checks."
    )
    return row_dot


# one vector, four elements in flight; four vectors (32 columns, one broadcast of x per 4 loads
# of factor entries), two elements in flight: 4 and 8 independent FMA chains
row_dot8 = _make_row_dot(1, 4)
row_dot32 = _make_row_dot(4, 2)


@intrinsic
def axpy_rows(typingctx, x, start, count, p, acc, cols):
    """acc[j * cols + c] += x[start + j] * p[c] for j < count, c < cols (a multiple of 8): the slab
    update of the dense slab kernel, with ``p`` held in vector registers 32 columns at a time
    (as numba code ``p`` is reloaded for every element: the stores to ``acc`` might alias it)."""
    arrays = (x, p, acc)
    if not all(isinstance(a, types.Array) and a.ndim == 1 for a in arrays):
        return None
    if x.dtype not in (types.float32, types.float64) or p.dtype != x.dtype or acc.dtype != x.dtype:
        return None
    sig = types.void(x, types.intp, types.intp, p, acc, types.intp)

    def codegen(context, builder, signature, args):
        xv, start_, count_, pv, av, cols_ = args
        xa = context.make_array(signature.args[0])(context, builder, xv)
        pa = context.make_array(signature.args[3])(context, builder, pv)
        aa = context.make_array(signature.args[4])(context, builder, av)
        dt = context.get_data_type(signature.args[0].dtype)
        itemsize = context.get_abi_sizeof(dt)
        vec = ir.VectorType(dt, WIDTH)
        vptr = vec.as_pointer()
        intp = context.get_value_type(types.intp)
        i32 = ir.IntType(32)
        zero = ir.Constant(intp, 0)
        one = ir.Constant(intp, 1)
        splat = ir.Constant(ir.VectorType(i32, WIDTH), [ir.Constant(i32, 0)] * WIDTH)
        undef = ir.Constant(vec, ir.Undefined)
        suffix = "v8f64" if itemsize == 8 else "v8f32"
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.{suffix}"
        )

        def vload(base, i):
            return builder.load(builder.bitcast(builder.gep(base, [i]), vptr), align=itemsize)

        def vstore(val, base, i):
            builder.store(val, builder.bitcast(builder.gep(base, [i]), vptr), align=itemsize)

        def columns(c0, nvec):
            """Columns c0 .. c0 + 8 nvec for every slab row, p's vectors loaded once."""
            ps = [vload(pa.data, builder.add(c0, ir.Constant(intp, WIDTH * v))) for v in range(nvec)]
            with cgutils.for_range_slice(builder, zero, count_, one, intp=intp) as (j, _):
                y = builder.load(builder.gep(xa.data, [builder.add(start_, j)]))
                yv = builder.shuffle_vector(builder.insert_element(undef, y, ir.Constant(i32, 0)), undef, splat)
                row = builder.add(builder.mul(j, cols_), c0)
                for v in range(nvec):
                    i = builder.add(row, ir.Constant(intp, WIDTH * v))
                    vstore(builder.call(fma, [yv, ps[v], vload(aa.data, i)]), aa.data, i)

        wide = ir.Constant(intp, 4 * WIDTH)
        main = builder.sub(cols_, builder.srem(cols_, wide))
        with cgutils.for_range_slice(builder, zero, main, wide, intp=intp) as (c0, _):
            columns(c0, 4)
        with cgutils.for_range_slice(builder, main, cols_, ir.Constant(intp, WIDTH), intp=intp) as (c0, _):
            columns(c0, 1)
        return context.get_dummy_value()

    return sig, codegen
