"""Compile every GPU kernel variant to PTX and SASS without a GPU, and report its resources.

``python -m tensorflow_ooc.kernels.ptx_report [--json PATH] [--markdown]`` compiles each variant
with ``numba.cuda.compile_ptx`` for compute capability 8.0, assembles that PTX for 8.0 and 9.0 with
``ptxas -v`` (from the ``nvidia-cuda-nvcc-cu12`` wheel, or ``ptxas`` on PATH) and reports
registers per thread, spill bytes, static shared memory and which warp intrinsics and atomics the
PTX contains. It needs numba-cuda with the real (not simulated) CUDA target: run it with
``NUMBA_ENABLE_CUDASIM`` unset or 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CCS = ((8, 0), (9, 0))
INTRINSICS = {
    "shfl": r"\bshfl\.sync",
    "match": r"\bmatch\.any\.sync",
    "vote": r"\bvote\.sync",
    "atom": r"\batom\.(global|shared)",
    "red": r"\bred\.(global|shared)",
}


def find_ptxas() -> str | None:
    """ptxas from the nvidia-cuda-nvcc wheel, else from PATH."""
    try:
        import nvidia.cuda_nvcc as nvcc  # type: ignore[import-not-found]

        for root in list(getattr(nvcc, "__path__", [])):
            cand = Path(root) / "bin" / "ptxas"
            if cand.exists():
                return str(cand)
    except ImportError:
        pass
    return shutil.which("ptxas")


def variants() -> list[tuple[str, object, object]]:
    """(name, python function, signature) for every kernel variant that the product launches."""
    from .mttkrp.decode_gpu import kernel_sources
    from .mttkrp.gpu import KernelConfig, kernel_source, merge_copies_kernel, ptx_signature

    out = []
    configs = []
    for conflict in ("register", "hierarchical"):
        for dtype in ("float64", "float32"):
            for exchange in ("intrinsics", "shared"):
                configs.append(KernelConfig.for_rank(3, 32, conflict, exchange, dtype))
        configs.append(KernelConfig.for_rank(3, 16, conflict, "intrinsics", "float64"))  # 2 nonzeros a warp
        configs.append(KernelConfig.for_rank(3, 8, conflict, "intrinsics", "float32"))  # 4 nonzeros a warp
        configs.append(KernelConfig.for_rank(3, 64, conflict, "intrinsics", "float64"))  # R 33..64
        configs.append(KernelConfig.for_rank(3, 128, conflict, "intrinsics", "float32"))  # R 97..128
        for n in range(4, 9):
            configs.append(KernelConfig.for_rank(n, 32, conflict, "intrinsics", "float64"))
    for cfg in configs:
        name = f"mttkrp N={cfg.nmodes} R<={cfg.lanes * cfg.rank_chunks} {cfg.conflict} {cfg.dtype} {cfg.exchange}"
        out.append((name, kernel_source(cfg), ptx_signature(cfg)))
    from numba import float32, float64, types

    for ft in (float64, float32):
        out.append(
            (f"merge_copies {ft}", merge_copies_kernel, types.void(types.Array(ft, 3, "C"), types.Array(ft, 2, "C")))
        )
    for name, (fn, sig) in kernel_sources().items():
        out.append((f"decode {name}", fn, sig))
    from .ttm.gpu import ptx_variants as ttm_variants

    out.extend(ttm_variants())
    from .dense.gpu import ptx_variants as dense_variants

    out.extend(dense_variants())
    from .completion.fasttucker_gpu import ptx_variants as fasttucker_variants

    out.extend(fasttucker_variants())
    return out


def _ptxas(ptxas: str, ptx: str, cc: tuple[int, int]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run(
            [ptxas, "-v", f"-arch=sm_{cc[0]}{cc[1]}", str(src), "-o", str(Path(d) / "k.cubin")],
            capture_output=True,
            text=True,
        )
    if res.returncode != 0:
        return {"error": res.stderr.strip()[-2000:]}
    text = res.stderr
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", text)]
    spill_st = [int(x) for x in re.findall(r"(\d+) bytes spill stores", text)]
    spill_ld = [int(x) for x in re.findall(r"(\d+) bytes spill loads", text)]
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", text)]
    stack = [int(x) for x in re.findall(r"(\d+) bytes stack frame", text)]
    return {
        "registers": max(regs, default=0),
        "spill_store_bytes": sum(spill_st),
        "spill_load_bytes": sum(spill_ld),
        "smem_bytes": max(smem, default=0),
        "stack_bytes": max(stack, default=0),
    }


def report() -> list[dict]:
    """Compile and assemble every variant for every compute capability in ``CCS``."""
    from numba import cuda

    from .gpu.device import simulator_enabled

    if simulator_enabled():
        raise RuntimeError("the CUDA simulator is enabled: unset NUMBA_ENABLE_CUDASIM to compile PTX")
    ptxas = find_ptxas()
    rows = []
    for name, fn, sig in variants():
        # PTX of the lowest capability, assembled for each: PTX is forward compatible and the
        # registers and spills are ptxas's (each cc's own PTX gave the same counts, at half the
        # compile time: NVVM, not ptxas, is most of this report's minutes)
        ptx, _ = cuda.compile_ptx(fn, sig, cc=min(CCS))
        intrinsics = sorted(k for k, pat in INTRINSICS.items() if re.search(pat, ptx))
        for cc in CCS:
            row = {"variant": name, "cc": f"{cc[0]}.{cc[1]}", "ptx_cc": "%d.%d" % min(CCS), "intrinsics": intrinsics}
            row.update(_ptxas(ptxas, ptx, cc) if ptxas else {"error": "ptxas not found"})
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| variant | cc | registers | spills (st/ld B) | stack B | smem B | PTX intrinsics |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['cc']} | {r.get('registers', '-')} | "
            f"{r.get('spill_store_bytes', '-')}/{r.get('spill_load_bytes', '-')} | {r.get('stack_bytes', '-')} | "
            f"{r.get('smem_bytes', '-')} | {', '.join(r['intrinsics'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows as JSON to this path")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table instead of JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    rows = report()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
