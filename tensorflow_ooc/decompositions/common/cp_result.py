"""CP results (``CPResult``): a rank-R model in memory, in a Zarr result store, and exported to npz,
pyttb, TensorLy; CP-ALS writes them, and CP-APR's ``PoissonResult`` extends them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from .result_store import write_result_store

RESULT_FORMAT = "cp-result"


RESULT_VERSION = 1


@dataclass
class CPResult:
    """A rank-R CP model ``sum_r weights[r] * a_1[:, r] o ... o a_N[:, r]``.

    Attributes
    ----------
    weights : (R,) array
    factors : list of (I_n, R) arrays, unit 2-norm columns, components sorted by weight
    fit : float             1 - ||X - model|| / ||X||
    iterations : int        iterations run (including any before a resume)
    history : list of dict  per iteration: fit, fit change, seconds, seconds per mode
    params : dict           rank, tolerance, seed, dtype, execution mode, ...
    input : dict            fingerprint of the input store
    """

    weights: np.ndarray
    factors: list[np.ndarray]
    fit: float
    iterations: int
    history: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    input: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.weights.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """``{"weights": ..., "factor0": ..., ...}``."""
        out = {"weights": self.weights}
        out.update({f"factor{n}": f for n, f in enumerate(self.factors)})
        return out

    def save_npz(self, path: str | os.PathLike) -> None:
        np.savez(path, **self.to_numpy(), history=json.dumps(self.history), fit=self.fit)

    def to_pyttb(self):
        """A ``pyttb.ktensor``."""
        import pyttb

        return pyttb.ktensor([np.array(f) for f in self.factors], np.array(self.weights))

    def to_tensorly(self):
        """A ``tensorly.cp_tensor.CPTensor``."""
        from tensorly.cp_tensor import CPTensor

        return CPTensor((np.array(self.weights), [np.array(f) for f in self.factors]))

    # --- labels: a store converted from a table (tfo.convert(..., modes=[...])) ---------------------

    def factor_frame(self, mode: int | str, labels=None):
        """Mode ``mode`` (its number or name)'s factor as a pandas DataFrame indexed by the mode's
        keys (the table's values, in index order), one column per component: ``c0``, ``c1``, ...

        ``labels``: the store to read the keys from (default: the input store; a later version
        appended to it also serves, its first keys being the same)."""
        from .labelled_factors import factor_frame

        return factor_frame(self, mode, labels)

    def top_keys(self, mode: int | str, k: int = 10, labels=None):
        """The ``k`` keys of mode ``mode`` with the largest entries in each component, as a
        DataFrame (``component``, ``rank``, the key, ``value``)."""
        from .labelled_factors import top_keys

        return top_keys(self, mode, k, labels)

    def predict(self, keys, unknown: str = "error", labels=None):
        """The model's values at rows of keys (a DataFrame or mapping with a column per mode
        name): a DataFrame of the keys and ``prediction``. Unknown keys are an error naming them,
        or with ``unknown="skip"`` their rows are left out. An integer array (n, nmodes) of 0-based
        coordinates gives the values as an array."""
        from .labelled_factors import cp_values, predict_keys

        if isinstance(keys, np.ndarray):
            return cp_values(self.weights, self.factors, np.asarray(keys, dtype=np.int64))
        return predict_keys(self, keys, unknown, labels)

    def to_parquet(self, folder: str | os.PathLike, labels=None) -> list[str]:
        """The model as Parquet files with the keys: ``NAME.parquet`` per mode (key column, then
        ``c0``, ``c1``, ...) and ``weights.parquet``. Returns the files written."""
        from .labelled_factors import export_parquet

        return export_parquet(self, folder, labels)

    def full(self) -> np.ndarray:
        """The dense model (small tensors only)."""
        letters = "abcdefgh"[: len(self.factors)]
        spec = ",".join(f"{c}r" for c in letters) + ",r->" + letters
        return np.einsum(spec, *self.factors, self.weights)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> str:
        """Write a Zarr result store (atomically for local paths). Returns its path."""
        arrays = {"weights": np.asarray(self.weights), **{f"factor{n}": f for n, f in enumerate(self.factors)}}
        return write_result_store(
            path,
            arrays,
            {
                "format": RESULT_FORMAT,
                "format_version": RESULT_VERSION,
                "fit": float(self.fit),
                "iterations": int(self.iterations),
                "history": self.history,
                "params": self.params,
                "input": self.input,
            },
            overwrite,
        )


def arrange(weights: np.ndarray, factors: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Unit 2-norm columns (norms moved into the weights), components sorted by weight, as
    Tensor Toolbox's ``arrange``."""
    w = np.array(weights, dtype=np.float64, copy=True)
    out = []
    for f in factors:
        norms = np.sqrt((f * f).sum(axis=0))
        w = w * norms
        out.append(f / np.where(norms == 0, 1, norms))
    order = np.argsort(-w, kind="stable")
    return w[order], [f[:, order] for f in out]
