"""BLCO Zarr store: atomic writing, validated opening, chunk and block iteration."""

from .reader import Block, Chunk, EncodedChunk, Store, open_store
from .writer import DEFAULT_CHUNK_NNZ, StoreWriter

__all__ = ["Block", "Chunk", "EncodedChunk", "DEFAULT_CHUNK_NNZ", "Store", "StoreWriter", "open_store"]
