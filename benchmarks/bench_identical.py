"""Bit-identical results before and after a refactor (issue 46: "one run loop, options declared once").

    python benchmarks/bench_identical.py --out benchmarks/results/identical_71ff601.json   # record
    python benchmarks/bench_identical.py --compare benchmarks/results/identical_71ff601.json
    python benchmarks/bench_identical.py --list                       # the cases, nothing run
    python benchmarks/bench_identical.py --only 'cp/|cli/cpd' --out /tmp/some.json

The baseline of the code before the refactor comes from a worktree of that commit, the harness
(this file) from the current checkout:

    git worktree add /tmp/base71 71ff601
    PYTHONPATH=/tmp/base71 .venv/bin/python benchmarks/bench_identical.py \\
        --out benchmarks/results/identical_71ff601.json

It prints where ``tensorflow_ooc`` was imported from (and checks that the worker processes of its
Dask cluster and the CLI subprocesses import the same copy), so a baseline that silently ran the
checkout's code is caught.

Every case runs one decomposition through what users call: the public API (``tfo.cp_als``,
``cp_apr``, ``tt_als``, ``tucker_hooi``, ``tucker_sgd``), the command line (the ``tfooc`` console
script beside the interpreter, else ``python -m tensorflow_ooc.cli``: ``cpd``, ``apr``, ``tt``,
``tucker``, ``complete``, each result read back with ``tfo.load_result``) or a workflow spec
(``tfooc run SPEC``). The matrix: every method; in this process (``scheduler="inline"``), on the
embedded cluster and on a real ``distributed.LocalCluster`` of two one-thread worker processes
with ``distribution="owner"`` and ``"graph"`` where the method offers them; streamed and
in-memory execution; float32 and float64; dense NumPy and Zarr arrays; the randomized (sampled)
solvers; nonnegative CP; given initial factors and warm starts; runs stopped by their tolerance;
and checkpoint-then-resume (k iterations with a checkpoint, then resumed to n: both halves are
cases, and the checkpoint file's arrays one more).

A case's record is a SHA-256 over the exact bytes of everything numeric the result gives: every
array (weights, factors, cores, core factors; dtype and shape included), the scalars (fit,
iterations or sweeps or epochs, log-likelihood, KKT violation, test RMSE and MAE, best epoch),
the history with every timing left out (keys naming seconds, and nnz_per_s), and the input's
shape, nonzeros and norm. The hashes of the parts are kept beside it, so a difference names what
differs, and the result arrays go to ``FILE.arrays.npz`` beside the JSON, so ``--compare`` also
prints the largest absolute difference of a case that differs. The inputs themselves (plain NumPy
draws from fixed seeds, converted by ``tfo.convert``; the workflow converts the same nonzeros from
a .tns file) are cases too (``input/...``, ``workflow/run+convert``), hashed only.

Determinism: the harness fixes numba's thread count (NUMBA_NUM_THREADS=2, unless set), the
cluster (two worker processes, one thread each), seeds and sizes, and runs randomized CP-ALS and
completion with fixed seeds (completion with ``threads=1``: its parallel factor pass writes rows
without synchronization). On the 2-core machine of issue 46 every case was identical run to run
(four full runs of 71ff601, cold and warm numba caches, and two more of the cluster cases). The
hashes do depend on the environment: with NUMBA_NUM_THREADS=1 exact CP-ALS and TT-ALS factors
differ from those of 2 threads by about 1e-15 (another summation order), so compare on the
machine, thread count and NumPy that recorded the baseline (``--compare`` warns when they differ).

Output: ``{case: {"sha256", "iterations", "fit", "parts", "ran", "seconds"}}`` plus ``"_meta"``
(where the package was imported from, versions, environment). ``fit`` is the test RMSE for
completion. ``--compare`` prints case | baseline hash | now hash | identical and exits 1 if a
case differs, failed or is missing.
"""

from __future__ import annotations

import os

# before anything loads numba: its thread count must be that of the baseline's run
os.environ.setdefault("NUMBA_NUM_THREADS", "2")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

import tensorflow_ooc as tfo  # noqa: E402

RESULTS = Path(__file__).parent / "results"

# what a result gives, by attribute name (whatever its class): arrays or lists of arrays, scalars
ARRAY_ATTRS = ("weights", "factors", "core", "cores", "core_factors")
SCALAR_ATTRS = ("fit", "iterations", "sweeps", "epochs", "best_epoch", "loglik", "kkt", "test_rmse", "test_mae")
# not hashed: configuration echoed back (params; the memory plan in it measures this process) and
# the input's identity (a store id drawn at conversion, its path); shape, nnz and norm are kept
NOT_OUTPUTS = ("params", "input", "history")
INPUT_KEYS = ("shape", "nnz", "norm_sq")
# how a run ran (from its params), recorded beside the hash to show which path a case took
RAN_KEYS = ("scheduler", "execution", "distribution", "method", "algorithm", "dtype", "resumed_after", "device")

# sizes: small enough that the whole matrix runs in a few minutes on 2 cores
SPARSE_SHAPE = (30, 24, 20, 16)
SPARSE_NNZ = 4000
COUNTS_SHAPE = (30, 24, 20)
COUNTS_NNZ = 2500
DENSE_SHAPE = (16, 14, 12)
CHUNK_NNZ = 512  # several chunks and partitions, so two workers share the nonzeros
RANK = 4
ITERS = 5
SAMPLES = 512


# ------------------------------------------------------------------------------------------------
# digests


def _timing(key: str) -> bool:
    return "seconds" in key or key == "nnz_per_s"


def _strip_timings(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_timings(v) for k, v in obj.items() if not _timing(str(k))}
    if isinstance(obj, (list, tuple)):
        return [_strip_timings(v) for v in obj]
    return obj


def _feed(h, obj: Any) -> None:
    """Type-tagged canonical bytes of ``obj``: dicts by sorted key, arrays as dtype, shape and
    bytes, floats as their IEEE-754 binary64 bytes (NumPy scalars as the Python number they are)."""
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(f"A{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(obj, np.generic):
        _feed(h, obj.item())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=str):
            _feed(h, str(k))
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, bool) or obj is None:
        h.update(f"B{obj}".encode())
    elif isinstance(obj, int):
        h.update(f"I{obj}".encode())
    elif isinstance(obj, float):
        h.update(b"F" + np.float64(obj).tobytes())
    elif isinstance(obj, str):
        h.update(f"S{len(obj)}:".encode() + obj.encode())
    else:
        raise TypeError(f"cannot digest {type(obj).__name__}")


def sha(obj: Any) -> str:
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def result_parts(result: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict]:
    """The parts of a decomposition result that are hashed (name -> object), its arrays by name,
    and a summary (iterations, fit, how it ran, attributes left out)."""
    parts: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for attr in ARRAY_ATTRS:
        value = getattr(result, attr, None)
        if isinstance(value, np.ndarray):
            parts[attr] = arrays[attr] = value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
            for i, v in enumerate(value):
                parts[f"{attr}{i}"] = arrays[f"{attr}{i}"] = v
    parts["scalars"] = {a: getattr(result, a) for a in SCALAR_ATTRS if hasattr(result, a)}
    parts["history"] = _strip_timings(list(getattr(result, "history", [])))
    inp = getattr(result, "input", None) or {}
    parts["input"] = {k: inp[k] for k in INPUT_KEYS if k in inp}
    params = getattr(result, "params", None) or {}
    ran = {k: params[k] for k in RAN_KEYS if k in params}
    known = set(ARRAY_ATTRS) | set(SCALAR_ATTRS) | set(NOT_OUTPUTS)
    extra = sorted(k for k in vars(result) if k not in known)
    iterations = next((getattr(result, a) for a in ("iterations", "sweeps", "epochs") if hasattr(result, a)), None)
    fit = getattr(result, "fit", None)
    if fit is None:
        fit = getattr(result, "test_rmse", None)
    summary = {"iterations": iterations, "fit": fit, "ran": _jsonable(ran)}
    if extra:
        summary["unhashed_attributes"] = extra
    return parts, arrays, summary


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=lambda o: o.item() if isinstance(o, np.generic) else str(o)))


def _float_or_none(x: Any) -> Any:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else str(x)


def record_of(obj: Any) -> tuple[dict, dict[str, np.ndarray]]:
    """The JSON record of a case's outcome: a result object, or ``(parts, arrays)`` already made."""
    if isinstance(obj, tuple):
        parts, arrays = obj
        summary = {"iterations": None, "fit": None, "ran": {}}
    else:
        parts, arrays, summary = result_parts(obj)
    rec = {
        "sha256": sha(parts),
        "iterations": summary.pop("iterations"),
        "fit": _float_or_none(summary.pop("fit")),
        "parts": {k: sha(v) for k, v in parts.items()},
        **summary,
    }
    return rec, arrays


def npz_parts(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """A checkpoint file's numeric arrays (its JSON meta, with the history's timings, left out)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in sorted(z.files) if k != "meta" and z[k].dtype.kind in "biufc"}
    return dict(arrays), arrays


# ------------------------------------------------------------------------------------------------
# inputs: plain NumPy draws from fixed seeds


def _planted(shape, rank, seed):
    rng = np.random.default_rng(seed)
    return rng, [rng.random((s, rank)) for s in shape]


def _model_at(factors, coords):
    prod = np.ones((len(coords), factors[0].shape[1]))
    for m, f in enumerate(factors):
        prod *= f[coords[:, m]]
    return prod.sum(axis=1)


def _support(rng, shape, nnz):
    flat = np.sort(rng.choice(int(np.prod(shape)), nnz, replace=False))
    return np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)


def make_inputs(work: Path) -> dict[str, Any]:
    """A 4-way sparse planted model with noise, a 3-way store of counts, a 3-way dense array (in
    memory and as a Zarr array), and the sparse ones as .tns files for the workflow."""
    rng, factors = _planted(SPARSE_SHAPE, 3, 20260101)
    coords = _support(rng, SPARSE_SHAPE, SPARSE_NNZ)
    values = _model_at(factors, coords)
    values = values + 0.05 * values.std() * rng.standard_normal(len(values))
    sparse = tfo.convert((coords, values), work / "sparse4.zarr", shape=SPARSE_SHAPE, chunk_nnz=CHUNK_NNZ)

    rng, factors = _planted(COUNTS_SHAPE, 3, 20260102)
    ccoords = _support(rng, COUNTS_SHAPE, COUNTS_NNZ)
    counts = (1 + rng.poisson(2.0 * _model_at(factors, ccoords))).astype(np.float64)
    count_store = tfo.convert((ccoords, counts), work / "counts3.zarr", shape=COUNTS_SHAPE, chunk_nnz=CHUNK_NNZ)

    rng, factors = _planted(DENSE_SHAPE, 3, 20260103)
    dense = np.einsum("ir,jr,kr->ijk", *factors)
    dense = dense + 0.05 * dense.std() * rng.standard_normal(dense.shape)
    import zarr

    zpath = work / "dense3.zarr"
    z = zarr.create_array(str(zpath), shape=dense.shape, chunks=(8, 7, 12), dtype="float64")
    z[...] = dense

    tns = work / "tns"
    tns.mkdir()
    _write_tns(tns / "t.tns", coords, values)
    _write_tns(tns / "c.tns", ccoords, counts)
    return {
        "sparse": sparse,
        "counts": count_store,
        "dense": dense,
        "dense_zarr": str(zpath),
        "tns": tns,
    }


def _write_tns(path: Path, coords: np.ndarray, values: np.ndarray) -> None:
    with open(path, "w") as f:
        for c, v in zip(coords.tolist(), values.tolist()):
            f.write(" ".join(str(i + 1) for i in c) + f" {v!r}\n")


def input_parts(store) -> tuple[dict, dict[str, np.ndarray]]:
    c, v = store.to_coo()
    order = np.lexsort(c.T[::-1])
    arrays = {"coords": np.ascontiguousarray(c[order]), "values": np.ascontiguousarray(v[order])}
    return {
        **arrays,
        "shape": list(store.shape),
        "nnz": int(store.nnz),
        "norm_sq": float(store.meta["norm_sq"]),
    }, {}  # hashed only: the nonzeros would be most of the arrays file, and how far they moved says little


# ------------------------------------------------------------------------------------------------
# the cases


@dataclass
class Ctx:
    work: Path
    inputs: dict
    env: dict
    client: Any = None
    cluster: Any = None
    results: dict | None = None  # earlier results a case builds on (warm starts)

    @property
    def address(self) -> str:
        return self.cluster.scheduler_address


@dataclass
class Case:
    name: str
    run: Callable[[Ctx], Any]
    cluster: bool = False
    after: str | None = None  # a case this one builds on (run first when --only picks this one)


def _cp_cases() -> list[Case]:
    S = lambda c: c.inputs["sparse"]  # noqa: E731
    base = dict(seed=1, max_iters=ITERS, tol=0)
    inl = dict(base, scheduler="inline")
    rnd = dict(samples=SAMPLES)
    cases = [
        Case("cp/exact/inline/f64", lambda c: tfo.cp_als(S(c), RANK, **inl)),
        Case("cp/exact/inline/f32", lambda c: tfo.cp_als(S(c), RANK, dtype="float32", **inl)),
        Case("cp/exact/inline/streaming", lambda c: tfo.cp_als(S(c), RANK, execution="streaming", **inl)),
        Case("cp/exact/auto/default-tol", lambda c: tfo.cp_als(S(c), RANK, seed=1, max_iters=60)),
        Case(
            "cp/exact/inline/init-given",
            lambda c: tfo.cp_als(
                S(c), RANK, init=[np.random.default_rng(7).random((s, RANK)) for s in S(c).shape], **inl
            ),
        ),
        Case("cp/exact/embedded", lambda c: tfo.cp_als(S(c), RANK, scheduler="embedded", **base)),
        Case("cp/exact/out-store", lambda c: _saved(c, "cp-out.zarr", tfo.cp_als, S(c), RANK, **inl)),
        Case("cp/sts/inline", lambda c: tfo.cp_als(S(c), RANK, method="sts", **rnd, **inl)),
        Case(
            "cp/sts/inline/f32-fit-every-2",
            lambda c: tfo.cp_als(S(c), RANK, method="sts", dtype="float32", fit_every=2, **rnd, **inl),
        ),
        Case("cp/arls-lev/inline", lambda c: tfo.cp_als(S(c), RANK, method="arls-lev", **rnd, **inl)),
        Case("cp/arls-lev-hybrid/inline", lambda c: tfo.cp_als(S(c), RANK, method="arls-lev-hybrid", **rnd, **inl)),
        Case(
            "cp/sts/inline/streaming",
            lambda c: tfo.cp_als(S(c), RANK, method="sts", execution="streaming", **rnd, **inl),
        ),
        Case("cp/nonneg/inline", lambda c: tfo.cp_als(S(c), RANK, nonnegative=True, **inl)),
        Case(
            "cp/nonneg/inline/reg-f32",
            lambda c: tfo.cp_als(S(c), RANK, nonnegative=True, reg=0.01, dtype="float32", **inl),
        ),
        Case("cp/dense-numpy/inline/f64", lambda c: tfo.cp_als(c.inputs["dense"], 3, **inl)),
        Case("cp/dense-numpy/inline/f32", lambda c: tfo.cp_als(c.inputs["dense"], 3, dtype="float32", **inl)),
        Case("cp/dense-zarr/inline", lambda c: tfo.cp_als(c.inputs["dense_zarr"], 3, **inl)),
        Case("cp/dense-numpy/inline/nonneg", lambda c: tfo.cp_als(c.inputs["dense"], 3, nonnegative=True, **inl)),
    ]
    cases += _resume_cases(
        "cp/exact/inline", lambda c, **kw: tfo.cp_als(S(c), RANK, seed=1, tol=0, scheduler="inline", **kw), "max_iters"
    )
    cases += _resume_cases(
        "cp/sts/inline",
        lambda c, **kw: tfo.cp_als(S(c), RANK, seed=1, tol=0, scheduler="inline", method="sts", **rnd, **kw),
        "max_iters",
    )
    cases += _resume_cases(
        "cp/dense-numpy/inline",
        lambda c, **kw: tfo.cp_als(c.inputs["dense"], 3, seed=1, tol=0, scheduler="inline", **kw),
        "max_iters",
    )
    lc = dict(base)
    cases += [
        Case(
            "cp/exact/lc2-owner/f64",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="owner", **lc),
            True,
        ),
        Case(
            "cp/exact/lc2-owner/f32",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="owner", dtype="float32", **lc),
            True,
        ),
        Case(
            "cp/exact/lc2-owner/streaming",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="owner", execution="streaming", **lc),
            True,
        ),
        Case("cp/exact/lc2-auto", lambda c: tfo.cp_als(S(c), RANK, client=c.client, **lc), True),
        Case(
            "cp/exact/lc2-graph/f64",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="graph", **lc),
            True,
        ),
        Case(
            "cp/exact/lc2-graph/f32",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="graph", dtype="float32", **lc),
            True,
        ),
        Case(
            "cp/sts/lc2-owner",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="owner", method="sts", **rnd, **lc),
            True,
        ),
        Case(
            "cp/sts/lc2-graph",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, distribution="graph", method="sts", **rnd, **lc),
            True,
        ),
        Case(
            "cp/arls-lev/lc2-graph",
            lambda c: tfo.cp_als(S(c), RANK, client=c.client, method="arls-lev", **rnd, **lc),
            True,
        ),
        Case("cp/nonneg/lc2-graph", lambda c: tfo.cp_als(S(c), RANK, client=c.client, nonnegative=True, **lc), True),
        Case("cp/dense-numpy/lc2-graph", lambda c: tfo.cp_als(c.inputs["dense"], 3, client=c.client, **lc), True),
    ]
    cases += _resume_cases(
        "cp/exact/lc2-owner",
        lambda c, **kw: tfo.cp_als(S(c), RANK, seed=1, tol=0, client=c.client, distribution="owner", **kw),
        "max_iters",
        cluster=True,
    )
    cases += _resume_cases(
        "cp/sts/lc2-owner",
        lambda c, **kw: tfo.cp_als(
            S(c), RANK, seed=1, tol=0, client=c.client, distribution="owner", method="sts", **rnd, **kw
        ),
        "max_iters",
        cluster=True,
    )
    return cases


def _apr_cases() -> list[Case]:
    C = lambda c: c.inputs["counts"]  # noqa: E731
    base = dict(seed=1, max_iters=ITERS, max_inner_iters=5)
    inl = dict(base, scheduler="inline")
    cases = [
        Case("apr/mu/inline", lambda c: tfo.cp_apr(C(c), 3, **inl)),
        Case("apr/pdnr/inline", lambda c: tfo.cp_apr(C(c), 3, algorithm="pdnr", **inl)),
        Case("apr/mu/inline/streaming", lambda c: tfo.cp_apr(C(c), 3, execution="streaming", **inl)),
        Case("apr/pdnr/auto/converge", lambda c: tfo.cp_apr(C(c), 3, algorithm="pdnr", seed=1, max_iters=40, tol=0.1)),
        Case("apr/mu/embedded", lambda c: tfo.cp_apr(C(c), 3, scheduler="embedded", **base)),
        Case("apr/mu/lc2-owner", lambda c: tfo.cp_apr(C(c), 3, client=c.client, distribution="owner", **base), True),
        Case("apr/mu/lc2-graph", lambda c: tfo.cp_apr(C(c), 3, client=c.client, distribution="graph", **base), True),
        Case(
            "apr/pdnr/lc2-owner",
            lambda c: tfo.cp_apr(C(c), 3, algorithm="pdnr", client=c.client, distribution="owner", **base),
            True,
        ),
        Case(
            "apr/pdnr/lc2-graph",
            lambda c: tfo.cp_apr(C(c), 3, algorithm="pdnr", client=c.client, distribution="graph", **base),
            True,
        ),
    ]
    kw = dict(seed=1, max_inner_iters=5, tol=0)
    cases += _resume_cases(
        "apr/mu/inline", lambda c, **k: tfo.cp_apr(C(c), 3, scheduler="inline", **kw, **k), "max_iters"
    )
    cases += _resume_cases(
        "apr/pdnr/lc2-owner",
        lambda c, **k: tfo.cp_apr(C(c), 3, algorithm="pdnr", client=c.client, distribution="owner", **kw, **k),
        "max_iters",
        cluster=True,
    )
    return cases


def _tt_cases() -> list[Case]:
    S = lambda c: c.inputs["sparse"]  # noqa: E731
    base = dict(seed=1, max_sweeps=4, tol=0)
    inl = dict(base, scheduler="inline")
    rnd = dict(method="randomized", samples=SAMPLES)
    cases = [
        Case("tt/exact/inline", lambda c: tfo.tt_als(S(c), 3, **inl)),
        Case("tt/exact/inline/ranks-3-4-2", lambda c: tfo.tt_als(S(c), [3, 4, 2], **inl)),
        Case("tt/exact/inline/streaming", lambda c: tfo.tt_als(S(c), 3, execution="streaming", **inl)),
        Case("tt/exact/auto/default-tol", lambda c: tfo.tt_als(S(c), 3, seed=1)),
        Case("tt/randomized/inline", lambda c: tfo.tt_als(S(c), 3, **rnd, **inl)),
        Case("tt/randomized/inline/fit-every-2", lambda c: tfo.tt_als(S(c), 3, fit_every=2, **rnd, **inl)),
        Case("tt/exact/embedded", lambda c: tfo.tt_als(S(c), 3, scheduler="embedded", **base)),
        Case("tt/exact/lc2", lambda c: tfo.tt_als(S(c), 3, client=c.client, **base), True),
        Case("tt/exact/lc2/partitions-3", lambda c: tfo.tt_als(S(c), 3, client=c.client, partitions=3, **base), True),
        Case("tt/randomized/lc2", lambda c: tfo.tt_als(S(c), 3, client=c.client, **rnd, **base), True),
    ]
    kw = dict(seed=1, tol=0)
    cases += _resume_cases(
        "tt/exact/inline", lambda c, **k: tfo.tt_als(S(c), 3, scheduler="inline", **kw, **k), "max_sweeps"
    )
    cases += _resume_cases(
        "tt/randomized/inline", lambda c, **k: tfo.tt_als(S(c), 3, scheduler="inline", **rnd, **kw, **k), "max_sweeps"
    )
    cases += _resume_cases(
        "tt/randomized/lc2",
        lambda c, **k: tfo.tt_als(S(c), 3, client=c.client, **rnd, **kw, **k),
        "max_sweeps",
        cluster=True,
    )
    return cases


def _tucker_cases() -> list[Case]:
    S = lambda c: c.inputs["sparse"]  # noqa: E731
    base = dict(seed=1, max_iters=4, tol=0, progress=False)
    inl = dict(base, scheduler="inline")
    J = (3, 3, 2, 2)
    cases = [
        Case("tucker/inline", lambda c: tfo.tucker_hooi(S(c), J, **inl)),
        Case("tucker/inline/svd-randomized", lambda c: tfo.tucker_hooi(S(c), J, svd="randomized", **inl)),
        Case("tucker/inline/init-nvecs", lambda c: tfo.tucker_hooi(S(c), J, init="nvecs", **inl)),
        Case("tucker/inline/kernel-csr", lambda c: tfo.tucker_hooi(S(c), J, kernel="csr", **inl)),
        Case("tucker/inline/kernel-fiber", lambda c: tfo.tucker_hooi(S(c), J, kernel="fiber", **inl)),
        Case("tucker/inline/streaming", lambda c: tfo.tucker_hooi(S(c), J, execution="streaming", **inl)),
        Case("tucker/auto/default-tol", lambda c: tfo.tucker_hooi(S(c), J, seed=1, progress=False)),
        Case("tucker/embedded", lambda c: tfo.tucker_hooi(S(c), J, scheduler="embedded", **base)),
        Case("tucker/lc2", lambda c: tfo.tucker_hooi(S(c), J, client=c.client, **base), True),
        Case(
            "tucker/lc2/svd-randomized",
            lambda c: tfo.tucker_hooi(S(c), J, client=c.client, svd="randomized", **base),
            True,
        ),
    ]
    kw = dict(seed=1, tol=0, progress=False)
    cases += _resume_cases(
        "tucker/inline", lambda c, **k: tfo.tucker_hooi(S(c), J, scheduler="inline", **kw, **k), "max_iters"
    )
    cases += _resume_cases(
        "tucker/lc2", lambda c, **k: tfo.tucker_hooi(S(c), J, client=c.client, **kw, **k), "max_iters", cluster=True
    )
    return cases


def _sgd_cases() -> list[Case]:
    S = lambda c: c.inputs["sparse"]  # noqa: E731
    base = dict(test_fraction=0.1, epochs=4, seed=1, threads=1, patience=None, progress=False)
    inl = dict(base, scheduler="inline")

    def warm(c):
        first = tfo.tucker_sgd(S(c), 3, 3, **inl)
        return tfo.tucker_sgd(S(c), 3, 3, init=first, **dict(inl, epochs=2))

    return [
        Case("sgd/inline", lambda c: tfo.tucker_sgd(S(c), 3, 3, **inl)),
        Case("sgd/inline/plain-step", lambda c: tfo.tucker_sgd(S(c), 3, 3, step="plain", **inl)),
        Case(
            "sgd/inline/no-rebalance-batch-16",
            lambda c: tfo.tucker_sgd(S(c), [3, 2, 2, 3], 2, rebalance=False, batch=16, **inl),
        ),
        Case(
            "sgd/inline/patience",
            lambda c: tfo.tucker_sgd(S(c), 3, 3, **dict(inl, epochs=40, patience=2, lr_core=0.9, lr_factors=1.0)),
        ),
        Case("sgd/inline/warm-start", warm),
        Case("sgd/embedded", lambda c: tfo.tucker_sgd(S(c), 3, 3, scheduler="embedded", **base)),
        Case("sgd/lc2", lambda c: tfo.tucker_sgd(S(c), 3, 3, client=c.client, **base), True),
    ]


def _resume_cases(prefix: str, run: Callable[..., Any], iters_key: str, cluster: bool = False) -> list[Case]:
    """``prefix/ckpt-first3``: 3 iterations with a checkpoint; ``/ckpt-file``: that checkpoint's
    arrays; ``/resumed-to6``: resumed from it to 6 iterations (the uninterrupted run's result)."""
    key = prefix.replace("/", "_")

    def first(c):
        ck = c.work / "ck" / f"{key}.npz"
        ck.parent.mkdir(exist_ok=True)
        r = run(c, checkpoint=ck, **{iters_key: 3})
        shutil.copy(ck, ck.with_suffix(".first.npz"))
        return r

    def ckfile(c):
        return npz_parts(c.work / "ck" / f"{key}.first.npz")

    def resumed(c):
        return run(c, checkpoint=c.work / "ck" / f"{key}.npz", resume=True, **{iters_key: 6})

    return [
        Case(f"{prefix}/ckpt-first3", first, cluster),
        Case(f"{prefix}/ckpt-file", ckfile, cluster, after=f"{prefix}/ckpt-first3"),
        Case(f"{prefix}/resumed-to6", resumed, cluster, after=f"{prefix}/ckpt-first3"),
    ]


def _saved(c: Ctx, name: str, fn, *args, **kw):
    out = c.work / name
    fn(*args, out=out, **kw)
    return tfo.load_result(out)


# --- the command line and a workflow


def tfooc_command() -> list[str]:
    """The ``tfooc`` console script beside this interpreter (it honours PYTHONPATH), else the module."""
    script = Path(sys.executable).with_name("tfooc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tensorflow_ooc.cli"]


def _cli(c: Ctx, *args: str) -> None:
    """``tfooc -q ARGS`` in the work folder (never the checkout: its package would shadow PYTHONPATH's)."""
    cmd = [*tfooc_command(), "-q", *args]
    p = subprocess.run(cmd, cwd=c.work, env=c.env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: tfooc {' '.join(args)}\n{p.stderr[-3000:]}")


def _cli_case(name: str, out: str, *args: str, cluster: bool = False, store: str = "sparse") -> Case:
    def run(c: Ctx):
        src = c.inputs["dense_zarr"] if store == "dense" else str(c.inputs[store].path)
        extra = ("--scheduler", c.address) if cluster else ()
        _cli(c, *args[:1], src, "--out", str(c.work / out), *args[1:], *extra)
        return tfo.load_result(c.work / out)

    return Case(name, run, cluster)


def _cli_cases() -> list[Case]:
    it = ("--max-iters", str(ITERS), "--tol", "0", "--seed", "1")
    cases = [
        _cli_case("cli/cpd/exact", "cli-cpd.zarr", "cpd", "--rank", str(RANK), *it),
        _cli_case(
            "cli/cpd/sts-f32",
            "cli-cpd-sts.zarr",
            "cpd",
            "--rank",
            str(RANK),
            "--method",
            "sts",
            "--samples",
            str(SAMPLES),
            "--dtype",
            "float32",
            *it,
        ),
        _cli_case(
            "cli/cpd/nonneg-reg", "cli-cpd-nn.zarr", "cpd", "--rank", str(RANK), "--nonnegative", "--reg", "0.01", *it
        ),
        _cli_case("cli/cpd/dense-zarr", "cli-cpd-dense.zarr", "cpd", "--rank", "3", *it, store="dense"),
        _cli_case("cli/cpd/lc2", "cli-cpd-lc2.zarr", "cpd", "--rank", str(RANK), *it, cluster=True),
        _cli_case(
            "cli/apr/mu",
            "cli-apr.zarr",
            "apr",
            "--rank",
            "3",
            "--max-iters",
            str(ITERS),
            "--max-inner-iters",
            "5",
            "--seed",
            "1",
            store="counts",
        ),
        _cli_case(
            "cli/apr/pdnr-lc2-owner",
            "cli-apr-owner.zarr",
            "apr",
            "--rank",
            "3",
            "--algorithm",
            "pdnr",
            "--max-iters",
            str(ITERS),
            "--max-inner-iters",
            "5",
            "--seed",
            "1",
            "--distribution",
            "owner",
            store="counts",
            cluster=True,
        ),
        _cli_case("cli/tt/exact", "cli-tt.zarr", "tt", "--ranks", "3", "--sweeps", "4", "--tol", "0", "--seed", "1"),
        _cli_case(
            "cli/tt/randomized",
            "cli-tt-r.zarr",
            "tt",
            "--ranks",
            "3,4,2",
            "--method",
            "randomized",
            "--samples",
            str(SAMPLES),
            "--sweeps",
            "4",
            "--tol",
            "0",
            "--seed",
            "1",
        ),
        _cli_case(
            "cli/tucker",
            "cli-tucker.zarr",
            "tucker",
            "--ranks",
            "3,3,2,2",
            "--max-iters",
            "4",
            "--tol",
            "0",
            "--seed",
            "1",
        ),
        _cli_case(
            "cli/complete",
            "cli-complete.zarr",
            "complete",
            "--ranks",
            "3",
            "--core-rank",
            "3",
            "--epochs",
            "4",
            "--threads",
            "1",
            "--seed",
            "1",
            "--test-fraction",
            "0.1",
        ),
    ]

    def resume(c: Ctx):
        src, out, ck = str(c.inputs["sparse"].path), str(c.work / "cli-resume.zarr"), str(c.work / "cli-resume.npz")
        common = ("--rank", str(RANK), "--tol", "0", "--seed", "1", "--checkpoint", ck)
        _cli(c, "cpd", src, "--out", out, "--max-iters", "3", *common)
        _cli(c, "cpd", src, "--out", out, "--max-iters", "6", "--resume", *common)
        return tfo.load_result(out)

    cases.append(Case("cli/cpd/resumed-3-to-6", resume))
    return cases


WORKFLOW = """\
name: identical
cluster: {cluster}
steps:
  convert: {{kind: convert, input: t.tns, out: t.zarr, chunk_nnz: {chunk}}}
  convert-counts: {{kind: convert, input: c.tns, out: c.zarr, chunk_nnz: {chunk}}}
  cp: {{kind: decompose, input: t.zarr, out: cp.zarr, rank: {rank}, max_iters: {iters}, tol: 0, seed: 1}}
  cp-f32-streaming:
    {{kind: decompose, input: t.zarr, out: cp32.zarr, rank: {rank}, max_iters: {iters}, tol: 0, seed: 1,
     dtype: float32, execution: streaming}}
  cp-sts:
    {{kind: decompose, method: sts, input: t.zarr, out: cp-sts.zarr, rank: {rank}, max_iters: {iters}, tol: 0,
     seed: 1, samples: {samples}}}
  cp-nonneg:
    {{kind: decompose, input: t.zarr, out: cp-nn.zarr, rank: {rank}, max_iters: {iters}, tol: 0, seed: 1,
     nonnegative: true}}
  cp-cluster:
    {{kind: decompose, input: t.zarr, out: cp-cluster.zarr, rank: {rank}, max_iters: {iters}, tol: 0, seed: 1,
     scheduler: cluster}}
  apr:
    {{kind: decompose, method: cp-apr, input: c.zarr, out: apr.zarr, rank: 3, max_iters: {iters},
     max_inner_iters: 5, seed: 1}}
  tt: {{kind: decompose, method: tt, input: t.zarr, out: tt.zarr, ranks: 3, max_iters: 4, tol: 0, seed: 1}}
  tt-randomized:
    {{kind: decompose, method: tt, algorithm: randomized, samples: {samples}, input: t.zarr, out: tt-r.zarr,
     ranks: 3, max_iters: 4, tol: 0, seed: 1}}
  tucker:
    {{kind: decompose, method: tucker, input: t.zarr, out: tucker.zarr, ranks: [3, 3, 2, 2], max_iters: 4, tol: 0,
     seed: 1}}
  complete:
    {{kind: decompose, method: completion, input: t.zarr, out: ft.zarr, ranks: 3, core_rank: 3, epochs: 4,
     patience: 10, threads: 1, seed: 1}}
"""
WORKFLOW_OUTPUTS = {
    "cp": "cp.zarr",
    "cp-f32-streaming": "cp32.zarr",
    "cp-sts": "cp-sts.zarr",
    "cp-nonneg": "cp-nn.zarr",
    "cp-cluster": "cp-cluster.zarr",
    "apr": "apr.zarr",
    "tt": "tt.zarr",
    "tt-randomized": "tt-r.zarr",
    "tucker": "tucker.zarr",
    "complete": "ft.zarr",
}


def _workflow_cases() -> list[Case]:
    def run_spec(c: Ctx):
        storage = c.work / "wf"
        storage.mkdir(exist_ok=True)
        for name in ("t.tns", "c.tns"):
            shutil.copy(c.inputs["tns"] / name, storage / name)
        spec = c.work / "identical.yaml"
        spec.write_text(WORKFLOW.format(cluster=c.address, chunk=CHUNK_NNZ, rank=RANK, iters=ITERS, samples=SAMPLES))
        cmd = [*tfooc_command(), "run", str(spec), "--storage", str(storage), "-q"]
        p = subprocess.run(cmd, cwd=c.work, env=c.env, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"tfooc run: exit {p.returncode}\n{p.stderr[-3000:]}")
        c.results["workflow"] = storage
        return npz_like_input(storage / "t.zarr")

    cases = [Case("workflow/run+convert", run_spec, True)]
    for step, out in WORKFLOW_OUTPUTS.items():
        load = lambda c, out=out: tfo.load_result(c.results["workflow"] / out)  # noqa: E731
        cases.append(Case(f"workflow/{step}", load, True, after="workflow/run+convert"))
    return cases


def npz_like_input(path: Path):
    return input_parts(tfo.open_store(path))


def all_cases() -> list[Case]:
    inputs = [
        Case("input/sparse4", lambda c: input_parts(c.inputs["sparse"])),
        Case("input/counts3", lambda c: input_parts(c.inputs["counts"])),
        Case("input/dense3", lambda c: ({"dense": c.inputs["dense"]}, {})),
    ]
    cases = inputs + _cp_cases() + _apr_cases() + _tt_cases() + _tucker_cases() + _sgd_cases()
    cases += _cli_cases() + _workflow_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names repeat"
    # in-process cases first, then everything on the cluster (started once), in a fixed order
    return [c for c in cases if not c.cluster] + [c for c in cases if c.cluster]


# ------------------------------------------------------------------------------------------------
# running and comparing


def _origin_checks(ctx: Ctx) -> dict:
    """Where the package comes from here, in the CLI's subprocesses and on the cluster's workers."""
    here = str(Path(tfo.__file__).resolve().parent)
    p = subprocess.run(  # the interpreter tfooc_command() runs, with the CLI's working folder and environment
        [sys.executable, "-c", "import tensorflow_ooc, os; print(os.path.dirname(tensorflow_ooc.__file__))"],
        cwd=ctx.work,
        env=ctx.env,
        capture_output=True,
        text=True,
        check=True,
    )
    sub = str(Path(p.stdout.strip()).resolve())
    if sub != here:
        raise SystemExit(f"CLI subprocesses import tensorflow_ooc from {sub}, this process from {here}")
    return {"tensorflow_ooc": here, "cli": " ".join(tfooc_command()), **_git_state(Path(here).parent)}


def _git_state(root: Path) -> dict:
    """The commit of the checkout the package comes from, and whether its package files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "tensorflow_ooc"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": head.stdout.strip(), "package_modified": bool(dirty.stdout.strip())}


def _start_cluster(ctx: Ctx) -> None:
    from distributed import Client, LocalCluster

    ctx.cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    ctx.client = Client(ctx.cluster)

    def where():
        import tensorflow_ooc

        return str(Path(tensorflow_ooc.__file__).resolve().parent)

    here = str(Path(tfo.__file__).resolve().parent)
    there = ctx.client.run(where)
    if set(there.values()) != {here}:
        raise SystemExit(f"cluster workers import tensorflow_ooc from {there}, this process from {here}")


def run_cases(cases: list[Case], work: Path) -> tuple[dict, dict[str, np.ndarray]]:
    env = dict(os.environ)
    ctx = Ctx(work=work, inputs={}, env=env, results={})
    meta = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tfo_version": tfo.__version__,
        "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "cpus": os.cpu_count(),
        **_origin_checks(ctx),
    }
    print(f"tensorflow_ooc imported from {meta['tensorflow_ooc']}", flush=True)
    t0 = time.perf_counter()
    ctx.inputs = make_inputs(work)
    print(f"inputs written in {time.perf_counter() - t0:.1f} s", flush=True)
    records: dict[str, dict] = {}
    arrays: dict[str, np.ndarray] = {}
    try:
        for case in cases:
            if case.cluster and ctx.client is None:
                _start_cluster(ctx)
                meta["cluster_workers"] = len(ctx.client.scheduler_info()["workers"])
            t = time.perf_counter()
            try:
                rec, arrs = record_of(case.run(ctx))
            except Exception as exc:  # recorded and reported; the other cases go on
                rec, arrs = {"error": f"{type(exc).__name__}: {exc}"[:2000]}, {}
                traceback.print_exc()
            rec["seconds"] = round(time.perf_counter() - t, 3)
            records[case.name] = rec
            for k, v in arrs.items():
                arrays[f"{case.name}::{k}"] = v
            state = rec.get("error", "")[:90] or f"{rec['sha256'][:16]}  it={rec['iterations']}  fit={rec['fit']}"
            print(f"{case.name:<46} {rec['seconds']:7.2f} s  {state}", flush=True)
    finally:
        if ctx.client is not None:
            ctx.client.close()
            ctx.cluster.close()
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return {"_meta": meta, **records}, arrays


def _arrays_path(json_path: Path) -> Path:
    return json_path.with_name(json_path.name.removesuffix(".json") + ".arrays.npz")


def _max_abs_diff(name: str, base_arrays, now_arrays) -> str:
    if base_arrays is None:
        return ""
    diffs = []
    prefix = f"{name}::"
    for key in sorted(k for k in now_arrays if k.startswith(prefix)):
        if key not in base_arrays.files:
            continue
        a, b = base_arrays[key], now_arrays[key]
        if a.shape != b.shape:
            diffs.append(f"{key[len(prefix) :]} shape {a.shape}->{b.shape}")
        elif a.dtype.kind in "fc" or b.dtype.kind in "fc":
            d = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
            if d:
                diffs.append(f"{key[len(prefix) :]} {d:.2e}")
        elif not np.array_equal(a, b):
            diffs.append(f"{key[len(prefix) :]} differs")
    return "max|diff| " + ", ".join(diffs[:4]) if diffs else ""


def compare(base: dict, now: dict, base_arrays, now_arrays) -> int:
    names = [k for k in base if not k.startswith("_")]
    names += [k for k in now if not k.startswith("_") and k not in base]
    bad = 0
    print(f"\n{'case':<46} {'baseline':<16} {'now':<16} identical")
    for name in names:
        b, n = base.get(name), now.get(name)
        bh = "missing" if b is None else b.get("sha256", "error")[:16]
        nh = "missing" if n is None else n.get("sha256", "error")[:16]
        if b is None:
            print(f"{name:<46} {bh:<16} {nh:<16} new (not in the baseline)")
            continue
        same = n is not None and "sha256" in n and n["sha256"] == b.get("sha256")
        detail = ""
        if not same:
            bad += 1
            if n is None:
                detail = "case missing now"
            elif "error" in n:
                detail = n["error"][:120]
            elif "error" in b:
                detail = "baseline: " + b["error"][:110]
            else:
                parts = sorted(k for k in b["parts"] if b["parts"][k] != n["parts"].get(k))
                parts += sorted(k for k in n["parts"] if k not in b["parts"])
                detail = "parts " + ",".join(parts) + "  " + _max_abs_diff(name, base_arrays, now_arrays)
                if b.get("iterations") != n.get("iterations"):
                    detail += f"  iterations {b.get('iterations')}->{n.get('iterations')}"
        elif b.get("ran") != n.get("ran"):
            detail = f"(same numbers; ran {b.get('ran')} -> {n.get('ran')})"
        print(f"{name:<46} {bh:<16} {nh:<16} {'yes' if same else 'NO'}  {detail}".rstrip())
    total = len([k for k in base if not k.startswith("_")])
    print(f"\n{total - bad} of {total} baseline cases identical" + (f", {bad} not" if bad else ""))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="record the cases' hashes to this JSON (arrays beside it)")
    mode.add_argument("--compare", type=Path, metavar="BASELINE", help="run again and compare with this JSON")
    mode.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--only", metavar="REGEX", help="run the cases whose name matches (re.search)")
    ap.add_argument("--save", type=Path, help="with --compare: also write this run's JSON here")
    ap.add_argument("--workdir", type=Path, help="inputs and outputs here (default: a temporary folder, removed)")
    args = ap.parse_args(argv)

    every = all_cases()
    cases = every
    if args.only:
        picked = {c.name for c in every if re.search(args.only, c.name)}
        names = set(picked)
        picked |= {c.after for c in every if c.name in picked and c.after}
        cases = [c for c in every if c.name in picked]
    if args.list:
        for c in cases:
            print(c.name + ("  (cluster)" if c.cluster else ""))
        print(f"{len(cases)} cases")
        return 0
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=False)
        work = args.workdir
    else:
        work = Path(tempfile.mkdtemp(prefix="bench-identical-"))
    try:
        now, arrays = run_cases(cases, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(cases)} cases in {now['_meta']['seconds']} s")
    errors = [k for k, v in now.items() if not k.startswith("_") and "error" in v]

    def write(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        np.savez_compressed(_arrays_path(path), **arrays)
        print(f"wrote {path} and {_arrays_path(path).name}")

    if args.out:
        write(args.out)
        if errors:
            print(f"{len(errors)} cases failed: {', '.join(errors)}")
        return 1 if errors else 0
    if args.save:
        write(args.save)
    base = json.loads(args.compare.read_text())
    if args.only:
        base = {k: v for k, v in base.items() if k.startswith("_") or k in names}
    ap_path = _arrays_path(args.compare)
    base_arrays = np.load(ap_path) if ap_path.exists() else None
    now_arrays = {k: v for k, v in arrays.items()}
    bm, nm = base.get("_meta", {}), now["_meta"]
    print(f"baseline: {bm.get('tensorflow_ooc')} {bm.get('commit', '')[:12]}")
    print(
        f"now:      {nm.get('tensorflow_ooc')} {nm.get('commit', '')[:12]}"
        + (" (modified)" if nm.get("package_modified") else "")
    )
    for key in ("NUMBA_NUM_THREADS", "cpus", "numpy", "python"):
        if bm.get(key) != nm.get(key):  # rounding depends on them: hashes may differ for this reason alone
            print(f"warning: {key} was {bm.get(key)!r} for the baseline, {nm.get(key)!r} now")
    return compare(base, now, base_arrays, now_arrays)


if __name__ == "__main__":
    sys.exit(main())
