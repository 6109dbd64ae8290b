"""Names and version of the store format (see docs/FORMAT.md), and the metadata checksum."""

from __future__ import annotations

import hashlib
import json

import numpy as np

META_KEY = "tensorflow_ooc"
FORMAT_NAME = "blco"
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
CHECKSUM_KEY = "checksum"


def meta_checksum(meta: dict) -> str:
    """SHA-256 of the store's metadata (every field but the checksum itself), as ``sha256:HEX``.

    Chunks carry CRCs, but the fields results depend on (``norm_sq``, ``shape``, ``nnz``, the
    layout, the counts) live in ``zarr.json`` as plain JSON: a doubled ``norm_sq`` opened as valid
    and gave a wrong fit with exit 0. The hash is over canonical JSON (sorted keys, no spaces), and
    floats round-trip exactly through JSON, so any edit to any field is seen at open.
    """
    body = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def patches_checksum(positions, words) -> str:
    """SHA-256 of a ``delta32`` store's patch table (positions int64, words uint64, little-endian
    bytes): the metadata records it, so a table copied from another store or edited is refused
    at open although its own CRC32C holds."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(positions, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(words, dtype="<u8").tobytes())
    return "sha256:" + h.hexdigest()


#: the store's arrays, whose own Zarr metadata (codecs, dtype, shape, chunks) the checksum binds too
ARRAY_NAMES = (
    "alto",
    "values",
    "blocks/key",
    "blocks/start",
    "blocks/count",
    "blocks/base",
    "chunks/min",
    "chunks/max",
    "chunks/crc_alto",
    "chunks/crc_values",
    "patches/position",
    "patches/word",
)


def arrays_checksum(root, names: tuple[str, ...] = ARRAY_NAMES) -> str:
    """SHA-256 over the Zarr metadata of the store's arrays (``root`` a zarr Group).

    Each array's ``zarr.json`` is plain JSON beside the data: removing the delta filter from
    ``alto``'s codecs left ``tfooc info`` content (its chunks are only decoded by a pass), so the
    codec chains, dtypes, shapes and chunk grids are bound to the store here and checked at open.
    """
    body = {}
    for name in names:
        if name in root:
            d = dict(root[name].metadata.to_dict())
            d.pop("attributes", None)
            body[name] = d
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
