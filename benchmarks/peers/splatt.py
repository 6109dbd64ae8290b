"""SPLATT (github.com/ShadenSmith/splatt) CP-ALS and MTTKRP timings, from its ``splatt`` executable.

Built by the user outside this repository and passed by path.

- CP-ALS: ``splatt cpd X.tns -r R -i N --tol 0 -t T --seed SEED --nowrite -v`` prints per
  iteration ``its = k (Ts)  fit = f  delta = d`` (SPLATT's own timer; reading the file and
  building the CSF are outside) and, with ``-v``, the total ``MTTKRP`` time of the run.
- MTTKRP: ``splatt bench X.tns -a csf -r R -i N+1 -t T`` times ``N+1`` sweeps over all modes
  with one tiled CSF (``its = k (Ts)`` per sweep; the first, untimed by us, warms up).

Threads: ``-t T`` (its default is 1), with ``OMP_NUM_THREADS`` set as well.
"""

from __future__ import annotations

from pathlib import Path

from .external import floats, one, run, steady

ITS_CPD = r"^\s+its =\s*(\d+) \(([0-9.eE+-]+)s\)\s+fit =\s*(\S+)"
ITS_BENCH = r"^\s+its =\s*(\d+) \(([0-9.eE+-]+)s\)\s*$"


def cp_als(exe: str, tns: Path, rank: int, iters: int, threads: int, seed: int = 1, mttkrp: bool = True) -> dict:
    """CP-ALS and (with ``mttkrp``) all-mode MTTKRP seconds of SPLATT on ``tns`` (a run of the
    executable for each)."""
    text, wall = run(
        [exe, "cpd", tns, "-r", rank, "-i", iters, "--tol", "0", "-t", threads, "--seed", seed, "--nowrite", "-v"],
        threads,
    )
    per_iter = floats(ITS_CPD, text, 2)
    if len(per_iter) != iters:
        raise RuntimeError(f"SPLATT ran {len(per_iter)} iterations, not {iters}: {text.strip()[-300:]}")
    fit = one(r"^Final fit:\s*(\S+)", text, "final fit")
    cpd_mttkrp = one(r"^\s+MTTKRP\s+([0-9.eE+-]+)s", text, "MTTKRP total")
    out = {
        "cp_als_s": steady(per_iter),
        "per_iter": per_iter,
        "cp_als_mttkrp_s": cpd_mttkrp / iters,
        "fit": fit,
        "wall_s": wall,
        "threads": threads,
    }
    if not mttkrp:
        return out
    btext, _ = run([exe, "bench", tns, "-a", "csf", "-r", rank, "-i", iters + 1, "-t", threads], threads)
    sweeps = floats(ITS_BENCH, btext, 2)
    if len(sweeps) < 2:
        raise RuntimeError(f"SPLATT bench printed {len(sweeps)} sweeps: {btext.strip()[-300:]}")
    return {**out, "mttkrp_s": min(sweeps[1:])}
