"""Warm starts: a decompose step's initial model from a previous result of its method, for a tensor
that may have grown since (new rows drawn at the scale of the old ones)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..decompositions import CPResult, TTResult, TuckerResult
from .errors import InputError


def warm_start(
    previous: CPResult | Any, shape: tuple[int, ...], rank: int, seed: int | None
) -> tuple[list[np.ndarray], str]:
    """Initial factors from a previous result for a tensor of ``shape``.

    The weights are spread evenly over the modes (each factor scaled by ``w ** (1/N)``), which
    keeps the columns balanced as CP-ALS expects. A mode that grew keeps its old rows and gets its
    new rows drawn uniformly at the mean magnitude of each column's old rows (zero rows would leave
    the new slices out of the first updates of the other modes). Extra components (a larger rank)
    are drawn the same way; a smaller rank keeps the heaviest components.
    """
    w = np.asarray(previous.weights, dtype=np.float64)
    F = [np.asarray(f, dtype=np.float64) for f in previous.factors]
    N = len(shape)
    if len(F) != N:
        raise InputError(f"the previous result has {len(F)} modes, the tensor {N}")
    order = np.argsort(-np.abs(w), kind="stable")[:rank]
    w, F = w[order], [f[:, order] for f in F]
    scale = np.abs(w) ** (1.0 / N)
    rng = np.random.default_rng(seed)
    out, notes = [], []
    for n, (f, rows) in enumerate(zip(F, shape)):
        if f.shape[0] > rows:
            raise InputError(
                f"mode {n} shrank from {f.shape[0]} to {rows} rows since the previous result: "
                "a warm start cannot drop rows; use init: random"
            )
        a = f * scale
        mag = np.abs(a).mean(axis=0) if a.shape[0] else np.ones(a.shape[1])
        mag = np.where(mag > 0, mag, 1.0)
        if a.shape[1] < rank:
            extra = rng.uniform(0, 1, (a.shape[0], rank - a.shape[1])) * mag.mean()
            a = np.concatenate([a, extra], axis=1)
            mag = np.concatenate([mag, np.full(rank - mag.shape[0], mag.mean())])
        if rows > a.shape[0]:
            notes.append(f"mode {n}: {rows - a.shape[0]} new rows initialized")
            a = np.concatenate([a, rng.uniform(0, 1, (rows - a.shape[0], rank)) * mag], axis=0)
        out.append(np.ascontiguousarray(a))
    if len(order) < rank:
        notes.append(f"{rank - len(order)} new components")
    return out, "; ".join(notes)


def tt_warm_start(previous: TTResult, shape: tuple[int, ...], seed: int | None) -> tuple[list[np.ndarray], str]:
    """Initial cores from a previous tensor train (of the same ranks) for a tensor of ``shape``.

    A mode that grew keeps its core's old slices and gets new slices ``core[:, i, :]`` drawn
    N(0, s^2) at the spread of the old ones (TT-ALS makes the cores orthonormal before its first
    sweep and recomputes each core from the others when it updates it). A mode that shrank is an
    error.
    """
    if len(previous.cores) != len(shape):
        raise InputError(f"the previous result has {len(previous.cores)} cores, the tensor {len(shape)} modes")
    rng = np.random.default_rng(seed)
    cores, notes = [], []
    for n, (core, rows) in enumerate(zip(previous.cores, shape)):
        c = np.asarray(core, dtype=np.float64)
        old = c.shape[1]
        if rows < old:
            raise InputError(f"mode {n} shrank from {old} to {rows} rows since the previous result")
        if rows > old:
            spread = float(np.sqrt(np.mean(c * c))) or 1.0
            extra = rng.standard_normal((c.shape[0], rows - old, c.shape[2])) * spread
            c = np.concatenate([c, extra], axis=1)
            notes.append(f"mode {n}: {rows - old} new slices initialized")
        cores.append(np.ascontiguousarray(c))
    return cores, "; ".join(notes)


def tucker_warm_start(
    previous: TuckerResult, shape: tuple[int, ...], ranks: tuple[int, ...], seed: int | None
) -> tuple[list[np.ndarray], str]:
    """Initial Tucker factors from a previous Tucker result for a tensor of ``shape``.

    A mode that grew keeps its old rows and gets new rows drawn N(0, s^2) at the spread of its old
    rows (HOOI's first SVDs orthonormalize them); a larger rank gets random columns, a smaller one
    keeps the leading ones (the largest singular values come first).
    """
    if len(previous.factors) != len(shape):
        raise InputError(f"the previous result has {len(previous.factors)} modes, the tensor {len(shape)}")
    rng = np.random.default_rng(seed)
    out, notes = [], []
    for n, (U, rows, j) in enumerate(zip(previous.factors, shape, ranks)):
        U = np.asarray(U, dtype=np.float64)
        if U.shape[0] > rows:
            raise InputError(
                f"mode {n} shrank from {U.shape[0]} to {rows} rows since the previous result: "
                "a warm start cannot drop rows; use init: random"
            )
        spread = float(U.std()) or 1.0 / math.sqrt(max(rows, 1))
        U = U[:, :j]
        if U.shape[1] < j:
            U = np.concatenate([U, rng.standard_normal((U.shape[0], j - U.shape[1])) * spread], axis=1)
            notes.append(f"mode {n}: {j - previous.factors[n].shape[1]} new columns")
        if rows > U.shape[0]:
            notes.append(f"mode {n}: {rows - U.shape[0]} new rows initialized")
            U = np.concatenate([U, rng.standard_normal((rows - U.shape[0], j)) * spread], axis=0)
        out.append(np.ascontiguousarray(U))
    return out, "; ".join(notes)
