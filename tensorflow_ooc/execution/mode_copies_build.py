"""Writing a store's mode-sorted copies (:mod:`tensorflow_ooc.store.mode_copies`): each chunk
read and validated as streaming reads it, each work item sorted by each mode as the in-memory
copies are (:func:`~tensorflow_ooc.kernels.mttkrp.mode_order.mode_sorted`), written chunk by chunk
(memory: one chunk and its sorted copy)."""

from __future__ import annotations

import os
from typing import Sequence

from ..ingest import rewrite as ingest_rewrite
from ..kernels.mttkrp.mode_order import mode_sorted
from ..kernels.mttkrp.plan import ITEM_NNZ
from ..store import Store, open_store
from ..store.mode_copies import ModeCopiesWriter, drop_mode_copies
from .sorted_stream import STREAMED_RUN_MIN
from .stream import BatchBuffers, fill_batch


def build_mode_copies(
    store: Store | str, modes: str | Sequence[int] = "auto", run_min: float = STREAMED_RUN_MIN
) -> Store:
    """Write the mode-sorted copies of ``modes`` into ``store`` (replacing any it has); the store
    reopened. ``"auto"``: every mode whose sorted runs average at least ``run_min`` nonzeros (the
    others are written and dropped: a mode as long as the items gains nothing); ``"all"``: every
    mode. Costs 16 bytes a nonzero a mode on disk (docs/FORMAT.md, "Mode-sorted copies")."""
    store = store if isinstance(store, Store) else open_store(store)
    auto = modes == "auto"
    todo = list(range(store.nmodes)) if modes in ("auto", "all") else sorted({int(m) for m in modes})
    for m in todo:
        if not 0 <= m < store.nmodes:
            raise ValueError(f"mode {m} out of range for an order-{store.nmodes} store")
    writer = ModeCopiesWriter(store, todo, ITEM_NNZ)
    try:
        bufs = BatchBuffers(store, 1)
        for c in range(store.nchunks):
            # re-encoded (not Delta) and validated as every streamed chunk's first read is
            items = fill_batch(store, range(c, c + 1), bufs, delta=False)
            for m in todo:
                sorted_items = mode_sorted(items, store.layout, m, run_min=0)
                if sorted_items is None:  # a chunk without items: stored as it is
                    writer.write(c, m, items.index, items.values, 0)
                else:
                    writer.write(c, m, sorted_items.index, sorted_items.values, int(sorted_items.changes[:, m].sum()))
        keep = [m for m in todo if store.nnz >= run_min * max(1, writer.runs[m])] if auto else todo
    except BaseException:
        writer.abort()
        raise
    if not keep:
        writer.abort()
        drop_mode_copies(store)
    else:
        writer.finish(keep)
    return open_store(store.path)


def rewrite(
    source: str | os.PathLike | Store,
    store: str | os.PathLike,
    *,
    mode_copies: str | Sequence[int] | None = None,
    **kwargs,
) -> Store:
    """:func:`tensorflow_ooc.ingest.rewrite` (the public ``tfo.rewrite``; keywords as there), and
    the new store's mode-sorted copies: by default of the modes the source keeps copies of (its
    own are bound to it), ``[]`` for none, or as :func:`build_mode_copies` takes them."""
    src = source if isinstance(source, Store) else open_store(source)
    modes = src.copy_modes() if mode_copies is None else mode_copies
    out = ingest_rewrite(src, store, **kwargs)
    return build_mode_copies(out, modes) if modes else out
