"""Checkpoint/resume after SIGKILL of the driver, and a worker process killed mid-run."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import random_coo
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions import read_checkpoint

CHILD = """
import sys, time
import tensorflow_ooc as tfo
tfo.cp_als(sys.argv[1], 4, seed=3, max_iters=10, tol=0, checkpoint=sys.argv[2],
           callback=lambda record: time.sleep(0.4))
"""


def test_sigkill_driver_then_resume(tmp_path, rng):
    coords, values = random_coo(rng, (30, 35, 40), 6000)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", chunk_nnz=1500)
    ck = tmp_path / "ck.npz"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store.path), str(ck)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            state = read_checkpoint(str(ck)) if ck.exists() else None
            if state is not None and state.iteration >= 3:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = read_checkpoint(str(ck)).iteration
    assert 3 <= killed_at < 9
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        resumed = tfo.cp_als(store, 4, client=client, seed=3, max_iters=10, tol=0, checkpoint=ck, resume=True)
        full = tfo.cp_als(store, 4, client=client, seed=3, max_iters=10, tol=0)
    assert resumed.iterations == 10 and resumed.history[0]["iteration"] == 1
    assert abs(resumed.fit - full.fit) < 1e-10
    for a, b in zip(resumed.factors, full.factors):
        assert np.abs(a - b).max() < 1e-10


@pytest.mark.parametrize("execution", ["in-memory", "streaming"])
def test_worker_killed_mid_run(tmp_path, rng, execution):
    coords, values = random_coo(rng, (40, 45, 50), 20_000)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", chunk_nnz=2000)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        reference = tfo.cp_als(store, 4, client=client, seed=5, max_iters=8, tol=0, execution=execution)
        pids = client.run(os.getpid)
        victim = sorted(pids.values())[0]
        started = threading.Event()

        def slow(record):
            started.set()
            time.sleep(0.3)

        box = {}

        def run():
            box["result"] = tfo.cp_als(
                store, 4, client=client, seed=5, max_iters=8, tol=0, execution=execution, callback=slow
            )

        t = threading.Thread(target=run)
        t.start()
        assert started.wait(120)
        os.kill(victim, signal.SIGKILL)
        t.join(300)
        assert not t.is_alive()
    assert abs(box["result"].fit - reference.fit) < 1e-8
