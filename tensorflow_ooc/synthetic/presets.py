"""Shapes and nonzero counts of real tensors (FROSTT and others) that synthetic tensors can take
(``--like``), and the value distributions of heavy-tailed tensors (``--values``): plain data the
command line offers as choices without loading the generators' numba kernels."""

from __future__ import annotations

#: value distributions of heavy-tailed tensors: uniform in (0, 1], counts, normal
VALUE_KINDS = ("uniform", "count", "normal")

PRESETS: dict[str, tuple[tuple[int, ...], int]] = {
    "uber": ((183, 24, 1140, 1717), 3_309_490),
    "nips": ((2482, 2862, 14036, 17), 3_101_609),
    "chicago": ((6186, 24, 77, 32), 5_330_673),
    "nell2": ((12092, 9184, 28818), 20_000_000),
    "vast": ((165427, 11374, 2), 26_021_854),
    "hypersparse": ((10_000_000, 100_000, 1000), 5_000_000),
    # FROSTT amazon-reviews (user x item x word): 65 index bits, so stores need block keys
    "amazon": ((4_821_207, 1_774_269, 1_805_187), 1_741_809_018),
}
