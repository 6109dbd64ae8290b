import os
import shutil
import subprocess

import numpy as np
import pytest

os.environ.setdefault("NUMBA_NUM_THREADS", "2")
# Dask's worker profiler calls sys._current_frames() every 10 ms; on CPython 3.11 a GC callback run
# inside it can deadlock a thread being started (the CUDA simulator starts one per CUDA thread):
# see docs/TESTING.md. Workers and CLI subprocesses inherit this.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "False")
# GPU kernels run in numba's CUDA simulator unless a GPU is visible (tiny inputs only: one Python
# thread per CUDA thread). CPU kernels are unaffected; set before anything imports numba.cuda.
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process more than the cores. Many tests wait (worker processes and
    clusters starting, CLI subprocesses importing, locks and heartbeats): on 2 cores, 3 processes
    kept both busy (1.95 cores on average) and the suite took 14.9 min where 2 took 21 (docs/TESTING.md)."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(scope="module")
def client():
    """An in-process one-worker, one-thread Dask cluster, shared by a test module's tests."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        yield c


def _worker_processes(n):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def two_workers():
    """A cluster of two one-thread worker processes, shared by a test module's tests."""
    yield from _worker_processes(2)


@pytest.fixture(scope="module")
def three_workers():
    """A cluster of three one-thread worker processes, shared by a test module's tests."""
    yield from _worker_processes(3)


def fixed(K):
    """A pyttb ktensor in canonical form (components sorted by weight, signs fixed), for comparing."""
    K.arrange()
    return K.fixsigns()


@pytest.fixture
def rng():
    """Fresh random inputs every run; the seed is printed on failure for reproduction."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed = {seed}")
    return np.random.default_rng(seed)


def random_coo(rng, shape, nnz):
    """Distinct random coordinates (nnz, N) and float64 values."""
    shape = tuple(int(s) for s in shape)
    cells = 1
    for s in shape:
        cells *= s
    nnz = min(nnz, cells)
    coords = np.zeros((0, len(shape)), dtype=np.int64)
    while coords.shape[0] < nnz:
        more = np.stack([rng.integers(0, s, 2 * nnz) for s in shape], axis=1)
        coords = np.unique(np.concatenate([coords, more]), axis=0)
    coords = coords[rng.permutation(coords.shape[0])[:nnz]]
    return coords, rng.standard_normal(nnz)


def sort_rows(coords, values):
    order = np.lexsort(coords.T[::-1])
    return coords[order], values[order]


@pytest.fixture
def full_share(tmp_path):
    """``storage/shared``: a 64 kB tmpfs filled to the last byte by a ballast file (a transient
    failure: the step fails with "no space left" until the ballast goes)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    share = tmp_path / "storage" / "shared"
    share.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(share)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    ballast = share / "ballast"
    try:
        with open(ballast, "wb") as f:
            while True:
                f.write(b"x" * 1024)
                f.flush()
    except OSError:
        pass
    try:
        yield ballast
    finally:
        subprocess.run(["umount", "-l", str(share)], check=False)
