"""Numba parser for FROSTT ``.tns`` text: one nonzero per line, ``i_1 ... i_N value``.

The parser validates while it reads (column count, token syntax, index range, finite values) and
stops at the first problem, reporting an error code, the 1-based line within the buffer and the
column, so the caller can name the file and the global line. Values that the exact fast path
(Clinger: <= 15 significant digits, |exponent| <= 22) cannot convert are handed back as token
positions for Python's correctly rounded ``float``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

OK = 0
ERR_COLUMNS = 1
ERR_TOKEN = 2
ERR_INDEX_LOW = 3
ERR_INDEX_HIGH = 4
ERR_NONFINITE = 5
ERR_INDEX_OVERFLOW = 6

#: largest index a line may hold (int64); mode lengths must stay below 2^63
INDEX_MAX = 2**63 - 1

_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)

SPACE, TAB, CR, NL, HASH = 32, 9, 13, 10, 35


@nb.njit(inline="always")
def _is_sep(c):
    return c == SPACE or c == TAB or c == CR or c == NL or c == HASH


@nb.njit(inline="always")
def _lower(c):
    return c | 32 if 65 <= c <= 90 else c


@nb.njit(nogil=True, cache=True)
def parse_tns(buf, nmodes, one_based, shape, coords, values, slow):
    """Parse whole lines of ``buf`` (uint8).

    Parameters
    ----------
    buf : uint8 array, starting at a line start
    nmodes : number of index columns
    one_based : 1 if indices are 1-based (0 and negatives rejected), else 0
    shape : int64 (nmodes,), -1 where unknown; indices must be < shape (after conversion to 0-based)
    coords : int64 (cap, nmodes) output, 0-based
    values : float64 (cap,) output
    slow : int64 (cap, 3) output: (row, token start, token end) of values needing Python's float

    Returns
    -------
    (rows, nslow, lines, err, err_line, err_col)
        ``lines`` counts every line seen (comments and blanks included); on error ``err_line`` is
        the 1-based line in ``buf`` and ``err_col`` the 1-based column.
    """
    n = buf.shape[0]
    i = 0
    row = 0
    nslow = 0
    line = 0
    while i < n:
        line += 1
        col = 0
        while True:
            while i < n and (buf[i] == SPACE or buf[i] == TAB or buf[i] == CR):
                i += 1
            if i >= n or buf[i] == NL:
                break
            if buf[i] == HASH:
                while i < n and buf[i] != NL:
                    i += 1
                break
            if col > nmodes:
                return row, nslow, line, ERR_COLUMNS, line, col + 1
            if col < nmodes:
                neg = False
                if buf[i] == 45 or buf[i] == 43:
                    neg = buf[i] == 45
                    i += 1
                v = np.int64(0)
                while i < n and 48 <= buf[i] <= 57:
                    d = np.int64(buf[i] - 48)
                    if v > (INDEX_MAX - d) // 10:
                        return row, nslow, line, ERR_INDEX_OVERFLOW, line, col + 1
                    v = v * 10 + d
                    i += 1
                if i == 0 or not (48 <= buf[i - 1] <= 57) or (i < n and not _is_sep(buf[i])):
                    return row, nslow, line, ERR_TOKEN, line, col + 1
                if neg:
                    v = -v
                v -= one_based
                if v < 0:
                    return row, nslow, line, ERR_INDEX_LOW, line, col + 1
                if shape[col] >= 0 and v >= shape[col]:
                    return row, nslow, line, ERR_INDEX_HIGH, line, col + 1
                coords[row, col] = v
            else:
                start = i
                neg = False
                if buf[i] == 45 or buf[i] == 43:
                    neg = buf[i] == 45
                    i += 1
                c0 = _lower(buf[i]) if i < n else 0
                if c0 == 110 or c0 == 105:  # nan / inf / infinity
                    j = i
                    while j < n and not _is_sep(buf[j]):
                        j += 1
                    L = j - i
                    ok = False
                    if L == 3:
                        a, b, c = _lower(buf[i]), _lower(buf[i + 1]), _lower(buf[i + 2])
                        ok = (a == 110 and b == 97 and c == 110) or (a == 105 and b == 110 and c == 102)
                    elif L == 8:
                        ok = (
                            _lower(buf[i]) == 105
                            and _lower(buf[i + 1]) == 110
                            and _lower(buf[i + 2]) == 102
                            and _lower(buf[i + 3]) == 105
                            and _lower(buf[i + 4]) == 110
                            and _lower(buf[i + 5]) == 105
                            and _lower(buf[i + 6]) == 116
                            and _lower(buf[i + 7]) == 121
                        )
                    if ok:
                        return row, nslow, line, ERR_NONFINITE, line, col + 1
                    return row, nslow, line, ERR_TOKEN, line, col + 1
                mant = np.int64(0)
                sig = 0  # significant digits kept in mant
                exp10 = 0
                ndigits = 0
                exact = True
                while i < n and 48 <= buf[i] <= 57:
                    d = buf[i] - 48
                    ndigits += 1
                    if sig < 18:
                        mant = mant * 10 + d
                        if mant > 0:
                            sig += 1
                    else:
                        exp10 += 1
                        if d != 0:
                            exact = False
                    i += 1
                if i < n and buf[i] == 46:
                    i += 1
                    while i < n and 48 <= buf[i] <= 57:
                        d = buf[i] - 48
                        ndigits += 1
                        if sig < 18:
                            mant = mant * 10 + d
                            if mant > 0:
                                sig += 1
                            exp10 -= 1
                        elif d != 0:
                            exact = False
                        i += 1
                if ndigits == 0:
                    return row, nslow, line, ERR_TOKEN, line, col + 1
                if i < n and (buf[i] == 101 or buf[i] == 69):
                    i += 1
                    eneg = False
                    if i < n and (buf[i] == 45 or buf[i] == 43):
                        eneg = buf[i] == 45
                        i += 1
                    e = 0
                    ed = 0
                    while i < n and 48 <= buf[i] <= 57:
                        if e < 100000:
                            e = e * 10 + (buf[i] - 48)
                        ed += 1
                        i += 1
                    if ed == 0:
                        return row, nslow, line, ERR_TOKEN, line, col + 1
                    exp10 += -e if eneg else e
                if i < n and not _is_sep(buf[i]):
                    return row, nslow, line, ERR_TOKEN, line, col + 1
                if mant == 0:
                    values[row] = -0.0 if neg else 0.0
                elif exact and sig <= 15 and -22 <= exp10 <= 22:
                    x = np.float64(mant)
                    x = x * _POW10[exp10] if exp10 >= 0 else x / _POW10[-exp10]
                    values[row] = -x if neg else x
                else:
                    slow[nslow, 0] = row
                    slow[nslow, 1] = start
                    slow[nslow, 2] = i
                    nslow += 1
                    values[row] = 0.0
            col += 1
        if col != 0:
            if col != nmodes + 1:
                return row, nslow, line, ERR_COLUMNS, line, col
            row += 1
        i += 1  # past the newline
    return row, nslow, line, OK, 0, 0


def count_lines(buf: np.ndarray) -> int:
    """Upper bound on the nonzeros in ``buf``."""
    return int(np.count_nonzero(buf == NL)) + 1
