"""Command-line polish that goes with workflows: cpd refuses to overwrite an earlier result, info
tells chunk capacity from chunk contents, quickstart is the quickstart spec."""

import json

from conftest import random_coo

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import find_quickstart_spec, main
from tensorflow_ooc.workflow import load_spec


def test_cpd_twice_without_out_refuses_and_says_how_to_proceed(tmp_path, rng, capsys):
    coords, values = random_coo(rng, (int(rng.integers(8, 20)), int(rng.integers(8, 20)), 9), 400)
    store = tfo.convert((coords, values), tmp_path / "s.zarr")
    args = ["cpd", str(store.path), "--rank", "2", "--max-iters", "3", "--tol", "0", "-q"]
    assert main(args) == 0
    default_out = f"{store.path}.cp-r2.zarr"
    first = tfo.load_result(default_out)
    capsys.readouterr()
    assert main(args + ["--seed", "7"]) == 2
    err = capsys.readouterr().err
    assert default_out in err and "--out" in err and "--overwrite" in err and "--resume" in err
    assert tfo.load_result(default_out).history == first.history  # untouched
    assert main(args + ["--seed", "7", "--overwrite"]) == 0
    assert tfo.load_result(default_out).params["seed"] == 7
    assert main(args + ["--max-iters", "5", "--resume"]) == 0  # continuing is not overwriting
    assert tfo.load_result(default_out).iterations == 5


def test_info_reports_chunk_capacity_apart_from_contents(tmp_path, rng, capsys):
    nnz = int(rng.integers(300, 900))
    coords, values = random_coo(rng, (30, 40, 50), nnz)
    one = tfo.convert((coords, values), tmp_path / "one.zarr")
    assert main(["info", str(one.path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("chunks"))
    assert f"({nnz:,} nonzeros; capacity {one.chunk_nnz:,} nonzeros per chunk" in line
    cap = int(rng.integers(50, 120))
    many = tfo.convert((coords, values), tmp_path / "many.zarr", chunk_nnz=cap)
    assert main(["info", str(many.path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("chunks"))
    last = nnz - (many.nchunks - 1) * cap
    assert line.split()[1] == f"{many.nchunks:,}" and (f"the last {last:,}" in line or last == cap)
    assert main(["info", str(many.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chunk_nnz"] == cap


def test_quickstart_is_the_quickstart_spec(tmp_path, capsys):
    spec = find_quickstart_spec()
    assert spec.name == "quickstart.yaml" and spec.parent.name == "workflows"
    wf = load_spec(spec, storage=str(tmp_path))
    gen = wf.step("generate").model
    assert gen.model == "planted" and gen.like == "uber" and gen.noise > 0
    assert wf.step("evaluate").inputs["reference"] == wf.step("generate").outputs["factors_out"]
    try:
        main(["quickstart", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "workflows/quickstart.yaml" in capsys.readouterr().out
