"""BLCO construction from in-memory COO: linearize, sort in ALTO order, merge duplicates, block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np

from ..errors import DuplicateError
from .blocking import DUPLICATE_POLICIES, BlockTable, block_table, first_duplicate, merge_duplicates
from .layout import BitLayout
from .linearize import alto_words, delinearize, reencode
from .radix_sort import sort_alto

DEFAULT_MAX_BLOCK_NNZ = 1 << 24

T = TypeVar("T")


@dataclass
class BLCOTensor:
    """A BLCO tensor in memory.

    Attributes
    ----------
    layout : BitLayout
    index : uint64 (nnz,)
        Re-encoded BLCO indices in ALTO order; decode with the block's base.
    values : (nnz,)
    blocks : BlockTable
    """

    layout: BitLayout
    index: np.ndarray
    values: np.ndarray
    blocks: BlockTable
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def derived(self, key: Hashable, build: Callable[[], T]) -> T:
        """What ``build()`` makes of this tensor, made the first time ``key`` is asked for and kept
        with it: the structures the layers above derive from it (the kernels' work items and
        mode-sorted copies, TTM layouts), which this layer cannot name. The tensor is not changed
        after construction, so they stay valid."""
        try:
            return self._derived[key]
        except KeyError:
            made = self._derived[key] = build()
            return made

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])

    def to_coo(self) -> tuple[np.ndarray, np.ndarray]:
        """0-based coordinates (nnz, nmodes) int64 and values, in ALTO order."""
        coords = np.empty((self.nnz, self.layout.nmodes), dtype=np.int64)
        for b in range(self.blocks.nblocks):
            s, c = int(self.blocks.start[b]), int(self.blocks.count[b])
            delinearize(self.index[s : s + c], self.blocks.base[b], self.layout, out=coords[s : s + c])
        return coords, self.values


def describe_duplicate(keys: np.ndarray, i: int, layout: BitLayout, one_based: bool = False) -> str:
    """Coordinates of the duplicate at sorted position i, for error messages."""
    base = layout.key_to_base(keys[1:, i]) if layout.nwords > 1 else np.zeros(layout.nmodes, np.int64)
    low = reencode(keys[0, i : i + 1].copy(), layout)
    coord = delinearize(low, base, layout)[0] + (1 if one_based else 0)
    return f"({', '.join(str(int(c)) for c in coord)})" + (" (1-based)" if one_based else " (0-based)")


def duplicate_error(keys: np.ndarray, i: int, layout: BitLayout, one_based: bool = False) -> DuplicateError:
    """The error for a coordinate that appears more than once (sorted position i)."""
    return DuplicateError(
        f"duplicate coordinate {describe_duplicate(keys, i, layout, one_based)} appears more "
        "than once; pass duplicates='sum' or duplicates='last' to merge duplicates"
    )


def sort_nonzeros(
    keys: np.ndarray, values: np.ndarray, layout: BitLayout, duplicates: str = "error", one_based_report: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Sort ALTO words (with values) and apply the duplicate policy."""
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {duplicates!r}")
    keys, values = sort_alto(keys, values, layout.total_bits)
    return apply_duplicates(keys, values, layout, duplicates, one_based_report)


def apply_duplicates(
    keys: np.ndarray, values: np.ndarray, layout: BitLayout, duplicates: str = "error", one_based_report: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The duplicate policy on sorted ALTO words: raise, sum or keep the last of each repeat."""
    i = first_duplicate(keys)
    if i >= 0:
        if duplicates == "error":
            raise duplicate_error(keys, i, layout, one_based_report)
        keys, values = merge_duplicates(keys, values, duplicates)
    return keys, values


def encode_coo(
    coords: np.ndarray,
    values: np.ndarray,
    shape: Sequence[int],
    *,
    duplicates: str = "error",
    max_block_nnz: int = DEFAULT_MAX_BLOCK_NNZ,
) -> BLCOTensor:
    """Build a BLCO tensor from validated 0-based COO data.

    Parameters
    ----------
    coords : int64 array (nnz, nmodes), 0 <= coords[:, n] < shape[n] (not checked here)
    values : array (nnz,)
    shape : mode lengths
    duplicates : "error", "sum" or "last"
    max_block_nnz : largest block

    Examples
    --------
    >>> import numpy as np
    >>> t = encode_coo(np.array([[0, 1, 2], [3, 0, 1]]), np.array([1.0, 2.0]), (4, 2, 3))
    >>> t.nnz, t.blocks.nblocks
    (2, 1)
    """
    layout = BitLayout(tuple(shape))
    keys = alto_words(coords, layout)
    keys, values = sort_nonzeros(keys, np.array(values, copy=True), layout, duplicates)
    blocks = block_table(keys, layout, max_block_nnz)
    return BLCOTensor(layout, reencode(keys[0], layout), values, blocks)
