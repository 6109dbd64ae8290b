"""The TT-ALS contraction kernels generated for a train's ranks (unrolled and looped) give the
run-time-rank kernel's bits, in every mode checked, at orders 3 to 6, on items decoded in memory
and on streamed (Delta-encoded) chunks, through the partition task; and the einsum reference
agrees with both."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.partitions import plan_partitions
from tensorflow_ooc.execution.tasks import load_partition
from tensorflow_ooc.execution.tt_tasks import contraction_partition, residual_partition
from tensorflow_ooc.kernels.tt import TTCores, specialized
from tensorflow_ooc.kernels.tt import cpu as tt_cpu


def _tensor(tmp_path, rng, order):
    shape = tuple(int(s) for s in rng.integers(3, 7, size=order))
    cells = np.argwhere(np.ones(shape, dtype=bool))
    keep = rng.random(len(cells)) < min(0.5, 600 / len(cells))
    coords = cells[keep]
    values = rng.standard_normal(len(coords))
    store = tfo.convert((coords, values), tmp_path / f"t{order}.zarr", shape=shape, chunk_nnz=64, max_block_nnz=100)
    return store, shape, coords, values


def _ranks(rng, shape, rmax):
    """R_0 .. R_N with each R_k in 1..rmax and at most both unfoldings' sizes."""
    N = len(shape)
    inner = [
        int(rng.integers(1, 1 + min(rmax, math.prod(shape[: k + 1]), math.prod(shape[k + 1 :])))) for k in range(N - 1)
    ]
    return [1] + inner + [1]


def _dense_Y(coords, values, shape, cores, j):
    """Y_j as (I_j, R_{j-1} R_j), summed nonzero by nonzero in NumPy."""
    out = np.zeros((shape[j], cores[j].shape[0] * cores[j].shape[2]))
    for c, x in zip(coords, values):
        left = np.ones((1, 1))
        for m in range(j):
            left = left @ cores[m][:, c[m], :]
        right = np.ones((1, 1))
        for m in range(len(shape) - 1, j, -1):
            right = cores[m][:, c[m], :] @ right
        out[c[j]] += x * np.outer(left[0], right[:, 0]).ravel()
    return out


def _both(monkeypatch, source, tt, j):
    """Partition task rows from the run-time kernel and from the generated one."""
    monkeypatch.setattr(tt_cpu, "SPECIALIZE_MIN_NNZ", 1 << 62)
    ref = contraction_partition(source, tt, j, threads=2)
    monkeypatch.setattr(tt_cpu, "SPECIALIZE_MIN_NNZ", 0)
    got = contraction_partition(source, tt, j, threads=2)
    assert got.lo == ref.lo
    return ref.lo, ref.rows, got.rows


@pytest.mark.parametrize("order", [3, 4, 5, 6])
def test_unrolled_kernels_give_the_run_time_kernels_bits(tmp_path, rng, monkeypatch, order):
    store, shape, coords, values = _tensor(tmp_path, rng, order)
    ranks = _ranks(rng, shape, 4)
    cores = [rng.standard_normal((ranks[k], shape[k], ranks[k + 1])) for k in range(order)]
    tt = TTCores.of(cores)
    whole = plan_partitions(store, 1)[0]
    # every mode at order 3; above, an end core and an inner one (each ranks, core and encoding
    # is a compile of about a second); streamed chunks for the first of them
    ends = [0, order - 1]
    modes = list(range(order)) if order == 3 else [ends[int(rng.integers(2))], int(rng.integers(1, order - 1))]
    for j in modes:
        assert specialized.chain_terms(tuple(ranks), j) <= specialized.UNROLL_MAX_TERMS
        want = _dense_Y(coords, values, shape, cores, j)
        sources = [load_partition(store.path, whole)] + ([(store.path, whole)] if j == modes[0] else [])
        for source in sources:
            lo, ref, got = _both(monkeypatch, source, tt, j)
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_allclose(got, want[lo : lo + got.shape[0]], rtol=1e-12, atol=1e-12)
    built = {(k[1], k[2], k[3]) for k in specialized.kernel_variants() if k[0] == tuple(ranks)}
    assert {(j, False, True) for j in modes} | {(modes[0], True, True)} <= built


@pytest.mark.parametrize("order", [3, 5])
def test_looped_kernels_give_the_run_time_kernels_bits(tmp_path, rng, monkeypatch, order):
    monkeypatch.setattr(specialized, "UNROLL_MAX_TERMS", 0)
    store, shape, coords, values = _tensor(tmp_path, rng, order)
    ranks = _ranks(rng, shape, 5)
    cores = [rng.standard_normal((ranks[k], shape[k], ranks[k + 1])) for k in range(order)]
    tt = TTCores.of(cores)
    whole = plan_partitions(store, 1)[0]
    modes = [0, 1, 2] if order == 3 else [int(rng.integers(1, order - 1))]
    for j in modes:
        want = _dense_Y(coords, values, shape, cores, j)
        sources = [load_partition(store.path, whole)] + ([(store.path, whole)] if j == modes[0] else [])
        for source in sources:
            lo, ref, got = _both(monkeypatch, source, tt, j)
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_allclose(got, want[lo : lo + got.shape[0]], rtol=1e-12, atol=1e-12)
    assert any(k[0] == tuple(ranks) and not k[3] for k in specialized.kernel_variants())


def test_right_slices_transpose_only_the_cores_right_of_the_mode(rng):
    shape, ranks = (3, 4, 5, 2), [1, 2, 3, 2, 1]
    tt = TTCores.of([rng.standard_normal((ranks[k], shape[k], ranks[k + 1])) for k in range(4)])
    t = specialized.right_slices(tt, 0)
    for k in range(4):
        block = t[tt.offsets[k] : tt.offsets[k + 1]]
        want = tt.slices[k].transpose(0, 2, 1) if k in (1, 2) else tt.slices[k]
        np.testing.assert_array_equal(block, np.ascontiguousarray(want).ravel())
    assert not np.shares_memory(t, tt.data)


def test_generated_residual_kernels_give_the_run_time_kernels_bits(tmp_path, rng, monkeypatch):
    """The whole chain at the nonzeros (the fit's residual pass), unrolled (in memory and
    streamed) and looped, against the run-time kernel bit for bit and against NumPy, at an order
    drawn from 3-6."""
    order = int(rng.integers(3, 7))
    store, shape, coords, values = _tensor(tmp_path, rng, order)
    ranks = _ranks(rng, shape, 4)
    cores = [rng.standard_normal((ranks[k], shape[k], ranks[k + 1])) for k in range(order)]
    tt = TTCores.of(cores)
    model = np.array([np.linalg.multi_dot([cores[m][:, c[m], :] for m in range(order)])[0, 0] for c in coords])
    want = (np.sum((values - model) ** 2), np.sum(model**2))
    whole = plan_partitions(store, 1)[0]
    for unroll in (specialized.UNROLL_MAX_TERMS, 0):
        monkeypatch.setattr(specialized, "UNROLL_MAX_TERMS", unroll)
        streamed = [(store.path, whole)] if unroll else []
        for source in [load_partition(store.path, whole)] + streamed:
            monkeypatch.setattr(tt_cpu, "SPECIALIZE_MIN_NNZ", 1 << 62)
            ref = residual_partition(source, tt, threads=2)
            monkeypatch.setattr(tt_cpu, "SPECIALIZE_MIN_NNZ", 0)
            got = residual_partition(source, tt, threads=2)
            np.testing.assert_array_equal(got[:2], ref[:2])
            np.testing.assert_allclose(got[:2], want, rtol=1e-12)
    built = set(specialized.kernel_variants())
    assert {(tuple(ranks), "residual", d, True) for d in (False, True)} | {
        (tuple(ranks), "residual", False, False)
    } <= built
