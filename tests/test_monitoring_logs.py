"""Structured logs (``--log-format json``) and log lines that never land on a progress bar."""

from __future__ import annotations

import json
import re

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
    iterations = [d for d in lines if d["logger"] == "tensorflow_ooc.decompositions.cp_als" and "iteration" in d]
    assert [d["iteration"] for d in iterations] == [1, 2, 3, 4]
    assert all(d["run_id"] == run_id and d["step"] == "decompose" and d["level"] == "INFO" for d in iterations)

    assert main(["--log-format", "json", "status", "--storage", str(tmp_path / "s"), "nope"]) == 2
    assert capsys.readouterr().err.startswith("tfooc: error: no run 'nope'")  # errors stay one plain line


def test_log_lines_do_not_interleave_with_bars(tmp_path, capsys):
    # generating to a store draws bars while the converter logs
    assert main(["generate", str(tmp_path / "g.zarr"), "--shape", "300,200,100", "--nnz", "300000"]) == 0
    err = capsys.readouterr().err
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

    # the same with JSON lines: each rendered line is a bar or a whole JSON object
    assert (
        main(
            ["--log-format", "json", "generate", str(tmp_path / "h.zarr"), "--shape", "300,200,100", "--nnz", "300000"]
        )
        == 0
    )
    lines = rendered(capsys.readouterr().err)
    objs = [json.loads(s) for s in lines if not BAR.search(s)]
    assert len(objs) >= 3 and all(s.startswith("{") for s in lines if not BAR.search(s))
