"""Full disks, on real file systems: a disk that fills during ``convert`` (in memory, and out of
core with its buckets on the full disk), during a CP-ALS checkpoint, during the result write, or
under a workflow's storage root gives one ``tfooc: error:`` line (or the run's failure line) that
names the path and "no space", exit status 1, no traceback, no temporary file left, and nothing
on the full disk that opens as a store or a result.

The small disk is a tmpfs of a few hundred kB mounted in the test's tmp dir: directly when the
tests run as root (CI), else inside a user and mount namespace (``unshare -rm``), where the whole
scenario (mount, command, checks) runs in a child process. Without either they are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


def _cli(args: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def _collect(disk: Path, argv: list[str], opens: list[list[str]]) -> dict:
    """Run ``tfooc argv`` ("{disk}" replaced), then list what is left on the disk and try to open
    ``opens`` ([kind, path]: kind "store" or "result")."""
    fill = lambda s: s.replace("{disk}", str(disk))  # noqa: E731
    r = _cli([fill(a) for a in argv])
    left = sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))
    records = [json.loads(p.read_text()) for p in disk.rglob("record.json") if ".tfooc" in p.parts]
    opened = {}
    for kind, path in opens:
        path = fill(path)
        try:
            if kind == "store":
                from tensorflow_ooc.store import open_store

                open_store(path)
            else:
                from tensorflow_ooc import load_result

                load_result(path)
            opened[path] = "opened"
        except Exception as exc:  # the refusal we want, or the path does not exist
            opened[path] = f"{type(exc).__name__}: {exc}"
    return {
        "disk": str(disk),
        "rc": r.returncode,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "left": left,
        "records": records,
        "opened": opened,
        "free": shutil.disk_usage(disk).free,
    }


def _mount(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True, capture_output=True)


def _can_mount_here(tmp: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount") or os.environ.get("TFOOC_TEST_FULL_DISK_UNSHARE"):
        return False
    probe = tmp / "probe"
    probe.mkdir()
    try:
        _mount(probe, "64k")
    except (subprocess.CalledProcessError, OSError):
        return False
    subprocess.run(["umount", str(probe)], check=False)
    return True


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d; rmdir $d"],
        capture_output=True,
    )
    return r.returncode == 0


@pytest.fixture(scope="module")
def tiny_disk(tmp_path_factory):
    """``run(size, argv, opens)``: the scenario on a fresh tmpfs of ``size`` at ``{disk}``."""
    base = tmp_path_factory.mktemp("disks")
    direct = _can_mount_here(base)
    if not direct and not _can_unshare():
        pytest.skip("needs a small tmpfs: run as root (mount -t tmpfs) or where unshare -rm may mount one")
    count = [0]

    def run(size: str, argv: list[str], opens: list[list[str]] = ()) -> dict:
        count[0] += 1
        disk = base / f"disk{count[0]}"
        disk.mkdir()
        if direct:
            _mount(disk, size)
            try:
                return _collect(disk, argv, list(opens))
            finally:
                subprocess.run(["umount", str(disk)], check=False)
        spec = json.dumps({"disk": str(disk), "size": size, "argv": argv, "opens": list(opens)})
        r = subprocess.run(
            ["unshare", "-rm", sys.executable, str(HERE), spec],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 40 k-nonzero .tns (about 0.8 MB; its store about 0.45 MB) and its store, on a normal disk."""
    from tensorflow_ooc import synthetic
    from tensorflow_ooc.ingest import convert

    d = tmp_path_factory.mktemp("inputs")
    tns = d / "t.tns"
    synthetic.write_tns(tns, synthetic.iter_heavy_tailed((200, 300, 400), 40_000, seed=5))
    store = convert(str(tns), str(d / "t.zarr"), chunk_nnz=4096)
    return {"dir": d, "tns": str(tns), "store": store.path}


def _one_error_line(out: dict, *names: str) -> str:
    """The failure is one ``tfooc: error:`` line naming ``names`` and "no space", exit 1, no traceback."""
    err = out["stderr"]
    assert out["rc"] == 1, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("tfooc: error:")]
    assert len(lines) == 1, err
    assert "no space left on device" in lines[0], err
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert "needs about" in lines[0] and "free" in lines[0], lines[0]
    return lines[0]


def _refused(out: dict) -> None:
    for path, how in out["opened"].items():
        assert how != "opened", f"{path} opens as valid after a failed write"


def test_convert_in_memory_onto_a_full_disk(tiny_disk, inputs):
    out = tiny_disk(
        "200k",
        ["-q", "convert", inputs["tns"], "{disk}/out.zarr", "--chunk-nnz", "4096"],
        [["store", "{disk}/out.zarr"]],
    )
    line = _one_error_line(out, f"{out['disk']}/out.zarr")
    assert out["left"] == [], out["left"]  # no staging store, no half chunk
    _refused(out)
    # the store's size is named, against the space free once the partial store is gone
    assert "MB" in line or "kB" in line


def test_convert_out_of_core_with_buckets_on_a_full_disk(tiny_disk, inputs):
    store = str(inputs["dir"] / "ooc.zarr")
    out = tiny_disk(
        "128k",
        ["-q", "convert", inputs["tns"], store, "--chunk-nnz", "4096", "--out-of-core", "--tmp-dir", "{disk}/tmp"],
        [["store", store]],
    )
    _one_error_line(out, f"{out['disk']}/tmp/.tfooc-buckets-")
    assert [p for p in out["left"] if p != "tmp"] == [], out["left"]  # the bucket folder is gone
    _refused(out)
    assert not os.path.exists(store)


def test_convert_out_of_core_store_onto_a_full_disk(tiny_disk, inputs, tmp_path):
    # out of core, buckets on a roomy disk, the store on the small one: the merge+write phase fills it
    buckets = tmp_path / "buckets"
    out = tiny_disk(
        "200k",
        [
            "-q",
            "convert",
            inputs["tns"],
            "{disk}/ooc.zarr",
            "--chunk-nnz",
            "4096",
            "--out-of-core",
            "--tmp-dir",
            str(buckets),
        ],
        [["store", "{disk}/ooc.zarr"]],
    )
    _one_error_line(out, f"{out['disk']}/ooc.zarr")
    assert out["left"] == [], out["left"]
    assert list(buckets.iterdir()) == []  # the bucket folder is removed too
    _refused(out)


@pytest.mark.parametrize("scheduler", ["inline", "embedded"])
def test_cpd_checkpoint_onto_a_full_disk(tiny_disk, inputs, tmp_path, scheduler):
    # embedded: the checkpoint is written by a Dask worker, which would log a failed task's traceback
    result = str(tmp_path / "cp.zarr")
    out = tiny_disk(
        "64k",
        [
            "-q",
            "cpd",
            inputs["store"],
            "--rank",
            "16",
            "--max-iters",
            "3",
            "--out",
            result,
            "--checkpoint",
            "{disk}/cp.checkpoint.npz",
            "--scheduler",
            scheduler,
        ],
        [["result", result]],
    )
    _one_error_line(out, f"{out['disk']}/cp.checkpoint.npz")
    assert out["left"] == [], out["left"]  # no temporary checkpoint left on the full disk
    _refused(out)


def test_cpd_result_onto_a_full_disk(tiny_disk, inputs, tmp_path):
    out = tiny_disk(
        "48k",
        [
            "-q",
            "cpd",
            inputs["store"],
            "--rank",
            "16",
            "--max-iters",
            "2",
            "--out",
            "{disk}/cp.zarr",
            "--checkpoint",
            str(tmp_path / "cp.checkpoint.npz"),
        ],
        [["result", "{disk}/cp.zarr"]],
    )
    _one_error_line(out, f"{out['disk']}/cp.zarr")
    assert out["left"] == [], out["left"]  # no staging result store
    _refused(out)
    assert (tmp_path / "cp.checkpoint.npz").exists()  # the run can be resumed once there is space


def test_generate_tns_onto_a_full_disk(tiny_disk):
    out = tiny_disk(
        "200k",
        ["-q", "generate", "{disk}/g.tns", "--shape", "200,300,400", "--nnz", "40000"],
        [["store", "{disk}/g.tns"]],
    )
    _one_error_line(out, f"{out['disk']}/g.tns")
    assert out["left"] == [], out["left"]  # no .partial text file


def test_disk_full_error_crosses_processes_and_names_quota():
    import errno
    import pickle

    from tensorflow_ooc.disk import disk_full_error, is_disk_full
    from tensorflow_ooc.errors import DiskFullError, TfoocError

    e = DiskFullError("/x/y.zarr/alto/c/3", 12_300_000, 20_000_000, 900_000)
    assert str(e) == (
        "no space left on device writing /x/y.zarr/alto/c/3 (needs about 12.3 MB more, about "
        "20.0 MB in all, 900.0 kB free)"
    )
    assert isinstance(e, TfoocError) and isinstance(e, OSError) and e.errno == errno.ENOSPC and is_disk_full(e)
    back = pickle.loads(pickle.dumps(e))  # a checkpoint written on a Dask worker process
    assert type(back) is DiskFullError and str(back) == str(e) and back.path == e.path
    q = disk_full_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "/home/u/cp.npz", needed=2048)
    assert str(q).startswith("disk quota exceeded writing /home/u/cp.npz (needs about 2.0 kB")
    # an outer layer keeps the inner file and the larger figures
    outer = disk_full_error(DiskFullError("/d/b00001.bin", 500), "/d", needed=7_000_000)
    assert outer.path == "/d/b00001.bin" and outer.needed == 7_000_000
    assert not is_disk_full(OSError(errno.EACCES, "denied"))


SPEC = """\
name: full
steps:
  generate:
    kind: generate
    out: t.zarr
    shape: [200, 300, 400]
    nnz: 40000
    seed: 3
"""


def test_workflow_run_on_a_full_storage_root(tiny_disk, tmp_path):
    spec = tmp_path / "full.yaml"
    spec.write_text(SPEC)
    out = tiny_disk("160k", ["-q", "run", str(spec), "--storage", "{disk}"], [["store", "{disk}/t.zarr"]])
    err = out["stderr"]
    assert out["rc"] == 1, err
    assert "Traceback" not in err, err
    failed = [ln for ln in err.splitlines() if ln.startswith("tfooc: run ") and " failed: " in ln]
    assert len(failed) == 1 and "no space left on device" in failed[0] and "t.zarr" in failed[0], err
    assert not any(p.startswith("t.zarr") or ".partial-" in p or ".tmp-" in p for p in out["left"]), out["left"]
    _refused(out)
    (record,) = out["records"]
    assert record["state"] == "failed" and record["steps"]["generate"]["state"] == "failed"
    assert "no space left on device" in record["steps"]["generate"]["error"]


if __name__ == "__main__":  # the scenario inside a user and mount namespace (unshare -rm)
    job = json.loads(sys.argv[1])
    disk = Path(job["disk"])
    _mount(disk, job["size"])
    print(json.dumps(_collect(disk, job["argv"], job["opens"])))
