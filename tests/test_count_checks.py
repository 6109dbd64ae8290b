"""CP-APR input checks: negative values refused (naming the nonzero and its coordinates), non-integers warned once
(a log line, not a Python warning), all-zero counts refused."""

import logging
import re
import warnings

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions.apr.count_checks import check_counts
from tensorflow_ooc.errors import DecompositionError

SHAPE = (40, 30, 20)


def counts_store(rng, tmp_path, n=3000, name="x.zarr"):
    """A store of random distinct cells with integer counts, small chunks (several to scan)."""
    lin = rng.choice(int(np.prod(SHAPE)), size=n, replace=False)
    coords = np.stack(np.unravel_index(lin, SHAPE), axis=1).astype(np.int64)
    values = rng.integers(1, 20, n).astype(np.float64)
    return coords, values, lambda v: tfo.convert((coords, v), tmp_path / name, shape=SHAPE, chunk_nnz=512)


def store_positions(store, coords):
    """Where the nonzeros at ``coords`` (n, nmodes) lie in the store's (ALTO) order."""
    c, _ = store.to_coo()
    lin = np.ravel_multi_index(tuple(c.T), SHAPE)
    where = dict(zip(lin.tolist(), range(len(lin))))
    return np.array([where[int(x)] for x in np.ravel_multi_index(tuple(np.atleast_2d(coords).T), SHAPE)])


def test_clean_counts_are_silent(rng, tmp_path, caplog):
    coords, values, write = counts_store(rng, tmp_path)
    store = write(values)
    assert store.nchunks > 3
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        assert check_counts(store) == pytest.approx(float(values.sum()), rel=1e-12)  # the total count
        check_counts(store.path)  # a path is opened
    zeros = values.copy()
    zeros[: len(zeros) // 2] = 0.0  # explicit zeros are counts too
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        check_counts(tfo.convert((coords, zeros), tmp_path / "z.zarr", shape=SHAPE))
    assert not _warnings(caplog)


def test_all_zero_counts_are_refused(rng, tmp_path):
    coords, values, write = counts_store(rng, tmp_path)
    store = write(np.zeros_like(values))
    with pytest.raises(DecompositionError, match=rf"all {len(values):,} values are zero: CP-APR needs positive counts"):
        check_counts(store)


def test_negative_value_names_the_nonzero_and_its_coordinates(rng, tmp_path):
    coords, values, write = counts_store(rng, tmp_path)
    k = int(rng.integers(len(values)))
    bad = -float(rng.integers(1, 9))
    values[k] = bad
    store = write(values)
    with pytest.raises(DecompositionError) as e:
        check_counts(store)
    msg = str(e.value)
    where = "(" + ", ".join(str(int(i)) for i in coords[k]) + ")"
    assert "CP-APR needs nonnegative counts" in msg and store.path in msg
    assert where in msg and msg.endswith(f"is {bad!r}")
    assert f"nonzero {store_positions(store, coords[k])[0]} " in msg


def test_stops_at_the_first_negative_in_store_order(rng, tmp_path):
    coords, values, write = counts_store(rng, tmp_path)
    ks = rng.choice(len(values), size=5, replace=False)
    values[ks] = -1.0
    store = write(values)
    first = store_positions(store, coords[ks]).min()
    with pytest.raises(DecompositionError, match=rf"nonzero {first} at "):
        check_counts(store)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_non_integers_warn_exactly_once(rng, tmp_path, caplog):
    coords, values, write = counts_store(rng, tmp_path)
    ks = rng.choice(len(values), size=40, replace=False)  # spread over several chunks
    values[ks] += 0.5
    store = write(values)
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")  # a log line, not a Python warning
        check_counts(store)
    assert len(_warnings(caplog)) == 1
    msg = _warnings(caplog)[0]
    pos = store_positions(store, coords[ks])
    first = ks[np.argmin(pos)]
    where = "(" + ", ".join(str(int(i)) for i in coords[first]) + ")"
    assert where in msg and f"is {float(values[first])!r}, not an integer" in msg
    assert re.search(rf"nonzero {pos.min()} at", msg)
    # each call warns again (once)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_counts(store)
    assert len(_warnings(caplog)) == 1 and "not an integer" in _warnings(caplog)[0]


def test_negative_after_non_integer_still_refused(rng, tmp_path, caplog):
    coords, values, write = counts_store(rng, tmp_path)
    values[:] += 0.25
    values[int(rng.integers(len(values)))] = -3.0
    store = write(values)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(DecompositionError, match=r"is -3\.0$"):
            check_counts(store)
    assert len(_warnings(caplog)) <= 1
