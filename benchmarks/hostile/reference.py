"""The benchmark's own references: a small pure-Python parse of a ``.tns`` text (what it must convert
to, or why it must be refused), and stores and results read back in this process for the checks."""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .harness import FIT, READ_LOCK, Cmd, Ctx

TINY = 2.2250738585072014e-308  # smallest normal float64


SQ_MIN = math.sqrt(TINY)  # smallest magnitude whose square is a normal float64 (2^-511)


SQ_MAX = math.sqrt(sys.float_info.max)


INDEX_RE = re.compile(r"^[0-9]+$")


INDEX_MAYBE = re.compile(r"^\+[0-9]+$|^[0-9]+\.0*$")


VALUE_RE = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")


@dataclass
class Ref:
    """What a .tns text means: ``status`` 'valid' (must convert to exactly this), 'invalid' (must be
    refused) or 'either' (a clear refusal or exactly this)."""

    status: str
    reason: str = ""
    coords: list[tuple[int, ...]] = field(default_factory=list)  # 0-based
    values: list[float] = field(default_factory=list)
    shape: tuple[int, ...] = ()

    def norm(self) -> float:
        if not self.values:
            return 0.0
        m = max(abs(v) for v in self.values)
        if m == 0:
            return 0.0
        # scaled, so that neither huge nor denormal values lose the norm
        e = math.frexp(m)[1]
        return math.ldexp(math.sqrt(math.fsum(math.ldexp(v, -e) ** 2 for v in self.values)), e)


def ref_parse(data: bytes, shape: tuple[int, ...] | None = None, duplicates: str = "error") -> Ref:
    """Whitespace separated columns, '#' comment lines, 1-based integer indices, float values."""
    either: list[str] = []
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except Exception as exc:
            return Ref("invalid", f"gzip: {exc}")
    entries: dict[tuple[int, ...], float] = {}
    order: list[tuple[int, ...]] = []
    ncols = None
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        stripped = raw.strip(b" \t")
        if not stripped:
            continue
        if stripped.startswith(b"#"):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                either.append(f"line {lineno}: a comment that is not UTF-8")
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Ref("invalid", f"line {lineno}: not UTF-8")
        if "#" in line:
            either.append(f"line {lineno}: '#' after data")
            line = line[: line.index("#")]
            if not line.strip():
                continue
        tokens = re.split(r"[ \t]+", line.strip(" \t"))
        if any(re.search(r"\s", t) for t in tokens) or "\x00" in line:
            if "\x00" in line or any(re.search(r"[^\S\x0b\x0c\x1c-\x1f\x85\xa0]", t) for t in tokens):
                return Ref("invalid", f"line {lineno}: control character")
            either.append(f"line {lineno}: unusual whitespace")
            tokens = line.split()
        if ncols is None:
            ncols = len(tokens)
            if ncols < 2:
                return Ref("invalid", f"line {lineno}: {ncols} column")
            if ncols == 2:
                either.append("a 1-mode tensor")
        elif len(tokens) != ncols:
            return Ref("invalid", f"line {lineno}: {len(tokens)} columns, expected {ncols}")
        idx = []
        for t in tokens[:-1]:
            if INDEX_RE.match(t):
                i = int(t)
            elif INDEX_MAYBE.match(t):
                either.append(f"line {lineno}: index written {t!r}")
                i = int(float(t)) if "." in t else int(t)
            else:
                return Ref("invalid", f"line {lineno}: index {t!r}")
            if i < 1:
                return Ref("invalid", f"line {lineno}: index {i} in 1-based data")
            if i > 2**62:
                either.append(f"line {lineno}: index {i} beyond 2^62")
            idx.append(i - 1)
        t = tokens[-1]
        if VALUE_RE.match(t):
            v = float(t)
        else:
            try:
                v = float(t)
            except ValueError:
                return Ref("invalid", f"line {lineno}: value {t!r}")
            if math.isfinite(v):
                either.append(f"line {lineno}: value written {t!r}")
        if not math.isfinite(v):
            return Ref("invalid", f"line {lineno}: non-finite value {t!r}")
        if abs(v) > SQ_MAX:
            either.append(f"line {lineno}: value {t} whose square overflows")
        if 0 < abs(v) < SQ_MIN:
            either.append(f"line {lineno}: value {t} whose square is subnormal or 0")
        if v == 0 and re.search(r"[1-9]", t.split("e")[0].split("E")[0]):
            either.append(f"line {lineno}: value {t} underflows to 0")
        key = tuple(idx)
        if key in entries:
            if duplicates == "error":
                return Ref("invalid", f"line {lineno}: duplicate coordinate")
            entries[key] = entries[key] + v if duplicates == "sum" else v
        else:
            entries[key] = v
            order.append(key)
    if ncols is None:
        return Ref("invalid", "no nonzeros")
    nm = ncols - 1
    inferred = tuple(max(k[m] for k in entries) + 1 for m in range(nm))
    if shape is not None:
        if len(shape) != nm:
            return Ref("invalid", f"--shape has {len(shape)} modes, data {nm}")
        if any(i >= s for k in entries for i, s in zip(k, shape)):
            return Ref("invalid", "index beyond --shape")
        inferred = tuple(shape)
    if sum(max(1, (s - 1).bit_length()) for s in inferred) > 64:
        either.append("more than 64 index bits")
    vals = [entries[k] for k in order]
    ref = Ref("either" if either else "valid", "; ".join(either[:3]), order, vals, inferred)
    if any(math.isinf(v) for v in vals):  # duplicates summed past the float range
        return Ref("invalid", "a summed value overflows")
    if ref.norm() > sys.float_info.max or not math.isfinite(ref.norm()):
        return Ref("either", "the norm itself overflows float64")
    return ref


def read_store(path: Path) -> dict:
    import numpy as np

    import tensorflow_ooc as tfo

    with READ_LOCK:
        st = tfo.open_store(str(path))
        coords, values = st.to_coo()
        return {
            "shape": tuple(int(s) for s in st.shape),
            "nnz": int(st.nnz),
            "coords": np.asarray(coords, dtype=np.int64),
            "values": np.asarray(values, dtype=np.float64),
        }


def read_result(path: Path) -> dict:
    import numpy as np

    import tensorflow_ooc as tfo

    with READ_LOCK:
        r = tfo.load_result(str(path))
        return {
            "fit": float(r.fit),
            "weights": np.asarray(r.weights, dtype=np.float64),
            "factors": [np.asarray(f, dtype=np.float64) for f in r.factors],
        }


def compare_store(ctx: Ctx, store: Path, ref: Ref, who: str = "convert") -> bool:
    """The store's content against the reference parse; a 'silent' verdict when it differs."""
    try:
        got = read_store(store)
    except Exception as exc:
        ctx.silent(f"{who} exited 0 but the store does not open: {type(exc).__name__}: {exc}"[:300])
        return False
    ref_vals = list(ref.values)
    ref_coords = list(ref.coords)
    if got["nnz"] != len(ref_coords):
        zeros = [i for i, v in enumerate(ref_vals) if v == 0.0]
        if zeros and got["nnz"] == len(ref_coords) - len(zeros):  # explicit zeros dropped: fine
            keep = [i for i, v in enumerate(ref_vals) if v != 0.0]
            ref_coords = [ref_coords[i] for i in keep]
            ref_vals = [ref_vals[i] for i in keep]
        else:
            ctx.silent(f"{who}: nnz {got['nnz']}, the input has {len(ref_coords)}")
            return False
    if got["shape"] != tuple(ref.shape):
        ctx.silent(f"{who}: shape {got['shape']}, the input says {tuple(ref.shape)}")
        return False
    gc = [tuple(int(x) for x in row) for row in got["coords"].tolist()]
    gv = got["values"].tolist()
    if len(gc) != got["nnz"]:
        ctx.silent(f"{who}: to_coo gives {len(gc)} nonzeros, nnz says {got['nnz']}")
        return False
    a = sorted(zip(gc, gv))
    b = sorted(zip(ref_coords, ref_vals))
    for (c1, v1), (c2, v2) in zip(a, b):
        if c1 != c2:
            ctx.silent(
                f"{who}: coordinate {tuple(x + 1 for x in c1)} stored, "
                f"the input has {tuple(x + 1 for x in c2)} (1-based)"
            )
            return False
        if not (v1 == v2 or abs(v1 - v2) <= 1e-12 * abs(v2)):
            n_doubled = sum(1 for (_, x), (_, y) in zip(a, b) if x == 2 * y and y != 0)
            ctx.silent(
                f"{who}: value {v1!r} stored at {tuple(x + 1 for x in c1)}, the input has {v2!r}"
                + (f" ({n_doubled} of {len(a)} values doubled)" if n_doubled else "")
            )
            return False
    return True


def check_info(ctx: Ctx, c: Cmd, ref: Ref) -> None:
    try:
        info = json.loads(c.out)
    except ValueError as exc:
        ctx.silent(f"info --json printed no JSON: {exc}")
        return
    true = ref.norm()
    norm = info.get("norm")
    if not isinstance(norm, (int, float)) or not math.isfinite(norm):
        ctx.silent(f"info: norm {norm!r}, true norm {true!r}")
    elif not (norm == true or abs(norm - true) <= 1e-9 * abs(true)):
        ctx.silent(f"info: norm {norm!r}, true norm {true!r}")
    if info.get("nnz") not in (len(ref.values), len([v for v in ref.values if v != 0.0])):
        ctx.silent(f"info: nnz {info.get('nnz')}, the input has {len(ref.values)}")
    if tuple(info.get("shape") or ()) != tuple(ref.shape):
        ctx.silent(f"info: shape {info.get('shape')}, the input says {tuple(ref.shape)}")


def check_cpd(ctx: Ctx, c: Cmd, result: Path) -> dict | None:
    m = FIT.search(c.out)
    if not m:
        ctx.silent("cpd printed no fit")
        return None
    try:
        fit = float(m.group(1))
    except ValueError:
        ctx.silent(f"cpd: fit {m.group(1)!r}")
        return None
    if not math.isfinite(fit) or not 0.0 <= fit <= 1.0:
        ctx.silent(f"cpd: fit {m.group(1)} (not finite or outside [0, 1])")
    try:
        r = read_result(result)
    except Exception as exc:
        ctx.silent(f"cpd exited 0 but its result does not load: {type(exc).__name__}: {exc}"[:300])
        return None
    import numpy as np

    if not np.isfinite(r["weights"]).all() or not all(np.isfinite(f).all() for f in r["factors"]):
        ctx.silent("cpd: the model holds NaN or inf")
    elif not np.any(r["weights"]) or any(not np.any(f) for f in r["factors"]):
        ctx.silent(f"cpd: an all-zero model (weights {r['weights'].tolist()}), fit {m.group(1)}")
    r["fit_printed"] = m.group(1)
    return r


CPD = ["--rank", "2", "--max-iters", "3", "--seed", "0", "--scheduler", "inline"]
