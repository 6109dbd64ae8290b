"""tensorflow_ooc: out-of-core sparse tensor decomposition on BLCO Zarr stores.

Public API
----------
convert(source, store, ...) -> Store
    Any supported input (FROSTT .tns/.tns.gz, COO arrays, sparse.COO, scipy.sparse, pyttb.sptensor)
    to a BLCO Zarr store, in memory or out of core.
rewrite(old, new, ...) -> Store
    A store of an older format version (or another compression, chunking, value dtype) written
    again in the current format.
open_store(path) -> Store
    Open and validate a store (local path or fsspec URL).
encode_coo(coords, values, shape) -> BLCOTensor
    BLCO construction in memory.
mttkrp(tensor, factors, mode) -> ndarray
    MTTKRP for any mode of a store (streamed through the fast chunk reader) or in-memory BLCO tensor.
StackedFactors(shape, rank)
    Factor matrices in one array, as the MTTKRP kernels read them (a list is stacked per call).
cp_als(store, rank, ...) -> CPResult
    CP-ALS as iterated Dask graph reductions (embedded LocalCluster by default), of a BLCO store or
    of a dense Zarr, Dask or NumPy array (streamed chunk by chunk).
open_dense(array) -> DenseArray
    A dense tensor (Zarr array path or URL, Dask or NumPy array) as CP-ALS reads it, validated.
ttm(tensor, matrix, mode) -> SemiSparse, ttm_chain(tensor, matrices, skip) -> SemiSparse
    Sparse tensor times matrix (and all modes but one), kernel chosen by tensor features.
tucker_hooi(store, ranks, ...) -> TuckerResult
    Tucker HOOI of a store: semi-sparse TTM chains over Dask partitions, pyttb's tucker_als conventions.
tucker_sgd(store, ranks, core_rank, ...) -> FastTuckerResult
    FastTuckerPlus tensor completion by SGD: test RMSE/MAE per epoch, ``result.predict(coords)``.
synthetic
    Heavy-tailed and planted low-rank test tensors.
"""

# numba's CPU target is set before anything compiles a kernel
from .cpu_target import configure_numba_target
from .version import __version__

configure_numba_target()

from .decompositions import (
    CompletionError,
    CPResult,
    FastTuckerResult,
    TuckerResult,
    cp_als,
    load_fasttucker_result,
    load_result,
    load_tucker,
    tucker_hooi,
    tucker_sgd,
)
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
from .execution.stream import mttkrp
from .format import BitLayout, BLCOTensor, encode_coo
from .ingest import convert, rewrite
from .kernels.factors import StackedFactors
from .kernels.ttm.chain import SemiSparse, ttm, ttm_chain
from .store import Store, open_store
from .store.dense import DenseArray, open_dense

__all__ = [
    "BitLayout",
    "BLCOTensor",
    "CPResult",
    "cp_als",
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
    "encode_coo",
    "mttkrp",
    "open_store",
    "rewrite",
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
]


def _attach_monitoring(client, storage: str | None = None) -> None:
    """The tfooc dashboard page and metrics on a cluster's scheduler (:mod:`.monitoring`).

    Registered here, at the top, with the hooks the lower stages offer: execution and workflow
    never import monitoring (it reads the workflow's run records), and monitoring is loaded only
    when a cluster starts (importing it with the package cost about 1.3 s of every startup)."""
    from .monitoring import attach

    attach(client, storage=storage)


def _register_monitoring() -> None:
    from .execution import cluster

    if _attach_monitoring not in cluster.ON_CLIENT:
        cluster.ON_CLIENT.append(_attach_monitoring)


_register_monitoring()
