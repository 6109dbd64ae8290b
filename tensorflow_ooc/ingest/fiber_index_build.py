"""Build a store's fiber index out of core: per mode, the nonzeros sorted by fiber key in passes
that each hold one range of keys (``tfooc fiber-index``, ``convert --fiber-index``).

A first pass counts the keys per range of their top bits; the ranges are then grouped into
buckets of at most the memory budget's entries, and each bucket is one pass over the store that
keeps the entries whose key falls in it, sorts them stably (each fiber in store order) and
appends them to the mode's index. Memory: about 112 bytes an entry of the largest bucket (its
keys, rows, values and the sort's scratch), whatever the store's size.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterable, Sequence

import numba as nb
import numpy as np
import psutil

from ..format.fiber_keys import exact_keys, key_strides
from ..format.radix_sort import stable_key_order
from ..store import Store, open_store
from ..store.chunk_cache import parse_bytes
from ..store.fiber_index import DEFAULT_FIBER_CHUNK_NNZ, FiberIndex, ModeIndexWriter, open_fiber_index, publish_modes
from ..store.output_lock import OutputLock
from .memory import limit_heap_growth, trim

log = logging.getLogger(__name__)

#: bytes an entry of a bucket costs while it is sorted: keys, rows and values as read and concatenated,
#: the sort's joined words, positions and scratch, the reordered copies (a 500 M build at 64 held
#: 11.3 GB under a 10 GB limit)
ENTRY_BYTES = 112
_HIST_BITS = 16


def parse_modes(modes: str | int | Iterable[int] | None, nmodes: int) -> list[int]:
    """``"all"`` / None: every mode; else mode numbers (0-based; ints or a comma list), checked."""
    if modes is None or (isinstance(modes, str) and modes.strip().lower() == "all"):
        return list(range(nmodes))
    if isinstance(modes, str):
        try:
            items = [int(x) for x in modes.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"fiber index modes must be 'all' or mode numbers like 0,2; got {modes!r}") from None
    elif isinstance(modes, int):
        items = [modes]
    else:
        items = [int(x) for x in modes]
    if not items:
        raise ValueError("fiber index modes: none given (use 'all' or mode numbers like 0,2)")
    bad = [m for m in items if not 0 <= m < nmodes]
    if bad:
        raise ValueError(f"fiber index modes {bad} are not modes of an order-{nmodes} tensor (0..{nmodes - 1})")
    return sorted(set(items))


@nb.njit(parallel=True, nogil=True, cache=True)
def _keys_rows(coords, mode, strides, keys, rows):
    for i in nb.prange(coords.shape[0]):
        k = np.uint64(0)
        for m in range(coords.shape[1]):
            if m == mode:
                rows[i] = coords[i, m]
            else:
                k += np.uint64(coords[i, m]) * strides[m]
        keys[i] = k


def _entries(store: Store, mode: int) -> Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per store chunk, in store order: the fiber keys, mode-``mode`` rows and values."""
    strides = key_strides(store.shape, mode)
    for c in range(store.nchunks):
        ch = store.read_chunk(c)
        coords = ch.coords(store.layout)
        keys = np.empty(coords.shape[0], dtype=np.uint64)
        rows = np.empty(coords.shape[0], dtype=np.int64)
        _keys_rows(coords, mode, strides, keys, rows)
        yield keys, rows, ch.values


def _buckets(store: Store, mode: int, max_entries: int) -> list[tuple[int, int]]:
    """Key ranges ``[lo, hi)`` in order, each of at most ``max_entries`` entries where one range
    of the histogram allows (a single heavier range is one bucket of its own)."""
    key_space = int(np.prod([s for m, s in enumerate(store.shape) if m != mode], dtype=object))
    if store.nnz <= max_entries:
        return [(0, key_space)]
    shift = max(0, (key_space - 1).bit_length() - _HIST_BITS)
    hist = np.zeros((key_space - 1 >> shift) + 1, dtype=np.int64)
    for keys, _, _ in _entries(store, mode):
        hist += np.bincount((keys >> np.uint64(shift)).astype(np.int64), minlength=hist.shape[0])
    out, lo, n = [], 0, 0
    for b, count in enumerate(hist.tolist()):
        if n and n + count > max_entries:
            out.append((lo, b << shift))
            lo, n = b << shift, 0
        n += count
    out.append((lo, key_space))
    return out


def _bucket(store: Store, mode: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entries with key in ``[lo, hi)``, sorted by key (stably: each fiber in store order)."""
    ks, rs, vs = [], [], []
    whole = lo == 0 and hi >= int(np.prod([s for m, s in enumerate(store.shape) if m != mode], dtype=object))
    for keys, rows, values in _entries(store, mode):
        if not whole:
            keep = (keys >= np.uint64(lo)) & (keys < np.uint64(hi))
            keys, rows, values = keys[keep], rows[keep], values[keep]
        ks.append(keys)
        rs.append(rows)
        vs.append(values)
    keys = np.concatenate(ks) if ks else np.zeros(0, np.uint64)
    rows = np.concatenate(rs) if rs else np.zeros(0, np.int64)
    values = np.concatenate(vs) if vs else np.zeros(0, store.value_dtype)
    del ks, rs, vs
    order, keys = stable_key_order(keys, hi)
    return keys, rows[order], values[order]


def build_fiber_index(
    store: Store | str | os.PathLike,
    modes: str | Sequence[int] | None = "all",
    *,
    chunk_nnz: int | None = None,
    memory_limit: int | str | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> FiberIndex:
    """Write the fiber index of ``store`` for ``modes``: per mode, the nonzeros ordered by their
    fiber (their indices in the other modes), so randomized CP (STS-CP, CP-ARLS-LEV) and rTT-ALS
    read only the sampled fibers instead of every nonzero.

    Parameters
    ----------
    store : Store or path
        A BLCO store (local path or URL) this package wrote.
    modes : "all" or mode numbers
        Modes to index (0-based). A mode whose other modes span more than 2^63 cells cannot be.
    chunk_nnz : int, optional
        Entries per index chunk: the unit a sampled fiber is read in. Default: per mode about its
        fibers' mean length, 128 to 1024 (1024 where fibers average under 16 entries).
    memory_limit : int or str, optional
        Bytes the build may hold, a count or ``"4GiB"`` (default: half the memory available, as
        ``convert``): keys are sorted in ranges that fit it, one pass over the store each.
    overwrite : bool
        Replace the index of modes that have one (else they are an error).
    progress : bool
        A progress bar per mode.

    Returns
    -------
    FiberIndex
        The store's index, opened (``.modes``, ``.describe()``).

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> s = tfo.convert((np.array([[0, 1, 2], [1, 1, 2], [2, 0, 1]]), np.ones(3)), "memory://doc-fibers")
    >>> tfo.build_fiber_index(s, "all").modes
    [0, 1, 2]
    """
    src = store if isinstance(store, Store) else open_store(store)
    todo = parse_modes(modes, src.nmodes)
    wide = [m for m in todo if not exact_keys(src.shape, m)]
    if wide:
        raise ValueError(
            f"{src.path}: modes {wide} cannot be indexed: the product of the other modes' lengths exceeds 2^63"
        )
    existing = open_fiber_index(src)
    have = [m for m in todo if existing is not None and m in existing.modes]
    if have and not overwrite:
        raise FileExistsError(f"{src.path}: modes {have} already have a fiber index; pass overwrite=True to rebuild")
    # as convert: half the memory available now, unless given (each bucket is one more pass)
    budget = parse_bytes(memory_limit) if memory_limit else psutil.virtual_memory().available // 2
    max_entries = max(chunk_nnz or DEFAULT_FIBER_CHUNK_NNZ, budget // ENTRY_BYTES)
    limit_heap_growth()
    with OutputLock([f"{src.path.rstrip('/')}/fibers"], f"fiber index of {src.path}"):
        written: dict[int, tuple[ModeIndexWriter, dict]] = {}
        try:
            for m in todo:
                written[m] = _build_mode(src, m, chunk_nnz, max_entries, progress)
            publish_modes(src, written)
        except BaseException:
            for w, _ in written.values():
                w.abort()
            raise
    out = open_fiber_index(open_store(src.path))
    assert out is not None
    return out


def _build_mode(src: Store, mode: int, chunk_nnz: int | None, max_entries: int, progress: bool):
    t0 = time.perf_counter()
    w = ModeIndexWriter(src, mode, chunk_nnz)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=src.nnz, unit="nnz", unit_scale=True, desc=f"fiber index, mode {mode}")
    try:
        buckets = _buckets(src, mode, max_entries)
        for lo, hi in buckets:
            keys, rows, values = _bucket(src, mode, lo, hi)
            w.append(keys, rows, values)
            if bar is not None:
                bar.update(keys.shape[0])
            del keys, rows, values
            trim()
        meta = w.finish()
    except BaseException:
        w.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    log.info(
        "fiber index of mode %d: %s nonzeros, %d chunks, %.2f bytes a nonzero, %d pass(es) in %.1f s",
        mode,
        f"{src.nnz:,}",
        meta["nchunks"],
        meta["bytes"] / max(1, src.nnz),
        len(buckets) + (len(buckets) > 1),
        time.perf_counter() - t0,
    )
    return w, meta
