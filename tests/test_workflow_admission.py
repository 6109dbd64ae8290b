"""Submitted runs respect their cluster, on a real scheduler and worker started as separate processes
(``dask scheduler`` and ``dask worker --memory-limit 1500MB --resources tfooc-slot=1``):

- a decompose step that runs inside the driver plans its memory with the worker's limit, not the
  host's RAM;
- a second run waits, ``queued``, while the first holds the worker's one slot, even though the
  worker has a free thread; it starts once the first ends;
- a run whose decomposition no worker can hold is refused at submit with both figures;
- the monitoring page's data lists the queue and the worker's limit against the plan's peak.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import urllib.request

import numpy as np
import pytest
from dask_processes import dask_processes, until
from test_monitoring_run import CHROMIUM, _dom

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow.records import RunStore, parse_iso

LIMIT = 1_500_000_000  # the worker's --memory-limit, well below any CI host's RAM
LIMIT_MIB = f"{LIMIT / 2**20:,.0f} MiB"  # as the memory plan writes it: 1,431 MiB

SPEC = """\
name: {name}
steps:
  generate: {{kind: generate, out: {name}.zarr, shape: [30, 20, 25], nnz: 3000, model: planted, rank: 3, seed: 2}}
  decompose: {{kind: decompose, input: {name}.zarr, out: {name}.cp.zarr, rank: 3, max_iters: {iters}, tol: 0,
              seed: 1}}
"""


def _until(predicate, timeout=120.0, what="condition", every=0.1):
    return until(predicate, timeout, what, every)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read().decode())


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def slotted(tmp_path_factory):
    """A scheduler (with the monitoring preload) and one worker with two threads, a memory limit
    and one tfooc-slot, as separate processes."""
    tmp = tmp_path_factory.mktemp("admission")
    root = str(tmp / "storage")
    env = {"TFOOC_HEARTBEAT_S": "0.3", "NUMBA_NUM_THREADS": "1"}
    with dask_processes(tmp, root, nthreads=2, memory_limit=str(LIMIT), resources="tfooc-slot=1", env=env) as site:
        yield {"address": site["address"], "base": site["base"], "root": root, "tmp": tmp}


def _submit(slotted, name: str, iters: int) -> str:
    spec = slotted["tmp"] / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, iters=iters))
    code, out, err = _cli("submit", str(spec), "--scheduler", slotted["address"], "--storage", slotted["root"])
    assert code == 0, err
    assert "declares the tfooc-slot" not in err  # this worker does: no fallback warning
    return out.strip()


def test_second_run_queues_for_the_slot_and_plans_with_the_workers_limit(slotted):
    runs = RunStore(slotted["root"])
    first = _submit(slotted, "first", iters=100_000)  # runs until cancelled

    def iterations(run_id):
        return sum(e["event"] == "iteration" for e in runs.events(run_id))

    _until(lambda: iterations(first) >= 2, 180, "the first run's iterations")
    second = _submit(slotted, "second", iters=3)
    # the worker has a free thread, but its one slot is held by the first run's driver
    time.sleep(2.0)
    assert runs.read(second).state == "queued" and runs.read(first).state == "running"
    code, out, _ = _cli("status", "--storage", slotted["root"])
    assert code == 0
    row = next(line for line in out.splitlines() if second in line)
    assert "queued" in row, out
    # the page's data: the queue, and the worker's limit against the running plan's peak
    data = _get(slotted["base"] + "/tfooc/runs.json")
    assert [q["run_id"] for q in data["queue"]] == [second]
    (worker,) = data["workers"]
    assert worker["memory_limit"] == LIMIT and worker["slots"] == 1 and worker["slots_used"] == 1
    assert worker["runs"] == [first]
    assert 0 < worker["plan_peak"] < 0.7 * LIMIT and worker["plan"]
    if CHROMIUM:  # the page draws them: the queued run, the worker's limit and its run's plan peak
        dom = _dom(slotted["base"] + "/tfooc")
        assert [a["data-run-id"] for a in dom.having("queue-row")] == [second]
        (row,) = dom.having("worker-row")
        assert int(row["data-memory-limit"]) == LIMIT and int(row["data-plan-peak"]) == worker["plan_peak"]
        (bar,) = dom.having("peak-bar")
        assert float(bar["data-value"]) == worker["plan_peak"]
    # the first run's memory plan used the worker's limit (the step runs inside its driver)
    plans = [e["message"] for e in runs.events(first) if "memory plan" in (e.get("message") or "")]
    assert plans and all(f"of worker limit {LIMIT_MIB}" in p for p in plans), plans

    assert _cli("cancel", first, "--storage", slotted["root"], "--wait", "--timeout", "60")[0] == 0
    done = _until(lambda: runs.read(second).final and runs.read(second), 180, "the second run")
    assert done.state == "done", done.error
    # it started only once the first run had let the slot go
    assert parse_iso(done.attempts[0].started_at) >= parse_iso(runs.read(first).finished_at)
    assert not _get(slotted["base"] + "/tfooc/runs.json")["queue"]


def test_a_run_no_worker_can_hold_is_refused_at_submit(slotted):
    rng = np.random.default_rng(0)
    coords = np.unique(rng.integers(0, 40, (200, 3)), axis=0)
    tfo.convert((coords, rng.random(len(coords))), os.path.join(slotted["root"], "wide.zarr"), shape=(40, 40, 40))
    spec = slotted["tmp"] / "wide.yaml"
    # rank 5000: the Gram matrices alone take 1.2 GB, beyond 70 % of the worker's 1.5 GB
    spec.write_text(
        "name: wide\nsteps:\n  decompose: {kind: decompose, input: wide.zarr, out: wide.cp.zarr,\n"
        "              rank: 5000}\n"
    )
    before = set(RunStore(slotted["root"]).list() and [r.run_id for r in RunStore(slotted["root"]).list()])
    code, out, err = _cli("submit", str(spec), "--scheduler", slotted["address"], "--storage", slotted["root"])
    assert code == 2 and not out, err
    assert "Traceback" not in err
    assert "wide.yaml, line " in err and "steps.decompose.rank: a rank-5000 CP-ALS" in err, err
    assert "needs a worker memory limit of at least" in err and f"the largest worker limit is {LIMIT_MIB}" in err
    needed = float(err.split("at least ")[1].split(" MiB")[0].replace(",", ""))
    assert needed * 2**20 > LIMIT
    assert "nothing was submitted" in err
    assert {r.run_id for r in RunStore(slotted["root"]).list()} == before  # no record written
