"""Ingest: read tensors from text files, tables and in-memory formats, validate, and convert to BLCO stores.

The names below load on first use, so that the table options (``ingest.table_options``) can be
read by the CLI's parser without loading any kernel.
"""

from __future__ import annotations

from ..lazy_names import lazy_names

_WHERE = {
    "convert": ".convert",
    "build_fiber_index": ".fiber_index_build",
    "rewrite": ".rewrite",
    "AltoRunSource": ".sources",
    "ArraySource": ".sources",
    "BatchSource": ".sources",
    "Source": ".sources",
    "TextSource": ".sources",
    "as_source": ".sources",
    "TableSource": ".table_source",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
