"""Duplicate handling and adaptive blocking of ALTO-sorted nonzeros (seed 001, section 4.2)."""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .layout import BitLayout

DUPLICATE_POLICIES = ("error", "sum", "last")


@nb.njit(nogil=True, cache=True)
def _first_duplicate(keys):
    nwords, n = keys.shape
    for i in range(n - 1):
        same = True
        for w in range(nwords):
            if keys[w, i] != keys[w, i + 1]:
                same = False
                break
        if same:
            return i
    return -1


def first_duplicate(keys: np.ndarray) -> int:
    """Position i of the first pair of equal sorted keys (i, i+1), or -1."""
    return int(_first_duplicate(keys))


@nb.njit(nogil=True, cache=True)
def _merge_duplicates(keys, values, keep_last):
    nwords, n = keys.shape
    out = 0
    for i in range(n):
        if out > 0:
            same = True
            for w in range(nwords):
                if keys[w, out - 1] != keys[w, i]:
                    same = False
                    break
            if same:
                if keep_last:
                    values[out - 1] = values[i]
                else:
                    values[out - 1] += values[i]
                continue
        for w in range(nwords):
            keys[w, out] = keys[w, i]
        values[out] = values[i]
        out += 1
    return out


def merge_duplicates(keys: np.ndarray, values: np.ndarray, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """Collapse runs of equal sorted keys in place: ``"sum"`` adds values, ``"last"`` keeps the last."""
    n = _merge_duplicates(keys, values, policy == "last")
    return keys[:, :n], values[:n]


@nb.njit(nogil=True, cache=True)
def _key_runs(keys):
    """Start of every run of equal key words (rows 1.. of the ALTO words)."""
    nwords, n = keys.shape
    starts = np.empty(n + 1, dtype=np.int64)
    k = 0
    if n > 0:
        starts[0] = 0
        k = 1
    for i in range(1, n):
        for w in range(1, nwords):
            if keys[w, i] != keys[w, i - 1]:
                starts[k] = i
                k += 1
                break
    return starts[:k]


@dataclass
class BlockTable:
    """BLCO blocks: the key (upper ALTO words), first nonzero, nonzero count and per-mode base."""

    key: np.ndarray  # uint64 (nblocks, key_words); key_words = max(1, nwords - 1)
    start: np.ndarray  # int64 (nblocks,)
    count: np.ndarray  # int64 (nblocks,)
    base: np.ndarray  # int64 (nblocks, nmodes)

    @property
    def nblocks(self) -> int:
        return int(self.start.shape[0])

    @staticmethod
    def empty(layout: BitLayout) -> "BlockTable":
        kw = max(1, layout.nwords - 1)
        return BlockTable(
            np.zeros((0, kw), np.uint64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros((0, layout.nmodes), np.int64),
        )

    @staticmethod
    def concat(tables: list["BlockTable"], layout: BitLayout) -> "BlockTable":
        if not tables:
            return BlockTable.empty(layout)
        return BlockTable(*(np.concatenate([getattr(t, f) for t in tables]) for f in ("key", "start", "count", "base")))


def block_table(keys: np.ndarray, layout: BitLayout, max_block_nnz: int, offset: int = 0) -> BlockTable:
    """Blocks of sorted ALTO words: one per distinct key, split so none exceeds ``max_block_nnz``.

    ``offset`` is the global position of ``keys[:, 0]`` in the store.
    """
    n = keys.shape[1]
    run_starts = _key_runs(keys)
    run_ends = np.append(run_starts[1:], n)
    starts, counts, key_rows = [], [], []
    for s, e in zip(run_starts.tolist(), run_ends.tolist()):
        for b in range(s, e, max_block_nnz):
            starts.append(b)
            counts.append(min(max_block_nnz, e - b))
            key_rows.append(s)
    rows = np.array(key_rows, dtype=np.int64)
    kw = max(1, layout.nwords - 1)
    key = np.zeros((len(rows), kw), dtype=np.uint64)
    if layout.nwords > 1:
        key[:] = keys[1:, rows].T
    base = layout.keys_to_bases(key)
    return BlockTable(key, np.array(starts, dtype=np.int64) + offset, np.array(counts, dtype=np.int64), base)
