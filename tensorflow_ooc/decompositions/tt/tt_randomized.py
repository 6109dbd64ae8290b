"""Randomized TT-ALS: the sketched least-squares update of one core (seed 000, sections 5.2.2-5.4).

The update of core ``j`` solves ``min ||(A_{<j} (x) A_{>j}^T) G - mat(X, j)^T||`` for ``G``
(``R_{j-1} R_j`` columns, ``I_j`` right-hand sides). With the chains orthonormal the design's
leverage scores are its squared row norms, drawn by :mod:`~tensorflow_ooc.kernels.sampling.tt_sampler`;
the sketched problem keeps ``J`` rows ``(s, t)`` weighted by ``1 / sqrt(J p_s p_t)``. Its normal
equations are

    (D^T W D) G = D^T W X_sampled,     D[(s,t)] = kron(L(s), Rt(t)),  W = diag(counts / (J p)),

and the right-hand side is a *sampled MTTKRP*: row ``i`` of core ``j`` gets
``sum_(s,t) w X[s, i, t] d_(s,t)`` over the nonzeros of the sampled mode-``j`` fibers ``X[s, :, t]``,
which the CP sampler's fiber gather finds (:func:`~tensorflow_ooc.execution.tasks.sampled_partition`,
a per-mode :class:`~tensorflow_ooc.kernels.sampling.fiber_gather.FiberIndex` kept beside each
decoded partition): ``O(J log nnz + fiber nonzeros)``, independent of the tensor's size, where the
exact update reads every nonzero. The Gram is ``R_{j-1} R_j`` square, solved once for all rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numba as nb
import numpy as np

from ...blas_threads import one_blas_thread
from ...execution.partitions import plan_partitions
from ...execution.stream import BatchBuffers, fill_batch
from ...execution.tasks import PartitionData, sampled_partition
from ...kernels.mttkrp.dispatch import numba_threads
from ...kernels.sampling.krp_sampler import SampleSet, psd_pinv
from ...kernels.sampling.tt_sampler import CoreTree, chain_trees, check_cores, draw_core_samples
from ...kernels.tt.cores import TTCores
from ...store import Store

FiberSource = Store | PartitionData | Sequence[PartitionData]


# Draws of at most this many walk steps (draws times chain cores) and their fiber gathers run on one
# numba thread: a draw is a dozen parallel loops of 0.1-1 ms, each waiting for its slowest thread,
# and a thread that lost its core to another process held every loop up (65536 draws, uber-shaped,
# order 4, 2 cores shared: draws 0.65 s a sweep on 2 threads, 0.11 s on one; gathers 0.17 -> 0.06 s;
# on free cores 11 against 18 ms a draw). The draws are the same for any thread count.
DRAW_ONE_THREAD_STEPS = 1 << 20


def sketch_threads(samples: int, nmodes: int, threads: int | None) -> int | None:
    """The numba threads of an update's draws and fiber gathers: one up to
    :data:`DRAW_ONE_THREAD_STEPS` walk steps (one per draw and chain core), else ``threads``."""
    return 1 if samples * (nmodes - 1) <= DRAW_ONE_THREAD_STEPS else threads


def load_fibers(store: Store, max_nnz: int | None = None) -> list[PartitionData]:
    """A store's nonzeros decoded into memory for repeated sketched solves: partitions of at most
    ``max_nnz`` nonzeros (one by default), each keeping the fiber index of every mode it is
    asked for (built on first use, 16-24 bytes a nonzero per mode)."""
    out = []
    for part in plan_partitions(store, 1, max_nnz):
        bufs = BatchBuffers(store, part.chunk_hi - part.chunk_lo)
        items = fill_batch(store, range(part.chunk_lo, part.chunk_hi), bufs, delta=False)
        out.append(PartitionData(part, store.layout, items))
    return out


def _partitions(source: FiberSource) -> list[PartitionData]:
    if isinstance(source, Store):
        return load_fibers(source)
    if isinstance(source, PartitionData):
        return [source]
    return list(source)


def sketched_rhs(source: FiberSource, samples: SampleSet, rows: int) -> np.ndarray:
    """The sketched right-hand side ``M[i] = sum_s weights[s] X[s with mode j = i] rows[s]``
    (``rows`` x ``R_{j-1} R_j``) for the sampled design rows ``samples`` of core ``j = samples.mode``.

    Parameters
    ----------
    source : Store, PartitionData or sequence of PartitionData
        The tensor: a store (decoded here, its fiber index built and thrown away) or partitions
        from :func:`load_fibers` (their fiber indexes kept for the next solve of the same mode).
    samples : SampleSet
        From :func:`~tensorflow_ooc.kernels.sampling.tt_sampler.draw_core_samples`.
    rows : int
        ``I_j``.
    """
    out = np.zeros((rows, samples.ncols))
    for data in _partitions(source):
        p = sampled_partition(data, samples, samples.mode, threads=nb.get_num_threads())
        p.add_into(out)
    return out


def solve_sketched(samples: SampleSet, rhs: np.ndarray, ranks: tuple[int, int]) -> np.ndarray:
    """Core ``j`` (R_{j-1}, I_j, R_j) from the sketched normal equations: ``rhs`` (I_j, R_{j-1} R_j)
    times the pseudo-inverse of the sketched Gram ``rows^T diag(weights) rows``.

    The pseudo-inverse (eigenvalues below ``1e-12`` of the largest dropped,
    :func:`~tensorflow_ooc.kernels.sampling.krp_sampler.psd_pinv`) gives the minimum-norm solution
    where too few distinct rows were drawn to span the design; with enough draws the Gram is near
    the identity (orthonormal design) and the solve is well conditioned."""
    Ra, Rb = ranks
    return np.ascontiguousarray(sketched_slices(samples, rhs).reshape(rhs.shape[0], Ra, Rb).transpose(1, 0, 2))


def sketched_slices(samples: SampleSet, rhs: np.ndarray, gram_pinv: np.ndarray | None = None) -> np.ndarray:
    """:func:`solve_sketched` in the right-hand side's layout: row ``i`` (I_j, R_{j-1} R_j) is the new
    core's slice ``i`` (what the state stores; the core's layout costs two copies of it).
    ``gram_pinv``: :func:`sketched_gram_pinv` of ``samples`` where the caller formed it already."""
    return rhs @ (sketched_gram_pinv(samples) if gram_pinv is None else gram_pinv)


def sketched_gram_pinv(samples: SampleSet) -> np.ndarray:
    """The pseudo-inverse of the sketched Gram ``rows^T diag(weights) rows`` (it depends on the draws
    only, so it can be formed while their fibers are gathered)."""
    # the Gram's loop over the draws is short: one numba thread, as for the draws (2 threads took
    # 14 ms against 0.6 a nell2-shaped R 8 Gram where another process held a core)
    with numba_threads(1 if samples.coords.shape[0] <= DRAW_ONE_THREAD_STEPS else None):
        G = samples.gram()
    with one_blas_thread():  # an (R^2, R^2) eigendecomposition: tiny
        Gp, _ = psd_pinv(G)
    return Gp


def draw_core(state: TTCores, j: int, samples: int, seed: Sequence[int]) -> SampleSet:
    """The ``samples`` design rows of core ``j``'s update drawn beside the state (a task where it
    lives: only the sample set travels to the partitions), seeded by ``seed`` = (run entropy,
    sweep, update), so a resumed run draws what the uninterrupted one drew. The draw time is kept
    in the set's ``seconds``.

    Where the state keeps a ``trees`` dict (:class:`~tensorflow_ooc.decompositions.tt.tt_steps.TTState`
    does, and drops a core's entries when the core changes) the sampler trees of the cores an
    update left alone are taken from it and the new ones stored there: an update changes two
    cores, so most trees outlive it (they depend only on their core, so the draws are the same)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(np.random.SeedSequence([int(x) for x in seed]))
    cores = [state.core(k) for k in range(state.nmodes)]  # views: the trees copy what they keep
    with numba_threads(sketch_threads(int(samples), state.nmodes, None)):
        trees = chain_trees(cores, j, cache=getattr(state, "trees", None))
        out = draw_core_samples(cores, j, int(samples), rng, trees)
    out.seconds = time.perf_counter() - t0
    return out


def prepare_walks(state: TTCores, j: int, skip: set[int]) -> None:
    """Build the walk structures (:meth:`CoreTree.build_walks`) of the trees in ``state.trees`` that the
    draws for core ``j`` walk (every core of its chains but the two next to ``j``, which are drawn
    from their slice masses), except those of the cores ``skip`` (an update about to change them).
    Those trees depend only on their cores, so the draws are the same; built beside the gathers
    of the update before, they are off its critical path."""
    trees = getattr(state, "trees", None)
    if not trees:
        return
    walked = [(k, "left") for k in range(j - 1)] + [(k, "right") for k in range(j + 2, state.nmodes)]
    with numba_threads(1):
        for key in walked:
            tr = trees.get(key)
            if tr is not None and key[0] not in skip:
                tr.build_walks()


def sketched_core(
    source: FiberSource,
    cores: Sequence[np.ndarray],
    j: int,
    samples: int,
    rng: np.random.Generator,
    trees: Sequence[CoreTree | None] | None = None,
) -> np.ndarray:
    """The randomized TT-ALS update of core ``j``: the least-squares fit of the tensor by core ``j``
    with the other cores fixed, on ``samples`` rows of the design drawn by leverage scores.

    Parameters
    ----------
    source : Store, PartitionData or sequence of PartitionData
        The tensor (see :func:`sketched_rhs`; pass :func:`load_fibers` output across a sweep).
    cores : sequence of N float64 (R_{k-1}, I_k, R_k) arrays
        The tensor train; cores before ``j`` left-orthonormal, after ``j`` right-orthonormal
        (core ``j`` itself only gives the shape).
    j : int
        The core to update (0-based).
    samples : int
        Draws ``J`` of each chain (pairs ``(s, t)``; repeated pairs merged).
    rng : numpy Generator
    trees : sequence of N CoreTree or None, optional
        Left trees before ``j``, right trees after it
        (:func:`~tensorflow_ooc.kernels.sampling.tt_sampler.chain_trees`); built where missing.

    Returns
    -------
    float64 (R_{j-1}, I_j, R_j)
        The new core ``j``; rows ``i`` of core ``j`` touched by no sampled fiber are zero.
    """
    cores = check_cores(cores)
    if isinstance(source, Store):
        shape = source.shape
    else:
        parts = _partitions(source)
        shape = parts[0].layout.shape if parts else None
    if shape is not None and tuple(shape) != tuple(c.shape[1] for c in cores):
        raise ValueError(f"the cores' mode lengths {[c.shape[1] for c in cores]} do not match the tensor's {shape}")
    s = draw_core_samples(cores, j, samples, rng, trees)
    Ra, I, Rb = cores[s.mode].shape
    return solve_sketched(s, sketched_rhs(source, s, I), (Ra, Rb))
