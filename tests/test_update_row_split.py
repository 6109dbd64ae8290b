"""The update's product split into row blocks over threads: one GEMM's result to rounding, the
same bits on any thread count, only the given rows written."""

import numpy as np
import pytest

from tensorflow_ooc.kernels.update import row_split
from tensorflow_ooc.kernels.update.row_split import matmul_rows


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_split_product_is_the_same_on_any_thread_count(rng, monkeypatch, dtype):
    monkeypatch.setattr(row_split, "SPLIT_MIN_MADDS", 0)  # small inputs split too
    monkeypatch.setattr(row_split, "BLOCK_ROWS", int(rng.integers(5, 200)))
    n, r = int(rng.integers(7, 3000)), int(rng.choice([3, 8, 16, 33, 100]))
    M = rng.standard_normal((n, r)).astype(dtype)
    W = rng.standard_normal((r, r)).astype(dtype)
    want = np.matmul(M, W)
    results = []
    for threads in (1, 2, 3, 5):
        stack = np.full((n + 5, r), np.nan, dtype=dtype)  # rows of a larger array, as factor views are
        matmul_rows(M, W, stack[2 : 2 + n], threads=threads)
        assert np.isnan(stack[:2]).all() and np.isnan(stack[2 + n :]).all()  # nothing outside the rows
        results.append(stack[2 : 2 + n])
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(results[0], want, rtol=tol, atol=tol * np.abs(want).max())
    for got in results[1:]:
        assert np.array_equal(got, results[0])


def test_small_products_stay_on_the_calling_thread(rng, monkeypatch):
    calls = []
    monkeypatch.setattr(row_split, "_pool", lambda workers: calls.append(workers))
    M, W = rng.standard_normal((3000, 8)), rng.standard_normal((8, 8))
    assert np.array_equal(matmul_rows(M, W, np.empty((3000, 8)), threads=2), M @ W)
    assert calls == []  # 192,000 multiply-adds: below the bar, one GEMM, no handoff


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_split_gram_is_the_same_on_any_thread_count(rng, monkeypatch, dtype):
    """The Gram in row blocks: A^T A to rounding, symmetric, the same bits on 1-5 threads, and
    the state's own Gram (a resumed run's) is formed the same way."""
    from tensorflow_ooc.decompositions.cp.updates import CPState

    monkeypatch.setattr(row_split, "SPLIT_MIN_MADDS", 0)
    monkeypatch.setattr(row_split, "BLOCK_ROWS", int(rng.integers(5, 200)))
    n, r = int(rng.integers(7, 3000)), int(rng.choice([3, 8, 16, 33, 100]))
    A = rng.standard_normal((n, r)).astype(dtype)
    results = [row_split.gram_rows(A, threads=t) for t in (1, 2, 3, 5)]
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(results[0], A.T @ A, rtol=tol, atol=tol * n)
    for got in results[1:]:
        assert np.array_equal(got, results[0])
    state = CPState((n, 4), r, dtype, np.concatenate([A, np.ones((4, r), dtype)]))
    assert np.array_equal(state.grams[0], results[0])
