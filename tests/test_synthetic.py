"""Synthetic generators: distinct coordinates, bounds, seeding, heavy tails, planted models, exact .tns."""

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic


@pytest.mark.parametrize("shape", [(50, 40, 30), (183, 24, 1140, 1717), (2**31, 2**31, 2**30, 7), (3, 4, 5, 6, 7, 8)])
def test_heavy_tailed_distinct_in_bounds(rng, shape):
    seed = int(rng.integers(1 << 30))
    parts = list(synthetic.iter_heavy_tailed(shape, 20_000, seed=seed, batch_nnz=3000))
    coords = np.concatenate([c for c, _ in parts])
    values = np.concatenate([v for _, v in parts])
    assert coords.shape == (20_000, len(shape))
    assert len(np.unique(coords, axis=0)) == 20_000  # no duplicates across batches
    assert (coords >= 0).all() and (coords < np.array(shape)).all()
    assert (values > 0).all() and (values <= 1).all()
    again = list(synthetic.iter_heavy_tailed(shape, 20_000, seed=seed, batch_nnz=3000))
    assert np.array_equal(np.concatenate([c for c, _ in again]), coords)  # same seed, same tensor


def test_slices_are_heavy_tailed(rng):
    coords, _ = synthetic.heavy_tailed((2000, 3000, 1000), 200_000, skew=2.0, seed=int(rng.integers(1 << 30)))
    for n in range(3):
        sizes = np.bincount(coords[:, n])
        sizes = sizes[sizes > 0]
        assert sizes.max() > 20 * np.median(sizes)
    uniform, _ = synthetic.heavy_tailed((2000, 3000, 1000), 200_000, skew=1.0, seed=int(rng.integers(1 << 30)))
    sizes = np.bincount(uniform[:, 0])
    assert sizes.max() < 3 * np.median(sizes)


def test_too_dense_is_an_error():
    with pytest.raises(ValueError, match="exceeds"):
        synthetic.heavy_tailed((3, 3), 10)


def test_planted_values_follow_the_model(rng):
    p = synthetic.planted_cp((30, 40, 50), 5, 2000, seed=int(rng.integers(1 << 30)))
    dense = np.einsum("r,ir,jr,kr->ijk", p.weights, *p.factors)
    assert np.allclose(p.values, dense[tuple(p.coords.T)], rtol=1e-13)
    assert np.count_nonzero(dense) == len(p.values)  # exactly rank 5: zero off the support
    assert 1000 < len(p.values) < 3000
    noisy = synthetic.planted_cp((30, 40, 50), 5, 2000, noise=0.1, seed=3)
    clean = np.einsum("r,ir,jr,kr->ijk", noisy.weights, *noisy.factors)[tuple(noisy.coords.T)]
    rel = np.std(noisy.values - clean) / np.std(clean)
    assert 0.07 < rel < 0.13


@pytest.mark.parametrize("values", ["uniform", "count", "normal"])
@pytest.mark.parametrize("gz", [False, True])
def test_write_tns_exact_round_trip(tmp_path, rng, values, gz):
    shape = (60, 70, 80, 9)
    coords, vals = synthetic.heavy_tailed(shape, 5000, seed=int(rng.integers(1 << 30)), values=values)
    path = tmp_path / ("t.tns.gz" if gz else "t.tns")
    n = synthetic.write_tns(path, [(coords[:2000], vals[:2000]), (coords[2000:], vals[2000:])], header="test")
    assert n == 5000
    s = tfo.convert(path, tmp_path / "t.zarr", shape=shape)
    c, v = s.to_coo()
    o1, o2 = np.lexsort(coords.T[::-1]), np.lexsort(c.T[::-1])
    assert np.array_equal(coords[o1], c[o2]) and np.array_equal(vals[o1], v[o2])
