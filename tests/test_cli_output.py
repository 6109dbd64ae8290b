"""What the command line writes where machines read it: stderr in a file or pipe (no progress-bar
fragments; in JSON mode one JSON object per line, errors included), a reader that stops reading
(``| head -1``), and versioned stores named by their folder. Real subprocesses and real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main

CLI = [sys.executable, "-m", "tensorflow_ooc.cli"]


def tfooc(*args, **kw) -> subprocess.CompletedProcess:
    # stderr is a pipe here, as in a CI log, a cron mail or `2> e.json`: never a terminal
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300, **kw)


def _tns(path: Path, rng, shape=(9, 8, 7), nnz=120, first_row=0) -> Path:
    """A 1-based .tns file of ``nnz`` distinct coordinates, mode 0 starting at ``first_row``."""
    keys = rng.choice(int(np.prod(shape)), size=nnz, replace=False)
    coords = np.stack(np.unravel_index(keys, shape), axis=1) + 1
    coords[:, 0] += first_row
    path.write_text("".join(" ".join(map(str, c)) + f" {v:.4f}\n" for c, v in zip(coords, rng.uniform(0.5, 2, nnz))))
    return path


def test_json_mode_writes_only_json_lines_to_stderr(tmp_path, rng):
    tns = _tns(tmp_path / "t.tns", rng)
    store = tmp_path / "t.zarr"
    r = tfooc("--log-format", "json", "convert", tns, store)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    # the converter's bar drew "parse: 100%|..." fragments with carriage returns before each object
    assert "\r" not in r.stderr and lines
    records = [json.loads(s) for s in lines]
    assert all(isinstance(d, dict) and {"time", "level", "logger", "message"} <= set(d) for d in records)
    assert any(d["level"] == "INFO" and d["message"].startswith("converting") for d in records)  # info kept

    r = tfooc("cpd", store, "--rank", "2", "--max-iters", "3", "--seed", "1", "--log-format", "json")
    assert r.returncode == 0, r.stderr
    records = [json.loads(s) for s in r.stderr.splitlines()]
    assert [d["iteration"] for d in records if "iteration" in d] == [1, 2, 3]

    # errors are objects too: bad input, a usage error, a run that does not exist
    for args in (
        ("info", tmp_path / "missing.zarr"),
        ("cpd", store, "--rank", "zero"),
        ("status", "nope", "--storage", tmp_path / "runs"),
    ):
        r = tfooc("--log-format", "json", *args)
        assert r.returncode == 2, r.stderr
        (record,) = [json.loads(s) for s in r.stderr.splitlines()]
        assert record["level"] == "ERROR" and record["logger"] == "tensorflow_ooc.cli", record
        assert "Traceback" not in r.stderr and not record["message"].startswith("tfooc: error")


def test_text_mode_into_a_pipe_keeps_the_log_lines_and_draws_no_bars(tmp_path, rng):
    tns = _tns(tmp_path / "t.tns", rng)
    r = tfooc("convert", tns, tmp_path / "t.zarr")
    assert r.returncode == 0, r.stderr
    # -q was the only way to lose the bar, and it dropped these lines too
    assert "\r" not in r.stderr and "%|" not in r.stderr
    assert " INFO converting " in r.stderr and " INFO converted " in r.stderr


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    # buffered output, as a user's shell has it (PYTHONUNBUFFERED makes argparse swallow the error)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for args in (["status", "--storage", str(tmp_path)], ["--help"], ["--version"]):
        # the read end is closed before the command writes: every write to stdout is a broken pipe
        proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.wait(timeout=120) == 141, (args, err)  # 128 + SIGPIPE, as `seq 1000000 | head -1`
        assert err == "", err  # no BrokenPipeError traceback, no "Exception ignored"


def _versioned(tmp_path: Path, rng) -> tuple[Path, list[int]]:
    """A versioned store as a nightly workflow writes it: two runs, two versions."""
    spec = tmp_path / "nightly.yaml"
    spec.write_text("name: nightly\nsteps:\n  ingest: {kind: convert, input: incoming/, out: tensor, append: true}\n")
    storage = tmp_path / "storage"
    (storage / "incoming").mkdir(parents=True)
    nnz = []
    for night, n in enumerate((60, 40)):
        _tns(storage / "incoming" / f"day{night}.tns", rng, nnz=n, first_row=9 * night)  # new rows: no repeats
        assert main(["-q", "run", str(spec), "--storage", str(storage)]) == 0
        nnz.append(n + (nnz[-1] if nnz else 0))
    return storage / "tensor", nnz


def test_versioned_store_folders_open_at_their_latest_version_or_at_vN(tmp_path, rng, capsys):
    folder, nnz = _versioned(tmp_path, rng)
    assert sorted(p.name for p in folder.iterdir()) == ["v000001.zarr", "v000002.zarr", "versions.json"]
    # the Python API: the folder is its latest version, FOLDER@vN the one asked for
    assert tfo.open_store(folder).nnz == nnz[1] and tfo.open_store(f"{folder}@v1").nnz == nnz[0]
    assert tfo.open_store(f"{folder}@2").path.endswith("v000002.zarr")

    r = tfooc("info", folder, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nnz"] == nnz[1]
    r = tfooc("info", f"{folder}@v1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["nnz"] == nnz[0], r.stderr
    r = tfooc("info", f"{folder}@v7")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no version 7" in r.stderr and "v1, v2" in r.stderr
    r = tfooc("info", f"{tmp_path / 'storage' / 'incoming'}@v1")
    assert r.returncode == 2 and "not a versioned store" in r.stderr

    out = tmp_path / "cp.zarr"
    assert main(["-q", "cpd", str(folder), "--rank", "2", "--max-iters", "2", "--out", str(out)]) == 0
    assert "v000002.zarr" in capsys.readouterr().out  # the version it decomposed
    assert tfo.load_result(out).iterations == 2
    assert os.path.isdir(folder / "v000001.zarr")  # nothing moved


# the quick commands, and what they must not import (their timing is benchmarks/bench_cli_startup.py)
PROBE = """
import json, sys
from tensorflow_ooc.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = [m for m in ("dask", "distributed", "numba", "zarr") if m in sys.modules]
print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
"""


def test_quick_commands_load_no_dask_numba_or_zarr(tmp_path, rng):
    folder, _ = _versioned(tmp_path, rng)  # a storage root with real runs
    storage = folder.parent
    run_id = sorted(p.name for p in (storage / ".tfooc" / "runs").iterdir())[0]
    for args in (
        ["--help"],
        ["--version"],
        ["status", "--storage", storage],
        ["status", run_id, "--storage", storage],
        ["logs", run_id, "--storage", storage],
        ["cancel", run_id, "--storage", storage],
        ["--log-format", "json", "status", "--storage", storage],
    ):
        r = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=120)
        probe = json.loads(r.stderr.strip().splitlines()[-1])
        assert probe == {"code": 0, "loaded": []}, (args, r.stderr)
    # the package itself imports as before, its names loading their stage when used
    r = subprocess.run(
        [sys.executable, "-c", "import sys, tensorflow_ooc as t; print('numba' in sys.modules, t.cp_als.__name__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.split() == ["False", "cp_als"], r.stderr
