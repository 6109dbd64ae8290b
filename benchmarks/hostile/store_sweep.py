"""Sweep 2: a valid store copied and damaged per case, ``info`` and ``cpd`` compared with the
undamaged store's; and CLI numbers that must be refused at parse time."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import FIT, Case, Cmd, Ctx, tfooc
from .reference import CPD, check_cpd, compare_store, read_result, ref_parse
from .tns_sweep import _tns_lines, small_rows


def base_store_rows() -> list[tuple]:
    r = random.Random(11)
    seen: dict[tuple, float] = {}
    shape = (30, 20, 12, 9)
    while len(seen) < 3000:
        seen[tuple(r.randint(1, s) for s in shape)] = round(r.uniform(0.1, 10.0), 6)
    return [(*k, v) for k, v in seen.items()]


def prepare_store(base: Path, env: dict) -> dict:
    """The undamaged store and its info and cpd outputs (the reference for every damage)."""
    d = base / "store-base"
    d.mkdir(exist_ok=True)
    (d / "root").mkdir(exist_ok=True)
    data = _tns_lines(base_store_rows())
    (d / "base.tns").write_bytes(data)
    env = dict(env, TFOOC_STORAGE=str(d / "root"))
    store = d / "base.zarr"
    cmds = [tfooc(["convert", d / "base.tns", store, "--chunk-nnz", "500", "--max-block-nnz", "1000"], d, env)]
    if cmds[-1].rc != 0:
        raise SystemExit(f"bench_hostile: cannot make the base store:\n{cmds[-1].err[-3000:]}")
    info = tfooc(["info", store, "--json"], d, env)
    cpd = tfooc(["cpd", store, *CPD, "--out", d / "cp.zarr"], d, env)
    if info.rc != 0 or cpd.rc != 0:
        raise SystemExit(f"bench_hostile: the base store does not work:\n{info.err[-2000:]}\n{cpd.err[-2000:]}")
    ref = ref_parse(data)
    base_info = json.loads(info.out)
    true = ref.norm()
    problems = []
    if abs(base_info["norm"] - true) > 1e-9 * true or base_info["nnz"] != 3000:
        problems.append(
            f"the undamaged store's info is wrong: norm {base_info['norm']} (true {true}), nnz {base_info['nnz']}"
        )
    result = read_result(d / "cp.zarr")
    result["fit_printed"] = FIT.search(cpd.out).group(1)
    return {"store": store, "info": base_info, "cpd": result, "problems": problems, "norm": true}


# on-disk byte counts (junk files and extra chunks add bytes without changing the tensor)
INFO_IGNORE = {
    "path", "bytes_on_disk", "bytes_per_nnz", "compression_ratio", "index_bytes_per_nnz", "values_bytes_per_nnz"
}  # fmt: skip


# damage that only decoding the chunks can reveal (chunk files, their checksums, how they decode):
# info, which reads metadata and the block/chunk tables but no chunk, need not notice it
DATA_DAMAGE = (
    "alto-chunk",
    "values-chunk",
    "values-doubled",
    "values-nan",
    "values-halves",
    "chunks-crc-",
    "alto-json-codecs",
)


def store_case(name: str, damage: Callable[[Path], None], harm: str) -> Callable[[Ctx], None]:
    """harm: 'must-refuse' (exit 0 with the undamaged store's results is silent too), 'harmless'
    (the damage cannot change a result: identical results are ok) or 'rederivable' (the reader may
    re-derive what was lost: identical results are ok). Damage to chunk data (names starting with
    DATA_DAMAGE) need only be noticed by cpd, which reads the chunks; ``info`` reads metadata and
    tables, so damage to those must be refused by both."""
    data_only = name.startswith(DATA_DAMAGE)

    def fn(ctx: Ctx) -> None:
        import numpy as np

        sh = ctx.shared["store"]
        store = ctx.dir / "s.zarr"
        shutil.copytree(sh["store"], store, symlinks=True)
        before = store_content(store)
        damage(store)
        must_refuse = harm == "must-refuse"
        if must_refuse and store_content(store) == before:
            # written for another format version (the damage sets what this store already holds)
            ctx.flags.append("no-op in this store's format")
            must_refuse = False
        differs: list[str] = []
        c, outcome = ctx.run(["info", str(store), "--json"])
        if outcome is None:
            try:
                info = json.loads(c.out)
                for k, v in sh["info"].items():
                    if k not in INFO_IGNORE and info.get(k) != v:
                        differs.append(f"info {k}: {str(info.get(k))[:60]} (undamaged: {str(v)[:60]})")
                        break
            except ValueError:
                differs.append("info --json printed no JSON")
        res = ctx.dir / "cp.zarr"
        c, outcome2 = ctx.run(["cpd", str(store), *CPD, "--out", str(res)])
        if outcome2 is None:
            r = check_cpd(ctx, c, res)
            b = sh["cpd"]
            if r is not None:
                same = (
                    r["fit_printed"] == b["fit_printed"]
                    and r["weights"].shape == b["weights"].shape
                    and np.allclose(r["weights"], b["weights"], rtol=1e-9, atol=0)
                    and abs(r["fit"] - b["fit"]) <= 1e-9 * max(abs(b["fit"]), 1e-300)
                )
                if not same:
                    differs.append(
                        f"cpd fit {r['fit_printed']} weights {np.round(r['weights'], 4).tolist()} "
                        f"(undamaged: fit {b['fit_printed']} weights {np.round(b['weights'], 4).tolist()})"
                    )
        if differs:
            ctx.silent("; ".join(differs))
        elif must_refuse and (outcome2 is None or (outcome is None and not data_only)):
            who = " and ".join(
                w for w, o in (("info", outcome), ("cpd", outcome2)) if o is None and (w == "cpd" or not data_only)
            )
            ctx.silent(
                f"{who} accepted the damaged store (same results as undamaged) although this damage must be refused"
            )

    return fn


def store_content(store: Path) -> dict:
    """What a store holds, file by file: JSON files parsed (a rewrite that changes only spacing or
    key order is no change), others as bytes."""
    out: dict = {}
    for p in sorted(store.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            try:
                out[str(p.relative_to(store))] = json.loads(data) if p.suffix == ".json" else data
            except ValueError:
                out[str(p.relative_to(store))] = data
    return out


def _meta(store: Path) -> tuple[dict, dict]:
    doc = json.loads((store / "zarr.json").read_text())
    return doc, doc["attributes"]["tensorflow_ooc"]


def edit_attrs(f: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        doc, a = _meta(store)
        f(a)
        (store / "zarr.json").write_text(json.dumps(doc, indent=2))

    return damage


def edit_array_meta(array: str, f: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / array / "zarr.json"
        doc = json.loads(p.read_text())
        f(doc)
        p.write_text(json.dumps(doc, indent=2))

    return damage


def chunk(store: Path, array: str, i: int = 0) -> Path:
    c = store / array / "c"
    p = c / str(i)
    if p.is_file() or p.is_symlink():
        return p
    return sorted(q for q in c.rglob("*") if q.is_file())[i]


def flip_byte(array: str, i: int, where: float = 0.5) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        b = bytearray(p.read_bytes())
        b[int(len(b) * where)] ^= 0x10
        p.write_bytes(bytes(b))

    return damage


def truncate(array: str, i: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        b = p.read_bytes()
        p.write_bytes(b[: len(b) // 2])

    return damage


def delete(rel: str) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return damage


def swap(array: str, i: int, j: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        a, b = chunk(store, array, i), chunk(store, array, j)
        da, db = a.read_bytes(), b.read_bytes()
        a.write_bytes(db)
        b.write_bytes(da)

    return damage


def zero_fill(array: str, i: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        p.write_bytes(bytes(p.stat().st_size))

    return damage


def _crc32c(data: bytes) -> int:
    table = _crc32c.table
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_table() -> list[int]:
    t = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_crc32c.table = _crc_table()  # type: ignore[attr-defined]


def values_rewrite(f: Callable[[bytearray], None], i: int = 1) -> Callable[[Path], None]:
    """Change an uncompressed values chunk and fix its zarr crc32c, so that only a checksum kept
    by the store itself can notice (as a buggy writer or a careful adversary would)."""

    def damage(store: Path) -> None:
        p = chunk(store, "values", i)
        b = bytearray(p.read_bytes())
        payload = bytearray(b[:-4])
        if _crc32c(bytes(payload)).to_bytes(4, "little") != bytes(b[-4:]):
            raise RuntimeError("values chunk is not raw + crc32c: this damage needs compression=fast on random values")
        f(payload)
        p.write_bytes(bytes(payload) + _crc32c(bytes(payload)).to_bytes(4, "little"))

    return damage


def _double_first(p: bytearray) -> None:
    import struct

    v = struct.unpack_from("<d", p, 0)[0]
    struct.pack_into("<d", p, 0, v * 2)


def _nan_first(p: bytearray) -> None:
    import struct

    struct.pack_into("<d", p, 8, float("nan"))


def _swap_halves(p: bytearray) -> None:
    h = len(p) // 2 // 8 * 8
    p[:] = p[h : 2 * h] + p[:h] + p[2 * h :]


def combo(*ds: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        for d in ds:
            d(store)

    return damage


def junk(rel: str, data: bytes = b"junk") -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return damage


def write_text(rel: str, text: str) -> Callable[[Path], None]:
    return junk(rel, text.encode())


def truncate_text(rel: str) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = store / rel
        t = p.read_bytes()
        p.write_bytes(t[: len(t) // 2])

    return damage


def chunk_to_dir(array: str, i: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p = chunk(store, array, i)
        p.unlink()
        p.mkdir()

    return damage


def chunk_symlink(array: str, i: int, j: int) -> Callable[[Path], None]:
    def damage(store: Path) -> None:
        p, q = chunk(store, array, i), chunk(store, array, j)
        p.unlink()
        p.symlink_to(q.name)

    return damage


def remove_key(*keys: str) -> Callable[[dict], None]:
    def f(a: dict) -> None:
        for k in keys:
            a.pop(k, None)

    return f


def setk(key: str, value: Any) -> Callable[[dict], None]:
    def f(a: dict) -> None:
        a[key] = value(a[key]) if callable(value) else value

    return f


def layout(f: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda a: f(a["layout"])


def store_cases() -> list[Case]:
    R, H, D = "must-refuse", "harmless", "rederivable"
    why = {
        R: "must be refused: the metadata or data the results depend on no longer match; an identical "
        "result means the damage went unnoticed (a different result is silent either way)",
        H: "cannot change a result (descriptive field or junk outside the arrays): identical results are ok",
        D: "the reader may re-derive what was removed from the data: identical results are ok",
    }

    def sh(f):
        return lambda a: a.__setitem__("shape", f(list(a["shape"])))

    cases: list[tuple[str, str, Callable[[Path], None], str]] = [
        ("undamaged", "an untouched copy (control)", lambda s: None, H),
        # root zarr.json attributes
        ("norm-doubled", "norm_sq doubled", edit_attrs(setk("norm_sq", lambda v: v * 2)), R),
        ("norm-halved", "norm_sq halved", edit_attrs(setk("norm_sq", lambda v: v / 2)), R),
        ("norm-negative", "norm_sq = -1", edit_attrs(setk("norm_sq", -1.0)), R),
        ("norm-zero", "norm_sq = 0", edit_attrs(setk("norm_sq", 0.0)), R),
        ("norm-nan", "norm_sq = NaN (JSON NaN literal)", edit_attrs(setk("norm_sq", float("nan"))), R),
        ("norm-string", "norm_sq as a string", edit_attrs(setk("norm_sq", lambda v: str(v))), R),
        ("norm-removed", "norm_sq removed", edit_attrs(remove_key("norm_sq")), D),
        ("nnz-minus-1", "nnz one less", edit_attrs(setk("nnz", lambda v: v - 1)), R),
        ("nnz-plus-1000", "nnz 1000 more", edit_attrs(setk("nnz", lambda v: v + 1000)), R),
        ("nnz-float", "nnz 3000.5", edit_attrs(setk("nnz", lambda v: v + 0.5)), R),
        ("nnz-removed", "nnz removed", edit_attrs(remove_key("nnz")), D),
        ("shape-grown", "shape[0] + 5", edit_attrs(sh(lambda s: [s[0] + 5, *s[1:]])), R),
        ("shape-shrunk", "shape[0] - 5 (indices beyond it)", edit_attrs(sh(lambda s: [s[0] - 5, *s[1:]])), R),
        ("shape-negative", "shape[0] negative", edit_attrs(sh(lambda s: [-s[0], *s[1:]])), R),
        ("shape-mode-dropped", "the last mode dropped from shape", edit_attrs(sh(lambda s: s[:-1])), R),
        ("shape-modes-swapped", "shape[0] and shape[1] swapped", edit_attrs(sh(lambda s: [s[1], s[0], *s[2:]])), R),
        ("nmodes", "nmodes = 5", edit_attrs(setk("nmodes", 5)), R),
        (
            "layout-shift-swapped",
            "layout field_shift of modes 0 and 1 swapped",
            edit_attrs(
                layout(
                    lambda L: L.__setitem__(
                        "field_shift", [L["field_shift"][1], L["field_shift"][0], *L["field_shift"][2:]]
                    )
                )
            ),
            R,
        ),
        (
            "layout-bits",
            "layout mode_bits[0] - 1",
            edit_attrs(layout(lambda L: L["mode_bits"].__setitem__(0, L["mode_bits"][0] - 1))),
            R,
        ),
        (
            "layout-order",
            "layout order 'alto-msb-roundrobin'",
            edit_attrs(layout(lambda L: L.__setitem__("order", "alto-msb-roundrobin"))),
            R,
        ),
        ("layout-removed", "layout removed", edit_attrs(remove_key("layout")), R),
        ("nblocks", "nblocks = 2", edit_attrs(setk("nblocks", 2)), R),
        ("nchunks-less", "nchunks = 5", edit_attrs(setk("nchunks", 5)), R),
        ("nchunks-more", "nchunks = 7", edit_attrs(setk("nchunks", 7)), R),
        ("chunk-nnz", "chunk_nnz = 400", edit_attrs(setk("chunk_nnz", 400)), R),
        ("max-block-nnz", "max_block_nnz = 10 (blocks hold more)", edit_attrs(setk("max_block_nnz", 10)), R),
        ("value-dtype-f4", "value_dtype '<f4'", edit_attrs(setk("value_dtype", "<f4")), R),
        ("value-dtype-int", "value_dtype '<i8'", edit_attrs(setk("value_dtype", "<i8")), R),
        ("complete-false", "complete = false", edit_attrs(setk("complete", False)), R),
        ("complete-removed", "complete removed", edit_attrs(remove_key("complete")), R),
        ("format-version-2", "format_version 2", edit_attrs(setk("format_version", 2)), R),
        ("format-name", "format 'coo'", edit_attrs(setk("format", "coo")), R),
        ("store-id", "store_id changed", edit_attrs(setk("store_id", "0" * 32)), H),
        ("created-by", "created_by edited", edit_attrs(setk("created_by", "someone else 9.9")), H),
        ("created-at", "created_at edited", edit_attrs(setk("created_at", "1999-01-01T00:00:00Z")), H),
        ("source-removed", "source removed", edit_attrs(remove_key("source")), H),
        ("checksum-removed", "checksum removed (data intact)", edit_attrs(remove_key("checksum")), D),
        (
            "checksum-wrong",
            "checksum replaced by another sha256",
            edit_attrs(setk("checksum", "sha256:" + "0" * 64)),
            R,
        ),
        (
            "checksum-removed-norm-doubled",
            "checksum removed and norm_sq doubled",
            edit_attrs(lambda a: (a.pop("checksum", None), a.__setitem__("norm_sq", a["norm_sq"] * 2))),
            R,
        ),
        (
            "attrs-removed",
            "the tensorflow_ooc attributes removed",
            lambda s: (lambda doc: (s / "zarr.json").write_text(json.dumps({**doc, "attributes": {}})))(_meta(s)[0]),
            R,
        ),
        ("root-json-truncated", "root zarr.json cut in half (invalid JSON)", truncate_text("zarr.json"), R),
        ("root-json-empty", "root zarr.json empty", write_text("zarr.json", ""), R),
        ("root-json-list", "root zarr.json is []", write_text("zarr.json", "[]"), R),
        ("root-json-deleted", "root zarr.json deleted", delete("zarr.json"), R),
        # chunk files
        ("alto-chunk-deleted", "alto chunk 2 deleted", delete("alto/c/2"), R),
        ("alto-chunk-truncated", "alto chunk 2 truncated to half", truncate("alto", 2), R),
        ("alto-chunk-flipped", "a byte flipped in alto chunk 2", flip_byte("alto", 2), R),
        ("alto-chunks-swapped", "alto chunks 1 and 2 swapped", swap("alto", 1, 2), R),
        ("alto-chunk-zeroed", "alto chunk 3 overwritten with zero bytes", zero_fill("alto", 3), R),
        ("alto-chunk-symlinked", "alto chunk 4 replaced by a symlink to chunk 3", chunk_symlink("alto", 4, 3), R),
        ("values-chunk-deleted", "values chunk 3 deleted", delete("values/c/3"), R),
        ("values-chunk-truncated", "values chunk 3 truncated to half", truncate("values", 3), R),
        ("values-chunk-flipped", "a byte flipped in values chunk 3", flip_byte("values", 3), R),
        ("values-chunks-swapped", "values chunks 0 and 1 swapped (each with its valid crc)", swap("values", 0, 1), R),
        ("values-chunk-zeroed", "values chunk 2 overwritten with zero bytes", zero_fill("values", 2), R),
        ("values-chunk-dir", "values chunk 2 replaced by a directory", chunk_to_dir("values", 2), R),
        (
            "values-doubled-crc-fixed",
            "a value doubled, the chunk's crc32c recomputed",
            values_rewrite(_double_first),
            R,
        ),
        ("values-nan-crc-fixed", "a value set to NaN, the chunk's crc32c recomputed", values_rewrite(_nan_first), R),
        (
            "values-halves-swapped-crc-fixed",
            "a values chunk's halves swapped, crc32c recomputed",
            values_rewrite(_swap_halves),
            R,
        ),
        ("values-extra-chunk", "an extra values chunk 6 beyond the array", junk("values/c/6", b"\x00" * 4004), H),
        # block and chunk tables
        ("blocks-count-deleted", "blocks/count chunk deleted", delete("blocks/count/c/0"), R),
        ("blocks-count-flipped", "a byte flipped in blocks/count", flip_byte("blocks/count", 0, 0.6), R),
        ("blocks-start-deleted", "blocks/start chunk deleted", delete("blocks/start/c/0"), R),
        ("blocks-removed", "the blocks group removed", delete("blocks"), R),
        (
            "chunks-crc-values-deleted",
            "chunks/crc_values chunk deleted (data intact)",
            delete("chunks/crc_values/c/0"),
            D,
        ),
        (
            "chunks-crc-alto-flipped",
            "a byte flipped in chunks/crc_alto (data intact)",
            flip_byte("chunks/crc_alto", 0, 0.6),
            R,
        ),
        ("chunks-min-flipped", "a byte flipped in chunks/min", flip_byte("chunks/min", 0, 0.6), R),
        ("chunks-max-deleted", "chunks/max chunk deleted", lambda s: chunk(s, "chunks/max", 0).unlink(), R),
        ("chunks-removed", "the chunks group removed", delete("chunks"), R),
        # array-level zarr.json
        (
            "alto-json-shape",
            "alto array shape 2999",
            edit_array_meta("alto", lambda d: d.__setitem__("shape", [d["shape"][0] - 1])),
            R,
        ),
        (
            "alto-json-dtype",
            "alto data_type uint32",
            edit_array_meta("alto", lambda d: d.__setitem__("data_type", "uint32")),
            R,
        ),
        (
            "alto-json-codecs",
            "alto codecs: delta filter removed",
            edit_array_meta(
                "alto", lambda d: d.__setitem__("codecs", [c for c in d["codecs"] if "delta" not in c["name"]])
            ),
            R,
        ),
        ("alto-json-invalid", "alto zarr.json cut in half", truncate_text("alto/zarr.json"), R),
        (
            "values-json-dtype",
            "values data_type float32",
            edit_array_meta("values", lambda d: d.__setitem__("data_type", "float32")),
            R,
        ),
        (
            "values-json-chunk-shape",
            "values chunk_shape 400",
            edit_array_meta("values", lambda d: d["chunk_grid"]["configuration"].__setitem__("chunk_shape", [400])),
            R,
        ),
        (
            "values-json-fill-deleted",
            "values fill_value 1.0 and chunk 4 deleted",
            combo(edit_array_meta("values", lambda d: d.__setitem__("fill_value", 1.0)), delete("values/c/4")),
            R,
        ),
        ("values-json-deleted", "values zarr.json deleted", delete("values/zarr.json"), R),
        (
            "values-json-attrs",
            "values array attributes edited",
            edit_array_meta("values", lambda d: d.__setitem__("attributes", {"x": 1})),
            H,
        ),
        (
            "junk-files",
            "junk files in the store root and in values/c",
            combo(junk("README.txt"), junk("values/c/.DS_Store")),
            H,
        ),
    ]
    if os.geteuid() != 0:  # chmod does not stop root: there the directory-for-a-chunk case stands in
        cases.append(
            ("values-chunk-unreadable", "values chunk 1 chmod 000", lambda s: os.chmod(chunk(s, "values", 1), 0), R)
        )
    return [
        Case(
            "store",
            name,
            desc,
            store_case(name, dmg, harm),
            f"{harm}: {why[harm]}"
            + (
                " (chunk data: cpd must notice; info need not read chunks)"
                if name.startswith(DATA_DAMAGE) and harm == R
                else ""
            ),
        )
        for name, desc, dmg, harm in cases
    ] + cli_cases()


def cli_cases() -> list[Case]:
    """CLI numbers on the valid store: each must be refused at parse time (or by the memory plan)."""
    bad = [
        ("cli-tol-nan", ["--tol", "nan"]),
        ("cli-tol-inf", ["--tol", "inf"]),
        ("cli-tol-negative", ["--tol", "-1"]),
        ("cli-tol-1e309", ["--tol", "1e309"]),
        ("cli-rank-0", ["--rank", "0"]),
        ("cli-rank-negative", ["--rank", "-2"]),
        ("cli-rank-100000", ["--rank", "100000"]),
        ("cli-rank-2^62", ["--rank", str(2**62)]),
        ("cli-max-iters-0", ["--max-iters", "0"]),
        ("cli-max-iters-negative", ["--max-iters", "-3"]),
        ("cli-samples-0", ["--method", "sts", "--samples", "0"]),
    ]

    def make(extra: list[str]) -> Callable[[Ctx], None]:
        def fn(ctx: Ctx) -> None:
            args = list(CPD)
            for i in range(0, len(extra), 2):
                if extra[i] in args:
                    args[args.index(extra[i]) + 1] = extra[i + 1]
                else:
                    args += extra[i : i + 2]
            res = ctx.dir / "cp.zarr"
            c, outcome = ctx.run(["cpd", str(ctx.shared["store"]["store"]), *args, "--out", str(res)])
            if outcome is None:
                check_cpd(ctx, c, res)
                ctx.silent(f"cpd accepted {' '.join(extra)}")

        return fn

    out = [Case("store", n, f"cpd {' '.join(e)} on the valid store (must be refused)", make(e)) for n, e in bad]
    return out + cli_flow_cases()


THROUGHPUT = re.compile(r"([0-9.eE+]+) M nonzero-modes/s")


def _throughput(ctx: Ctx, c: Cmd) -> None:
    for m in THROUGHPUT.finditer(c.out + c.err):
        if float(m.group(1)) > 1e5:  # 10^11 nonzero-modes a second: no machine does that
            ctx.silent(f"nonsense throughput printed: {m.group(0)}")


def cli_flow_cases() -> list[Case]:
    """Command sequences on the valid store: resume, rerun, convert onto an existing store."""

    def store(ctx: Ctx) -> Path:
        return ctx.shared["store"]["store"]

    def resume_without_checkpoint(ctx: Ctx) -> None:
        res = ctx.dir / "cp.zarr"
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res), "--resume"])
        if outcome is None:
            check_cpd(ctx, c, res)
            if not re.search(r"checkpoint", c.err, re.IGNORECASE):
                ctx.silent("--resume without a checkpoint started afresh without saying so")

    def resume_finished(ctx: Ctx) -> None:
        res = ctx.dir / "cp.zarr"
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res)])
        if outcome is not None:
            return
        first = check_cpd(ctx, c, res)
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res), "--resume"])
        if outcome is None:
            _throughput(ctx, c)
            again = check_cpd(ctx, c, res)
            if first and again and first["fit_printed"] != again["fit_printed"]:
                ctx.silent(f"resuming a finished run changed the fit {first['fit_printed']} -> {again['fit_printed']}")

    def result_exists(ctx: Ctx) -> None:
        res = ctx.dir / "cp.zarr"
        _, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--out", str(res)])
        if outcome is not None:
            return
        before = (res / "zarr.json").read_bytes()
        c, outcome = ctx.run(["cpd", str(store(ctx)), *CPD, "--seed", "1", "--out", str(res)])
        if outcome is None:
            ctx.silent("cpd replaced an existing result without --overwrite")
        elif (res / "zarr.json").read_bytes() != before:
            ctx.silent("a refused cpd still changed the existing result")

    def convert_onto_store(ctx: Ctx) -> None:
        dst = ctx.dir / "s.zarr"
        shutil.copytree(store(ctx), dst, symlinks=True)
        before = (dst / "zarr.json").read_bytes()
        src = ctx.dir / "other.tns"
        src.write_bytes(_tns_lines(small_rows(50, 3, (5, 5, 5))))
        _, outcome = ctx.run(["convert", str(src), str(dst)])
        if outcome is None:
            ctx.silent("convert replaced an existing store without --overwrite")
        elif (dst / "zarr.json").read_bytes() != before:
            ctx.silent("a refused convert still changed the existing store")

    def convert_overwrite(ctx: Ctx) -> None:
        dst = ctx.dir / "s.zarr"
        shutil.copytree(store(ctx), dst, symlinks=True)
        data = _tns_lines(small_rows(50, 3, (5, 5, 5)))
        src = ctx.dir / "other.tns"
        src.write_bytes(data)
        _, outcome = ctx.run(["convert", str(src), str(dst), "--overwrite"])
        if outcome is None:
            compare_store(ctx, dst, ref_parse(data))
        elif outcome == "clear error":
            ctx.flags.append("valid input refused")

    return [
        Case(
            "store",
            "flow-resume-no-checkpoint",
            "cpd --resume with no checkpoint: an error, or a warning that says it starts afresh",
            resume_without_checkpoint,
        ),
        Case(
            "store",
            "flow-resume-finished",
            "cpd, then cpd --resume of the finished run (0 iterations left): same fit, no nonsense throughput",
            resume_finished,
        ),
        Case(
            "store",
            "flow-result-exists",
            "cpd twice to one --out without --overwrite: the second refused, the result kept",
            result_exists,
        ),
        Case(
            "store",
            "flow-convert-existing",
            "convert onto an existing store without --overwrite: refused, the store kept",
            convert_onto_store,
        ),
        Case(
            "store",
            "flow-convert-overwrite",
            "convert onto an existing store with --overwrite: the new content (valid)",
            convert_overwrite,
        ),
    ]
