"""CP-ALS sweeps on a one-partition graph (the embedded default's one worker of one thread): the
modes of an iteration run as one task, a batch of iterations' sweeps as one task, the next batch
is submitted before the driver reads this one's summaries and skips its sweeps where the driver's
test stops the run, and the in-process cluster updates in place. Results equal the inline
scheduler's; several workers give one worker's result."""

import numpy as np
import pytest
from conftest import random_coo
from distributed import Client, LocalCluster, get_task_stream

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.cluster import in_this_process


def _store(tmp_path, rng, shape=(40, 30, 25), nnz=6000):
    coords, values = random_coo(rng, shape, nnz)
    return tfo.convert((coords, np.abs(values)), tmp_path / "s.zarr", chunk_nnz=2048)


def _same(a, b, rtol=1e-12):
    assert abs(a.fit - b.fit) < 1e-12
    for x, y in zip(a.factors, b.factors):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(a.weights, b.weights, rtol=rtol)


def test_in_process_sweeps_equal_inline_with_two_tasks_a_batch(tmp_path, rng, client):
    store = _store(tmp_path, rng)
    iters = int(rng.integers(4, 7))
    inline = tfo.cp_als(store, 5, seed=3, max_iters=iters, tol=0, scheduler="inline")
    with get_task_stream(client) as ts:
        dask = tfo.cp_als(store, 5, client=client, seed=3, max_iters=iters, tol=0)
    assert in_this_process(client.scheduler_info()["workers"])
    assert dask.params["in_place_updates"]  # as inline: nothing recomputes an earlier state here
    _same(dask, inline)
    names = [d["key"].split("-")[0] for d in ts.data if isinstance(d["key"], str)]
    # one sweep task and one summary task a batch, never one task a mode or an iteration: the
    # first iteration alone (it times one), the second submitted ahead before that timing was
    # read, then the rest at once (an iteration takes milliseconds)
    assert names.count("_sweeps_then") == names.count("sweep_summaries") == 3
    assert "_mttkrp_then" not in names and "update_mode" not in names and "_modes_then" not in names
    for h in dask.history:
        assert len(h["mode_seconds"]) == 3 and all(t > 0 for t in h["mttkrp_seconds"] + h["update_seconds"])
        assert sum(h["mttkrp_seconds"]) + sum(h["update_seconds"]) <= h["seconds"] + 1e-3


@pytest.mark.parametrize("batch", [2, 3, 32])
def test_sweep_submitted_ahead_leaves_a_converged_run_as_it_was(tmp_path, rng, client, monkeypatch, batch):
    """A run that converges before max_iters: the sweeps after it in its batch, and the batch
    already submitted after that one, must leave the (in-place updated) state alone, so the
    factors are those of the last iteration."""
    from tensorflow_ooc.decompositions.cp import iteration

    monkeypatch.setattr(iteration, "MAX_BATCH", batch)
    store = _store(tmp_path, rng)
    probe = tfo.cp_als(store, 4, seed=5, max_iters=12, tol=0, scheduler="inline")
    stop = int(rng.integers(2, 10))
    # just above iteration stop's change: the run stops there or at an earlier smaller change
    tol = float(np.nextafter(probe.history[stop]["fit_change"], np.inf))
    inline = tfo.cp_als(store, 4, seed=5, max_iters=12, tol=tol, scheduler="inline")
    dask = tfo.cp_als(store, 4, client=client, seed=5, max_iters=12, tol=tol)
    assert dask.iterations == inline.iterations <= stop + 1 < 12
    _same(dask, inline)
    # and with a checkpoint every other iteration (those are not run ahead), resumed to the end
    ck = tmp_path / "ck.npz"
    part = tfo.cp_als(store, 4, client=client, seed=5, max_iters=stop, tol=0, checkpoint=ck, checkpoint_every=2)
    whole = tfo.cp_als(store, 4, seed=5, max_iters=stop, tol=0, scheduler="inline")
    _same(part, whole)
    resumed = tfo.cp_als(store, 4, client=client, seed=5, max_iters=stop + 2, tol=0, checkpoint=ck, resume=True)
    _same(resumed, tfo.cp_als(store, 4, seed=5, max_iters=stop + 2, tol=0, scheduler="inline"))


def test_process_worker_copying_sweep_and_two_workers_equal_one(tmp_path, rng, two_workers):
    """A worker process keeps copying updates (a lost worker is recomputed from earlier states):
    the sweep copies the state once and leaves its input alone; two workers give its result."""
    store = _store(tmp_path, rng, shape=(35, 28, 20, 6), nnz=5000)
    inline = tfo.cp_als(store, 3, seed=8, max_iters=4, tol=0, scheduler="inline")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        assert not in_this_process(c.scheduler_info()["workers"])
        with get_task_stream(c) as ts:
            one = tfo.cp_als(store, 3, client=c, seed=8, max_iters=4, tol=0)
    assert not one.params["in_place_updates"]
    assert sum(str(d["key"]).startswith("_sweeps_then") for d in ts.data) == 3  # [0], [1], [2, 3]
    _same(one, inline, rtol=1e-10)
    for distribution in ("graph", "owner"):
        two = tfo.cp_als(store, 3, client=two_workers, seed=8, max_iters=4, tol=0, distribution=distribution)
        _same(two, one, rtol=1e-9)


@pytest.mark.parametrize("nonnegative", [False, True])
def test_fused_sweep_equals_per_mode_tasks(tmp_path, rng, client, nonnegative):
    """The one-task sweep against the per-mode tasks of the same graph (two partitions on one
    worker keep one task a mode): the same numbers."""
    store = _store(tmp_path, rng)
    kw = dict(seed=11, max_iters=4, tol=0, nonnegative=nonnegative)
    fused = tfo.cp_als(store, 4, client=client, **kw)
    per_mode = tfo.cp_als(store, 4, client=client, partitions=2, **kw)
    assert fused.params["memory_plan"]["in_place"] == per_mode.params["memory_plan"]["in_place"]
    _same(fused, per_mode, rtol=1e-10)
