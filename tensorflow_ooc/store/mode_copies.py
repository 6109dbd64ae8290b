"""Mode-sorted copies of a store: per mode, its nonzeros with each work item sorted by that mode.

Streamed MTTKRP reads every chunk once per mode, in ALTO order, where consecutive nonzeros rarely
share a target row; in memory the same kernel runs over mode-sorted copies with run tables
(docs/KERNELS.md, "Mode-sorted copies"). A store may keep those copies beside its chunks, under
its ``sorted`` group (docs/FORMAT.md, "Mode-sorted copies"), per copied mode ``m``:

- ``m{m}/index`` uint64 (nnz,), chunked as the store: chunk ``c`` holds the store's chunk ``c``
  re-encoded (BLCO: one shift and mask a mode) with each work item's nonzeros stably sorted by
  their mode-``m`` index; uncompressed + CRC32C, so streaming maps it where it lies;
- ``m{m}/value``: the values in the same order, uncompressed + CRC32C;
- ``m{m}/crc`` int64 (2, nchunks): the CRC32C each chunk of index and value ended with, by
  position, so moved or swapped chunks are refused as the store's own are.

The group's metadata binds the copies to the store (its id and metadata checksum) and records per
mode the checksums of its arrays' Zarr metadata and of its table: copies written for another
store, or edited, are refused at open. A store without them streams ALTO-ordered chunks as before.
Items are cut from the store's block segments exactly as the streaming reader cuts them
(``item_nnz``), so a sorted chunk has the items of the ALTO chunk; the MTTKRP sum does not depend
on the order within a block segment, so results do not either.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from ..errors import CorruptStoreError
from . import paths
from .chunk_files import ABSENT, ChunkDecodeError, ChunkFiles
from .codecs import TableCodecs
from .metadata import CHECKSUM_KEY, arrays_checksum, meta_checksum

# ``Store`` (store.reader) is not imported here: the reader imports this module to open the copies
Store = Any

GROUP = "sorted"
COPIES_KEY = "mode_copies"
COPIES_VERSION = 1
ARRAYS = ("index", "value")


def _arrays_checksum(group) -> str:
    """SHA-256 over the Zarr metadata of a mode's arrays (codecs, dtypes, shapes, chunk grids)."""
    return arrays_checksum(group, (*ARRAYS, "crc"))


def _table_checksum(crc: np.ndarray) -> str:
    return "sha256:" + hashlib.sha256(np.ascontiguousarray(crc, dtype="<i8").tobytes()).hexdigest()


@dataclass
class SortedChunk:
    """One chunk of a mode's copy, mapped (or read) as stored: re-encoded indices and values and
    its recorded index range (its block segments are the store's chunk's, ``Store.chunk_segments``:
    the streaming reader needs them only on a chunk's first read, and they took two thirds of the
    per-chunk work of a later pass)."""

    id: int
    index: np.ndarray  # uint64 (n,)
    values: np.ndarray
    min: np.ndarray
    max: np.ndarray
    checksum: tuple[int, int]  # the index's and the values' CRC32C


class ModeCopy:
    """One mode's sorted copy, opened: its checksum table in memory, chunks mapped on demand."""

    def __init__(self, store: Store, mode: int, group, meta: dict) -> None:
        self.store = store
        self.mode = mode
        self.group = group
        self.meta = meta
        self.crc: np.ndarray = group["crc"][...] if store.nchunks else np.zeros((2, 0), np.int64)

    def check(self) -> None:
        """Refuse arrays or tables that are not the ones the copy was written with."""
        where = f"{self.store.path}: mode-sorted copy of mode {self.mode}"
        if _arrays_checksum(self.group) != self.meta["arrays_checksum"]:
            raise CorruptStoreError(f"{where}: the Zarr metadata of its arrays was changed after it was written")
        if self.crc.shape != (2, self.store.nchunks):
            raise CorruptStoreError(f"{where}: its checksum table does not have {self.store.nchunks} chunks")
        if _table_checksum(self.crc) != self.meta["table_checksum"]:
            raise CorruptStoreError(f"{where}: its checksum table was edited after it was written")

    @cached_property
    def _files(self) -> tuple[ChunkFiles, ChunkFiles]:
        return tuple(ChunkFiles(self.group[name]) for name in ARRAYS)

    def chunk(self, c: int, keep_nnz: int = 0, out: tuple[np.ndarray, np.ndarray] | None = None) -> SortedChunk:
        """Chunk ``c``: mapped where its files are local (mappings of up to ``keep_nnz`` nonzeros
        kept for later passes), else read into ``out`` (index, values buffers of ``chunk_nnz``).
        Each file's CRC32C is checked once per version of it and its position on every read."""
        store = self.store
        if not 0 <= c < store.nchunks:
            raise IndexError(f"chunk {c} out of range (store has {store.nchunks})")
        got = []
        try:
            for k, f in enumerate(self._files):
                read = f.view(c, keep_nnz)
                if read is None:
                    if out is None:
                        out = (np.empty(store.chunk_nnz, np.uint64), np.empty(store.chunk_nnz, store.value_dtype))
                    read = f.read(c, out[k])
                got.append(read)
        except ChunkDecodeError as exc:
            raise CorruptStoreError(f"{store.path}: mode-sorted copy of mode {self.mode}: {exc}") from exc
        for k, read in enumerate(got):
            self._check_position(k, c, read.checksum)
        start = c * store.chunk_nnz
        n = min(store.nnz, start + store.chunk_nnz) - start
        if got[0].data.shape[0] != n or got[1].data.shape[0] != n:
            raise CorruptStoreError(f"{store.path}: mode-sorted copy of mode {self.mode}: chunk {c} is short")
        mins, maxs = store.chunk_ranges
        return SortedChunk(c, got[0].data, got[1].data, mins[c], maxs[c], (int(got[0].checksum), int(got[1].checksum)))

    def _check_position(self, k: int, c: int, got: int | None) -> None:
        want = int(self.crc[k, c])
        if got is None or int(got) == want:
            return
        what = "is missing" if got == ABSENT else f"does not belong at this position (checksum {int(got):#010x})"
        raise CorruptStoreError(
            f"{self.store.path}: mode-sorted copy of mode {self.mode}: chunk {c} of '{ARRAYS[k]}' {what}; "
            "write the copies again (tfooc mode-copies STORE)"
        )


class ModeCopies:
    """A store's mode-sorted copies: the modes they hold (see :func:`open_mode_copies`)."""

    def __init__(self, store: Store, meta: dict, group) -> None:
        self.store = store
        self.meta = meta
        self.group = group
        self._modes: dict[int, ModeCopy] = {}

    @property
    def modes(self) -> list[int]:
        return sorted(int(m) for m in self.meta["modes"])

    @property
    def item_nnz(self) -> int:
        return int(self.meta["item_nnz"])

    def mode(self, mode: int) -> ModeCopy | None:
        """Mode ``mode``'s copy, opened and checked on first use; None where there is none."""
        if str(mode) not in self.meta["modes"]:
            return None
        if mode not in self._modes:
            try:
                copy = ModeCopy(self.store, mode, self.group[f"m{mode}"], self.meta["modes"][str(mode)])
            except KeyError as exc:
                raise CorruptStoreError(
                    f"{self.store.path}: mode-sorted copy of mode {mode}: array {exc} is missing; write it again"
                ) from exc
            copy.check()
            self._modes[mode] = copy
        return self._modes[mode]

    def describe(self) -> dict:
        """Per mode, for ``tfooc info``: bytes, bytes per nonzero and the average run."""
        nnz = max(1, self.store.nnz)
        return {
            m: {
                "bytes": int(mm["bytes"]),
                "bytes_per_nnz": int(mm["bytes"]) / nnz,
                "runs_per_nnz": float(mm["runs"]) / nnz,
                "mean_run": nnz / max(1, int(mm["runs"])),
            }
            for m, mm in sorted(self.meta["modes"].items(), key=lambda kv: int(kv[0]))
        }


def open_mode_copies(store: Store) -> ModeCopies | None:
    """The mode-sorted copies of ``store``, their binding checked; None where it has none.

    Raises :class:`~tensorflow_ooc.errors.CorruptStoreError` for copies another store wrote, or
    whose metadata was edited."""
    if GROUP not in store.root:
        return None
    group = store.root[GROUP]
    meta = dict(group.attrs).get(COPIES_KEY)
    if not isinstance(meta, dict) or not meta.get("modes"):
        return None
    where = f"{store.path}: mode-sorted copies"
    if meta.get(CHECKSUM_KEY) != meta_checksum(meta):
        raise CorruptStoreError(f"{where}: their metadata was edited after they were written; write them again")
    if meta.get("version") != COPIES_VERSION:
        raise CorruptStoreError(f"{where}: version {meta.get('version')!r} is not supported; write them again")
    if meta.get("store_id") != store.meta.get("store_id") or meta.get("store_checksum") != store.meta.get(CHECKSUM_KEY):
        raise CorruptStoreError(
            f"{where}: they were written for another store (or before this store's metadata changed); write them "
            "again (tfooc mode-copies STORE)"
        )
    return ModeCopies(store, meta, group)


# --- writing ------------------------------------------------------------------------------------


class ModeCopiesWriter:
    """Writes the copies of ``modes`` chunk by chunk (:meth:`write`, any order) into a staging
    group, then :meth:`finish` publishes them as the store's ``sorted`` group (replacing any)."""

    def __init__(self, store: Store, modes: list[int], item_nnz: int) -> None:
        self.store = store
        self.modes = [int(m) for m in modes]
        self.item_nnz = int(item_nnz)
        base = store.path.rstrip("/")
        self.remote = paths.is_url(store.path)
        if self.remote:
            self.staging = f"{base}/{GROUP}"
            paths.remove(self.staging)
        else:
            parent = Path(base).parent
            self.staging = str(parent / f".{Path(base).name}.{GROUP}.staging-{uuid.uuid4().hex[:8]}")
        self.group = zarr.open_group(self.staging, mode="w", **{**paths.read_options(self.staging), "zarr_format": 3})
        n = max(1, store.nnz)
        opts = {"shape": (n,), "chunks": (store.chunk_nnz,), "fill_value": 0, "compressors": [Crc32cCodec()]}
        self.arrays = {
            m: {
                "index": self.group.create_array(f"m{m}/index", dtype=np.uint64, **opts),
                "value": self.group.create_array(f"m{m}/value", dtype=store.value_dtype, **opts),
            }
            for m in self.modes
        }
        self.runs = dict.fromkeys(self.modes, 0)

    def write(self, c: int, mode: int, index: np.ndarray, values: np.ndarray, runs: int) -> None:
        """Chunk ``c`` of ``mode``'s copy, with ``runs`` runs of one target row in its items."""
        start = c * self.store.chunk_nnz
        stop = start + index.shape[0]
        self.arrays[mode]["index"][start:stop] = index
        self.arrays[mode]["value"][start:stop] = values
        self.runs[mode] += int(runs)

    def finish(self, keep: list[int] | None = None) -> None:
        """Each kept mode's checksum table and metadata (``keep``: default every mode written; the
        others' arrays are removed); then the staging group becomes the store's."""
        keep = self.modes if keep is None else [int(m) for m in keep]
        for m in self.modes:
            if m not in keep:
                paths.remove(f"{self.staging}/m{m}")
        modes = {}
        for m in keep:
            files = [ChunkFiles(self.arrays[m][name]) for name in ARRAYS]
            crc = np.array([[f.stored_checksum(c) for c in range(self.store.nchunks)] for f in files], np.int64)
            crc = crc.reshape(2, self.store.nchunks)
            table = self.group.create_array(
                f"m{m}/crc", shape=crc.shape, chunks=(2, max(1, crc.shape[1])), dtype=np.int64, fill_value=0,
                **TableCodecs().array_options(),
            )  # fmt: skip
            if crc.size:
                table[...] = crc
            nbytes = sum(paths.disk_bytes(f"{self.staging}/m{m}/{name}") for name in ARRAYS)
            modes[str(m)] = {
                "arrays_checksum": _arrays_checksum(self.group[f"m{m}"]),
                "table_checksum": _table_checksum(crc),
                "runs": self.runs[m],
                "bytes": int(nbytes),
            }
        meta = {
            "version": COPIES_VERSION,
            "store_id": self.store.meta.get("store_id"),
            "store_checksum": self.store.meta.get(CHECKSUM_KEY),
            "item_nnz": self.item_nnz,
            "modes": modes,
        }
        meta[CHECKSUM_KEY] = meta_checksum(meta)
        try:
            self.group.attrs.put({COPIES_KEY: meta})
            if not self.remote:
                final = Path(self.store.path.rstrip("/")) / GROUP
                if final.exists():
                    shutil.rmtree(final)
                Path(self.staging).rename(final)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Remove the staging group (remote: the copies written so far)."""
        paths.remove(self.staging)


def drop_mode_copies(store: Store) -> None:
    """Remove the store's mode-sorted copies (streaming then reads the ALTO-ordered chunks)."""
    paths.remove(f"{store.path.rstrip('/')}/{GROUP}")
