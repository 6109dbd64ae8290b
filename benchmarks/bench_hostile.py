"""Hostile-user sweep: bad .tns files, damaged stores, hostile workflow specs and a fuzz pass, each
run through the real ``tfooc`` command line as a subprocess (issue 28).

    .venv/bin/python benchmarks/bench_hostile.py                      # everything: ~600 cases, ~14 min
    .venv/bin/python benchmarks/bench_hostile.py --only tns --limit 5 # a few cases of one sweep
    .venv/bin/python benchmarks/bench_hostile.py --only store --match norm
    .venv/bin/python benchmarks/bench_hostile.py --only fuzz --fuzz 50 --seed 3 --json out.json
    .venv/bin/python benchmarks/bench_hostile.py --list               # the case tables, nothing run
    .venv/bin/python benchmarks/bench_hostile.py --tfooc OTHER/tfooc  # another build's CLI

Run it with the project's virtual environment: the checks read stores and results in this process
(``tensorflow_ooc.open_store`` / ``load_result``, compared with the benchmark's own parse of the
input). Each ``tfooc`` call costs about 2 s of start-up (imports), so the full run is about 900
calls: ~14 min with the default ``--jobs 2`` on 2 cores, about twice that with ``--jobs 1``.

Every case runs in a fresh temporary directory (``TFOOC_STORAGE`` points into it), each command
with a timeout (``--timeout``, default 120 s) and an address-space limit (``--mem-limit``, default
6 GiB, so that a YAML bomb cannot take the machine), and ends in exactly one outcome:

- ``ok``: every command exited 0 and its result is right, checked independently of the package's
  own checks: the store's nonzeros and values equal a small pure-Python parse of the input (sorted
  coordinates and values compared), ``tfooc info --json`` shows the true nnz, shape and norm (1e-9
  relative), a decomposition's fit is finite and in [0, 1] and its model is not all zero; a
  damaged store gives the undamaged store's results only where the damage cannot matter; a spec
  run wrote its outputs inside the storage root and nothing outside it.
- ``clear error``: a command exited non-zero with a one-line message (``tfooc: error: ...``, an
  argparse ``tfooc CMD: error: ...`` or ``tfooc: run ID failed: ...``) and no ``Traceback``.
- ``traceback``: ``Traceback`` in the output, a signal, or a non-zero exit without such a line.
- ``silent``: exit 0, but something is wrong (wrong nnz, values, shape or norm, NaN/inf printed or
  fitted, an all-zero model, a damaged store whose results differ from the undamaged one's or that
  was accepted although the damage must be refused, a spec violation accepted, data doubled, a
  file written outside the storage root, ...).
- ``hang``: a command ran past the timeout (its whole process group is killed).

A case is judged by its worst command (hang > traceback > silent > clear error > ok). Inputs that
are valid (CRLF line endings, tabs, ...) are expected to come out ``ok``: a clear error on them is
counted as ``clear error`` but listed as "valid input refused" and makes the exit status 1 too.
Inputs that may be either refused or accepted (values whose square overflows, denormals: the
issue allows a refusal or a correct, finite norm) are ``ok`` when refused clearly or when the
result is right.

The four sweeps: ``tns`` (convert, then info and cpd where convert succeeded), ``store`` (a small
valid store, copied and damaged per case, then info and cpd compared with the undamaged store's
output for the same seed; plus CLI number checks), ``spec`` (``tfooc run SPEC --storage ROOT``)
and ``fuzz`` (seeded mutations of a valid .tns, checked against a reference parser, and of a valid
spec, checked against a reference loader). ``--list`` prints every case with what it does and,
for damaged stores, why an identical result is or is not acceptable.

Prints per sweep the count of each outcome, every case that is neither ok nor a clear error with
the first lines of its output, and a total line; ``--json PATH`` writes every case. Exit status 0
when no case is silent, traceback or hang (and no valid input was refused), else 1.

Nothing here is committed data: every input is generated at run time in the temporary directory.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("ok", "clear error", "silent", "traceback", "hang")
RANK = {o: i for i, o in enumerate(("ok", "clear error", "silent", "traceback", "hang"))}
SWEEPS = ("tns", "store", "spec", "fuzz", "outputs")
CLEAR = re.compile(r"^tfooc(?: [a-z-]+)?: (?:error:|run \S+ failed:)", re.MULTILINE)
NONFINITE = re.compile(r"(?<![A-Za-z_])(nan|[+-]?inf(?:inity)?)(?![A-Za-z_])", re.IGNORECASE)
FIT = re.compile(r"\bfit\s+(\S+)")

# --- settings (set in main) -----------------------------------------------------------------------

TFOOC = str(REPO / ".venv" / "bin" / "tfooc")
TIMEOUT = 120.0
MEM_LIMIT = 6 << 30
READ_LOCK = threading.Lock()  # the in-process store reader (numba, zarr) one case at a time


# --- running commands -----------------------------------------------------------------------------


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


# --- cases ----------------------------------------------------------------------------------------


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


# --- reference .tns parser ------------------------------------------------------------------------

TINY = 2.2250738585072014e-308  # smallest normal float64
SQ_MIN = math.sqrt(TINY)  # smallest magnitude whose square is a normal float64 (2^-511)
SQ_MAX = math.sqrt(sys.float_info.max)
INDEX_RE = re.compile(r"^[0-9]+$")
INDEX_MAYBE = re.compile(r"^\+[0-9]+$|^[0-9]+\.0*$")
VALUE_RE = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")


@dataclass
class Ref:
    """What a .tns text means: ``status`` 'valid' (must convert to exactly this), 'invalid' (must be
    refused) or 'either' (a clear refusal or exactly this)."""

    status: str
    reason: str = ""
    coords: list[tuple[int, ...]] = field(default_factory=list)  # 0-based
    values: list[float] = field(default_factory=list)
    shape: tuple[int, ...] = ()

    def norm(self) -> float:
        if not self.values:
            return 0.0
        m = max(abs(v) for v in self.values)
        if m == 0:
            return 0.0
        # scaled, so that neither huge nor denormal values lose the norm
        e = math.frexp(m)[1]
        return math.ldexp(math.sqrt(math.fsum(math.ldexp(v, -e) ** 2 for v in self.values)), e)


def ref_parse(data: bytes, shape: tuple[int, ...] | None = None, duplicates: str = "error") -> Ref:
    """Whitespace separated columns, '#' comment lines, 1-based integer indices, float values."""
    either: list[str] = []
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except Exception as exc:
            return Ref("invalid", f"gzip: {exc}")
    entries: dict[tuple[int, ...], float] = {}
    order: list[tuple[int, ...]] = []
    ncols = None
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        stripped = raw.strip(b" \t")
        if not stripped:
            continue
        if stripped.startswith(b"#"):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                either.append(f"line {lineno}: a comment that is not UTF-8")
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Ref("invalid", f"line {lineno}: not UTF-8")
        if "#" in line:
            either.append(f"line {lineno}: '#' after data")
            line = line[: line.index("#")]
            if not line.strip():
                continue
        tokens = re.split(r"[ \t]+", line.strip(" \t"))
        if any(re.search(r"\s", t) for t in tokens) or "\x00" in line:
            if "\x00" in line or any(re.search(r"[^\S\x0b\x0c\x1c-\x1f\x85\xa0]", t) for t in tokens):
                return Ref("invalid", f"line {lineno}: control character")
            either.append(f"line {lineno}: unusual whitespace")
            tokens = line.split()
        if ncols is None:
            ncols = len(tokens)
            if ncols < 2:
                return Ref("invalid", f"line {lineno}: {ncols} column")
            if ncols == 2:
                either.append("a 1-mode tensor")
        elif len(tokens) != ncols:
            return Ref("invalid", f"line {lineno}: {len(tokens)} columns, expected {ncols}")
        idx = []
        for t in tokens[:-1]:
            if INDEX_RE.match(t):
                i = int(t)
            elif INDEX_MAYBE.match(t):
                either.append(f"line {lineno}: index written {t!r}")
                i = int(float(t)) if "." in t else int(t)
            else:
                return Ref("invalid", f"line {lineno}: index {t!r}")
            if i < 1:
                return Ref("invalid", f"line {lineno}: index {i} in 1-based data")
            if i > 2**62:
                either.append(f"line {lineno}: index {i} beyond 2^62")
            idx.append(i - 1)
        t = tokens[-1]
        if VALUE_RE.match(t):
            v = float(t)
        else:
            try:
                v = float(t)
            except ValueError:
                return Ref("invalid", f"line {lineno}: value {t!r}")
            if math.isfinite(v):
                either.append(f"line {lineno}: value written {t!r}")
        if not math.isfinite(v):
            return Ref("invalid", f"line {lineno}: non-finite value {t!r}")
        if abs(v) > SQ_MAX:
            either.append(f"line {lineno}: value {t} whose square overflows")
        if 0 < abs(v) < SQ_MIN:
            either.append(f"line {lineno}: value {t} whose square is subnormal or 0")
        if v == 0 and re.search(r"[1-9]", t.split("e")[0].split("E")[0]):
            either.append(f"line {lineno}: value {t} underflows to 0")
        key = tuple(idx)
        if key in entries:
            if duplicates == "error":
                return Ref("invalid", f"line {lineno}: duplicate coordinate")
            entries[key] = entries[key] + v if duplicates == "sum" else v
        else:
            entries[key] = v
            order.append(key)
    if ncols is None:
        return Ref("invalid", "no nonzeros")
    nm = ncols - 1
    inferred = tuple(max(k[m] for k in entries) + 1 for m in range(nm))
    if shape is not None:
        if len(shape) != nm:
            return Ref("invalid", f"--shape has {len(shape)} modes, data {nm}")
        if any(i >= s for k in entries for i, s in zip(k, shape)):
            return Ref("invalid", "index beyond --shape")
        inferred = tuple(shape)
    if sum(max(1, (s - 1).bit_length()) for s in inferred) > 64:
        either.append("more than 64 index bits")
    vals = [entries[k] for k in order]
    ref = Ref("either" if either else "valid", "; ".join(either[:3]), order, vals, inferred)
    if any(math.isinf(v) for v in vals):  # duplicates summed past the float range
        return Ref("invalid", "a summed value overflows")
    if ref.norm() > sys.float_info.max or not math.isfinite(ref.norm()):
        return Ref("either", "the norm itself overflows float64")
    return ref


# --- reading a store in this process (for the check only) -----------------------------------------


def read_store(path: Path) -> dict:
    import numpy as np

    import tensorflow_ooc as tfo

    with READ_LOCK:
        st = tfo.open_store(str(path))
        coords, values = st.to_coo()
        return {
            "shape": tuple(int(s) for s in st.shape),
            "nnz": int(st.nnz),
            "coords": np.asarray(coords, dtype=np.int64),
            "values": np.asarray(values, dtype=np.float64),
        }


def read_result(path: Path) -> dict:
    import numpy as np

    import tensorflow_ooc as tfo

    with READ_LOCK:
        r = tfo.load_result(str(path))
        return {
            "fit": float(r.fit),
            "weights": np.asarray(r.weights, dtype=np.float64),
            "factors": [np.asarray(f, dtype=np.float64) for f in r.factors],
        }


def compare_store(ctx: Ctx, store: Path, ref: Ref, who: str = "convert") -> bool:
    """The store's content against the reference parse; a 'silent' verdict when it differs."""
    try:
        got = read_store(store)
    except Exception as exc:
        ctx.silent(f"{who} exited 0 but the store does not open: {type(exc).__name__}: {exc}"[:300])
        return False
    ref_vals = list(ref.values)
    ref_coords = list(ref.coords)
    if got["nnz"] != len(ref_coords):
        zeros = [i for i, v in enumerate(ref_vals) if v == 0.0]
        if zeros and got["nnz"] == len(ref_coords) - len(zeros):  # explicit zeros dropped: fine
            keep = [i for i, v in enumerate(ref_vals) if v != 0.0]
            ref_coords = [ref_coords[i] for i in keep]
            ref_vals = [ref_vals[i] for i in keep]
        else:
            ctx.silent(f"{who}: nnz {got['nnz']}, the input has {len(ref_coords)}")
            return False
    if got["shape"] != tuple(ref.shape):
        ctx.silent(f"{who}: shape {got['shape']}, the input says {tuple(ref.shape)}")
        return False
    gc = [tuple(int(x) for x in row) for row in got["coords"].tolist()]
    gv = got["values"].tolist()
    if len(gc) != got["nnz"]:
        ctx.silent(f"{who}: to_coo gives {len(gc)} nonzeros, nnz says {got['nnz']}")
        return False
    a = sorted(zip(gc, gv))
    b = sorted(zip(ref_coords, ref_vals))
    for (c1, v1), (c2, v2) in zip(a, b):
        if c1 != c2:
            ctx.silent(
                f"{who}: coordinate {tuple(x + 1 for x in c1)} stored, "
                f"the input has {tuple(x + 1 for x in c2)} (1-based)"
            )
            return False
        if not (v1 == v2 or abs(v1 - v2) <= 1e-12 * abs(v2)):
            n_doubled = sum(1 for (_, x), (_, y) in zip(a, b) if x == 2 * y and y != 0)
            ctx.silent(
                f"{who}: value {v1!r} stored at {tuple(x + 1 for x in c1)}, the input has {v2!r}"
                + (f" ({n_doubled} of {len(a)} values doubled)" if n_doubled else "")
            )
            return False
    return True


def check_info(ctx: Ctx, c: Cmd, ref: Ref) -> None:
    try:
        info = json.loads(c.out)
    except ValueError as exc:
        ctx.silent(f"info --json printed no JSON: {exc}")
        return
    true = ref.norm()
    norm = info.get("norm")
    if not isinstance(norm, (int, float)) or not math.isfinite(norm):
        ctx.silent(f"info: norm {norm!r}, true norm {true!r}")
    elif not (norm == true or abs(norm - true) <= 1e-9 * abs(true)):
        ctx.silent(f"info: norm {norm!r}, true norm {true!r}")
    if info.get("nnz") not in (len(ref.values), len([v for v in ref.values if v != 0.0])):
        ctx.silent(f"info: nnz {info.get('nnz')}, the input has {len(ref.values)}")
    if tuple(info.get("shape") or ()) != tuple(ref.shape):
        ctx.silent(f"info: shape {info.get('shape')}, the input says {tuple(ref.shape)}")


def check_cpd(ctx: Ctx, c: Cmd, result: Path) -> dict | None:
    m = FIT.search(c.out)
    if not m:
        ctx.silent("cpd printed no fit")
        return None
    try:
        fit = float(m.group(1))
    except ValueError:
        ctx.silent(f"cpd: fit {m.group(1)!r}")
        return None
    if not math.isfinite(fit) or not 0.0 <= fit <= 1.0:
        ctx.silent(f"cpd: fit {m.group(1)} (not finite or outside [0, 1])")
    try:
        r = read_result(result)
    except Exception as exc:
        ctx.silent(f"cpd exited 0 but its result does not load: {type(exc).__name__}: {exc}"[:300])
        return None
    import numpy as np

    if not np.isfinite(r["weights"]).all() or not all(np.isfinite(f).all() for f in r["factors"]):
        ctx.silent("cpd: the model holds NaN or inf")
    elif not np.any(r["weights"]) or any(not np.any(f) for f in r["factors"]):
        ctx.silent(f"cpd: an all-zero model (weights {r['weights'].tolist()}), fit {m.group(1)}")
    r["fit_printed"] = m.group(1)
    return r


CPD = ["--rank", "2", "--max-iters", "3", "--seed", "0", "--scheduler", "inline"]


# --- sweep 1: bad .tns files ----------------------------------------------------------------------


def _tns_lines(rows: list[tuple]) -> bytes:
    return "".join(" ".join(str(x) for x in r) + "\n" for r in rows).encode()


def small_rows(n: int = 60, seed: int = 5, shape=(7, 6, 5)) -> list[tuple]:
    r = random.Random(seed)
    seen = {}
    while len(seen) < n:
        seen[tuple(r.randint(1, s) for s in shape)] = round(r.uniform(0.5, 5.0), 6)
    return [(*k, v) for k, v in seen.items()]


def tns_case(
    data: bytes | None,
    extra: list[str] = (),
    shape: tuple | None = None,
    make: Callable[[Path], Path] | None = None,
    expect: str | None = None,
    duplicates: str = "error",
) -> Callable[[Ctx], None]:
    """convert FILE STORE; where it succeeds, the content, info --json and cpd are checked."""

    def fn(ctx: Ctx) -> None:
        if make is not None:
            src = make(ctx.dir)
            ref = Ref(expect or "invalid", "not a readable .tns file")
        else:
            src = ctx.dir / "in.tns"
            src.write_bytes(data)
            ref = ref_parse(data, shape, duplicates)
            if expect is not None and ref.status != expect:
                ref.status = expect
        store = ctx.dir / "out.zarr"
        args = ["convert", str(src), str(store), *extra]
        if shape is not None:
            args += ["--shape", ",".join(map(str, shape))]
        c, outcome = ctx.run(args)
        if outcome == "clear error":
            if ref.status == "valid":
                ctx.flags.append("valid input refused")
            elif ref.status == "either":
                ctx.flags.append(f"refused ({ref.reason})")
            if store.exists():
                ctx.silent("a failed convert left a store at the destination")
            return
        if outcome is not None:
            return
        if ref.status == "invalid":
            ctx.silent(f"convert accepted an invalid input ({ref.reason})")
        if not compare_store(ctx, store, ref):
            return
        c, outcome = ctx.run(["info", str(store), "--json"])
        if outcome is None:
            check_info(ctx, c, ref)
        res = ctx.dir / "cp.zarr"
        c, outcome = ctx.run(["cpd", str(store), *CPD, "--out", str(res)])
        if outcome is None:
            check_cpd(ctx, c, res)

    return fn


def tns_cases() -> list[Case]:
    good = small_rows()
    G = _tns_lines(good)
    first = good[0]

    def with_first(row) -> bytes:
        return _tns_lines([row] + good[1:])

    def truncated_gz(d: Path) -> Path:
        p = d / "in.tns.gz"
        z = gzip.compress(G)
        p.write_bytes(z[: len(z) // 2])
        return p

    def directory(d: Path) -> Path:
        p = d / "dir.tns"
        p.mkdir()
        (p / "a.tns").write_bytes(G)
        return p

    def fifo_missing(d: Path) -> Path:
        return d / "missing.tns"

    def unreadable_dir_entry(d: Path) -> Path:
        p = d / "link.tns"
        p.symlink_to(d / "nowhere.tns")
        return p

    huge_line = (" ".join(["1"] * 200000) + " 1.0\n").encode() + G
    cases = [
        ("valid", "the valid 60-nonzero file (control)", G, {}),
        ("valid-gzip", "the valid file gzip-compressed", gzip.compress(G), {}),
        ("valid-crlf", "CRLF line endings (valid)", G.replace(b"\n", b"\r\n"), {}),
        (
            "valid-tabs",
            "mixed tabs and spaces, leading and trailing blanks (valid)",
            b"".join(
                (b"\t" if i % 2 else b"  ") + ln.replace(b" ", b" \t ", 1) + b" \t\n"
                for i, ln in enumerate(G.splitlines())
            ),
            {},
        ),
        (
            "valid-comments",
            "comment lines and blank lines between data (valid)",
            b"# header\n\n" + G.replace(b"\n", b"\n# c\n\n", 3),
            {},
        ),
        ("valid-shape", "a --shape larger than the indices (valid)", G, {"shape": (9, 9, 9)}),
        ("cols-short", "a line with one column too few", G + b"1 2 3.5\n", {}),
        ("cols-long", "a line with one column too many", G + b"1 2 3 4 5.5\n", {}),
        ("value-word", "a non-numeric value", G + b"1 2 3 abc\n", {}),
        ("index-word", "a non-numeric index", G + b"1 x 3 1.0\n", {}),
        ("index-float", "an index 2.5", G + b"1 2.5 3 1.0\n", {}),
        ("value-nan", "a NaN value", with_first((*first[:-1], "nan")), {}),
        ("value-inf", "an inf value", with_first((*first[:-1], "inf")), {}),
        ("value-neg-inf", "a -Infinity value", with_first((*first[:-1], "-Infinity")), {}),
        ("value-1e400", "a value 1e400 (overflows to inf when parsed)", with_first((*first[:-1], "1e400")), {}),
        ("value-1e200", "a value 1e200 (finite, its square overflows)", with_first((*first[:-1], "1e200")), {}),
        ("value-1e300", "a value 1e300 (finite, its square overflows)", with_first((*first[:-1], "1e300")), {}),
        ("value-all-1e300", "every value 1e300", _tns_lines([(*r[:-1], "1e300") for r in good]), {}),
        ("value-1e-310", "a denormal value 1e-310", with_first((*first[:-1], "1e-310")), {}),
        (
            "value-all-4.9e-324",
            "every value 4.9e-324 (the smallest denormal)",
            _tns_lines([(*r[:-1], "4.9e-324") for r in good]),
            {},
        ),
        ("index-zero", "index 0 in 1-based data", with_first((0, *first[1:])), {}),
        ("index-negative", "index -1", with_first((-1, *first[1:])), {}),
        ("index-2^60", "index 2^60", with_first((2**60, *first[1:])), {}),
        ("index-2^63-1", "index 2^63-1", with_first((2**63 - 1, *first[1:])), {}),
        ("index-2^64", "index 2^64 (does not fit 64 bits)", with_first((2**64, *first[1:])), {}),
        ("index-2^100", "index 2^100", with_first((2**100, *first[1:])), {}),
        ("beyond-shape", "an index beyond --shape", G, {"shape": (7, 6, 4)}),
        ("shape-modes", "--shape with the wrong number of modes", G, {"shape": (7, 6)}),
        ("empty", "an empty file", b"", {}),
        ("only-comments", "only comment lines", b"# a\n# b\n\n", {}),
        ("only-blank", "only blank lines and spaces", b"\n   \n\t\n", {}),
        ("truncated-gzip", "a gzip file cut in half", None, {"make": truncated_gz}),
        ("binary", "binary garbage", bytes(random.Random(3).randrange(256) for _ in range(4000)), {}),
        ("nul-bytes", "NUL bytes inside a line", G + b"1 2 \x00 3 1.0\n", {}),
        ("latin1", "a Latin-1 byte in a value", G + b"1 2 3 1.0\xe9\n", {}),
        ("huge-line", "a 400 kB first line (200000 columns)", huge_line, {}),
        ("huge-comment", "a 1 MB comment line before the data (valid)", b"# " + b"x" * 1_000_000 + b"\n" + G, {}),
        (
            "long-padding",
            "a data line padded with 100000 spaces and tabs (valid)",
            G + b" \t" * 50_000 + b"7 6 5 1.25" + b"\t " * 50_000 + b"\n",
            {},
        ),
        ("no-final-newline", "no newline after the last line (valid)", G.rstrip(b"\n"), {}),
        (
            "exponent-values",
            "values written 1.5E+02, -2e-3, .5, 7. (valid)",
            _tns_lines([(*r[:-1], f) for r, f in zip(good[:4], ["1.5E+02", "-2e-3", ".5", "7."])] + good[4:]),
            {},
        ),
        ("duplicates", "a repeated coordinate (duplicates=error)", G + _tns_lines([good[3]]), {}),
        (
            "duplicates-sum",
            "a repeated coordinate, --duplicates sum (valid)",
            G + _tns_lines([good[3]]),
            {"extra": ["--duplicates", "sum"], "duplicates": "sum"},
        ),
        ("single-nonzero", "one nonzero (valid)", _tns_lines([good[0]]), {}),
        ("zero-value", "explicit zero values (valid; kept or dropped)", G + b"7 6 5 0.0\n", {}),
        ("index-plus", "an index written +3", with_first(("+3", *first[1:])), {}),
        ("value-hex", "a value written 0x10", with_first((*first[:-1], "0x10")), {}),
        ("directory", "a directory instead of a file", None, {"make": directory}),
        ("missing", "a file that does not exist", None, {"make": fifo_missing}),
        ("dangling-symlink", "a symlink to nothing", None, {"make": unreadable_dir_entry}),
        ("one-column", "one number per line", b"1\n2\n3\n", {}),
    ]
    out = []
    for name, desc, data, kw in cases:
        make = kw.get("make")
        fn = tns_case(data, kw.get("extra", []), kw.get("shape"), make, kw.get("expect"), kw.get("duplicates", "error"))
        out.append(Case("tns", name, desc, fn))
    return out


# --- sweep 2: damaged stores ----------------------------------------------------------------------


def base_store_rows() -> list[tuple]:
    r = random.Random(11)
    seen: dict[tuple, float] = {}
    shape = (30, 20, 12, 9)
    while len(seen) < 3000:
        seen[tuple(r.randint(1, s) for s in shape)] = round(r.uniform(0.1, 10.0), 6)
    return [(*k, v) for k, v in seen.items()]


def prepare_store(base: Path, env: dict) -> dict:
    """The undamaged store and its info and cpd outputs (the reference for every damage)."""
    d = base / "store-base"
    d.mkdir(exist_ok=True)
    (d / "root").mkdir(exist_ok=True)
    data = _tns_lines(base_store_rows())
    (d / "base.tns").write_bytes(data)
    env = dict(env, TFOOC_STORAGE=str(d / "root"))
    store = d / "base.zarr"
    cmds = [tfooc(["convert", d / "base.tns", store, "--chunk-nnz", "500", "--max-block-nnz", "1000"], d, env)]
    if cmds[-1].rc != 0:
        raise SystemExit(f"bench_hostile: cannot make the base store:\n{cmds[-1].err[-3000:]}")
    info = tfooc(["info", store, "--json"], d, env)
    cpd = tfooc(["cpd", store, *CPD, "--out", d / "cp.zarr"], d, env)
    if info.rc != 0 or cpd.rc != 0:
        raise SystemExit(f"bench_hostile: the base store does not work:\n{info.err[-2000:]}\n{cpd.err[-2000:]}")
    ref = ref_parse(data)
    base_info = json.loads(info.out)
    true = ref.norm()
    problems = []
    if abs(base_info["norm"] - true) > 1e-9 * true or base_info["nnz"] != 3000:
        problems.append(
            f"the undamaged store's info is wrong: norm {base_info['norm']} (true {true}), nnz {base_info['nnz']}"
        )
    result = read_result(d / "cp.zarr")
    result["fit_printed"] = FIT.search(cpd.out).group(1)
    return {"store": store, "info": base_info, "cpd": result, "problems": problems, "norm": true}


# on-disk byte counts (junk files and extra chunks add bytes without changing the tensor)
INFO_IGNORE = {
    "path", "bytes_on_disk", "bytes_per_nnz", "compression_ratio", "index_bytes_per_nnz", "values_bytes_per_nnz"
}  # fmt: skip


# damage that only decoding the chunks can reveal (chunk files, their checksums, how they decode):
# info, which reads metadata and the block/chunk tables but no chunk, need not notice it
DATA_DAMAGE = (
    "alto-chunk",
    "values-chunk",
    "values-doubled",
    "values-nan",
    "values-halves",
    "chunks-crc-",
    "alto-json-codecs",
)


def store_case(name: str, damage: Callable[[Path], None], harm: str) -> Callable[[Ctx], None]:
    """harm: 'must-refuse' (exit 0 with the undamaged store's results is silent too), 'harmless'
    (the damage cannot change a result: identical results are ok) or 'rederivable' (the reader may
    re-derive what was lost: identical results are ok). Damage to chunk data (names starting with
    DATA_DAMAGE) need only be noticed by cpd, which reads the chunks; ``info`` reads metadata and
    tables, so damage to those must be refused by both."""
    data_only = name.startswith(DATA_DAMAGE)

    def fn(ctx: Ctx) -> None:
        import numpy as np

        sh = ctx.shared["store"]
        store = ctx.dir / "s.zarr"
        shutil.copytree(sh["store"], store, symlinks=True)
        before = store_content(store)
        damage(store)
        must_refuse = harm == "must-refuse"
        if must_refuse and store_content(store) == before:
            # written for another format version (the damage sets what this store already holds)
            ctx.flags.append("no-op in this store's format")
            must_refuse = False
        differs: list[str] = []
        c, outcome = ctx.run(["info", str(store), "--json"])
        if outcome is None:
            try:
                info = json.loads(c.out)
                for k, v in sh["info"].items():
                    if k not in INFO_IGNORE and info.get(k) != v:
                        differs.append(f"info {k}: {str(info.get(k))[:60]} (undamaged: {str(v)[:60]})")
                        break
            except ValueError:
                differs.append("info --json printed no JSON")
        res = ctx.dir / "cp.zarr"
        c, outcome2 = ctx.run(["cpd", str(store), *CPD, "--out", str(res)])
        if outcome2 is None:
            r = check_cpd(ctx, c, res)
            b = sh["cpd"]
            if r is not None:
                same = (
                    r["fit_printed"] == b["fit_printed"]
                    and r["weights"].shape == b["weights"].shape
                    and np.allclose(r["weights"], b["weights"], rtol=1e-9, atol=0)
                    and abs(r["fit"] - b["fit"]) <= 1e-9 * max(abs(b["fit"]), 1e-300)
                )
                if not same:
                    differs.append(
                        f"cpd fit {r['fit_printed']} weights {np.round(r['weights'], 4).tolist()} "
                        f"(undamaged: fit {b['fit_printed']} weights {np.round(b['weights'], 4).tolist()})"
                    )
        if differs:
            ctx.silent("; ".join(differs))
        elif must_refuse and (outcome2 is None or (outcome is None and not data_only)):
            who = " and ".join(
                w for w, o in (("info", outcome), ("cpd", outcome2)) if o is None and (w == "cpd" or not data_only)
            )
            ctx.silent(
                f"{who} accepted the damaged store (same results as undamaged) although this damage must be refused"
            )

    return fn


def store_content(store: Path) -> dict:
    """What a store holds, file by file: JSON files parsed (a rewrite that changes only spacing or
    key order is no change), others as bytes."""
    out: dict = {}
    for p in sorted(store.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            try:
                out[str(p.relative_to(store))] = json.loads(data) if p.suffix == ".json" else data
            except ValueError:
                out[str(p.relative_to(store))] = data
    return out


def _meta(store: Path) -> tuple[dict, dict]:
    doc = json.loads((store / "zarr.json").read_text())
    return doc, doc["attributes"]["tensorflow_ooc"]


def edit_attrs(f: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        doc, a = _meta(store)
        f(a)
        (store / "zarr.json").write_text(json.dumps(doc, indent=2))

    return damage


def edit_array_meta(array: str, f: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / array / "zarr.json"
        doc = json.loads(p.read_text())
        f(doc)
        p.write_text(json.dumps(doc, indent=2))

    return damage


def chunk(store: Path, array: str, i: int = 0) -> Path:
    c = store / array / "c"
    p = c / str(i)
    if p.is_file() or p.is_symlink():
        return p
    return sorted(q for q in c.rglob("*") if q.is_file())[i]


def flip_byte(array: str, i: int, where: float = 0.5) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        b = bytearray(p.read_bytes())
        b[int(len(b) * where)] ^= 0x10
        p.write_bytes(bytes(b))

    return damage


def truncate(array: str, i: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        b = p.read_bytes()
        p.write_bytes(b[: len(b) // 2])

    return damage


def delete(rel: str) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return damage


def swap(array: str, i: int, j: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        a, b = chunk(store, array, i), chunk(store, array, j)
        da, db = a.read_bytes(), b.read_bytes()
        a.write_bytes(db)
        b.write_bytes(da)

    return damage


def zero_fill(array: str, i: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        p.write_bytes(bytes(p.stat().st_size))

    return damage


def _crc32c(data: bytes) -> int:
    table = _crc32c.table
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_table() -> list[int]:
    t = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_crc32c.table = _crc_table()  # type: ignore[attr-defined]


def values_rewrite(f: Callable[[bytearray], None], i: int = 1) -> Callable[[Path], None]:
    """Change an uncompressed values chunk and fix its zarr crc32c, so that only a checksum kept
    by the store itself can notice (as a buggy writer or a careful adversary would)."""

    def damage(store: Path) -> None:
        p = chunk(store, "values", i)
        b = bytearray(p.read_bytes())
        payload = bytearray(b[:-4])
        if _crc32c(bytes(payload)).to_bytes(4, "little") != bytes(b[-4:]):
            raise RuntimeError("values chunk is not raw + crc32c: this damage needs compression=fast on random values")
        f(payload)
        p.write_bytes(bytes(payload) + _crc32c(bytes(payload)).to_bytes(4, "little"))

    return damage


def _double_first(p: bytearray) -> None:
    import struct

    v = struct.unpack_from("<d", p, 0)[0]
    struct.pack_into("<d", p, 0, v * 2)


def _nan_first(p: bytearray) -> None:
    import struct

    struct.pack_into("<d", p, 8, float("nan"))


def _swap_halves(p: bytearray) -> None:
    h = len(p) // 2 // 8 * 8
    p[:] = p[h : 2 * h] + p[:h] + p[2 * h :]


def combo(*ds: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        for d in ds:
            d(store)

    return damage


def junk(rel: str, data: bytes = b"junk") -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return damage


def write_text(rel: str, text: str) -> Callable[[Path], None]:
    return junk(rel, text.encode())


def truncate_text(rel: str) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / rel
        t = p.read_bytes()
        p.write_bytes(t[: len(t) // 2])

    return damage


def chunk_to_dir(array: str, i: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        p.unlink()
        p.mkdir()

    return damage


def chunk_symlink(array: str, i: int, j: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p, q = chunk(store, array, i), chunk(store, array, j)
        p.unlink()
        p.symlink_to(q.name)

    return damage


def remove_key(*keys: str) -> Callable[[dict], None]:
    def f(a: dict) -> None:
        for k in keys:
            a.pop(k, None)

    return f


def setk(key: str, value: Any) -> Callable[[dict], None]:
    def f(a: dict) -> None:
        a[key] = value(a[key]) if callable(value) else value

    return f


def layout(f: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda a: f(a["layout"])


def store_cases() -> list[Case]:
    R, H, D = "must-refuse", "harmless", "rederivable"
    why = {
        R: "must be refused: the metadata or data the results depend on no longer match; an identical "
        "result means the damage went unnoticed (a different result is silent either way)",
        H: "cannot change a result (descriptive field or junk outside the arrays): identical results are ok",
        D: "the reader may re-derive what was removed from the data: identical results are ok",
    }

    def sh(f):
        return lambda a: a.__setitem__("shape", f(list(a["shape"])))

    cases: list[tuple[str, str, Callable[[Path], None], str]] = [
        ("undamaged", "an untouched copy (control)", lambda s: None, H),
        # root zarr.json attributes
        ("norm-doubled", "norm_sq doubled", edit_attrs(setk("norm_sq", lambda v: v * 2)), R),
        ("norm-halved", "norm_sq halved", edit_attrs(setk("norm_sq", lambda v: v / 2)), R),
        ("norm-negative", "norm_sq = -1", edit_attrs(setk("norm_sq", -1.0)), R),
        ("norm-zero", "norm_sq = 0", edit_attrs(setk("norm_sq", 0.0)), R),
        ("norm-nan", "norm_sq = NaN (JSON NaN literal)", edit_attrs(setk("norm_sq", float("nan"))), R),
        ("norm-string", "norm_sq as a string", edit_attrs(setk("norm_sq", lambda v: str(v))), R),
        ("norm-removed", "norm_sq removed", edit_attrs(remove_key("norm_sq")), D),
        ("nnz-minus-1", "nnz one less", edit_attrs(setk("nnz", lambda v: v - 1)), R),
        ("nnz-plus-1000", "nnz 1000 more", edit_attrs(setk("nnz", lambda v: v + 1000)), R),
        ("nnz-float", "nnz 3000.5", edit_attrs(setk("nnz", lambda v: v + 0.5)), R),
        ("nnz-removed", "nnz removed", edit_attrs(remove_key("nnz")), D),
        ("shape-grown", "shape[0] + 5", edit_attrs(sh(lambda s: [s[0] + 5, *s[1:]])), R),
        ("shape-shrunk", "shape[0] - 5 (indices beyond it)", edit_attrs(sh(lambda s: [s[0] - 5, *s[1:]])), R),
        ("shape-negative", "shape[0] negative", edit_attrs(sh(lambda s: [-s[0], *s[1:]])), R),
        ("shape-mode-dropped", "the last mode dropped from shape", edit_attrs(sh(lambda s: s[:-1])), R),
        ("shape-modes-swapped", "shape[0] and shape[1] swapped", edit_attrs(sh(lambda s: [s[1], s[0], *s[2:]])), R),
        ("nmodes", "nmodes = 5", edit_attrs(setk("nmodes", 5)), R),
        (
            "layout-shift-swapped",
            "layout field_shift of modes 0 and 1 swapped",
            edit_attrs(
                layout(
                    lambda L: L.__setitem__(
                        "field_shift", [L["field_shift"][1], L["field_shift"][0], *L["field_shift"][2:]]
                    )
                )
            ),
            R,
        ),
        (
            "layout-bits",
            "layout mode_bits[0] - 1",
            edit_attrs(layout(lambda L: L["mode_bits"].__setitem__(0, L["mode_bits"][0] - 1))),
            R,
        ),
        (
            "layout-order",
            "layout order 'alto-msb-roundrobin'",
            edit_attrs(layout(lambda L: L.__setitem__("order", "alto-msb-roundrobin"))),
            R,
        ),
        ("layout-removed", "layout removed", edit_attrs(remove_key("layout")), R),
        ("nblocks", "nblocks = 2", edit_attrs(setk("nblocks", 2)), R),
        ("nchunks-less", "nchunks = 5", edit_attrs(setk("nchunks", 5)), R),
        ("nchunks-more", "nchunks = 7", edit_attrs(setk("nchunks", 7)), R),
        ("chunk-nnz", "chunk_nnz = 400", edit_attrs(setk("chunk_nnz", 400)), R),
        ("max-block-nnz", "max_block_nnz = 10 (blocks hold more)", edit_attrs(setk("max_block_nnz", 10)), R),
        ("value-dtype-f4", "value_dtype '<f4'", edit_attrs(setk("value_dtype", "<f4")), R),
        ("value-dtype-int", "value_dtype '<i8'", edit_attrs(setk("value_dtype", "<i8")), R),
        ("complete-false", "complete = false", edit_attrs(setk("complete", False)), R),
        ("complete-removed", "complete removed", edit_attrs(remove_key("complete")), R),
        ("format-version-2", "format_version 2", edit_attrs(setk("format_version", 2)), R),
        ("format-name", "format 'coo'", edit_attrs(setk("format", "coo")), R),
        ("store-id", "store_id changed", edit_attrs(setk("store_id", "0" * 32)), H),
        ("created-by", "created_by edited", edit_attrs(setk("created_by", "someone else 9.9")), H),
        ("created-at", "created_at edited", edit_attrs(setk("created_at", "1999-01-01T00:00:00Z")), H),
        ("source-removed", "source removed", edit_attrs(remove_key("source")), H),
        ("checksum-removed", "checksum removed (data intact)", edit_attrs(remove_key("checksum")), D),
        (
            "checksum-wrong",
            "checksum replaced by another sha256",
            edit_attrs(setk("checksum", "sha256:" + "0" * 64)),
            R,
        ),
        (
            "checksum-removed-norm-doubled",
            "checksum removed and norm_sq doubled",
            edit_attrs(lambda a: (a.pop("checksum", None), a.__setitem__("norm_sq", a["norm_sq"] * 2))),
            R,
        ),
        (
            "attrs-removed",
            "the tensorflow_ooc attributes removed",
            lambda s: (lambda doc: (s / "zarr.json").write_text(json.dumps({**doc, "attributes": {}})))(_meta(s)[0]),
            R,
        ),
        ("root-json-truncated", "root zarr.json cut in half (invalid JSON)", truncate_text("zarr.json"), R),
        ("root-json-empty", "root zarr.json empty", write_text("zarr.json", ""), R),
        ("root-json-list", "root zarr.json is []", write_text("zarr.json", "[]"), R),
        ("root-json-deleted", "root zarr.json deleted", delete("zarr.json"), R),
        # chunk files
        ("alto-chunk-deleted", "alto chunk 2 deleted", delete("alto/c/2"), R),
        ("alto-chunk-truncated", "alto chunk 2 truncated to half", truncate("alto", 2), R),
        ("alto-chunk-flipped", "a byte flipped in alto chunk 2", flip_byte("alto", 2), R),
        ("alto-chunks-swapped", "alto chunks 1 and 2 swapped", swap("alto", 1, 2), R),
        ("alto-chunk-zeroed", "alto chunk 3 overwritten with zero bytes", zero_fill("alto", 3), R),
        ("alto-chunk-symlinked", "alto chunk 4 replaced by a symlink to chunk 3", chunk_symlink("alto", 4, 3), R),
        ("values-chunk-deleted", "values chunk 3 deleted", delete("values/c/3"), R),
        ("values-chunk-truncated", "values chunk 3 truncated to half", truncate("values", 3), R),
        ("values-chunk-flipped", "a byte flipped in values chunk 3", flip_byte("values", 3), R),
        ("values-chunks-swapped", "values chunks 0 and 1 swapped (each with its valid crc)", swap("values", 0, 1), R),
        ("values-chunk-zeroed", "values chunk 2 overwritten with zero bytes", zero_fill("values", 2), R),
        ("values-chunk-dir", "values chunk 2 replaced by a directory", chunk_to_dir("values", 2), R),
        (
            "values-doubled-crc-fixed",
            "a value doubled, the chunk's crc32c recomputed",
            values_rewrite(_double_first),
            R,
        ),
        ("values-nan-crc-fixed", "a value set to NaN, the chunk's crc32c recomputed", values_rewrite(_nan_first), R),
        (
            "values-halves-swapped-crc-fixed",
            "a values chunk's halves swapped, crc32c recomputed",
            values_rewrite(_swap_halves),
            R,
        ),
        ("values-extra-chunk", "an extra values chunk 6 beyond the array", junk("values/c/6", b"\x00" * 4004), H),
        # block and chunk tables
        ("blocks-count-deleted", "blocks/count chunk deleted", delete("blocks/count/c/0"), R),
        ("blocks-count-flipped", "a byte flipped in blocks/count", flip_byte("blocks/count", 0, 0.6), R),
        ("blocks-start-deleted", "blocks/start chunk deleted", delete("blocks/start/c/0"), R),
        ("blocks-removed", "the blocks group removed", delete("blocks"), R),
        (
            "chunks-crc-values-deleted",
            "chunks/crc_values chunk deleted (data intact)",
            delete("chunks/crc_values/c/0"),
            D,
        ),
        (
            "chunks-crc-alto-flipped",
            "a byte flipped in chunks/crc_alto (data intact)",
            flip_byte("chunks/crc_alto", 0, 0.6),
            R,
        ),
        ("chunks-min-flipped", "a byte flipped in chunks/min", flip_byte("chunks/min", 0, 0.6), R),
        ("chunks-max-deleted", "chunks/max chunk deleted", lambda s: chunk(s, "chunks/max", 0).unlink(), R),
        ("chunks-removed", "the chunks group removed", delete("chunks"), R),
        # array-level zarr.json
        (
            "alto-json-shape",
            "alto array shape 2999",
            edit_array_meta("alto", lambda d: d.__setitem__("shape", [d["shape"][0] - 1])),
            R,
        ),
        (
            "alto-json-dtype",
            "alto data_type uint32",
            edit_array_meta("alto", lambda d: d.__setitem__("data_type", "uint32")),
            R,
        ),
        (
            "alto-json-codecs",
            "alto codecs: delta filter removed",
            edit_array_meta(
                "alto", lambda d: d.__setitem__("codecs", [c for c in d["codecs"] if "delta" not in c["name"]])
            ),
            R,
        ),
        ("alto-json-invalid", "alto zarr.json cut in half", truncate_text("alto/zarr.json"), R),
        (
            "values-json-dtype",
            "values data_type float32",
            edit_array_meta("values", lambda d: d.__setitem__("data_type", "float32")),
            R,
        ),
        (
            "values-json-chunk-shape",
            "values chunk_shape 400",
            edit_array_meta("values", lambda d: d["chunk_grid"]["configuration"].__setitem__("chunk_shape", [400])),
            R,
        ),
        (
            "values-json-fill-deleted",
            "values fill_value 1.0 and chunk 4 deleted",
            combo(edit_array_meta("values", lambda d: d.__setitem__("fill_value", 1.0)), delete("values/c/4")),
            R,
        ),
        ("values-json-deleted", "values zarr.json deleted", delete("values/zarr.json"), R),
        (
            "values-json-attrs",
            "values array attributes edited",
            edit_array_meta("values", lambda d: d.__setitem__("attributes", {"x": 1})),
            H,
        ),
        (
            "junk-files",
            "junk files in the store root and in values/c",
            combo(junk("README.txt"), junk("values/c/.DS_Store")),
            H,
        ),
    ]
    if os.geteuid() != 0:  # chmod does not stop root: there the directory-for-a-chunk case stands in
        cases.append(
            ("values-chunk-unreadable", "values chunk 1 chmod 000", lambda s: os.chmod(chunk(s, "values", 1), 0), R)
        )
    return [
        Case(
            "store",
            name,
            desc,
            store_case(name, dmg, harm),
            f"{harm}: {why[harm]}"
            + (
                " (chunk data: cpd must notice; info need not read chunks)"
                if name.startswith(DATA_DAMAGE) and harm == R
                else ""
            ),
        )
        for name, desc, dmg, harm in cases
    ] + cli_cases()


def cli_cases() -> list[Case]:
    """CLI numbers on the valid store: each must be refused at parse time (or by the memory plan)."""
    bad = [
        ("cli-tol-nan", ["--tol", "nan"]),
        ("cli-tol-inf", ["--tol", "inf"]),
        ("cli-tol-negative", ["--tol", "-1"]),
        ("cli-tol-1e309", ["--tol", "1e309"]),
        ("cli-rank-0", ["--rank", "0"]),
        ("cli-rank-negative", ["--rank", "-2"]),
        ("cli-rank-100000", ["--rank", "100000"]),
        ("cli-rank-2^62", ["--rank", str(2**62)]),
        ("cli-max-iters-0", ["--max-iters", "0"]),
        ("cli-max-iters-negative", ["--max-iters", "-3"]),
        ("cli-samples-0", ["--method", "sts", "--samples", "0"]),
    ]

    def make(extra: list[str]) -> Callable[[Ctx], None]:
        def fn(ctx: Ctx) -> None:
            args = list(CPD)
            for i in range(0, len(extra), 2):
                if extra[i] in args:
                    args[args.index(extra[i]) + 1] = extra[i + 1]
                else:
                    args += extra[i : i + 2]
            res = ctx.dir / "cp.zarr"
            c, outcome = ctx.run(["cpd", str(ctx.shared["store"]["store"]), *args, "--out", str(res)])
            if outcome is None:
                check_cpd(ctx, c, res)
                ctx.silent(f"cpd accepted {' '.join(extra)}")

        return fn

    out = [Case("store", n, f"cpd {' '.join(e)} on the valid store (must be refused)", make(e)) for n, e in bad]
    return out + cli_flow_cases()


THROUGHPUT = re.compile(r"([0-9.eE+]+) M nonzero-modes/s")


def _throughput(ctx: Ctx, c: Cmd) -> None:
    for m in THROUGHPUT.finditer(c.out + c.err):
        if float(m.group(1)) > 1e5:  # 10^11 nonzero-modes a second: no machine does that
            ctx.silent(f"nonsense throughput printed: {m.group(0)}")


def cli_flow_cases() -> list[Case]:
    """Command sequences on the valid store: resume, rerun, convert onto an existing store."""

    def store(ctx: Ctx) -> Path:
        return ctx.shared["store"]["store"]

    def resume_without_checkpoint(ctx: Ctx) -> None:
        res = ctx.dir / "cp.zarr"
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res), "--resume"])
        if outcome is None:
            check_cpd(ctx, c, res)
            if not re.search(r"checkpoint", c.err, re.IGNORECASE):
                ctx.silent("--resume without a checkpoint started afresh without saying so")

    def resume_finished(ctx: Ctx) -> None:
        res = ctx.dir / "cp.zarr"
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res)])
        if outcome is not None:
            return
        first = check_cpd(ctx, c, res)
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res), "--resume"])
        if outcome is None:
            _throughput(ctx, c)
            again = check_cpd(ctx, c, res)
            if first and again and first["fit_printed"] != again["fit_printed"]:
                ctx.silent(f"resuming a finished run changed the fit {first['fit_printed']} -> {again['fit_printed']}")

    def result_exists(ctx: Ctx) -> None:
        res = ctx.dir / "cp.zarr"
        _, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res)])
        if outcome is not None:
            return
        before = (res / "zarr.json").read_bytes()
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--seed", "1", "--out", str(res)])
        if outcome is None:
            ctx.silent("cpd replaced an existing result without --overwrite")
        elif (res / "zarr.json").read_bytes() != before:
            ctx.silent("a refused cpd still changed the existing result")

    def convert_onto_store(ctx: Ctx) -> None:
        dst = ctx.dir / "s.zarr"
        shutil.copytree(store(ctx), dst, symlinks=True)
        before = (dst / "zarr.json").read_bytes()
        src = ctx.dir / "other.tns"
        src.write_bytes(_tns_lines(small_rows(50, 3, (5, 5, 5))))
        _, outcome = ctx.run(["convert", str(src), str(dst)])
        if outcome is None:
            ctx.silent("convert replaced an existing store without --overwrite")
        elif (dst / "zarr.json").read_bytes() != before:
            ctx.silent("a refused convert still changed the existing store")

    def convert_overwrite(ctx: Ctx) -> None:
        dst = ctx.dir / "s.zarr"
        shutil.copytree(store(ctx), dst, symlinks=True)
        data = _tns_lines(small_rows(50, 3, (5, 5, 5)))
        src = ctx.dir / "other.tns"
        src.write_bytes(data)
        _, outcome = ctx.run(["convert", str(src), str(dst), "--overwrite"])
        if outcome is None:
            compare_store(ctx, dst, ref_parse(data))
        elif outcome == "clear error":
            ctx.flags.append("valid input refused")

    return [
        Case(
            "store",
            "flow-resume-no-checkpoint",
            "cpd --resume with no checkpoint: an error, or a warning that says it starts afresh",
            resume_without_checkpoint,
        ),
        Case(
            "store",
            "flow-resume-finished",
            "cpd, then cpd --resume of the finished run (0 iterations left): same fit, no nonsense throughput",
            resume_finished,
        ),
        Case(
            "store",
            "flow-result-exists",
            "cpd twice to one --out without --overwrite: the second refused, the result kept",
            result_exists,
        ),
        Case(
            "store",
            "flow-convert-existing",
            "convert onto an existing store without --overwrite: refused, the store kept",
            convert_onto_store,
        ),
        Case(
            "store",
            "flow-convert-overwrite",
            "convert onto an existing store with --overwrite: the new content (valid)",
            convert_overwrite,
        ),
    ]


# --- sweep: outputs that could destroy the user's data (issue 45) ---------------------------------


def tree_digest(path: Path) -> str:
    """Names and bytes of everything under ``path``: equal means untouched."""
    import hashlib

    h = hashlib.sha256()
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


DECOMPOSE = {
    "cpd": ["cpd", "--rank", "2", "--max-iters", "2", "--scheduler", "inline"],
    "tt": ["tt", "--ranks", "2", "--max-sweeps", "2"],
    "apr": ["apr", "--rank", "2", "--max-iters", "2"],
    "tucker": ["tucker", "--ranks", "2", "--max-iters", "2"],
    "complete": ["complete", "--ranks", "2", "--core-rank", "2", "--epochs", "1"],
}
# API keywords that a CLI message must not advise (it names the flag instead)
KEYWORD_LEAK = re.compile(r"\b(overwrite|duplicates|values_dtype|memory_limit|one_based|shape)=")


def must_refuse(
    ctx: Ctx, args: list[str], keep: list[Path], needle: str | None = None, code: int | None = None
) -> None:
    """``args`` must be refused with one clear line (``needle`` in it, exit ``code``) and leave every
    path in ``keep`` as it was."""
    before = {p: tree_digest(p) for p in keep}
    c, outcome = ctx.run(args)
    if outcome is None:
        ctx.silent(f"{' '.join(args[:1])} accepted: {' '.join(map(str, args))[:160]}")
    elif outcome == "clear error":
        if needle and needle not in c.err:
            ctx.silent(f"the refusal does not say {needle!r}: {c.err.strip()[-200:]}")
        if code is not None and c.rc != code:
            ctx.silent(f"exit status {c.rc}, not {code}")
        if KEYWORD_LEAK.search(c.err):
            ctx.silent(f"the CLI message advises a Python keyword: {c.err.strip()[-200:]}")
    for p, d in before.items():
        if not p.exists() or tree_digest(p) != d:
            ctx.silent(f"{p.name} was changed or removed")


def _copy_store(ctx: Ctx) -> Path:
    dst = ctx.dir / "X.zarr"
    shutil.copytree(ctx.shared["store"]["store"], dst, symlinks=True)
    return dst


def output_cases() -> list[Case]:
    cases: list[Case] = []

    def self_output(cmd: str, overwrite: bool) -> Callable[[Ctx], None]:
        def fn(ctx: Ctx) -> None:
            x = _copy_store(ctx)
            extra = ["--overwrite"] if overwrite else []
            must_refuse(ctx, [DECOMPOSE[cmd][0], str(x), *DECOMPOSE[cmd][1:], "--out", str(x), *extra], [x], "input")
            if cmd != "complete":
                must_refuse(ctx, [DECOMPOSE[cmd][0], str(x), *DECOMPOSE[cmd][1:], "--checkpoint", str(x), *extra], [x])
            link = ctx.dir / "link.zarr"
            link.symlink_to(x)
            must_refuse(ctx, [DECOMPOSE[cmd][0], str(x), *DECOMPOSE[cmd][1:], "--out", str(link), *extra], [x])
            must_refuse(ctx, [DECOMPOSE[cmd][0], str(x), *DECOMPOSE[cmd][1:], "--out", str(x / "in.zarr"), *extra], [x])

        return fn

    for cmd in DECOMPOSE:
        for overwrite in (True, False):
            name = f"self-{cmd}" + ("-overwrite" if overwrite else "")
            cases.append(
                Case(
                    "outputs",
                    name,
                    f"{cmd} --out/--checkpoint = the input, a link to it, inside it",
                    self_output(cmd, overwrite),
                )
            )

    def convert_self(ctx: Ctx) -> None:
        tns = ctx.dir / "IN.tns"
        tns.write_bytes(_tns_lines(small_rows()))
        must_refuse(ctx, ["convert", str(tns), str(tns), "--overwrite"], [tns], "input")
        must_refuse(ctx, ["convert", str(tns), str(tns)], [tns], "input")

    def rewrite_self(ctx: Ctx) -> None:
        x = _copy_store(ctx)
        must_refuse(ctx, ["convert", "--rewrite", str(x), str(x), "--overwrite"], [x])
        must_refuse(ctx, ["convert", "--rewrite", str(x), str(x / "new.zarr"), "--overwrite"], [x])

    def foreign(kind: str, cmd: str) -> Callable[[Ctx], None]:
        def fn(ctx: Ctx) -> None:
            x = _copy_store(ctx)
            tns = ctx.dir / "small.tns"
            tns.write_bytes(_tns_lines(small_rows()))
            target = ctx.dir / "mine"
            if kind == "folder":
                target.mkdir()
                (target / "notes.txt").write_text("a user's notes")
            else:
                target.write_text("a user's file")
            args = {
                "convert": ["convert", str(tns), str(target), "--overwrite"],
                "cpd-out": ["cpd", str(x), *DECOMPOSE["cpd"][1:], "--out", str(target), "--overwrite"],
                "cpd-checkpoint": ["cpd", str(x), *DECOMPOSE["cpd"][1:], "--checkpoint", str(target), "--overwrite"],
                "generate": ["generate", str(target), "--shape", "4,4,4", "--nnz", "10", "--overwrite"],
                "tucker-out": ["tucker", str(x), *DECOMPOSE["tucker"][1:], "--out", str(target), "--overwrite"],
            }[cmd]
            must_refuse(ctx, args, [target, x], "not written by tensorflow_ooc" if kind == "file" else "holding")

        return fn

    for kind in ("folder", "file"):
        for cmd in ("convert", "cpd-out", "cpd-checkpoint", "generate", "tucker-out"):
            cases.append(
                Case("outputs", f"foreign-{kind}-{cmd}", f"{cmd} --overwrite onto a user's {kind}", foreign(kind, cmd))
            )

    def ours_replaced(ctx: Ctx) -> None:
        """--overwrite onto this package's own store and result: valid, must work."""
        x = _copy_store(ctx)
        tns = ctx.dir / "small.tns"
        data = _tns_lines(small_rows())
        tns.write_bytes(data)
        out = ctx.dir / "r.zarr"
        for _ in range(2):
            _, outcome = ctx.run(["cpd", str(x), *DECOMPOSE["cpd"][1:], "--out", str(out), "--overwrite"])
            if outcome is not None:
                ctx.flags.append("valid input refused")
                return
        target = ctx.dir / "s.zarr"
        for _ in range(2):
            _, outcome = ctx.run(["convert", str(tns), str(target), "--overwrite"])
            if outcome is not None:
                ctx.flags.append("valid input refused")
                return
        compare_store(ctx, target, ref_parse(data))

    def two_writers(ctx: Ctx) -> None:
        x = _copy_store(ctx)
        out = ctx.dir / "same.zarr"
        argv = [TFOOC, "cpd", str(x), "--rank", "2", "--seed", "0", "--out", str(out), "--scheduler", "inline"]
        first = subprocess.Popen(
            [*argv, "--max-iters", "1000", "--tol", "0"], cwd=ctx.dir, env=ctx.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        lock = ctx.dir / ".same.zarr.tfooc-lock"
        deadline = time.monotonic() + 60
        while not lock.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        c, outcome = ctx.run(["cpd", str(x), "--rank", "2", "--seed", "1", "--out", str(out), "--max-iters", "2"])
        try:
            out1, err1 = first.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            out1, err1 = first.communicate()
            ctx.verdicts.append(("hang", "the first writer ran past the timeout"))
            return
        if outcome is None:
            ctx.silent("two cpd runs onto one --out both exited 0")
        elif f"PID {first.pid}" not in c.err:
            ctx.silent(f"the refusal does not name the holder's PID: {c.err.strip()[-200:]}")
        if first.returncode != 0:
            ctx.verdicts.append(("traceback", f"the first writer failed: {err1.strip()[-200:]}"))
        elif lock.exists():
            ctx.silent("the lock file stayed after the run")

    def store_and_tns(ctx: Ctx) -> tuple[Path, Path]:
        tns = ctx.dir / "small.tns"
        tns.write_bytes(_tns_lines(small_rows()))
        return _copy_store(ctx), tns

    def read_only(ctx: Ctx) -> None:
        x, tns = store_and_tns(ctx)
        ro = ctx.dir / "ro"
        ro.mkdir()
        if (
            os.geteuid() != 0
            or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode
        ):
            ctx.ok("skipped: cannot mount a read-only file system here")
            return
        try:
            must_refuse(ctx, ["convert", str(tns), str(ro / "Y.zarr")], [x], "read-only", 1)
            must_refuse(ctx, ["cpd", str(x), *DECOMPOSE["cpd"][1:], "--out", str(ro / "r.zarr")], [x], "read-only", 1)
            must_refuse(ctx, ["generate", str(ro / "g.tns"), "--shape", "4,4,4", "--nnz", "10"], [], "read-only", 1)
        finally:
            subprocess.run(["umount", str(ro)])

    def permission_denied(ctx: Ctx) -> None:
        x, tns = store_and_tns(ctx)
        locked = ctx.dir / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        setpriv = shutil.which("setpriv")
        if os.geteuid() == 0 and setpriv is None:
            ctx.ok("skipped: root without setpriv ignores permissions")
            return
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        try:
            for args in (
                ["convert", str(tns), str(locked / "Y.zarr")],
                ["cpd", str(x), *DECOMPOSE["cpd"][1:], "--out", str(locked / "r.zarr")],
            ):
                c = tfooc_prefixed(prefix, args, ctx)
                if c.rc == 1 and "Traceback" not in c.err and CLEAR.search(c.err) and "permission denied" in c.err:
                    ctx.verdicts.append(("clear error", f"{args[0]}: {c.err.strip()[:120]}"))
                else:
                    ctx.verdicts.append(
                        ("traceback" if "Traceback" in c.err else "silent", f"{args[0]}: {c.err.strip()[-200:]}")
                    )
            if list(locked.iterdir()):
                ctx.silent(f"left {[p.name for p in locked.iterdir()]} in the read-only folder")
        finally:
            locked.chmod(0o755)

    def messages(ctx: Ctx) -> None:
        """Confusing messages of issue 45: each must name the option and say what is wrong."""
        x = _copy_store(ctx)
        must_refuse(ctx, ["cpd", str(x), *DECOMPOSE["cpd"][1:], "--seed", "-5"], [x], "--seed")
        bad = ctx.dir / "bad.npz"
        bad.write_bytes(b"PK\x03\x04 not really a zip")
        c, outcome = ctx.run(["cpd", str(x), *DECOMPOSE["cpd"][1:], "--checkpoint", str(bad), "--resume"])
        if outcome is None:
            ctx.silent("an unreadable checkpoint was resumed from")
        elif "allow_pickle" in c.err:
            ctx.silent("numpy's allow_pickle advice leaked")
        tiny = ctx.dir / "tiny.tns"
        tiny.write_text("1 1 1 1e-200\n2 2 2 1.0\n")
        must_refuse(ctx, ["convert", str(tiny), str(ctx.dir / "tiny.zarr")], [tiny], "line 1")
        zeros = ctx.dir / "zeros.tns"
        zeros.write_text("1 1 1 0\n2 2 2 0\n")
        c, outcome = ctx.run(["convert", str(zeros), str(ctx.dir / "zeros.zarr")])
        if outcome is None:
            c, outcome = ctx.run(["apr", str(ctx.dir / "zeros.zarr"), "--rank", "2"])
            if outcome is None:
                ctx.silent("CP-APR ran on all-zero counts")
            elif "seed" in c.err:
                ctx.silent(f"CP-APR on all-zero counts advises another seed: {c.err.strip()[-200:]}")
        dup = ctx.dir / "dup.tns"
        dup.write_text("1 1 1 1.0\n1 1 1 2.0\n")
        must_refuse(ctx, ["convert", str(dup), str(ctx.dir / "dup.zarr")], [dup], "--duplicates")
        c, outcome = ctx.run(["convert", str(tiny), str(ctx.dir / "m.zarr"), "--memory-limit", "64MB"])
        if outcome == "clear error" and "process" not in c.err:
            ctx.silent(f"--memory-limit refusal does not say it counts the whole process: {c.err.strip()[-200:]}")
        big = ctx.dir / "big.tns"
        big.write_text(f"1 1 {2**62} 1.0\n2 2 1 2.0\n")
        c, outcome = ctx.run(["convert", str(big), str(ctx.dir / "big.zarr")])
        if outcome is None:
            must_refuse(ctx, ["tt", str(ctx.dir / "big.zarr"), "--ranks", "2"], [], "mode")
            c = ctx.cmds[-1]
            if "array is too big" in c.err:
                ctx.silent("numpy's 'array is too big' leaked")

    cases += [
        Case("outputs", "convert-self", "convert IN.tns IN.tns (with and without --overwrite)", convert_self),
        Case("outputs", "rewrite-self", "convert --rewrite X X, and into X/new.zarr", rewrite_self),
        Case("outputs", "ours-replaced", "--overwrite onto this package's own result and store (valid)", ours_replaced),
        Case(
            "outputs",
            "two-writers",
            "two cpd runs onto one --out at once: the second refused with the PID",
            two_writers,
        ),
        Case(
            "outputs",
            "read-only-fs",
            "convert, cpd, generate into a read-only file system: one line, exit 1",
            read_only,
        ),
        Case(
            "outputs",
            "permission-denied",
            "convert, cpd into a folder without write permission (not root)",
            permission_denied,
        ),
        Case(
            "outputs",
            "messages",
            "--seed -5, bad checkpoint, 1e-200, all-zero APR, duplicates, 64MB, 2^62 mode",
            messages,
        ),
    ]
    return cases


def tfooc_prefixed(prefix: list[str], args: list[str], ctx: Ctx) -> Cmd:
    """``tfooc ARGS`` run under ``prefix`` (setpriv without root's permission override)."""
    t0 = time.monotonic()
    p = subprocess.run(
        [*prefix, TFOOC, *args], cwd=ctx.dir, env=ctx.env, capture_output=True, text=True, timeout=TIMEOUT
    )
    c = Cmd([*prefix, TFOOC, *args], p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    ctx.cmds.append(c)
    return c


# --- sweep 3: hostile workflow specs --------------------------------------------------------------

SPEC_BASE = """\
name: hostile
steps:
  convert:
    kind: convert
    input: in.tns
    out: t.zarr
  decompose:
    kind: decompose
    input: t.zarr
    out: cp.zarr
    rank: 2
    max_iters: 3
    seed: 0
    scheduler: inline
"""

SPEC_KEYS_TOP = {"version", "name", "description", "storage", "allow_paths", "cluster", "steps"}
SPEC_KEYS = {
    "convert": {
        "kind",
        "after",
        "description",
        "input",
        "out",
        "append",
        "keep_versions",
        "shape",
        "zero_based",
        "duplicates",
        "chunk_nnz",
        "max_block_nnz",
        "compression",
        "memory_limit",
    },
    "decompose": {
        "kind",
        "after",
        "description",
        "input",
        "out",
        "rank",
        "max_iters",
        "tol",
        "seed",
        "init",
        "previous",
        "dtype",
        "execution",
        "device",
        "conflict",
        "streams",
        "device_memory_limit",
        "checkpoint_every",
        "partitions",
        "method",
        "samples",
        "fit_every",
        "scheduler",
    },
}


class _UniqueLoader(__import__("yaml").SafeLoader):
    pass


def _unique_mapping(loader, node, deep=False):
    import yaml

    keys = set()
    for k, _ in node.value:
        key = loader.construct_object(k, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


_UniqueLoader.add_constructor("tag:yaml.org,2002:map", _unique_mapping)


def ref_spec(text: bytes) -> tuple[dict | None, str]:
    """The reference loader: safe YAML without duplicate keys or aliases, the keys and ranges of
    the steps this benchmark uses. (None, why) when the spec must be refused."""
    import yaml

    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        doc = yaml.load(s, Loader=_UniqueLoader)
    except Exception as exc:
        return None, f"YAML: {str(exc).splitlines()[0]}"
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), dict) or not doc["steps"]:
        return None, "no steps mapping"
    if set(map(str, doc)) - SPEC_KEYS_TOP:
        return None, f"unknown keys {sorted(set(map(str, doc)) - SPEC_KEYS_TOP)}"
    if doc.get("allow_paths"):
        return None, "allow_paths in the spec"
    cl = doc.get("cluster", "embedded")
    if cl not in ("embedded", "gpu"):
        return None, f"cluster {cl!r}"
    for name, st in doc["steps"].items():
        if not isinstance(st, dict) or st.get("kind") not in SPEC_KEYS:
            return None, f"step {name!r}"
        if set(map(str, st)) - SPEC_KEYS[st["kind"]]:
            return None, f"unknown key in step {name}"
        for k, v in st.items():
            if isinstance(v, float) and not math.isfinite(v):
                return None, f"{name}.{k} not finite"
        for k in ("rank", "max_iters", "chunk_nnz", "max_block_nnz", "keep_versions", "samples", "streams"):
            if k in st and (type(st[k]) is not int or not 1 <= st[k] <= 2**62):
                return None, f"{name}.{k} = {st[k]!r}"
        if "tol" in st and (type(st["tol"]) not in (int, float) or not st["tol"] >= 0):
            return None, f"{name}.tol = {st['tol']!r}"
        for k in ("input", "out"):
            if not isinstance(st.get(k), str):
                return None, f"{name}.{k} = {st.get(k)!r}"
    return doc, ""


def files_outside(d: Path, root: Path, allowed: set[Path]) -> list[str]:
    """Files created under the case folder outside the storage root (besides the inputs)."""
    out = []
    for p in d.rglob("*"):
        try:
            rel = p.relative_to(root)
            del rel
            continue
        except ValueError:
            pass
        if p in allowed or p.is_dir():
            continue
        out.append(str(p.relative_to(d)))
    return out


def spec_case(
    text: str | bytes | Callable[[Ctx], str],
    must: str = "refuse",
    setup: Callable[[Ctx], None] | None = None,
    check: Callable[[Ctx, Cmd], None] | None = None,
) -> Callable[[Ctx], None]:
    """must: 'refuse' (exit 0 is silent), 'run' (exit 0 checked: outputs inside the root, nothing
    outside), 'either' (a clear refusal or a correct run)."""

    def fn(ctx: Ctx) -> None:
        root = ctx.dir / "root"
        (root / "in.tns").write_bytes(_tns_lines(small_rows(200, 7, (12, 9, 7))))
        (ctx.dir / "outside").mkdir()
        if setup:
            setup(ctx)
        t = text(ctx) if callable(text) else text
        spec = ctx.dir / "spec.yaml"
        spec.write_bytes(t.encode() if isinstance(t, str) else t)
        before = {p for p in ctx.dir.rglob("*")}
        c, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0, 3))
        stray = files_outside(ctx.dir, root, before)
        if stray:
            ctx.silent(f"wrote outside the storage root: {stray[:3]}")
        if (ctx.dir / "PWNED").exists() or (root / "PWNED").exists():
            ctx.silent("a YAML tag ran code (PWNED was created)")
        if outcome is not None:
            return
        if must == "refuse":
            ctx.silent("the spec was accepted (exit 0) although it must be refused")
        if check:
            check(ctx, c)

    return fn


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def bomb(levels: int, width: int = 9) -> str:
    lines = ['b0: &b0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _versions(root: Path) -> list[dict]:
    p = root / "nightly" / "tensor" / "versions.json"
    doc = json.loads(p.read_text())
    return doc["versions"] if isinstance(doc, dict) else doc


def nightly_case(action: str, on_changed: str | None = None) -> Callable[[Ctx], None]:
    """Run a nightly-style spec, change nightly/incoming/ (touch, rename, edit, a new file), run it
    again and compare the latest version with what its files hold."""
    spec_text = """\
name: nightly
steps:
  ingest:
    kind: convert
    input: nightly/incoming/
    out: nightly/tensor
    append: true
    duplicates: sum
    keep_versions: 7
{on_changed}  decompose:
    kind: decompose
    input: nightly/tensor
    out: nightly/cp.zarr
    rank: 2
    init: previous
    max_iters: 3
    seed: 0
    scheduler: inline
"""

    def fn(ctx: Ctx) -> None:
        root = ctx.dir / "root"
        inc = root / "nightly" / "incoming"
        inc.mkdir(parents=True)
        a = small_rows(150, 21, (12, 9, 7))
        b = small_rows(150, 22, (12, 9, 7))
        (inc / "a.tns").write_bytes(_tns_lines(a))
        (inc / "b.tns").write_bytes(_tns_lines(b))
        spec = ctx.dir / "nightly.yaml"
        spec.write_text(spec_text.replace("{on_changed}", f"    on_changed: {on_changed}\n" if on_changed else ""))
        c, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0,))
        if outcome is not None:
            return
        merged = ref_parse(_tns_lines(a) + _tns_lines(b), duplicates="sum")
        v1 = _versions(root)
        latest = root / "nightly" / "tensor" / Path(v1[-1]["path"]).name
        if not compare_store(ctx, latest, merged, "the first run"):
            return
        time.sleep(1.1)
        expect = merged
        if action == "touch":
            os.utime(inc / "a.tns")
        elif action == "rename":
            (inc / "a.tns").rename(inc / "a-renamed.tns")
        elif action == "edit":
            edited = [(*a[0][:-1], round(a[0][-1] + 1.0, 6))] + a[1:]
            (inc / "a.tns").write_bytes(_tns_lines(edited))
            if on_changed == "append":  # the new content added as new data, the old stays
                expect = ref_parse(_tns_lines(a) + _tns_lines(b) + _tns_lines(edited), duplicates="sum")
            elif on_changed == "replace-version":
                expect = ref_parse(_tns_lines(edited) + _tns_lines(b), duplicates="sum")
        elif action == "new":
            n = small_rows(80, 23, (14, 9, 7))
            (inc / "n.tns").write_bytes(_tns_lines(n))
            expect = ref_parse(_tns_lines(a) + _tns_lines(b) + _tns_lines(n), duplicates="sum")
        elif action == "copy":
            shutil.copy(inc / "a.tns", inc / "a-copy.tns")
        _, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0, 3))
        if outcome is not None:
            if action == "new" or on_changed in ("append", "replace-version"):
                ctx.flags.append("valid input refused")
            return
        if action == "edit" and on_changed in (None, "error"):
            ctx.silent("an ingested file was edited under the same name and the run went on (exit 0)")
        v2 = _versions(root)
        latest = root / "nightly" / "tensor" / Path(v2[-1]["path"]).name
        if action == "copy":
            # the same content under a new name: not new data; summing it again doubles a.tns
            pass
        if (
            compare_store(ctx, latest, expect, "the second run")
            and (action == "new" or on_changed)
            and len(v2) <= len(v1)
        ):
            ctx.silent("the new content was not ingested")

    return fn


def spec_cases() -> list[Case]:
    B = SPEC_BASE

    def outside(ctx: Ctx) -> str:
        return str(ctx.dir / "outside")

    def symlink_setup(ctx: Ctx) -> None:
        (ctx.dir / "root" / "link").symlink_to(ctx.dir / "outside")

    def outputs_inside(ctx: Ctx, c: Cmd) -> None:
        root = (ctx.dir / "root").resolve()
        for o in ("t.zarr", "cp.zarr"):
            p = (ctx.dir / "root" / o).resolve()
            if not p.exists() or root not in p.parents:
                ctx.silent(f"output {o} missing or outside the root")
        m = FIT.search(c.out)
        if m and nonfinite_in(m.group(1)):
            ctx.silent(f"fit {m.group(1)}")

    def cluster_check(ctx: Ctx, c: Cmd) -> None:
        if not re.search(r"WARNING.*(127\.0\.0\.1|unreach|local)", c.err, re.IGNORECASE):
            ctx.silent("an unreachable cluster address was accepted without an error or a warning")

    port = closed_port()
    sub = B.replace
    cases: list[tuple[str, str, Any, str, Any, Any]] = [
        ("valid", "the valid two-step spec (control)", B, "run", None, outputs_inside),
        ("yaml-syntax", "an unclosed flow sequence", B + "  extra: [1, 2\n", "refuse", None, None),
        ("yaml-tab-indent", "a tab used for indentation", sub("    rank: 2", "\trank: 2"), "refuse", None, None),
        ("yaml-empty", "an empty file", "", "refuse", None, None),
        ("yaml-list", "a list instead of a mapping", "- convert\n- decompose\n", "refuse", None, None),
        ("yaml-scalar", "a bare scalar", "hello\n", "refuse", None, None),
        (
            "not-utf8",
            "a Latin-1 byte in a comment and a value",
            (B + "# caf\xe9\n").encode("latin-1"),
            "either",
            None,
            None,
        ),
        ("nul-byte", "a NUL byte", B.encode() + b"\x00\n", "refuse", None, None),
        ("unknown-top-key", "an unknown top-level key", B + "colour: blue\n", "refuse", None, None),
        ("unknown-step-key", "rank misspelt ranks", sub("rank: 2", "ranks: 2"), "refuse", None, None),
        ("unknown-kind", "kind: transmogrify", sub("kind: decompose", "kind: transmogrify"), "refuse", None, None),
        ("rank-word", "rank: sixteen", sub("rank: 2", "rank: sixteen"), "refuse", None, None),
        ("rank-string", 'rank: "2" (a string)', sub("rank: 2", 'rank: "2"'), "refuse", None, None),
        ("rank-float", "rank: 2.5", sub("rank: 2", "rank: 2.5"), "refuse", None, None),
        ("rank-bool", "rank: true", sub("rank: 2", "rank: true"), "refuse", None, None),
        ("rank-zero", "rank: 0", sub("rank: 2", "rank: 0"), "refuse", None, None),
        ("rank-negative", "rank: -3", sub("rank: 2", "rank: -3"), "refuse", None, None),
        (
            "rank-huge",
            "rank: 100000 (the memory plan must refuse it)",
            sub("rank: 2", "rank: 100000"),
            "refuse",
            None,
            None,
        ),
        ("rank-bignum", "rank: 10^30", sub("rank: 2", "rank: 1000000000000000000000000000000"), "refuse", None, None),
        ("tol-nan", "tol: .nan", sub("seed: 0", "seed: 0\n    tol: .nan"), "refuse", None, None),
        ("tol-inf", "tol: .inf", sub("seed: 0", "seed: 0\n    tol: .inf"), "refuse", None, None),
        ("tol-negative", "tol: -1", sub("seed: 0", "seed: 0\n    tol: -1"), "refuse", None, None),
        ("tol-1e400", "tol: 1e400 (parses as inf)", sub("seed: 0", "seed: 0\n    tol: 1.0e+400"), "refuse", None, None),
        ("max-iters-zero", "max_iters: 0", sub("max_iters: 3", "max_iters: 0"), "refuse", None, None),
        ("chunk-nnz-zero", "chunk_nnz: 0", sub("out: t.zarr", "out: t.zarr\n    chunk_nnz: 0"), "refuse", None, None),
        (
            "memory-limit-word",
            "memory_limit: lots",
            sub("out: t.zarr", "out: t.zarr\n    memory_limit: lots"),
            "refuse",
            None,
            None,
        ),
        (
            "keep-versions-no-append",
            "keep_versions without append",
            sub("out: t.zarr", "out: t.zarr\n    keep_versions: 2"),
            "refuse",
            None,
            None,
        ),
        ("version-2", "version: 2", "version: 2\n" + B, "refuse", None, None),
        ("steps-empty", "steps: {}", "name: x\nsteps: {}\n", "refuse", None, None),
        ("step-name-slash", "a step named a/b", sub("  decompose:\n", "  a/b:\n"), "refuse", None, None),
        ("duplicate-keys", "rank given twice", sub("rank: 2", "rank: 2\n    rank: 3"), "refuse", None, None),
        (
            "duplicate-steps",
            "the step name convert given twice",
            B + "  convert:\n    kind: convert\n    input: in.tns\n    out: u.zarr\n",
            "refuse",
            None,
            None,
        ),
        ("two-writers", "two steps write one output", sub("out: cp.zarr", "out: t.zarr"), "refuse", None, None),
        (
            "after-cycle",
            "steps after each other",
            sub("kind: convert", "kind: convert\n    after: [decompose]"),
            "refuse",
            None,
            None,
        ),
        (
            "after-self",
            "a step after itself",
            sub("kind: decompose", "kind: decompose\n    after: [decompose]"),
            "refuse",
            None,
            None,
        ),
        (
            "after-unknown",
            "after an unknown step",
            sub("kind: decompose", "kind: decompose\n    after: [nosuch]"),
            "refuse",
            None,
            None,
        ),
        (
            "input-missing",
            "an input that does not exist",
            sub("input: in.tns", "input: nosuch.tns"),
            "refuse",
            None,
            None,
        ),
        ("out-dotdot", "out: ../escape.zarr", sub("out: cp.zarr", "out: ../escape.zarr"), "refuse", None, None),
        (
            "out-absolute",
            "out: an absolute path outside the root",
            lambda ctx: sub("out: cp.zarr", f"out: {outside(ctx)}/cp.zarr"),
            "refuse",
            None,
            None,
        ),
        ("out-root-itself", "out: . (the storage root itself)", sub("out: cp.zarr", "out: ."), "refuse", None, None),
        (
            "out-symlink-escape",
            "out through a symlink inside the root to a folder outside",
            sub("out: cp.zarr", "out: link/cp.zarr"),
            "refuse",
            symlink_setup,
            None,
        ),
        (
            "input-symlink-escape",
            "input through a symlink inside the root to a file outside",
            sub("input: in.tns", "input: link/in.tns"),
            "refuse",
            lambda ctx: (symlink_setup(ctx), shutil.copy(ctx.dir / "root" / "in.tns", ctx.dir / "outside" / "in.tns")),
            None,
        ),
        (
            "allow-paths-root",
            "allow_paths: [/] and an output outside the root",
            lambda ctx: "allow_paths: [/]\n" + sub("out: cp.zarr", f"out: {outside(ctx)}/cp.zarr"),
            "refuse",
            None,
            None,
        ),
        (
            "allow-paths-only",
            "allow_paths: [/] alone (a spec cannot widen its sandbox)",
            "allow_paths: [/]\n" + B,
            "refuse",
            None,
            None,
        ),
        (
            "storage-in-spec",
            "storage: pointing outside (--storage wins)",
            lambda ctx: f"storage: {outside(ctx)}\n" + B,
            "run",
            None,
            outputs_inside,
        ),
        (
            "cluster-closed-port",
            f"cluster: tcp://127.0.0.1:{port} (nothing listens)",
            f"cluster: tcp://127.0.0.1:{port}\n" + B,
            "either",
            None,
            cluster_check,
        ),
        ("cluster-garbage", "cluster: not-a-cluster", "cluster: not-a-cluster\n" + B, "refuse", None, None),
        (
            "python-tag",
            "!!python/object/apply:os.system (must not run)",
            B
            + '  evil:\n    kind: export\n    result: !!python/object/apply:os.system ["touch PWNED"]\n'
            + "    format: npz\n    out: e.npz\n",
            "refuse",
            None,
            None,
        ),
        (
            "python-name-tag",
            "!!python/name:os.system",
            sub("rank: 2", "rank: !!python/name:os.system"),
            "refuse",
            None,
            None,
        ),
        ("yaml-bomb-top", "billion laughs: 9 levels of aliases under unknown keys", bomb(9) + B, "refuse", None, None),
        (
            "yaml-bomb-after",
            "billion laughs inside a step's 'after'",
            bomb(9) + sub("kind: decompose", "kind: decompose\n    after: *b8"),
            "refuse",
            None,
            None,
        ),
        (
            "yaml-deep-nesting",
            "10000 nested lists",
            B + "  x: " + "[" * 10000 + "]" * 10000 + "\n",
            "refuse",
            None,
            None,
        ),
        ("huge-key", "a 2 MB key", B + "k" * 2_000_000 + ": 1\n", "refuse", None, None),
        ("spec-is-directory", "the spec path is a directory", None, "refuse", None, None),
        ("spec-missing", "the spec file does not exist", None, "refuse", None, None),
    ]
    out = []
    for name, desc, text, must, setup, check in cases:
        if name == "spec-is-directory":

            def fn(ctx: Ctx) -> None:
                (ctx.dir / "spec.yaml").mkdir()
                _, outcome = ctx.run(
                    ["run", str(ctx.dir / "spec.yaml"), "--storage", str(ctx.dir / "root")], ok_codes=(0, 3)
                )
                if outcome is None:
                    ctx.silent("a directory was run as a spec")

            out.append(Case("spec", name, desc, fn))
            continue
        if name == "spec-missing":

            def fn2(ctx: Ctx) -> None:
                _, outcome = ctx.run(
                    ["run", str(ctx.dir / "nosuch.yaml"), "--storage", str(ctx.dir / "root")], ok_codes=(0, 3)
                )
                if outcome is None:
                    ctx.silent("a missing spec ran")

            out.append(Case("spec", name, desc, fn2))
            continue
        out.append(Case("spec", name, desc, spec_case(text, must, setup, check)))
    for action, desc in [
        ("new", "a new file dropped in (control: appended once, values summed)"),
        ("touch", "an ingested file touched (must not be appended again)"),
        ("rename", "an ingested file renamed (same content: not new)"),
        ("copy", "an ingested file copied under a new name (same content: not new)"),
        ("edit", "an ingested file edited under its name (must be an error)"),
    ]:
        out.append(Case("spec", f"nightly-{action}", f"nightly spec run twice: {desc}", nightly_case(action)))
    for oc, desc in [
        ("append", "the edited content added as new data, the old kept"),
        ("replace-version", "the next version built from the edited content instead of the old"),
    ]:
        out.append(
            Case(
                "spec",
                f"nightly-edit-{oc}",
                f"nightly spec, on_changed: {oc}, a file edited: {desc}",
                nightly_case("edit", oc),
            )
        )
    return out


# --- sweep 4: fuzz --------------------------------------------------------------------------------

TNS_TOKENS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e300",
    "1e200",
    "-1e300",
    "1e400",
    "-1",
    "0",
    "-0",
    "1e-310",
    "4.9e-324",
    "2.5",
    "+3",
    "3.0",
    "0x10",
    "1_000",
    "18446744073709551616",
    "9223372036854775807",
    "1152921504606846976",
    "4294967296",
    "99999999999",
    "abc",
    "foo",
    "#",
    "\t",
    "\r",
    "\r\n",
    "\n",
    " ",
    "\x00",
    "\xe9",
    "é",
    "\x0b",
    "1 2",
    "1.0.0",
    "--",
    "e5",
]
SPEC_TOKENS = [
    ":",
    "-",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a",
    "*a",
    "!!python/object/apply:os.system [touch PWNED]",
    "!!str",
    "|",
    ">",
    "#",
    "%YAML 1.1",
    "@",
    "`",
    '"',
    "'",
    "?",
    "\t",
    "\n",
    "---",
    "...",
    "~",
    "null",
    "true",
    "false",
    "yes",
    "no",
    ".nan",
    ".inf",
    "-.inf",
    "1e300",
    "-1",
    "0",
    "1e400",
    "99999999999999999999",
    "0x10",
    "2.5",
    "../",
    "/",
    "/etc",
    "..",
    "kind",
    "rank",
    "allow_paths: [/]",
    "cluster: tcp://127.0.0.1:9",
    "steps",
    "out",
    "input",
    "after: [convert]",
    "after: [decompose]",
]


def mutate(data: bytes, rng: random.Random, tokens: list[str]) -> tuple[bytes, str]:
    """One seeded mutation: a bit flip, a random byte, a truncation, a token inserted (at a token
    boundary or anywhere), a token replaced, a line duplicated, deleted or swapped."""
    b = bytearray(data)
    kind = rng.choices(
        ["flip", "byte", "truncate", "insert", "insert-raw", "replace", "dupline", "delline", "swap"],
        [15, 6, 8, 14, 6, 33, 8, 6, 4],
    )[0]
    if not b:
        return bytes(b), "empty"
    pos = rng.randrange(len(b))
    if kind == "flip":
        b[pos] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip bit at {pos}"
    if kind == "byte":
        b[pos] = rng.randrange(256)
        return bytes(b), f"byte {b[pos]:#x} at {pos}"
    if kind == "truncate":
        return bytes(b[:pos]), f"truncate at {pos}"
    tok = rng.choice(tokens)
    if rng.random() < 0.35:
        tok = rng.choice(
            [
                str(rng.randint(-10, 10 ** rng.randint(1, 25))),
                str(rng.randint(1, 9)),
                f"{rng.uniform(-1e6, 1e6):.{rng.randint(1, 17)}g}",
                f"{rng.uniform(0, 10):.6f}e{rng.randint(-330, 330)}",
                "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8))),
            ]
        )
    if kind == "insert":
        bounds = [m.start() for m in re.finditer(rb"(?<=\s)|$", bytes(b))] or [pos]
        at = rng.choice(bounds)
        return bytes(b[:at]) + tok.encode() + b" " + bytes(b[at:]), f"insert {tok!r} at {at}"
    if kind == "insert-raw":
        return bytes(b[:pos]) + tok.encode() + bytes(b[pos:]), f"insert {tok!r} at {pos}"
    if kind == "replace":
        spans = [m.span() for m in re.finditer(rb"[^\s:\[\]{},]+", bytes(b))]
        s, e = rng.choice(spans) if spans else (pos, pos)
        return bytes(b[:s]) + tok.encode() + bytes(b[e:]), f"replace {bytes(b[s:e]).decode('latin-1')!r} by {tok!r}"
    lines = bytes(b).split(b"\n")
    i = rng.randrange(len(lines))
    if kind == "dupline":
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
        return b"\n".join(lines), f"duplicate line {i + 1}"
    if kind == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines), f"swap lines {i + 1} and {j + 1}"
    del lines[i]
    return b"\n".join(lines), f"delete line {i + 1}"


def fuzz_tns_case(i: int, seed: int) -> Case:
    rng = random.Random(f"{seed}-tns-{i}")
    base = _tns_lines(small_rows(25, 9, (6, 5, 4)))
    data, what = base, []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        data, w = mutate(data, rng, TNS_TOKENS)
        what.append(w)

    def fn(ctx: Ctx) -> None:
        ref = ref_parse(data)
        src = ctx.dir / "in.tns"
        src.write_bytes(data)
        store = ctx.dir / "out.zarr"
        c, outcome = ctx.run(["convert", str(src), str(store)])
        ctx.flags.append(f"reference: {ref.status}" + (f" ({ref.reason})" if ref.reason else ""))
        if outcome == "clear error":
            if ref.status == "valid":
                ctx.flags.append("valid input refused")
            return
        if outcome is not None:
            return
        if ref.status == "invalid":
            ctx.silent(f"convert accepted what the reference parser refuses ({ref.reason})")
            return
        if compare_store(ctx, store, ref):
            c, outcome = ctx.run(["info", str(store), "--json"])
            if outcome is None:
                check_info(ctx, c, ref)

    return Case("fuzz", f"tns-{i:03d}", "; ".join(what), fn)


def fuzz_spec_case(i: int, seed: int) -> Case:
    rng = random.Random(f"{seed}-spec-{i}")
    data, what = SPEC_BASE.encode(), []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        data, w = mutate(data, rng, SPEC_TOKENS)
        what.append(w)

    def fn(ctx: Ctx) -> None:
        root = ctx.dir / "root"
        (root / "in.tns").write_bytes(_tns_lines(small_rows(200, 7, (12, 9, 7))))
        spec = ctx.dir / "spec.yaml"
        spec.write_bytes(data)
        before = set(ctx.dir.rglob("*"))
        _, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0, 3))
        stray = files_outside(ctx.dir, root, before)
        if stray:
            ctx.silent(f"wrote outside the storage root: {stray[:3]}")
        if (ctx.dir / "PWNED").exists() or (root / "PWNED").exists():
            ctx.silent("a YAML tag ran code")
        if outcome is not None:
            return
        doc, why = ref_spec(data)
        if doc is None:
            ctx.silent(f"accepted a spec the reference loader refuses: {why}")
            return
        rr = root.resolve()
        for name, st in doc["steps"].items():
            i = st.get("input")
            p = (root / i).resolve() if not os.path.isabs(i) else Path(i).resolve()
            if rr != p and rr not in p.parents:
                ctx.silent(f"step {name}: input {i!r} outside the storage root was read")
            o = st.get("out")
            p = (root / o).resolve() if not os.path.isabs(o) else Path(o).resolve()
            if rr != p and rr not in p.parents:
                ctx.silent(f"step {name}: output {o!r} outside the storage root")
            elif not p.exists():
                ctx.silent(f"step {name}: output {o!r} does not exist after exit 0")

    return Case("fuzz", f"spec-{i:03d}", "; ".join(what), fn)


def fuzz_cases(n: int, seed: int) -> list[Case]:
    return [fuzz_tns_case(i, seed) for i in range(n)] + [fuzz_spec_case(i, seed) for i in range(n)]


# --- report ---------------------------------------------------------------------------------------


def first_lines(r: dict, n: int = 4) -> list[str]:
    lines = []
    for c in r["commands"]:
        if c["rc"] == 0 and not c["timed_out"] and r["outcome"] != "silent":
            continue
        err = [ln for ln in c["stderr"].splitlines() if ln.strip() and "%|" not in ln]
        outl = [ln for ln in c["stdout"].splitlines() if ln.strip()]
        head = [f"$ {' '.join(c['argv'][:2])} ... -> rc {c['rc']}{' (timeout)' if c['timed_out'] else ''}"]
        if "Traceback (most recent call last)" in c["stderr"]:
            head.append("  " + _exception_line(c["stderr"]))
        head += ["  " + ln[:200] for ln in (err[: n - 2] if err else outl[: n - 2])]
        lines += head
    return lines[: n + 4]


def report(results: list[dict], sweeps: list[str], wall: float, commit: str) -> int:
    print(f"\nbench_hostile on {commit}, {len(results)} cases in {wall:.0f} s\n")
    w = max(len(o) for o in OUTCOMES)
    print(f"{'sweep':8s} " + " ".join(f"{o:>{w}s}" for o in OUTCOMES) + f" {'total':>7s}")
    tot = {o: 0 for o in OUTCOMES}
    for s in sweeps:
        rs = [r for r in results if r["sweep"] == s]
        if not rs:
            continue
        cnt = {o: sum(r["outcome"] == o for r in rs) for o in OUTCOMES}
        for o in OUTCOMES:
            tot[o] += cnt[o]
        print(f"{s:8s} " + " ".join(f"{cnt[o]:>{w}d}" for o in OUTCOMES) + f" {len(rs):>7d}")
    print(f"{'total':8s} " + " ".join(f"{tot[o]:>{w}d}" for o in OUTCOMES) + f" {len(results):>7d}")
    bad = [r for r in results if r["outcome"] not in ("ok", "clear error")]
    refused = [r for r in results if "valid input refused" in r["flags"]]
    if bad:
        print(f"\n{len(bad)} cases neither ok nor a clear error:")
        for r in bad:
            print(f"\n[{r['outcome']}] {r['sweep']}/{r['name']}: {r['desc'][:150]}")
            print(f"  why: {r['why'][:400]}")
            for ln in first_lines(r):
                print("  " + ln)
    if refused:
        print(f"\n{len(refused)} valid inputs refused:")
        for r in refused:
            print(f"  {r['sweep']}/{r['name']}: {r['desc'][:100]}: {r['why'][:200]}")
    status = 0 if tot["silent"] == tot["traceback"] == tot["hang"] == 0 and not refused else 1
    print(
        f"\nTOTAL {len(results)} cases: "
        + ", ".join(f"{tot[o]} {o}" for o in OUTCOMES)
        + f"; {len(refused)} valid inputs refused -> exit {status}"
    )
    return status


def git_commit() -> str:
    try:
        h = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "tensorflow_ooc"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return h + (f" + {len(dirty.splitlines())} uncommitted package files" if dirty else "")
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    global TFOOC, TIMEOUT, MEM_LIMIT
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=SWEEPS, action="append", help="run only this sweep (repeatable)")
    ap.add_argument("--fuzz", type=int, default=200, help="mutations of the .tns and of the spec (default 200 each)")
    ap.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="cases run at once (default: 2, or 1 on one core; a full run at 1 takes about twice as long)",
    )
    ap.add_argument("--limit", type=int, default=None, help="only the first N cases of each sweep")
    ap.add_argument("--match", default=None, help="only cases whose name contains this")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per command before it counts as a hang")
    ap.add_argument("--mem-limit", type=float, default=6.0, help="GiB of address space per command (default 6)")
    ap.add_argument("--tfooc", default=None, help="the tfooc executable (default .venv/bin/tfooc, else PATH)")
    ap.add_argument("--json", default=None, help="write every case's result here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (printed)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    found = shutil.which(args.tfooc) if args.tfooc else (TFOOC if Path(TFOOC).exists() else shutil.which("tfooc"))
    if not found:
        ap.error(f"no tfooc executable ({args.tfooc or TFOOC}, nor on PATH): pass --tfooc")
    TFOOC = str(Path(found).absolute())
    TIMEOUT = args.timeout
    MEM_LIMIT = int(args.mem_limit * (1 << 30))
    sweeps = args.only or list(SWEEPS)
    makers = {
        "tns": tns_cases,
        "store": store_cases,
        "spec": spec_cases,
        "fuzz": lambda: fuzz_cases(args.fuzz, args.seed),
        "outputs": output_cases,
    }
    cases: list[Case] = []
    for s in sweeps:
        cs = makers[s]()
        if args.match:
            cs = [c for c in cs if args.match in c.name]
        cases += cs[: args.limit] if args.limit else cs
    if args.list:
        for c in cases:
            print(f"{c.sweep:6s} {c.name:34s} {c.desc}" + (f"\n{'':41s}identical result: {c.why}" if c.why else ""))
        print(f"{len(cases)} cases")
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    try:
        return _run_all(cases, sweeps, args, base)
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _run_all(cases: list[Case], sweeps: list[str], args: argparse.Namespace, base: Path) -> int:
    shared: dict = {"keep": args.keep}
    env = dict(os.environ, TFOOC_STORAGE=str(base / "root"))
    t0 = time.monotonic()
    commit_start = git_commit()
    print(
        f"bench_hostile: {len(cases)} cases ({', '.join(sweeps)}), {args.jobs} at a time, in {base}; "
        f"tfooc = {TFOOC}; commit {commit_start}",
        flush=True,
    )
    if any(c.sweep in ("store", "outputs") for c in cases):
        shared["store"] = prepare_store(base, env)
        for p in shared["store"]["problems"]:
            print(f"WARNING: {p}", flush=True)
    results: list[dict] = []
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futs = {pool.submit(run_case, c, base, shared): c for c in cases}
        for f in concurrent.futures.as_completed(futs):
            r = f.result()
            results.append(r)
            done += 1
            print(
                f"  [{done:4d}/{len(cases)}] {r['outcome']:11s} {r['sweep']}/{r['name']} ({r['seconds']:.1f} s)"
                + (f"  {r['why'][:110]}" if r["outcome"] not in ("ok", "clear error") else ""),
                flush=True,
            )
    order = {(c.sweep, c.name): i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order[(r["sweep"], r["name"])])
    commit_end = git_commit()
    commit = (
        commit_start if commit_end == commit_start else f"{commit_start} (tree changed to {commit_end} during the run)"
    )
    status = report(results, sweeps, time.monotonic() - t0, commit)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "commit": commit,
                    "tfooc": TFOOC,
                    "sweeps": sweeps,
                    "fuzz": args.fuzz,
                    "seed": args.seed,
                    "jobs": args.jobs,
                    "exit_status": status,
                    "cases": results,
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
