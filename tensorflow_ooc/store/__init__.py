"""BLCO Zarr store: atomic writing, validated opening, chunk and block iteration."""

from .reader import Block, Chunk, Store, open_store
from .writer import DEFAULT_CHUNK_NNZ, StoreWriter

__all__ = ["Block", "Chunk", "DEFAULT_CHUNK_NNZ", "Store", "StoreWriter", "open_store"]
