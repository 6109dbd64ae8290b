"""Synthetic sparse tensors: heavy-tailed supports shaped like real data, and planted low-rank CP.

Real tensors have a few huge slices and many tiny ones. Each mode's index is drawn from a power
law over a random permutation of the mode (rank ``r = floor(L * u**skew)``, ``u`` uniform), so
slice sizes are heavy tailed and popular indices are scattered over the mode, not packed at 0.
Generation streams in batches with no duplicate coordinates across batches: batch k owns a
disjoint range of ranks of the longest mode, so 10^9 nonzeros need only one batch in memory.

Every random number is a hash of (seed, batch, draw number), so draws run in parallel (numba
threads) and the tensor is the same for a seed whatever the thread count. Draws become ALTO words
at once; a batch is made distinct by sorting them, so batches come out in ALTO order, and
values are a hash of the cell, so a cell's value does not depend on the batch it falls in.

One module per generator: ``heavy_tailed_generator`` (:class:`HeavyTailedGenerator`, the
``iter_heavy_tailed`` streams, ``heavy_tailed``) with its numba kernels in ``heavy_tailed_kernels``;
``sparse_cp`` (``planted_cp``), ``dense_cp`` (``planted_dense``, ``write_planted_dense``),
``fasttucker`` (``planted_fasttucker``) and ``poisson_cp`` (``planted_poisson`` and the streaming
:class:`PlantedPoissonGenerator`: counts of a planted Poisson CP model, for CP-APR) with its numba kernels
in ``poisson_kernels``; ``tns_writer`` (``format_tns``, ``write_tns``). The power law the sparse
generators draw from is in ``power_law``, and ``PRESETS`` (real tensors' shapes) in ``presets``.

Examples
--------
>>> from tensorflow_ooc import synthetic
>>> coords, values = synthetic.heavy_tailed((50, 40, 30), 1000, seed=0)
>>> coords.shape, values.shape
((1000, 3), (1000,))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import lazy_names

if TYPE_CHECKING:  # for type checkers, editors and the import contract
    from .dense_cp import PlantedDense, planted_dense, planted_dense_factors, write_planted_dense
    from .fasttucker import PlantedFastTucker, planted_fasttucker
    from .heavy_tailed_generator import (
        DEFAULT_BATCH_NNZ,
        DENSE_BOX_CELLS,
        MAX_AUTO_BATCH_NNZ,
        HeavyTailedGenerator,
        default_batch_nnz,
        heavy_tailed,
        iter_heavy_tailed,
        iter_heavy_tailed_alto,
    )
    from .heavy_tailed_kernels import INV_CDF_KNOTS, VALUE_CODES
    from .poisson_cp import PlantedPoisson, PlantedPoissonGenerator, planted_poisson
    from .presets import PRESETS, VALUE_KINDS
    from .sparse_cp import PlantedCP, planted_cp
    from .tns_writer import format_tns, write_tns

# loaded on first use (PEP 562): the command line reads ``presets`` alone, without the numba
# kernels of the generators
_LAZY = {
    "PlantedDense": ".dense_cp",
    "planted_dense": ".dense_cp",
    "planted_dense_factors": ".dense_cp",
    "write_planted_dense": ".dense_cp",
    "PlantedFastTucker": ".fasttucker",
    "planted_fasttucker": ".fasttucker",
    "DEFAULT_BATCH_NNZ": ".heavy_tailed_generator",
    "DENSE_BOX_CELLS": ".heavy_tailed_generator",
    "MAX_AUTO_BATCH_NNZ": ".heavy_tailed_generator",
    "VALUE_KINDS": ".presets",
    "HeavyTailedGenerator": ".heavy_tailed_generator",
    "default_batch_nnz": ".heavy_tailed_generator",
    "heavy_tailed": ".heavy_tailed_generator",
    "iter_heavy_tailed": ".heavy_tailed_generator",
    "iter_heavy_tailed_alto": ".heavy_tailed_generator",
    "INV_CDF_KNOTS": ".heavy_tailed_kernels",
    "VALUE_CODES": ".heavy_tailed_kernels",
    "PRESETS": ".presets",
    "PlantedPoisson": ".poisson_cp",
    "PlantedPoissonGenerator": ".poisson_cp",
    "planted_poisson": ".poisson_cp",
    "PlantedCP": ".sparse_cp",
    "planted_cp": ".sparse_cp",
    "format_tns": ".tns_writer",
    "write_tns": ".tns_writer",
}

__all__ = [
    "DEFAULT_BATCH_NNZ",
    "DENSE_BOX_CELLS",
    "INV_CDF_KNOTS",
    "MAX_AUTO_BATCH_NNZ",
    "PRESETS",
    "VALUE_CODES",
    "VALUE_KINDS",
    "HeavyTailedGenerator",
    "PlantedCP",
    "PlantedDense",
    "PlantedFastTucker",
    "PlantedPoisson",
    "PlantedPoissonGenerator",
    "default_batch_nnz",
    "format_tns",
    "heavy_tailed",
    "iter_heavy_tailed",
    "iter_heavy_tailed_alto",
    "planted_cp",
    "planted_dense",
    "planted_dense_factors",
    "planted_fasttucker",
    "planted_poisson",
    "write_planted_dense",
    "write_tns",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
