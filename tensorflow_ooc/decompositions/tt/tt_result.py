"""Tensor-train results: in memory (``TTResult``), in a Zarr result store, exported to npz and TensorLy."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..common.result_store import read_result_store, write_result_store

RESULT_FORMAT = "tt-result"
RESULT_VERSION = 1


@dataclass
class TTResult:
    """A tensor train ``T[i_0, ..., i_{N-1}] = core_0[:, i_0, :] @ ... @ core_{N-1}[:, i_{N-1}, :]``.

    Attributes
    ----------
    cores : list of (R_{k-1}, I_k, R_k) float64 arrays, ``R_0 = R_N = 1`` (TensorLy's convention);
            cores 1 .. N-1 are right-orthonormal, core 0 carries the norm
    fit : float             1 - ||X - T|| / ||X||
    sweeps : int            sweeps run (including any before a resume)
    history : list of dict  per sweep: ``sweep``, ``fit``, ``fit_change`` (absolute),
                            ``fit_change_relative`` (what ``tol`` bounds; None without a fit
                            before), ``fit_evaluated`` (False: a randomized sweep whose fit was
                            not evaluated, recorded without the three before), ``seconds``, and
                            per core update its mode, contraction and update seconds
    params : dict           ranks, method, tolerance, seed, init, execution, ...
    input : dict            fingerprint of the input store
    """

    cores: list[np.ndarray]
    fit: float
    sweeps: int
    history: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    input: dict = field(default_factory=dict)

    @property
    def ranks(self) -> tuple[int, ...]:
        """``(R_0, R_1, ..., R_N)``, as TensorLy's ``TTTensor.rank``."""
        return (int(self.cores[0].shape[0]),) + tuple(int(c.shape[2]) for c in self.cores)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(c.shape[1]) for c in self.cores)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """``{"core0": ..., "core1": ..., ...}``."""
        return {f"core{k}": c for k, c in enumerate(self.cores)}

    def save_npz(self, path: str | os.PathLike) -> None:
        """The cores, fit, sweeps, history and params in one ``.npz`` (:meth:`load` reads it back)."""
        np.savez(
            path,
            **self.to_numpy(),
            fit=self.fit,
            sweeps=self.sweeps,
            history=json.dumps(self.history),
            params=json.dumps(self.params),
            input=json.dumps(self.input),
        )

    def to_tensorly(self):
        """A ``tensorly.tt_tensor.TTTensor``."""
        from tensorly.tt_tensor import TTTensor

        return TTTensor([np.array(c) for c in self.cores])

    def to_dense(self) -> np.ndarray:
        """The dense tensor (small tensors only)."""
        out = self.cores[0]
        for c in self.cores[1:]:
            out = np.tensordot(out, c, axes=(-1, 0))
        return out.reshape(self.shape)

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> str:
        """Write a Zarr result store (atomically for local paths). Returns its path."""
        return write_result_store(
            path,
            self.to_numpy(),
            {
                "format": RESULT_FORMAT,
                "format_version": RESULT_VERSION,
                "fit": float(self.fit),
                "sweeps": int(self.sweeps),
                "history": self.history,
                "params": self.params,
                "input": self.input,
            },
            overwrite,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TTResult":
        """Read a result written by :meth:`save` (a Zarr result store) or :meth:`save_npz` (``.npz``)."""
        if str(path).endswith(".npz"):
            with np.load(path) as z:
                cores = [z[f"core{k}"] for k in range(sum(1 for f in z.files if f.startswith("core")))]
                return cls(
                    cores,
                    float(z["fit"]),
                    int(z["sweeps"]),
                    json.loads(str(z["history"])),
                    json.loads(str(z["params"])),
                    json.loads(str(z["input"])),
                )
        return load_tt(path)


def load_tt(path: str | os.PathLike) -> TTResult:
    """Read a result store written by :meth:`TTResult.save`."""
    root, meta = read_result_store(path, RESULT_FORMAT, "tensor-train")
    n = sum(1 for k in root.array_keys() if k.startswith("core"))
    cores = [root[f"core{k}"][...] for k in range(n)]
    return TTResult(cores, meta["fit"], meta["sweeps"], meta["history"], meta["params"], meta["input"])
