"""Rewrite a store in the current format: ``tfooc convert --rewrite OLD NEW``.

A store of an older format version (or another compression, chunking or value dtype) is read
chunk by chunk, every chunk checked as a decomposition would check it (CRC32C, position,
decoded index ranges), and its ALTO words are written again, already in order, through the
store writer: no sort, memory of about two chunks.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from ..store import StoreWriter, open_store, paths
from ..store.codecs import check_compression
from ..store.output_claim import claim_outputs
from ..store.reader import Store
from .convert import with_fiber_index

log = logging.getLogger(__name__)


def rewrite(
    source: str | os.PathLike | Store,
    store: str | os.PathLike,
    *,
    compression: str | None = None,
    index_encoding: str | None = None,
    chunk_nnz: int | None = None,
    values_dtype: str | np.dtype | None = None,
    overwrite: bool = False,
    progress: bool = False,
    fiber_index: str | list[int] | None = None,
) -> Store:
    """Write the tensor of store ``source`` as a new store at ``store`` in the current format.

    Parameters
    ----------
    source : str, PathLike or Store
        Any store this build opens (format versions 1 and 2).
    store : str or PathLike
        Destination, a local path or an fsspec URL; must differ from ``source``.
    compression, chunk_nnz, values_dtype : optional
        As for :func:`~tensorflow_ooc.convert`; default: the source's.
    index_encoding : {"delta32", "delta64"}, optional
        Default: chosen from the data, as :func:`~tensorflow_ooc.convert` does.
    overwrite : replace an existing store at ``store``
    progress : show a progress bar
    fiber_index : "all" or mode numbers, optional
        Fiber index modes of the new store (default: the modes the source's index holds, so a
        rewrite keeps it; ``[]``: none).

    Returns
    -------
    Store
        The new store, opened.

    Examples
    --------
    >>> import numpy as np, tensorflow_ooc as tfo
    >>> coords = np.array([[0, 0, 0], [1, 2, 3]])
    >>> old = tfo.convert((coords, np.array([1.0, 2.0])), "memory://doc-rewrite-old", shape=(2, 3, 4))
    >>> tfo.rewrite(old, "memory://doc-rewrite-new", compression="small").nnz
    2
    """
    src = source if isinstance(source, Store) else open_store(source)
    # the source is read while the new store is written: never the same place, never inside it
    with claim_outputs({"store": store}, {"source": src.path}, f"rewrite of {src.path}"):
        compression = check_compression(compression or src.meta.get("compression", "small"))
        chunk_nnz = int(chunk_nnz or src.chunk_nnz)
        value_dtype = np.dtype(values_dtype) if values_dtype is not None else src.value_dtype
        if value_dtype not in (np.float32, np.float64):
            raise ValueError(f"values_dtype must be float64 or float32, got {values_dtype!r}")
        attrs = dict(src.meta.get("source") or {})
        attrs["rewritten_from"] = {
            "path": src.path,
            "store_id": src.meta.get("store_id"),
            "format_version": src.meta.get("format_version"),
        }
        t0 = time.perf_counter()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=src.nnz, unit="nnz", unit_scale=True, desc="rewrite")
        with StoreWriter(
            store,
            src.layout,
            value_dtype,
            src.nnz,
            chunk_nnz=chunk_nnz,
            max_block_nnz=src.max_block_nnz,
            overwrite=overwrite,
            attrs=attrs,
            flush_chunks=1,
            compression=compression,
            index_encoding=index_encoding,
        ) as w:
            for c in range(src.nchunks):
                keys, values = src.read_alto(c)
                w.append(keys, values)
                if bar is not None:
                    bar.update(values.shape[0])
            w.commit()
        if bar is not None:
            bar.close()
        out = open_store(store)
        if out.nnz != src.nnz or abs(out.norm() - src.norm()) > 1e-9 * max(1.0, src.norm()):
            paths.remove(str(store))
            raise RuntimeError(f"{store}: the rewritten store does not hold the source's nonzeros; removed")
        modes = src.fiber_modes() if fiber_index is None else fiber_index
        if modes:  # the source's index is kept: built again for the new store's chunks
            out = with_fiber_index(out, modes, None, None, progress)
        log.info("rewrote %s -> %s (%s nonzeros) in %.2f s", src.path, store, f"{src.nnz:,}", time.perf_counter() - t0)
        return out
