"""PDN-R against pyttb's ``cp_apr(algorithm="pdnr")`` outer iteration by outer iteration, from the
same start, on fresh random count tensors (with a row that has no nonzero and a zero row in the
initial factors); and on sparse binary tensors, where the reference's log-likelihood can become
-inf, a finite one with the rows that needed the safeguard named in the history."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import pyttb as ttb
from test_cp_apr import poisson_tensor, store_of

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.common.checkpoint_files import read_npz
from tensorflow_ooc.errors import DecompositionError

OUTER = 10


def arranged(weights, factors):
    return tfo.PoissonResult.arranged(weights, factors, 0, 0, 0, 0, [], {}, {})


def relative_difference(a, b) -> float:
    """The largest entry difference of the factor matrices and weights, relative to each one's
    largest entry, under the best matching of components (two weights equal to rounding can sort
    either way); a component of weight 0 (no part of the model) is compared by its weight only."""
    live = b.weights > 0

    def apart(order) -> float:
        parts = [
            np.max(np.abs(x[:, order][:, live] - y[:, live])) / np.max(np.abs(y[:, live]))
            for x, y in zip(a.factors, b.factors)
        ]
        return max(parts + [float(np.max(np.abs(a.weights[list(order)] - b.weights)) / np.max(b.weights))])

    return min(apart(list(p)) for p in itertools.permutations(range(len(b.weights))))


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
        # the KKT violation is 1 - phi at its largest: rounding of phi (about 1) bounds it absolutely
        assert r.history[k - 1]["kkt_violation"] == pytest.approx(out["kktViolations"][-1], rel=1e-10, abs=1e-12)
    assert r.loglik == pytest.approx(out["obj"], rel=1e-10)
    assert not ours[-1].factors[empty_mode][-1].any()


def clustered_start(rng, shape, rank):
    """Each factor row in one component (a clustering of the rows): most nonzeros of a random
    binary tensor then start with model value 0."""
    init = []
    for I in shape:
        a = np.zeros((I, rank))
        a[np.arange(I), rng.integers(0, rank, I)] = rng.random(I) + 0.5
        init.append(a)
    return init


def test_pdnr_stays_finite_where_pyttb_returns_minus_infinity(tmp_path, rng, recwarn, caplog):
    """A sparse binary tensor from a clustered start: pyttb's PDN-R keeps nonzeros at model value 0
    (its rows' objectives are infinite, so its line search takes any unit step) and returns -inf;
    ours leaves out of a row's problem the nonzeros no value of the row can reach, takes the first
    step with a finite objective, lifts such rows off zero, says so in the history, and ends finite."""
    shape, R, nnz = (200, 200, 50), 8, 3000
    lin = rng.choice(int(np.prod(shape)), nnz, replace=False)
    coords = np.stack(np.unravel_index(lin, shape), axis=1)
    vals = np.ones(nnz)
    init = clustered_start(rng, shape, R)
    start = np.sum(np.prod([a[coords[:, n]] for n, a in enumerate(init)], axis=0), axis=1)
    assert (start == 0).mean() > 0.5
    _, out = pyttb_pdnr(coords, vals, shape, R, init, 2, 1e-4)
    assert out["obj"] == -np.inf
    store = store_of(tmp_path, "binary", coords, vals, shape)
    with caplog.at_level("WARNING", logger="tensorflow_ooc"):
        r = tfo.cp_apr(store, R, algorithm="pdnr", init=init, max_iters=4)
    assert all(np.isfinite(h["loglik"]) for h in r.history) and np.isfinite(r.loglik)
    model = np.sum(r.weights * np.prod([f[coords[:, n]] for n, f in enumerate(r.factors)], axis=0), axis=1)
    assert model.min() > 0
    first = r.history[0]["safeguards"]
    assert sum(first["zero_model_rows"]) > 0 and sum(first["unreachable_nonzeros"]) > 0
    assert all(len(v) == 3 for v in first.values())
    assert any("where pyttb's log-likelihood is -inf" in m for m in caplog.messages)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    # from a start positive at every nonzero nothing is needed: no safeguards in the history
    plain = tfo.cp_apr(store, R, algorithm="pdnr", seed=int(rng.integers(1 << 30)), max_iters=2)
    assert not any("safeguards" in h for h in plain.history)


def without_component(init, mode: int, r: int):
    """``init`` with component ``r`` held by no row of ``mode`` (its rows moved to the next
    component): the start's weight of ``r`` is 0, so the rows of the other modes that hold only
    ``r`` are zero once the weights go into them."""
    init = [a.copy() for a in init]
    a = init[mode]
    moved = a[:, r] > 0
    a[moved, (r + 1) % a.shape[1]] = a[moved, r]
    a[:, r] = 0
    return init


def test_pdnr_lifts_rows_that_are_zero_throughout(tmp_path, rng):
    """A clustered start in which one component is held by no row of the last mode: the first mode's
    rows holding only that component are zero throughout once the weights go into them, and where
    no value of such a row reaches any of its nonzeros, it has no problem to solve and its own entries
    give no scale to lift it by. They are lifted to a fraction of the mode's mean entry,
    the next modes reach their nonzeros, and every outer iteration ends finite, as from any start."""
    shape, R, nnz = (400, 120, 30), 6, 2000  # 5 nonzeros a first-mode row: many reach none of theirs
    lin = rng.choice(int(np.prod(shape)), nnz, replace=False)
    coords = np.stack(np.unravel_index(lin, shape), axis=1)
    init = without_component(clustered_start(rng, shape, R), 2, int(rng.integers(R)))
    store = store_of(tmp_path, "binary", coords, np.ones(nnz), shape)
    r = tfo.cp_apr(store, R, algorithm="pdnr", init=init, max_iters=3)
    assert all(np.isfinite(h["loglik"]) for h in r.history)
    model = np.sum(r.weights * np.prod([f[coords[:, n]] for n, f in enumerate(r.factors)], axis=0), axis=1)
    assert model.min() > 0
    first = r.history[0]["safeguards"]
    assert first["frozen_rows"][0] > 0 and first["lifted_rows"][0] >= first["frozen_rows"][0]
    # lifting those rows lets the later modes reach every nonzero
    assert first["unreachable_nonzeros"][1:] == [0, 0]


def test_pdnr_error_names_the_nonzeros_no_update_reaches():
    """Where the log-likelihood is still not finite after an outer iteration, the error says why:
    nonzeros no row update could reach (no component positive on all the other modes), or factors
    beyond float64's range; not 'try another init or seed'."""
    from tensorflow_ooc.decompositions.apr.cp_apr import _non_finite

    msg = _non_finite(0, -np.inf, "pdnr", {"unreachable_nonzeros": [3, 0, 1], "zero_model_rows": [1, 0, 0]})
    assert "no component positive on all the other modes" in msg and "4 nonzero-mode pairs" in msg
    assert "NaN or infinite" in _non_finite(2, float("nan"), "pdnr", {})
    assert "seed" not in msg


def test_initial_factors_beyond_float64_are_refused_without_warnings(tmp_path, rng, recwarn):
    shape = (6, 5, 4)
    X, coords, vals = poisson_tensor(rng, shape, 2, 300)
    store = store_of(tmp_path, "s", coords, vals, shape)
    init = [rng.random((I, 2)) * 1e250 for I in shape]
    for algorithm in ("pdnr", "mu"):
        with pytest.raises(DecompositionError, match="exceed float64's range; scale the initial factors down"):
            tfo.cp_apr(store, 2, algorithm=algorithm, init=init, max_iters=2)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
