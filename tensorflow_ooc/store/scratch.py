"""Buffers that the groups of one sampled gather reuse, in place of fresh ones a group.

A gather reads its index chunks in groups of millions of entries; a buffer that large is mapped
fresh by the allocator each time and costs its pages' faults and zeroing (about 100 MB a group
on the 86 M Amazon-shaped store, between the compressed bytes, the decoded entries and the
scatter's slots). Reused, only the first group pays them.
"""

from __future__ import annotations

import numpy as np


class ScratchBuffers:
    """Named 1-D buffers, each grown as asked and reused: :meth:`take` gives a view of the first
    ``n`` elements (contents undefined), valid until the next :meth:`take` of that name."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def take(self, name: str, n: int, dtype) -> np.ndarray:
        """``n`` elements of ``dtype`` from buffer ``name`` (grown, never shrunk, while kept)."""
        dtype = np.dtype(dtype)
        have = self._arrays.get(name)
        if have is None or have.dtype != dtype or have.shape[0] < n:
            have = self._arrays[name] = np.empty(int(n), dtype=dtype)
        return have[: int(n)]

    @property
    def nbytes(self) -> int:
        """Bytes the buffers hold."""
        return sum(a.nbytes for a in self._arrays.values())
