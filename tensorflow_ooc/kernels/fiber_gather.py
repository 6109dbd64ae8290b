"""Sampled MTTKRP: the mode-j fibers of sampled Khatri-Rao rows, gathered from BLCO work items.

The sketched least-squares solve of mode ``j`` (seed 000, section 3.3.3) keeps only the rows of
``mat(X, j)^T`` named by the sampled multi-indices ``s`` of the other modes: each is the fiber
``X[s_0, .., :, .., s_{N-1}]``. Its right-hand side is the *sampled MTTKRP*

    Mtilde[i, :] = sum_s  X[s with mode j = i] * Hw[s, :],    Hw[s] = weight_s * KRP row_s,

so fibers never need to be formed: every nonzero whose other coordinates equal a sample adds its
value times that sample's row into its mode-j row. Two ways to find those nonzeros:

- **scan** (streamed chunks, the hash join): one pass over the work items, each nonzero's other
  coordinates looked up in an open-addressing hash table of the sample keys. O(nnz) probes, but no
  factor rows are read, so a pass costs a fraction of an MTTKRP.
- **index** (decoded partitions kept in memory): once per partition and mode, the nonzeros' keys
  sorted with their mode-j row and value (:class:`FiberIndex`); each sample then finds its fiber
  by binary search: O(S log nnz + fiber nonzeros) per solve, independent of the tensor's size.

A key is the mixed-radix number of a nonzero's coordinates in the other modes. When the product of
the other modes' lengths exceeds 2^63 the keys wrap (a hash); the scan then checks a hit's
coordinates against the sample's, and the index is not used (:func:`exact_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from ..format import BitLayout
from ..format.bits import pext
from .atomics import atomic_add
from .plan import WorkItems

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


def key_strides(shape: tuple[int, ...], mode: int) -> np.ndarray:
    """uint64 (N,) strides of the mixed-radix key over the modes other than ``mode`` (0 for it);
    products wrap modulo 2^64 where the key space is larger."""
    strides = np.zeros(len(shape), dtype=np.uint64)
    s = 1
    for m in range(len(shape) - 1, -1, -1):
        if m != mode:
            strides[m] = np.uint64(s % 2**64)
            s *= int(shape[m])
    return strides


def exact_keys(shape: tuple[int, ...], mode: int) -> bool:
    """Whether mode ``mode``'s keys are exact (the other modes' index space fits in 63 bits)."""
    p = 1
    for m, s in enumerate(shape):
        if m != mode:
            p *= int(s)
    return p < 2**63


def sample_keys(coords: np.ndarray, shape: tuple[int, ...], mode: int) -> np.ndarray:
    """uint64 keys of sampled multi-indices ``coords`` (S, N); column ``mode`` is ignored."""
    strides = key_strides(shape, mode)
    return (np.asarray(coords, dtype=np.int64).astype(np.uint64) * strides[None, :]).sum(axis=1, dtype=np.uint64)


@dataclass
class SampleTable:
    """Open-addressing hash table (linear probing, load <= 1/2) of distinct sample keys.

    ``slot_key[h]`` / ``slot_id[h]``: the key and sample number stored in slot ``h`` (-1: empty)."""

    slot_key: np.ndarray     # uint64 (T,), T a power of two
    slot_id: np.ndarray      # int64 (T,)
    shift: int               # 64 - log2(T): a key's home slot is (key * mult) >> shift

    @classmethod
    def build(cls, keys: np.ndarray) -> SampleTable:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        bits = max(4, int(2 * max(1, keys.shape[0]) - 1).bit_length())
        slot_key = np.zeros(1 << bits, dtype=np.uint64)
        slot_id = np.full(1 << bits, -1, dtype=np.int64)
        _fill_table(keys, slot_key, slot_id, 64 - bits)
        return cls(slot_key, slot_id, 64 - bits)


@nb.njit(cache=True)
def _home(key, shift):
    return np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))


@nb.njit(cache=True)
def _fill_table(keys, slot_key, slot_id, shift):
    mask = slot_key.shape[0] - 1
    for s in range(keys.shape[0]):
        h = _home(keys[s], shift)
        while slot_id[h] >= 0:
            h = (h + 1) & mask
        slot_key[h] = keys[s]
        slot_id[h] = s


@nb.njit(parallel=True, nogil=True, cache=True)
def sampled_scan(index, values, item_start, item_end, item_base, item_prev, shift, mask, delta, mode, strides,
                 verify, slot_key, slot_id, table_shift, sample_coords, Hw, out_flat, out_lo):
    """Add the sampled MTTKRP of work items into ``out_flat`` (rows ``out_lo ..`` of mode ``mode``,
    row-major), finding each nonzero's sample by hash lookup.

    Parameters
    ----------
    index, values, item_start, item_end, item_base, item_prev : the work items (see
        :class:`~tensorflow_ooc.kernels.plan.WorkItems`); with ``delta`` the index holds Delta
        differences of ALTO words, split into modes with ``pext`` by ``mask``, else BLCO fields
        ``(x >> shift[m]) & mask[m]``
    mode : int                   target mode j
    strides : uint64 (N,)        key strides (:func:`key_strides`)
    verify : bool                compare a hit's coordinates with ``sample_coords`` (wrapped keys)
    slot_key, slot_id, table_shift : the :class:`SampleTable`
    sample_coords : int64 (S, N) the samples' multi-indices
    Hw : float (S, R)            weighted Khatri-Rao row of each sample
    out_flat : float (rows * R,) output, updated with atomic adds (fibers of two samples may share rows)
    """
    N = item_base.shape[1]
    R = Hw.shape[1]
    tmask = slot_key.shape[0] - 1
    for k in nb.prange(item_start.shape[0]):
        c = np.empty(N, dtype=np.int64)
        word = item_prev[k]
        for i in range(item_start[k], item_end[k]):
            if delta:
                word += index[i]
                x = word
            else:
                x = index[i]
            key = np.uint64(0)
            for m in range(N):
                if delta:
                    c[m] = item_base[k, m] + np.int64(pext(x, mask[m]))
                else:
                    c[m] = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                key += np.uint64(c[m]) * strides[m]
            h = _home(key, table_shift)
            sid = -1
            while slot_id[h] >= 0:
                if slot_key[h] == key:
                    sid = slot_id[h]
                    if verify:
                        for m in range(N):
                            if m != mode and c[m] != sample_coords[sid, m]:
                                sid = -1
                    if sid >= 0:
                        break
                h = (h + 1) & tmask
            if sid >= 0:
                v = values[i]
                base = (c[mode] - out_lo) * R
                for r in range(R):
                    atomic_add(out_flat, base + r, v * Hw[sid, r])


@nb.njit(parallel=True, nogil=True, cache=True)
def _index_entries(index, values, item_start, item_end, item_base, shift, mask, mode, strides, keys, rows, vals):
    """Key, mode-``mode`` row and value of every nonzero of (non-delta) work items, in place."""
    N = item_base.shape[1]
    for k in nb.prange(item_start.shape[0]):
        for i in range(item_start[k], item_end[k]):
            x = index[i]
            key = np.uint64(0)
            for m in range(N):
                c = item_base[k, m] + np.int64((x >> np.uint64(shift[m])) & mask[m])
                if m == mode:
                    rows[i] = c
                else:
                    key += np.uint64(c) * strides[m]
            keys[i] = key
            vals[i] = values[i]


@nb.njit(parallel=True, nogil=True, cache=True)
def sampled_indexed(keys, rows, vals, skeys, Hw, out_flat, out_lo):
    """Add the sampled MTTKRP into ``out_flat`` from a :class:`FiberIndex`.

    Parameters
    ----------
    keys : uint64 (nnz,) sorted; rows : int64 (nnz,); vals : float (nnz,)   the index
    skeys : uint64 (S,)          the samples' keys (exact keys only)
    Hw : float (S, R)            weighted Khatri-Rao row of each sample
    out_flat, out_lo : as in :func:`sampled_scan`
    """
    R = Hw.shape[1]
    for s in nb.prange(skeys.shape[0]):
        lo = np.searchsorted(keys, skeys[s], side="left")
        hi = np.searchsorted(keys, skeys[s], side="right")
        for e in range(lo, hi):
            v = vals[e]
            base = (rows[e] - out_lo) * R
            for r in range(R):
                atomic_add(out_flat, base + r, v * Hw[s, r])


@dataclass
class FiberIndex:
    """A partition's nonzeros sorted by their key in the modes other than ``mode``: the fiber of a
    sampled multi-index is one contiguous run, found by binary search. 24 bytes a nonzero."""

    mode: int
    keys: np.ndarray        # uint64 (nnz,), sorted
    rows: np.ndarray        # int64 (nnz,): the nonzero's index in ``mode``
    vals: np.ndarray        # (nnz,) values

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.rows.nbytes + self.vals.nbytes)

    @classmethod
    def build(cls, items: WorkItems, layout: BitLayout, mode: int) -> FiberIndex:
        """Index decoded (non-delta) work items for ``mode``; needs :func:`exact_keys`."""
        if items.delta:
            raise ValueError("a fiber index is built from decoded partitions, not Delta-encoded batches")
        if not exact_keys(layout.shape, mode):
            raise ValueError(f"mode {mode}: the other modes' index space exceeds 63 bits; use the scan")
        nnz = items.index.shape[0]
        keys = np.zeros(nnz, dtype=np.uint64)
        rows = np.zeros(nnz, dtype=np.int64)
        vals = np.zeros(nnz, dtype=items.values.dtype)
        _index_entries(items.index, items.values, items.start, items.end, items.base, layout.field_shift,
                       layout.field_mask, mode, key_strides(layout.shape, mode), keys, rows, vals)
        order = np.argsort(keys, kind="stable")
        return cls(mode, keys[order], rows[order], vals[order])


def sampled_mttkrp_items(items: WorkItems, layout: BitLayout, mode: int, coords: np.ndarray, Hw: np.ndarray,
                         out: np.ndarray, out_lo: int = 0, table: SampleTable | None = None,
                         index: FiberIndex | None = None) -> None:
    """Add the sampled MTTKRP of ``items`` for samples ``coords`` (S, N) with weighted rows ``Hw``
    (S, R) into ``out`` (rows ``out_lo ..`` of mode ``mode``): through ``index`` when given (it must
    be for ``mode``), else by scanning with the hash ``table`` of the samples' keys (built here when
    not given). ``coords`` must be valid indices (the samplers draw them from the factors' rows)."""
    R = out.shape[1]
    if Hw.shape != (coords.shape[0], R):
        raise ValueError(f"Hw must be (samples, R) = {(coords.shape[0], R)}, got {Hw.shape}")
    Hw = np.ascontiguousarray(Hw, dtype=out.dtype)
    if coords.shape[0] == 0 or items.nitems == 0:
        return
    if index is not None:
        if index.mode != mode:
            raise ValueError(f"the fiber index is for mode {index.mode}, not {mode}")
        skeys = sample_keys(coords, layout.shape, mode)
        sampled_indexed(index.keys, index.rows, index.vals, skeys, Hw, out.reshape(-1), out_lo)
        return
    if table is None:
        table = SampleTable.build(sample_keys(coords, layout.shape, mode))
    mask = layout.pext_masks if items.delta else layout.field_mask
    sampled_scan(items.index, items.values, items.start, items.end, items.base, items.prev,
                 layout.field_shift, mask, items.delta, mode, key_strides(layout.shape, mode),
                 not exact_keys(layout.shape, mode), table.slot_key, table.slot_id, table.shift,
                 np.ascontiguousarray(coords, dtype=np.int64), Hw, out.reshape(-1), out_lo)
