"""Planted Poisson CP tensors (count data for CP-APR): counts, nonzeros, the model's intensity, seeding, the CLI."""

import numpy as np
import pytest

from tensorflow_ooc import synthetic
from tensorflow_ooc.cli import main
from tensorflow_ooc.format import coords_from_words


def run(argv):
    """``tfooc ARGV`` in this process: its exit status (usage errors exit through SystemExit)."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def dense_model(p):
    letters = "abcdefgh"[: len(p.factors)]
    spec = ",".join(f"{c}r" for c in letters) + ",r->" + letters
    return np.einsum(spec, *p.factors, p.weights)


def test_counts_follow_the_model(rng):
    shape, rank, nnz = (40, 30, 20), 4, 3000
    p = synthetic.planted_poisson(shape, rank, nnz, seed=int(rng.integers(1 << 30)), batch_nnz=1000)
    n = p.coords.shape[0]
    # shapes, bounds, distinct cells, counts are integers >= 1
    assert p.shape == shape and p.coords.shape == (n, 3) and p.values.shape == (n,)
    assert p.coords.dtype == np.int64 and p.values.dtype == np.float64
    assert (p.coords >= 0).all() and (p.coords < np.array(shape)).all()
    assert len(np.unique(p.coords, axis=0)) == n
    assert (p.values >= 1).all() and (p.values == np.round(p.values)).all()
    # the model: nonnegative factors with columns summing to 1, weights the expected counts
    assert len(p.factors) == 3 and all(f.shape == (L, rank) for f, L in zip(p.factors, shape))
    assert all((f >= 0).all() and np.allclose(f.sum(axis=0), 1) for f in p.factors)
    assert p.weights.shape == (rank,) and (p.weights > 0).all()
    M = dense_model(p)
    assert np.allclose(p.intensity(), M[tuple(p.coords.T)], rtol=1e-12)
    # expected nonzeros sum(1 - exp(-m)) over all cells: as requested (the pilot estimate), and the draw near it
    expected = -np.expm1(-M).sum()
    assert abs(expected - nnz) < 0.03 * nnz
    assert abs(n - expected) < 5 * np.sqrt(expected)
    # the total count is Poisson(sum m); over the nonzeros, E[x] = m / (1 - exp(-m)) per cell
    total = M.sum()
    assert np.isclose(total, p.weights.sum())
    assert abs(p.values.sum() - total) < 5 * np.sqrt(total)
    m = p.intensity()
    conditional = m / -np.expm1(-m)
    assert abs(p.values.sum() / conditional.sum() - 1) < 0.05
    # cells the model makes busy hold larger counts (heavy intensities, heavy counts)
    busy = m > np.quantile(m, 0.9)
    assert p.values[busy].mean() > 1.3 * p.values[~busy].mean()


def test_deterministic_and_streamed_in_batches(rng):
    seed = int(rng.integers(1 << 30))
    shape = (50, 40, 30, 6)
    a = synthetic.planted_poisson(shape, 3, 2000, seed=seed, skew=1.6, batch_nnz=700)
    gen = synthetic.PlantedPoissonGenerator(shape, 3, 2000, seed=seed, skew=1.6, batch_nnz=700)
    assert all(np.array_equal(x, y) for x, y in zip(a.factors, gen.factors)) and np.array_equal(a.weights, gen.weights)
    assert gen.nbatches >= 3
    # the same seed, the same counts; batch by batch, each a distinct set of cells
    runs = list(gen.runs())
    coords = np.concatenate([coords_from_words(k, gen.layout) for k, _ in runs])
    assert np.array_equal(coords, a.coords) and np.array_equal(np.concatenate([v for _, v in runs]), a.values)
    assert len(np.unique(coords, axis=0)) == coords.shape[0]
    # runs for conversion to merge: ALTO words ascending within each
    for keys, counts in runs:
        assert keys.dtype == np.uint64 and keys.shape == (1, counts.shape[0])
        assert (keys[0][1:] > keys[0][:-1]).all()
    other = synthetic.PlantedPoissonGenerator(shape, 3, 2000, seed=seed + 1, skew=1.6, batch_nnz=700)
    assert not np.array_equal(other.weights, a.weights)


def test_heavy_rows_drawn_in_pieces_stay_distinct(rng):
    # a batch far above batch_nnz: drawn in pieces of 2 * batch_nnz events, each reduced, merged
    gen = synthetic.PlantedPoissonGenerator((8, 10, 10), 2, 200, seed=int(rng.integers(1 << 30)), batch_nnz=2)
    k = int(np.argmax(gen._mass.sum(axis=1)))  # at most 8 batches of >= 200 events: >= 25 expected
    events = int(gen._rng(2, k).poisson(gen._mass[k]).sum())  # the batch's first draw: its event count
    assert events > 2 * gen.batch_nnz  # two pieces or more
    keys, counts = gen.batch_keys(k)
    assert (keys[0][1:] > keys[0][:-1]).all() and (counts >= 1).all() and counts.sum() == events
    c = coords_from_words(keys, gen.layout)
    assert ((gen.bounds[k] <= c[:, gen.part]) & (c[:, gen.part] < gen.bounds[k + 1])).all()


def test_more_than_64_index_bits(rng):
    # 5 modes of 2**13: 65 ALTO bits, two words per key
    gen = synthetic.PlantedPoissonGenerator((2**13,) * 5, 2, 3000, seed=int(rng.integers(1 << 30)), batch_nnz=1000)
    assert gen.layout.nwords == 2
    runs = list(gen.runs())
    for keys, _ in runs:
        assert (np.lexsort(keys) == np.arange(keys.shape[1])).all()  # ascending, high word first
    coords = np.concatenate([coords_from_words(k, gen.layout) for k, _ in runs])
    assert len(np.unique(coords, axis=0)) == coords.shape[0] and abs(coords.shape[0] - 3000) < 300
    assert (gen.intensity(coords) > 0).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (((10, 10), 2, 60), "more than half"),
        (((10, 10), 0, 10), "rank must be >= 1"),
        (((10, 10), 2, 0), "nnz must be >= 1"),
        (((10,), 2, 3), "2 or more modes"),
        (((10, 10), 2, 10, {"concentration": 0.0}), "concentration"),
        (((10, 10), 2, 10, {"skew": 0.5}), "skew must be >= 1"),
    ],
)
def test_bad_arguments(args, message):
    kw = args[3] if len(args) > 3 else {}
    with pytest.raises(ValueError, match=message):
        synthetic.planted_poisson(*args[:3], **kw)


def test_cli_writes_counts_and_true_model(tmp_path, rng):
    import tensorflow_ooc as tfo

    seed = str(int(rng.integers(1 << 30)))
    args = ["--kind", "planted-poisson", "--shape", "30,20,10", "--nnz", "1500", "--rank", "3", "--seed", seed]
    assert run(["-q", "generate", tmp_path / "p.tns", *args]) == 0
    z = np.load(tmp_path / "p.factors.npz")
    assert sorted(z.files) == ["factor0", "factor1", "factor2", "weights"]
    assert z["factor0"].shape == (30, 3) and np.allclose(z["factor2"].sum(axis=0), 1)
    s = tfo.convert(tmp_path / "p.tns", tmp_path / "from_text.zarr", shape=(30, 20, 10))
    c, v = s.to_coo()
    assert 1200 < s.nnz < 1800 and (v >= 1).all() and (v == np.round(v)).all()
    m = np.einsum("r,ir,jr,kr->ijk", z["weights"], z["factor0"], z["factor1"], z["factor2"])
    assert (m[tuple(c.T)] > 0).all()
    # straight into a store (sorted runs merged): the same tensor as the text file
    assert run(["-q", "generate", tmp_path / "p.zarr", *args]) == 0
    c2, v2 = tfo.open_store(tmp_path / "p.zarr").to_coo()
    assert np.array_equal(c, c2) and np.array_equal(v, v2)
    assert (tmp_path / "p.zarr.factors.npz").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--noise", "0.1"], "--noise does not apply"),
        (["--values", "uniform"], "--values uniform does not apply"),
        (["--nnz", "4000"], "more than half"),
        (["--concentration", "-1"], "--concentration"),
    ],
)
def test_cli_bad_arguments_exit_2(tmp_path, capsys, extra, message):
    argv = ["-q", "generate", str(tmp_path / "p.tns"), "--kind", "planted-poisson", "--shape", "20,20,10"]
    argv += ["--nnz", "500", *extra] if "--nnz" not in extra else extra
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.strip().count("\n") == 0
    assert not (tmp_path / "p.tns").exists() and not (tmp_path / "p.factors.npz").exists()
    # options of planted-poisson refused for the other kinds
    assert run(["-q", "generate", tmp_path / "h.tns", "--shape", "9,9", "--nnz", "9", "--concentration", "1"]) == 2
    assert "only for --kind planted-poisson" in capsys.readouterr().err


def test_help_names_the_kind(capsys):
    assert run(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "planted-poisson" in out and "--concentration" in out and "Poisson" in out
