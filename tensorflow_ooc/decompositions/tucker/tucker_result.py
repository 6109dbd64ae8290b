"""Tucker results: in memory (``TuckerResult``), in a Zarr result store, exported to npz, pyttb, TensorLy."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..common.result_store import read_result_store, write_result_store

RESULT_FORMAT = "tucker-result"
RESULT_VERSION = 1


@dataclass
class TuckerResult:
    """A Tucker model ``core x_1 U_1 x_2 U_2 ... x_N U_N``.

    Attributes
    ----------
    core : (J_1, ..., J_N) array
    factors : list of (I_n, J_n) arrays with orthonormal columns
    fit : float             1 - ||X - model|| / ||X||
    iterations : int        iterations run (including any before a resume)
    history : list of dict  per iteration: fit, fit change, seconds, TTM and SVD seconds per mode
    params : dict           ranks, tolerance, seed, init, execution, ...
    input : dict            fingerprint of the input store
    """

    core: np.ndarray
    factors: list[np.ndarray]
    fit: float
    iterations: int
    history: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    input: dict = field(default_factory=dict)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(int(j) for j in self.core.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(f.shape[0]) for f in self.factors)

    # --- labels: a store converted from a table (tfo.convert(..., modes=[...])) ---------------------

    def factor_frame(self, mode: int | str, labels=None):
        """Mode ``mode`` (its number or name)'s factor as a pandas DataFrame indexed by the mode's
        keys, one column per column of the factor (``c0`` .. ``c{J_n - 1}``); ``labels``: the store
        to read the keys from (default the input store, or a later version appended to it)."""
        from ..common.labelled_factors import factor_frame

        return factor_frame(self, mode, labels)

    def top_keys(self, mode: int | str, k: int = 10, labels=None):
        """The ``k`` keys of mode ``mode`` with the largest entries in each column of its factor."""
        from ..common.labelled_factors import top_keys

        return top_keys(self, mode, k, labels)

    def predict(self, keys, unknown: str = "error", labels=None):
        """The model's values at rows of keys (a DataFrame or mapping with a column per mode name;
        unknown keys an error naming them, or skipped with ``unknown="skip"``), or at an integer
        array (n, nmodes) of 0-based coordinates (then an array)."""
        from ..common.labelled_factors import predict_keys, tucker_values

        if isinstance(keys, np.ndarray):
            return tucker_values(self.core, self.factors, np.asarray(keys, dtype=np.int64))
        return predict_keys(self, keys, unknown, labels)

    def to_parquet(self, folder: str | os.PathLike, labels=None) -> list[str]:
        """The factors as Parquet files with the keys (``NAME.parquet`` per mode); returns them."""
        from ..common.labelled_factors import export_parquet

        return export_parquet(self, folder, labels)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """``{"core": ..., "factor0": ..., ...}``."""
        out = {"core": self.core}
        out.update({f"factor{n}": f for n, f in enumerate(self.factors)})
        return out

    def save_npz(self, path: str | os.PathLike) -> None:
        np.savez(path, **self.to_numpy(), history=json.dumps(self.history), fit=self.fit)

    def to_pyttb(self):
        """A ``pyttb.ttensor``."""
        import pyttb

        return pyttb.ttensor(pyttb.tensor(np.array(self.core)), [np.array(f) for f in self.factors])

    def to_tensorly(self):
        """A ``tensorly.tucker_tensor.TuckerTensor`` (the ``(core, factors)`` pair)."""
        from tensorly.tucker_tensor import TuckerTensor

        return TuckerTensor((np.array(self.core), [np.array(f) for f in self.factors]))

    def full(self) -> np.ndarray:
        """The dense model (small tensors only)."""
        out = np.asarray(self.core)
        for n, U in enumerate(self.factors):
            out = np.moveaxis(np.tensordot(U, out, axes=(1, n)), 0, n)
        return out

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> str:
        """Write a Zarr result store (atomically for local paths). Returns its path."""
        return write_result_store(
            path,
            self.to_numpy(),
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


def load_tucker(path: str | os.PathLike) -> TuckerResult:
    """Read a result store written by :meth:`TuckerResult.save`."""
    root, meta = read_result_store(path, RESULT_FORMAT, "Tucker")
    core = root["core"][...]
    factors = [root[f"factor{n}"][...] for n in range(core.ndim)]
    return TuckerResult(core, factors, meta["fit"], meta["iterations"], meta["history"], meta["params"], meta["input"])
