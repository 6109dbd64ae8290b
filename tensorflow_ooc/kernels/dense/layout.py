"""Input checks and the canonical layout shared by the CPU and GPU dense MTTKRP kernels.

The kernels see a dense block as a flat buffer plus its shape in *memory order* (outermost mode
first, the contiguous mode last): a C-ordered block keeps its modes, an F-ordered one is seen
reversed, any other contiguous permutation is sorted by stride. No data moves; only the modes and
their factor matrices are renumbered. The factor rows the block touches are stacked in one
C array (sum of block lengths, R) in that order, which also gives the kernels row-major reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...errors import DenseArrayError, ShapeError

MIN_ORDER = 3
MAX_ORDER = 6
VARIANTS = ("elem", "slice", "tile")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class DenseLayout:
    """A validated dense MTTKRP call in memory order.

    perm[c] is the caller's mode at canonical position c; ``shape`` and ``strides`` (elements,
    C strides of ``shape``) are in canonical order; ``mode`` is the target's canonical position;
    ``loop`` the other positions, outermost first; ``offs[c]`` the first row of canonical mode c in
    the stacked factors (the target mode has no rows there).
    """

    perm: tuple[int, ...]
    shape: np.ndarray
    strides: np.ndarray
    mode: int
    loop: np.ndarray
    offs: np.ndarray
    rank: int
    dtype: np.dtype


def check_variant(variant: str, tile: int | None) -> None:
    if variant not in VARIANTS:
        raise DenseArrayError(f"dense MTTKRP variant must be one of {VARIANTS}, got {variant!r}")
    if tile is not None:
        if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or int(tile) < 1:
            raise DenseArrayError(f"tile width must be a positive integer, got {tile!r}")
        if variant != "tile":
            raise DenseArrayError(f"tile= applies to the 'tile' variant only, not {variant!r}")


def check_call(
    shape: Sequence[int], dtype, strides_ok: bool, factors: Sequence, mode: int, origin: Sequence[int] | None
) -> tuple[tuple[int, ...], int]:
    """Validate order, dtype, mode, origin and factor shapes; return (origin, rank).

    ``factors`` may hold host or device arrays (anything with ``shape`` and ``dtype``).
    """
    shape = tuple(int(s) for s in shape)
    d = len(shape)
    if not MIN_ORDER <= d <= MAX_ORDER:
        raise DenseArrayError(
            f"dense MTTKRP takes blocks of order {MIN_ORDER} to {MAX_ORDER}, got order {d} (shape {shape})"
        )
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise DenseArrayError(f"dense MTTKRP takes float32 or float64 blocks, got {dtype}")
    if not strides_ok:
        raise DenseArrayError("dense MTTKRP takes C- or F-contiguous blocks (or a contiguous permutation)")
    if isinstance(mode, bool) or not isinstance(mode, (int, np.integer)) or not 0 <= int(mode) < d:
        raise DenseArrayError(f"mode must be an integer in 0..{d - 1}, got {mode!r}")
    if len(factors) != d:
        raise ShapeError(f"expected {d} factor matrices for a block of order {d}, got {len(factors)}")
    if origin is None:
        origin = (0,) * d
    origin = tuple(int(o) for o in origin)
    if len(origin) != d:
        raise ShapeError(f"origin has {len(origin)} entries for a block of order {d}")
    if any(o < 0 for o in origin):
        raise ShapeError(f"origin {origin} has a negative entry")
    rank = None
    for m, f in enumerate(factors):
        fs = tuple(getattr(f, "shape", ()))
        if len(fs) != 2:
            raise ShapeError(f"factor matrix {m} must be 2-D (I_{m} x R), got shape {fs}")
        if np.dtype(f.dtype) != dtype:
            raise DenseArrayError(
                f"factor matrix {m} has dtype {np.dtype(f.dtype)}, the block {dtype}: pass factors of the block's dtype"
            )
        if rank is None:
            rank = fs[1]
        if fs[1] != rank:
            raise ShapeError(f"factor matrix {m} has {fs[1]} columns, factor matrix 0 has {rank}")
        if fs[0] < origin[m] + shape[m]:
            raise ShapeError(
                f"factor matrix {m} has {fs[0]} rows, but the block covers rows {origin[m]}.."
                f"{origin[m] + shape[m] - 1} of mode {m}"
            )
    if rank is None or rank < 1:
        raise ShapeError(f"the rank must be at least 1, got {rank}")
    return origin, int(rank)


def check_out(out, rows: int, rank: int, dtype) -> None:
    os_ = tuple(getattr(out, "shape", ()))
    if os_ != (rows, rank):
        raise ShapeError(f"out must have shape {(rows, rank)} (block rows of the target mode x rank), got {os_}")
    if np.dtype(out.dtype) != np.dtype(dtype):
        raise DenseArrayError(f"out has dtype {np.dtype(out.dtype)}, the block {np.dtype(dtype)}")


def memory_order(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """The permutation that makes a contiguous array C-ordered (outermost stride first), or None
    when the array is not a contiguous permutation. Modes of length one may have any stride."""
    d = len(shape)
    perm = tuple(sorted(range(d), key=lambda m: (-(abs(strides[m]) if shape[m] > 1 else 0), m)))
    # singleton modes go first (outermost): they never change an offset, and the innermost loop
    # of the kernels should run along a real mode
    perm = tuple([m for m in perm if shape[m] <= 1] + [m for m in perm if shape[m] > 1])
    expect = 1
    for m in reversed(perm):
        if shape[m] > 1:
            if strides[m] != expect:
                return None
            expect *= shape[m]
    return perm


def layout(shape: Sequence[int], perm: Sequence[int], mode: int, rank: int, dtype) -> DenseLayout:
    """The canonical layout for a block of ``shape`` seen in mode order ``perm``."""
    shp = np.array([int(shape[m]) for m in perm], dtype=np.int64)
    d = shp.shape[0]
    st = np.ones(d, dtype=np.int64)
    for c in range(d - 2, -1, -1):
        st[c] = st[c + 1] * shp[c + 1]
    k = list(perm).index(int(mode))
    loop = np.array([c for c in range(d) if c != k], dtype=np.int64)
    offs = np.zeros(d, dtype=np.int64)
    acc = 0
    for c in range(d):
        offs[c] = acc
        if c != k:
            acc += int(shp[c])
    return DenseLayout(tuple(int(p) for p in perm), shp, st, k, loop, offs, int(rank), np.dtype(dtype))


def stack_factors(
    factors: Sequence[np.ndarray], lay: DenseLayout, origin: Sequence[int], pad_to: int = 1
) -> np.ndarray:
    """The factor rows the block touches, canonical order, target mode left out: a C array
    (sum b_m, R') with R' = R rounded up to a multiple of ``pad_to`` (padding columns are zero)."""
    total = int(sum(int(lay.shape[c]) for c in range(len(lay.perm)) if c != lay.mode))
    cols = -(-lay.rank // pad_to) * pad_to
    F = np.empty((max(total, 1), cols), dtype=lay.dtype)
    if cols > lay.rank:
        F[:, lay.rank :] = 0
    for c, m in enumerate(lay.perm):
        if c == lay.mode:
            continue
        o = int(lay.offs[c])
        F[o : o + int(lay.shape[c]), : lay.rank] = factors[m][origin[m] : origin[m] + int(lay.shape[c])]
    return F


def check_finite_factors(F: np.ndarray) -> None:
    if not np.isfinite(F).all():
        raise DenseArrayError("a factor matrix holds NaN or Inf in the rows this block touches")
