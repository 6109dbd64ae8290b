"""Where a small-rank MTTKRP's time goes, and what memoizing a pair of modes would save (issue 49).

    python benchmarks/bench_mttkrp_profile.py --tensor nips --rank 8 --threads 1
    python benchmarks/bench_mttkrp_profile.py --tensor nips --rank 8 --pair 2 3

Part 1, per target mode, the kernel CP-ALS runs in memory (``runs_threads`` over the mode-sorted
copy) against the same kernel with fewer factor-row loads per nonzero (the product keeps 0, 1 or 2
of the other modes' rows) and with every load taken from one row (same instruction count, one
cache line): what the index stream and decode cost, and what each factor-row fetch adds.

Part 2 (order 4 only), dimension-tree memoization of ``--pair`` (a, b): one pass forms
``Z[(i_a, i_b), :] = sum x * A_c[i_c] * A_d[i_d]`` over the distinct (i_a, i_b) pairs of the
nonzeros (sorted by the pair), then both modes' MTTKRPs come from Z (``M_a[i_a] += Z * A_b[i_b]``
and the converse), against the current kernel's two passes. In CP-ALS A_a changes between the two,
which the second product reads after the update, so the saving carries over.

Both parts run kernels made here from the package's source generator (nothing in the package
changes); the best of ``--repeat`` calls each, interleaved so that load from other processes
hits every variant alike. Prints one table per part.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time


def _early_threads(argv: list[str]) -> None:
    # numba reads NUMBA_NUM_THREADS when first imported
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            os.environ["NUMBA_NUM_THREADS"] = argv[i + 1]


_early_threads(sys.argv)

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402
from tensorflow_ooc import synthetic  # noqa: E402
from tensorflow_ooc.kernels.mttkrp import cpu  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.dispatch import tensor_items  # noqa: E402
from tensorflow_ooc.kernels.mttkrp.plan import thread_shares  # noqa: E402

PRODUCT = re.compile(r"a(\d+) \+= v \* (Ff\[q1[^\]]*\])((?: \* Ff\[q\d[^\]]*\])*)")


def _loads_kept(keep: int):
    """Source edit: each rank term's product keeps the first ``keep`` factor-row loads."""

    def edit(src: str) -> str:
        def one(m: re.Match) -> str:
            terms = [m.group(2)] + re.findall(r"Ff\[q\d[^\]]*\]", m.group(3))
            return f"a{m.group(1)} += " + " * ".join(["v"] + terms[:keep])

        return PRODUCT.sub(one, src)

    return edit


def _one_row(src: str) -> str:
    """Source edit: every factor-row load from the first other mode's row (one cache line)."""
    return re.sub(r"Ff\[q[2-9]", "Ff[q1", src)


def _kernel(name: str, nmodes: int, rank: int, edit) -> cpu.SLPKernel:
    src = edit(cpu._source(name, "runs_threads", nmodes, rank, False, False))
    scope = dict(vars(cpu))
    exec(compile(src, f"<{name}>", "exec"), scope)
    return cpu.SLPKernel(nb.njit(parallel=True, nogil=True)(scope[name]))


def _call(kernel, tensor, F, mode: int):
    """A no-argument call of ``kernel`` over ``mode``'s items as CP-ALS has them, and its output."""
    items, layout = tensor_items(tensor, mode), tensor.layout
    bounds, todo = thread_shares(items, nb.get_num_threads())
    out = np.zeros((tensor.shape[mode], F.rank))
    first = np.zeros_like(out)
    bufs = np.zeros((max(0, nb.get_num_threads() - 2),) + out.shape)
    args = (
        *items.kernel_args(layout)[:6],
        items.lo,
        layout.field_shift,
        items.masks(layout),
        F.data,
        F.offsets,
        mode,
        F.rank,
        todo,
        bounds,
        out,
        first,
        bufs,
        0,
    )
    return (lambda: kernel(*args)), out


def _best(fns: dict, repeat: int) -> dict:
    for f in fns.values():
        f()
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return {k: v * 1e3 for k, v in best.items()}


def load_profile(tensor, F, repeat: int) -> None:
    N = len(tensor.shape)
    variants = {"all": lambda s: s, **{f"keep {k}": _loads_kept(k) for k in range(N - 1)}, "one row": _one_row}
    kernels = {v: _kernel(f"k{i}", N, F.rank, e) for i, (v, e) in enumerate(variants.items())}
    fns = {(v, m): _call(k, tensor, F, m)[0] for v, k in kernels.items() for m in range(N)}
    best = _best(fns, repeat)
    print(f"\nms per mode, kernel alone, {nb.get_num_threads()} thread(s), best of {repeat}")
    print(f"{'loads':<10}" + "".join(f"{'mode ' + str(m):>9}" for m in range(N)) + f"{'all':>9}")
    for v in variants:
        row = [best[(v, m)] for m in range(N)]
        print(f"{v:<10}" + "".join(f"{x:>9.2f}" for x in row) + f"{sum(row):>9.2f}")


def _memo_source(rank: int) -> str:
    L = ["def z_pass(ptr, i0, i1, v, A0, A1, Z):", "    for p in range(ptr.shape[0] - 1):"]
    L += [f"        a{r} = 0.0" for r in range(rank)]
    L += ["        for i in range(ptr[p], ptr[p + 1]):", "            x = v[i]; j0 = i0[i]; j1 = i1[i]"]
    L += [f"            a{r} += x * A0[j0, {r}] * A1[j1, {r}]" for r in range(rank)]
    L += [f"        Z[p, {r}] = a{r}" for r in range(rank)]
    L += ["def z_out(Z, rows, other, B, M):", "    for p in range(Z.shape[0]):", "        i = rows[p]; j = other[p]"]
    L += [f"        M[i, {r}] += Z[p, {r}] * B[j, {r}]" for r in range(rank)]
    return "\n".join(L) + "\n"


def memo_profile(tensor, coords, values, F, pair: tuple[int, int], repeat: int) -> None:
    shape, R = tensor.shape, F.rank
    a, b = pair
    c, d = (m for m in range(4) if m not in pair)
    key = coords[:, a].astype(np.int64) * shape[b] + coords[:, b]
    order = np.lexsort((coords[:, d], coords[:, c], key))
    pairs, start = np.unique(key[order], return_index=True)
    ptr = np.append(start, key.shape[0]).astype(np.int64)
    pa, pb = pairs // shape[b], pairs % shape[b]
    ic, id_, v = coords[order, c].astype(np.int32), coords[order, d].astype(np.int32), values[order]
    A = [np.ascontiguousarray(F.data[F.offsets[m] : F.offsets[m] + shape[m]]) for m in range(4)]
    scope = {"np": np}
    exec(compile(_memo_source(R), "<memo>", "exec"), scope)
    z_pass, z_out = (cpu.SLPKernel(nb.njit(nogil=True)(scope[n])) for n in ("z_pass", "z_out"))
    Z = np.zeros((pairs.shape[0], R))
    Ma, Mb = np.zeros((shape[a], R)), np.zeros((shape[b], R))

    def memo() -> None:
        z_pass(ptr, ic, id_, v, A[c], A[d], Z)
        Ma[...] = 0
        z_out(Z, pa, pb, A[b], Ma)
        Mb[...] = 0
        z_out(Z, pb, pa, A[a], Mb)

    k = cpu.kernel_for(4, R).runs_threads
    (fa, oa), (fb, ob) = _call(k, tensor, F, a), _call(k, tensor, F, b)
    best = _best({"memo": memo, "z": lambda: z_pass(ptr, ic, id_, v, A[c], A[d], Z), "a": fa, "b": fb}, repeat)
    memo()
    oa[...] = ob[...] = 0
    fa(), fb()  # the kernels add into their outputs
    err = max(float(np.abs(Ma - oa).max() / np.abs(oa).max()), float(np.abs(Mb - ob).max() / np.abs(ob).max()))
    print(
        f"\nmemoized pair ({a}, {b}): {pairs.shape[0]} distinct pairs ({pairs.shape[0] / key.shape[0]:.3f} a nonzero), "
        f"Z {Z.nbytes / 2**20:.1f} MiB; serial kernels, best of {repeat}"
    )
    print(f"  current kernel, modes {a} and {b}: {best['a']:.2f} + {best['b']:.2f} = {best['a'] + best['b']:.2f} ms")
    print(f"  memoized: {best['memo']:.2f} ms (Z pass {best['z']:.2f}); largest relative difference {err:.1e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensor", default="nips", choices=sorted(synthetic.PRESETS))
    ap.add_argument("--rank", type=int, default=8, choices=[r for r in cpu.SPECIALIZED_RANKS])
    ap.add_argument("--threads", type=int, default=1, help="numba threads (part 2's kernels are serial)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--pair", type=int, nargs=2, default=None, help="order-4 tensors: the modes to memoize")
    ap.add_argument("--seed", type=int, default=21)
    args = ap.parse_args(argv)
    shape, nnz = synthetic.PRESETS[args.tensor]
    if args.pair is not None and (len(shape) != 4 or len(set(args.pair)) != 2 or not set(args.pair) <= set(range(4))):
        ap.error(f"--pair takes two different modes of an order-4 tensor; {args.tensor} has order {len(shape)}")
    # the tensor bench_peers writes for this preset (same generator, seed and values)
    coords, _ = synthetic.heavy_tailed(shape, nnz, seed=args.seed)
    values = np.random.default_rng(args.seed + 1).random(len(coords))
    tensor = tfo.encode_coo(coords, values, shape)
    rng = np.random.default_rng(args.seed)
    F = tfo.StackedFactors.from_list([rng.random((s, args.rank)) for s in shape])
    print(f"{args.tensor} {'x'.join(map(str, shape))}, {nnz} nonzeros, R{args.rank}")
    load_profile(tensor, F, args.repeat)
    if args.pair is not None:
        memo_profile(tensor, coords, values, F, tuple(args.pair), args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
