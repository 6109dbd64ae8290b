"""The input of the MTTKRP-based families (CP-ALS, CP-APR): a store or dense array opened once, and its
MTTKRP graph on the cluster."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
from distributed import Client

from ...execution import MTTKRPGraph
from ...execution.dense_graph import DenseMTTKRPGraph
from ...execution.inline import is_inline
from ...store import Store, open_store, paths
from ...store.dense import DenseArray, is_dense_array, open_dense

log = logging.getLogger(__name__)


def open_input(x: Store | DenseArray | str | os.PathLike | np.ndarray) -> Store | DenseArray:
    """The CP-ALS input: a BLCO store (a path or URL; a versioned store folder means its latest
    version, ``FOLDER@vN`` version N), or a dense array (a Zarr array path, URL or ``zarr.Array``,
    a Dask array, a NumPy array) as a :class:`~tensorflow_ooc.store.dense.DenseArray`."""
    if isinstance(x, (Store, DenseArray)):
        return x
    if isinstance(x, (str, os.PathLike)):
        x = paths.resolve_version(x)
        return open_dense(x) if is_dense_array(x) else open_store(x)
    return open_dense(x)


def open_graph(
    c: Client,
    store: Store | DenseArray,
    params: dict,
    run: Any,
    *,
    rank: int,
    dtype: str,
    samples: int,
    load: bool = True,
    sampler: str = "sts",
    keep_target: bool = False,
    memo_pairs: bool = False,
) -> MTTKRPGraph:
    """The MTTKRP graph of a sparse store or a dense array under ``run`` (its execution, partitions,
    device and device options); records its choices in ``params``. A dense array's ||X||^2 is
    computed here. ``keep_target``: the mode update reads the target mode's old rows (see
    :class:`~tensorflow_ooc.execution.MTTKRPGraph`). ``memo_pairs``: the graph's sweeps may memoize
    mode pairs (exact CP-ALS; see :func:`~tensorflow_ooc.execution.memory_plan.candidates`)."""
    dense = store.dense
    graph_of = DenseMTTKRPGraph if dense else MTTKRPGraph
    graph = graph_of(
        c,
        store,
        execution=run.execution,
        partitions=run.partitions,
        device=run.device,
        device_options=run.device_options,
        rank=rank,
        dtype=dtype,
        samples=samples,
        **({} if dense else {"load": load, "sampler": sampler, "keep_target": keep_target, "memo_pairs": memo_pairs}),
    )
    params["execution"] = graph.execution
    params["in_place_updates"] = graph.in_place
    if graph.memory_plan is not None:
        params["memory_plan"] = graph.memory_plan.as_dict()
    params["device"] = graph.device
    params["scheduler"] = "inline" if is_inline(c) else "dask"
    if dense:
        # ||X||^2 and the NaN/Inf check in one pass over the chunks, before anything is written
        store.set_norm_sq(graph.scan())
        params["input_kind"] = f"dense {store.kind} array"
    return graph


def plan_graph(graph: MTTKRPGraph, params: dict, owner: bool, in_place: bool) -> None:
    """Plan ``graph`` for owner-computes (``owner``; its updates ``in_place`` or not) or for per-mode
    task graphs, recording the plan in ``params``, and load the partitions kept in memory."""
    if owner:
        graph.plan_owner_computes()
        params["execution"] = graph.execution
        params["in_place_updates"] = in_place
        if graph.memory_plan is not None:
            params["memory_plan"] = graph.memory_plan.as_dict()
    else:
        graph.require_plan()
    if graph.execution == "in-memory" and graph.data is None and not owner:
        graph.load()
