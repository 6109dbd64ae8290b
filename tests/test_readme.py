"""The README's Python example runs as written, and its first lines hold exactly the two commands."""

import re
import runpy
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(block)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script))
    assert (tmp_path / "storage" / "example.zarr" / "zarr.json").exists()


def test_readme_starts_with_two_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert len(first) == 2
    assert "tfooc run workflows/quickstart.yaml" in first[0] and "pytest" in first[1]
    ci = (README.parent / ".ci" / "run").read_text()
    assert first[1] in ci


def test_readme_tables_example_runs(tmp_path, monkeypatch):
    text = README.read_text()
    section = text[text.index("### Tables in, labelled factors out") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "tables.py"
    script.write_text(block)
    (tmp_path / "storage").mkdir()
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script))
    assert (tmp_path / "storage" / "events-factors" / "user.parquet").exists()
    assert (tmp_path / "storage" / "events-v2.zarr" / "labels" / "mode0.parquet").exists()
