"""ALTO (github.com/IntelLabs/ALTO) CP-ALS and MTTKRP timings, from its ``cpd`` executable.

The executable is built by the user outside this repository (ALTO's Makefile with gcc and
OpenBLAS needs a few fixes; a 64-bit-index build aborts on tensors needing more than 64 index
bits, for which a 128-bit build is needed) and passed by path.

- CP-ALS: ``cpd -i X.tns -l ALS -r R -m N -e 1e-300 -x SEED`` (never stop early: upstream
  rejects ``-e 0``, and no fit changes by less than 1e-300 in N iterations) prints per iteration
  ``it: k  fit: f  fit-delta: d  time(for MTTKRP): T s (M s)``: the iteration's seconds and its
  MTTKRP seconds summed over modes, from ALTO's own timers (file reading and conversion to ALTO
  are outside).
- MTTKRP: ``cpd ... -m N -p`` runs one untimed sweep over all modes, then ``N`` timed ones, and
  prints ``ALTO runtime: T``, the total of the ``N`` sweeps.

Threads: ALTO takes ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

from pathlib import Path

from .external import floats, one, run, steady

IT_LINE = (
    r"^it:\s*(\d+)\s+fit:\s*(\S+)\s+fit-delta:\s*(\S+)\s+time\(for MTTKRP\):\s*([0-9.eE+-]+) s \(([0-9.eE+-]+) s\)"
)


def index_bits(shape) -> int:
    return sum(int(d - 1).bit_length() for d in shape)


def cp_als(exe: str, tns: Path, rank: int, iters: int, threads: int, seed: int = 1, mttkrp: bool = True) -> dict:
    """CP-ALS and (with ``mttkrp``) all-mode MTTKRP seconds of ALTO on ``tns`` (a run of the
    executable for each)."""
    text, wall = run([exe, "-i", tns, "-l", "ALS", "-r", rank, "-m", iters, "-e", "1e-300", "-x", seed], threads)
    per_iter = floats(IT_LINE, text, 4)
    mttkrp_per_iter = floats(IT_LINE, text, 5)
    fits = floats(IT_LINE, text, 2)
    if len(per_iter) != iters:
        raise RuntimeError(f"ALTO ran {len(per_iter)} iterations, not {iters}: {text.strip()[-300:]}")
    out = {
        "cp_als_s": steady(per_iter),
        "per_iter": per_iter,
        "cp_als_mttkrp_s": steady(mttkrp_per_iter),
        "fit": fits[-1],
        "wall_s": wall,
        "threads": threads,
    }
    if not mttkrp:
        return out
    mtext, _ = run([exe, "-i", tns, "-l", "ALS", "-r", rank, "-m", iters, "-x", seed, "-p"], threads)
    sweeps = one(r"^ALTO runtime:\s+([0-9.eE+-]+)", mtext, "ALTO runtime line")
    return {**out, "mttkrp_s": sweeps / iters}


def cp_apr(exe: str, tns: Path, rank: int, outer: int, inner: int, threads: int, seed: int = 1) -> dict:
    """ALTO's CP-APR (``-l APR``, multiplicative updates with Phi computed on the fly): ``outer``
    outer iterations of ``inner`` inner iterations per mode (tolerance 1e-300: none stops early).
    Seconds per inner iteration = ALTO's "CP-APR main iteration time" / "Total inner iterations"
    (its own timers; reading the file and building ALTO's format are outside)."""
    text, wall = run(
        [exe, "-i", tns, "-l", "APR", "-r", rank, "-m", outer, "-n", inner, "-e", "1e-300", "-x", seed], threads
    )
    main = one(r"CP-APR main iteration time\s*=\s*([0-9.eE+-]+)", text, "CP-APR main iteration time")
    total_inner = one(r"Total inner iterations\s*=\s*(\d+)", text, "total inner iterations")
    return {
        "inner_s": main / total_inner,
        "main_s": main,
        "inner_iterations": int(total_inner),
        "loglik": one(r"Final log-likelihood\s*=\s*([0-9.eE+-]+)", text, "final log-likelihood"),
        "wall_s": wall,
        "threads": threads,
    }
