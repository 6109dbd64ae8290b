"""Workflows on a real distributed LocalCluster (worker processes): submit returns at once and the
run finishes on the cluster; records outlive the cluster; status, logs, cancel; the output lock;
a SIGKILLed worker (running the driver) and a SIGKILLed foreground driver both leave runs that
resume from the CP-ALS checkpoint, with records that say what happened."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import load_spec
from tensorflow_ooc.workflow.records import RunStore
from tensorflow_ooc.workflow.runner import execute
from tensorflow_ooc.workflow.submit import submit, wait

SPEC = """\
name: cluster
steps:
  generate: {{kind: generate, out: t.zarr, shape: [{shape}], nnz: {nnz}, model: planted, rank: {rank}, seed: {seed}}}
  decompose: {{kind: decompose, input: t.zarr, out: t.cp.zarr, rank: {rank}, max_iters: {iters}, tol: 0,
              seed: {seed}, scheduler: cluster}}
  export: {{kind: export, result: t.cp.zarr, format: npz, out: t.npz}}
"""
# fast heartbeats so a killed driver's lock goes stale within the test (inherited by the workers)
ENV = {"TFOOC_HEARTBEAT_S": "0.3", "TFOOC_STALE_AFTER_S": "2"}


@pytest.fixture(scope="module")
def cluster():
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
            yield c
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spec(tmp_path, rng, iters):
    params = {
        "shape": ", ".join(str(int(rng.integers(15, 30))) for _ in range(3)),
        "nnz": int(rng.integers(1500, 3000)),
        "rank": int(rng.integers(2, 4)),
        "seed": int(rng.integers(1 << 30)),
        "iters": iters,
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(SPEC.format(**params))
    return path, params


def _until(predicate, timeout=120.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _iteration(storage, run_id):
    try:
        rec = RunStore(str(storage)).read(run_id)
    except Exception:
        return 0
    return rec.steps["decompose"].progress.get("iteration", 0)


# The planted model is fitted exactly, so its fit is 1 - sqrt(a rounding-level residual) / ||X||:
# sums in another order (owner-computes on the 2 workers against one process) move it by ~2e-8,
# while factors agree to 1e-10 (tests/test_owner_computes.py)
FIT_TOL = 1e-7


def _reference_fit(storage, params):
    """The same CP-ALS without interruption, in this process."""
    r = tfo.cp_als(
        storage / "t.zarr", params["rank"], seed=params["seed"], max_iters=params["iters"], tol=0, scheduler="inline"
    )
    return r.fit


def test_submit_returns_at_once_and_records_outlive_the_cluster(tmp_path, rng, cluster, capsys):
    path, params = _spec(tmp_path, rng, iters=60)
    storage = tmp_path / "nightly runs"  # not the default root, and a name the shell must quote
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as first:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tensorflow_ooc.cli",
                "submit",
                str(path),
                "--scheduler",
                first.scheduler_address,
                "--storage",
                str(storage),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **ENV},
        )
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.strip()
        # the command has exited; the run is still going on the cluster
        assert not RunStore(str(storage)).read(run_id).final
        assert f"tfooc status {run_id}" in r.stderr
        # the hints work as pasted into a shell: they name the storage root, quoted
        hints = re.findall(r"tfooc (?:status|logs -f) [^\n]*?--storage '[^']*'", r.stderr)
        assert len(hints) == 2, r.stderr
        for hint in hints:
            pasted = subprocess.run(
                [sys.executable, "-m", "tensorflow_ooc.cli", *shlex.split(hint)[1:]],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert pasted.returncode == 0 and run_id in pasted.stdout + pasted.stderr, (hint, pasted.stderr)
        done = wait(str(storage), run_id, timeout=120)
        assert done.state == "done" and done.exit_code == 0, done.error
        assert done.mode == "submitted" and done.attempts[0].worker in first.scheduler_info["workers"]
        with Client(first) as c:
            events = [e for _, e in c.get_events("tfooc") if e.get("run_id") == run_id]
        assert sum(e["event"] == "iteration" for e in events) == params["iters"]
    # the first cluster is gone: the record, its events and the outputs are still there
    assert main(["status", run_id, "--storage", str(storage)]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id}: done" in out and "decompose  done" in out
    assert main(["logs", run_id, "--storage", str(storage)]) == 0
    assert f"iteration {params['iters']}: fit" in capsys.readouterr().out
    assert tfo.load_result(storage / "t.cp.zarr").iterations == params["iters"]
    # on a new cluster the same spec is up to date
    again = submit(load_spec(path, storage=str(storage)), cluster.scheduler_address)
    assert main(["status", again, "--storage", str(storage), "--wait", "--timeout", "120"]) == 3
    assert main(["status", "--storage", str(storage)]) == 0
    listing = capsys.readouterr().out
    assert run_id in listing and again in listing and "skipped" in listing


def test_lock_cancel_and_resume_from_the_checkpoint(tmp_path, rng, cluster, capsys):
    path, params = _spec(tmp_path, rng, iters=120)
    storage = tmp_path / "storage"
    wf = load_spec(path, storage=str(storage))
    run_id = submit(wf, cluster.scheduler_address)
    _until(lambda: _iteration(storage, run_id) >= 4, what="CP-ALS iterations")
    # a second run writing the same outputs fails at once, touching nothing
    clash = execute(load_spec(path, storage=str(storage)), cluster=cluster.scheduler_address)
    assert clash.exit_code == 1 and f"being written by run {run_id}" in clash.record.error
    assert set(st.state for st in clash.record.steps.values()) == {"not run"}
    assert main(["cancel", run_id[:-1], "--storage", str(storage), "--wait", "--timeout", "60"]) == 0
    assert "cancel" in capsys.readouterr().out
    rec = RunStore(str(storage)).read(run_id)
    assert rec.state == "cancelled" and rec.exit_code == 1 and rec.cancel_requested_at
    assert rec.steps["decompose"].state == "cancelled" and rec.steps["generate"].state == "done"
    stopped = rec.steps["decompose"].progress["iteration"]
    assert 4 <= stopped < params["iters"]
    # run it again: the generator is up to date, CP-ALS continues from its checkpoint
    resumed = wait(str(storage), submit(load_spec(path, storage=str(storage)), cluster.scheduler_address), timeout=120)
    assert resumed.state == "done", resumed.error
    dec = resumed.steps["decompose"]
    assert resumed.steps["generate"].state == "skipped"
    assert 3 <= dec.resumed_from_iteration <= stopped
    assert dec.metrics["iterations"] == params["iters"]
    assert dec.metrics["iterations_this_run"] == params["iters"] - dec.resumed_from_iteration
    assert abs(dec.metrics["fit"] - _reference_fit(storage, params)) < FIT_TOL


def test_sigkill_of_the_worker_running_the_driver(tmp_path, rng, cluster):
    path, params = _spec(tmp_path, rng, iters=100)
    storage = tmp_path / "storage"
    run_id = submit(load_spec(path, storage=str(storage)), cluster.scheduler_address)
    _until(lambda: _iteration(storage, run_id) >= 5, what="CP-ALS iterations")
    driver = RunStore(str(storage)).read(run_id).attempts[-1]
    os.kill(driver.pid, signal.SIGKILL)
    # the scheduler runs the driver task again on a live worker: a second attempt of the same run.
    # Until it starts, the record looks lost (no heartbeat for 2 s here); on a loaded machine the
    # scheduler takes longer than that to notice the death and start it
    runs = RunStore(str(storage))
    _until(lambda: len(runs.read(run_id).attempts) >= 2 or runs.read(run_id).final, timeout=120, what="attempt 2")
    final = wait(str(storage), run_id, timeout=180)
    assert final.state == "done", final.error
    assert len(final.attempts) == 2 and final.attempts[1].pid != driver.pid
    lost = final.attempts[0]
    assert lost.outcome.startswith("lost during step 'decompose'") and str(driver.pid) in lost.outcome
    dec = final.steps["decompose"]
    assert final.steps["generate"].state == "skipped" and dec.attempt == 2
    assert dec.resumed_from_iteration >= 3 and dec.metrics["iterations"] == params["iters"]
    assert any(e["event"] == "attempt-lost" for e in RunStore(str(storage)).events(run_id))
    assert abs(dec.metrics["fit"] - _reference_fit(storage, params)) < FIT_TOL


def test_sigkill_of_a_foreground_driver_then_rerun_takes_over(tmp_path, rng, cluster):
    path, params = _spec(tmp_path, rng, iters=100)
    storage = tmp_path / "storage"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorflow_ooc.cli",
            "-q",
            "run",
            str(path),
            "--scheduler",
            cluster.scheduler_address,
            "--storage",
            str(storage),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **ENV},
    )
    try:
        runs = RunStore(str(storage))
        run_id = _until(lambda: (runs.list() or [None])[0] and runs.list()[0].run_id, what="the run's record")
        _until(lambda: _iteration(storage, run_id) >= 5 or proc.poll() is not None, what="CP-ALS iterations")
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = runs.read(run_id)
    assert killed.state == "running"  # nobody closed it...
    _until(lambda: runs.read(run_id).display_state() == "lost", timeout=30, what="the heartbeat to go stale")
    again = execute(load_spec(path, storage=str(storage)), cluster=cluster.scheduler_address)
    assert again.state == "done", again.record.error
    assert again.record.took_over == [run_id]
    closed = runs.read(run_id)  # ...until the next run took its outputs over
    assert closed.state == "failed" and closed.error.startswith("lost:") and again.run_id in closed.error
    assert closed.steps["decompose"].state == "failed" and "interrupted" in closed.steps["decompose"].error
    dec = again.record.steps["decompose"]
    assert dec.resumed_from_iteration >= 3 and dec.metrics["iterations"] == params["iters"]
    assert abs(dec.metrics["fit"] - _reference_fit(storage, params)) < FIT_TOL
