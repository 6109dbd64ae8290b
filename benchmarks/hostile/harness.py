"""How a case runs: the ``tfooc`` command as a subprocess (timeout, address-space limit, its own
process group), the outcome of each command, and a case's folder, environment and verdicts."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: benchmarks/hostile/harness.py


OUTCOMES = ("ok", "clear error", "silent", "traceback", "hang")


RANK = {o: i for i, o in enumerate(("ok", "clear error", "silent", "traceback", "hang"))}


SWEEPS = ("tns", "store", "spec", "fuzz", "outputs")


CLEAR = re.compile(r"^tfooc(?: [a-z-]+)?: (?:error:|run \S+ failed:)", re.MULTILINE)


NONFINITE = re.compile(r"(?<![A-Za-z_])(nan|[+-]?inf(?:inity)?)(?![A-Za-z_])", re.IGNORECASE)


FIT = re.compile(r"\bfit\s+(\S+)")


TFOOC = str(REPO / ".venv" / "bin" / "tfooc")


TIMEOUT = 120.0


MEM_LIMIT = 6 << 30


READ_LOCK = threading.Lock()  # the in-process store reader (numba, zarr) one case at a time


@dataclass
class Cmd:
    argv: list[str]
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool = False

    def short(self) -> str:
        return " ".join(self.argv)

    def json(self) -> dict:
        return {
            "argv": self.argv,
            "rc": self.rc,
            "seconds": round(self.seconds, 2),
            "timed_out": self.timed_out,
            "stdout": self.out[-4000:],
            "stderr": self.err[-4000:],
        }


# the address-space limit is set by a tiny exec wrapper, not by preexec_fn (unsafe with threads)
_LIMIT_EXEC = (
    "import os, sys\n"
    "try:\n"
    "    import resource\n"
    "    n = int(sys.argv[1])\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (n, n))\n"
    "except (ImportError, ValueError, OSError):\n"
    "    pass\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def tfooc(args: list[str], cwd: Path, env: dict, timeout: float | None = None) -> Cmd:
    """Run ``tfooc -q ARGS`` in its own process group; on timeout the whole group is killed."""
    argv = [sys.executable, "-I", "-S", "-c", _LIMIT_EXEC, str(MEM_LIMIT), TFOOC, "-q", *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout or TIMEOUT)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        timed_out = True
    return Cmd(
        ["tfooc", *map(str, args)],
        p.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        time.monotonic() - t0,
        timed_out,
    )


def classify(c: Cmd, ok_codes: tuple[int, ...] = (0,)) -> tuple[str | None, str]:
    """The outcome a command has by its exit alone; None when it succeeded (the caller checks the
    result)."""
    if c.timed_out:
        return "hang", f"no exit within {TIMEOUT:.0f} s"
    if "Traceback (most recent call last)" in c.err or "Traceback (most recent call last)" in c.out:
        return "traceback", _exception_line(c.err + "\n" + c.out)
    if c.rc is not None and c.rc < 0:
        return "traceback", f"killed by signal {-c.rc}"
    if c.rc in ok_codes:
        return None, ""
    if CLEAR.search(c.err):
        return "clear error", CLEAR.search(c.err).group(0)
    return "traceback", f"exit {c.rc} without a 'tfooc: error:' line"


def _exception_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b", lines[i]):
            return lines[i][:300]
    return lines[-1][:300] if lines else "Traceback"


def nonfinite_in(text: str) -> str | None:
    m = NONFINITE.search(text)
    return m.group(0) if m else None


@dataclass
class Case:
    sweep: str
    name: str
    desc: str
    fn: Callable[["Ctx"], None]
    why: str = ""  # store: why an identical result is (or is not) acceptable


@dataclass
class Ctx:
    """What one case does and finds: its folder, environment, commands and verdicts."""

    case: Case
    dir: Path
    env: dict
    cmds: list[Cmd] = field(default_factory=list)
    verdicts: list[tuple[str, str]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def run(self, args: list[str], ok_codes: tuple[int, ...] = (0,), cwd: Path | None = None) -> tuple[Cmd, str | None]:
        c = tfooc(args, cwd or self.dir, self.env)
        self.cmds.append(c)
        outcome, why = classify(c, ok_codes)
        if outcome is not None:
            self.verdicts.append((outcome, f"{args[0]}: {why}"))
        elif nonfinite_in(c.out):
            self.silent(f"{args[0]}: '{nonfinite_in(c.out)}' in its output")
        return c, outcome

    def silent(self, why: str) -> None:
        self.verdicts.append(("silent", why))

    def ok(self, why: str = "") -> None:
        self.verdicts.append(("ok", why))

    def outcome(self) -> tuple[str, str]:
        if not self.verdicts:
            return "ok", ""
        worst = max(self.verdicts, key=lambda v: RANK[v[0]])
        return worst


def run_case(case: Case, base: Path, shared: dict) -> dict:
    d = Path(tempfile.mkdtemp(prefix=f"{case.sweep}-{re.sub(r'[^A-Za-z0-9_.-]', '_', case.name)}-", dir=base))
    env = dict(os.environ)
    env["TFOOC_STORAGE"] = str(d / "root")
    env.pop("TFOOC_ALLOW_PATHS", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    ctx = Ctx(case, d, env)
    ctx.shared = shared  # type: ignore[attr-defined]
    (d / "root").mkdir()
    t0 = time.monotonic()
    try:
        case.fn(ctx)
    except Exception as exc:  # a bug in the benchmark's own check, or an unreadable result
        ctx.verdicts.append(
            (
                "silent" if ctx.cmds and all(c.rc == 0 for c in ctx.cmds) else "traceback",
                f"benchmark check raised {type(exc).__name__}: {exc}"[:300],
            )
        )
    outcome, why = ctx.outcome()
    res = {
        "sweep": case.sweep,
        "name": case.name,
        "desc": case.desc,
        "outcome": outcome,
        "why": why,
        "flags": ctx.flags,
        "seconds": round(time.monotonic() - t0, 2),
        "commands": [c.json() for c in ctx.cmds],
    }
    if case.why:
        res["identical_result"] = case.why
    if not shared.get("keep"):
        shutil.rmtree(d, ignore_errors=True)
    return res
