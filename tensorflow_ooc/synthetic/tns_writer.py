"""Writing nonzeros as ``.tns`` text: ``format_tns`` (exact, numba-formatted) and ``write_tns`` (atomic, gzip)."""

from __future__ import annotations

import gzip
import os

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def _write_int(buf, pos, v):
    if v == 0:
        buf[pos] = 48
        return pos + 1
    start = pos
    while v > 0:
        buf[pos] = 48 + v % 10
        v //= 10
        pos += 1
    i, j = start, pos - 1
    while i < j:
        buf[i], buf[j] = buf[j], buf[i]
        i += 1
        j -= 1
    return pos


@nb.njit(nogil=True, cache=True)
def _format_fixed(coords, offset, scaled, decimals, buf):
    """Lines 'i_1 ... i_N value' with value = scaled / 10**decimals (scaled >= 0)."""
    pos = 0
    div = 10**decimals
    for i in range(coords.shape[0]):
        for m in range(coords.shape[1]):
            pos = _write_int(buf, pos, coords[i, m] + offset)
            buf[pos] = 32
            pos += 1
        v = scaled[i]
        pos = _write_int(buf, pos, v // div)
        if decimals > 0:
            buf[pos] = 46
            pos += 1
            frac = v % div
            d = div // 10
            while d > 0:
                buf[pos] = 48 + (frac // d) % 10
                pos += 1
                d //= 10
        buf[pos] = 10
        pos += 1
    return pos


def format_tns(coords: np.ndarray, values: np.ndarray, one_based: bool = True) -> bytes:
    """Text lines for a batch of nonzeros. Exact: values parse back to the same float64."""
    offset = 1 if one_based else 0
    for decimals in (0, 6):
        scaled = np.round(values * 10**decimals)
        if (values >= 0).all() and (scaled / 10**decimals == values).all() and scaled.max(initial=0) < 2**62:
            cap = coords.shape[0] * (coords.shape[1] * 20 + 32)
            buf = np.empty(cap, dtype=np.uint8)
            n = _format_fixed(np.ascontiguousarray(coords), offset, scaled.astype(np.int64), decimals, buf)
            return buf[:n].tobytes()
    # general floats: shortest repr that round-trips
    idx = (coords + offset).astype(str)
    lines = [" ".join(row) + " " + repr(float(v)) for row, v in zip(idx.tolist(), values.tolist(), strict=False)]
    return ("\n".join(lines) + "\n").encode()


def write_tns(path: str | os.PathLike, batches, *, one_based: bool = True, header: str | None = None) -> int:
    """Write batches of ``(coords, values)`` to a ``.tns`` file (gzip if the name ends in ``.gz``).

    Returns the number of nonzeros written. The file appears under its final name only when
    complete (written to ``<path>.partial-<host>-<pid>``, then renamed); partial files of killed
    runs in the same folder are removed first (see :mod:`tensorflow_ooc.tempdirs`).
    """
    from ..tempdirs import clean_stale, owner_suffix

    path = str(path)
    clean_stale(os.path.dirname(os.path.abspath(path)))  # what killed runs left here
    # host and pid in the name: if this process dies, the next run into this folder removes it
    tmp = f"{path}.partial-{owner_suffix()}"
    opener = gzip.open if path.endswith(".gz") else open
    total = piece = 0
    try:
        with opener(tmp, "wb") as f:
            if header:
                f.write(b"".join(b"# " + line.encode() + b"\n" for line in header.splitlines()))
            for coords, values in batches:
                text = format_tns(coords, values, one_based)
                piece = len(text)
                f.write(text)
                total += coords.shape[0]
        os.replace(tmp, path)
    except BaseException as exc:
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if os.path.exists(tmp):
            os.remove(tmp)
        from ..disk import disk_full_error, is_disk_full

        if is_disk_full(exc):  # the file named; it needs at least what was written and the failed piece
            raise disk_full_error(exc, path, needed=written + piece) from exc
        raise
    return total
