"""Planted dense CP tensors: :class:`PlantedDense` in memory or written to Zarr (``write_planted_dense``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class PlantedDense:
    """A dense tensor that is a known rank-R CP model plus Gaussian noise.

    ``tensor = sum_r weights[r] * factors[0][:, r] o ... o factors[N-1][:, r] + E`` with
    ``||E|| = noise * ||model||`` (in expectation): ``noise=0.01`` is 1 % noise.
    """

    tensor: np.ndarray
    weights: np.ndarray
    factors: list[np.ndarray]
    noise: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(f.shape[0] for f in self.factors)


def planted_dense_factors(
    shape: Sequence[int], rank: int, seed: int | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Unit weights and standard normal factors (well conditioned with high probability)."""
    rng = np.random.default_rng(seed)
    return np.ones(rank), [rng.standard_normal((int(s), rank)) for s in shape]


def _dense_model(weights: np.ndarray, factors: Sequence[np.ndarray]) -> np.ndarray:
    letters = "abcdefgh"[: len(factors)]
    return np.einsum(",".join(f"{c}r" for c in letters) + ",r->" + letters, *factors, weights, optimize=True)


def _model_norm_sq(weights: np.ndarray, factors: Sequence[np.ndarray]) -> float:
    H = np.outer(weights, weights)
    for f in factors:
        H = H * (f.T @ f)
    return float(H.sum())


def planted_dense(
    shape: Sequence[int], rank: int, *, noise: float = 0.0, seed: int | None = None, dtype: str = "float64"
) -> PlantedDense:
    """A planted rank-``rank`` dense tensor in memory (see :class:`PlantedDense`).

    Examples
    --------
    >>> p = planted_dense((4, 5, 6), 2, noise=0.01, seed=0)
    >>> p.tensor.shape, len(p.factors)
    ((4, 5, 6), 2)
    """
    weights, factors = planted_dense_factors(shape, rank, seed)
    X = _dense_model(weights, factors)
    if noise:
        rng = np.random.default_rng(None if seed is None else [int(seed), 1])
        sigma = noise * math.sqrt(_model_norm_sq(weights, factors) / X.size)
        X += sigma * rng.standard_normal(X.shape)
    return PlantedDense(X.astype(dtype, copy=False), weights, factors, float(noise))


def write_planted_dense(
    path: str | os.PathLike,
    shape: Sequence[int],
    rank: int,
    *,
    noise: float = 0.0,
    seed: int | None = 0,
    chunks: Sequence[int] | None = None,
    dtype: str = "float64",
    codec: str = "none",
    overwrite: bool = False,
    progress: bool = False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Write a planted rank-``rank`` dense tensor (:class:`PlantedDense`) to a Zarr v3 array at
    ``path``, one chunk at a time (an array larger than memory is fine), atomically for local
    paths. The array's ``tensorflow_ooc`` attributes record the planted model's parameters and the
    written tensor's ||X||^2. Returns the true ``(weights, factors)``.

    ``codec="none"`` stores chunks uncompressed: noisy float64 values shrink by about 4 % under
    Zarr's default zstd, whose decompression (about 0.3 GB/s a core) would then bound a streamed
    CP-ALS; ``codec="zstd"`` takes Zarr's default compressor.

    Examples
    --------
    >>> w, f = write_planted_dense("memory://doc-dense.zarr", (6, 7, 8), 2, noise=0.01)
    >>> import zarr; zarr.open_array("memory://doc-dense.zarr").shape
    (6, 7, 8)
    """
    import zarr

    from ..errors import StoreExistsError
    from ..store import paths

    shape = tuple(int(s) for s in shape)
    if codec not in ("none", "zstd"):
        raise ValueError(f"codec must be 'none' or 'zstd', got {codec!r}")
    if chunks is None:
        # at most 8 MiB chunks: whole trailing modes, the leading ones cut into equal pieces, so no
        # edge chunk is mostly padding (Zarr stores an edge chunk at the full chunk shape, and a
        # streamed pass reads it whole: 209 rows cut 168 + 41 read 1.6x the data, 105 + 104 do not)
        chunks, budget = [], (8 << 20) // np.dtype(dtype).itemsize
        for s in reversed(shape):
            c = max(1, min(s, budget))
            c = -(-s // -(-s // c))
            chunks.insert(0, c)
            budget = max(1, budget // c)
    chunks = tuple(int(c) for c in chunks)
    weights, factors = planted_dense_factors(shape, rank, seed)
    sigma = noise * math.sqrt(_model_norm_sq(weights, factors) / math.prod(shape)) if noise else 0.0
    final = str(path)
    from tqdm.auto import tqdm

    from ..disk import disk_writes

    # a full disk: the staging array is removed (``staged``), the error names the array and its size
    with (
        disk_writes(final, needed=math.prod(shape) * np.dtype(dtype).itemsize + (64 << 10)),
        paths.staged(
            final, overwrite, StoreExistsError(f"{final}: exists; pass overwrite=True to replace it")
        ) as staging,
    ):
        arr = zarr.create_array(
            staging,
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            zarr_format=3,
            overwrite=True,
            **({"compressors": None} if codec == "none" else {}),
        )
        grid = [range(0, s, c) for s, c in zip(shape, chunks, strict=True)]
        norm_sq = 0.0
        for k, origin in enumerate(
            tqdm(
                list(np.ndindex(*[len(g) for g in grid])),
                desc="generate",
                unit="chunk",
                disable=not progress,
                leave=False,
            )
        ):
            lo = [g[i] for g, i in zip(grid, origin, strict=True)]
            sl = tuple(slice(a, min(s, a + c)) for a, s, c in zip(lo, shape, chunks, strict=True))
            block = _dense_model(weights, [f[s] for f, s in zip(factors, sl, strict=True)])
            if sigma:
                block += sigma * np.random.default_rng([0 if seed is None else int(seed), 2, k]).standard_normal(
                    block.shape
                )
            block = block.astype(dtype, copy=False)
            norm_sq += float(np.vdot(block, block))
            arr[sl] = block
        arr.attrs["tensorflow_ooc"] = {
            "kind": "planted-dense",
            "norm_sq": norm_sq,
            "planted": {"rank": int(rank), "noise": float(noise), "seed": seed},
            "codec": codec,
        }
    return weights, factors
