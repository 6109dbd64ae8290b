"""The package's structure and style, checked by the tools that own them (docs/ARCHITECTURE.md):
import-linter's contract in pyproject.toml (layers, kernel families, no root imports below the
decompositions, no import cycles) and ruff's lint and format check. A failure prints the offending
import or line."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it is in the test extra (pip install -e '.[test]')")
    return found


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_import_contract_is_kept():
    r = _run(_tool("lint-imports"), "--no-cache")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout or "broken" not in r.stdout.split("Contracts:")[-1].split("\n")[0]


def test_ruff_lint_is_clean():
    r = _run(_tool("ruff"), "check", ".")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_ruff_format_is_kept():
    r = _run(_tool("ruff"), "format", "--check", ".")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
