"""Nothing of the user's is ever destroyed (issue 45): outputs that cannot hit inputs, --overwrite
that replaces only what this package wrote, one writer per output, every OS error one line.

Each test runs the real CLI (in this process, or as a subprocess where a second process or lost
privileges are the point) on a fresh random store and checks that the input is byte for byte what
it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.errors import DestinationError, OutputLockedError
from tensorflow_ooc.store.destinations import holding
from tensorflow_ooc.store.output_lock import LOCK_SUFFIX, OutputLock, lock_path


def digest(path: Path) -> str:
    """A hash of everything under ``path`` (names and bytes): equal means untouched."""
    h = hashlib.sha256()
    if path.is_file():
        h.update(path.read_bytes())
        return h.hexdigest()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def tensor(tmp_path, rng):
    """A fresh random count tensor as a .tns file and a store (values >= 1, so CP-APR takes it)."""
    shape = (int(rng.integers(6, 12)), int(rng.integers(5, 10)), int(rng.integers(4, 9)))
    flat = rng.choice(int(np.prod(shape)), size=120, replace=False)
    coords = np.stack(np.unravel_index(flat, shape), axis=1)
    values = rng.integers(1, 5, size=coords.shape[0]).astype(np.float64)
    tns = tmp_path / "X.tns"
    tns.write_text("".join(" ".join(str(i + 1) for i in c) + f" {v:g}\n" for c, v in zip(coords, values)))
    store = tmp_path / "X.zarr"
    tfo.convert(str(tns), str(store), shape=shape)
    return tns, store


def run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, err


COMMANDS = {
    "cpd": ["cpd", "--rank", "2", "--max-iters", "2"],
    "tt": ["tt", "--ranks", "2", "--max-sweeps", "2"],
    "apr": ["apr", "--rank", "2", "--max-iters", "2"],
    "tucker": ["tucker", "--ranks", "2", "--max-iters", "2"],
}


def argv(cmd: str, store: Path, *extra) -> list:
    name, *opts = COMMANDS[cmd]
    return [name, store, *opts, *extra]


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
@pytest.mark.parametrize("overwrite", [True, False])
def test_a_decomposition_never_writes_over_its_input(tmp_path, tensor, capsys, cmd, overwrite):
    _, store = tensor
    before = digest(store)
    code, err = run(capsys, "-q", *argv(cmd, store, "--out", store, *(["--overwrite"] if overwrite else [])))
    assert code == 2, err
    assert "is the input store" in err and "earlier run" not in err and err.count("\n") == 1
    assert digest(store) == before and tfo.open_store(str(store)).nnz == 120
    # a path through a symlink or '..' is the same place
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.zarr").symlink_to(store)
    for alias in (tmp_path / "link.zarr", tmp_path / "sub" / ".." / "X.zarr"):
        code, err = run(capsys, "-q", *argv(cmd, store, "--out", alias, "--overwrite"))
        assert code == 2 and "is the input store" in err, err
    # a result inside the input, or a folder holding it
    code, err = run(capsys, "-q", *argv(cmd, store, "--out", store / "inner.zarr", "--overwrite"))
    assert code == 2 and "lies inside the input store" in err, err
    code, err = run(capsys, "-q", *argv(cmd, store, "--out", tmp_path, "--overwrite"))
    assert code == 2 and "contains the input store" in err, err
    assert digest(store) == before


@pytest.mark.parametrize("overwrite", [True, False])
def test_a_checkpoint_never_writes_over_the_input(tensor, capsys, overwrite):
    _, store = tensor
    before = digest(store)
    code, err = run(
        capsys, "-q", "cpd", store, "--rank", "2", "--checkpoint", store, *(["--overwrite"] if overwrite else [])
    )
    assert code == 2 and "--checkpoint path is the input store" in err, err
    assert "--overwrite to start over" not in err  # no advice that would delete the input
    assert digest(store) == before


def test_the_api_refuses_outputs_over_inputs(tensor):
    tns, store = tensor
    before = digest(store)
    s = tfo.open_store(str(store))
    calls = {
        "cp_als": lambda **kw: tfo.cp_als(s, 2, max_iters=1, **kw),
        "cp_apr": lambda **kw: tfo.cp_apr(s, 2, max_iters=1, **kw),
        "tt_als": lambda **kw: tfo.tt_als(s, 2, max_sweeps=1, **kw),
        "tucker_hooi": lambda **kw: tfo.tucker_hooi(s, 2, max_iters=1, **kw),
        "tucker_sgd": lambda **kw: tfo.tucker_sgd(s, 2, 2, epochs=1, **kw),
    }
    for name, call in calls.items():
        with pytest.raises(DestinationError, match="is the input store"):
            call(out=str(store), overwrite=True)
        if name in ("cp_als", "cp_apr", "tt_als", "tucker_hooi"):
            with pytest.raises(DestinationError, match="checkpoint path is the input store"):
                call(checkpoint=str(store))
    with pytest.raises(DestinationError, match="is the input source"):
        tfo.convert(str(tns), str(tns), overwrite=True)
    with pytest.raises(DestinationError, match="lies inside the input source"):
        tfo.rewrite(str(store), str(store / "again.zarr"), overwrite=True)
    assert digest(store) == before


def test_convert_never_replaces_its_input_file(tensor, capsys):
    tns, _ = tensor
    before = digest(tns)
    for extra in (["--overwrite"], []):
        code, err = run(capsys, "-q", "convert", tns, tns, *extra)
        assert code == 2 and "is the input source" in err, err
        assert tns.is_file() and digest(tns) == before


def test_overwrite_replaces_only_what_this_package_wrote(tmp_path, tensor, capsys):
    tns, store = tensor
    docs = tmp_path / "mydocs"
    docs.mkdir()
    (docs / "notes.txt").write_text("a user's notes")
    plain = tmp_path / "plain.txt"
    plain.write_text("a user's file")
    foreign_zarr = tmp_path / "foreign.zarr"
    foreign_zarr.mkdir()
    (foreign_zarr / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    kept = {p: digest(p) for p in (docs, plain, foreign_zarr)}
    for target in (docs, plain, foreign_zarr):
        code, err = run(capsys, "-q", "convert", tns, target, "--overwrite")
        assert code == 2 and "overwrite replaces only what tensorflow_ooc wrote" in err, err
        code, err = run(capsys, "-q", "cpd", store, "--rank", "2", "--out", target, "--overwrite")
        assert code == 2 and "holds" in err, err
        code, err = run(capsys, "-q", "cpd", store, "--rank", "2", "--checkpoint", target, "--overwrite")
        assert code == 2 and "holds" in err, err
    code, err = run(capsys, "-q", "convert", tns, docs)  # without --overwrite: says what is there, no advice to
    assert code == 2 and "notes.txt" in err and "--overwrite" not in err, err
    assert {p: digest(p) for p in kept} == kept
    # what this package wrote is replaced: a store, a result, a checkpoint, an empty folder
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "copy.zarr", tmp_path / "empty"):
        assert run(capsys, "-q", "convert", tns, target)[0] in (0, 2)
        code, err = run(capsys, "-q", "convert", tns, target, "--overwrite")
        assert code == 0, err
        assert holding(target).kind == "store"
    out = tmp_path / "r.zarr"
    for _ in range(2):
        code, err = run(capsys, "-q", "cpd", store, "--rank", "2", "--max-iters", "2", "--out", out, "--overwrite")
        assert code == 0, err
    assert holding(out).kind == "result" and holding(f"{out}.checkpoint.npz").kind == "checkpoint"
    # an earlier result without --overwrite: the message says what it is
    code, err = run(capsys, "-q", "cpd", store, "--rank", "2", "--out", out)
    assert code == 2 and "holds a CP result written by tensorflow_ooc" in err, err


def test_the_api_refuses_to_replace_what_it_did_not_write(tmp_path, tensor):
    tns, store = tensor
    plain = tmp_path / "plain.txt"
    plain.write_text("keep me")
    with pytest.raises(DestinationError, match="ordinary file"):
        tfo.convert(str(tns), str(plain), overwrite=True)
    with pytest.raises(DestinationError, match="ordinary file"):
        tfo.cp_als(str(store), 2, max_iters=1, out=str(plain), overwrite=True)
    with pytest.raises(DestinationError, match="ordinary file"):
        tfo.cp_als(str(store), 2, max_iters=1, checkpoint=str(plain))
    assert plain.read_text() == "keep me"


HOLDER = textwrap.dedent(
    """
    import sys, time
    from tensorflow_ooc.store.output_lock import OutputLock
    with OutputLock([sys.argv[1]], "a cpd run of the test"):
        print("held", flush=True)
        time.sleep(120)
    """
)


def hold(path: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_one_writer_per_output(tmp_path, tensor, capsys):
    tns, store = tensor
    out = tmp_path / "r.zarr"
    holder = hold(out)
    try:
        code, err = run(capsys, "-q", "cpd", store, "--rank", "2", "--out", out)
        assert code == 2 and f"PID {holder.pid}" in err and socket.gethostname() in err, err
        with pytest.raises(OutputLockedError, match=f"PID {holder.pid}"):
            tfo.cp_als(str(store), 2, max_iters=1, out=str(out))
        with pytest.raises(OutputLockedError):
            tfo.convert(str(tns), str(out))
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    # its holder killed (SIGKILL leaves the lock file): taken over at once on this host
    assert Path(lock_path(out)).exists()
    code, err = run(capsys, "-q", "cpd", store, "--rank", "2", "--max-iters", "2", "--out", out)
    assert code == 0, err
    assert not Path(lock_path(out)).exists() and holding(out).kind == "result"


def test_two_cli_runs_at_once_one_is_refused(tmp_path, tensor):
    _, store = tensor
    out = tmp_path / "same.zarr"
    cmd = [sys.executable, "-m", "tensorflow_ooc.cli", "-q", "cpd", str(store), "--rank", "2", "--out", str(out)]
    first = subprocess.Popen([*cmd, "--max-iters", "400", "--tol", "0"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not Path(lock_path(out)).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run([*cmd, "--max-iters", "2"], capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and f"PID {first.pid}" in second.stderr, second.stderr
    finally:
        first.wait(timeout=600)
    assert first.returncode == 0, first.stderr
    assert tfo.load_result(str(out)).iterations >= 2


def test_a_lock_from_another_host_waits_for_its_heartbeat(tmp_path, monkeypatch):
    out = tmp_path / "r.zarr"
    lock = Path(lock_path(out))
    stale = {"purpose": "a run elsewhere", "host": "another-host", "pid": 1, "user": "u", "started": 0, "token": "t"}
    lock.write_text(json.dumps({**stale, "heartbeat": time.time()}))
    with pytest.raises(OutputLockedError, match="another-host"):
        OutputLock([out], "this run").acquire()
    monkeypatch.setenv("TFOOC_LOCK_STALE_S", "5")
    lock.write_text(json.dumps({**stale, "heartbeat": time.time() - 60}))
    with OutputLock([out], "this run"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_run_restarted_in_its_thread_takes_its_own_lock_again(tmp_path):
    out = tmp_path / "r.zarr"
    with OutputLock([out], "outer"), OutputLock([out], "inner"):
        assert Path(lock_path(out)).exists()
    assert not Path(lock_path(out)).exists()
    assert not list(tmp_path.glob(f"*{LOCK_SUFFIX}"))


def _without_permission_override() -> list[str] | None:
    """A command prefix that runs without root's permission override (None: not possible here)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_permission_denied_is_one_line(tmp_path, tensor):
    prefix = _without_permission_override()
    if prefix is None:
        pytest.skip("root without setpriv: permissions cannot be denied here")
    tns, store = tensor
    locked_dir = tmp_path / "locked"
    locked_dir.mkdir()
    locked_dir.chmod(0o555)
    try:
        for args in (
            ["convert", str(tns), str(locked_dir / "Y.zarr")],
            ["cpd", str(store), "--rank", "2", "--out", str(locked_dir / "r.zarr")],
            ["generate", str(locked_dir / "g.tns"), "--shape", "4,4,4", "--nnz", "10"],
        ):
            r = subprocess.run(
                [*prefix, sys.executable, "-m", "tensorflow_ooc.cli", "-q", *args], capture_output=True, text=True
            )
            assert r.returncode == 1, r.stderr
            assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
            assert r.stderr.startswith("tfooc: error: ") and "permission denied" in r.stderr, r.stderr
            assert list(locked_dir.iterdir()) == []
    finally:
        locked_dir.chmod(0o755)


def test_read_only_file_system_is_one_line(tmp_path, tensor):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only file system needs root")
    tns, store = tensor
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("this machine does not let the test mount a tmpfs")
    try:
        for args in (
            ["convert", str(tns), str(ro / "Y.zarr")],
            ["cpd", str(store), "--rank", "2", "--out", str(ro / "r.zarr")],
            ["--log-format", "json", "convert", str(tns), str(ro / "Y.zarr")],
        ):
            r = subprocess.run(
                [sys.executable, "-m", "tensorflow_ooc.cli", "-q", *args], capture_output=True, text=True
            )
            assert r.returncode == 1, r.stderr
            assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
            assert "read-only file system" in r.stderr, r.stderr
            if "json" in args:
                assert json.loads(r.stderr)["level"] == "ERROR"
        assert list(ro.iterdir()) == []
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_paths_through_a_file_and_names_too_long_are_one_line(tmp_path, tensor, capsys):
    tns, store = tensor
    for target in (tns / "under-a-file.zarr", tmp_path / ("n" * 300 + ".zarr")):
        code, err = run(capsys, "-q", "convert", tns, target)
        assert code in (1, 2) and err.startswith("tfooc: error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err


def test_a_workflow_step_never_writes_over_its_input(tmp_path, tensor, capsys):
    tns, _ = tensor
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(tns, root / "in.tns")
    before = digest(root / "in.tns")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            """\
            name: self-output
            steps:
              convert:
                kind: convert
                input: in.tns
                out: in.tns
            """
        )
    )
    code, err = run(capsys, "validate", spec, "--storage", root)
    assert code == 2 and "in.tns" in err and "would destroy it" in err and "line 6" in err, err
    code, err = run(capsys, "-q", "run", spec, "--storage", root)
    assert code == 2 and "would destroy it" in err, err
    assert digest(root / "in.tns") == before


@pytest.mark.parametrize("url", ["memory://lock-test-{}", "memory://bucket/dir/lock-test-{}.zarr"])
def test_locks_of_urls_stay_in_their_file_system(tmp_path, monkeypatch, rng, url):
    """Before: memory://x's lock went to a local folder named 'memory:' in the working directory."""
    import fsspec

    monkeypatch.chdir(tmp_path)
    out = url.format(rng.integers(2**62))
    lock = lock_path(out)
    assert lock.startswith("memory://") and lock.endswith(LOCK_SUFFIX) and "/." in lock
    with OutputLock([out], "a run"):
        assert fsspec.filesystem("memory").exists(lock.split("://", 1)[1])
        refused = []

        def another_run() -> None:  # another thread: not a re-entry of this one's lock
            try:
                OutputLock([out], "another run").acquire()
            except OutputLockedError as exc:
                refused.append(exc)

        t = threading.Thread(target=another_run)
        t.start()
        t.join()
        assert refused
    assert not fsspec.filesystem("memory").exists(lock.split("://", 1)[1])
    assert list(tmp_path.iterdir()) == []
