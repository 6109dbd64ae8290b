"""Values of declared options as the API takes them: the settings the CLI and specs give one by one
(a GPU's conflict resolution, streams, memory limit) folded into the object the API takes."""

from __future__ import annotations

from typing import Any

from .options import OptionSet

# the CLI's and specs' GPU settings, which the API takes as one DeviceOptions
DEVICE_SETTINGS = ("conflict", "streams", "device_memory_limit")


def api_keywords(options: OptionSet, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (option name -> value, from a surface) as keyword arguments of the method."""
    out = {k: v for k, v in values.items() if k in options.names}
    device = {k: values[k] for k in DEVICE_SETTINGS if k in values}
    if device and "device_options" in options.names:
        from ...execution import DeviceOptions

        out["device_options"] = DeviceOptions(**device)
    return out
