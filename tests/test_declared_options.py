"""Options declared once (decompositions/<family>/options.py): the API signature and docstring, the
CLI flags and the workflow step model of every method come from one declaration, and the three
surfaces hand the method the same values for the same settings."""

import argparse
import inspect
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.cli.declared_flags import add_declared, declared_keywords
from tensorflow_ooc.decompositions.apr.options import CP_APR
from tensorflow_ooc.decompositions.common.option_values import api_keywords
from tensorflow_ooc.decompositions.completion.options import TUCKER_SGD
from tensorflow_ooc.decompositions.cp.options import CP_ALS
from tensorflow_ooc.decompositions.tt.options import TT_ALS
from tensorflow_ooc.decompositions.tucker.options import TTM_KERNELS, TUCKER_HOOI
from tensorflow_ooc.execution import DeviceOptions
from tensorflow_ooc.workflow import step_models as M

ROOT = Path(__file__).resolve().parent.parent

METHODS = {
    "cp_als": (CP_ALS, tfo.cp_als, {"method": "cp", "rank": 3}),
    "cp_apr": (CP_APR, tfo.cp_apr, {"method": "cp-apr", "rank": 3}),
    "tt_als": (TT_ALS, tfo.tt_als, {"method": "tt", "ranks": 2}),
    "tucker_hooi": (TUCKER_HOOI, tfo.tucker_hooi, {"method": "tucker", "ranks": 2}),
    "tucker_sgd": (TUCKER_SGD, tfo.tucker_sgd, {"method": "completion", "ranks": 2, "core_rank": 2}),
}


def _other_value(option, rng: random.Random):
    """A value of ``option`` other than its default, as the CLI text and the typed value."""
    v = option.values
    choices = [c for c in (option.cli_choices or v.choices or ()) if c != option.default]
    if choices:
        c = rng.choice(choices)
        return c, c
    if v.kind == "bool":
        return None, not option.default
    if v.kind in ("int", "seed"):
        n = rng.randint(2, 40) + int(option.default or 0)
        return str(n), n
    if v.kind == "size":
        n = rng.randint(1, 9)
        return f"{n}GiB", n * 2**30
    if v.kind == "float":
        high = v.high if v.high is not None else 10.0
        x = round(rng.uniform(0.01, high * 0.9), 4)
        return repr(x), x
    if v.kind == "str":
        return "somewhere.zarr", "somewhere.zarr"
    raise AssertionError(f"no test value for {option.name} ({v.kind})")


@pytest.mark.parametrize("name", list(METHODS))
def test_api_signature_and_docstring_come_from_the_declaration(name):
    options, function, _ = METHODS[name]
    params = inspect.signature(function).parameters
    declared = {o.name: o.default for o in options if o.api}
    keywords = {p.name: p.default for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == declared
    for o in (*options.arguments, *options):
        if o.api:
            assert f"\n    {o.name} : " in function.__doc__, o.name
    positional = [p.name for p in params.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional[1:] == [a.name for a in options.arguments]
    assert "{options}" not in function.__doc__


@pytest.mark.parametrize("name", list(METHODS))
def test_an_unknown_keyword_is_refused_naming_it(name):
    _, function, _ = METHODS[name]
    first = [p for p in inspect.signature(function).parameters.values() if p.default is inspect.Parameter.empty]
    args = [np.zeros((2, 2, 2))] + [2] * (len(first) - 1)
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'max_iter_s'"):
        function(*args, max_iter_s=3)


@pytest.mark.parametrize("name", list(METHODS))
def test_cli_flags_and_spec_keys_give_the_api_the_same_values(name):
    """Every declared option set away from its default on the command line and in a spec reaches
    the method with that value, by its API name, from both."""
    options, _, required = METHODS[name]
    rng = random.Random()
    parser = argparse.ArgumentParser()
    add_declared(parser, options)
    argv, expected, spec = [], {}, dict(required)
    for a in options.arguments:  # the method's required arguments, as the spec's
        value = required[a.name]
        argv += [a.cli_flags[0], str(value)]
        expected[a.name] = (value,) if a.values.kind == "ranks" else value
    for o in options.on_cli():
        if o.group and any(p.group == o.group and p.name in expected for p in options.on_cli()):
            continue  # one of a group that excludes the others
        text, value = _other_value(o, rng)
        argv += [o.cli_flags[0]] + ([] if text is None else [text])
        expected[o.name] = value
        if o.spec_key is not None:
            spec[o.spec_key] = value if o.values.kind != "size" else f"{value // 2**30}GiB"
    keywords = declared_keywords(parser.parse_args(argv), options)
    for key, value in expected.items():
        if key in {a.name for a in options.arguments}:
            continue  # the command passes its arguments itself
        if key in ("conflict", "streams", "device_memory_limit"):
            assert getattr(keywords["device_options"], key) == value, key
        else:
            assert keywords[key] == value, key
    assert set(keywords) <= set(options.names)
    parsed = parser.parse_args(argv)
    for a in options.arguments:
        assert getattr(parsed, a.name) == expected[a.name], a.name

    if name == "cp_als" and spec.get("nonnegative") and spec.get("method") not in ("cp", "exact"):
        spec["method"] = "exact"  # nonnegative CP-ALS takes the exact solver only
        expected["method"] = "exact"
    if name == "cp_als" and spec.get("reg") and not spec.get("nonnegative"):
        spec["nonnegative"] = True
    if name == "cp_apr":
        spec["algorithm"] = "pdnr"
        for k in ("kappa", "kappa_tol"):
            spec.pop(k, None)
    if name == "tt_als":
        spec["algorithm"] = "randomized"
    step = M.Spec.model_validate(
        {"version": 1, "name": "x", "steps": {"s": {"kind": "decompose", "input": "a.zarr", "out": "b.zarr", **spec}}}
    ).steps["s"]
    from_spec = api_keywords(step._declared_options, step.declared_values())
    for o in options.in_spec():
        if o.spec_key in spec and o.api:
            want = spec[o.spec_key]
            if o.values.kind == "size":
                want = int(want[:-3]) * 2**30
            if name == "cp_als" and o.name == "method" and want == "cp":
                want = "exact"
            assert from_spec[o.name] == want, o.name
    if any(o.name == "conflict" for o in options.in_spec()):
        assert isinstance(from_spec["device_options"], DeviceOptions)


def test_declared_ttm_kernels_are_the_kernel_selectors():
    from tensorflow_ooc.kernels.ttm.select import KERNELS

    assert TTM_KERNELS == KERNELS


def test_specs_keep_their_fingerprints_for_keys_added_later():
    """A key a spec gained later (CP-APR's device) leaves the settings of specs that do not set it as they were."""
    from tensorflow_ooc.workflow.plan import PlannedStep

    def config(extra):
        spec = {"kind": "decompose", "input": "a.zarr", "out": "b.zarr", "method": "cp-apr", "rank": 3, **extra}
        step = M.Spec.model_validate({"version": 1, "name": "x", "steps": {"s": spec}}).steps["s"]
        return PlannedStep("s", step, {}, {}).config()

    assert "device" not in config({})
    assert config({"device": "gpu"})["device"] == "gpu"


@pytest.mark.skipif(shutil.which("cp") is None, reason="needs cp")
def test_the_contract_refuses_an_import_between_two_families(tmp_path):
    """The import contract fails when one decomposition family imports another."""
    lint = Path(sys.executable).parent / "lint-imports"
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copytree(ROOT / "tensorflow_ooc", copy / "tensorflow_ooc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "tensorflow_ooc" / "decompositions" / "cp" / "options.py"
    target.write_text(target.read_text() + "\nfrom ..tt.options import TT_ALS  # noqa: E402,F401\n")
    env = {"PYTHONPATH": str(copy), "PATH": str(Path(sys.executable).parent)}
    r = subprocess.run([str(lint), "--no-cache"], cwd=copy, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode != 0
    assert "Decomposition families" in r.stdout and "BROKEN" in r.stdout.upper()
    said = " ".join(r.stdout.split())
    assert "tensorflow_ooc.decompositions.cp.options -> tensorflow_ooc.decompositions.tt.options" in said
