"""A worker lost under a submitted run, on a real cluster of processes (``dask scheduler`` and two
``dask worker`` processes under nannies, each with one ``tfooc-slot``): the worker running run A's
driver is SIGKILLed while run B holds the other slot and run C, submitted after A, waits. The
nanny restarts the worker; A's driver takes its free slot before C (submission order), never on
B's busy worker; meanwhile A's status is ``retrying``, never ``lost``; C runs once a slot is
free."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time

import pytest
from dask_processes import dask_processes, until
from webhook_server import webhook_server

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow.records import RunStore, parse_iso

SPEC = """\
name: {name}
webhooks: {{on_retry: "{hook}"}}
steps:
  generate: {{kind: generate, out: {name}.zarr, shape: [{shape}], nnz: {nnz}, model: planted, rank: 3, seed: {seed}}}
  decompose: {{kind: decompose, input: {name}.zarr, out: {name}.cp.zarr, rank: 3, max_iters: {iters}, tol: 0,
              seed: 1}}
"""

ENV = {"TFOOC_HEARTBEAT_S": "0.3", "TFOOC_STALE_AFTER_S": "4", "NUMBA_NUM_THREADS": "1"}


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def env(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)  # this process's readers (status) use the same staleness


def test_a_lost_workers_driver_takes_the_first_free_slot_in_submission_order(tmp_path, rng, env):
    storage = tmp_path / "storage"
    runs = RunStore(str(storage))

    def submit(name: str, iters: int) -> str:
        spec = tmp_path / f"{name}.yaml"
        shape = ", ".join(str(int(rng.integers(20, 30))) for _ in range(3))
        spec.write_text(
            SPEC.format(
                name=name,
                shape=shape,
                nnz=int(rng.integers(2000, 3000)),
                seed=rng.integers(1000),
                iters=iters,
                hook=f"{hooks['url']}/{name}",
            )
        )
        code, out, err = _cli("submit", str(spec), "--scheduler", dask["address"], "--storage", str(storage))
        assert code == 0, err
        return out.strip()

    def iterations(run_id: str) -> int:
        return sum(e["event"] == "iteration" for e in runs.events(run_id))

    with (
        webhook_server() as hooks,
        dask_processes(
            tmp_path, str(storage), workers=2, nthreads=2, resources="tfooc-slot=1", env=ENV, memory_limit="1500MB"
        ) as dask,
    ):
        a = submit("a", 1_000_000)
        until(lambda: iterations(a) >= 2, 240, "run A's iterations")
        b = submit("b", 1_000_000)
        until(lambda: iterations(b) >= 2, 240, "run B's iterations")
        c = submit("c", int(rng.integers(3, 8)))
        time.sleep(1.0)
        assert runs.read(c).state == "queued"  # both slots are held
        a_worker = runs.read(a).attempts[-1]
        b_worker = runs.read(b).attempts[-1].worker
        assert a_worker.worker != b_worker
        os.kill(a_worker.pid, signal.SIGKILL)  # the worker process running A's driver
        seen = []
        deadline = time.time() + 240
        while len(runs.read(a).attempts) < 2:
            assert time.time() < deadline, f"A never restarted; states seen: {seen}"
            seen.append(runs.read(a).display_state())
            code, out, _ = _cli("status", "--storage", str(storage))
            row = next(line for line in out.splitlines() if a in line)
            seen.append(row.split()[1] if len(row.split()) > 1 else row)
            time.sleep(0.1)
        assert "lost" not in " ".join(seen), seen
        assert "retrying" in seen, seen  # shown while it waited for a slot
        restarted = runs.read(a)
        second = restarted.attempts[1]
        assert second.worker != b_worker  # not queued behind B on its busy worker
        assert restarted.requeued is None and restarted.state == "running"  # started again: no longer waiting
        until(lambda: iterations(a) > 0 and runs.read(a).steps["decompose"].attempt == 2, 240, "A resuming")
        # C was submitted after A: it is still waiting, B and A hold the two slots
        assert runs.read(c).state == "queued" and not runs.read(c).attempts
        assert any(e["event"] == "requeued" and "left the cluster" in e["message"] for e in runs.events(a))
        assert runs.read(a).attempts[0].outcome.startswith("lost during step 'decompose'")
        # the on_retry webhook was told of the driver's restart, from the worker it restarted on
        (told,) = [p["json"] for p in hooks["posts"] if p["path"] == "/a"]
        assert told["event"] == "on_retry" and told["retry"] == "driver" and told["run_id"] == a
        assert told["lost_attempt"] == 1 and told["attempt"] == 2 and "lost during step" in told["reason"]
        # the slots go: C runs and ends
        for r in (a, b):
            assert _cli("cancel", r, "--storage", str(storage), "--wait", "--timeout", "120")[0] == 0
        done = until(lambda: runs.read(c).final and runs.read(c), 240, "run C")
        assert done.state == "done", done.error
        assert parse_iso(done.attempts[0].started_at) > parse_iso(second.started_at)
