"""A decomposition command's flags, built from its declared options
(:mod:`tensorflow_ooc.decompositions.common.options`), and the API keywords read back from them."""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from ..decompositions.common.options import Option, OptionSet, Values
from .options import (
    _finite_float,
    _fraction,
    _nonnegative_int,
    _positive_int,
    _seed,
    _tolerance,
    parse_ranks,
    parse_size,
)


def _positive_float(text: str) -> float:
    """A finite number > 0 (rates): NaN, infinities, zero and negative numbers are refused."""
    v = _finite_float(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def parser_for(values: Values) -> Callable[[str], Any] | None:
    """The argparse ``type`` of an option's values (None: the text as it is)."""
    if values.kind == "seed":
        return _seed
    if values.kind == "int":
        return _positive_int if (values.low or 0) >= 1 else _nonnegative_int
    if values.kind == "size":
        return parse_size
    if values.kind == "ranks":
        return parse_ranks
    if values.kind == "float":
        if values.high is not None:
            return _fraction
        if values.low is None:
            return _finite_float
        return _positive_float if values.low_open else _tolerance
    return None


def _help(o: Option, default: Any) -> str:
    text = o.help.replace("%", "%%")
    if default is None or "(default" in text or o.values.kind == "bool" or f"{default}:" in text:
        return text
    return f"{text} (default {default})"


def add_declared(parser: argparse.ArgumentParser, options: OptionSet) -> None:
    """Add a required flag for each of the method's arguments, then a flag for each of ``options``
    shown on the CLI (options of one ``group`` exclude each other)."""
    for a in options.arguments:
        parser.add_argument(*a.cli_flags, dest=a.name, type=parser_for(a.values), required=True, help=a.help)
    groups: dict[str, Any] = {}
    for o in options.on_cli():
        target: Any = parser
        if o.group:
            if o.group not in groups:
                groups[o.group] = parser.add_mutually_exclusive_group()
            target = groups[o.group]
        default = o.default_on("cli")
        kw: dict[str, Any] = {"dest": o.name, "default": default, "help": _help(o, default)}
        if o.values.kind == "bool":
            kw["action"] = "store_false" if default else "store_true"
        else:
            kw["type"] = parser_for(o.values)
            choices = o.cli_choices or o.values.choices
            if choices:
                kw["choices"] = list(choices)
            if o.metavar:
                kw["metavar"] = o.metavar
        target.add_argument(*o.cli_flags, **kw)


def declared_keywords(args: argparse.Namespace, options: OptionSet) -> dict[str, Any]:
    """The API keywords of the command's declared flags (the CLI-only ones folded into theirs)."""
    from ..decompositions.common.option_values import api_keywords

    return api_keywords(options, {o.name: getattr(args, o.name) for o in options.on_cli()})
