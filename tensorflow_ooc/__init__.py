"""tensorflow_ooc: out-of-core sparse tensor decomposition on BLCO Zarr stores.

Public API
----------
convert(source, store, ...) -> Store
    Any supported input (FROSTT .tns/.tns.gz, COO arrays, sparse.COO, scipy.sparse, pyttb.sptensor)
    to a BLCO Zarr store, in memory or out of core.
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

from .version import __version__  # noqa: E402

from .cpu_target import configure_numba_target  # noqa: E402  (before anything compiles a kernel)

configure_numba_target()

from .errors import (  # noqa: E402
    CorruptStoreError, DuplicateError, EmptyTensorError, ForeignStoreError, IncompleteStoreError, IndexRangeError,
    IngestError, NonFiniteValueError, ParseError, ShapeError, StoreError, StoreExistsError, TfoocError,
)
from .format import BitLayout, BLCOTensor, encode_coo  # noqa: E402
from .ingest import convert  # noqa: E402
from .execution.stream import mttkrp  # noqa: E402
from .kernels.factors import StackedFactors  # noqa: E402
from .decompositions import CPResult, cp_als, load_result  # noqa: E402
from .decompositions import CompletionError, FastTuckerResult, load_fasttucker_result, tucker_sgd  # noqa: E402
from .store import Store, open_store  # noqa: E402
from .store.dense import DenseArray, open_dense  # noqa: E402
from .errors import DenseArrayError  # noqa: E402
from .kernels.ttm.chain import SemiSparse, ttm, ttm_chain  # noqa: E402
from .decompositions import TuckerResult, load_tucker, tucker_hooi  # noqa: E402
# the dashboard page on every embedded cluster and submission: monitoring registers itself with
# the lower stages' hooks when it is loaded (they never import it)
from . import monitoring  # noqa: E402, F401

__all__ = [
    "BitLayout", "BLCOTensor", "CPResult", "cp_als", "load_result", "CorruptStoreError", "DuplicateError", "EmptyTensorError", "ForeignStoreError",
    "IncompleteStoreError", "IndexRangeError", "IngestError", "NonFiniteValueError", "ParseError", "ShapeError",
    "Store", "StoreError", "StoreExistsError", "TfoocError", "__version__", "convert", "encode_coo", "mttkrp", "open_store",
    "StackedFactors",
    "SemiSparse", "ttm", "ttm_chain",
    "TuckerResult", "load_tucker", "tucker_hooi",
    "DenseArray", "DenseArrayError", "open_dense",
    "CompletionError", "FastTuckerResult", "load_fasttucker_result", "tucker_sgd",
]
