"""FastTucker completion results: in memory (``FastTuckerResult``), in a Zarr result store, npz."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import TfoocError
from ..common.result_store import read_result_store, write_result_store

FASTTUCKER_FORMAT = "fasttucker-result"
FASTTUCKER_VERSION = 1


class CompletionError(TfoocError, ValueError):
    """Bad input to tensor completion (ranks, learning rates, test set, coordinates)."""


@dataclass
class FastTuckerResult:
    """A FastTucker model: ``x[i_1..i_N] ~ sum_r prod_n (A^(n) B^(n))[i_n, r]``.

    The Tucker core is the Kruskal tensor of the core factors ``B^(n)`` (J_n x R), the factors are
    ``A^(n)`` (I_n x J_n).

    Attributes
    ----------
    factors : list of (I_n, J_n) arrays
    core_factors : list of (J_n, R) arrays
    test_rmse, test_mae : float    on the test set, at the kept epoch (nan without a test set)
    epochs : int                   epochs run
    best_epoch : int               the epoch whose model is kept (lowest test RMSE)
    history : list of dict         per epoch: test/train RMSE, test MAE, seconds of each pass
    params : dict                  ranks, learning rates, regularization, batch, seed, ...
    input : dict                   fingerprint of the training store
    """

    factors: list[np.ndarray]
    core_factors: list[np.ndarray]
    test_rmse: float
    test_mae: float
    epochs: int
    best_epoch: int
    history: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    input: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(f.shape[1] for f in self.factors)

    @property
    def core_rank(self) -> int:
        return int(self.core_factors[0].shape[1])

    def factor_frame(self, mode: int | str, labels=None):
        """Mode ``mode`` (its number or name)'s factor ``A^(n)`` as a pandas DataFrame indexed by
        the mode's keys (a store converted from a table), one column per column (``c0`` ..)."""
        from ..common.labelled_factors import factor_frame

        return factor_frame(self, mode, labels)

    def top_keys(self, mode: int | str, k: int = 10, labels=None):
        """The ``k`` keys of mode ``mode`` with the largest entries in each column of ``A^(n)``."""
        from ..common.labelled_factors import top_keys

        return top_keys(self, mode, k, labels)

    def predict(self, coords: Any, unknown: str = "error", labels=None) -> Any:
        """Predicted values at ``coords`` ((n, N) 0-based integer coordinates), or at rows of keys
        (a DataFrame or mapping with a column per mode name of a table's store: a DataFrame of the
        keys and ``prediction``; unknown keys an error naming them, or skipped with
        ``unknown="skip"``).

        Examples
        --------
        >>> r.predict(np.array([[0, 1, 2], [3, 4, 5]]))   # doctest: +SKIP
        array([ 0.31, -1.02])
        """
        if not isinstance(coords, (np.ndarray, list, tuple)):
            from ..common.labelled_factors import predict_keys

            return predict_keys(self, coords, unknown, labels)
        c = np.asarray(coords)
        N = len(self.factors)
        if c.ndim != 2 or c.shape[1] != N:
            raise CompletionError(f"coords must be an (n, {N}) array, got shape {c.shape}")
        if c.size and not np.issubdtype(c.dtype, np.integer):
            if not np.all(np.isfinite(c)) or np.any(c != np.round(c)):
                raise CompletionError("coords must be integers")
            c = c.astype(np.int64)
        c = c.astype(np.int64, copy=False)
        for n, L in enumerate(self.shape):
            if c.shape[0] and (c[:, n].min() < 0 or c[:, n].max() >= L):
                bad = int(np.flatnonzero((c[:, n] < 0) | (c[:, n] >= L))[0])
                raise CompletionError(f"coords row {bad}: index {int(c[bad, n])} of mode {n} is outside 0..{L - 1}")
        out = np.ones((c.shape[0], self.core_rank))
        for n, (A, B) in enumerate(zip(self.factors, self.core_factors)):
            out *= (A @ B)[c[:, n]]
        return out.sum(axis=1)

    def core(self) -> np.ndarray:
        """The dense Tucker core ``sum_r b^(1)_r o ... o b^(N)_r`` (J_1 x ... x J_N)."""
        letters = "abcdefgh"[: len(self.factors)]
        return np.einsum(",".join(f"{c}r" for c in letters) + "->" + letters, *self.core_factors)

    def full(self) -> np.ndarray:
        """The dense model (small shapes only)."""
        letters = "abcdefgh"[: len(self.factors)]
        C = [A @ B for A, B in zip(self.factors, self.core_factors)]
        return np.einsum(",".join(f"{c}r" for c in letters) + "->" + letters, *C)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """``{"factor0": ..., "core_factor0": ..., ...}``."""
        out = {f"factor{n}": f for n, f in enumerate(self.factors)}
        out.update({f"core_factor{n}": b for n, b in enumerate(self.core_factors)})
        return out

    def save_npz(self, path: str | os.PathLike) -> None:
        np.savez(
            path, **self.to_numpy(), history=json.dumps(self.history), test_rmse=self.test_rmse, test_mae=self.test_mae
        )

    def to_tensorly(self):
        """A ``tensorly.tucker_tensor.TuckerTensor`` (the dense core of the Kruskal core)."""
        from tensorly.tucker_tensor import TuckerTensor

        return TuckerTensor((self.core(), [np.array(f) for f in self.factors]))

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> str:
        """Write a Zarr result store (atomically for local paths). Returns its path."""
        return write_result_store(
            path,
            self.to_numpy(),
            {
                "format": FASTTUCKER_FORMAT,
                "format_version": FASTTUCKER_VERSION,
                "test_rmse": _json_float(self.test_rmse),
                "test_mae": _json_float(self.test_mae),
                "epochs": int(self.epochs),
                "best_epoch": int(self.best_epoch),
                "history": self.history,
                "params": self.params,
                "input": self.input,
                "nmodes": len(self.factors),
            },
            overwrite,
        )


def _json_float(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def load_fasttucker_result(path: str | os.PathLike) -> FastTuckerResult:
    """Read a result store written by :meth:`FastTuckerResult.save`."""
    root, meta = read_result_store(path, FASTTUCKER_FORMAT, "FastTucker")
    n = int(meta["nmodes"])
    nan = float("nan")
    return FastTuckerResult(
        [root[f"factor{i}"][...] for i in range(n)],
        [root[f"core_factor{i}"][...] for i in range(n)],
        nan if meta["test_rmse"] is None else meta["test_rmse"],
        nan if meta["test_mae"] is None else meta["test_mae"],
        meta["epochs"],
        meta["best_epoch"],
        meta["history"],
        meta["params"],
        meta["input"],
    )
