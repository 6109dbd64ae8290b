"""tensorflow_ooc: out-of-core sparse tensor decomposition on BLCO Zarr stores.

Public API
----------
convert(source, store, ...) -> Store
    Any supported input (FROSTT .tns/.tns.gz, COO arrays, sparse.COO, scipy.sparse, pyttb.sptensor)
    to a BLCO Zarr store, in memory or out of core.
rewrite(old, new, ...) -> Store
    A store of an older format version (or another compression, chunking, value dtype) written
    again in the current format (keeping the source's mode-sorted copies).
build_mode_copies(store, modes="auto") -> Store
    Per mode, the nonzeros with each work item sorted by that mode, kept in the store: streamed
    MTTKRP then runs the in-memory path's run-table kernel (``tfooc mode-copies``).
build_fiber_index(store, modes="all", ...) -> FiberIndex
    Per mode, the nonzeros ordered by fiber in the store, so randomized CP and rTT-ALS read only
    the sampled fibers (built out of core; ``tfooc fiber-index``).
open_store(path) -> Store
    Open and validate a store (local path or fsspec URL); a versioned store folder (a workflow's
    ``append: true`` output) opens its latest version, ``FOLDER@vN`` version N.
encode_coo(coords, values, shape) -> BLCOTensor
    BLCO construction in memory.
mttkrp(tensor, factors, mode) -> ndarray
    MTTKRP for any mode of a store (streamed through the fast chunk reader) or in-memory BLCO tensor.
StackedFactors(shape, rank)
    Factor matrices in one array, as the MTTKRP kernels read them (a list is stacked per call).
cp_als(store, rank, ...) -> CPResult
    CP-ALS as iterated Dask graph reductions (embedded LocalCluster by default), of a BLCO store or
    of a dense Zarr, Dask or NumPy array (streamed chunk by chunk).
cp_apr(store, rank, algorithm="mu" | "pdnr", ...) -> PoissonResult
    CP-APR: nonnegative CP of count data by Poisson maximum likelihood (pyttb's cp_apr), streamed
    or in memory, on the same Dask passes.
open_dense(array) -> DenseArray
    A dense tensor (Zarr array path or URL, Dask or NumPy array) as CP-ALS reads it, validated.
ttm(tensor, matrix, mode) -> SemiSparse, ttm_chain(tensor, matrices, skip) -> SemiSparse
    Sparse tensor times matrix (and all modes but one), kernel chosen by tensor features.
tucker_hooi(store, ranks, ...) -> TuckerResult
    Tucker HOOI of a store: semi-sparse TTM chains over Dask partitions, pyttb's tucker_als conventions.
tucker_sgd(store, ranks, core_rank, ...) -> FastTuckerResult
    FastTuckerPlus tensor completion by SGD: test RMSE/MAE per epoch, ``result.predict(coords)``.
tt_als(store, ranks, ...) -> TTResult
    Tensor-train ALS of a store: exact core updates contracted at the nonzeros, orthonormal sweeps.
synthetic
    Heavy-tailed and planted low-rank test tensors.

Importing the package is quick: each name above loads its stage (numba, Dask, Zarr) when it is
first used, so ``tfooc --help``, ``status`` or ``logs`` do not pay for what they do not run.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any, Callable

# numba's CPU target is set before anything compiles a kernel (the stages load after this)
from .cpu_target import configure_numba_target
from .errors import (
    CorruptStoreError,
    DenseArrayError,
    DuplicateError,
    EmptyTensorError,
    ForeignStoreError,
    IncompleteStoreError,
    IndexRangeError,
    IngestError,
    NonFiniteValueError,
    ParseError,
    ShapeError,
    StoreError,
    StoreExistsError,
    TfoocError,
    ValueRangeError,
)
from .version import __version__

configure_numba_target()

if TYPE_CHECKING:  # what the lazy names below are, for type checkers, editors and the import contract
    from .decompositions import (
        CompletionError,
        CPResult,
        FastTuckerResult,
        PoissonResult,
        TTResult,
        TuckerResult,
        cp_als,
        cp_apr,
        load_fasttucker_result,
        load_result,
        load_tucker,
        tt_als,
        tucker_hooi,
        tucker_sgd,
    )
    from .execution.mode_copies_build import build_mode_copies, rewrite
    from .execution.stream import mttkrp
    from .format import BitLayout, BLCOTensor, encode_coo
    from .ingest import build_fiber_index, convert
    from .kernels.factors import StackedFactors
    from .kernels.ttm.chain import SemiSparse, ttm, ttm_chain
    from .store import Store
    from .store.dense import DenseArray, open_dense

# the public names each stage gives, imported when first used (PEP 562): importing numba, Dask and
# Zarr with the package cost every command line about 1.5 s, `tfooc --version` included
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "CompletionError",
            "CPResult",
            "FastTuckerResult",
            "TTResult",
            "TuckerResult",
            "cp_als",
            "cp_apr",
            "PoissonResult",
            "load_fasttucker_result",
            "load_result",
            "load_tucker",
            "tt_als",
            "tucker_hooi",
            "tucker_sgd",
        ),
        ".decompositions",
    ),
    "mttkrp": ".execution.stream",
    **dict.fromkeys(("BitLayout", "BLCOTensor", "encode_coo"), ".format"),
    **dict.fromkeys(("build_fiber_index", "convert"), ".ingest"),
    **dict.fromkeys(("build_mode_copies", "rewrite"), ".execution.mode_copies_build"),
    "StackedFactors": ".kernels.factors",
    **dict.fromkeys(("SemiSparse", "ttm", "ttm_chain"), ".kernels.ttm.chain"),
    "Store": ".store",
    **dict.fromkeys(("DenseArray", "open_dense"), ".store.dense"),
}

__all__ = [
    "BitLayout",
    "BLCOTensor",
    "CPResult",
    "cp_als",
    "cp_apr",
    "PoissonResult",
    "load_result",
    "CorruptStoreError",
    "DuplicateError",
    "EmptyTensorError",
    "ForeignStoreError",
    "IncompleteStoreError",
    "IndexRangeError",
    "IngestError",
    "NonFiniteValueError",
    "ParseError",
    "ShapeError",
    "Store",
    "StoreError",
    "StoreExistsError",
    "TfoocError",
    "ValueRangeError",
    "__version__",
    "convert",
    "rewrite",
    "build_fiber_index",
    "build_mode_copies",
    "encode_coo",
    "mttkrp",
    "open_store",
    "StackedFactors",
    "SemiSparse",
    "ttm",
    "ttm_chain",
    "TuckerResult",
    "load_tucker",
    "tucker_hooi",
    "DenseArray",
    "DenseArrayError",
    "open_dense",
    "CompletionError",
    "FastTuckerResult",
    "load_fasttucker_result",
    "tucker_sgd",
    "TTResult",
    "tt_als",
]


def __getattr__(name: str) -> Any:
    """A public name's stage, imported on first use; a subpackage (``tfo.synthetic``) likewise."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def open_store(path: str | os.PathLike) -> Store:
    """Open and validate a BLCO store: a local path or an fsspec URL.

    A versioned store folder (one holding ``versions.json``, as a workflow's convert step with
    ``append: true`` writes: ``v000001.zarr``, ``v000002.zarr``, ...) opens its latest version;
    ``FOLDER@vN`` opens version N.

    Parameters
    ----------
    path : str or os.PathLike
        The store, a versioned store folder, or ``FOLDER@vN``.

    Returns
    -------
    Store
        The opened store (``store.path`` is the version's own path for a versioned folder).

    Raises
    ------
    StoreError
        A foreign, incomplete or corrupt store, a missing path, or a version the folder does not
        hold (the message lists those it holds).
    """
    from .store import open_store as open_one
    from .store import paths

    return open_one(paths.resolve_version(path))


def _attach_monitoring(client: Any, storage: str | None = None) -> None:
    """The tfooc dashboard page and metrics on a cluster's scheduler (:mod:`.monitoring`).

    Registered here, at the top, with the hooks the lower stages offer: execution and workflow
    never import monitoring (it reads the workflow's run records), and monitoring is loaded only
    when a cluster starts (importing it with the package cost about 1.3 s of every startup)."""
    from .monitoring import attach

    attach(client, storage=storage)


def _register_monitoring(cluster: Any) -> None:
    if _attach_monitoring not in cluster.ON_CLIENT:
        cluster.ON_CLIENT.append(_attach_monitoring)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``hook(module)`` right after the module ``name`` is first imported, whoever imports it.

    The execution stage offers ``cluster.ON_CLIENT`` for the monitoring page; registering there
    when the package is imported would load Dask with it. A finder that steps aside once it has
    wrapped the module's loader registers it when the cluster module loads instead (a user's
    ``from tensorflow_ooc.execution import get_client`` included), and costs nothing until then.
    """

    def __init__(self, name: str, hook: Callable[[Any], None]) -> None:
        self.name, self.hook = name, hook

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once, and the search below must not come back here
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, self.hook)
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    """A module's own loader, then the hook; the module keeps its own loader afterwards."""

    def __init__(self, loader: Any, hook: Callable[[Any], None]) -> None:
        self.loader, self.hook = loader, hook

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.hook(module)


_CLUSTER_MODULE = f"{__name__}.execution.cluster"
if _CLUSTER_MODULE in sys.modules:  # loaded already (a reload of this package)
    _register_monitoring(sys.modules[_CLUSTER_MODULE])
elif not any(isinstance(f, _AfterImport) and f.name == _CLUSTER_MODULE for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport(_CLUSTER_MODULE, _register_monitoring))
