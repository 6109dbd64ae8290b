"""Evaluating a CP model: its fit to a tensor store and its factor match score against a reference.

The fit streams the store once: ``||X - M||^2 = ||X||^2 + ||M||^2 - 2 <X, M>``, with ``<X, M>`` the
model's values at the nonzeros (chunk by chunk) and ``||M||^2 = w^T (*_n A_n^T A_n) w``.

The factor match score (FMS) is Tensor Toolbox's ``score``: components are paired by an optimal
assignment (Hungarian algorithm, not greedy) maximizing, per pair, the product over modes of the
absolute cosines of the factor columns, times the weight penalty ``1 - |w_r - v_s| / max(w_r, v_s)``;
the score is the mean over the larger rank. ``congruence`` is the same without the weight penalty.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..decompositions import load_result
from ..decompositions.result import arrange
from ..store import Store
from . import locations as loc
from .errors import InputError


@dataclass
class Model:
    """A CP model: weights (R,) and factors (I_n, R)."""

    weights: np.ndarray
    factors: list[np.ndarray]
    source: str

    @property
    def rank(self) -> int:
        return int(self.weights.shape[0])


def load_model(location: str) -> Model:
    """A result store (:func:`tensorflow_ooc.load_result`), or an ``.npz`` with ``weights`` and
    ``factor0``, ``factor1``, ... (``CPResult.save_npz``, ``tfooc generate --kind planted``)."""
    if loc.isdir(location):
        r = load_result(location)
        return Model(np.asarray(r.weights), [np.asarray(f) for f in r.factors], location)
    try:
        z = np.load(io.BytesIO(loc.read_bytes(location)), allow_pickle=False)
    except Exception as exc:
        raise InputError(f"{location}: not a result store or a model .npz ({exc})") from None
    names = sorted((k for k in z.files if k.startswith("factor")), key=lambda k: int(k[6:] or 0))
    if "weights" not in z.files or not names:
        raise InputError(f"{location}: a model .npz needs 'weights' and 'factor0', 'factor1', ...; has {z.files}")
    return Model(
        np.asarray(z["weights"], dtype=np.float64), [np.asarray(z[k], dtype=np.float64) for k in names], location
    )


def model_fit(store: Store, model: Model) -> float:
    """``1 - ||X - M|| / ||X||`` for a store X, streaming its chunks once."""
    if tuple(f.shape[0] for f in model.factors) != tuple(store.shape):
        raise InputError(
            f"model {model.source} has shape {tuple(f.shape[0] for f in model.factors)}, "
            f"the tensor {store.path} {tuple(store.shape)}"
        )
    w = model.weights.astype(np.float64)
    H = np.ones((model.rank, model.rank))
    for A in model.factors:
        H *= A.T @ A
    norm_m2 = float(w @ H @ w)
    inner = 0.0
    for ch in store.iter_chunks():
        idx = ch.coords(store.layout)
        prod = np.broadcast_to(w, (idx.shape[0], model.rank)).copy()
        for n, A in enumerate(model.factors):
            prod *= A[idx[:, n]]
        inner += float(ch.values.astype(np.float64) @ prod.sum(axis=1))
    norm_x2 = float(store.meta["norm_sq"])
    if norm_x2 <= 0:
        return 0.0
    return 1.0 - float(np.sqrt(abs(norm_x2 + norm_m2 - 2 * inner))) / float(np.sqrt(norm_x2))


def factor_match(model: Model, reference: Model) -> dict:
    """Factor match score of ``model`` against ``reference`` (see the module docstring).

    Returns
    -------
    dict
        ``fms`` (with the weight penalty), ``congruence`` (without), ``pairs`` (model component,
        reference component, score) in reference order.
    """
    if len(model.factors) != len(reference.factors):
        raise InputError(
            f"{model.source} has {len(model.factors)} modes, the reference {reference.source} {len(reference.factors)}"
        )
    mf, rf = list(model.factors), list(reference.factors)
    for n, (a, b) in enumerate(zip(mf, rf)):
        # a tensor read from .tns has the shape of its largest indices: trailing slices without
        # nonzeros are missing from it, and the reference model is zero on them (zero rows)
        if a.shape[0] < b.shape[0] and not np.any(b[a.shape[0] :]):
            mf[n] = np.concatenate([a, np.zeros((b.shape[0] - a.shape[0], a.shape[1]))])
        elif b.shape[0] < a.shape[0] and not np.any(a[b.shape[0] :]):
            rf[n] = np.concatenate([b, np.zeros((a.shape[0] - b.shape[0], b.shape[1]))])
        elif a.shape[0] != b.shape[0]:
            raise InputError(
                f"mode {n}: {model.source} has {a.shape[0]} rows, the reference {reference.source} "
                f"{b.shape[0]} (and the extra rows are not zero)"
            )
    w1, F1 = arrange(model.weights, mf)
    w2, F2 = arrange(reference.weights, rf)
    C = np.ones((w1.shape[0], w2.shape[0]))
    for a, b in zip(F1, F2):
        C *= np.abs(a.T @ b)
    top = np.maximum(np.abs(w1)[:, None], np.abs(w2)[None, :])
    penalty = 1 - np.abs(np.abs(w1)[:, None] - np.abs(w2)[None, :]) / np.where(top == 0, 1, top)
    S = C * penalty
    denom = max(w1.shape[0], w2.shape[0])
    r, c = linear_sum_assignment(-S)
    r2, c2 = linear_sum_assignment(-C)
    order = np.argsort(c)
    return {
        "fms": float(S[r, c].sum() / denom),
        "congruence": float(C[r2, c2].sum() / denom),
        "pairs": [[int(r[i]), int(c[i]), round(float(S[r[i], c[i]]), 6)] for i in order],
    }
