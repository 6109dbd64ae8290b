"""A store's label dictionaries: per mode, the keys its indices stand for (index ``i`` of mode ``m``
is the ``i``-th key of ``labels/mode{m}.parquet``), written by a conversion from a table.

Each mode's keys are one Parquet file of one column ``key`` (strings, integers, dates or
timestamps as the table held them), zstd-compressed, so a dictionary costs a few bytes a key. The
store's metadata (``labels``, covered by the metadata checksum) records per mode its name, key
type, count, the file's SHA-256 and a digest of the keys; a file edited, swapped or copied from
another store is refused when read. ``digest`` is over the keys' values, so a later version of
an appended store, whose dictionary starts with this one's keys in the same order, is recognised
by the digest of its first ``count`` keys (:func:`keys_digest`).
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any, Sequence

import fsspec

from ..errors import CorruptStoreError
from . import paths

LABELS_DIR = "labels"
LABELS_VERSION = 1


def file_name(mode: int) -> str:
    return f"mode{mode}.parquet"


def keys_digest(keys: Any) -> str:
    """SHA-256 over the keys' values (a pyarrow Array), in order: the same for the same keys
    whatever file or batch layout held them."""
    import pyarrow as pa

    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    h = hashlib.sha256(str(arr.type).encode())
    # one table of the keys, re-encoded without the offsets of any slice it came from
    sink = io.BytesIO()
    import pyarrow.ipc as ipc

    table = pa.table({"key": pa.concat_arrays([arr]) if len(arr) else arr})
    with ipc.new_stream(sink, table.schema, options=ipc.IpcWriteOptions(compression=None)) as w:
        w.write_table(table)
    h.update(sink.getvalue())
    return "sha256:" + h.hexdigest()


def key_type(keys: Any) -> str:
    """A key type's name: ``string``, ``int64``, ``date32[day]``, ``timestamp[us]``, ..."""
    return str(keys.type)


def write_labels(store_path: str, names: Sequence[str], keys: Sequence[Any]) -> dict:
    """Write each mode's keys under ``store_path`` (the store being written) and return the
    ``labels`` entry of its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = str(store_path).rstrip("/")
    fs, root = fsspec.core.url_to_fs(f"{base}/{LABELS_DIR}")
    fs.makedirs(root, exist_ok=True)
    modes = []
    for m, (name, k) in enumerate(zip(names, keys)):
        table = pa.table({"key": k})
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd", compression_level=9, use_dictionary=False)
        data = buf.getvalue()
        with fs.open(f"{root}/{file_name(m)}", "wb") as f:
            f.write(data)
        modes.append(
            {
                "name": str(name),
                "key_type": key_type(k),
                "count": len(k),
                "bytes": len(data),
                "sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
                "digest": keys_digest(k),
            }
        )
    return {"version": LABELS_VERSION, "modes": modes}


def _arrow_type(name: str) -> Any:
    """The pyarrow type a key type's name stands for (``timestamp[s]``, ``timestamp[us, tz=UTC]``)."""
    import pyarrow as pa

    m = re.fullmatch(r"timestamp\[(\w+)(?:, tz=(.+))?\]", name)
    if m:
        return pa.timestamp(m.group(1), tz=m.group(2))
    return pa.type_for_alias(name)


@dataclass
class ModeLabels:
    """One mode's dictionary as the metadata records it."""

    mode: int
    name: str
    key_type: str
    count: int
    bytes: int
    sha256: str
    digest: str


class StoreLabels:
    """A store's label dictionaries (see the module's doc); keys read and checked on first use."""

    def __init__(self, store_path: str, meta: dict, shape: Sequence[int]) -> None:
        self.path = str(store_path)
        self.meta = meta
        self.modes = [
            ModeLabels(mode=m, **{k: d[k] for k in ModeLabels.__dataclass_fields__ if k != "mode"})
            for m, d in enumerate(meta["modes"])
        ]
        if len(self.modes) != len(shape):
            raise CorruptStoreError(f"{self.path}: labels of {len(self.modes)} modes for a tensor of {len(shape)}")
        for ml, n in zip(self.modes, shape):
            if ml.count != int(n):
                raise CorruptStoreError(
                    f"{self.path}: the label dictionary of mode {ml.mode} ({ml.name!r}) holds {ml.count:,} keys "
                    f"for a mode of length {n:,}"
                )
        self._keys: dict[int, Any] = {}

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.modes]

    def mode_of(self, mode: int | str) -> int:
        """A mode's number from its number or its name."""
        if isinstance(mode, str):
            if mode not in self.names:
                raise KeyError(f"no mode named {mode!r}; the modes are {self.names}")
            return self.names.index(mode)
        if not 0 <= int(mode) < len(self.modes):
            raise KeyError(f"mode {mode} out of range: the tensor has {len(self.modes)} modes ({self.names})")
        return int(mode)

    def keys(self, mode: int | str) -> Any:
        """Mode ``mode``'s keys in index order (a pyarrow Array), its file's checksum checked."""
        import pyarrow.parquet as pq

        m = self.mode_of(mode)
        if m not in self._keys:
            ml = self.modes[m]
            where = f"{self.path}: label dictionary of mode {m} ({ml.name!r})"
            location = f"{self.path.rstrip('/')}/{LABELS_DIR}/{file_name(m)}"
            fs, p = fsspec.core.url_to_fs(location)
            try:
                with fs.open(p, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise CorruptStoreError(f"{where}: its file {location} is missing") from None
            if "sha256:" + hashlib.sha256(data).hexdigest() != ml.sha256:
                raise CorruptStoreError(
                    f"{where}: {location} is not the file the store was written with (its checksum differs); "
                    "convert the table again"
                )
            keys = pq.read_table(io.BytesIO(data)).column("key").combine_chunks()
            if key_type(keys) != ml.key_type:
                # Parquet has no seconds unit: timestamp[s] keys come back as timestamp[ms]
                keys = keys.cast(_arrow_type(ml.key_type))
            if len(keys) != ml.count or key_type(keys) != ml.key_type:
                raise CorruptStoreError(f"{where}: holds {len(keys)} keys of {keys.type}, recorded {ml.count}")
            self._keys[m] = keys
        return self._keys[m]

    def describe(self) -> list[dict]:
        """Per mode, for ``tfooc info``: name, key type, count and bytes a key."""
        return [
            {
                "mode": ml.mode,
                "name": ml.name,
                "key_type": ml.key_type,
                "count": ml.count,
                "bytes": ml.bytes,
                "bytes_per_key": ml.bytes / max(1, ml.count),
            }
            for ml in self.modes
        ]

    def fingerprint(self) -> dict:
        """What a result records to find its labels again: names, counts and digests."""
        return {"names": self.names, "modes": [{"count": m.count, "digest": m.digest} for m in self.modes]}


def open_labels(store_path: str, meta: dict, shape: Sequence[int]) -> StoreLabels | None:
    """The labels a store's metadata records, or None for a store converted from coordinates."""
    entry = meta.get("labels")
    if not entry:
        return None
    if entry.get("version") != LABELS_VERSION:
        raise CorruptStoreError(f"{store_path}: label dictionaries of version {entry.get('version')!r} (reads 1)")
    return StoreLabels(store_path, entry, shape)


def remove_labels(store_path: str) -> None:
    paths.remove(f"{str(store_path).rstrip('/')}/{LABELS_DIR}")
