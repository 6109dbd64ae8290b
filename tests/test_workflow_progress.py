"""What a run's record and output say while it goes: the record's progress is saved with each
checkpoint (a driver stopped at any moment shows the iteration a rerun resumes after, not one from
its last heartbeat); ``tfooc -q run`` prints nothing but errors; a rank set with ``--set`` that no
worker can hold is refused naming the option, not the file's line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.decompositions import read_checkpoint
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.admission import check_fits
from tensorflow_ooc.workflow.records import RunStore

REPO = Path(__file__).resolve().parent.parent

SPEC = """\
name: progress
steps:
  generate: {{kind: generate, out: t.zarr, shape: [{shape}], nnz: {nnz}, model: planted, rank: 3, seed: {seed}}}
  decompose: {{kind: decompose, input: t.zarr, out: t.cp.zarr, rank: 3, max_iters: 100000, tol: 0, seed: 1}}
"""


def _tfooc(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tensorflow_ooc.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "TFOOC_HEARTBEAT_S": "30", **kw},
    )


def test_the_records_progress_keeps_up_with_the_checkpoints(tmp_path, rng):
    storage = tmp_path / "storage"
    spec = tmp_path / "progress.yaml"
    shape = ", ".join(str(int(rng.integers(40, 60))) for _ in range(3))
    spec.write_text(SPEC.format(shape=shape, nnz=int(rng.integers(20_000, 30_000)), seed=int(rng.integers(1 << 30))))
    proc = _tfooc("-q", "run", str(spec), "--storage", str(storage))
    runs = RunStore(str(storage))
    checkpoints = storage / ".tfooc" / "checkpoints"
    try:
        deadline = time.time() + 300
        while not (checkpoints.is_dir() and list(checkpoints.glob("decompose-*.npz"))):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.1)
        samples = []
        for _ in range(6):
            time.sleep(float(rng.uniform(0.3, 1.0)))
            os.kill(proc.pid, signal.SIGSTOP)  # the driver stops where it is, as a killed one would
            try:
                (path,) = checkpoints.glob("decompose-*.npz")
                done = read_checkpoint(str(path)).iteration + 1  # iterations a rerun resumes after
                (rec,) = runs.list()
                samples.append((rec.steps["decompose"].progress.get("iteration", 0), done))
            finally:
                os.kill(proc.pid, signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait()
    # the record may be one iteration behind only while the checkpoint is being written and the
    # record saved right after it: never by the iterations since the last heartbeat
    assert all(shown >= done - 1 for shown, done in samples), samples
    # and not always behind (that window's share of an iteration grows with the machine's load: a
    # CI run beside other work found 4 of 5 samples in it, so one in sync is what is asked)
    assert any(shown >= done for shown, done in samples), samples
    assert samples[-1][1] > samples[0][1]  # it was iterating between the samples


def test_quiet_run_prints_nothing_but_errors(tmp_path, rng):
    storage = tmp_path / "storage"
    spec = tmp_path / "quiet.yaml"
    spec.write_text(
        f"steps:\n  generate: {{kind: generate, out: t.tns, shape: [5, 6, 7], nnz: {int(rng.integers(10, 50))}}}\n"
        "  convert: {kind: convert, input: t.tns, out: t.zarr}\n"
    )
    proc = _tfooc("-q", "run", str(spec), "--storage", str(storage))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out == "" and err == "", (out, err)
    (storage / "bad.tns").write_text("1 2 3 1.0\n1 2 x 2.0\n")
    spec.write_text("steps:\n  convert: {kind: convert, input: bad.tns, out: b.zarr}\n")
    proc = _tfooc("-q", "run", str(spec), "--storage", str(storage))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and out == "" and "tfooc: run " in err and "failed: ParseError" in err, (out, err)


def test_a_rank_set_with_set_that_no_worker_holds_names_the_option(tmp_path, rng):
    coords = np.unique(rng.integers(0, 40, (300, 3)), axis=0)
    tfo.convert((coords, rng.random(len(coords))), str(tmp_path / "wide.zarr"), shape=(40, 40, 40))
    spec = tmp_path / "wide.yaml"
    spec.write_text(
        "name: wide\nsteps:\n  cp:\n    kind: decompose\n    input: wide.zarr\n    out: wide.cp.zarr\n    rank: 5\n"
    )
    rank = int(rng.integers(9000, 15000))
    wf = load_spec(spec, storage=str(tmp_path), overrides=[f"steps.cp.rank={rank}"])
    workers = {"tcp://127.0.0.1:1": {"memory_limit": 1_500_000_000, "metrics": {"memory": 100_000_000}}}
    with pytest.raises(SpecError) as info:
        check_fits(wf, workers)
    (p,) = info.value.problems
    assert p.line is None and p.field == "steps.cp.rank", p
    assert f"a rank-{rank} CP-ALS" in p.message and f"(from --set steps.cp.rank={rank})" in p.message
    assert "line 7" not in str(info.value)
    # the file's own rank is named at its line
    big = spec.read_text().replace("rank: 5", f"rank: {rank}")
    spec.write_text(big)
    with pytest.raises(SpecError) as info:
        check_fits(load_spec(spec, storage=str(tmp_path)), workers)
    assert info.value.problems[0].line == 7 and "--set" not in str(info.value)
