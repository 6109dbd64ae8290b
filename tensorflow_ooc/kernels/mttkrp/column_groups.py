"""Column groups: an MTTKRP of rank R as passes over groups of at most ``GROUP_MAX`` columns, each
padded to a multiple of ``GROUP_STEP`` (orchestration, no arithmetic).

Two things made ranks other than 8, 16 and 32 slow where the factors are small enough to stay in
the caches (uber-, nips-shaped):

- **Rows that straddle cache lines.** A rank-25 row is 200 bytes, so reading one touches five
  64-byte lines, not four, and its vector loads split across lines. Padded to 32 columns
  (zeros, whose products are zero) the row is four aligned lines again. Uber-shaped, all-mode
  in-memory MTTKRP, 2 threads: rank 25 43.5 ms, rank 32 36.9 ms.
- **The second-level cache.** A mode's MTTKRP reads the other modes' rows at random. At rank 32
  uber's are 0.74 MB and stay in a 1 MiB L2; at rank 64 they are 1.5 MB, and the MTTKRP took
  118 ms, 3.2x rank 32. As two passes of 32 columns it took 71 ms (nips-shaped, 10 MB of
  factors: 153 -> 119 ms; rank 100 as 32 + 32 + 32 + 8: 248 -> 197 ms).

So a stack of factors of at most ``GROUP_MAX_FACTOR_BYTES`` is copied into padded groups of
columns, each computed by the fixed-width kernels of 8, 16, 24 or 32 columns (accumulators in
registers), and the real columns of each group's output are added into the caller's. The bound
was 16 MiB (factors that stay in the second-level caches); factors far beyond them gain too,
in-memory all-mode MTTKRP, 2 threads (one run each):

============================ ============ ============= ============
tensor, rank                 factors      as it is      in groups
============================ ============ ============= ============
nell2-shaped 20 M, R 50      19.1 MiB     755 ms        425 ms
nell2-shaped, R 64           24.5 MiB     944 ms        661 ms
nell2-shaped, R 100          38.2 MiB     1,376 ms      1,081 ms
vast-shaped 26 M, R 50       67.4 MiB     711 ms        574 ms
vast-shaped, R 100           134.9 MiB    1,301 ms      1,368 ms
============================ ============ ============= ============

Beyond about 100 MiB the passes (four at R 100) each fetch every row's lines again and gain
nothing; the copy also costs memory, which the worker memory plan counts
(:func:`column_group_bytes`). Larger factors run their ranks as they are.
"""

from __future__ import annotations

from ..factors import StackedFactors

GROUP_STEP = 8  # a cache line of float64; the fixed-width kernels' widths are its multiples
GROUP_MAX = 32  # widest group: 32 float64 accumulators still fit the vector registers
GROUP_WIDTHS = tuple(range(GROUP_STEP, GROUP_MAX + 1, GROUP_STEP))
GROUP_MAX_FACTOR_BYTES = 96 << 20


def column_groups(rank: int, factor_bytes: int) -> list[tuple[int, int, int]] | None:
    """``(first column, real columns, padded width)`` of each group for a rank-``rank`` MTTKRP
    over factors of ``factor_bytes``, or None where the rank runs as it is: a width the
    fixed-width kernels take, or factors too large to copy."""
    if rank in GROUP_WIDTHS or factor_bytes > GROUP_MAX_FACTOR_BYTES:
        return None
    groups = []
    for c0 in range(0, rank, GROUP_MAX):
        real = min(GROUP_MAX, rank - c0)
        groups.append((c0, real, -(-real // GROUP_STEP) * GROUP_STEP))
    return groups


def column_block(factors: StackedFactors, first: int, real: int, width: int) -> StackedFactors:
    """Columns ``first .. first + real`` of every factor, zero-padded to ``width`` columns."""
    block = StackedFactors(factors.shape, width, factors.dtype)
    block.data[:, :real] = factors.data[:, first : first + real]
    return block


def column_group_bytes(factor_bytes: int, out_rows: int, rank: int, itemsize: int) -> int:
    """Memory a pass over padded column groups adds beside ``factor_bytes`` of factors (rank
    ``rank``): the padded copies of the factors and one padded output of ``out_rows`` rows per
    group (0 where the rank runs as it is)."""
    groups = column_groups(rank, factor_bytes)
    if groups is None:
        return 0
    padded = sum(width for _, _, width in groups)
    return int(factor_bytes * padded // max(1, rank) + out_rows * padded * itemsize)
