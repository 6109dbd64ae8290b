"""Names a package loads on first use (PEP 562), so that importing the package for one light
module (declared options, log settings) does not load its heavy ones (numba kernels, Dask)."""

from __future__ import annotations

import importlib
import types
from typing import Any, Callable


def lazy_names(
    package: str, where: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: name ``n`` of ``where`` is read
    from its module ``where[n]`` (relative to the package) on first use and kept in ``namespace``
    (the package's ``globals()``), so later uses are plain attribute reads.

    Examples
    --------
    >>> __getattr__, __dir__ = lazy_names(__name__, {"convert": ".convert"}, globals())  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value
        # importing a submodule binds it on the package under its own name: where that name is a
        # lazy name too (``ingest.convert``, a module and its function) the module would shadow it
        # for good, so it is unbound and read on its next use
        for n in where:
            if isinstance(namespace.get(n), types.ModuleType):
                del namespace[n]
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
