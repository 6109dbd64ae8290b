"""Inputs every peer shares (factor matrices, a NumPy reference MTTKRP) and the plumbing to run C/C++
peers in-process (capturing their fd-level output, temporary environment variables), and the
sampler the benchmarks measure peak memory and disk with."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

FACTOR_SEED = 0
"""Seed of the factor matrices given to every peer (see :func:`random_factors`)."""


# --- shared inputs -------------------------------------------------------------------------------------


def random_factors(shape: Sequence[int], rank: int, seed: int = FACTOR_SEED) -> list[np.ndarray]:
    """Factor matrices shared by all peers.

    Parameters
    ----------
    shape : sequence of int
        Tensor dimensions.
    rank : int
        Number of columns of each factor.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    list of numpy.ndarray
        One C-contiguous float64 ``(shape[n], rank)`` matrix per mode, uniform in [0, 1).
    """
    rng = np.random.default_rng(seed)
    return [rng.random((int(s), int(rank))) for s in shape]


def numpy_mttkrp(coords: np.ndarray, values: np.ndarray, factors: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Reference mode-``n`` MTTKRP in plain NumPy (for verification; not fast).

    Parameters
    ----------
    coords : numpy.ndarray
        ``(nnz, nmodes)`` 0-based integer coordinates; duplicates are summed, as every peer does.
    values : numpy.ndarray
        ``(nnz,)`` values.
    factors : sequence of numpy.ndarray
        One ``(shape[k], R)`` matrix per mode; ``factors[n]`` only gives the output's row count.
    n : int
        Output mode.

    Returns
    -------
    numpy.ndarray
        ``(shape[n], R)``: ``out[i, r] = sum over nonzeros with coords[:, n] == i of
        value * prod_{k != n} factors[k][coords[:, k], r]``.
    """
    rows = np.repeat(np.asarray(values, dtype=np.float64)[:, None], factors[n].shape[1], axis=1)
    for k, f in enumerate(factors):
        if k != n:
            rows *= f[coords[:, k]]
    out = np.empty(factors[n].shape)
    for r in range(out.shape[1]):  # bincount per column: a vectorised scatter-add
        out[:, r] = np.bincount(coords[:, n], weights=rows[:, r], minlength=out.shape[0])
    return out


def _check_tensor(coords: Any, values: Any, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Return C-contiguous int64 coordinates, float64 values and a tuple shape, after checking them."""
    coords = np.ascontiguousarray(coords, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    shape = tuple(int(s) for s in shape)
    if coords.ndim != 2 or coords.shape[1] != len(shape):
        raise ValueError(f"coords must be (nnz, {len(shape)}), got {coords.shape}")
    if coords.shape[0] != values.shape[0]:
        raise ValueError(f"{coords.shape[0]} coordinates but {values.shape[0]} values")
    return coords, values, shape


def _check_init(init: Sequence[np.ndarray] | None, shape: tuple[int, ...], rank: int, seed: int) -> list[np.ndarray]:
    """C-contiguous float64 copies of the initial factors, or :func:`random_factors` when ``init`` is None."""
    if init is None:
        return random_factors(shape, rank, seed)
    factors = [np.array(f, dtype=np.float64, order="C", copy=True) for f in init]
    if len(factors) != len(shape) or any(f.shape != (s, rank) for f, s in zip(factors, shape)):
        raise ValueError(
            f"init must be {len(shape)} matrices of shapes {[(s, rank) for s in shape]}, "
            f"got {[f.shape for f in factors]}"
        )
    return factors


# --- capturing C-level output --------------------------------------------------------------------------


class _Captured:
    """Text written to file descriptors 1 and 2 inside :func:`_capture_output` (set on exit)."""

    text: str = ""


def _flush_all() -> None:
    # Python's buffers, then C stdio's (std::cout is synchronised with stdio, so this covers C++).
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def _capture_output() -> Iterator[_Captured]:
    """Redirect fds 1 and 2 (so C/C++ output too) to a temporary file; its text is on the result."""
    captured = _Captured()
    with tempfile.TemporaryFile() as buf:
        _flush_all()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(buf.fileno(), 1)
            os.dup2(buf.fileno(), 2)
            yield captured
        finally:
            _flush_all()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            buf.seek(0)
            captured.text = buf.read().decode(errors="replace")


@contextlib.contextmanager
def _temporary_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the previous ones."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Sampler:
    """Polls a value in a thread and keeps its maximum."""

    def __init__(self, fn, period: float = 0.02) -> None:
        self.fn, self.period, self.peak = fn, period, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, int(self.fn()))
            except Exception:
                pass
            self._stop.wait(self.period)

    def __enter__(self) -> "Sampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
