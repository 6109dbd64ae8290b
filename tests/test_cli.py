"""The tfooc command line, run as a user would (subprocess)."""

import json
import os
import signal
import subprocess
import sys

import pytest


def tfooc(*args, cwd=None, timeout=300):
    """Run the CLI; a command still running after ``timeout`` s fails the test with every thread's
    stack (faulthandler, on SIGABRT), so that a hang names where it waits."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    p = subprocess.Popen(
        [sys.executable, "-m", "tensorflow_ooc.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        out, err = p.communicate()
        pytest.fail(f"tfooc {' '.join(map(str, args))} hung for {timeout} s; its threads:\n{err[-20000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_generate_convert_info(tmp_path):
    tns = tmp_path / "g.tns.gz"
    r = tfooc("-q", "generate", tns, "--shape", "30,40,50,6", "--nnz", "20000", "--seed", "3")
    assert r.returncode == 0, r.stderr
    r = tfooc("convert", tns, tmp_path / "g.zarr", "--chunk-nnz", "4096")
    assert r.returncode == 0, r.stderr
    assert "20,000 nonzeros" in r.stdout and "converting" in r.stderr  # logs say what happens
    r = tfooc("info", tmp_path / "g.zarr", "--json")
    info = json.loads(r.stdout)
    assert info["nnz"] == 20000 and info["shape"] == [30, 40, 50, 6] and info["chunks"] == 5
    r = tfooc("info", tmp_path / "g.zarr")
    assert "bytes/nonzero" in r.stdout and "chunk span" in r.stdout and "fast" in r.stdout
    r = tfooc("convert", tns, tmp_path / "small.zarr", "--compression", "small")
    assert r.returncode == 0, r.stderr
    assert json.loads(tfooc("info", tmp_path / "small.zarr", "--json").stdout)["compression"] == "small"
    r = tfooc("convert", tns, tmp_path / "raw.zarr", "--compression", "none")
    assert r.returncode == 0, r.stderr
    assert json.loads(tfooc("info", tmp_path / "raw.zarr", "--json").stdout)["compression"] == "none"
    r = tfooc("convert", tns, tmp_path / "bad.zarr", "--compression", "gzip")
    assert r.returncode != 0 and "invalid choice" in r.stderr and not (tmp_path / "bad.zarr").exists()


def test_generate_store_and_planted(tmp_path):
    r = tfooc("-q", "generate", tmp_path / "s.zarr", "--shape", "20x30x40", "--nnz", "5000")
    assert r.returncode == 0, r.stderr
    r = tfooc(
        "-q",
        "generate",
        tmp_path / "p.tns",
        "--kind",
        "planted",
        "--shape",
        "20,30,40",
        "--nnz",
        "3000",
        "--rank",
        "4",
        "--noise",
        "0.05",
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.factors.npz").exists()
    assert tfooc("-q", "convert", tmp_path / "p.tns", tmp_path / "p.zarr").returncode == 0


@pytest.mark.parametrize(
    "content, message",
    [
        ("1 1 1 1.0\n1 1\n", "line 2: expected 4 columns"),
        ("1 1 1 1.0\n0 1 1 1.0\n", "line 2: column 1: index 0 is out of range"),
        ("1 1 1 nan\n", "line 1: column 4: value 'nan' is not finite"),
        ("", "empty"),
    ],
)
def test_bad_input_one_line_nonzero_exit(tmp_path, content, message):
    (tmp_path / "bad.tns").write_text(content)
    r = tfooc("-q", "convert", tmp_path / "bad.tns", tmp_path / "bad.zarr")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr and "bad.tns" in r.stderr
    assert not (tmp_path / "bad.zarr").exists()


def test_bad_arguments_and_stores(tmp_path):
    r = tfooc("convert", tmp_path / "missing.tns", tmp_path / "x.zarr")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = tfooc("info", tmp_path / "nothing.zarr")
    assert r.returncode == 2 and "no such store" in r.stderr
    r = tfooc("convert", "a.tns", "b.zarr", "--memory-limit", "lots")
    assert r.returncode == 2 and "not a size" in r.stderr


@pytest.mark.parametrize("cmd", [[], ["generate"], ["convert"], ["info"], ["quickstart"], ["cpd"]])
def test_help_is_complete(cmd):
    r = tfooc(*cmd, "--help")
    assert r.returncode == 0 and "usage: tfooc" in r.stdout
    for opt in {
        "convert": [
            "--memory-limit",
            "--duplicates",
            "--zero-based",
            "--shape",
            "--chunk-nnz",
            "--max-block-nnz",
            "--overwrite",
        ],
        "generate": ["--like", "--kind", "--rank", "--noise", "--skew", "--values", "--seed"],
    }.get(cmd[0] if cmd else "", []):
        assert opt in r.stdout


def test_cpd_and_resume(tmp_path):
    assert tfooc("-q", "generate", tmp_path / "s.zarr", "--shape", "20,30,40", "--nnz", "6000").returncode == 0
    r = tfooc(
        "cpd",
        tmp_path / "s.zarr",
        "--rank",
        "3",
        "--max-iters",
        "4",
        "--tol",
        "0",
        "--seed",
        "1",
        "--out",
        tmp_path / "r.zarr",
        "--scheduler",
        "embedded",
    )
    assert r.returncode == 0, r.stderr
    assert "fit" in r.stdout and "per iteration" in r.stdout and str(tmp_path / "r.zarr") in r.stdout
    assert "first iter" in r.stdout and "of which       MTTKRP" in r.stdout
    assert "dashboard at" in r.stderr
    r2 = tfooc(
        "-q",
        "cpd",
        tmp_path / "s.zarr",
        "--rank",
        "3",
        "--max-iters",
        "6",
        "--tol",
        "0",
        "--seed",
        "1",
        "--out",
        tmp_path / "r.zarr",
        "--resume",
    )
    assert r2.returncode == 0, r2.stderr
    assert "after 6 iterations" in r2.stdout and "2 iterations in this run" in r2.stdout
    bad = tfooc("cpd", tmp_path / "s.zarr", "--rank", "0")
    assert bad.returncode == 2


def test_cpd_on_gpu_device(tmp_path):
    """``--device gpu`` runs MTTKRP on GPU workers (the CUDA simulator here, inherited from conftest)."""
    from tensorflow_ooc.kernels.gpu.device import gpu_unavailable

    assert tfooc("-q", "generate", tmp_path / "s.zarr", "--shape", "6,7,5", "--nnz", "40").returncode == 0
    r = tfooc(
        "cpd",
        tmp_path / "s.zarr",
        "--rank",
        "2",
        "--max-iters",
        "2",
        "--tol",
        "0",
        "--seed",
        "1",
        "--device",
        "gpu",
        "--conflict",
        "register",
        "--streams",
        "2",
        "--execution",
        "streaming",
        "--device-memory-limit",
        "64MiB",
    )
    if gpu_unavailable():
        assert r.returncode != 0 and "no Dask worker can run GPU kernels" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert "on gpu" in r.stdout and "after 2 iterations" in r.stdout
