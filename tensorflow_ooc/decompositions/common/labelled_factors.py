"""Results with the labels of a table's keys: factor rows keyed by the mode's keys, the top keys of
each component, predictions at keys, Parquet exports with the keys.

A result records its input store's label fingerprint (names, and per mode the key count and a
digest of the keys, :meth:`~tensorflow_ooc.store.labels.StoreLabels.fingerprint`). The keys are
read from that store, or from another one given as ``labels`` (a later version of an appended
store: its dictionaries start with the same keys, which the digest of their first rows checks).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...errors import StoreError

if TYPE_CHECKING:
    import pandas as pd

    from ...store import Store

UNKNOWN_POLICIES = ("error", "skip")


def _labels_store(result: Any, labels: str | os.PathLike | Store | None) -> Store:
    from ...store import Store, open_store

    recorded = (result.input or {}).get("labels")
    if not recorded:
        raise StoreError(
            "this result's input store has no label dictionaries (it was converted from coordinates, not a "
            "table with named key columns)"
        )
    if isinstance(labels, Store):
        return labels
    where = labels if labels is not None else (result.input or {}).get("path")
    try:
        return open_store(where)
    except StoreError as exc:
        raise StoreError(f"{exc}; pass labels=STORE: the input store, or a later version appended to it") from None


def mode_names(result: Any) -> list[str]:
    """The mode names recorded with the result (its input table's key columns)."""
    recorded = (result.input or {}).get("labels") or {}
    return list(recorded.get("names") or [])


def mode_number(result: Any, mode: int | str) -> int:
    names = mode_names(result)
    if isinstance(mode, str):
        if mode not in names:
            raise KeyError(f"no mode named {mode!r}; the modes are {names}")
        return names.index(mode)
    if not 0 <= int(mode) < len(result.factors):
        raise KeyError(f"mode {mode} out of range: the model has {len(result.factors)} modes")
    return int(mode)


def mode_keys(result: Any, mode: int | str, labels: str | os.PathLike | Store | None = None) -> Any:
    """The keys of mode ``mode``'s factor rows (a pyarrow Array), checked against the digest the
    result recorded."""
    from ...store.labels import keys_digest

    m = mode_number(result, mode)
    store = _labels_store(result, labels)
    if store.labels is None:
        raise StoreError(f"{store.path}: no label dictionaries")
    want = result.input["labels"]["modes"][m]
    rows = int(result.factors[m].shape[0])
    have = store.labels.modes[m]
    if have.count < rows or want["count"] != rows:
        raise StoreError(
            f"{store.path}: mode {m} has {have.count:,} keys, the result {rows:,} rows: not the labels it was "
            "computed with"
        )
    keys = store.labels.keys(m)
    if not (have.count == rows and have.digest == want["digest"]):
        keys = keys.slice(0, rows)
        if keys_digest(keys) != want["digest"]:
            raise StoreError(
                f"{store.path}: the first {rows:,} keys of mode {m} are not those the result was computed with "
                "(another table, or renumbered)"
            )
    return keys


def component_names(rank: int) -> list[str]:
    return [f"c{r}" for r in range(rank)]


def factor_frame(result: Any, mode: int | str, labels: str | os.PathLike | Store | None = None) -> pd.DataFrame:
    """Mode ``mode``'s factor as a pandas DataFrame: one row per key (the index, named after the
    mode), one column per component (``c0``, ``c1``, ...)."""
    import pandas as pd

    m = mode_number(result, mode)
    keys = mode_keys(result, m, labels)
    names = mode_names(result)
    index = pd.Index(keys.to_pandas(), name=names[m] if names else f"mode{m}")
    factor = np.asarray(result.factors[m])  # CP: R columns; Tucker: the mode's rank J_m
    return pd.DataFrame(factor, index=index, columns=component_names(factor.shape[1]))


def top_keys(
    result: Any, mode: int | str, k: int = 10, labels: str | os.PathLike | Store | None = None
) -> pd.DataFrame:
    """The ``k`` keys with the largest entries of each component of mode ``mode``: columns
    ``component``, ``rank`` (0 = largest), the key (named after the mode) and ``value``."""
    import pandas as pd

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    frame = factor_frame(result, mode, labels)
    rows = []
    for r, col in enumerate(frame.columns):
        top = frame[col].nlargest(k)
        rows.append(
            pd.DataFrame(
                {"component": r, "rank": np.arange(len(top)), frame.index.name: top.index, "value": top.to_numpy()}
            )
        )
    return pd.concat(rows, ignore_index=True)


def key_coordinates(
    result: Any,
    keys: Any,
    unknown: str = "error",
    labels: str | os.PathLike | Store | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """0-based coordinates of rows of keys (a DataFrame or a mapping with a column per mode
    name) and which rows were kept: with ``unknown="error"`` a key outside a mode's dictionary is
    an error naming the unknown keys, with ``"skip"`` its row is left out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if unknown not in UNKNOWN_POLICIES:
        raise ValueError(f"unknown must be one of {UNKNOWN_POLICIES}, got {unknown!r}")
    names = mode_names(result)
    columns = {c: keys[c] for c in names if c in keys}
    missing = [c for c in names if c not in columns]
    if missing:
        raise KeyError(f"no column {', '.join(map(repr, missing))} in the keys; the modes are {names}")
    n = len(next(iter(columns.values()))) if columns else 0
    coords = np.empty((n, len(names)), dtype=np.int64)
    kept = np.ones(n, dtype=bool)
    for m, c in enumerate(names):
        dictionary = mode_keys(result, m, labels)
        values = pa.array(columns[c], from_pandas=True)
        if values.type != dictionary.type:
            try:
                values = values.cast(dictionary.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ValueError(f"column {c!r} holds {values.type}, the mode's keys are {dictionary.type}") from None
        idx = pc.index_in(values, value_set=dictionary)
        found = idx.is_valid().to_numpy(zero_copy_only=False)
        if not found.all():
            if unknown == "error":
                bad = pc.unique(values.filter(pa.array(~found))).to_pylist()
                shown = ", ".join(map(repr, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
                raise KeyError(
                    f"mode {c!r}: {len(bad)} key(s) the model does not know: {shown} (pass unknown='skip' to leave "
                    "their rows out)"
                )
            kept &= found
        coords[:, m] = idx.fill_null(0).to_numpy(zero_copy_only=False)
    return coords[kept], kept


def predict_keys(
    result: Any,
    keys: Any,
    unknown: str = "error",
    labels: str | os.PathLike | Store | None = None,
) -> pd.DataFrame:
    """The CP model's values at rows of keys: the key columns (rows with unknown keys left out
    under ``unknown="skip"``) and ``prediction``."""
    import pandas as pd

    coords, kept = key_coordinates(result, keys, unknown, labels)
    frame = pd.DataFrame({c: np.asarray(keys[c])[kept] for c in mode_names(result)})
    if hasattr(result, "core_factors"):  # FastTucker: its own predict at coordinates
        frame["prediction"] = result.predict(coords)
    elif hasattr(result, "core"):
        frame["prediction"] = tucker_values(result.core, result.factors, coords)
    else:
        frame["prediction"] = cp_values(result.weights, result.factors, coords)
    return frame


def tucker_values(core: np.ndarray, factors: Sequence[np.ndarray], coords: np.ndarray) -> np.ndarray:
    """The Tucker model ``core x_1 U_1 ... x_N U_N`` at each row of ``coords``."""
    out = np.broadcast_to(np.asarray(core, dtype=np.float64), (coords.shape[0], *np.shape(core))).copy()
    for n in reversed(range(len(factors))):  # contract the last mode first: out[p, j_1..j_n]
        out = np.einsum("p...j,pj->p...", out, np.asarray(factors[n])[coords[:, n]])
    return out


def cp_values(weights: np.ndarray, factors: Sequence[np.ndarray], coords: np.ndarray) -> np.ndarray:
    """``sum_r w_r prod_n A_n[i_n, r]`` at each row of ``coords``."""
    prod = np.broadcast_to(np.asarray(weights, dtype=np.float64), (coords.shape[0], len(weights))).copy()
    for n, f in enumerate(factors):
        prod *= np.asarray(f)[coords[:, n]]
    return prod.sum(axis=1)


def export_parquet(
    result: Any, folder: str | os.PathLike, labels: str | os.PathLike | Store | None = None
) -> list[str]:
    """Write the model as Parquet files in ``folder``: one per mode (``NAME.parquet``: the key
    column, named after the mode, then ``c0``, ``c1``, ...) and ``weights.parquet``
    (``component``, ``weight``). Returns the files written."""
    import fsspec
    import pandas as pd

    folder = str(folder).rstrip("/")
    fs, root = fsspec.core.url_to_fs(folder)
    fs.makedirs(root, exist_ok=True)
    written = []
    names = mode_names(result)
    for m in range(len(result.factors)):
        frame = factor_frame(result, m, labels).reset_index()
        path = f"{folder}/{names[m]}.parquet"
        with fs.open(f"{root}/{names[m]}.parquet", "wb") as f:
            frame.to_parquet(f, index=False)
        written.append(path)
    if hasattr(result, "weights"):
        w = pd.DataFrame({"component": np.arange(result.rank), "weight": np.asarray(result.weights)})
        with fs.open(f"{root}/weights.parquet", "wb") as f:
            w.to_parquet(f, index=False)
        written.append(f"{folder}/weights.parquet")
    return written
