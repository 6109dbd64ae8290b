"""Values whose squares float64 cannot hold.

CP-ALS measures the fit from ||X||^2 = sum of squared values. A value above sqrt(DBL_MAX)
(about 1.34e154) squares to infinity, so the norm becomes ``Infinity`` and the fit NaN; a
subnormal value (below DBL_MIN, about 2.2e-308) squares to 0, and a tensor of such values has
||X|| = 0 and an all-zero model. Both gave exit 0 before; both are refused at ingest now, naming
the value and where it is, since no result computed from them would be right.
"""

from __future__ import annotations

import math
import sys

import numpy as np

#: largest magnitude whose square is finite in float64
SQUARE_MAX = math.sqrt(sys.float_info.max)
#: smallest normal float64 (values below it, but not 0, are subnormal)
NORMAL_MIN = sys.float_info.min


def first_out_of_range(values: np.ndarray) -> int:
    """Index of the first value whose square overflows or that is subnormal, or -1."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    bad = (a > SQUARE_MAX) | ((a < NORMAL_MIN) & (a != 0))
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
    return (
        f"value {shown} is subnormal (below float64's smallest normal number {NORMAL_MIN:.4g}): its square "
        f"is 0, so it cannot contribute to ||X|| or the fit; rescale the data or drop it"
    )
