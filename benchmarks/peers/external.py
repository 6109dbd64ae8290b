"""Running an external peer executable and reading numbers from its output."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence


class PeerError(RuntimeError):
    """A peer executable failed or printed nothing we can read."""


def run(cmd: Sequence[str], threads: int, timeout: float = 3600) -> tuple[str, float]:
    """Run ``cmd`` with ``threads`` OpenMP threads; its combined output and wall seconds."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"{cmd[0]} did not finish in {timeout:.0f} s") from exc
    wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise PeerError(f"{' '.join(map(str, cmd))} exited with {proc.returncode}: {text.strip()[-500:]}")
    return text, wall


def floats(pattern: str, text: str, group: int = 1) -> list[float]:
    """Every match of ``pattern`` (multiline) in ``text``, group ``group`` as float."""
    return [float(m.group(group)) for m in re.finditer(pattern, text, re.MULTILINE)]


def one(pattern: str, text: str, what: str, group: int = 1) -> float:
    vals = floats(pattern, text, group)
    if not vals:
        raise PeerError(f"no {what} in the output ({pattern!r}); last lines: {text.strip()[-400:]}")
    return vals[-1]


def steady(per_iter: Sequence[float]) -> float:
    """Steady-state seconds per iteration: the median after the first (the first touches every
    page and, for us, loads the compiled kernels); the same rule for every tool."""
    xs = sorted(per_iter[1:] or per_iter)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
