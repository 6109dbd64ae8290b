"""Chunk files mapped on 2 MiB pages: a mode-sorted copy cached in 4 KiB pages is read back in
2 MiB folios, and streamed MTTKRP from it still gives the dense reference."""

import mmap
import os

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.execution.mode_copies_build import build_mode_copies
from tensorflow_ooc.execution.sorted_stream import copy_for
from tensorflow_ooc.kernels import StackedFactors

MIB2 = 2 << 20


def _pmd_kib(path, advise=False, drop=False) -> int:
    """FilePmdMapped (from /proc/self/smaps) of a fresh private mapping of ``path`` after every
    page is touched: the file's page cache in 2 MiB folios. ``drop``: its cache dropped first;
    ``advise``: the mapping advised MADV_HUGEPAGE, so cold faults read 2 MiB folios; without it
    they read 4 KiB pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    if advise:
        mm.madvise(mmap.MADV_HUGEPAGE)
    pages = np.frombuffer(mm, dtype=np.uint8)
    int(pages[:: mmap.PAGESIZE].sum())
    start = format(pages.ctypes.data, "x")
    with open("/proc/self/smaps") as f:
        vma = f.read().split("\n" + start + "-")[1]
    del pages
    mm.close()
    line = next(ln for ln in vma.splitlines() if ln.startswith("FilePmdMapped:"))
    return int(line.split()[1])


@pytest.fixture
def large_folios(tmp_path):
    """Skip where this kernel and file system cache no 2 MiB folios for an advised mapping."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"):
        pytest.skip("no MADV_HUGEPAGE or /proc/self/smaps")
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(2 * MIB2))
    os.sync()  # written back, so the drop takes the pages
    if _pmd_kib(probe, advise=True, drop=True) == 0:
        pytest.skip("this kernel or file system caches no 2 MiB folios")


def test_a_copy_on_small_pages_is_read_back_on_2mib_pages(rng, tmp_path, large_folios):
    nmodes = int(rng.integers(3, 6))
    # short modes (long runs: their copies are streamed) and a long last one; chunks of 2^18
    # nonzeros, so each chunk file of a copy spans one whole 2 MiB range
    shape = tuple(int(s) for s in rng.integers(4, 7, nmodes - 1)) + (int(rng.integers(30000, 40000)) // nmodes,)
    coords, values = random_coo(rng, shape, 600_000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=1 << 18, compression="fast")
    store = build_mode_copies(store, "all")
    os.sync()
    files = sorted(p for p in (tmp_path / "t.zarr" / "sorted").glob("m*/[iv]*/c/*") if p.stat().st_size >= MIB2)
    # the copies' cache made 4 KiB pages, as an unadvised mapping or read() leaves it
    for p in files:
        assert _pmd_kib(p, drop=True) == 0
    store = tfo.open_store(store.path)
    streamed = [m for m in range(nmodes) if copy_for(store, m) is not None]
    assert streamed
    R = int(rng.choice([8, 16]))
    factors = [rng.standard_normal((s, R)) for s in shape]
    for m in range(nmodes):
        for threads in (1, 2):
            got = tfo.mttkrp(store, StackedFactors.from_list(factors), m, threads=threads)
            assert rel_err(got, dense_mttkrp(shape, coords, values, factors, m)) < 1e-12
    # every whole 2 MiB range of the streamed copies' files now cached in a 2 MiB folio
    for p in files:
        if int(p.parts[-4][1:]) in streamed:
            assert _pmd_kib(p) == (p.stat().st_size // MIB2) * 2048, p
