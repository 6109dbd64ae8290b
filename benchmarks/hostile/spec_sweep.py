"""Sweep 3: hostile workflow specs (``tfooc run SPEC --storage ROOT``)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import FIT, Case, Cmd, Ctx, nonfinite_in
from .reference import compare_store, ref_parse
from .tns_sweep import _tns_lines, small_rows

SPEC_BASE = """\
name: hostile
steps:
  convert:
    kind: convert
    input: in.tns
    out: t.zarr
  decompose:
    kind: decompose
    input: t.zarr
    out: cp.zarr
    rank: 2
    max_iters: 3
    seed: 0
    scheduler: inline
"""


SPEC_KEYS_TOP = {"version", "name", "description", "storage", "allow_paths", "cluster", "steps"}


SPEC_KEYS = {
    "convert": {
        "kind",
        "after",
        "description",
        "input",
        "out",
        "append",
        "keep_versions",
        "shape",
        "zero_based",
        "duplicates",
        "chunk_nnz",
        "max_block_nnz",
        "compression",
        "memory_limit",
    },
    "decompose": {
        "kind",
        "after",
        "description",
        "input",
        "out",
        "rank",
        "max_iters",
        "tol",
        "seed",
        "init",
        "previous",
        "dtype",
        "execution",
        "device",
        "conflict",
        "streams",
        "device_memory_limit",
        "checkpoint_every",
        "partitions",
        "method",
        "samples",
        "fit_every",
        "scheduler",
    },
}


class _UniqueLoader(__import__("yaml").SafeLoader):
    pass


def _unique_mapping(loader, node, deep=False):
    import yaml

    keys = set()
    for k, _ in node.value:
        key = loader.construct_object(k, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


_UniqueLoader.add_constructor("tag:yaml.org,2002:map", _unique_mapping)


def ref_spec(text: bytes) -> tuple[dict | None, str]:
    """The reference loader: safe YAML without duplicate keys or aliases, the keys and ranges of
    the steps this benchmark uses. (None, why) when the spec must be refused."""
    import yaml

    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        doc = yaml.load(s, Loader=_UniqueLoader)
    except Exception as exc:
        return None, f"YAML: {str(exc).splitlines()[0]}"
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), dict) or not doc["steps"]:
        return None, "no steps mapping"
    if set(map(str, doc)) - SPEC_KEYS_TOP:
        return None, f"unknown keys {sorted(set(map(str, doc)) - SPEC_KEYS_TOP)}"
    if doc.get("allow_paths"):
        return None, "allow_paths in the spec"
    cl = doc.get("cluster", "embedded")
    if cl not in ("embedded", "gpu"):
        return None, f"cluster {cl!r}"
    for name, st in doc["steps"].items():
        if not isinstance(st, dict) or st.get("kind") not in SPEC_KEYS:
            return None, f"step {name!r}"
        if set(map(str, st)) - SPEC_KEYS[st["kind"]]:
            return None, f"unknown key in step {name}"
        for k, v in st.items():
            if isinstance(v, float) and not math.isfinite(v):
                return None, f"{name}.{k} not finite"
        for k in ("rank", "max_iters", "chunk_nnz", "max_block_nnz", "keep_versions", "samples", "streams"):
            if k in st and (type(st[k]) is not int or not 1 <= st[k] <= 2**62):
                return None, f"{name}.{k} = {st[k]!r}"
        if "tol" in st and (type(st["tol"]) not in (int, float) or not st["tol"] >= 0):
            return None, f"{name}.tol = {st['tol']!r}"
        for k in ("input", "out"):
            if not isinstance(st.get(k), str):
                return None, f"{name}.{k} = {st.get(k)!r}"
    return doc, ""


def files_outside(d: Path, root: Path, allowed: set[Path]) -> list[str]:
    """Files created under the case folder outside the storage root (besides the inputs)."""
    out = []
    for p in d.rglob("*"):
        try:
            rel = p.relative_to(root)
            del rel
            continue
        except ValueError:
            pass
        if p in allowed or p.is_dir():
            continue
        out.append(str(p.relative_to(d)))
    return out


def spec_case(
    text: str | bytes | Callable[[Ctx], str],
    must: str = "refuse",
    setup: Callable[[Ctx], None] | None = None,
    check: Callable[[Ctx, Cmd], None] | None = None,
) -> Callable[[Ctx], None]:
    """must: 'refuse' (exit 0 is silent), 'run' (exit 0 checked: outputs inside the root, nothing
    outside), 'either' (a clear refusal or a correct run)."""

    def fn(ctx: Ctx) -> None:
        root = ctx.dir / "root"
        (root / "in.tns").write_bytes(_tns_lines(small_rows(200, 7, (12, 9, 7))))
        (ctx.dir / "outside").mkdir()
        if setup:
            setup(ctx)
        t = text(ctx) if callable(text) else text
        spec = ctx.dir / "spec.yaml"
        spec.write_bytes(t.encode() if isinstance(t, str) else t)
        before = {p for p in ctx.dir.rglob("*")}
        c, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0, 3))
        stray = files_outside(ctx.dir, root, before)
        if stray:
            ctx.silent(f"wrote outside the storage root: {stray[:3]}")
        if (ctx.dir / "PWNED").exists() or (root / "PWNED").exists():
            ctx.silent("a YAML tag ran code (PWNED was created)")
        if outcome is not None:
            return
        if must == "refuse":
            ctx.silent("the spec was accepted (exit 0) although it must be refused")
        if check:
            check(ctx, c)

    return fn


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def bomb(levels: int, width: int = 9) -> str:
    lines = ['b0: &b0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _versions(root: Path) -> list[dict]:
    p = root / "nightly" / "tensor" / "versions.json"
    doc = json.loads(p.read_text())
    return doc["versions"] if isinstance(doc, dict) else doc


def nightly_case(action: str, on_changed: str | None = None) -> Callable[[Ctx], None]:
    """Run a nightly-style spec, change nightly/incoming/ (touch, rename, edit, a new file), run it
    again and compare the latest version with what its files hold."""
    spec_text = """\
name: nightly
steps:
  ingest:
    kind: convert
    input: nightly/incoming/
    out: nightly/tensor
    append: true
    duplicates: sum
    keep_versions: 7
{on_changed}  decompose:
    kind: decompose
    input: nightly/tensor
    out: nightly/cp.zarr
    rank: 2
    init: previous
    max_iters: 3
    seed: 0
    scheduler: inline
"""

    def fn(ctx: Ctx) -> None:
        root = ctx.dir / "root"
        inc = root / "nightly" / "incoming"
        inc.mkdir(parents=True)
        a = small_rows(150, 21, (12, 9, 7))
        b = small_rows(150, 22, (12, 9, 7))
        (inc / "a.tns").write_bytes(_tns_lines(a))
        (inc / "b.tns").write_bytes(_tns_lines(b))
        spec = ctx.dir / "nightly.yaml"
        spec.write_text(spec_text.replace("{on_changed}", f"    on_changed: {on_changed}\n" if on_changed else ""))
        c, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0,))
        if outcome is not None:
            return
        merged = ref_parse(_tns_lines(a) + _tns_lines(b), duplicates="sum")
        v1 = _versions(root)
        latest = root / "nightly" / "tensor" / Path(v1[-1]["path"]).name
        if not compare_store(ctx, latest, merged, "the first run"):
            return
        time.sleep(1.1)
        expect = merged
        if action == "touch":
            os.utime(inc / "a.tns")
        elif action == "rename":
            (inc / "a.tns").rename(inc / "a-renamed.tns")
        elif action == "edit":
            edited = [(*a[0][:-1], round(a[0][-1] + 1.0, 6))] + a[1:]
            (inc / "a.tns").write_bytes(_tns_lines(edited))
            if on_changed == "append":  # the new content added as new data, the old stays
                expect = ref_parse(_tns_lines(a) + _tns_lines(b) + _tns_lines(edited), duplicates="sum")
            elif on_changed == "replace-version":
                expect = ref_parse(_tns_lines(edited) + _tns_lines(b), duplicates="sum")
        elif action == "new":
            n = small_rows(80, 23, (14, 9, 7))
            (inc / "n.tns").write_bytes(_tns_lines(n))
            expect = ref_parse(_tns_lines(a) + _tns_lines(b) + _tns_lines(n), duplicates="sum")
        elif action == "copy":
            shutil.copy(inc / "a.tns", inc / "a-copy.tns")
        _, outcome = ctx.run(["run", str(spec), "--storage", str(root)], ok_codes=(0, 3))
        if outcome is not None:
            if action == "new" or on_changed in ("append", "replace-version"):
                ctx.flags.append("valid input refused")
            return
        if action == "edit" and on_changed in (None, "error"):
            ctx.silent("an ingested file was edited under the same name and the run went on (exit 0)")
        v2 = _versions(root)
        latest = root / "nightly" / "tensor" / Path(v2[-1]["path"]).name
        if action == "copy":
            # the same content under a new name: not new data; summing it again doubles a.tns
            pass
        if (
            compare_store(ctx, latest, expect, "the second run")
            and (action == "new" or on_changed)
            and len(v2) <= len(v1)
        ):
            ctx.silent("the new content was not ingested")

    return fn


def spec_cases() -> list[Case]:
    B = SPEC_BASE

    def outside(ctx: Ctx) -> str:
        return str(ctx.dir / "outside")

    def symlink_setup(ctx: Ctx) -> None:
        (ctx.dir / "root" / "link").symlink_to(ctx.dir / "outside")

    def outputs_inside(ctx: Ctx, c: Cmd) -> None:
        root = (ctx.dir / "root").resolve()
        for o in ("t.zarr", "cp.zarr"):
            p = (ctx.dir / "root" / o).resolve()
            if not p.exists() or root not in p.parents:
                ctx.silent(f"output {o} missing or outside the root")
        m = FIT.search(c.out)
        if m and nonfinite_in(m.group(1)):
            ctx.silent(f"fit {m.group(1)}")

    def cluster_check(ctx: Ctx, c: Cmd) -> None:
        if not re.search(r"WARNING.*(127\.0\.0\.1|unreach|local)", c.err, re.IGNORECASE):
            ctx.silent("an unreachable cluster address was accepted without an error or a warning")

    port = closed_port()
    sub = B.replace
    cases: list[tuple[str, str, Any, str, Any, Any]] = [
        ("valid", "the valid two-step spec (control)", B, "run", None, outputs_inside),
        ("yaml-syntax", "an unclosed flow sequence", B + "  extra: [1, 2\n", "refuse", None, None),
        ("yaml-tab-indent", "a tab used for indentation", sub("    rank: 2", "\trank: 2"), "refuse", None, None),
        ("yaml-empty", "an empty file", "", "refuse", None, None),
        ("yaml-list", "a list instead of a mapping", "- convert\n- decompose\n", "refuse", None, None),
        ("yaml-scalar", "a bare scalar", "hello\n", "refuse", None, None),
        (
            "not-utf8",
            "a Latin-1 byte in a comment and a value",
            (B + "# caf\xe9\n").encode("latin-1"),
            "either",
            None,
            None,
        ),
        ("nul-byte", "a NUL byte", B.encode() + b"\x00\n", "refuse", None, None),
        ("unknown-top-key", "an unknown top-level key", B + "colour: blue\n", "refuse", None, None),
        ("unknown-step-key", "rank misspelt ranks", sub("rank: 2", "ranks: 2"), "refuse", None, None),
        ("unknown-kind", "kind: transmogrify", sub("kind: decompose", "kind: transmogrify"), "refuse", None, None),
        ("rank-word", "rank: sixteen", sub("rank: 2", "rank: sixteen"), "refuse", None, None),
        ("rank-string", 'rank: "2" (a string)', sub("rank: 2", 'rank: "2"'), "refuse", None, None),
        ("rank-float", "rank: 2.5", sub("rank: 2", "rank: 2.5"), "refuse", None, None),
        ("rank-bool", "rank: true", sub("rank: 2", "rank: true"), "refuse", None, None),
        ("rank-zero", "rank: 0", sub("rank: 2", "rank: 0"), "refuse", None, None),
        ("rank-negative", "rank: -3", sub("rank: 2", "rank: -3"), "refuse", None, None),
        (
            "rank-huge",
            "rank: 100000 (the memory plan must refuse it)",
            sub("rank: 2", "rank: 100000"),
            "refuse",
            None,
            None,
        ),
        ("rank-bignum", "rank: 10^30", sub("rank: 2", "rank: 1000000000000000000000000000000"), "refuse", None, None),
        ("tol-nan", "tol: .nan", sub("seed: 0", "seed: 0\n    tol: .nan"), "refuse", None, None),
        ("tol-inf", "tol: .inf", sub("seed: 0", "seed: 0\n    tol: .inf"), "refuse", None, None),
        ("tol-negative", "tol: -1", sub("seed: 0", "seed: 0\n    tol: -1"), "refuse", None, None),
        ("tol-1e400", "tol: 1e400 (parses as inf)", sub("seed: 0", "seed: 0\n    tol: 1.0e+400"), "refuse", None, None),
        ("max-iters-zero", "max_iters: 0", sub("max_iters: 3", "max_iters: 0"), "refuse", None, None),
        ("chunk-nnz-zero", "chunk_nnz: 0", sub("out: t.zarr", "out: t.zarr\n    chunk_nnz: 0"), "refuse", None, None),
        (
            "memory-limit-word",
            "memory_limit: lots",
            sub("out: t.zarr", "out: t.zarr\n    memory_limit: lots"),
            "refuse",
            None,
            None,
        ),
        (
            "keep-versions-no-append",
            "keep_versions without append",
            sub("out: t.zarr", "out: t.zarr\n    keep_versions: 2"),
            "refuse",
            None,
            None,
        ),
        ("version-2", "version: 2", "version: 2\n" + B, "refuse", None, None),
        ("steps-empty", "steps: {}", "name: x\nsteps: {}\n", "refuse", None, None),
        ("step-name-slash", "a step named a/b", sub("  decompose:\n", "  a/b:\n"), "refuse", None, None),
        ("duplicate-keys", "rank given twice", sub("rank: 2", "rank: 2\n    rank: 3"), "refuse", None, None),
        (
            "duplicate-steps",
            "the step name convert given twice",
            B + "  convert:\n    kind: convert\n    input: in.tns\n    out: u.zarr\n",
            "refuse",
            None,
            None,
        ),
        ("two-writers", "two steps write one output", sub("out: cp.zarr", "out: t.zarr"), "refuse", None, None),
        (
            "after-cycle",
            "steps after each other",
            sub("kind: convert", "kind: convert\n    after: [decompose]"),
            "refuse",
            None,
            None,
        ),
        (
            "after-self",
            "a step after itself",
            sub("kind: decompose", "kind: decompose\n    after: [decompose]"),
            "refuse",
            None,
            None,
        ),
        (
            "after-unknown",
            "after an unknown step",
            sub("kind: decompose", "kind: decompose\n    after: [nosuch]"),
            "refuse",
            None,
            None,
        ),
        (
            "input-missing",
            "an input that does not exist",
            sub("input: in.tns", "input: nosuch.tns"),
            "refuse",
            None,
            None,
        ),
        ("out-dotdot", "out: ../escape.zarr", sub("out: cp.zarr", "out: ../escape.zarr"), "refuse", None, None),
        (
            "out-absolute",
            "out: an absolute path outside the root",
            lambda ctx: sub("out: cp.zarr", f"out: {outside(ctx)}/cp.zarr"),
            "refuse",
            None,
            None,
        ),
        ("out-root-itself", "out: . (the storage root itself)", sub("out: cp.zarr", "out: ."), "refuse", None, None),
        (
            "out-symlink-escape",
            "out through a symlink inside the root to a folder outside",
            sub("out: cp.zarr", "out: link/cp.zarr"),
            "refuse",
            symlink_setup,
            None,
        ),
        (
            "input-symlink-escape",
            "input through a symlink inside the root to a file outside",
            sub("input: in.tns", "input: link/in.tns"),
            "refuse",
            lambda ctx: (symlink_setup(ctx), shutil.copy(ctx.dir / "root" / "in.tns", ctx.dir / "outside" / "in.tns")),
            None,
        ),
        (
            "allow-paths-root",
            "allow_paths: [/] and an output outside the root",
            lambda ctx: "allow_paths: [/]\n" + sub("out: cp.zarr", f"out: {outside(ctx)}/cp.zarr"),
            "refuse",
            None,
            None,
        ),
        (
            "allow-paths-only",
            "allow_paths: [/] alone (a spec cannot widen its sandbox)",
            "allow_paths: [/]\n" + B,
            "refuse",
            None,
            None,
        ),
        (
            "storage-in-spec",
            "storage: pointing outside (--storage wins)",
            lambda ctx: f"storage: {outside(ctx)}\n" + B,
            "run",
            None,
            outputs_inside,
        ),
        (
            "cluster-closed-port",
            f"cluster: tcp://127.0.0.1:{port} (nothing listens)",
            f"cluster: tcp://127.0.0.1:{port}\n" + B,
            "either",
            None,
            cluster_check,
        ),
        ("cluster-garbage", "cluster: not-a-cluster", "cluster: not-a-cluster\n" + B, "refuse", None, None),
        (
            "python-tag",
            "!!python/object/apply:os.system (must not run)",
            B
            + '  evil:\n    kind: export\n    result: !!python/object/apply:os.system ["touch PWNED"]\n'
            + "    format: npz\n    out: e.npz\n",
            "refuse",
            None,
            None,
        ),
        (
            "python-name-tag",
            "!!python/name:os.system",
            sub("rank: 2", "rank: !!python/name:os.system"),
            "refuse",
            None,
            None,
        ),
        ("yaml-bomb-top", "billion laughs: 9 levels of aliases under unknown keys", bomb(9) + B, "refuse", None, None),
        (
            "yaml-bomb-after",
            "billion laughs inside a step's 'after'",
            bomb(9) + sub("kind: decompose", "kind: decompose\n    after: *b8"),
            "refuse",
            None,
            None,
        ),
        (
            "yaml-deep-nesting",
            "10000 nested lists",
            B + "  x: " + "[" * 10000 + "]" * 10000 + "\n",
            "refuse",
            None,
            None,
        ),
        ("huge-key", "a 2 MB key", B + "k" * 2_000_000 + ": 1\n", "refuse", None, None),
        ("spec-is-directory", "the spec path is a directory", None, "refuse", None, None),
        ("spec-missing", "the spec file does not exist", None, "refuse", None, None),
    ]
    out = []
    for name, desc, text, must, setup, check in cases:
        if name == "spec-is-directory":

            def fn(ctx: Ctx) -> None:
                (ctx.dir / "spec.yaml").mkdir()
                _, outcome = ctx.run(
                    ["run", str(ctx.dir / "spec.yaml"), "--storage", str(ctx.dir / "root")], ok_codes=(0, 3)
                )
                if outcome is None:
                    ctx.silent("a directory was run as a spec")

            out.append(Case("spec", name, desc, fn))
            continue
        if name == "spec-missing":

            def fn2(ctx: Ctx) -> None:
                _, outcome = ctx.run(
                    ["run", str(ctx.dir / "nosuch.yaml"), "--storage", str(ctx.dir / "root")], ok_codes=(0, 3)
                )
                if outcome is None:
                    ctx.silent("a missing spec ran")

            out.append(Case("spec", name, desc, fn2))
            continue
        out.append(Case("spec", name, desc, spec_case(text, must, setup, check)))
    for action, desc in [
        ("new", "a new file dropped in (control: appended once, values summed)"),
        ("touch", "an ingested file touched (must not be appended again)"),
        ("rename", "an ingested file renamed (same content: not new)"),
        ("copy", "an ingested file copied under a new name (same content: not new)"),
        ("edit", "an ingested file edited under its name (must be an error)"),
    ]:
        out.append(Case("spec", f"nightly-{action}", f"nightly spec run twice: {desc}", nightly_case(action)))
    for oc, desc in [
        ("append", "the edited content added as new data, the old kept"),
        ("replace-version", "the next version built from the edited content instead of the old"),
    ]:
        out.append(
            Case(
                "spec",
                f"nightly-edit-{oc}",
                f"nightly spec, on_changed: {oc}, a file edited: {desc}",
                nightly_case("edit", oc),
            )
        )
    return out
