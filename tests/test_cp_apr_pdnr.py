"""PDN-R against pyttb's ``cp_apr(algorithm="pdnr")`` outer iteration by outer iteration, from the
same start, on fresh random count tensors (with a row that has no nonzero and a zero row in the
initial factors); and on sparse binary tensors, where the reference's log-likelihood can become
-inf, a finite one with the rows that needed the safeguard named in the history."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import pyttb as ttb
from test_cp_apr import poisson_tensor, store_of

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.common.checkpoint_files import read_npz

OUTER = 10


def arranged(weights, factors):
    return tfo.PoissonResult.arranged(weights, factors, 0, 0, 0, 0, [], {}, {})


def relative_difference(a, b) -> float:
    """The largest entry difference of the factor matrices and weights, relative to each one's largest entry."""
    parts = [np.max(np.abs(x - y)) / np.max(np.abs(y)) for x, y in zip(a.factors, b.factors)]
    return max(parts + [float(np.max(np.abs(a.weights - b.weights)) / np.max(b.weights))])


def pyttb_pdnr(coords, vals, shape, rank, init, iters, tol):
    X = ttb.sptensor(coords, vals[:, None], shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its own log(0) of refused line-search steps
        M, _, out = ttb.cp_apr(
            X,
            rank,
            algorithm="pdnr",
            init=ttb.ktensor([a.copy() for a in init]),
            maxiters=iters,
            stoptol=tol,
            printitn=0,
        )
    return arranged(M.weights, M.factor_matrices), out


def ours_per_outer(tmp_path, store, rank, init, tol, **kw):
    """Our run and its model after each outer iteration (read back from the checkpoint, which the
    run writes before it calls the callback)."""
    ck = tmp_path / "pdnr.ck.npz"
    offsets = np.cumsum([0] + [a.shape[0] for a in init])
    models = []

    def keep(record):
        arrays, _ = read_npz(str(ck))
        F = arrays["factors"]
        models.append(arranged(arrays["weights"], [F[offsets[n] : offsets[n + 1]] for n in range(len(init))]))

    r = tfo.cp_apr(
        store, rank, algorithm="pdnr", init=init, tol=tol, max_iters=OUTER, checkpoint=ck, callback=keep, **kw
    )
    return r, models


@pytest.mark.parametrize("order", [3, 4, 5])
def test_pdnr_equals_pyttb_after_every_outer_iteration(tmp_path, rng, order):
    shape = tuple(int(s) for s in rng.integers(4, 8 if order < 5 else 6, order))
    R = int(rng.integers(2, 5))
    X, coords, vals = poisson_tensor(rng, shape, R, 4 * int(np.prod(shape)) ** 0.8)
    # a slice with no nonzero (pyttb sets its row to zero and counts no inner iteration for it)
    empty_mode = int(rng.integers(order))
    keep = coords[:, empty_mode] != shape[empty_mode] - 1
    coords, vals = coords[keep], vals[keep]
    store = store_of(tmp_path, "s", coords, vals, shape)
    init = [rng.random((I, R)) for I in shape]
    init[int(rng.integers(order))][0] = 0  # a zero row: pyttb gives it 1e-8 before normalizing
    tol = 1e-9
    r, ours = ours_per_outer(tmp_path, store, R, init, tol)
    assert len(ours) == r.iterations
    for k in range(1, r.iterations + 1):
        ref, out = pyttb_pdnr(coords, vals, shape, R, init, k, tol)
        assert len(out["nInnerIters"]) == k
        diff = relative_difference(ours[k - 1], ref)
        assert diff < 1e-10, f"outer iteration {k}: factors {diff:.2e} apart"
        assert r.history[k - 1]["inner_iterations"] == int(out["nInnerIters"][-1])
        assert r.history[k - 1]["kkt_violation"] == pytest.approx(out["kktViolations"][-1], rel=1e-10)
    assert r.loglik == pytest.approx(out["obj"], rel=1e-10)
    assert not ours[-1].factors[empty_mode][-1].any()
