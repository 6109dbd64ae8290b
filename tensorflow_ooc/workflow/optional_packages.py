"""The packages a workflow imports beyond the core dependencies, and the extra of the package
(``pip install 'tensorflow_ooc[EXTRA]'``) that installs each.

An export to TensorLy or pyttb imports that library, a location in object storage the fsspec
implementation of its scheme (``s3://``: s3fs), the ``gpu`` cluster dask-cuda and a GPU decompose
numba-cuda. :func:`needed_modules` lists them for a loaded workflow (the deployment test checks
that the images install them for the shipped workflows), and :func:`require` turns a missing one
into an :class:`~.errors.InputError` that names the extra, rather than an ``ImportError`` that a
step would retry as if it could pass.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from . import locations as loc
from .errors import InputError

if TYPE_CHECKING:
    from .plan import Workflow

#: what an export format imports (format -> module)
EXPORT_MODULES = {"tensorly": "tensorly", "pyttb": "pyttb"}
#: what fsspec imports for a URL scheme (scheme -> module)
SCHEME_MODULES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
#: the module a ``cluster: gpu`` spec and a ``device: gpu`` step import
GPU_CLUSTER_MODULE, GPU_DEVICE_MODULE = "dask_cuda", "numba_cuda"
#: the extra of pyproject.toml that installs a module (modules with none: pip install the module)
EXTRAS = {"tensorly": "exports", "pyttb": "exports", "s3fs": "s3", "dask_cuda": "gpu", "numba_cuda": "gpu"}


def location_module(location: str) -> str | None:
    """The module fsspec imports for ``location``'s scheme (None: local, or built into fsspec)."""
    if not loc.is_url(location):
        return None
    return SCHEME_MODULES.get(location.split("://", 1)[0].lower())


def needed_modules(workflow: Workflow) -> dict[str, list[str]]:
    """The optional modules ``workflow`` imports when it runs, each with what needs it.

    Parameters
    ----------
    workflow : Workflow
        A loaded spec (:func:`~tensorflow_ooc.workflow.load_spec`).

    Returns
    -------
    dict
        Module name -> the settings that need it (``"step export: format tensorly"``, ``"storage
        root s3://..."``), in the order found.
    """
    out: dict[str, list[str]] = {}

    def need(module: str | None, why: str) -> None:
        if module is not None:
            out.setdefault(module, []).append(why)

    need(location_module(workflow.root), f"storage root {workflow.root}")
    if workflow.spec.cluster == "gpu":
        need(GPU_CLUSTER_MODULE, "cluster: gpu")
    for step in workflow.steps:
        config = step.model.model_dump(mode="json")
        if step.kind == "export":
            need(EXPORT_MODULES.get(config.get("format")), f"step {step.name}: format {config.get('format')}")
        if config.get("device") == "gpu":
            need(GPU_DEVICE_MODULE, f"step {step.name}: device gpu")
        for location in {**step.inputs, **step.outputs}.values():
            need(location_module(location), f"step {step.name}: {location}")
    return out


def install_hint(module: str) -> str:
    """How to install ``module``: the package's extra that has it, else the module itself."""
    extra = EXTRAS.get(module)
    return f"pip install 'tensorflow_ooc[{extra}]'" if extra else f"pip install {module}"


def require(module: str, what: str) -> None:
    """Raise an :class:`~.errors.InputError` naming ``what`` needs ``module`` and how to install
    it, when ``module`` cannot be imported here."""
    if importlib.util.find_spec(module) is None:
        raise InputError(f"{what} needs the package {module}, which is not installed here ({install_hint(module)})")
