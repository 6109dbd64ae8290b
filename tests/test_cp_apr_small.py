"""CP-APR MU's in-process path (each mode's inner iterations in one or two kernel calls): the mode
kernel against a dense NumPy reference at several share counts, block sizes and first-call lengths,
fixed and run-time ranks, 32- and 64-bit coordinates, on this thread and on a pool, never stopping,
stopping at the first inner iteration or later; whole runs against the general path
(per-inner-iteration passes) and against a dense NumPy reference of the multiplicative updates, at
orders 3-5; which runs take the path."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.kernels.apr.mu_mode import mode_runs, model_sums, mu_mode, narrow_coords
from tensorflow_ooc.kernels.factors import StackedFactors

LETTERS = "abcdef"


def dense_model(factors, weights):
    N = len(factors)
    spec = ",".join(f"{c}r" for c in LETTERS[:N]) + ",r->" + LETTERS[:N]
    return np.einsum(spec, *factors, weights)


def count_tensor(rng, shape, nnz):
    """Random counts at ``nnz`` distinct random cells, one row of the first two modes heavy and
    the last row of every mode empty (rows longer than a block, rows with no nonzero)."""
    cells = np.array(np.unravel_index(rng.choice(int(np.prod(shape)), nnz, replace=False), shape)).T
    heavy = rng.random(nnz) < 0.4
    cells[heavy, 0] = 1
    cells[heavy, 1] = 0
    for n, I in enumerate(shape):
        cells[:, n] = np.minimum(cells[:, n], I - 2)
    cells = np.unique(cells, axis=0)
    values = (1 + rng.geometric(0.5, len(cells))).astype(np.float64)
    X = np.zeros(shape)
    X[tuple(cells.T)] = values
    return X, cells, values


def unfold(X, n):
    return np.moveaxis(X, n, 0).reshape(X.shape[n], -1)


def flushed(a):
    """``a`` with its subnormal entries 0 (what a product is with subnormals flushed to zero)."""
    return np.where(np.abs(a) < np.finfo(np.float64).tiny, 0.0, a)


def khatri_rao(factors, n, flush=False):
    """Rows of prod_{j != n} A_j over the cells of X with mode n moved first (C order); ``flush``:
    each product's subnormal entries 0."""
    others = [f for j, f in enumerate(factors) if j != n]
    out = others[0]
    for f in others[1:]:
        out = (out[:, None, :] * f[None, :, :]).reshape(-1, f.shape[1])
        out = flushed(out) if flush else out
    return out


def dense_mode_iterations(X, factors, B, n, eps, tol, max_inner, trace=False, flush=False):
    """pyttb's inner loop of mode ``n`` on the dense tensor: Phi, KKT, stop or ``B <- B * Phi``
    (``trace``: the KKT violation of every inner iteration instead of the last; ``flush``: the
    Khatri-Rao products' subnormal entries 0)."""
    Pi = khatri_rao(factors, n, flush)
    Xn = unfold(X, n)
    inner, kkts = 0, []
    while True:
        inner += 1
        Phi = (Xn / np.maximum(B @ Pi.T, eps)) @ Pi
        kkts.append(float(np.max(np.abs(np.minimum(B, 1 - Phi)))))
        if kkts[-1] < tol:
            break
        B = B * Phi
        if inner == max_inner:
            break
    return B, Phi, kkts if trace else kkts[-1], inner


def dense_mu(X, init, outer, max_inner, tol, eps, kappa=0.01, kappa_tol=1e-10):
    """pyttb's ``cp_apr(algorithm="mu")`` on a dense tensor: weights, factors, log-likelihood and
    inner iterations per outer iteration."""
    A = [a.copy() for a in init]
    lam = np.ones(A[0].shape[1])
    for n in range(len(A)):  # normalize(normtype=1)
        s = A[n].sum(axis=0)
        A[n] = A[n] / s
        lam = lam * s
    phi = [None] * len(A)
    inners = []
    for it in range(outer):
        total = 0
        for n in range(len(A)):
            if it > 0:
                A[n] = A[n] + kappa * ((phi[n] > 0) & (A[n] < kappa_tol))
            B = A[n] * lam
            B, phi[n], _, inner = dense_mode_iterations(X, A, B, n, eps, tol, max_inner)
            total += inner
            lam = B.sum(axis=0)
            A[n] = B / lam
        inners.append(total)
    M = dense_model(A, lam)
    nz = X > 0
    return lam, A, float(np.sum(X[nz] * np.log(M[nz])) - M.sum()), inners


@pytest.mark.parametrize("order,fixed", [(3, True), (4, False), (5, True), (3, False)])
def test_mode_kernel_matches_dense_reference_at_every_share_and_block_size(rng, order, fixed):
    shape = tuple(int(s) for s in rng.integers(4, 8, order))
    X, coords, values = count_tensor(rng, shape, 4 * int(np.prod(shape)) // 10)
    # a rank whose kernel is unrolled, or one taken at run time
    R = int(rng.choice([4, 8, 16])) if fixed else int(rng.choice([3, 5, 7]))
    F = StackedFactors(shape, R)
    F.data[:] = rng.random(F.data.shape) + 0.05
    n = int(rng.integers(order))
    eps, max_inner = 1e-10, 6
    B0 = F.views[n].copy()
    # never stops, stops at the first inner iteration, stops after a few
    _, _, kkts, _ = dense_mode_iterations(X, F.views, B0, n, eps, 0.0, max_inner, trace=True)
    pool = ThreadPoolExecutor(3)
    for tol in (1e-300, kkts[0] * 1.001, kkts[2] * 1.001):
        B_ref, Phi_ref, kkt_ref, inner_ref = dense_mode_iterations(X, F.views, B0, n, eps, tol, max_inner)
        updates_ref = inner_ref if kkt_ref >= tol else inner_ref - 1
        # first: inner iterations of the first kernel call (1, fewer or more than the mode takes;
        # more are undone); 32-bit or 64-bit coordinates
        for shares, block, threads, first, narrow in [
            (1, 1, True, 1, False),
            (1, 10**9, False, max_inner, True),
            (2, 3, True, 2, False),
            (3, 1, False, 3, True),
            (5, 7, True, 4, True),
            (8, 2, True, 1, False),
        ]:
            m = mode_runs(narrow_coords(coords) if narrow else coords, n, values, shape[n], shares, block)
            assert m.coords.dtype == (np.int32 if narrow else coords.dtype)
            F.views[n][:] = B0
            S = m.share.shape[0] - 1
            pi = np.full((S, max(1, m.block_nnz), R), np.nan)
            before = np.full((shape[n] + 2, max_inner, R), np.nan)
            positive_at = np.ones((shape[n] + 2, max_inner, R), dtype=bool)
            positive = np.ones((shape[n], R), dtype=bool)
            scratch = (pi, before, positive_at, np.full((S + 1, max_inner), np.nan))
            args = (m, F.data, F.offsets, n, eps, tol, max_inner, *scratch, positive, pool if threads else None)
            kkt, inner, updates = mu_mode(*args, first)
            assert (inner, updates) == (inner_ref, updates_ref)
            assert kkt == pytest.approx(kkt_ref, rel=1e-12)
            np.testing.assert_array_equal(positive, Phi_ref > 0)
            np.testing.assert_allclose(F.views[n], B_ref, rtol=1e-12, atol=1e-300)
    # the log-likelihood's data term and <X, M>
    lam = rng.uniform(0.5, 2, R)
    ll, xm = model_sums(m.coords, m.values, F.data, F.offsets, lam, 3)
    assert model_sums(m.coords, m.values, F.data, F.offsets, lam, 3, pool) == (ll, xm)
    pool.shutdown()
    M = dense_model(F.views, lam)
    nz = X > 0
    assert ll == pytest.approx(float(np.sum(X[nz] * np.log(M[nz]))), rel=1e-12)
    assert xm == pytest.approx(float(np.sum(X * M)), rel=1e-12)


@pytest.mark.parametrize("order", [3, 4, 5])
def test_mode_kernel_flushes_subnormal_products_only(rng, order):
    """Factor entries of 1e-160 (as MU leaves them after many updates): products of two are
    subnormal, and the kernel (subnormals flushed to zero: x86 takes a microcode assist per
    subnormal operation) counts them as 0; everything else is the dense reference's."""
    shape = tuple(int(s) for s in rng.integers(4, 8, order))
    X, coords, values = count_tensor(rng, shape, 4 * int(np.prod(shape)) // 10)
    R = int(rng.choice([8, 16, 5]))
    F = StackedFactors(shape, R)
    F.data[:] = rng.random(F.data.shape) + 0.05
    tiny = rng.random(F.data.shape) < 0.3
    F.data[tiny] *= 1e-160
    n = int(rng.integers(order))
    # one component small enough on every other mode that its Khatri-Rao entries are all subnormal:
    # in IEEE arithmetic its Phi is positive (and tiny), flushed it is 0
    c = int(rng.integers(R))
    for j in range(order):
        if j != n:
            F.views[j][:, c] = 10.0 ** (-315 / (order - 1)) * rng.uniform(0.5, 1, shape[j])
    eps, max_inner, tol = 1e-10, 5, 1e-300
    B0 = F.views[n].copy()
    B_ref, Phi_ref, kkt_ref, inner_ref = dense_mode_iterations(X, F.views, B0, n, eps, tol, max_inner, flush=True)
    # the flush matters here: in IEEE arithmetic Phi is positive where it is 0 flushed
    exact = dense_mode_iterations(X, F.views, B0, n, eps, tol, max_inner)[1]
    assert np.all(exact[:-1, c] > 0) and not np.any(Phi_ref[:, c])  # the last row is empty
    with ThreadPoolExecutor(2) as pool:
        for shares, threads in [(1, False), (3, True)]:
            m = mode_runs(coords, n, values, shape[n], shares, 4)
            F.views[n][:] = B0
            S = m.share.shape[0] - 1
            scratch = (
                np.empty((S, max(1, m.block_nnz), R)),
                np.empty((shape[n], max_inner, R)),
                np.empty((shape[n], max_inner, R), dtype=bool),
                np.empty((S, max_inner)),
            )
            positive = np.empty((shape[n], R), dtype=bool)
            args = (m, F.data, F.offsets, n, eps, tol, max_inner, *scratch, positive, pool if threads else None)
            kkt, inner, updates = mu_mode(*args)
            assert (inner, updates) == (inner_ref, max_inner)
            assert kkt == pytest.approx(kkt_ref, rel=1e-12)
            np.testing.assert_array_equal(positive, Phi_ref > 0)
            np.testing.assert_allclose(F.views[n], B_ref, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("order", [3, 4, 5])
def test_small_path_equals_general_path_and_dense_reference(tmp_path, rng, order):
    shape = tuple(int(s) for s in rng.integers(4, 8, order))
    X, coords, values = count_tensor(rng, shape, int(np.prod(shape)) // 4)
    store = tfo.convert((coords, values), str(tmp_path / "s.zarr"), shape=shape, chunk_nnz=64)
    R = 3  # the general path's kernels compiled for rank 3 are cached by the other CP-APR tests
    init = [rng.random((I, R)) for I in shape]
    kw = dict(algorithm="mu", init=init, max_iters=4, max_inner_iters=7, tol=float(rng.choice([1e-300, 1e-3])))
    small = tfo.cp_apr(store, R, **kw)
    general = tfo.cp_apr(store, R, execution="streaming", partitions=2, **kw)
    assert small.params["inner_loop"] == "inline" and "inner_loop" not in general.params
    assert [h["inner_iterations"] for h in small.history] == [h["inner_iterations"] for h in general.history]
    for key in ("loglik", "kkt_violation", "fit"):
        assert [h[key] for h in small.history] == pytest.approx([h[key] for h in general.history], rel=1e-11)
    for a, b in zip(small.factors, general.factors):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    lam, A, ll, inners = dense_mu(X, init, 4, 7, kw["tol"], small.params["eps_div_zero"])
    assert [h["inner_iterations"] for h in small.history] == inners
    assert small.loglik == pytest.approx(ll, rel=1e-11)
    ref = tfo.PoissonResult.arranged(lam, A, 0, 0, 0, 0, [], {}, {})
    np.testing.assert_allclose(small.weights, ref.weights, rtol=1e-10)
    for a, b in zip(small.factors, ref.factors):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("order", [3, 4, 6])
def test_fixed_rank_runs_match_dense_reference_as_modes_stop_earlier(tmp_path, rng, order):
    """A fixed rank (the kernels written out for the order) over outer iterations in which modes
    take fewer inner iterations than the time before: each mode's first kernel call runs as many
    as it took last, and the iterations past its stop are undone."""
    shape = tuple(int(s) for s in rng.integers(3, 6, order))
    X, coords, values = count_tensor(rng, shape, max(8, int(np.prod(shape)) // 5))
    store = tfo.convert((coords, values), str(tmp_path / "s.zarr"), shape=shape, chunk_nnz=64)
    R = int(rng.choice([4, 8]))
    init = [rng.random((I, R)) for I in shape]
    eps = 1e-10
    # a tolerance at which the modes stop earlier in later outer iterations than in the first
    for tol in 10.0 ** -np.arange(0, 5, 0.5):
        lam, A, ll, inners = dense_mu(X, init, 8, 6, tol, eps)
        if inners[-1] < inners[0]:
            break
    assert inners[-1] < inners[0]
    kw = dict(algorithm="mu", init=init, max_iters=8, max_inner_iters=6, tol=float(tol), eps_div_zero=eps)
    res = tfo.cp_apr(store, R, **kw)
    assert res.params["inner_loop"] == "inline"
    took = [h["inner_iterations"] for h in res.history]
    assert took == inners[: len(took)]
    if len(took) == 8:
        assert res.loglik == pytest.approx(ll, rel=1e-11)
        ref = tfo.PoissonResult.arranged(lam, A, 0, 0, 0, 0, [], {}, {})
        for a, b in zip(res.factors, ref.factors):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)


def test_which_runs_take_the_in_process_path():
    from tensorflow_ooc.decompositions.apr.inline_mu import (
        INLINE_MU_FREE_FRACTION,
        SMALL_MU_BYTES,
        inline_mu_bytes,
        inline_mu_fits,
    )

    # every rank up to SMALL_MU_BYTES; above, fixed ranks while the memory free allows
    assert inline_mu_fits(SMALL_MU_BYTES, 3) and inline_mu_fits(SMALL_MU_BYTES, 8)
    assert not inline_mu_fits(SMALL_MU_BYTES + 1, 3)
    assert not inline_mu_fits(1 << 60, 8)
    free = psutil.virtual_memory().available
    if INLINE_MU_FREE_FRACTION * free > 2 * SMALL_MU_BYTES:
        assert inline_mu_fits(2 * SMALL_MU_BYTES, 8)
    # 32-bit coordinates: order 4, 3.3 M nonzeros keep about 0.45 GB (64-bit: 0.66 GB)
    keeps = inline_mu_bytes(3_309_490, (183, 24, 1140, 1717), 8, 10, 2)
    assert 0.4e9 < keeps < 0.5e9
    assert inline_mu_bytes(10, (2**31 + 5, 3, 3), 8, 10, 2) > inline_mu_bytes(10, (2**31 - 5, 3, 3), 8, 10, 2)
