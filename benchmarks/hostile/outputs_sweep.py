"""The outputs sweep (issue 45): outputs that could destroy the user's data, two writers, read-only
and permission-denied destinations, and the messages users found confusing."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from . import harness
from .harness import CLEAR, Case, Cmd, Ctx
from .reference import compare_store, ref_parse
from .tns_sweep import _tns_lines, small_rows


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
        argv = [harness.TFOOC, "cpd", str(x), "--rank", "2", "--seed", "0", "--out", str(out), "--scheduler", "inline"]
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
            out1, err1 = first.communicate(timeout=harness.TIMEOUT)
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
        [*prefix, harness.TFOOC, *args],
        cwd=ctx.dir,
        env=ctx.env,
        capture_output=True,
        text=True,
        timeout=harness.TIMEOUT,
    )
    c = Cmd([*prefix, harness.TFOOC, *args], p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    ctx.cmds.append(c)
    return c
