"""Messages in the user's language (issue 45's smaller cases): no library text without the option
it concerns, the README's claims about refused values match what is refused, warnings print as
one log line, and the memory limit's meaning is in the help."""

import logging
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensorflow_ooc as tfo
from tensorflow_ooc.cli import main
from tensorflow_ooc.decompositions.common.checkpoint_files import read_npz
from tensorflow_ooc.decompositions.cp.checkpoint import read_checkpoint
from tensorflow_ooc.errors import DecompositionError, StoreError, ValueRangeError
from tensorflow_ooc.ingest.value_range import SQUARE_MAX, SQUARE_MIN

README = Path(__file__).resolve().parent.parent / "README.md"


def _store(tmp_path, values=(1.0, 2.0, 3.0, 4.0, 5.0), name="x.zarr", shape=(3, 4, 5)):
    coords = np.array([[0, 0, 0], [1, 1, 1], [2, 0, 1], [0, 2, 2], [1, 3, 4]])[: len(values)]
    return tfo.convert((coords, np.asarray(values, dtype=np.float64)), tmp_path / name, shape=shape)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- --seed -5 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["cpd", "x.zarr", "--rank", "2"],
        ["apr", "x.zarr", "--rank", "2"],
        ["tt", "x.zarr", "--ranks", "2"],
        ["tucker", "x.zarr", "--ranks", "2"],
        ["complete", "x.zarr", "--ranks", "2", "--core-rank", "2"],
        ["generate", "x.tns", "--shape", "3,4,5", "--nnz", "10"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_negative_seed_is_refused_naming_the_option(argv, capsys):
    """Before: parsed, then NumPy's bare "expected non-negative integer" (no option named)."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--seed", "-5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed: must be an integer >= 0, got -5" in err
    assert "non-negative integer" not in err


def test_a_negative_seed_to_the_api_names_seed(tmp_path):
    store = _store(tmp_path)
    runs = {
        "cp_als": lambda: tfo.cp_als(store, 2, seed=-5, max_iters=2),
        "cp_als sts": lambda: tfo.cp_als(store, 2, seed=-5, max_iters=2, method="sts", samples=16),
        "cp_apr": lambda: tfo.cp_apr(store, 2, seed=-5, max_iters=2),
        "tt_als": lambda: tfo.tt_als(store, 2, seed=-5, max_sweeps=1),
        "tucker_hooi": lambda: tfo.tucker_hooi(store, (2, 2, 2), seed=-5, max_iters=2),
        "tucker_sgd": lambda: tfo.tucker_sgd(store, 2, 2, seed=-5, epochs=1, progress=False),
    }
    for name, run in runs.items():
        with pytest.raises(ValueError) as e:
            run()
        assert str(e.value) == "seed must be an integer >= 0 or None, got -5", name
    assert tfo.cp_als(store, 2, seed=0, max_iters=2).iterations >= 1  # 0 is a seed


# --- tt on a mode of length 2^62 -------------------------------------------------------------------


def test_tt_refuses_a_core_no_memory_holds_naming_the_mode(tmp_path, capsys):
    """Before: NumPy's "array is too big" (2^62) or an uncaught MemoryError traceback (2^40)."""
    coords = np.array([[0, 0, 0], [1, 1, 1], [2**62 - 1, 2, 3]])
    store = tfo.convert((coords, np.array([1.0, 2.0, 3.0])), tmp_path / "big.zarr", shape=(2**62, 3, 4))
    assert store.shape[0] == 2**62
    core_bytes = 2**62 * 2 * 8
    with pytest.raises(DecompositionError) as e:
        tfo.tt_als(store, 2, max_sweeps=1)
    msg = str(e.value)
    assert f"core 0 would need {core_bytes:,} bytes" in msg and f"mode 0 has length {2**62:,}" in msg
    assert main(["tt", str(store.path), "--ranks", "2", "--out", str(tmp_path / "tt.zarr")]) == 2
    err = capsys.readouterr().err
    assert "tfooc: error:" in err and f"mode 0 has length {2**62:,}" in err and f"{core_bytes:,} bytes" in err
    assert "array is too big" not in err and "Traceback" not in err
    assert not (tmp_path / "tt.zarr").exists()


@pytest.mark.parametrize("command", ["tucker", "complete"])
def test_tucker_and_completion_refuse_factors_no_memory_holds(tmp_path, capsys, command):
    """Before: NumPy's "array is too big", naming no mode."""
    coords = np.array([[0, 0, 0], [1, 1, 1], [2, 2**62 - 1, 3]])
    store = tfo.convert((coords, np.array([1.0, 2.0, 3.0])), tmp_path / "big.zarr", shape=(3, 2**62, 4))
    factor_bytes = 2**62 * 2 * 8
    with pytest.raises(DecompositionError, match=f"factor of mode 1 would need {factor_bytes:,} bytes"):
        if command == "tucker":
            tfo.tucker_hooi(store, 2, max_iters=1)
        else:
            tfo.tucker_sgd(store, 2, 2, epochs=1)
    extra = ["--ranks", "2"] + (["--core-rank", "2", "--epochs", "1"] if command == "complete" else [])
    assert main([command, str(store.path), *extra, "--out", str(tmp_path / "r.zarr")]) == 2
    err = capsys.readouterr().err
    assert f"length {2**62:,}" in err and "array is too big" not in err and "Traceback" not in err
    assert not (tmp_path / "r.zarr").exists()


# --- apr on all-zero counts ------------------------------------------------------------------------


def test_apr_refuses_all_zero_counts_up_front(tmp_path, capsys):
    """Before: a NaN log-likelihood after the first outer iteration, advising another seed."""
    store = _store(tmp_path, values=[0.0, 0.0, 0.0])
    assert store.nnz == 3 and store.norm() == 0  # convert keeps explicit zeros
    with pytest.raises(DecompositionError, match=r"all 3 values are zero: CP-APR needs positive counts"):
        tfo.cp_apr(store, 2, max_iters=2)
    assert main(["apr", str(store.path), "--rank", "2", "--out", str(tmp_path / "apr.zarr")]) == 2
    err = capsys.readouterr().err
    assert "all 3 values are zero: CP-APR needs positive counts" in err
    assert "seed" not in err and "nan" not in err


# --- unreadable checkpoints ------------------------------------------------------------------------


def _foreign_checkpoints(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a checkpoint at all\n" * 8)
    objects = tmp_path / "objects.npz"  # a user's np.save'd object array
    with open(objects, "wb") as f:
        np.save(f, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    zipped = tmp_path / "zipped.npz"  # an .npz with a meta record and an object array
    np.savez(zipped, meta=np.frombuffer(b'{"version": 1}', dtype=np.uint8), x=np.array([{"a": 1}], dtype=object))
    plain = tmp_path / "plain.npz"  # someone else's .npz
    np.savez(plain, x=np.arange(3))
    return [garbage, objects, zipped, plain]


def test_an_unreadable_checkpoint_gives_no_pickle_advice(tmp_path):
    """Before: "unreadable checkpoint (Cannot load file containing pickled data when
    allow_pickle=False)", NumPy's advice to load a stranger's pickle."""
    for path in _foreign_checkpoints(tmp_path):
        for read in (read_checkpoint, lambda p: read_npz(p, "tt-als", "TT-ALS")):
            with pytest.raises(StoreError) as e:
                read(str(path))
            msg = str(e.value)
            assert msg.startswith(f"{path}: unreadable checkpoint: not a checkpoint written by tensorflow_ooc (")
            assert "allow_pickle" not in msg
    store = _store(tmp_path)
    for path in _foreign_checkpoints(tmp_path):
        with pytest.raises((ValueError, OSError)) as e:
            tfo.cp_als(store, 2, max_iters=2, checkpoint=str(path), resume=True)
        assert "allow_pickle" not in str(e.value)


def test_an_unreadable_checkpoint_on_the_command_line(tmp_path, capsys):
    store = _store(tmp_path)
    for k, path in enumerate(_foreign_checkpoints(tmp_path)):
        out = tmp_path / f"r{k}.zarr"
        argv = ["cpd", str(store.path), "--rank", "2", "--out", str(out), "--checkpoint", str(path), "--resume"]
        assert main(argv) != 0
        err = capsys.readouterr().err
        assert "tfooc: error:" in err and str(path) in err
        assert "allow_pickle" not in err and "Traceback" not in err
        assert path.exists()  # the user's file is left as it was


# --- values whose squares underflow ----------------------------------------------------------------


@pytest.mark.parametrize("value, square", [("1e-200", "0"), ("-1e-160", "subnormal"), ("1.4e-154", "subnormal")])
def test_values_whose_squares_underflow_are_refused(tmp_path, value, square, capsys):
    """Before: 1e-200 was accepted (its square is 0) although the README said it was refused."""
    tns = tmp_path / "x.tns"
    tns.write_text("1 1 1 1.5\n# a comment\n2 2 2 " + value + "\n3 1 2 2.0\n")
    with pytest.raises(ValueRangeError) as e:
        tfo.convert(str(tns), tmp_path / "x.zarr")
    msg = str(e.value)
    assert str(tns) in msg and "line 3" in msg and f"value {value} is too small: its square is {square}" in msg
    assert not (tmp_path / "x.zarr").exists()
    assert main(["convert", str(tns), str(tmp_path / "y.zarr")]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and f"value {value} is too small" in err
    coords = np.array([[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    with pytest.raises(
        ValueRangeError, match=rf"^values\[1\]: value {float(value)!r} is too small: its square is {square}"
    ):
        tfo.convert((coords, np.array([1.0, float(value), 2.0])), tmp_path / "z.zarr")


def test_the_smallest_values_whose_squares_are_normal_are_accepted(tmp_path):
    coords = np.array([[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    assert SQUARE_MIN == 2.0**-511 and (SQUARE_MIN * SQUARE_MIN) == np.finfo(np.float64).smallest_normal
    store = tfo.convert((coords, np.array([SQUARE_MIN, -2e-154, 3e-154])), tmp_path / "ok.zarr")
    assert store.nnz == 3 and math.isclose(store.meta["norm_sq"], SQUARE_MIN**2 + 4e-308 + 9e-308, rel_tol=1e-12)
    with pytest.raises(ValueRangeError):
        tfo.convert((coords, np.array([np.nextafter(SQUARE_MIN, 0), 1.0, 1.0])), tmp_path / "no.zarr")


def test_the_readme_states_the_refused_values_exactly():
    text = _one_line(README.read_text())
    claim = re.search(
        r"magnitudes above (\S+), whose squares overflow, and nonzero magnitudes below (\S+), whose", text
    )
    assert claim, "the README names both bounds"
    assert claim.group(1) == f"{SQUARE_MAX:.3g}".replace("e+", "e") and claim.group(2) == f"{SQUARE_MIN:.3g}"
    assert "or subnormal) are refused" not in text


# --- CP-APR warnings are log lines -----------------------------------------------------------------


def test_cp_apr_warns_in_one_log_line_not_a_python_warning(tmp_path, caplog):
    """Before: a UserWarning, printed with its source line (``warnings.warn(``)."""
    store = _store(tmp_path, values=[1.0, 2.5, 3.0, 1.0, 2.0])
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="tensorflow_ooc"):
        warnings.simplefilter("error")
        tfo.cp_apr(store, 2, seed=1, max_iters=2)
    lines = [r.getMessage() for r in caplog.records if "not an integer" in r.getMessage()]
    assert len(lines) == 1 and "is 2.5, not an integer" in lines[0] and "\n" not in lines[0]


def test_pdnr_leaves_no_runtime_warning_where_a_model_value_is_zero(tmp_path):
    """A nonzero whose other modes' factor rows share no component has model value 0 for every
    candidate: the row's actual reduction is inf - inf. Before: an unhandled "RuntimeWarning:
    invalid value encountered in subtract" (apr_steps.pdnr_step)."""
    rng = np.random.default_rng(0)
    shape = (6, 5, 4)
    coords = np.stack(np.unravel_index(rng.choice(120, 40, replace=False), shape), axis=1)
    store = tfo.convert((coords, rng.integers(1, 5, 40).astype(np.float64)), tmp_path / "p.zarr", shape=shape)
    init = [np.ones((n, 2)) for n in shape]
    init[1][0] = 0  # becomes (1e-8, 0)
    init[2][:, 0] = 0  # (0, 1): their product is 0 in both components
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = tfo.cp_apr(store, 2, init=init, algorithm="pdnr", max_iters=2)
    assert r.iterations == 2


# --- --memory-limit's help -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["convert", "generate"])
def test_memory_limit_help_says_it_is_the_whole_process(command, capsys):
    """Before: "peak memory of the conversion"; --memory-limit 64MB was refused for the ~120 MiB
    the process holds before it starts, which the help did not mention."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = _one_line(capsys.readouterr().out)
    assert "--memory-limit MEMORY_LIMIT peak memory of the whole tfooc process" in out
    assert "it includes the ~120 MiB the process holds before" in out


def test_a_nearly_singular_hessian_is_one_log_line(tmp_path, caplog, monkeypatch):
    """Before: ``warnings.warn("CP-APR: damped Hessian is nearly singular")``, a raw Python warning."""

    def singular(*args, **kwargs):
        raise np.linalg.LinAlgError("Singular matrix")

    store = _store(tmp_path)
    monkeypatch.setattr(np.linalg, "solve", singular)
    with warnings.catch_warnings(), caplog.at_level(logging.DEBUG, logger="tensorflow_ooc"):
        warnings.simplefilter("error")
        tfo.cp_apr(store, 2, seed=1, algorithm="pdnr", max_iters=2)
    said = [r for r in caplog.records if "nearly singular" in r.getMessage()]
    assert said and [r.levelno for r in said].count(logging.WARNING) == 1  # then debug lines only


def test_cli_errors_name_flags_not_keywords():
    """Before: errors reached from the CLI advised ``duplicates='sum'``, ``overwrite=True``, ..."""
    from tensorflow_ooc.cli import build_parser, in_flags

    p = build_parser()
    msg = (
        "pass overwrite=True to replace it; duplicates='sum' merges; store values_dtype='float64'; "
        "give memory_limit=206MiB; keep overwrite=False; unknown_keyword=3 stays"
    )
    got = in_flags(msg, p, "convert")
    assert "pass --overwrite to replace it" in got and "--duplicates sum merges" in got
    assert "--values-dtype float64" in got and "--memory-limit 206MiB" in got
    assert "overwrite=False" in got and "unknown_keyword=3 stays" in got
    assert "checkpoint=PATH" in in_flags("(checkpoint=PATH)", p, "convert")  # convert has no --checkpoint
    assert in_flags("(checkpoint=PATH)", p, "cpd") == "(--checkpoint PATH)"
