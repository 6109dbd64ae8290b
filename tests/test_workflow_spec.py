"""Workflow specs: every kind of bad spec names the file, the line and the field, exits 2 and
starts nothing; the shipped specs validate."""

from pathlib import Path

import pytest

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec

WORKFLOWS = Path(__file__).resolve().parent.parent / "workflows"

GOOD = """\
name: ok
steps:
  generate:
    kind: generate
    out: t.tns
    shape: [{a}, {b}, {c}]
    nnz: 500
  convert:
    kind: convert
    input: t.tns
    out: t.zarr
  decompose:
    kind: decompose
    input: t.zarr
    out: t.cp.zarr
    rank: 3
"""


def _spec(tmp_path, rng, text=GOOD, **fmt):
    dims = dict(a=int(rng.integers(5, 30)), b=int(rng.integers(5, 30)), c=int(rng.integers(5, 30)))
    dims.update(fmt)
    path = tmp_path / "spec.yaml"
    path.write_text(text.format(**dims))
    return path


def _error(path, storage):
    with pytest.raises(SpecError) as info:
        load_spec(path, storage=str(storage))
    return info.value


def _line_of(path, needle):
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    "case",
    [
        "yaml",
        "type",
        "unknown-kind",
        "unknown-key",
        "missing-input",
        "outside-root",
        "cycle",
        "unknown-after",
        "duplicate-key",
    ],
)
def test_bad_spec_names_file_line_field_and_exits_2(tmp_path, rng, capsys, case):
    storage = tmp_path / "storage"
    storage.mkdir()
    good = _spec(tmp_path, rng).read_text()
    edits = {
        "yaml": (good.replace("    rank: 3", "    rank: [3"), "rank: [3", None, "YAML error"),
        "type": (
            good.replace("rank: 3", "rank: three"),
            "rank: three",
            "steps.decompose.rank",
            "expected a valid integer, got 'three'",
        ),
        "unknown-kind": (
            good.replace("kind: convert", "kind: convrt"),
            "kind: convrt",
            "steps.convert.kind",
            "unknown step kind 'convrt' (expected one of: generate, convert",
        ),
        "unknown-key": (
            good.replace("    rank: 3", "    rank: 3\n    ranks: 4"),
            "ranks: 4",
            "steps.decompose.ranks",
            "unknown key (expected one of:",
        ),
        "missing-input": (
            good.replace("input: t.tns", "input: elsewhere.tns"),
            "input: elsewhere.tns",
            "steps.convert.input",
            "missing input",
        ),
        "outside-root": (
            good.replace("out: t.cp.zarr", f"out: {tmp_path}/outside.cp.zarr"),
            "outside.cp.zarr",
            "steps.decompose.out",
            "outside the storage root",
        ),
        "cycle": (
            good.replace("out: t.tns", "out: t.tns\n    after: [decompose]"),
            "  generate:",
            "steps.generate",
            "cyclic dependency: generate -> decompose -> convert -> generate",
        ),
        "unknown-after": (
            good.replace("out: t.tns", "out: t.tns\n    after: [nowhere]"),
            "after: [nowhere]",
            "steps.generate.after.0",
            "unknown step 'nowhere'",
        ),
        "duplicate-key": (
            good.replace("    rank: 3", "    rank: 3\n    rank: 4"),
            "rank: 4",
            "steps.decompose.rank",
            "duplicate key",
        ),
    }
    text, needle, field, message = edits[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    err = _error(path, storage)
    first = err.problems[0]
    assert first.line == _line_of(path, needle), str(err)
    assert first.field == field and message in first.message, str(err)
    assert str(path) in str(err) and f"line {first.line}" in str(err)
    # the command line: one error, exit 2, nothing started under the storage root
    assert main(["run", str(path), "--storage", str(storage)]) == 2
    assert f"{path}, line {first.line}" in capsys.readouterr().err
    assert not (storage / ".tfooc").exists() and sorted(p.name for p in storage.iterdir()) == []


@pytest.fixture(autouse=True)
def _no_operator_settings(tmp_path, monkeypatch):
    # what the operator allows comes from the command line, the environment and a config file:
    # none of this machine's leaks into the tests
    monkeypatch.delenv("TFOOC_ALLOW_PATHS", raising=False)
    monkeypatch.delenv("TFOOC_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))


def test_allow_paths_admits_outside_locations_and_all_problems_are_listed(tmp_path, rng):
    storage, extra = tmp_path / "storage", tmp_path / "published"
    storage.mkdir()
    extra.mkdir()
    text = (
        _spec(tmp_path, rng).read_text()
        + f"""\
  export:
    kind: export
    result: t.cp.zarr
    format: npz
    out: {extra}/factors.npz
"""
    )
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="outside the storage root"):
        load_spec(path, storage=str(storage))
    # the operator allows the folder: a spec without allow_paths may use it
    wf = load_spec(path, storage=str(storage), allow_paths=[str(extra)])
    assert wf.step("export").outputs["out"] == str(extra / "factors.npz")
    # a spec's allow_paths alone does not widen its sandbox
    path.write_text(f"allow_paths: [{extra}]\n" + text)
    err = _error(path, storage)
    assert (err.problems[0].line, err.problems[0].field) == (1, "allow_paths.0"), str(err)
    assert "not inside a folder the operator allows" in err.problems[0].message
    # inside what the operator allows (here its parent), the spec's entry is accepted
    wf = load_spec(path, storage=str(storage), allow_paths=[str(tmp_path)])
    assert [s.name for s in wf.steps] == ["generate", "convert", "decompose", "export"]
    assert wf.step("export").outputs["out"] == str(extra / "factors.npz")
    assert wf.step("decompose").deps == ["convert"]
    # several problems at once: each with its own line
    bad = text.replace("rank: 3", "rank: -1").replace("nnz: 500", "nnz: lots")
    path.write_text(bad)
    err = _error(path, storage)
    assert [p.field for p in err.problems] == ["steps.generate.nnz", "steps.decompose.rank"]
    assert [p.line for p in err.problems] == [_line_of(path, "nnz: lots"), _line_of(path, "rank: -1")]


def test_no_code_runs_from_yaml(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\nsteps: {{}}\n")
    err = _error(path, tmp_path)
    assert err.problems[0].line == 1 and "YAML error" in str(err)
    assert not marker.exists()


def test_shipped_specs_validate(tmp_path):
    (tmp_path / "nightly" / "incoming").mkdir(parents=True)
    for name in ("quickstart", "nightly", "gpu"):
        wf = load_spec(WORKFLOWS / f"{name}.yaml", storage=str(tmp_path))
        assert wf.name == name and all(o.startswith(str(tmp_path)) for o in wf.outputs())
    q = load_spec(WORKFLOWS / "quickstart.yaml", storage=str(tmp_path))
    assert [s.kind for s in q.steps] == ["generate", "convert", "decompose", "evaluate", "export"]
    n = load_spec(WORKFLOWS / "nightly.yaml", storage=str(tmp_path))
    assert n.step("decompose").model.init == "previous" and n.step("ingest").model.append
    assert n.step("publish").deps == ["evaluate", "decompose"]  # explicit, then by path
