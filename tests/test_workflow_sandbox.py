"""Specs stay in their sandbox: paths are checked with their symbolic links resolved, a spec's
``allow_paths`` can only narrow what the operator allows (command line, ``$TFOOC_ALLOW_PATHS``, the
config file), and a ``cluster:`` address nobody answers at is refused before anything runs."""

import os
import socket

import pytest

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec
from tensorflow_ooc.workflow.runner import execute

SPEC = """\
name: sandboxed{head}
steps:
  generate:
    kind: generate
    out: {out}
    shape: [6, 7, 8]
    nnz: 40
"""


@pytest.fixture(autouse=True)
def _no_operator_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("TFOOC_ALLOW_PATHS", raising=False)
    monkeypatch.delenv("TFOOC_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))


@pytest.fixture
def dirs(tmp_path):
    storage, outside = tmp_path / "storage", tmp_path / "outside"
    storage.mkdir()
    outside.mkdir()
    return storage, outside


def _spec(tmp_path, out="t.tns", head=""):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(out=out, head=head))
    return path


def _line(path, needle):
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_output_through_a_symlink_out_of_the_root_is_refused(tmp_path, dirs, capsys):
    storage, outside = dirs
    (storage / "link").symlink_to(outside, target_is_directory=True)
    path = _spec(tmp_path, out="link/t.tns")
    with pytest.raises(SpecError) as info:
        load_spec(path, storage=str(storage))
    p = info.value.problems[0]
    assert p.field == "steps.generate.out" and p.line == _line(path, "out: link/t.tns"), str(info.value)
    assert "symbolic link" in p.message and str(outside) in p.message
    assert main(["run", str(path), "--storage", str(storage)]) == 2
    assert f"line {p.line}: steps.generate.out" in capsys.readouterr().err
    assert list(outside.iterdir()) == [] and not (storage / ".tfooc").exists()
    # an absolute path naming the same place through the link: the same refusal
    path = _spec(tmp_path, out=f"{storage}/link/t.tns")
    with pytest.raises(SpecError, match="symbolic link"):
        load_spec(path, storage=str(storage))
    # a link that stays inside the root is fine
    (storage / "inside").mkdir()
    (storage / "in-link").symlink_to(storage / "inside", target_is_directory=True)
    assert load_spec(_spec(tmp_path, out="in-link/t.tns"), storage=str(storage)).step("generate")


def test_a_symlink_made_after_the_check_is_refused_when_the_step_runs(tmp_path, dirs):
    storage, outside = dirs
    wf = load_spec(_spec(tmp_path, out="later/t.tns"), storage=str(storage))
    (storage / "later").symlink_to(outside, target_is_directory=True)
    out = execute(wf)
    assert out.exit_code == 1 and "outside the storage root" in out.record.error
    assert list(outside.iterdir()) == []


def test_a_spec_cannot_widen_its_own_sandbox(tmp_path, dirs, capsys):
    storage, outside = dirs
    path = _spec(tmp_path, out=f"{outside}/t.tns", head="\nallow_paths: [/]")
    with pytest.raises(SpecError) as info:
        load_spec(path, storage=str(storage))
    first = info.value.problems[0]
    assert (first.line, first.field) == (2, "allow_paths.0"), str(info.value)
    assert "not inside a folder the operator allows" in first.message and "--allow-path" in first.message
    assert main(["run", str(path), "--storage", str(storage)]) == 2
    assert "line 2: allow_paths.0" in capsys.readouterr().err
    assert list(outside.iterdir()) == []
    # '/' stays refused even when the operator allows a folder: the spec may only narrow it
    with pytest.raises(SpecError, match="allow_paths.0"):
        load_spec(path, storage=str(storage), allow_paths=[str(outside)])


@pytest.mark.parametrize("how", ["command-line", "environment", "config-file"])
def test_the_operator_allows_folders_and_a_spec_narrows_them(tmp_path, dirs, monkeypatch, capsys, how):
    storage, outside = dirs
    (outside / "a").mkdir()
    (outside / "b").mkdir()
    extra = []
    if how == "command-line":
        extra = ["--allow-path", str(tmp_path / "elsewhere"), "--allow-path", str(outside)]
    elif how == "environment":
        monkeypatch.setenv("TFOOC_ALLOW_PATHS", os.pathsep.join([str(tmp_path / "elsewhere"), str(outside)]))
    else:
        config = tmp_path / "ops.yaml"
        config.write_text(f"allow_paths:\n  - {tmp_path / 'elsewhere'}\n  - {outside}\n")
        monkeypatch.setenv("TFOOC_CONFIG", str(config))
    run = ["run", "--storage", str(storage)] + extra
    # no allow_paths in the spec: every folder the operator allows
    ok = _spec(tmp_path, out=f"{outside}/a/t.tns")
    assert main(run + [str(ok)]) == 0
    assert (outside / "a" / "t.tns").exists()
    # the spec narrows the operator's folders to outside/b: outside/a is refused now
    narrowed = _spec(tmp_path, out=f"{outside}/a/u.tns", head=f"\nallow_paths: [{outside}/b]")
    capsys.readouterr()
    assert main(run + [str(narrowed)]) == 2
    err = capsys.readouterr().err
    assert "steps.generate.out" in err and "outside the storage root" in err
    assert not (outside / "a" / "u.tns").exists()
    inside = _spec(tmp_path, out=f"{outside}/b/t.tns", head=f"\nallow_paths: [{outside}/b]")
    assert main(run + [str(inside)]) == 0
    # and without the operator's permission the same spec is refused
    monkeypatch.delenv("TFOOC_ALLOW_PATHS", raising=False)
    monkeypatch.delenv("TFOOC_CONFIG", raising=False)
    capsys.readouterr()
    assert main(["run", "--storage", str(storage), str(inside)]) == 2
    assert "allow_paths.0" in capsys.readouterr().err


def test_a_bad_operator_config_is_an_error(tmp_path, dirs, monkeypatch):
    storage, _ = dirs
    config = tmp_path / "ops.yaml"
    config.write_text("allow_paths: [relative/folder]\n")
    monkeypatch.setenv("TFOOC_CONFIG", str(config))
    with pytest.raises(SpecError) as info:
        load_spec(_spec(tmp_path), storage=str(storage))
    assert str(config) in str(info.value) and info.value.problems[0].field == "allow_paths.0"
    monkeypatch.setenv("TFOOC_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(SpecError, match="no such config file"):
        load_spec(_spec(tmp_path), storage=str(storage))


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_an_unreachable_cluster_is_refused_before_anything_runs(tmp_path, dirs, capsys):
    storage, _ = dirs
    address = f"tcp://127.0.0.1:{_dead_port()}"
    path = _spec(tmp_path, head=f"\ncluster: {address}")
    assert main(["run", str(path), "--storage", str(storage)]) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 2: cluster: the Dask scheduler at {address} cannot be reached" in err, err
    assert not (storage / "t.tns").exists() and not (storage / ".tfooc").exists()
    # the command line's --scheduler is checked the same way, and named
    plain = _spec(tmp_path)
    assert main(["run", str(plain), "--storage", str(storage), "--scheduler", address]) == 2
    assert f"--scheduler: the Dask scheduler at {address} cannot be reached" in capsys.readouterr().err
    assert not (storage / "t.tns").exists()


def test_a_reachable_cluster_address_passes_the_check(tmp_path, dirs):
    storage, _ = dirs
    with socket.socket() as server:  # something listens: the step (run in the driver) goes on
        server.bind(("127.0.0.1", 0))
        server.listen()
        path = _spec(tmp_path, head=f"\ncluster: tcp://127.0.0.1:{server.getsockname()[1]}")
        assert main(["run", str(path), "--storage", str(storage)]) == 0
    assert (storage / "t.tns").exists()
