"""CP results: in memory (``CPResult``, and ``PoissonResult`` for CP-APR), in a Zarr result store, and
exported to npz, pyttb, TensorLy."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..store import Store
from .result_store import read_result_store, result_format, write_result_store

if TYPE_CHECKING:
    from .fasttucker_result import FastTuckerResult
    from .tt_result import TTResult
    from .tucker_result import TuckerResult

RESULT_FORMAT = "cp-result"
RESULT_VERSION = 1


def fingerprint(store: Store) -> dict:
    """Identity of the input store: results and checkpoints refuse to mix stores."""
    return {
        "store_id": store.meta["store_id"],
        "path": store.path,
        "shape": list(store.shape),
        "nnz": store.nnz,
        "norm_sq": float(store.meta["norm_sq"]),
    }


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


def load_result(path: str | os.PathLike) -> CPResult | TuckerResult | FastTuckerResult | TTResult:
    """Read a result store: a CP result written by :meth:`CPResult.save`, or a Tucker, FastTucker
    or tensor-train result (as :func:`~tensorflow_ooc.decompositions.tucker_result.load_tucker`,
    :func:`~tensorflow_ooc.decompositions.fasttucker_result.load_fasttucker_result` and
    :func:`~tensorflow_ooc.decompositions.tt_result.load_tt` read them)."""
    root, meta = result_format(path)
    if meta["format"] == "tt-result":
        from .tt_result import load_tt

        return load_tt(path)
    if meta["format"] == "tucker-result":
        from .tucker_result import load_tucker

        return load_tucker(path)
    if meta["format"] == "fasttucker-result":
        from .fasttucker_result import load_fasttucker_result

        return load_fasttucker_result(path)
    root, meta = read_result_store(path, RESULT_FORMAT, "CP")
    n = (
        len(meta["input"]["shape"])
        if meta.get("input")
        else len([k for k in root.array_keys() if k.startswith("factor")])
    )
    factors = [root[f"factor{i}"][...] for i in range(n)]
    if (meta.get("params") or {}).get("model") == "poisson":
        last = meta["history"][-1] if meta["history"] else {}
        return PoissonResult(
            root["weights"][...],
            factors,
            meta["fit"],
            meta["iterations"],
            meta["history"],
            meta["params"],
            meta["input"],
            float(last.get("loglik", float("nan"))),
            float(last.get("kkt_violation", float("nan"))),
        )
    return CPResult(
        root["weights"][...], factors, meta["fit"], meta["iterations"], meta["history"], meta["params"], meta["input"]
    )


@dataclass
class PoissonResult(CPResult):
    """A nonnegative rank-R CP model of count data, ``sum_r weights[r] a_1[:, r] o ... o a_N[:, r]``,
    fitted by Poisson maximum likelihood (:func:`~tensorflow_ooc.decompositions.cp_apr.cp_apr`).

    Factors have columns of unit 1-norm (each a distribution over its mode's indices; the weight is
    the component's expected total count) and components are sorted by weight. Besides
    :class:`CPResult`'s attributes (``fit`` is the least-squares fit, for comparison with CP-ALS):

    Attributes
    ----------
    loglik : float  Poisson log-likelihood ``sum_i x_i log m_i - m_i`` (pyttb's ``tt_loglikelihood``)
    kkt : float     KKT violation of the last outer iteration
    """

    loglik: float = float("nan")
    kkt: float = float("nan")

    @classmethod
    def arranged(cls, weights, factors, loglik, kkt, fit, iterations, history, params, input_fp) -> "PoissonResult":
        """Columns scaled to unit 1-norm (norms into the weights), components by decreasing weight."""
        w = np.array(weights, dtype=np.float64, copy=True)
        out = []
        for f in factors:
            norms = np.abs(f).sum(axis=0)
            w = w * norms
            out.append(f / np.where(norms == 0, 1, norms))
        order = np.argsort(-w, kind="stable")
        return cls(
            w[order], [f[:, order] for f in out], fit, iterations, history, params, input_fp, float(loglik), float(kkt)
        )

    def save_npz(self, path: str | os.PathLike) -> None:
        np.savez(
            path,
            **self.to_numpy(),
            history=json.dumps(self.history),
            fit=self.fit,
            loglik=self.loglik,
            kkt=self.kkt,
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
