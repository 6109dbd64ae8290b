"""BLCO format: bit layout, linearization, ALTO sort, blocking."""

from .blco import DEFAULT_MAX_BLOCK_NNZ, BLCOTensor, encode_coo, sort_nonzeros
from .blocking import BlockTable, block_table
from .layout import BitLayout
from .linearize import alto_words, coords_from_words, decode_alto, delinearize, reencode, top_bits
from .radix_sort import sort_alto

__all__ = [
    "BitLayout",
    "BLCOTensor",
    "BlockTable",
    "DEFAULT_MAX_BLOCK_NNZ",
    "alto_words",
    "block_table",
    "coords_from_words",
    "decode_alto",
    "delinearize",
    "encode_coo",
    "reencode",
    "sort_alto",
    "sort_nonzeros",
    "top_bits",
]
