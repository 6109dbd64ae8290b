"""Nonnegative CP-ALS (``cp_als(..., nonnegative=True, reg=...)``): HALS mode updates against
TensorLy's ``hals_nnls`` and ``non_negative_parafac_hals``, the exact fit, regularization,
argument checks, the CLI flags and the workflow fields."""

import subprocess
import sys

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.decompositions.cp import updates as U
from tensorflow_ooc.execution.partials import Partial
from tensorflow_ooc.kernels.update.hals import HALS_BLOCK_ROWS, hals_rows
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.fingerprint import step_fingerprint


@pytest.fixture
def seeded():
    """(seed, generator): fresh inputs every run, the seed named in assertion messages."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    return seed, np.random.default_rng(seed)


def nonnegative_model(rng, shape, R, noise=0.05):
    """A dense nonnegative rank-R CP tensor plus nonnegative noise, and other random initial factors."""
    F = [rng.random((s, R)) for s in shape]
    X = full(np.ones(R), F)
    X += noise * X.mean() * rng.random(shape)
    return X, [rng.random((s, R)) for s in shape]


def full(weights, factors):
    N = len(factors)
    letters = "".join(chr(105 + n) for n in range(N))
    return np.einsum("r," + ",".join(f"{c}r" for c in letters) + "->" + letters, weights, *factors)


def test_hals_sweeps_equal_tensorly_hals_nnls(seeded):
    from tensorly.solvers.nnls import hals_nnls

    seed, rng = seeded
    # more rows than one block (the parallel kernel); the split below also runs the serial one
    I, R = int(rng.integers(HALS_BLOCK_ROWS + 100, 3 * HALS_BLOCK_ROWS)), int(rng.integers(2, 7))
    B = rng.random((40, R))
    V = B.T @ B
    M = rng.standard_normal((I, R)) + 1.0  # some entries of the solution are clipped at 0
    A0 = rng.random((I, R))
    for reg in (0.0, float(rng.uniform(0.1, 2.0))):
        ours = hals_rows(A0.copy(), M, V, reg, U.HALS_SWEEPS)
        # TensorLy solves V^T-major (R, I); tol=0: exactly HALS_SWEEPS sweeps; ridge_coefficient is reg/2
        ref = hals_nnls(
            M.T.copy(), V, A0.T.copy(), n_iter_max=U.HALS_SWEEPS, tol=0, ridge_coefficient=reg / 2 if reg else None
        ).T
        assert np.abs(ours - ref).max() < 1e-12, f"seed={seed} reg={reg}"
        assert (ours >= 0).all() and (ours == 0).any(), f"seed={seed}"
        # the array-API twin (device states) gives the same, and rows are independent: any split
        twin = U.hals_columns(A0.copy(), M, V, reg, U.HALS_SWEEPS)
        assert np.abs(twin - ours).max() < 1e-12, f"seed={seed}"
        cut = int(rng.integers(1, HALS_BLOCK_ROWS))
        split = A0.copy()
        hals_rows(split[:cut], M[:cut], V, reg, U.HALS_SWEEPS)
        hals_rows(split[cut:], M[cut:], V, reg, U.HALS_SWEEPS)
        assert np.array_equal(split, ours), f"seed={seed}"
    nan = M.copy()
    nan[0, 0] = np.nan
    assert np.isnan(hals_rows(A0.copy(), nan, V, 0.0, 1)[0]).any(), f"seed={seed}: NaN must not be clipped away"


def test_in_place_update_equals_the_copying_one(seeded):
    seed, rng = seeded
    shape, R = (13, 9, 11), 3
    state = U.stack([rng.random((s, R)) for s in shape], "float64", weights=rng.uniform(0.5, 2, R))
    # two disjoint slices of the mode-0 MTTKRP, with rows between and after them left out (zero)
    parts = [Partial(0, rng.random((4, R))), Partial(6, rng.random((5, R)))]
    nn = U.NonNegative(reg=0.3)
    a = U.update_mode(state, parts, 0, False, False, in_place=False, nonneg=nn)
    b = U.update_mode(state, parts, 0, False, False, in_place=True, nonneg=nn)
    assert np.allclose(a.views[0], b.views[0], rtol=1e-13, atol=1e-15), f"seed={seed}"
    assert np.allclose(a.weights, b.weights, rtol=1e-13), f"seed={seed}"
    assert (b.views[0][4:6] == 0).all() and (b.views[0][11:] == 0).all(), f"seed={seed}"


def test_a_zero_component_keeps_its_other_columns(seeded):
    # mode 0's column 1 went to zero (its weight is 0): mode 1's V[1, 1] is 0, so HALS keeps mode
    # 1's column 1 as it was, as TensorLy does, for mode 0 to bring the component back later
    seed, rng = seeded
    shape, R = (6, 7, 5), 2
    factors = [rng.random((s, R)) for s in shape]
    factors[0][:, 1] = 0
    state = U.stack(factors, "float64", weights=np.array([float(rng.uniform(1, 3)), 0.0]))
    M = Partial(0, rng.random((shape[1], R)))
    out = U.update_mode(state, [M], 1, False, False, nonneg=U.NonNegative())
    kept = factors[1][:, 1] / max(1.0, factors[1][:, 1].max())
    assert np.allclose(out.views[1][:, 1], kept, rtol=1e-14), f"seed={seed}"
    assert (out.views[1] >= 0).all() and out.weights[1] > 0, f"seed={seed}"


@pytest.mark.parametrize("order", [3, 4, 5])
def test_matches_tensorly_from_the_same_init(tmp_path, seeded, order):
    import tensorly as tl
    from tensorly.cp_tensor import CPTensor
    from tensorly.decomposition import non_negative_parafac_hals

    seed, rng = seeded
    shape = {3: (8, 9, 10), 4: (6, 5, 7, 4), 5: (4, 5, 3, 4, 5)}[order]
    R = int(rng.integers(2, 4))
    X, init = nonnegative_model(rng, shape, R)
    coords = np.argwhere(np.ones(shape, dtype=bool))
    store = tfo.convert((coords, X[tuple(coords.T)]), tmp_path / "x.zarr", shape=shape)
    iters, tol = 25, 1e-8
    ref, errors = non_negative_parafac_hals(
        tl.tensor(X),
        R,
        n_iter_max=iters,
        tol=tol,
        init=CPTensor((np.ones(R), [a.copy() for a in init])),
        return_errors=True,
    )
    ref_fit = 1 - float(errors[-1])
    normX = np.linalg.norm(X)
    runs = {
        "store": tfo.cp_als(store, R, init=init, max_iters=iters, tol=tol, nonnegative=True),
        # a dense NumPy array, in 3 partitions: partial MTTKRPs reduced, then one update task
        "dense": tfo.cp_als(X, R, init=init, max_iters=iters, tol=tol, nonnegative=True, partitions=3),
    }
    for kind, r in runs.items():
        where = f"seed={seed} order={order} R={R} {kind}"
        assert all((f >= 0).all() for f in r.factors) and (r.weights >= 0).all(), where
        assert abs(r.fit - ref_fit) < 1e-3, f"{where}: fit {r.fit} vs TensorLy {ref_fit}"
        # the inner-product identity's fit is the fit of the model returned
        explicit = 1 - np.linalg.norm(X - full(r.weights, r.factors)) / normX
        assert abs(r.fit - explicit) < 1e-8, f"{where}: {r.fit} vs {explicit}"
        assert r.params["nonnegative"] is True and r.params["reg"] == 0.0, where
    assert abs(runs["store"].fit - runs["dense"].fit) < 1e-8, f"seed={seed}"


@pytest.mark.parametrize("order", [3, 4, 5])
def test_store_and_dense_give_the_same_factors(tmp_path, seeded, order):
    # every entry of a dense array, stored sparse: the store's in-memory plan updates in place and,
    # with two kernel threads (conftest), lent the target's rows, the rows HALS starts from, to the
    # MTTKRP as a per-thread output (a fit of 0.80 against 0.87 after one iteration at 100^3, R 16);
    # these sizes at rank 8 take that kernel path
    seed, rng = seeded
    low, high = {3: (60, 67), 4: (20, 23), 5: (12, 14)}[order]
    shape = tuple(int(s) for s in rng.integers(low, high, order))
    R = 8
    X, init = nonnegative_model(rng, shape, R, noise=0.2)
    coords = np.argwhere(np.ones(shape, dtype=bool))
    store = tfo.convert((coords, X[tuple(coords.T)]), tmp_path / "x.zarr", shape=shape)
    kw = dict(init=init, max_iters=4, tol=0, nonnegative=True, dtype="float64")
    a, b = tfo.cp_als(store, R, **kw), tfo.cp_als(X, R, **kw)
    where = f"seed={seed} shape={shape} R={R}"
    assert a.params["in_place_updates"] is True, where  # the plan the lending came with
    assert np.allclose(a.weights, b.weights, rtol=1e-10), where
    for n, (fa, fb) in enumerate(zip(a.factors, b.factors)):
        assert np.abs(fa - fb).max() < 1e-10, f"{where} mode {n}: {np.abs(fa - fb).max():.2e}"
    assert [h["fit"] for h in a.history] == pytest.approx([h["fit"] for h in b.history], abs=1e-12), where


def test_reg_shrinks_the_model(tmp_path, seeded):
    seed, rng = seeded
    shape, R = (9, 8, 7), 3
    X, init = nonnegative_model(rng, shape, R)
    coords = np.argwhere(np.ones(shape, dtype=bool))
    store = tfo.convert((coords, X[tuple(coords.T)]), tmp_path / "x.zarr", shape=shape)
    norms = []
    for reg in (0.0, float(rng.uniform(1.0, 10.0))):
        r = tfo.cp_als(store, R, init=init, max_iters=15, tol=0, nonnegative=True, reg=reg)
        assert all((f >= 0).all() for f in r.factors) and r.params["reg"] == reg, f"seed={seed}"
        explicit = 1 - np.linalg.norm(X - full(r.weights, r.factors)) / np.linalg.norm(X)
        assert abs(r.fit - explicit) < 1e-8, f"seed={seed} reg={reg}"
        norms.append(np.linalg.norm(full(r.weights, r.factors)))
    assert norms[1] < norms[0], f"seed={seed}: model norms {norms}"


def test_resume_continues_the_same_run(tmp_path, seeded):
    # the HALS warm start reads the checkpoint's factors and weights: a resumed run is the uninterrupted one
    seed, rng = seeded
    X, init = nonnegative_model(rng, (7, 6, 5), 2)
    reg = float(rng.uniform(0, 1))
    ck = tmp_path / "ck.npz"
    whole = tfo.cp_als(X, 2, init=init, max_iters=6, tol=0, nonnegative=True, reg=reg)
    tfo.cp_als(X, 2, init=init, max_iters=3, tol=0, nonnegative=True, reg=reg, checkpoint=ck)
    resumed = tfo.cp_als(X, 2, init=init, max_iters=6, tol=0, nonnegative=True, reg=reg, checkpoint=ck, resume=True)
    assert resumed.params["resumed_after"] == 3 and abs(resumed.fit - whole.fit) < 1e-12, f"seed={seed}"


def test_bad_arguments(tmp_path, seeded):
    seed, rng = seeded
    X, init = nonnegative_model(rng, (5, 6, 7), 2)
    coords = np.argwhere(np.ones(X.shape, dtype=bool))
    store = tfo.convert((coords, X[tuple(coords.T)]), tmp_path / "x.zarr", shape=X.shape)
    with pytest.raises(ValueError, match="reg must be a finite number >= 0"):
        tfo.cp_als(store, 2, nonnegative=True, reg=-0.5)
    with pytest.raises(ValueError, match="reg must be"):
        tfo.cp_als(store, 2, nonnegative=True, reg=float("nan"))
    with pytest.raises(ValueError, match="pass nonnegative=True"):
        tfo.cp_als(store, 2, reg=0.5)
    with pytest.raises(ValueError, match="nonnegative must be True or False"):
        tfo.cp_als(store, 2, nonnegative="yes")
    with pytest.raises(ValueError, match="takes method='exact', not 'sts'"):
        tfo.cp_als(store, 2, nonnegative=True, method="sts", samples=64)
    with pytest.raises(ValueError, match="not owner-computes"):
        tfo.cp_als(store, 2, nonnegative=True, distribution="owner")
    bad = [a.copy() for a in init]
    bad[1][0, 0] = -1.0
    with pytest.raises(ValueError, match="factor matrix 1 holds negative entries"):
        tfo.cp_als(store, 2, init=bad, nonnegative=True)
    # a checkpoint of an unconstrained run is not resumed as a nonnegative one
    ck = tmp_path / "ck.npz"
    tfo.cp_als(store, 2, init=init, max_iters=2, checkpoint=ck)
    with pytest.raises(ValueError, match="nonnegative=False, not True"):
        tfo.cp_als(store, 2, init=init, max_iters=4, checkpoint=ck, resume=True, nonnegative=True)


def test_cli_flags(tmp_path, seeded, capsys):
    seed, rng = seeded
    X, _ = nonnegative_model(rng, (6, 7, 8), 2)
    coords = np.argwhere(np.ones(X.shape, dtype=bool))
    tfo.convert((coords, X[tuple(coords.T)]), tmp_path / "x.zarr", shape=X.shape)
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", "-q", "cpd", str(tmp_path / "x.zarr"), "--rank", "2"]
        + ["--max-iters", "8", "--nonnegative", "--reg", "0.1", "--out", str(tmp_path / "r.zarr")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "nonnegative (HALS, reg 0.1)" in r.stdout
    result = tfo.load_result(tmp_path / "r.zarr")
    assert all((f >= 0).all() for f in result.factors), f"seed={seed}"
    assert result.params["nonnegative"] is True and result.params["reg"] == 0.1
    # in this process: the help text, and a bad value refused as a usage error
    with pytest.raises(SystemExit):
        main(["cpd", "--help"])
    text = capsys.readouterr().out
    assert "--nonnegative" in text and "HALS" in text and "--reg REG" in text and "ridge" in text
    with pytest.raises(SystemExit) as exc:
        main(["cpd", str(tmp_path / "x.zarr"), "--rank", "2", "--reg", "-1"])
    assert exc.value.code == 2 and "must be a finite number >= 0" in capsys.readouterr().err
    assert main(["-q", "cpd", str(tmp_path / "x.zarr"), "--rank", "2", "--reg", "1"]) == 2
    assert "pass --nonnegative" in capsys.readouterr().err


SPEC = """\
steps:
  c: {kind: convert, input: t.tns, out: t.zarr}
  d: {kind: decompose, input: t.zarr, out: r.zarr, rank: 2}
"""


def test_workflow_fields(tmp_path):
    (tmp_path / "t.tns").write_text("1 1 1 1.0\n2 2 2 2.0\n")

    def fp(text):
        wf = load_spec(text=text, storage=str(tmp_path))
        return step_fingerprint("decompose", wf.step("d").config(), {})

    # the pinned fingerprint of the plain step (tests/test_workflow_methods.py)
    plain = "f5f81661e4b0dc95c609b2d0fead3e69c835ab30d35ff71af2d774c9b6fbafc8"
    assert fp(SPEC) == plain
    assert fp(SPEC.replace("rank: 2}", "rank: 2, nonnegative: false, reg: 0}")) == plain
    nn = fp(SPEC.replace("rank: 2}", "rank: 2, nonnegative: true}"))
    ridge = fp(SPEC.replace("rank: 2}", "rank: 2, nonnegative: true, reg: 0.5}"))
    assert len({plain, nn, ridge}) == 3
    step = load_spec(text=SPEC.replace("rank: 2}", "rank: 2, nonnegative: true, reg: 0.5}"), storage=str(tmp_path))
    assert step.step("d").model.nonnegative is True and step.step("d").model.reg == 0.5
    for bad, says in [
        ("rank: 2, reg: 0.5}", "set nonnegative: true"),
        ("rank: 2, nonnegative: true, method: sts}", "takes method: cp"),
        ("rank: 2, nonnegative: true, reg: -1}", "greater than or equal to 0"),
    ]:
        with pytest.raises(SpecError) as info:
            load_spec(text=SPEC.replace("rank: 2}", bad), storage=str(tmp_path))
        assert says in str(info.value), (bad, str(info.value))


def test_workflow_runs_a_nonnegative_step_from_an_unconstrained_warm_start(tmp_path, seeded):
    from tensorflow_ooc.workflow.runner import execute

    seed, rng = seeded
    X, _ = nonnegative_model(rng, (5, 6, 4), 2)
    coords = np.argwhere(np.ones(X.shape, dtype=bool))
    tfo.convert((coords, X[tuple(coords.T)]), tmp_path / "t.zarr", shape=X.shape)
    # an unconstrained result whose first component has two negative factors (the same model),
    # then a nonnegative step warm-started from it
    prev = tfo.cp_als(tmp_path / "t.zarr", 2, seed=int(rng.integers(1 << 30)), max_iters=2)
    prev.factors[0][:, 0] *= -1
    prev.factors[1][:, 0] *= -1
    prev.save(tmp_path / "r.zarr")
    text = "steps:\n  d: {kind: decompose, input: t.zarr, out: r.zarr, rank: 2, init: previous, max_iters: 5, "
    text += "nonnegative: true, reg: 0.01}\n"
    run = execute(load_spec(text=text, storage=str(tmp_path)))
    assert run.exit_code == 0, run.record.error
    metrics = run.record.steps["d"].metrics
    assert metrics["nonnegative"] is True and metrics["reg"] == 0.01, f"seed={seed}"
    result = tfo.load_result(tmp_path / "r.zarr")
    assert all((f >= 0).all() for f in result.factors) and result.params["nonnegative"] is True, f"seed={seed}"
