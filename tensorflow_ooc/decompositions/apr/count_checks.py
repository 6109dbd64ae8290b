"""Checks of a CP-APR (Poisson CP) input: counts must be nonnegative, and are expected to be integers.

CP-APR maximizes the Poisson likelihood ``sum x log m - m``: a negative value has no likelihood
(the multiplicative update would drive factors negative and the log of the model undefined), so
it is refused, naming the first such nonzero and its coordinates. Non-integer values are
allowed (the updates and the likelihood are defined for any ``x >= 0``, e.g. rates or scaled
counts) but are often a mistake (a tensor of real-valued data fed to a count model), so the
first one is named in one warning per check: a log line (logger ``tensorflow_ooc.decompositions.apr.count_checks``),
not a Python warning, which would print with a source line. A tensor whose values are all zero
is refused: it has no events, and CP-APR's model of it would be zero everywhere (its updates
divide by the model and its log-likelihood takes the log of it).

Store metadata records no value statistics (no minimum, no integer flag: see ``store/writer.py``),
so the check reads the values: chunk by chunk through :meth:`Store.read_encoded` (values mapped
where the store keeps them uncompressed, one reused buffer otherwise; no index is decoded),
stopping at the first negative value. Coordinates are decoded for the one offending chunk only.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from ...errors import DecompositionError
from ...store import Store, open_store

log = logging.getLogger(__name__)


def check_counts(store: Store | str | os.PathLike) -> float:
    """Refuse a store with a negative value or only zeros; warn once if a value is not an integer.

    Parameters
    ----------
    store : Store or path
        The tensor CP-APR would fit (a path is opened with :func:`~tensorflow_ooc.store.open_store`).

    Returns
    -------
    float
        The sum of the values (CP-APR's total count), summed chunk by chunk in store order.

    Raises
    ------
    DecompositionError
        At the first negative value, naming its position in the store's (ALTO) order, its
        0-based coordinates and the value; or when every value is zero.

    Notes
    -----
    Logs one warning per call, at the first value that is not an integer (the scan goes on for
    negatives).
    """
    if not isinstance(store, Store):
        store = open_store(store)
    if store.nnz == 0:
        return 0.0
    total = 0.0
    alto_buf = np.empty(store.chunk_nnz, dtype=store.index_dtype)
    values_buf = np.empty(store.chunk_nnz, dtype=store.value_dtype)
    map_values = store.values_mappable
    window = store.prefetch_window()  # 0 unless the store is in object storage
    queued = 0  # chunks below this were queued for fetching already
    warned = False
    for c in range(store.nchunks):
        lo, hi = max(c, queued), min(store.nchunks, c + 1 + window)
        if window and lo < hi:
            store.prefetch(range(lo, hi))
            queued = hi
        values = store.read_encoded(c, alto_buf, values_buf, map_values).values
        total += float(np.sum(values, dtype=np.float64))
        negative = values < 0
        if negative.any():
            j = int(np.argmax(negative))
            raise DecompositionError(
                f"{store.path}: CP-APR needs nonnegative counts; nonzero {c * store.chunk_nnz + j} at "
                f"{_coords_text(store, c, j)} is {_value_text(values[j])}"
            )
        if not warned:
            fractional = values != np.floor(values)
            if fractional.any():
                j = int(np.argmax(fractional))
                log.warning(
                    "%s: CP-APR models counts, but nonzero %d at %s is %s, not an integer "
                    "(the fit goes on: the Poisson likelihood is defined for any value >= 0)",
                    store.path,
                    c * store.chunk_nnz + j,
                    _coords_text(store, c, j),
                    _value_text(values[j]),
                )
                warned = True
    if total == 0:  # nonnegative values summing to 0: every one is 0
        raise DecompositionError(
            f"{store.path}: all {store.nnz:,} values are zero: CP-APR needs positive counts "
            "(a tensor without events has no Poisson model but zero)"
        )
    return total


def _coords_text(store: Store, c: int, j: int) -> str:
    """0-based coordinates of nonzero ``j`` of chunk ``c``, as ``(3, 5, 7)``: the one chunk is
    decoded (and validated) for them."""
    chunk = store.read_chunk(c)
    coords = chunk.coords(store.layout)[j]
    return "0-based (" + ", ".join(str(int(i)) for i in coords) + ")"


def _value_text(v) -> str:
    return repr(float(v))
