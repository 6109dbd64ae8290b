"""``${VAR}`` references where YAML has braces of its own, and the JSON Schema of specs: a
reference inside a flow mapping (``{rank: ${RANK:-16}}``, as the READMEs write it) is substituted,
not a YAML error; ``tfooc schema`` accepts a reference wherever ``tfooc validate`` does, and a bad
step is reported at its field, not as "not valid under any of the given schemas"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow import SpecError, load_spec

REPO = Path(__file__).resolve().parent.parent


def _readme_spec() -> str:
    """The spec of workflows/README.md that holds ``rank: ${RANK:-16}`` in a flow mapping."""
    text = (REPO / "workflows" / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    (block,) = [b for b in blocks if "${RANK:-16}" in b]
    assert re.search(r"\{[^}\n]*rank: \$\{RANK:-16\}\}", block), block  # in a flow mapping
    return block


def test_a_reference_in_a_flow_mapping_is_substituted(tmp_path, rng, monkeypatch, capsys):
    storage = tmp_path / "storage"
    (storage / "incoming").mkdir(parents=True)
    spec = tmp_path / "readme.yaml"
    spec.write_text(_readme_spec())
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("DROP_DIR", raising=False)
    wf = load_spec(spec, storage=str(storage))
    assert wf.step("decompose").model.rank == 16  # the default, typed as YAML types a plain 16
    rank = int(rng.integers(2, 40))
    monkeypatch.setenv("RANK", str(rank))
    assert load_spec(spec, storage=str(storage)).step("decompose").model.rank == rank
    assert main(["validate", str(spec), "--storage", str(storage)]) == 0
    assert "valid (2 steps" in capsys.readouterr().out
    # in flow sequences too, beside keys and a literal $${ that stay as written
    n = int(rng.integers(5, 50))
    text = (
        "steps:\n  g: {kind: generate, out: 'x-${TAG:-a}.tns', shape: [${N}, 7, 8], nnz: 30,"
        " description: '$${HOME} {braces}'}\n"
    )
    monkeypatch.setenv("N", str(n))
    g = load_spec(text=text, storage=str(storage)).step("g").model
    assert g.shape == [n, 7, 8] and g.out == "x-a.tns" and g.description == "${HOME} {braces}"


def test_yaml_errors_still_name_the_line_and_show_the_reference(tmp_path):
    text = "steps:\n  g: {kind: generate, out: t.tns, shape: [${N:-5}, 7, nnz: 30}\n"
    with pytest.raises(SpecError) as info:
        load_spec(text=text, storage=str(tmp_path))
    (p,) = info.value.problems
    assert p.line == 2 and "YAML error" in p.message and "$Q" not in str(info.value)


SPEC = """\
name: tuned
steps:
  generate:
    kind: generate
    out: t.zarr
    shape:
      - ${N:-30}
      - 20
      - 25
    nnz: ${NNZ:-500}
    noise: ${NOISE:-0.1}
    model: planted
  cp:
    kind: decompose
    input: t.zarr
    out: t.cp.zarr
    rank: ${RANK:-4}
    tol: ${TOL:-1e-6}
  tt:
    kind: decompose
    method: tt
    input: t.zarr
    out: t.tt.zarr
    ranks:
      - ${R:-2}
      - 3
"""


@pytest.fixture
def schema(capsys) -> dict:
    assert main(["schema"]) == 0
    return json.loads(capsys.readouterr().out)


def test_schema_accepts_references_where_validate_does(tmp_path, schema, monkeypatch, rng):
    for v in ("N", "NNZ", "NOISE", "RANK", "TOL", "R"):
        monkeypatch.delenv(v, raising=False)
    wf = load_spec(text=SPEC, storage=str(tmp_path))  # validate's view: the defaults, typed
    assert wf.step("cp").model.rank == 4 and wf.step("generate").model.shape == [30, 20, 25]
    assert wf.step("cp").model.tol == 1e-6  # 1e-6 is a float (PyYAML alone reads the text '1e-6')
    text = f"{rng.integers(1, 10)}e-{rng.integers(4, 9)}"  # no dot: YAML 1.2's float, not PyYAML's
    assert load_spec(text=SPEC, storage=str(tmp_path), overrides=[f"steps.cp.tol={text}"]).step(
        "cp"
    ).model.tol == float(text)
    validator = jsonschema.Draft202012Validator(schema)
    # an editor's view: the text as written (block style: a plain YAML parser reads a reference
    # in a flow collection as braces)
    errors = list(validator.iter_errors(yaml.safe_load(SPEC)))
    assert not errors, [(list(e.absolute_path), e.message) for e in errors]
    # the substituted spec is valid too
    assert not list(validator.iter_errors(yaml.safe_load(wf.source.effective_text)))


@pytest.mark.parametrize(
    "change, path, words",
    [
        ("rank: ${RANK:-4}", ["steps", "cp", "rank"], "sixteen"),
        ("kind: decompose\n    input: t.zarr\n    out: t.cp.zarr", ["steps", "cp", "kind"], "decompos"),
        ("- ${R:-2}", ["steps", "tt", "ranks", 0], "two"),
        ("nnz: ${NNZ:-500}", ["steps", "generate", "nnzz"], "nnzz"),
    ],
)
def test_schema_errors_name_the_field(schema, change, path, words):
    bad = {
        "rank: ${RANK:-4}": "rank: sixteen",
        "kind: decompose\n    input: t.zarr\n    out: t.cp.zarr": (
            "kind: decompos\n    input: t.zarr\n    out: t.cp.zarr"
        ),
        "- ${R:-2}": "- two",
        "nnz: ${NNZ:-500}": "nnzz: 500",
    }[change]
    data = yaml.safe_load(SPEC.replace(change, bad, 1))
    validator = jsonschema.Draft202012Validator(schema)
    errors = list(validator.iter_errors(data))
    assert errors
    best = jsonschema.exceptions.best_match(errors)
    where = list(best.absolute_path)
    if path[-1] == "nnzz":  # an unknown key is reported on its step, naming the key
        assert where == path[:-1] and "nnzz" in best.message, (where, best.message)
    else:
        assert where == path, (where, best.message)
    assert "is not valid under any of the given schemas" not in best.message or words in best.message
    assert words in best.message, best.message
