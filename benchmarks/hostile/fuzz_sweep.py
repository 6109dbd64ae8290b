"""Sweep 4: seeded mutations of a valid ``.tns`` (against the reference parser) and of a valid spec."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from .harness import Case, Ctx
from .reference import check_info, compare_store, ref_parse
from .spec_sweep import SPEC_BASE, files_outside, ref_spec
from .tns_sweep import _tns_lines, small_rows

TNS_TOKENS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e300",
    "1e200",
    "-1e300",
    "1e400",
    "-1",
    "0",
    "-0",
    "1e-310",
    "4.9e-324",
    "2.5",
    "+3",
    "3.0",
    "0x10",
    "1_000",
    "18446744073709551616",
    "9223372036854775807",
    "1152921504606846976",
    "4294967296",
    "99999999999",
    "abc",
    "foo",
    "#",
    "\t",
    "\r",
    "\r\n",
    "\n",
    " ",
    "\x00",
    "\xe9",
    "é",
    "\x0b",
    "1 2",
    "1.0.0",
    "--",
    "e5",
]


SPEC_TOKENS = [
    ":",
    "-",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a",
    "*a",
    "!!python/object/apply:os.system [touch PWNED]",
    "!!str",
    "|",
    ">",
    "#",
    "%YAML 1.1",
    "@",
    "`",
    '"',
    "'",
    "?",
    "\t",
    "\n",
    "---",
    "...",
    "~",
    "null",
    "true",
    "false",
    "yes",
    "no",
    ".nan",
    ".inf",
    "-.inf",
    "1e300",
    "-1",
    "0",
    "1e400",
    "99999999999999999999",
    "0x10",
    "2.5",
    "../",
    "/",
    "/etc",
    "..",
    "kind",
    "rank",
    "allow_paths: [/]",
    "cluster: tcp://127.0.0.1:9",
    "steps",
    "out",
    "input",
    "after: [convert]",
    "after: [decompose]",
]


def mutate(data: bytes, rng: random.Random, tokens: list[str]) -> tuple[bytes, str]:
    """One seeded mutation: a bit flip, a random byte, a truncation, a token inserted (at a token
    boundary or anywhere), a token replaced, a line duplicated, deleted or swapped."""
    b = bytearray(data)
    kind = rng.choices(
        ["flip", "byte", "truncate", "insert", "insert-raw", "replace", "dupline", "delline", "swap"],
        [15, 6, 8, 14, 6, 33, 8, 6, 4],
    )[0]
    if not b:
        return bytes(b), "empty"
    pos = rng.randrange(len(b))
    if kind == "flip":
        b[pos] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip bit at {pos}"
    if kind == "byte":
        b[pos] = rng.randrange(256)
        return bytes(b), f"byte {b[pos]:#x} at {pos}"
    if kind == "truncate":
        return bytes(b[:pos]), f"truncate at {pos}"
    tok = rng.choice(tokens)
    if rng.random() < 0.35:
        tok = rng.choice(
            [
                str(rng.randint(-10, 10 ** rng.randint(1, 25))),
                str(rng.randint(1, 9)),
                f"{rng.uniform(-1e6, 1e6):.{rng.randint(1, 17)}g}",
                f"{rng.uniform(0, 10):.6f}e{rng.randint(-330, 330)}",
                "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8))),
            ]
        )
    if kind == "insert":
        bounds = [m.start() for m in re.finditer(rb"(?<=\s)|$", bytes(b))] or [pos]
        at = rng.choice(bounds)
        return bytes(b[:at]) + tok.encode() + b" " + bytes(b[at:]), f"insert {tok!r} at {at}"
    if kind == "insert-raw":
        return bytes(b[:pos]) + tok.encode() + bytes(b[pos:]), f"insert {tok!r} at {pos}"
    if kind == "replace":
        spans = [m.span() for m in re.finditer(rb"[^\s:\[\]{},]+", bytes(b))]
        s, e = rng.choice(spans) if spans else (pos, pos)
        return bytes(b[:s]) + tok.encode() + bytes(b[e:]), f"replace {bytes(b[s:e]).decode('latin-1')!r} by {tok!r}"
    lines = bytes(b).split(b"\n")
    i = rng.randrange(len(lines))
    if kind == "dupline":
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
        return b"\n".join(lines), f"duplicate line {i + 1}"
    if kind == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines), f"swap lines {i + 1} and {j + 1}"
    del lines[i]
    return b"\n".join(lines), f"delete line {i + 1}"


def fuzz_tns_case(i: int, seed: int) -> Case:
    rng = random.Random(f"{seed}-tns-{i}")
    base = _tns_lines(small_rows(25, 9, (6, 5, 4)))
    data, what = base, []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        data, w = mutate(data, rng, TNS_TOKENS)
        what.append(w)

    def fn(ctx: Ctx) -> None:
        ref = ref_parse(data)
        src = ctx.dir / "in.tns"
        src.write_bytes(data)
        store = ctx.dir / "out.zarr"
        c, outcome = ctx.run(["convert", str(src), str(store)])
        ctx.flags.append(f"reference: {ref.status}" + (f" ({ref.reason})" if ref.reason else ""))
        if outcome == "clear error":
            if ref.status == "valid":
                ctx.flags.append("valid input refused")
            return
        if outcome is not None:
            return
        if ref.status == "invalid":
            ctx.silent(f"convert accepted what the reference parser refuses ({ref.reason})")
            return
        if compare_store(ctx, store, ref):
            c, outcome = ctx.run(["info", str(store), "--json"])
            if outcome is None:
                check_info(ctx, c, ref)

    return Case("fuzz", f"tns-{i:03d}", "; ".join(what), fn)


def fuzz_spec_case(i: int, seed: int) -> Case:
    rng = random.Random(f"{seed}-spec-{i}")
    data, what = SPEC_BASE.encode(), []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        data, w = mutate(data, rng, SPEC_TOKENS)
        what.append(w)

    def fn(ctx: Ctx) -> None:
        root = ctx.dir / "root"
        (root / "in.tns").write_bytes(_tns_lines(small_rows(200, 7, (12, 9, 7))))
        spec = ctx.dir / "spec.yaml"
        spec.write_bytes(data)
        before = set(ctx.dir.rglob("*"))
        _, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0, 3))
        stray = files_outside(ctx.dir, root, before)
        if stray:
            ctx.silent(f"wrote outside the storage root: {stray[:3]}")
        if (ctx.dir / "PWNED").exists() or (root / "PWNED").exists():
            ctx.silent("a YAML tag ran code")
        if outcome is not None:
            return
        doc, why = ref_spec(data)
        if doc is None:
            ctx.silent(f"accepted a spec the reference loader refuses: {why}")
            return
        rr = root.resolve()
        for name, st in doc["steps"].items():
            i = st.get("input")
            p = (root / i).resolve() if not os.path.isabs(i) else Path(i).resolve()
            if rr != p and rr not in p.parents:
                ctx.silent(f"step {name}: input {i!r} outside the storage root was read")
            o = st.get("out")
            p = (root / o).resolve() if not os.path.isabs(o) else Path(o).resolve()
            if rr != p and rr not in p.parents:
                ctx.silent(f"step {name}: output {o!r} outside the storage root")
            elif not p.exists():
                ctx.silent(f"step {name}: output {o!r} does not exist after exit 0")

    return Case("fuzz", f"spec-{i:03d}", "; ".join(what), fn)


def fuzz_cases(n: int, seed: int) -> list[Case]:
    return [fuzz_tns_case(i, seed) for i in range(n)] + [fuzz_spec_case(i, seed) for i in range(n)]
