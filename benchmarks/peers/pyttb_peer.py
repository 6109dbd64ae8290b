"""pyttb (``pyttb.sptensor.mttkrp`` and ``pyttb.cp_als``) timings on a sparse tensor, in this process."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import FACTOR_SEED, _check_init, _check_tensor, random_factors

# --- pyttb ---------------------------------------------------------------------------------------------


def _pyttb_warmup(ttb: Any) -> None:
    # pyttb's first MTTKRP in a process pays for lazy imports and first-use setup (0.5-10 s seen
    # here on 2 shared cores, far above the kernel itself); pay it on a tiny tensor, untimed.
    S = ttb.sptensor(np.array([[0, 0, 0], [1, 1, 1]]), np.array([[1.0], [2.0]]), (2, 2, 2))
    S.mttkrp([np.ones((2, 2))] * 3, 0)


def pyttb_mttkrp(
    coords: np.ndarray,
    values: np.ndarray,
    shape: Sequence[int],
    rank: int,
    modes: Sequence[int] | None = None,
    repeat: int = 1,
    *,
    seed: int = FACTOR_SEED,
) -> dict:
    """All-mode MTTKRP time of ``pyttb.sptensor.mttkrp``, measured on some modes and extrapolated.

    Parameters
    ----------
    coords, values, shape, rank
        As in :func:`genten_mttkrp`.
    modes : sequence of int, optional
        Modes to time; default all. pyttb is slow, so a subset can stand for the rest: the all-mode
        estimate is the mean measured mode time times the number of modes (pyttb's cost, R TTV
        passes over all nonzeros, hardly depends on the mode).
    repeat : int
        Timed calls per mode; the best is kept (after one untimed warm-up call per process).
    seed : int
        Seed of the factor matrices (:func:`random_factors`).

    Returns
    -------
    dict
        ``seconds``: all-mode estimate; ``measured_modes``; ``per_mode``: ``{n: seconds}``;
        ``extrapolated``: whether some modes were not measured; ``repeat``.
    """
    import pyttb as ttb

    coords, values, shape = _check_tensor(coords, values, shape)
    nd = len(shape)
    measured = list(range(nd)) if modes is None else sorted({int(n) for n in modes})
    if not measured or not all(0 <= n < nd for n in measured):
        raise ValueError(f"modes must be a non-empty subset of 0..{nd - 1}, got {modes}")
    _pyttb_warmup(ttb)
    S = ttb.sptensor(coords, values.reshape(-1, 1), shape, copy=False)
    factors = random_factors(shape, rank, seed)
    per_mode: dict[int, float] = {}
    for n in measured:
        best = float("inf")
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            S.mttkrp(factors, n)
            best = min(best, time.perf_counter() - t0)
        per_mode[n] = best
    return {
        "seconds": sum(per_mode.values()) / len(measured) * nd,
        "measured_modes": measured,
        "per_mode": per_mode,
        "extrapolated": len(measured) < nd,
        "repeat": repeat,
    }


def pyttb_cp_als(
    coords: np.ndarray,
    values: np.ndarray,
    shape: Sequence[int],
    rank: int,
    iters: int = 2,
    init: Sequence[np.ndarray] | None = None,
    *,
    seed: int = FACTOR_SEED,
) -> dict:
    """Per-iteration time of ``pyttb.cp_als``: wall time of one call of exactly ``iters`` iterations / ``iters``.

    The call is ``cp_als(S, rank, maxiters=iters, stoptol=0, printitn=0, init=ktensor(init))``
    (``stoptol=0`` never stops early). Its wall time includes, besides the iterations (per mode:
    ``sptensor.mttkrp``, Gram products, ``numpy.linalg.solve``, normalisation; then the fit, which
    pyttb takes from the last MTTKRP, without another pass over the nonzeros), pyttb's per-call
    overhead: the tensor's norm, checking and copying ``init``, and the final ``arrange`` and
    ``fixsigns``. Not included: building the ``sptensor`` and the ``ktensor``, and pyttb's first-use
    costs, paid untimed on a tiny tensor first.

    Parameters
    ----------
    coords, values, shape, rank
        As in :func:`genten_cp_als`.
    iters : int
        CP-ALS iterations (pyttb is slow: keep this small).
    init : sequence of numpy.ndarray, optional
        Initial factor matrices (unit weights); default :func:`random_factors` (seed ``seed``).
    seed : int
        Seed of the default initial factors.

    Returns
    -------
    dict
        ``seconds_per_iter``: total wall seconds / ``iters``; ``fit``: pyttb's fit after the last
        iteration; ``iters``; ``seconds``: the total.
    """
    import pyttb as ttb

    coords, values, shape = _check_tensor(coords, values, shape)
    if iters < 1:
        raise ValueError("iters must be at least 1")
    factors = _check_init(init, shape, rank, seed)
    _pyttb_warmup(ttb)
    ttb.cp_als(
        ttb.sptensor(np.array([[0, 0, 0], [1, 1, 1]]), np.array([[1.0], [2.0]]), (2, 2, 2)),
        1,
        maxiters=1,
        stoptol=0,
        printitn=0,
        init=ttb.ktensor([np.ones((2, 1))] * 3),
    )
    S = ttb.sptensor(coords, values.reshape(-1, 1), shape, copy=False)
    K = ttb.ktensor(factors)
    t0 = time.perf_counter()
    _, _, output = ttb.cp_als(S, rank, maxiters=iters, stoptol=0, printitn=0, init=K)
    seconds = time.perf_counter() - t0
    if int(output["iters"]) != iters - 1:  # pyttb reports the last 0-based iteration
        raise RuntimeError(f"pyttb cp_als ran {int(output['iters']) + 1} iterations, not {iters}")
    return {"seconds_per_iter": seconds / iters, "fit": float(output["fit"]), "iters": iters, "seconds": seconds}
