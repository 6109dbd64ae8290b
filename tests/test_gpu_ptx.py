"""The real-hardware form of every GPU kernel compiles without a GPU: PTX assembled for cc 8.0 and 9.0
by ptxas with no spills, with the warp intrinsics and atomics of the hardware path."""

import json
import os
import subprocess
import sys

import pytest

from tensorflow_ooc.kernels.gpu.device import cuda
from tensorflow_ooc.kernels.ptx_report import find_ptxas

pytestmark = [
    pytest.mark.skipif(cuda is None, reason="numba-cuda is not installed (pip install -e '.[gpu]')"),
    pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (pip install nvidia-cuda-nvcc-cu12)"),
]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptx") / "ptx.json"
    # a separate process: this one may run the CUDA simulator, which cannot compile PTX
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    res = subprocess.run(
        [sys.executable, "-m", "tensorflow_ooc.kernels.ptx_report", "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    return json.loads(out.read_text())


def test_every_variant_assembles_without_spills_for_both_ccs(rows):
    assert {r["cc"] for r in rows} == {"8.0", "9.0"}
    for r in rows:
        assert "error" not in r, r
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
        assert 0 < r["registers"] <= 255, r
        assert r["smem_bytes"] <= 48 * 1024, r


def test_hardware_path_uses_warp_intrinsics_and_atomics(rows):
    mttkrp = [r for r in rows if r["variant"].startswith("mttkrp")]
    assert len(mttkrp) >= 2 * 2 * 2 * 2 + 2 * 5 * 2
    for r in mttkrp:
        assert {"atom", "red"} & set(r["intrinsics"]), r
        if r["variant"].endswith("intrinsics"):
            assert {"shfl", "match"} <= set(r["intrinsics"]), r
        else:  # the shared-memory form (the simulator's) has no warp intrinsics
            assert not {"shfl", "match", "vote"} & set(r["intrinsics"]), r
    orders = {int(r["variant"].split()[1][2:]) for r in mttkrp}
    assert orders == set(range(3, 9))


def test_ttm_kernels_are_registered(rows):
    ttm = {r["variant"]: r for r in rows if r["variant"].startswith("ttm")}
    assert {v.rsplit(" ", 1)[0] for v in ttm} == {"ttm fiber", "ttm coo"}
    for name, r in ttm.items():
        if name.startswith("ttm coo"):  # one atomic add per (nonzero, column)
            assert {"atom", "red"} & set(r["intrinsics"]), r
        else:  # a fiber's sums stay in registers: no atomics
            assert not {"atom", "red", "shfl", "match"} & set(r["intrinsics"]), r


def test_fasttucker_kernels_assemble_with_atomic_updates(rows):
    """FastTuckerPlus (seed 003): the factor and core kernels of orders 3-5 and 32-wide tiles; both
    add their results with atomics (row moves, the core gradient)."""
    ft = [r for r in rows if r["variant"].startswith("fasttucker")]
    assert {r["variant"].split()[1] for r in ft} == {"factor", "core"}
    assert len(ft) == 2 * 4 * 2
    for r in ft:
        assert "atom" in r["intrinsics"] or "red" in r["intrinsics"], r
