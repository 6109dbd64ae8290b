"""Check the in-process peers (GenTen, pyttb) against NumPy, then time them on a small tensor.

python benchmarks/peers                           # verify against NumPy, then time a small tensor
python benchmarks/peers --nnz 100000 --rank 16    # time a larger one as well
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from .common import numpy_mttkrp, random_factors
from .genten import (
    _GENTEN,
    GENTEN_ALL_METHODS,
    GENTEN_MODE_METHODS,
    _genten_solve,
    _genten_threads,
    _load_genten,
    _relative_difference,
    _skip_reason,
    genten_cp_als,
    genten_mttkrp,
)
from .pyttb_peer import pyttb_cp_als, pyttb_mttkrp

# --- verification and demo -----------------------------------------------------------------------------


def _numpy_cp_als(
    coords: np.ndarray, values: np.ndarray, factors: Sequence[np.ndarray], iters: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """CP-ALS exactly as Genten_CpAls.cpp does it (2-norm column scaling on the first iteration,
    max-norm floored at 1 afterwards), from ``factors`` with unit weights, on top of :func:`numpy_mttkrp`."""
    U = [f.copy() for f in factors]
    lam = np.ones(U[0].shape[1])
    for it in range(iters):
        for n in range(len(U)):
            V = numpy_mttkrp(coords, values, U, n)
            Y = np.ones((V.shape[1], V.shape[1]))
            for k, Uk in enumerate(U):
                if k != n:
                    Y *= Uk.T @ Uk
            Un = np.linalg.solve(Y, V.T).T  # Y symmetric: U[n] = V Y^-1
            lam = np.linalg.norm(Un, axis=0) if it == 0 else np.maximum(np.abs(Un).max(axis=0), 1.0)
            U[n] = Un / lam
    return lam, U


def _full(weights: np.ndarray, factors: Sequence[np.ndarray]) -> np.ndarray:
    """Dense tensor of a Kruskal tensor (small shapes only)."""
    out = weights[None, :]
    for f in factors:
        out = (out[:, None, :] * f[None, :, :]).reshape(-1, f.shape[1])
    return out.sum(axis=1).reshape([f.shape[0] for f in factors])


def verify(threads: int = 2, tol: float = 1e-10) -> dict:
    """Check both peers against NumPy on a small random tensor (3 modes, 50x60x70, 5000 nonzeros, rank 8).

    * pyttb: each mode's MTTKRP output against :func:`numpy_mttkrp`.
    * GenTen, per-mode methods: pygenten returns no MTTKRP output, so its MTTKRP is checked
      through two CP-ALS iterations from the shared factors, whose result depends on every MTTKRP
      (and on which factors each one used), against :func:`_numpy_cp_als` (full reconstructions).
    * GenTen, fused all-mode methods: CP-OPT's L-BFGS-B result is not reproducible in NumPy here,
      so these are checked by agreement with All-Iterated, whose kernel is the per-mode Perm one
      verified above (``max_rel_diff`` in :func:`genten_mttkrp`'s details).

    Returns
    -------
    dict
        Largest relative errors, per check.
    """
    rng = np.random.default_rng(7)
    shape, nnz, rank = (50, 60, 70), 5000, 8
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1).astype(np.int64)
    values = rng.random(nnz)
    factors = random_factors(shape, rank)
    errors: dict[str, float] = {}

    import pyttb as ttb

    S = ttb.sptensor(coords, values.reshape(-1, 1), shape)
    errors["pyttb"] = max(
        float(
            np.abs(S.mttkrp(factors, n) - numpy_mttkrp(coords, values, factors, n)).max()
            / np.abs(numpy_mttkrp(coords, values, factors, n)).max()
        )
        for n in range(3)
    )

    gt = _load_genten(threads)
    lam, U = _numpy_cp_als(coords, values, factors, iters=2)
    ref = _full(lam, U)
    X = gt.Sptensor(shape, coords, values, copy=True)
    try:
        threads_used = _genten_threads(gt)
        for method in GENTEN_MODE_METHODS:
            if _skip_reason(method, threads_used):
                continue
            rec = _genten_solve(gt, X, factors, "mode", method, iters=2)
            if "error" not in rec:
                errors[f"genten {method}"] = float(
                    np.abs(_full(rec["weights"], rec["factors"]) - ref).max() / np.abs(ref).max()
                )
        fused = {
            m: _genten_solve(gt, X, factors, "all", m, iters=2)
            for m in GENTEN_ALL_METHODS
            if not _skip_reason(m, threads_used)
        }
    finally:
        del X
    if "error" in fused["Iterated"]:
        raise AssertionError(f"GenTen All-Iterated failed: {fused['Iterated']['error']}")
    for m, rec in fused.items():
        if m != "Iterated" and "error" not in rec:
            errors[f"genten All-{m} vs All-Iterated"] = _relative_difference(rec, fused["Iterated"])
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad:
        raise AssertionError(f"peers disagree with NumPy beyond {tol}: {bad}")
    return errors


FIT_TOL = 1e-6
"""Largest difference allowed between GenTen's and pyttb's CP-ALS fits from the same start."""


def verify_cp_als(threads: int = 2, iters: int = 3) -> dict:
    """Compare GenTen's and pyttb's CP-ALS fits after ``iters`` iterations from the same start.

    Same tensor and rank as :func:`verify`, start :func:`random_factors` with unit weights, GenTen's
    default MTTKRP method. The two run the same algorithm (Tensor Toolbox CP-ALS: 2-norm column
    normalisation in the first iteration, max-norm floored at 1 afterwards, fit
    ``1 - ||X - M|| / ||X||``); they differ only in rounding (GenTen solves the normal equations with
    a symmetric solver, pyttb with LU; GenTen's fit takes the inner product with the tensor, pyttb's
    reuses the last MTTKRP), so the fits should agree far below :data:`FIT_TOL`.

    Returns
    -------
    dict
        ``genten_fit``, ``pyttb_fit``, ``abs_diff``, ``iters``, ``agree`` (``abs_diff <= FIT_TOL``).
    """
    import pyttb as ttb

    rng = np.random.default_rng(7)
    shape, nnz, rank = (50, 60, 70), 5000, 8
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1).astype(np.int64)
    values = rng.random(nnz)
    init = random_factors(shape, rank)
    g = genten_cp_als(coords, values, shape, rank, iters=iters, threads=threads, init=init)
    S = ttb.sptensor(coords, values.reshape(-1, 1), shape)
    _, _, out = ttb.cp_als(S, rank, maxiters=iters, stoptol=0, printitn=0, init=ttb.ktensor(init))
    diff = abs(g["fit"] - float(out["fit"]))
    return {
        "genten_fit": g["fit"],
        "pyttb_fit": float(out["fit"]),
        "abs_diff": diff,
        "iters": iters,
        "agree": diff <= FIT_TOL,
    }


def _demo(shape: tuple[int, ...], nnz: int, rank: int, threads: int, iters: int) -> None:
    """Time both peers on a uniform random tensor and print the results."""
    rng = np.random.default_rng(3)
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1).astype(np.int64)
    values = rng.random(nnz)
    print(f"\ntensor {'x'.join(map(str, shape))}, {nnz} nonzeros, rank {rank}")
    g = genten_mttkrp(coords, values, shape, rank, threads=threads, iters=iters)
    print(
        f"  GenTen: {g['seconds'] * 1e3:8.3f} ms all-mode ({g['what']}, best method {g['method']}, "
        f"{g['threads']} threads, {iters} iterations per method)"
    )
    for name, v in g["per_method"].items():
        if not isinstance(v, float):
            print(f"    {name:<16}  {v}")
            continue
        d = g["details"][name]
        how = f"best of {len(d['samples'])} iterations" if d["stat"] == "min" else f"mean of {d['calls']} calls"
        print(f"    {name:<16}{v * 1e3:8.3f} ms  ({how}; GenTen ran '{d['resolved']}')")
    p = pyttb_mttkrp(coords, values, shape, rank, repeat=3)
    modes = ", ".join(f"{n}: {s * 1e3:.2f}" for n, s in p["per_mode"].items())
    print(f"  pyttb:  {p['seconds'] * 1e3:8.3f} ms all-mode (per mode ms {modes}; best of {p['repeat']})")

    # CP-ALS, all from the same start.
    init = random_factors(shape, rank)
    print("  CP-ALS per iteration (start: random_factors, unit weights):")
    for method in (None, "fastest"):
        c = genten_cp_als(coords, values, shape, rank, iters=iters, threads=threads, init=init, method=method)
        per_iter = ", ".join(f"{s * 1e3:.3f}" for s in c["per_iter"])
        label = "GenTen default" if method is None else "GenTen fastest"
        print(
            f"    {label:<16}{c['seconds_per_iter'] * 1e3:8.3f} ms  ({c['stat']} of {c['iters']} iterations "
            f"[{per_iter}] ms, mean {c['mean_seconds_per_iter'] * 1e3:.3f}; method {c['method']}, GenTen ran "
            f"'{c['resolved']}'; fit {c['fit']:.9f} after {c['iters']})"
        )
        for name, v in c.get("per_method", {}).items():
            print(f"      {name:<14}" + (f"{v * 1e3:8.3f} ms" if isinstance(v, float) else f"  {v}"))
    q = pyttb_cp_als(coords, values, shape, rank, iters=2, init=init)
    print(
        f"    {'pyttb':<16}{q['seconds_per_iter'] * 1e3:8.3f} ms  (wall time of {q['iters']} iterations / "
        f"{q['iters']}; fit {q['fit']:.9f} after {q['iters']})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--nnz", type=int, default=0, help="also time a 500x600x700 tensor with this many nonzeros")
    ap.add_argument("--rank", type=int, default=16, help="rank for --nnz")
    args = ap.parse_args(argv)
    errors = verify(args.threads)
    print("verification against NumPy (largest relative error):")
    for k, v in errors.items():
        print(f"  {k:<38}{v:.1e}")
    if _GENTEN["threads"] != 1:
        print(f"  (Single and All-Single not run: single-thread kernels race with {_GENTEN['threads']} threads)")
    c = verify_cp_als(args.threads)
    verdict = "agree" if c["agree"] else f"DISAGREE beyond {FIT_TOL:g} (see verify_cp_als)"
    print(
        f"CP-ALS fit after {c['iters']} iterations from the same start: GenTen {c['genten_fit']:.15f}, "
        f"pyttb {c['pyttb_fit']:.15f}, |difference| {c['abs_diff']:.1e}: {verdict}"
    )
    _demo((50, 60, 70), 5000, 8, args.threads, args.iters)
    if args.nnz:
        _demo((500, 600, 700), args.nnz, args.rank, args.threads, args.iters)
