"""The packages a workflow imports beyond the core dependencies, and the extra of the package
(``pip install 'tensorflow_ooc[EXTRA]'``) that installs each.

An export to TensorLy or pyttb imports that library (``step_models.EXPORT_NEEDS``), a location in
object storage the fsspec implementation of its scheme (``s3://``: s3fs), the ``gpu`` cluster
dask-cuda and a GPU decompose numba-cuda. :func:`needed_modules` lists them for a loaded workflow
(the deployment test checks that the images install them for the shipped workflows), and
:func:`install_hint` says how to install one (the planner's message for an export whose package is
missing).
"""

from __future__ import annotations

from typing import Any

from . import locations as loc
from .step_models import EXPORT_NEEDS

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


def needed_modules(workflow: Any) -> dict[str, list[str]]:
    """The optional modules ``workflow`` imports when it runs, each with what needs it.

    Parameters
    ----------
    workflow : Workflow
        A loaded spec (:func:`~tensorflow_ooc.workflow.load_spec`; not imported here: the planner
        imports this module).

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
            need(EXPORT_NEEDS.get(config.get("format")), f"step {step.name}: format {config.get('format')}")
        if config.get("device") == "gpu":
            need(GPU_DEVICE_MODULE, f"step {step.name}: device gpu")
        for location in {**step.inputs, **step.outputs}.values():
            need(location_module(location), f"step {step.name}: {location}")
    return out


def install_hint(module: str) -> str:
    """How to install ``module``: the package's extra that has it, else the module itself."""
    extra = EXTRAS.get(module)
    return f"pip install 'tensorflow_ooc[{extra}]'" if extra else f"pip install {module}"
