"""The Tucker HOOI mode update, as small functions the Dask workers run.

For mode ``n`` the TTM chain gives ``Y = X x_{m != n} U_m^T`` as a semi-sparse matrix ``Y_(n)``:
``F`` non-empty rows (slices of mode ``n``) by ``P = prod_{m != n} J_m`` columns. The new factor
is its ``J_n`` leading left singular vectors, found from the ``F x P`` block alone (empty slices
get zero rows):

- ``"gram"``: an eigendecomposition of the smaller Gram matrix. When ``F <= P`` that is
  ``Y Y^T`` restricted to the non-empty rows (what pyttb's ``nvecs`` does on the whole
  ``I_n x I_n`` Gram); otherwise ``Y^T Y`` (``P x P``), whose leading eigenvectors ``V`` give the
  subspace ``Y V``, from which one Rayleigh-Ritz step (QR of ``Y V``, SVD of ``Q^T Y``) takes the
  left singular vectors without the squared condition number of ``Y V / sigma``.
- ``"randomized"``: a randomized range finder (Halko, Martinsson & Tropp 2011): ``J_n + 10``
  Gaussian test vectors, two power iterations with QR between them, and the SVD of ``Q^T Y``.
- ``"auto"`` (default): ``"gram"`` when ``min(F, P) <= GRAM_MAX`` (an eigendecomposition of at
  most 2048 x 2048, well under a second), else ``"randomized"``, whose cost grows with ``F P J``
  instead of ``F P min(F, P)`` and the cubic eigensolver.

Columns are signed as pyttb's ``nvecs`` signs them (the largest entry of each column positive).
After the last mode the core ``G = U_N^T Y_(N)`` and its squared norm (for the fit) are kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg

from ...blas_threads import one_blas_thread
from ...execution.ttm_graph import TTMPartial, merge_partials
from ..common.model_checks import check_seed

SVD_METHODS = ("auto", "gram", "randomized")
GRAM_MAX = 2048
OVERSAMPLE = 10
POWER_ITERATIONS = 2


@dataclass
class TuckerState:
    """The model between mode updates, as it lives on the cluster.

    ``factors[n]`` is ``U_n`` (``I_n x J_n``), None for a mode not yet computed (pyttb does not
    initialize the first mode: the first update replaces it before it is used). After the last
    mode of an iteration, ``core`` and ``core_norm2`` hold ``G`` and ``||G||^2``."""

    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    factors: list[np.ndarray | None]
    core: np.ndarray | None = None
    core_norm2: float = 0.0
    finished: dict[int, float] = field(default_factory=dict)
    timings: dict[int, tuple[float, float, float]] = field(default_factory=dict)  # mode -> (TTM, SVD, layout s)
    methods: dict[int, str] = field(default_factory=dict)  # mode -> SVD method used
    rows: dict[int, int] = field(default_factory=dict)  # mode -> non-empty slices

    def chain_factors(self, mode: int) -> list[np.ndarray]:
        """The factors a mode-``mode`` TTM chain multiplies by: ``factors`` with the skipped mode
        (possibly not yet computed) as an empty ``I_n x J_n`` stand-in, never read."""
        out = list(self.factors)
        if out[mode] is None:
            out[mode] = np.zeros((self.shape[mode], self.ranks[mode]))
        return out


@dataclass
class TuckerSummary:
    """The small part of a state the driver reads once per iteration."""

    core_norm2: float
    finished: dict[int, float]
    timings: dict[int, tuple[float, float, float]]
    methods: dict[int, str]
    rows: dict[int, int]


def summary(state: TuckerState) -> TuckerSummary:
    return TuckerSummary(
        state.core_norm2, dict(state.finished), dict(state.timings), dict(state.methods), dict(state.rows)
    )


def random_init(shape: Sequence[int], ranks: Sequence[int], seed: int | None) -> TuckerState:
    """pyttb's ``init="random"``: uniform [0, 1) factors for every mode but the first, drawn mode
    by mode from one generator (reproducible by seed); the first is computed before it is used."""
    rng = np.random.default_rng(check_seed(seed))
    factors: list[np.ndarray | None] = [None]
    factors += [rng.random((int(shape[n]), int(ranks[n]))) for n in range(1, len(shape))]
    return TuckerState(tuple(shape), tuple(ranks), factors)


def given_init(
    shape: Sequence[int], ranks: Sequence[int], factors: Sequence[np.ndarray | None], core: np.ndarray | None = None
) -> TuckerState:
    """Initial state from given factors (the first may be None, as in pyttb), or from a
    checkpoint's factors and core."""
    state = TuckerState(
        tuple(shape), tuple(ranks), [None if f is None else np.array(f, dtype=np.float64) for f in factors]
    )
    if core is not None:
        state.core = np.array(core, dtype=np.float64)
        state.core_norm2 = float(np.vdot(state.core, state.core))
    return state


def flip_signs(U: np.ndarray) -> np.ndarray:
    """Each column's largest-magnitude entry made positive (pyttb's ``nvecs(flipsign=True)``)."""
    if U.size == 0:
        return U
    idx = np.argmax(np.abs(U), axis=0)
    signs = np.where(U[idx, np.arange(U.shape[1])] < 0, -1.0, 1.0)
    return U * signs


def choose_method(F: int, P: int, method: str = "auto") -> str:
    """The SVD method for an ``F x P`` block (see the module docstring)."""
    if method != "auto":
        return method
    return "gram" if min(F, P) <= GRAM_MAX else "randomized"


def _rayleigh_ritz(B: np.ndarray, V: np.ndarray, k: int) -> np.ndarray:
    """Left singular vectors of ``B`` within the span of ``B V``: QR, then an SVD of ``Q^T B``."""
    Q, _ = np.linalg.qr(B @ V)
    Ub, _, _ = np.linalg.svd(Q.T @ B, full_matrices=False)
    return Q @ Ub[:, :k]


def leading_left_vectors(
    B: np.ndarray, k: int, method: str = "auto", seed: Sequence[int] = (0,)
) -> tuple[np.ndarray, str]:
    """The ``k`` (``<= min(F, P)``) leading left singular vectors of the ``F x P`` block ``B``,
    and the method used. ``seed`` seeds the randomized range finder's test vectors."""
    F, P = B.shape
    method = choose_method(F, P, method)
    if k == 0:
        return np.zeros((F, 0)), method
    if method == "gram":
        if F <= P:
            _, V = scipy.linalg.eigh(B @ B.T, subset_by_index=(F - k, F - 1), check_finite=False)
            return V[:, ::-1], method
        _, V = scipy.linalg.eigh(B.T @ B, subset_by_index=(P - k, P - 1), check_finite=False)
        return _rayleigh_ritz(B, V[:, ::-1], k), method
    if method != "randomized":
        raise ValueError(f"svd must be one of {SVD_METHODS}, got {method!r}")
    rng = np.random.default_rng(np.random.SeedSequence([int(s) for s in seed]))
    ell = min(k + OVERSAMPLE, F, P)
    Q, _ = np.linalg.qr(B @ rng.standard_normal((P, ell)))
    for _ in range(POWER_ITERATIONS):
        Q, _ = np.linalg.qr(B.T @ Q)
        Q, _ = np.linalg.qr(B @ Q)
    Ub, _, _ = np.linalg.svd(Q.T @ B, full_matrices=False)
    return Q @ Ub[:, :k], method


def complete_basis(U: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Columns ``k..`` of ``U`` (``I_n x J_n``, columns ``< k`` orthonormal) filled with an
    orthonormal completion, for ranks above the rank of ``Y_(n)`` (fewer non-empty slices, or fewer
    columns ``P``, than ``J_n``): first within the non-empty rows (seeded Gaussian vectors
    orthogonalized against the others), then unit vectors on empty slices. These directions add
    nothing to the core; any orthonormal completion is a solution."""
    J = U.shape[1]
    rng = np.random.default_rng(0)
    F = rows.shape[0]
    within = min(J, F) - k
    if within > 0:
        sub = U[rows, :k]
        G = rng.standard_normal((F, within))
        for _ in range(2):  # twice is enough (Kahan-Parlett)
            G -= sub @ (sub.T @ G)
            G, _ = np.linalg.qr(G)
        U[rows, k : k + within] = G
        k += within
    if k < J:
        empty = np.setdiff1d(np.arange(U.shape[0]), rows)[: J - k]
        U[empty, np.arange(k, k + empty.shape[0])] = 1.0
    return U


def update_factor(
    state: TuckerState,
    partials: TTMPartial | Sequence[TTMPartial],
    mode: int,
    last_mode: bool,
    svd: str = "auto",
    seed: Sequence[int] = (0,),
) -> TuckerState:
    """One HOOI mode update, as one task: merge the last level of the TTM reduction, take the
    leading ``J_n`` left singular vectors of ``Y_(n)`` as ``U_n`` (zero rows for empty slices),
    and after the last mode the core ``G = U_N^T Y_(N)``. Returns a new state (earlier futures
    stay valid, which Dask's recomputation after a lost worker relies on)."""
    t0 = time.perf_counter()
    parts = [partials] if isinstance(partials, TTMPartial) else list(partials)
    y = merge_partials(*parts).y if len(parts) > 1 else parts[0].y
    rows = np.asarray(y.index[:, 0], dtype=np.int64)
    B = np.asarray(y.block, dtype=np.float64)
    I_n, J_n = state.shape[mode], state.ranks[mode]
    k = min(J_n, *B.shape)
    # small problems on one BLAS thread: its spinning threads would take cores from the numba
    # TTM kernels that follow (as in the CP-ALS update); large ones use them all
    with one_blas_thread(B.size < (1 << 20)):
        Ur, method = leading_left_vectors(B, k, svd, seed)
        U = np.zeros((I_n, J_n))
        U[rows, :k] = flip_signs(Ur)
        if k < J_n:
            U = complete_basis(U, rows, k)
        out = TuckerState(
            state.shape,
            state.ranks,
            list(state.factors),
            state.core,
            state.core_norm2,
            {**state.finished},
            {**state.timings},
            {**state.methods},
            {**state.rows},
        )
        out.factors[mode] = U
        if last_mode:
            G = U[rows].T @ B  # J_N x prod_{m < N} J_m, C order over modes 0..N-2
            out.core = np.moveaxis(G.reshape((J_n,) + tuple(state.ranks[:mode])), 0, -1).copy()
            out.core_norm2 = float(np.vdot(G, G))
    out.finished[mode] = time.time()
    out.timings[mode] = (max(p.seconds for p in parts), time.perf_counter() - t0, max(p.layout_seconds for p in parts))
    out.methods[mode] = method
    out.rows[mode] = int(rows.shape[0])
    return out


def core_of(state: TuckerState) -> np.ndarray:
    return state.core


def factor_of(state: TuckerState, mode: int) -> np.ndarray:
    return state.factors[mode]


# --- nvecs initialization -----------------------------------------------------------------------


def nvecs(coords: np.ndarray, values: np.ndarray, shape: Sequence[int], mode: int, rank: int) -> np.ndarray:
    """pyttb's ``sptensor.nvecs(mode, rank)``: the ``rank`` leading eigenvectors of
    ``X_(n) X_(n)^T``, each column's largest entry positive. ``X_(n)`` is built as a sparse
    ``I_n x F`` matrix over the non-empty mode-``n`` fibers only (so no index spans the product
    of the other mode lengths); the Gram matrix is sparse ``I_n x I_n``, solved densely up to
    ``GRAM_MAX`` rows and by ARPACK (``eigsh``) above, as pyttb does for ``rank < I_n - 1``."""
    N = coords.shape[1]
    others = [m for m in range(N) if m != mode]
    I_n = int(shape[mode])
    if coords.shape[0] == 0:
        cols = np.zeros(0, dtype=np.int64)
        nfib = 0
    else:
        _, cols = np.unique(coords[:, others], axis=0, return_inverse=True)
        cols = cols.ravel()
        nfib = int(cols.max()) + 1
    Xn = scipy.sparse.csr_matrix((np.asarray(values, dtype=np.float64), (coords[:, mode], cols)), shape=(I_n, nfib))
    gram = (Xn @ Xn.T).tocsr()
    if I_n <= GRAM_MAX or rank >= I_n - 1:
        _, V = scipy.linalg.eigh(gram.toarray(), subset_by_index=(I_n - rank, I_n - 1), check_finite=False)
    else:
        v0 = np.random.default_rng(0).standard_normal(I_n)  # ARPACK's start vector, seeded
        w, V = scipy.sparse.linalg.eigsh(gram, k=rank, which="LA", v0=v0)
        V = V[:, np.argsort(w)]
    return flip_signs(np.ascontiguousarray(V[:, ::-1]))


def nvecs_init(path: str, shape: Sequence[int], ranks: Sequence[int]) -> TuckerState:
    """pyttb's ``init="nvecs"``: ``nvecs`` factors for every mode but the first. Runs as one task
    that reads the store's nonzeros (in memory, as pyttb holds them)."""
    from ...store import open_store

    coords, values = open_store(path).to_coo()
    factors: list[np.ndarray | None] = [None]
    factors += [nvecs(coords, values, shape, n, int(ranks[n])) for n in range(1, len(shape))]
    return TuckerState(tuple(shape), tuple(ranks), factors)
