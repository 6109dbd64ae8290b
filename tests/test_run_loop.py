"""The one run loop (decompositions/common/run_loop.py): a worker killed in the middle of an
owner-computes run restarts the method on the workers left, from its checkpoint, in a loop, and the
run ends with the uninterrupted run's model."""

import logging
import os
import signal

import numpy as np
import pytest
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic


@pytest.mark.parametrize("method", ["cp_als", "cp_apr"])
def test_a_worker_killed_mid_run_restarts_from_the_checkpoint(tmp_path, method, caplog):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    if method == "cp_als":
        p = synthetic.planted_cp((40, 30, 20), 3, 4000, seed=seed)
        run = tfo.cp_als
    else:
        p = synthetic.planted_poisson((40, 30, 20), 3, 4000, seed=seed)
        run = tfo.cp_apr
    store = tfo.convert((p.coords, p.values), str(tmp_path / "x.zarr"))
    common = dict(seed=seed % 1000, max_iters=6, tol=0.0, distribution="owner", partitions=4)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            whole = run(store, 3, client=client, checkpoint=str(tmp_path / "whole.npz"), **common)
            killed: list[int] = []

            def kill_one_worker(record: dict) -> None:
                if record["iteration"] == 2 and not killed:
                    pid = sorted(client.run(os.getpid).values())[0]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

            caplog.set_level(logging.WARNING, logger="tensorflow_ooc")
            cut = run(store, 3, client=client, checkpoint=str(tmp_path / "cut.npz"), callback=kill_one_worker, **common)
    assert killed, "the callback never ran"
    said = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
    assert said and "from checkpoint" in said[0], [r.getMessage() for r in caplog.records][-20:]
    assert cut.iterations == whole.iterations == 6
    assert [h["iteration"] for h in cut.history] == list(range(1, 7))
    np.testing.assert_allclose(cut.weights, whole.weights, rtol=1e-9)
    for a, b in zip(cut.factors, whole.factors):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
