"""The identity of an input store that results and checkpoints record, so they refuse to mix stores."""

from __future__ import annotations

from ...store import Store


def fingerprint(store: Store) -> dict:
    """Identity of the input store: results and checkpoints refuse to mix stores."""
    fp = {
        "store_id": store.meta["store_id"],
        "path": store.path,
        "shape": list(store.shape),
        "nnz": store.nnz,
        "norm_sq": float(store.meta["norm_sq"]),
    }
    labels = getattr(store, "labels", None)
    if labels is not None:
        fp["labels"] = labels.fingerprint()  # results label their factors with the store's keys
    return fp
