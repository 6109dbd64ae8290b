"""Restarting a lost FastTucker component from the training residual: the rank-1 kernels
against NumPy, the restart recovering a removed component of a planted model (in this process
and over several partitions on a Dask cluster), and when it does nothing."""

import numpy as np
import pytest
from conftest import random_coo

from tensorflow_ooc import synthetic
from tensorflow_ooc.execution import completion as T
from tensorflow_ooc.execution import component_revival as R
from tensorflow_ooc.execution.inline import InlineClient
from tensorflow_ooc.kernels.completion import fasttucker_cpu as K
from tensorflow_ooc.kernels.completion.rank1_residual import rank1_row_sums, rank1_sse


@pytest.mark.parametrize("N", [3, 4, 5, 6])
def test_rank1_row_sums_and_sse_match_numpy(rng, N):
    shape = tuple(int(x) for x in rng.integers(3, 9, size=N))
    coords, _ = random_coo(rng, shape, 200)
    coords = coords.astype(np.int64)
    resid = rng.standard_normal(coords.shape[0])
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]]).astype(np.int64)
    S = 3
    cols = rng.standard_normal((sum(shape), S))
    parts = [cols[offsets[n] : offsets[n] + shape[n]][coords[:, n]] for n in range(N)]  # (n, S) each
    for mode in range(N):
        num, den = np.zeros((shape[mode], S)), np.zeros((shape[mode], S))
        rank1_row_sums(coords, resid, cols, offsets, mode, num, den)
        q = np.prod([parts[m] for m in range(N) if m != mode], axis=0)
        ref_num, ref_den = np.zeros((shape[mode], S)), np.zeros((shape[mode], S))
        np.add.at(ref_num, coords[:, mode], resid[:, None] * q)
        np.add.at(ref_den, coords[:, mode], q * q)
        np.testing.assert_allclose(num, ref_num, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(den, ref_den, rtol=1e-12, atol=1e-12)
    before, after = rank1_sse(coords, resid, cols, offsets)
    assert before == pytest.approx((resid**2).sum(), rel=1e-12)
    np.testing.assert_allclose(after, ((resid[:, None] - np.prod(parts, axis=0)) ** 2).sum(axis=0), rtol=1e-12)


def planted_state(p, ranks, R_):
    """The planted model as a FastTuckerState (stacked factors, zero padding past each rank)."""
    shape = tuple(int(f.shape[0]) for f in p.factors)
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]]).astype(np.int64)
    J = max(ranks)
    A = np.zeros((sum(shape), J))
    B = np.zeros((len(shape), J, R_))
    for n, (f, b) in enumerate(zip(p.factors, p.core_factors)):
        A[offsets[n] : offsets[n] + shape[n], : f.shape[1]] = f
        B[n, : b.shape[0]] = b
    return T.FastTuckerState(A, B, offsets, shape, tuple(ranks)), offsets, shape


def partitions(p, k):
    """The planted entries as k ObservedPartitions (no test entries)."""
    out = []
    for i, idx in enumerate(np.array_split(np.arange(p.coords.shape[0]), k)):
        c = np.ascontiguousarray(p.coords[idx], np.int64)
        out.append(
            T.ObservedPartition(
                i,
                c,
                np.ascontiguousarray(p.clean[idx]),
                T._stacked_rows(c, np.zeros(1)),
                np.zeros((0, c.shape[1]), np.int64),
                np.zeros(0),
            )
        )
    return out


@pytest.mark.parametrize("N,J", [(3, 4), (4, 4), (5, 3), (3, 6)])
def test_a_removed_component_is_found_and_refitted_from_the_residual(rng, N, J):
    """Remove one component of a noise-free planted model (J_n >= R, so C^(n) is free): the
    restart finds it as the lost one and puts back a rank-1 term that explains the residual, the
    other components untouched."""
    shape = tuple(int(x) for x in rng.integers(8, 13, size=N))
    R_ = 4
    p = synthetic.planted_fasttucker(shape, J, R_, int(0.3 * np.prod(shape)), noise=0.0, seed=int(rng.integers(2**31)))
    state, offsets, shape = planted_state(p, [J] * N, R_)
    lost = int(rng.integers(R_))
    B = state.B.copy()
    B[:, :, lost] *= 1e-4  # a component SGD has lost: each mode's column 1e-4 of its size
    broken = T.FastTuckerState(state.A, B, offsets, shape, state.ranks)
    strengths = R.component_strengths(broken)
    assert R.weakest_lost_component(strengths) == lost
    assert R.weakest_lost_component(np.array([1.0, 0.5, 0.2, 0.06])) is None  # above 5 % of the median
    assert R.weakest_lost_component(np.array([1.0, 0.5, 0.2, 0.01])) == 3
    c = InlineClient()
    sources = [c.submit(lambda x: x, part) for part in partitions(p, 3)]
    new, gain = R.revive_component(
        c,
        sources,
        c.submit(lambda x: x, broken),
        lost,
        shape,
        offsets,
        seed=int(rng.integers(2**31)),
        rebalance=True,
        split=2,
    )
    new = new.result()
    pred = K.predict_entries(np.ascontiguousarray(p.coords, np.int64), offsets, new.A, new.B)
    before = K.predict_entries(np.ascontiguousarray(p.coords, np.int64), offsets, broken.A, broken.B)
    resid_before = np.linalg.norm(p.clean - before)
    assert gain > 0.95
    assert np.linalg.norm(p.clean - pred) < 0.25 * resid_before
    # the other components are as they were (up to the gauge: compare C^(n) columns' products);
    # the gauge rebalance moves them by rounding only, which reached 1.6e-8 in the cosine at
    # N = 5, J = 3 (rng seed 1407541898), so 1e-7: a changed component is off by far more
    keep = [r for r in range(R_) if r != lost]
    for n in range(N):
        C_old = broken.factor(n) @ broken.core_factor(n)
        C_new = new.factor(n) @ new.core_factor(n)
        for r in keep:
            cos = abs(C_old[:, r] @ C_new[:, r]) / np.linalg.norm(C_old[:, r]) / np.linalg.norm(C_new[:, r])
            assert cos > 1 - 1e-7


def test_the_restart_keeps_the_state_when_the_residual_is_noise(rng):
    """A model that is right up to noise: the best rank-1 fit of the residual takes away about
    what its sum I_n parameters take from noise, below the bar, and the state comes back
    unchanged."""
    shape = (20, 18, 16)
    p = synthetic.planted_fasttucker(shape, 3, 3, 4000, noise=0.0, seed=int(rng.integers(2**31)))
    state, offsets, shape = planted_state(p, [3, 3, 3], 3)
    parts = partitions(p, 2)
    for part in parts:
        part.values[:] = part.values + 0.05 * rng.standard_normal(part.values.shape[0])
    c = InlineClient()
    sources = [c.submit(lambda x: x, part) for part in parts]
    old = c.submit(lambda x: x, state)
    new, gain = R.revive_component(c, sources, old, 0, shape, offsets, seed=1, rebalance=True, split=2)
    assert new is old and 0 <= gain < R.NOISE_GAIN_FACTOR * sum(shape) / 4000


def test_restart_over_partitions_on_a_dask_cluster(rng):
    shape = (16, 14, 12)
    p = synthetic.planted_fasttucker(shape, 3, 3, 1500, noise=0.0, seed=int(rng.integers(2**31)))
    state, offsets, shape = planted_state(p, [3, 3, 3], 3)
    B = state.B.copy()
    B[:, :, 1] = 0.0
    broken = T.FastTuckerState(state.A, B, offsets, shape, state.ranks)
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cl,
        Client(cl) as client,
    ):
        sources = client.scatter(partitions(p, 5))
        new, gain = R.revive_component(
            client, sources, client.scatter(broken), 1, shape, offsets, seed=3, rebalance=True, split=2
        )
        new = new.result()
    pred = K.predict_entries(np.ascontiguousarray(p.coords, np.int64), offsets, new.A, new.B)
    before = K.predict_entries(np.ascontiguousarray(p.coords, np.int64), offsets, broken.A, broken.B)
    assert gain > 0.95
    assert np.linalg.norm(p.clean - pred) < 0.25 * np.linalg.norm(p.clean - before)
