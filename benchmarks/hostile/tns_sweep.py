"""Sweep 1: bad ``.tns`` files, converted, then ``info`` and ``cpd`` where the conversion succeeded."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path

from .harness import Case, Ctx
from .reference import CPD, Ref, check_cpd, check_info, compare_store, ref_parse


def _tns_lines(rows: list[tuple]) -> bytes:
    return "".join(" ".join(str(x) for x in r) + "\n" for r in rows).encode()


def small_rows(n: int = 60, seed: int = 5, shape=(7, 6, 5)) -> list[tuple]:
    r = random.Random(seed)
    seen = {}
    while len(seen) < n:
        seen[tuple(r.randint(1, s) for s in shape)] = round(r.uniform(0.5, 5.0), 6)
    return [(*k, v) for k, v in seen.items()]


def tns_case(
    data: bytes | None,
    extra: list[str] = (),
    shape: tuple | None = None,
    make: Callable[[Path], Path] | None = None,
    expect: str | None = None,
    duplicates: str = "error",
) -> Callable[[Ctx], None]:
    """convert FILE STORE; where it succeeds, the content, info --json and cpd are checked."""

    def fn(ctx: Ctx) -> None:
        if make is not None:
            src = make(ctx.dir)
            ref = Ref(expect or "invalid", "not a readable .tns file")
        else:
            src = ctx.dir / "in.tns"
            src.write_bytes(data)
            ref = ref_parse(data, shape, duplicates)
            if expect is not None and ref.status != expect:
                ref.status = expect
        store = ctx.dir / "out.zarr"
        args = ["convert", str(src), str(store), *extra]
        if shape is not None:
            args += ["--shape", ",".join(map(str, shape))]
        c, outcome = ctx.run(args)
        if outcome == "clear error":
            if ref.status == "valid":
                ctx.flags.append("valid input refused")
            elif ref.status == "either":
                ctx.flags.append(f"refused ({ref.reason})")
            if store.exists():
                ctx.silent("a failed convert left a store at the destination")
            return
        if outcome is not None:
            return
        if ref.status == "invalid":
            ctx.silent(f"convert accepted an invalid input ({ref.reason})")
        if not compare_store(ctx, store, ref):
            return
        c, outcome = ctx.run(["info", str(store), "--json"])
        if outcome is None:
            check_info(ctx, c, ref)
        res = ctx.dir / "cp.zarr"
        c, outcome = ctx.run(["cpd", str(store), *CPD, "--out", str(res)])
        if outcome is None:
            check_cpd(ctx, c, res)

    return fn


def tns_cases() -> list[Case]:
    good = small_rows()
    G = _tns_lines(good)
    first = good[0]

    def with_first(row) -> bytes:
        return _tns_lines([row] + good[1:])

    def truncated_gz(d: Path) -> Path:
        p = d / "in.tns.gz"
        z = gzip.compress(G)
        p.write_bytes(z[: len(z) // 2])
        return p

    def directory(d: Path) -> Path:
        p = d / "dir.tns"
        p.mkdir()
        (p / "a.tns").write_bytes(G)
        return p

    def fifo_missing(d: Path) -> Path:
        return d / "missing.tns"

    def unreadable_dir_entry(d: Path) -> Path:
        p = d / "link.tns"
        p.symlink_to(d / "nowhere.tns")
        return p

    huge_line = (" ".join(["1"] * 200000) + " 1.0\n").encode() + G
    cases = [
        ("valid", "the valid 60-nonzero file (control)", G, {}),
        ("valid-gzip", "the valid file gzip-compressed", gzip.compress(G), {}),
        ("valid-crlf", "CRLF line endings (valid)", G.replace(b"\n", b"\r\n"), {}),
        (
            "valid-tabs",
            "mixed tabs and spaces, leading and trailing blanks (valid)",
            b"".join(
                (b"\t" if i % 2 else b"  ") + ln.replace(b" ", b" \t ", 1) + b" \t\n"
                for i, ln in enumerate(G.splitlines())
            ),
            {},
        ),
        (
            "valid-comments",
            "comment lines and blank lines between data (valid)",
            b"# header\n\n" + G.replace(b"\n", b"\n# c\n\n", 3),
            {},
        ),
        ("valid-shape", "a --shape larger than the indices (valid)", G, {"shape": (9, 9, 9)}),
        ("cols-short", "a line with one column too few", G + b"1 2 3.5\n", {}),
        ("cols-long", "a line with one column too many", G + b"1 2 3 4 5.5\n", {}),
        ("value-word", "a non-numeric value", G + b"1 2 3 abc\n", {}),
        ("index-word", "a non-numeric index", G + b"1 x 3 1.0\n", {}),
        ("index-float", "an index 2.5", G + b"1 2.5 3 1.0\n", {}),
        ("value-nan", "a NaN value", with_first((*first[:-1], "nan")), {}),
        ("value-inf", "an inf value", with_first((*first[:-1], "inf")), {}),
        ("value-neg-inf", "a -Infinity value", with_first((*first[:-1], "-Infinity")), {}),
        ("value-1e400", "a value 1e400 (overflows to inf when parsed)", with_first((*first[:-1], "1e400")), {}),
        ("value-1e200", "a value 1e200 (finite, its square overflows)", with_first((*first[:-1], "1e200")), {}),
        ("value-1e300", "a value 1e300 (finite, its square overflows)", with_first((*first[:-1], "1e300")), {}),
        ("value-all-1e300", "every value 1e300", _tns_lines([(*r[:-1], "1e300") for r in good]), {}),
        ("value-1e-310", "a denormal value 1e-310", with_first((*first[:-1], "1e-310")), {}),
        (
            "value-all-4.9e-324",
            "every value 4.9e-324 (the smallest denormal)",
            _tns_lines([(*r[:-1], "4.9e-324") for r in good]),
            {},
        ),
        ("index-zero", "index 0 in 1-based data", with_first((0, *first[1:])), {}),
        ("index-negative", "index -1", with_first((-1, *first[1:])), {}),
        ("index-2^60", "index 2^60", with_first((2**60, *first[1:])), {}),
        ("index-2^63-1", "index 2^63-1", with_first((2**63 - 1, *first[1:])), {}),
        ("index-2^64", "index 2^64 (does not fit 64 bits)", with_first((2**64, *first[1:])), {}),
        ("index-2^100", "index 2^100", with_first((2**100, *first[1:])), {}),
        ("beyond-shape", "an index beyond --shape", G, {"shape": (7, 6, 4)}),
        ("shape-modes", "--shape with the wrong number of modes", G, {"shape": (7, 6)}),
        ("empty", "an empty file", b"", {}),
        ("only-comments", "only comment lines", b"# a\n# b\n\n", {}),
        ("only-blank", "only blank lines and spaces", b"\n   \n\t\n", {}),
        ("truncated-gzip", "a gzip file cut in half", None, {"make": truncated_gz}),
        ("binary", "binary garbage", bytes(random.Random(3).randrange(256) for _ in range(4000)), {}),
        ("nul-bytes", "NUL bytes inside a line", G + b"1 2 \x00 3 1.0\n", {}),
        ("latin1", "a Latin-1 byte in a value", G + b"1 2 3 1.0\xe9\n", {}),
        ("huge-line", "a 400 kB first line (200000 columns)", huge_line, {}),
        ("huge-comment", "a 1 MB comment line before the data (valid)", b"# " + b"x" * 1_000_000 + b"\n" + G, {}),
        (
            "long-padding",
            "a data line padded with 100000 spaces and tabs (valid)",
            G + b" \t" * 50_000 + b"7 6 5 1.25" + b"\t " * 50_000 + b"\n",
            {},
        ),
        ("no-final-newline", "no newline after the last line (valid)", G.rstrip(b"\n"), {}),
        (
            "exponent-values",
            "values written 1.5E+02, -2e-3, .5, 7. (valid)",
            _tns_lines([(*r[:-1], f) for r, f in zip(good[:4], ["1.5E+02", "-2e-3", ".5", "7."])] + good[4:]),
            {},
        ),
        ("duplicates", "a repeated coordinate (duplicates=error)", G + _tns_lines([good[3]]), {}),
        (
            "duplicates-sum",
            "a repeated coordinate, --duplicates sum (valid)",
            G + _tns_lines([good[3]]),
            {"extra": ["--duplicates", "sum"], "duplicates": "sum"},
        ),
        ("single-nonzero", "one nonzero (valid)", _tns_lines([good[0]]), {}),
        ("zero-value", "explicit zero values (valid; kept or dropped)", G + b"7 6 5 0.0\n", {}),
        ("index-plus", "an index written +3", with_first(("+3", *first[1:])), {}),
        ("value-hex", "a value written 0x10", with_first((*first[:-1], "0x10")), {}),
        ("directory", "a directory instead of a file", None, {"make": directory}),
        ("missing", "a file that does not exist", None, {"make": fifo_missing}),
        ("dangling-symlink", "a symlink to nothing", None, {"make": unreadable_dir_entry}),
        ("one-column", "one number per line", b"1\n2\n3\n", {}),
    ]
    out = []
    for name, desc, data, kw in cases:
        make = kw.get("make")
        fn = tns_case(data, kw.get("extra", []), kw.get("shape"), make, kw.get("expect"), kw.get("duplicates", "error"))
        out.append(Case("tns", name, desc, fn))
    return out
