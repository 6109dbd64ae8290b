"""Structured logs (``--log-format json``), each iteration once in ``tfooc logs``, and log lines that
never land on a progress bar (drawn on a terminal only)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import sys
import termios
import threading
import time
from contextlib import contextmanager

from tensorflow_ooc.cli import main

SPEC = """\
name: logged
steps:
  generate: {kind: generate, out: t.zarr, shape: [20, 25, 30], nnz: 3000, model: planted, rank: 3, seed: 2}
  decompose: {kind: decompose, input: t.zarr, out: t.cp.zarr, rank: 3, max_iters: 4, tol: 0, seed: 1}
"""
TEXT_LINE = re.compile(r"\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
BAR = re.compile(r"\d+%\|")


def rendered(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: a carriage return moves back to column 0 and later
    characters overwrite earlier ones."""
    out = []
    for line in raw.split("\n"):
        buf: list[str] = []
        pos = 0
        for ch in line:
            if ch == "\r":
                pos = 0
                continue
            if pos < len(buf):
                buf[pos] = ch
            else:
                buf.append(ch)
            pos += 1
        out.append("".join(buf).rstrip())
    return [s for s in out if s]


def test_json_log_lines_carry_run_step_iteration(tmp_path, capsys):
    spec = tmp_path / "logged.yaml"
    spec.write_text(SPEC)
    # the option is global: before the command or after it
    assert main(["run", str(spec), "--storage", str(tmp_path / "s"), "--log-format", "json"]) == 0
    out, err = capsys.readouterr()
    run_id = out.split()[1].rstrip(":")  # "run RUN_ID: done in ..."
    lines = [json.loads(s) for s in rendered(err)]  # every line is one JSON object
    assert lines and all({"time", "level", "logger", "message"} <= set(d) for d in lines)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["time"]) for d in lines)
    run_lines = [d for d in lines if d.get("run_id") == run_id]
    assert {d.get("step") for d in run_lines} >= {"generate", "decompose"}
    iterations = [d for d in lines if d["logger"] == "tensorflow_ooc.decompositions.cp.cp_als" and "iteration" in d]
    assert [d["iteration"] for d in iterations] == [1, 2, 3, 4]
    assert all(d["run_id"] == run_id and d["step"] == "decompose" and d["level"] == "INFO" for d in iterations)

    # tfooc logs shows each iteration once (the step's iteration event, not also CP-ALS's log line)
    assert main(["logs", run_id, "--storage", str(tmp_path / "s")]) == 0
    shown = capsys.readouterr().out
    assert [shown.count(f"[decompose] iteration {i}: fit ") for i in (1, 2, 3, 4)] == [1, 1, 1, 1], shown
    assert main(["logs", run_id, "--storage", str(tmp_path / "s"), "--json"]) == 0
    events = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    assert sum("iteration 1: fit" in (e.get("message") or "") or e.get("iteration") == 1 for e in events) == 1

    assert main(["--log-format", "json", "status", "--storage", str(tmp_path / "s"), "nope"]) == 2
    (error,) = [json.loads(s) for s in capsys.readouterr().err.splitlines()]  # the error is a JSON line too
    assert error["level"] == "ERROR" and error["message"].startswith("no run 'nope'")


@contextmanager
def terminal_stderr(monkeypatch):
    """``sys.stderr`` on a real pseudo-terminal, as a person running tfooc has it (bars are drawn
    only there); yields a function returning what was written to it so far."""
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # no newline translation: what is read is what was written
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    # 24 rows of 120 columns: a terminal of no width gets bars of no width
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    chunks: list[bytes] = []

    def pump():  # the terminal's buffer is small: read it as it fills
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # the other end closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stream = open(slave, "w", buffering=1, closefd=False)
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        yield lambda: (stream.flush(), time.sleep(0.2), b"".join(chunks).decode())[-1]
    finally:
        monkeypatch.setattr(sys, "stderr", sys.__stderr__)
        stream.close()
        os.close(slave)
        reader.join(5)
        os.close(master)


def test_log_lines_do_not_interleave_with_bars(tmp_path, monkeypatch):
    # generating to a store draws bars while the converter logs: on a terminal
    with terminal_stderr(monkeypatch) as written:
        assert main(["generate", str(tmp_path / "g.zarr"), "--shape", "300,200,100", "--nnz", "300000"]) == 0
        err = written()
    assert BAR.search(err), "no progress bar was drawn"
    # some line was logged while a bar was on screen (bar and line share a raw line, split by \r)
    assert any(BAR.search(raw) and TEXT_LINE.search(raw) for raw in err.split("\n"))
    logged = 0
    for line in rendered(err):
        m = TEXT_LINE.search(line)
        if m:
            assert m.start() == 0 and not BAR.search(line), f"log line on a progress bar: {line!r}"
            logged += 1
    assert logged >= 3

    # JSON lines are for machines, even on a terminal: no bar at all, every line one JSON object
    with terminal_stderr(monkeypatch) as written:
        args = ["--log-format", "json", "generate", str(tmp_path / "h.zarr"), "--shape", "300,200,100"]
        assert main([*args, "--nnz", "300000"]) == 0
        err = written()
    assert "\r" not in err and not BAR.search(err)
    objs = [json.loads(s) for s in err.splitlines()]
    assert len(objs) >= 3 and all(isinstance(d, dict) for d in objs)
