"""Which sparse TTM kernel to run, from features of the unfolded layout (seed 004, section 5).

The seed's features are computed on the CSR unfolding of a :class:`ModeLayout` (rows = non-empty
fibers, columns = the product mode's length), plus the matrix's column count ``R``. A decision
tree fitted by ``benchmarks/train_ttm_selector.py`` (scikit-learn, cross-validated) is shipped as
``ttm_selector.json`` beside this module and walked here with plain NumPy, so choosing a kernel
needs no scikit-learn. A tree timed on a GPU (``train_ttm_selector.py --device gpu``) goes to
``ttm_selector_gpu.json`` and serves ``device="gpu"``; without it the GPU uses the CPU tree.
Without any file every choice is the fallback, ``coo``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

import numpy as np

from .layout import ModeLayout

KERNELS = ("coo", "csr", "fiber")
FALLBACK = "coo"
TREE_FILE = "ttm_selector.json"
TREE_FILES = {"cpu": TREE_FILE, "gpu": "ttm_selector_gpu.json"}
FEATURES = (
    "nnz",
    "rows_x_cols",
    "rows_per_col",
    "log_rows_per_col",
    "load_imbalance",
    "imbalance_per_log_aspect",
    "density",
    "rank",
)


def features(layout: ModeLayout, rank: int) -> dict[str, float]:
    """The seed's features of ``layout``'s unfolding for a matrix of ``rank`` columns.

    ``load_imbalance`` is max/min nonzeros over the non-empty rows (fibers); its ratio to
    ``log(rows/cols)`` is taken on the magnitude of the log, and is the imbalance itself where the
    unfolding is square (log 0).
    """
    rows = max(1, layout.nfibers)
    cols = max(1, layout.shape[layout.mode])
    nnz = layout.nnz
    lengths = np.diff(layout.fiber_ptr)
    imbalance = float(lengths.max() / lengths.min()) if lengths.size else 1.0
    log_aspect = math.log(rows / cols)
    return {
        "nnz": float(nnz),
        "rows_x_cols": float(rows) * cols,
        "rows_per_col": rows / cols,
        "log_rows_per_col": log_aspect,
        "load_imbalance": imbalance,
        "imbalance_per_log_aspect": imbalance / abs(log_aspect) if log_aspect else imbalance,
        "density": nnz / (float(rows) * cols),
        "rank": float(rank),
    }


@lru_cache(maxsize=None)
def load_tree(path: str | None = None, device: str = "cpu") -> dict | None:
    """The shipped decision tree for ``device`` (the CPU's where the GPU has none), or the one at
    ``path``; None when there is none."""
    try:
        if path is None:
            shipped = resources.files(__package__)
            name = TREE_FILES[device]
            if not shipped.joinpath(name).is_file():
                name = TREE_FILE
            text = shipped.joinpath(name).read_text()
        else:
            with open(path) as fh:
                text = fh.read()
    except FileNotFoundError:
        return None
    tree = json.loads(text)
    for key in ("features", "classes", "left", "right", "feature", "threshold", "leaf_class"):
        if key not in tree:
            raise ValueError(f"TTM selector tree {path or TREE_FILE} lacks {key!r}")
    if tuple(tree["features"]) != FEATURES[: len(tree["features"])] or not set(tree["classes"]) <= set(KERNELS):
        raise ValueError(f"TTM selector tree {path or TREE_FILE} was fitted on other features or kernels")
    return tree


def predict(tree: dict, feats: dict[str, float]) -> str:
    """Walk ``tree`` (scikit-learn's node arrays: a node is a leaf where ``left`` is -1)."""
    x = [feats[name] for name in tree["features"]]
    node = 0
    while tree["left"][node] != -1:
        node = tree["left"][node] if x[tree["feature"][node]] <= tree["threshold"][node] else tree["right"][node]
    return tree["classes"][tree["leaf_class"][node]]


def select_kernel(layout: ModeLayout, rank: int, tree: dict | None = None, device: str = "cpu") -> str:
    """The kernel the shipped tree for ``device`` picks for ``layout`` and ``rank`` (``coo``
    without a tree).

    Examples
    --------
    >>> import numpy as np
    >>> from tensorflow_ooc.kernels.ttm.layout import build_layout
    >>> lay = build_layout(np.array([[0, 1, 2], [1, 1, 0]]), np.array([2.0, 3.0]), (2, 2, 3), 1)
    >>> select_kernel(lay, 16) in KERNELS
    True
    """
    tree = load_tree(device=device) if tree is None else tree
    if tree is None:
        return FALLBACK
    return predict(tree, features(layout, rank))
