"""Read ``.tns`` / ``.tns.gz`` files as line-aligned pieces and parse them in parallel with Dask.

Plain files are cut into byte ranges that each task reads itself (a range owns the lines that start
inside it). Gzip streams cannot be split, so they are inflated here piece by piece and the pieces
are parsed in parallel. Results come back in file order so errors name the first bad line.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

import dask
import numpy as np

from ..errors import EmptyTensorError, IndexRangeError, NonFiniteValueError, ParseError, ShapeError, ValueRangeError
from . import tns_parse as P
from .value_range import first_out_of_range, range_problem

#: a value whose square overflows float64, or a nonzero one whose square is subnormal or 0 (see value_range)
ERR_VALUE_RANGE = 100

GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ParsedPiece:
    coords: np.ndarray  # int64 (rows, nmodes), 0-based
    values: np.ndarray  # float64 (rows,)
    lines: int  # lines in the piece (for global line numbers)
    error: tuple | None  # (code, line in piece, column, token text)
    nbytes: int
    max: np.ndarray  # int64 (nmodes,) largest index per mode, -1 if empty


def is_gzip(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def _open_text(path: str | os.PathLike):
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def detect_nmodes(path: str | os.PathLike) -> int:
    """Index columns in the first data line (comments and blank lines skipped)."""
    try:
        with _open_text(path) as f:
            for lineno, raw in enumerate(f, start=1):
                text = raw.split(b"#", 1)[0].strip()
                if text:
                    ncols = len(text.split())
                    if ncols < 3:
                        raise ParseError(
                            f"first data line has {ncols} column(s); a .tns line needs at least 2 indices and a value",
                            path,
                            lineno,
                        )
                    return ncols - 1
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ParseError(f"gzip stream is truncated or corrupt ({exc})", path) from exc
    except UnicodeDecodeError as exc:  # pragma: no cover - bytes mode
        raise ParseError(str(exc), path) from exc
    raise EmptyTensorError("file has no nonzeros (no data lines)", path)


# the header `tfooc generate` and the workflows' generate steps write (synthetic/tns_writer.py)
_HEADER_SHAPE = re.compile(rb"^#\s*tensorflow_ooc synthetic\b.*?\bshape (\d+(?:,\d+)*)")


def declared_shape(path: str | os.PathLike, nmodes: int) -> tuple[int, ...] | None:
    """The shape named in the comment header this package's generators write ("# tensorflow_ooc
    synthetic ... tensor, shape 183,24,1140,1717, ..."), or None. A ``.tns`` carries no shape, so it
    is otherwise inferred from the largest indices, which drops trailing slices without nonzeros
    (a planted uber-shaped model converted to 183 x 24 x 1138 x 1711)."""
    try:
        with _open_text(path) as f:
            for raw in f:
                if not raw.startswith(b"#"):
                    return None  # the header is the file's leading comment lines
                m = _HEADER_SHAPE.match(raw)
                if m:
                    shape = tuple(int(x) for x in m.group(1).split(b","))
                    return shape if len(shape) == nmodes and min(shape) > 0 else None
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return None  # reading the data reports what is wrong with the file
    return None


def parse_buffer(buf: np.ndarray, nmodes: int, one_based: bool, shape: np.ndarray) -> ParsedPiece:
    """Parse one line-aligned buffer (runs without the GIL)."""
    cap = P.count_lines(buf)
    coords = np.empty((cap, nmodes), dtype=np.int64)
    values = np.empty(cap, dtype=np.float64)
    slow = np.empty((cap, 3), dtype=np.int64)
    rows, nslow, lines, err, err_line, err_col = P.parse_tns(buf, nmodes, int(one_based), shape, coords, values, slow)
    error = None
    if err != P.OK:
        error = (int(err), int(err_line), int(err_col), *_token(buf, int(err_line), int(err_col)))
    for r, s, e in slow[:nslow]:
        text = bytes(buf[s:e])
        v = float(text)
        if not np.isfinite(v):
            ln = int(np.count_nonzero(buf[:s] == P.NL)) + 1
            cand = (P.ERR_NONFINITE, ln, nmodes + 1, text.decode(errors="replace"), nmodes + 1)
            if error is None or ln < error[1]:
                error = cand
            break
        values[r] = v
    bad = first_out_of_range(values[:rows])
    if bad >= 0:
        ln = _line_of_row(buf, bad)
        if error is None or ln < error[1]:
            error = (ERR_VALUE_RANGE, ln, nmodes + 1, *_token(buf, ln, nmodes + 1))
    coords = coords[:rows]
    mx = coords.max(axis=0) if rows else np.full(nmodes, -1, dtype=np.int64)
    return ParsedPiece(coords, values[:rows], int(lines), error, int(buf.shape[0]), mx)


def _line_of_row(buf: np.ndarray, row: int) -> int:
    """1-based line in ``buf`` of data row ``row`` (comments and blank lines skipped); for messages."""
    seen = -1
    for ln, raw in enumerate(bytes(buf).split(b"\n"), start=1):
        if raw.split(b"#", 1)[0].strip():
            seen += 1
            if seen == row:
                return ln
    return ln  # pragma: no cover - row beyond the buffer


def _token(buf: np.ndarray, line: int, col: int) -> tuple[str, int]:
    """Text of column ``col`` on ``line`` of buf and the line's token count, for messages."""
    nl = np.flatnonzero(buf == P.NL)
    s = 0 if line <= 1 else int(nl[line - 2]) + 1
    e = int(nl[line - 1]) if line - 1 < len(nl) else len(buf)
    toks = bytes(buf[s:e]).split(b"#", 1)[0].split()
    tok = toks[col - 1].decode(errors="replace")[:40] if 0 < col <= len(toks) else ""
    return tok, len(toks)


def raise_piece_error(
    path: str, first_line: int, nmodes: int, one_based: bool, shape: np.ndarray, error: tuple
) -> None:
    code, line, col, tok, ntoks = error
    where = dict(path=path, line=first_line + line - 1)
    field = f"column {col}"
    if code == P.ERR_COLUMNS or ntoks != nmodes + 1:
        # a short line puts its value in an index column: report the column count, not the token
        raise ParseError(f"expected {nmodes + 1} columns ({nmodes} indices and a value), found {ntoks}", **where)
    if code == P.ERR_TOKEN:
        kind = "an integer index" if col <= nmodes else "a number"
        raise ParseError(f"{field}: token {tok!r} is not {kind}", **where)
    if code == P.ERR_INDEX_OVERFLOW:
        raise IndexRangeError(
            f"{field}: index {tok!r} is too large: indices must be at most 2^63 - 1 ({P.INDEX_MAX:,})", **where
        )
    if code == P.ERR_INDEX_LOW:
        base = "1-based data: indices start at 1" if one_based else "0-based data: indices start at 0"
        raise IndexRangeError(f"{field}: index {tok} is out of range ({base})", **where)
    if code == P.ERR_INDEX_HIGH:
        raise IndexRangeError(
            f"{field}: index {tok} is beyond the given shape (mode {col - 1} has length {int(shape[col - 1])})", **where
        )
    if code == P.ERR_NONFINITE:
        raise NonFiniteValueError(f"{field}: value {tok!r} is not finite", **where)
    if code == ERR_VALUE_RANGE:
        raise ValueRangeError(f"{field}: {range_problem(float(tok), tok)}", **where)
    raise ParseError(f"{field}: parse error {code}", **where)  # pragma: no cover


# --- pieces ---------------------------------------------------------------------------------------


def _read_range(path: str, start: int, stop: int, size: int) -> np.ndarray:
    """Bytes of the lines that start in [start, stop)."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            prev = f.read(1)
            data = bytearray(f.read(stop - start))
            if prev != b"\n":
                cut = data.find(b"\n")
                if cut < 0:
                    return np.zeros(0, dtype=np.uint8)
                del data[: cut + 1]
        else:
            data = bytearray(f.read(stop))
        if stop < size and (not data or data[-1:] != b"\n"):
            while True:
                more = f.read(1 << 16)
                if not more:
                    break
                cut = more.find(b"\n")
                if cut >= 0:
                    data += more[: cut + 1]
                    break
                data += more
    return np.frombuffer(bytes(data), dtype=np.uint8)


def _gzip_pieces(path: str, piece_bytes: int) -> Iterator[np.ndarray]:
    carry = b""
    try:
        with gzip.open(path, "rb") as f:
            while True:
                block = f.read(piece_bytes)
                if not block:
                    break
                data = carry + block
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                carry = data[cut + 1 :]
                yield np.frombuffer(data[: cut + 1], dtype=np.uint8)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ParseError(f"gzip stream is truncated or corrupt ({exc})", path) from exc
    if carry:
        yield np.frombuffer(carry, dtype=np.uint8)


def piece_tasks(path: str, piece_bytes: int) -> Iterator[Callable[[], np.ndarray]]:
    """Callables returning line-aligned buffers, in file order."""
    if is_gzip(path):
        for buf in _gzip_pieces(path, piece_bytes):
            yield lambda buf=buf: buf
        return
    size = os.path.getsize(path)
    for start in range(0, size, piece_bytes):
        stop = min(size, start + piece_bytes)
        yield lambda s=start, e=stop: _read_range(path, s, e, size)


def parse_file(
    path: str | os.PathLike, nmodes: int, one_based: bool, shape: np.ndarray, piece_bytes: int, workers: int
) -> Iterator[ParsedPiece]:
    """Parse a text tensor in parallel, yielding pieces in file order; raises on the first bad line.

    At most ``workers`` pieces are in flight, so memory stays near ``workers * piece_bytes`` plus
    the parsed arrays.
    """
    path = str(path)
    first_line = 1
    window: list = []

    def run(window):
        tasks = [dask.delayed(lambda t: parse_buffer(t(), nmodes, one_based, shape))(t) for t in window]
        return dask.compute(*tasks, scheduler="threads", num_workers=workers)

    def drain(results):
        nonlocal first_line
        for piece in results:
            if piece.error is not None:
                raise_piece_error(path, first_line, nmodes, one_based, shape, piece.error)
            first_line += piece.lines
            yield piece

    for task in piece_tasks(path, piece_bytes):
        window.append(task)
        if len(window) == workers:
            yield from drain(run(window))
            window = []
    if window:
        yield from drain(run(window))


def check_shape_arity(path: str, shape, nmodes: int) -> None:
    if shape is not None and len(shape) != nmodes:
        raise ShapeError(f"the given shape has {len(shape)} modes but the file's lines have {nmodes} indices", path)
