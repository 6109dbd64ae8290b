"""Ingest: read tensors from text files and in-memory formats, validate, and convert to BLCO stores."""

from .convert import convert
from .fiber_index_build import build_fiber_index
from .rewrite import rewrite
from .sources import AltoRunSource, ArraySource, BatchSource, Source, TextSource, as_source

__all__ = [
    "AltoRunSource",
    "ArraySource",
    "BatchSource",
    "Source",
    "TextSource",
    "as_source",
    "build_fiber_index",
    "convert",
    "rewrite",
]
