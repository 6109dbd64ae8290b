"""Bit layout of BLCO linear indices for a given tensor shape.

ALTO order (seed 001, section 4.1): the bits of all mode indices are interleaved, least significant
level first, round-robin over the modes that still have bits at that level. Long modes therefore own
the uppermost bits alone, and a contiguous run of the order covers a compact sub-box in every mode.

If the ALTO index needs more than 64 bits, its uppermost ``total_bits - 64`` bits become the block
key (section 4.2). Because positions grow with the level inside each mode, the key always holds the
*top* levels of each mode, so a block is the sub-box ``base_n + [0, 2**field_bits[n])`` per mode.

The low 64 bits are re-encoded so that each mode's remaining bits form one contiguous field:
``coord_n = base_n + ((index >> field_shift[n]) & field_mask[n])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import ShapeError

MAX_MODES = 8
MIN_MODES = 2
WORD_BITS = 64


@dataclass(frozen=True)
class BitLayout:
    """Bit layout of a BLCO tensor.

    Parameters
    ----------
    shape : tuple of int
        Mode lengths, 2 to 8 modes, each >= 1 and < 2**63.
    """

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if not MIN_MODES <= len(shape) <= MAX_MODES:
            raise ShapeError(f"shape {shape}: a tensor needs {MIN_MODES} to {MAX_MODES} modes, got {len(shape)}")
        for n, s in enumerate(shape):
            if s < 1 or s >= 2**63:
                raise ShapeError(f"shape {shape}: mode {n} length {s} is outside [1, 2**63)")
        object.__setattr__(self, "shape", shape)

    @property
    def nmodes(self) -> int:
        return len(self.shape)

    @cached_property
    def mode_bits(self) -> np.ndarray:
        """Bits needed per mode: ceil(log2(I_n)), 0 for a length-1 mode."""
        return np.array([(s - 1).bit_length() for s in self.shape], dtype=np.int64)

    @property
    def total_bits(self) -> int:
        return int(self.mode_bits.sum())

    @cached_property
    def alto_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(mode, level) of every ALTO bit position, position 0 = least significant."""
        modes, levels = [], []
        for level in range(int(self.mode_bits.max(initial=0))):
            for n in range(self.nmodes):
                if level < self.mode_bits[n]:
                    modes.append(n)
                    levels.append(level)
        return np.array(modes, dtype=np.int64), np.array(levels, dtype=np.int64)

    @property
    def nwords(self) -> int:
        """64-bit words needed for the full ALTO index (at least 1)."""
        return max(1, -(-self.total_bits // WORD_BITS))

    @property
    def index_bits(self) -> int:
        """Bits of the per-nonzero index (the low ALTO word)."""
        return min(self.total_bits, WORD_BITS)

    @property
    def key_bits_total(self) -> int:
        return max(0, self.total_bits - WORD_BITS)

    @cached_property
    def key_bits(self) -> np.ndarray:
        """Per mode, how many of its top bits live in the block key."""
        modes, _ = self.alto_positions
        kb = np.zeros(self.nmodes, dtype=np.int64)
        for n in modes[WORD_BITS:]:
            kb[n] += 1
        return kb

    @cached_property
    def field_bits(self) -> np.ndarray:
        return self.mode_bits - self.key_bits

    @cached_property
    def field_shift(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.field_bits)[:-1]]).astype(np.int64)

    @cached_property
    def field_mask(self) -> np.ndarray:
        return np.array([(1 << int(b)) - 1 for b in self.field_bits], dtype=np.uint64)

    # --- lookup tables for the numba kernels -------------------------------------------------

    @cached_property
    def spread_tables(self) -> np.ndarray:
        """T[n, j, v, w]: ALTO word-w bits contributed by byte j (value v) of mode n's index."""
        modes, levels = self.alto_positions
        table = np.zeros((self.nmodes, 8, 256, self.nwords), dtype=np.uint64)
        values = np.arange(256, dtype=np.uint64)
        for p, (n, level) in enumerate(zip(modes, levels)):
            j, b = divmod(int(level), 8)
            bit = (values >> np.uint64(b)) & np.uint64(1)
            table[n, j, :, p // WORD_BITS] |= bit << np.uint64(p % WORD_BITS)
        return table

    @cached_property
    def mode_nbytes(self) -> np.ndarray:
        """Bytes of each mode's index that carry bits."""
        return (self.mode_bits + 7) // 8

    @cached_property
    def reencode_table(self) -> np.ndarray:
        """R[j, v]: BLCO field bits produced by byte j (value v) of the low ALTO word."""
        modes, levels = self.alto_positions
        table = np.zeros((8, 256), dtype=np.uint64)
        values = np.arange(256, dtype=np.uint64)
        for p in range(self.index_bits):
            n, level = int(modes[p]), int(levels[p])
            dest = int(self.field_shift[n]) + level
            j, b = divmod(p, 8)
            bit = (values >> np.uint64(b)) & np.uint64(1)
            table[j] |= bit << np.uint64(dest)
        return table

    @cached_property
    def pext_masks(self) -> np.ndarray:
        """Per mode, the low-ALTO-word positions of its in-block bits: ``pext`` with mask ``n``
        gives mode ``n``'s field (see :mod:`tensorflow_ooc.format.bits`)."""
        modes, _ = self.alto_positions
        masks = np.zeros(self.nmodes, dtype=np.uint64)
        for p in range(self.index_bits):
            masks[modes[p]] |= np.uint64(1) << np.uint64(p)
        return masks

    @property
    def index_nbytes(self) -> int:
        return (self.index_bits + 7) // 8

    def key_to_base(self, key_words: np.ndarray) -> np.ndarray:
        """Per-mode base coordinates of a block from its key words (word k = ALTO word k+1)."""
        return self.keys_to_bases(np.asarray(key_words, dtype=np.uint64).reshape(1, -1))[0]

    def keys_to_bases(self, keys: np.ndarray) -> np.ndarray:
        """Base coordinates (nblocks, nmodes) of many blocks from their keys (nblocks, key_words)."""
        modes, levels = self.alto_positions
        base = np.zeros((keys.shape[0], self.nmodes), dtype=np.int64)
        for p in range(WORD_BITS, self.total_bits):
            bit = (keys[:, p // WORD_BITS - 1] >> np.uint64(p % WORD_BITS)) & np.uint64(1)
            base[:, modes[p]] |= bit.astype(np.int64) << np.int64(levels[p])
        return base

    def describe(self) -> dict:
        """JSON-able description stored in the store metadata."""
        return {
            "order": "alto-lsb-roundrobin",
            "mode_bits": self.mode_bits.tolist(),
            "key_bits": self.key_bits.tolist(),
            "field_bits": self.field_bits.tolist(),
            "field_shift": self.field_shift.tolist(),
            "index_bits": self.index_bits,
            "total_bits": self.total_bits,
        }
