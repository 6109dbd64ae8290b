"""Evaluating a model: its fit to a tensor, its errors on the tensor's entries, its factor match
score against a reference, and its predicted values at given coordinates.

Three kinds of model come out of decompose steps, and every function here takes each of them:

- ``cp``: a CP model ``sum_r w_r a_1r o ... o a_Nr`` (:class:`~tensorflow_ooc.decompositions.CPResult`;
  a CP-APR result, :class:`~tensorflow_ooc.decompositions.PoissonResult`, is one with ``poisson``
  set: a nonnegative model of counts);
- ``tucker``: a Tucker model ``G x_1 U_1 ... x_N U_N`` (:class:`~tensorflow_ooc.decompositions.TuckerResult`);
- ``fasttucker``: a FastTucker completion model ``sum_r prod_n (A_n B_n)[i_n, r]``
  (:class:`~tensorflow_ooc.decompositions.FastTuckerResult`). It is a CP model with unit weights
  and factors ``C_n = A_n B_n``, so it is evaluated as one (the ``C_n`` are formed once);
- ``tt``: a tensor train ``core_0[:, i_0, :] @ ... @ core_{N-1}[:, i_{N-1}, :]``
  (:class:`~tensorflow_ooc.decompositions.TTResult`). Its squared norm is the train contracted
  with itself core by core; its fit against a sparse store is computed as TT-ALS's residual
  pass computes it, ``||X - T||^2 = sum over nonzeros (x - t)^2 + (||T||^2 - sum over nonzeros t^2)``.

The fit against a sparse store streams it once: ``||X - M||^2 = ||X||^2 + ||M||^2 - 2 <X, M>``, with
``<X, M>`` the model's values at the nonzeros (chunk by chunk) and ``||M||^2`` from the factors'
Gram matrices, never the dense model. The same pass gives the RMSE and MAE of the model on the
stored entries (what a completion model is judged by; its "fit" would count every missing entry as
a zero). Against a dense array the model is formed one stored chunk at a time. A Poisson model
also gets its log-likelihood ``sum_i x_i log m_i - sum_i m_i`` (pyttb's ``tt_loglikelihood``, as
CP-APR reports it): the first sum over the stored entries in the same pass, the second over every
cell from the factors' column sums.

The factor match score (FMS) is Tensor Toolbox's ``score``: components are paired by an optimal
assignment (Hungarian algorithm, not greedy) maximizing, per pair, the product over modes of the
absolute cosines of the factor columns, times the weight penalty ``1 - |w_r - v_s| / max(w_r, v_s)``;
the score is the mean over the larger rank. ``congruence`` is the same without the weight penalty.
It is defined for CP models only.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..decompositions import CPResult, FastTuckerResult, PoissonResult, TTResult, TuckerResult, load_result
from ..decompositions.common.cp_result import arrange
from ..store import Store
from ..store.dense import DenseArray
from . import locations as loc
from .errors import InputError

KIND_NAMES = {"cp": "CP", "tucker": "Tucker", "fasttucker": "FastTucker completion", "tt": "tensor-train"}
# rows of coordinates evaluated at once: bounds the Tucker contraction's (rows x prod J) buffer
_ROW_BYTES = 64 << 20


@dataclass
class Model:
    """A model to evaluate: ``kind`` is ``cp``, ``tucker``, ``fasttucker`` or ``tt``.

    ``weights`` and ``factors`` are the CP form (a FastTucker model's ``C_n = A_n B_n`` with unit
    weights); a Tucker model has ``core`` and ``factors`` (``weights`` None); a tensor train has
    ``cores`` (``(R_{k-1}, I_k, R_k)`` arrays; ``weights`` None, ``factors`` empty). ``sizes`` are
    the model's ranks as the run record shows them (``rank``; ``ranks``; ``ranks`` and
    ``core_rank``; a train's inner ``ranks``).
    ``poisson``: a CP model of counts (a CP-APR result, or an ``.npz`` with its ``loglik``), whose
    evaluation includes the Poisson log-likelihood.
    """

    weights: np.ndarray | None
    factors: list[np.ndarray]
    source: str
    kind: str = "cp"
    core: np.ndarray | None = None
    sizes: dict = field(default_factory=dict)
    result: CPResult | TuckerResult | FastTuckerResult | TTResult | None = None
    poisson: bool = False
    cores: list[np.ndarray] | None = None

    @property
    def rank(self) -> int:
        """CP rank (components); for a Tucker model the largest core dimension; for a tensor
        train its largest TT rank."""
        if self.weights is not None:
            return int(self.weights.shape[0])
        if self.cores is not None:
            return int(max(c.shape[2] for c in self.cores))
        assert self.core is not None
        return int(max(self.core.shape))

    @property
    def shape(self) -> tuple[int, ...]:
        if self.cores is not None:
            return tuple(int(c.shape[1]) for c in self.cores)
        return tuple(int(f.shape[0]) for f in self.factors)

    @property
    def what(self) -> str:
        return f"{'Poisson ' if self.poisson else ''}{KIND_NAMES[self.kind]} model {self.source}"


def model_of(result: CPResult | TuckerResult | FastTuckerResult | TTResult, source: str) -> Model:
    """The :class:`Model` of a decomposition result."""
    if isinstance(result, TTResult):
        return Model(
            None,
            [],
            source,
            "tt",
            sizes={"ranks": list(result.ranks[1:-1])},
            result=result,
            cores=[np.asarray(c, dtype=np.float64) for c in result.cores],
        )
    if isinstance(result, TuckerResult):
        return Model(
            None,
            [np.asarray(f, dtype=np.float64) for f in result.factors],
            source,
            "tucker",
            core=np.asarray(result.core, dtype=np.float64),
            sizes={"ranks": list(result.ranks)},
            result=result,
        )
    if isinstance(result, FastTuckerResult):
        C = [
            np.asarray(A, dtype=np.float64) @ np.asarray(B, dtype=np.float64)
            for A, B in zip(result.factors, result.core_factors)
        ]
        return Model(
            np.ones(result.core_rank),
            C,
            source,
            "fasttucker",
            sizes={"ranks": list(result.ranks), "core_rank": result.core_rank},
            result=result,
        )
    w = np.asarray(result.weights, dtype=np.float64)
    return Model(
        w,
        [np.asarray(f, dtype=np.float64) for f in result.factors],
        source,
        "cp",
        sizes={"rank": int(w.shape[0])},
        result=result,
        poisson=isinstance(result, PoissonResult),
    )


def load_model(location: str) -> Model:
    """A result store of any kind (:func:`tensorflow_ooc.load_result`), or an ``.npz``: a CP model
    (``weights``, ``factor0``, ``factor1``, ... as ``CPResult.save_npz`` and ``tfooc generate
    --kind planted`` write; with ``loglik``, as ``PoissonResult.save_npz`` and the npz export of a
    CP-APR result write, a Poisson model), a Tucker model (``core``, ``factor0``, ...), a FastTucker model
    (``factor0``, ..., ``core_factor0``, ...) or a tensor train (``core0``, ``core1``, ..., as
    ``TTResult.save_npz`` and the npz export of a TT result write)."""
    if loc.isdir(location):
        try:
            return model_of(load_result(location), location)
        except Exception as exc:
            raise InputError(f"{location}: not a result store ({exc})") from None
    try:
        z = np.load(io.BytesIO(loc.read_bytes(location)), allow_pickle=False)
    except Exception as exc:
        raise InputError(f"{location}: not a result store or a model .npz ({exc})") from None

    def numbered(prefix: str) -> list[np.ndarray]:
        names = [k for k in z.files if k.startswith(prefix) and k[len(prefix) :].isdigit()]
        return [np.asarray(z[k], dtype=np.float64) for k in sorted(names, key=lambda k: int(k[len(prefix) :]))]

    factors, core_factors, cores = numbered("factor"), numbered("core_factor"), numbered("core")
    if factors and "weights" in z.files:
        w = np.asarray(z["weights"], dtype=np.float64)
        if "loglik" in z.files:
            kkt = float(z["kkt"]) if "kkt" in z.files else math.nan
            return model_of(PoissonResult(w, factors, math.nan, 0, loglik=float(z["loglik"]), kkt=kkt), location)
        return model_of(CPResult(w, factors, math.nan, 0), location)
    if factors and "core" in z.files:
        return model_of(TuckerResult(np.asarray(z["core"], dtype=np.float64), factors, math.nan, 0), location)
    if factors and len(core_factors) == len(factors):
        return model_of(FastTuckerResult(factors, core_factors, math.nan, math.nan, 0, 0), location)
    if cores and not factors:
        bad = [k for k, c in enumerate(cores) if c.ndim != 3 or (k and c.shape[0] != cores[k - 1].shape[2])]
        if bad or cores[0].shape[0] != 1 or cores[-1].shape[2] != 1:
            raise InputError(
                f"{location}: 'core0', 'core1', ... are not a tensor train (core k of shape (R_k-1, I_k, R_k), "
                f"R_0 = R_N = 1, neighbouring ranks equal); shapes {[c.shape for c in cores]}"
            )
        fit = float(z["fit"]) if "fit" in z.files else math.nan
        sweeps = int(z["sweeps"]) if "sweeps" in z.files else 0
        return model_of(TTResult(cores, fit, sweeps), location)
    raise InputError(
        f"{location}: a model .npz needs 'weights' and 'factor0', 'factor1', ... (CP), 'core' and the "
        f"factors (Tucker), the factors and 'core_factor0', ... (FastTucker), or 'core0', 'core1', ... "
        f"(tensor train); it has {z.files}"
    )


def _check_shape(model: Model, shape: tuple[int, ...], what: str) -> None:
    if model.shape != tuple(shape):
        raise InputError(f"{model.what} has shape {model.shape}, the tensor {what} {tuple(shape)}")


def model_values(model: Model, coords: np.ndarray) -> np.ndarray:
    """The model's values at ``coords`` ((n, N) 0-based integer coordinates inside its shape)."""
    idx = np.asarray(coords, dtype=np.int64)
    n = idx.shape[0]
    if model.cores is not None:
        return _train_values(model.cores, idx)
    if model.core is None:
        assert model.weights is not None
        out = np.empty(n)
        R = model.weights.shape[0]
        step = max(1, _ROW_BYTES // (8 * max(R, 1)))
        for s in range(0, n, step):
            rows = idx[s : s + step]
            prod = np.broadcast_to(model.weights, (rows.shape[0], R)).copy()
            for m, A in enumerate(model.factors):
                prod *= A[rows[:, m]]
            out[s : s + rows.shape[0]] = prod.sum(axis=1)
        return out
    # Tucker: per row, the core contracted with the row's factor rows mode by mode, batched so the
    # (rows x J_2...J_N) intermediate stays bounded
    G = model.core
    J = G.shape
    rest = max(1, math.prod(J[1:]))
    step = max(1, _ROW_BYTES // (8 * rest))
    out = np.empty(n)
    for s in range(0, n, step):
        rows = idx[s : s + step]
        b = rows.shape[0]
        T = model.factors[0][rows[:, 0]] @ G.reshape(J[0], -1)
        for m in range(1, len(J)):
            T = np.einsum("bjr,bj->br", T.reshape(b, J[m], -1), model.factors[m][rows[:, m]])
        out[s : s + b] = T[:, 0]
    return out


def _train_values(cores: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """A tensor train's values at ``idx``: per row the product of the cores' slices, batched so the
    (rows x R_{k-1} x R_k) slices stay bounded."""
    n = idx.shape[0]
    out = np.empty(n)
    width = max(c.shape[0] * c.shape[2] for c in cores)
    step = max(1, _ROW_BYTES // (8 * width))
    for s in range(0, n, step):
        rows = idx[s : s + step]
        v = cores[0][0, rows[:, 0], :]  # (b, R_1)
        for k in range(1, len(cores)):
            v = np.einsum("ba,abc->bc", v, cores[k][:, rows[:, k], :])
        out[s : s + rows.shape[0]] = v[:, 0]
    return out


def model_norm_sq(model: Model) -> float:
    """``||M||^2`` from the factors' Gram matrices (the model is never formed); a tensor train's
    by contracting it with itself core by core."""
    if model.cores is not None:
        W = np.ones((1, 1))
        for G in model.cores:
            # W'[b, c] = sum over a, a', i of W[a, a'] G[a, i, b] G[a', i, c]
            W = np.einsum("ay,aib->yib", W, G)
            W = np.einsum("yib,yic->bc", W, G)
        return float(W[0, 0])
    if model.core is None:
        assert model.weights is not None
        H = np.ones((model.weights.shape[0],) * 2)
        for A in model.factors:
            H *= A.T @ A
        return float(model.weights @ H @ model.weights)
    # <G, G x_1 U_1^T U_1 ... x_N U_N^T U_N>: the factors need not be orthonormal
    W = model.core
    for m, U in enumerate(model.factors):
        W = np.moveaxis(np.tensordot(U.T @ U, W, axes=(1, m)), 0, m)
    return float(np.vdot(model.core, W))


def model_block(model: Model, origin: tuple[int, ...], size: tuple[int, ...]) -> np.ndarray:
    """The dense model over the box ``origin`` .. ``origin + size`` (one chunk of a dense array)."""
    if model.cores is not None:
        out = model.cores[0][:, origin[0] : origin[0] + size[0], :]
        for G, o, s in zip(model.cores[1:], origin[1:], size[1:]):
            out = np.tensordot(out, G[:, o : o + s, :], axes=(-1, 0))
        return out.reshape(tuple(size))
    rows = [A[o : o + s] for A, o, s in zip(model.factors, origin, size)]
    letters = "abcdefgh"[: len(rows)]
    if model.core is None:
        assert model.weights is not None
        spec = ",".join(f"{c}r" for c in letters) + ",r->" + letters
        return np.einsum(spec, *rows, model.weights)
    out = model.core
    for m, U in enumerate(rows):
        out = np.moveaxis(np.tensordot(U, out, axes=(1, m)), 0, m)
    return out


def model_total(model: Model) -> float:
    """The sum of the model over every cell, from the factors' column sums (CP models)."""
    assert model.weights is not None
    return float(np.sum(model.weights * np.prod([A.sum(axis=0) for A in model.factors], axis=0)))


def _x_log_m(x: np.ndarray, m: np.ndarray) -> float:
    """``sum x log m`` over the entries with ``x != 0`` (a zero count adds nothing, whatever ``m``)."""
    nz = x != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(x[nz] @ np.log(m[nz]))


def evaluate_tensor(tensor: Store | DenseArray, model: Model) -> dict:
    """Fit and errors of ``model`` against a sparse store or a dense array, reading it once.

    Returns
    -------
    dict
        ``fit`` (``1 - ||X - M|| / ||X||``; left out for a FastTucker completion model, whose
        missing entries are not zeros), and ``rmse``, ``mae`` and ``entries``: the errors on the
        stored entries (every entry of a dense array). A Poisson model also gets ``loglik``
        (``sum x log m - sum m``; ``-inf`` where the model is 0 at a nonzero count).
    """
    _check_shape(model, tuple(tensor.shape), tensor.path)
    sse = sae = 0.0
    xlogm = 0.0
    count = 0
    if tensor.dense:
        norm_x2 = 0.0
        for c, block in tensor.iter_chunks():
            origin, size = tensor.chunk_box(c)
            x = np.asarray(block, dtype=np.float64)
            mb = model_block(model, origin, size)
            d = x - mb
            norm_x2 += float(np.vdot(x, x))
            sse += float(np.vdot(d, d))
            sae += float(np.abs(d).sum())
            count += x.size
            if model.poisson:
                xlogm += _x_log_m(x.ravel(), mb.ravel())
        resid2 = sse
    else:
        inner = msq = 0.0
        for ch in tensor.iter_chunks():
            x = ch.values.astype(np.float64)
            m = model_values(model, ch.coords(tensor.layout))
            inner += float(x @ m)
            msq += float(m @ m)
            if model.poisson:
                xlogm += _x_log_m(x, m)
            d = x - m
            sse += float(d @ d)
            sae += float(np.abs(d).sum())
            count += x.shape[0]
        norm_x2 = float(tensor.meta["norm_sq"])
        if model.kind == "tt":
            # as TT-ALS's residual pass: the error at the nonzeros plus the train's energy off them
            resid2 = sse + max(0.0, model_norm_sq(model) - msq)
        else:
            resid2 = abs(norm_x2 + model_norm_sq(model) - 2 * inner)
    out: dict = {"entries": int(count), "rmse": math.sqrt(sse / count) if count else math.nan}
    out["mae"] = sae / count if count else math.nan
    if model.kind != "fasttucker":
        out["fit"] = 1.0 - math.sqrt(resid2) / math.sqrt(norm_x2) if norm_x2 > 0 else 0.0
    if model.poisson:
        out["loglik"] = xlogm - model_total(model)
    return out


def model_fit(store: Store, model: Model) -> float:
    """``1 - ||X - M|| / ||X||`` for a store X, streaming its chunks once."""
    _check_shape(model, tuple(store.shape), store.path)
    inner = 0.0
    for ch in store.iter_chunks():
        inner += float(ch.values.astype(np.float64) @ model_values(model, ch.coords(store.layout)))
    norm_x2 = float(store.meta["norm_sq"])
    if norm_x2 <= 0:
        return 0.0
    return 1.0 - float(np.sqrt(abs(norm_x2 + model_norm_sq(model) - 2 * inner))) / float(np.sqrt(norm_x2))


def factor_match(model: Model, reference: Model) -> dict:
    """Factor match score of ``model`` against ``reference`` (see the module docstring); CP models only.

    Returns
    -------
    dict
        ``fms`` (with the weight penalty), ``congruence`` (without), ``pairs`` (model component,
        reference component, score) in reference order.
    """
    for m in (model, reference):
        if m.kind != "cp" or m.weights is None:
            raise InputError(
                f"the factor match score compares CP models; {m.what} is not one (leave out 'reference', "
                "or evaluate a CP result)"
            )
    assert model.weights is not None and reference.weights is not None
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
