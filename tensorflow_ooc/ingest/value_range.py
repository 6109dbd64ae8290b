"""Values whose squares float64 cannot hold.

CP-ALS measures the fit from ||X||^2 = sum of squared values. A value above sqrt(DBL_MAX)
(about 1.34e154) squares to infinity, so the norm becomes ``Infinity`` and the fit NaN; a nonzero
value below sqrt(DBL_MIN) (2^-511, about 1.49e-154) squares to a subnormal number or to 0 (a
subnormal value itself, below DBL_MIN, about 2.2e-308, squares to 0), so the norm loses it, and a
tensor of such values has ||X|| = 0 and an all-zero model. Both gave exit 0 before; both are
refused at ingest now, naming the value and where it is, since no result computed from them would
be right. The test is made in float64, whatever the input's dtype: norms and fits are float64.
"""

from __future__ import annotations

import math
import sys

import numpy as np

#: largest magnitude whose square is finite in float64
SQUARE_MAX = math.sqrt(sys.float_info.max)
#: smallest normal float64 (values below it, but not 0, are subnormal)
NORMAL_MIN = sys.float_info.min
#: smallest magnitude whose square is a normal float64: 2^-511 (exactly sqrt(2^-1022))
SQUARE_MIN = math.sqrt(NORMAL_MIN)


def first_out_of_range(values: np.ndarray) -> int:
    """Index of the first value whose square overflows, or is subnormal or 0 though the value is
    not 0; -1 if there is none."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    bad = (a > SQUARE_MAX) | ((a < SQUARE_MIN) & (a != 0))
    if not bad.any():
        return -1
    return int(np.argmax(bad))


def range_problem(value: float, text: str | None = None) -> str:
    """Why ``value`` (written ``text`` in the input, when known) is refused, and what to do about it."""
    shown = text if text is not None else repr(value)
    if abs(value) > SQUARE_MAX:
        return (
            f"value {shown} is too large: its square overflows float64 (magnitudes must stay below "
            f"{SQUARE_MAX:.4g} so that ||X||^2 and the fit are finite); rescale the data"
        )
    if abs(value) < NORMAL_MIN:
        return (
            f"value {shown} is subnormal (below float64's smallest normal number {NORMAL_MIN:.4g}): its square "
            f"is 0, so it cannot contribute to ||X|| or the fit; rescale the data or drop it"
        )
    square = "0" if value * value == 0 else f"subnormal ({value * value:.4g})"
    return (
        f"value {shown} is too small: its square is {square} in float64, below the smallest normal number "
        f"{NORMAL_MIN:.4g}, so ||X||^2 and the fit lose it (nonzero magnitudes must be at least "
        f"{SQUARE_MIN:.4g}); rescale the data or drop it"
    )


def first_lost_in(values: np.ndarray, dtype: np.dtype) -> int:
    """Index of the first nonzero value that ``dtype`` (narrower than float64) holds only as a
    subnormal or as 0; -1 if there is none (float64: always -1, the square check covers it)."""
    dtype = np.dtype(dtype)
    if dtype.itemsize >= 8:
        return -1
    a = np.abs(np.asarray(values, dtype=np.float64))
    bad = (a < float(np.finfo(dtype).tiny)) & (a != 0)
    return int(np.argmax(bad)) if bad.any() else -1


def lost_problem(value: float, dtype: np.dtype) -> str:
    """Why ``value`` cannot be stored as ``dtype``."""
    dtype = np.dtype(dtype)
    return (
        f"value {value!r} is too small for {dtype.name} values (smallest normal magnitude "
        f"{float(np.finfo(dtype).tiny):.4g}): it would be stored as a subnormal or as 0; store float64 "
        f"values instead (values_dtype='float64')"
    )
