"""Checks that keep a decomposition from finishing with a silently wrong answer.

Parameters are judged before anything is allocated (a NaN ``tol`` never stops a run, so it ran
all iterations and exited 0), the tensor's norm before the first iteration, and the model after
every iteration: a NaN fit or an all-zero model raises :class:`DecompositionError` naming the
likely cause, instead of being written as a result with exit status 0.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ...errors import DecompositionError
from ...limits import MAX_COUNT


def check_count(name: str, value: object, low: int = 1) -> int:
    """``value`` as an int in [low, 2^62]; bools, floats and NaN are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= MAX_COUNT:
        raise DecompositionError(f"{name} must be an integer in [{low}, 2^62], got {value!r}")
    return int(value)


def check_seed(seed: object, name: str = "seed") -> int | None:
    """``seed`` as an int >= 0, or None (fresh entropy): the seeds NumPy's generators take. Checked
    where a seed is first used, so a negative one is refused naming ``seed`` rather than by NumPy's
    bare "expected non-negative integer"."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise DecompositionError(f"{name} must be an integer >= 0 or None, got {seed!r}")
    return int(seed)


def check_memory(sizes: list[int], refusal) -> None:
    """Refuse arrays of ``sizes`` bytes (one a mode) that together exceed this machine's memory,
    before any is allocated (NumPy's "array is too big" names no mode): raises
    :class:`DecompositionError` with ``refusal(n, total, memory)``, ``n`` the largest one's mode."""
    import psutil

    total, memory = sum(sizes), int(psutil.virtual_memory().total)
    if total > memory:
        raise DecompositionError(refusal(max(range(len(sizes)), key=sizes.__getitem__), total, memory))


def check_factor_memory(shape, widths, what: str) -> None:
    """Factor matrices, ``I_n x widths[n]`` float64 each, that this machine's memory can hold."""
    from ...errors import format_bytes

    sizes = [int(i) * int(w) * 8 for i, w in zip(shape, widths)]
    check_memory(
        sizes,
        lambda n, total, memory: (
            f"{what}: the factor of mode {n} would need {sizes[n]:,} bytes ({format_bytes(sizes[n])}): the mode "
            f"has length {int(shape[n]):,} and the factor {int(widths[n])} columns of float64 (all factors: "
            f"{total:,} bytes), more than this machine's {format_bytes(memory)} of memory; re-index the mode to "
            f"the indices it uses, or lower the ranks"
        ),
    )


def check_tolerance(tol: object, name: str = "tol") -> float:
    """``tol`` as a finite float >= 0."""
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not math.isfinite(tol) or tol < 0:
        raise DecompositionError(f"{name} must be a finite number >= 0, got {tol!r}")
    return float(tol)


def check_tensor_norm(path: str, norm_sq: float) -> None:
    """Refuse a tensor whose ||X||^2 is not a positive finite number: no fit is defined for it."""
    if not math.isfinite(norm_sq):
        raise DecompositionError(
            f"{path}: ||X||^2 is {norm_sq!r}: the values' squares overflow float64, so no fit "
            f"can be computed; rescale the data (values must stay below about 1.34e154)"
        )
    if norm_sq <= 0:
        raise DecompositionError(
            f"{path}: ||X||^2 is {norm_sq!r}: every value is 0 or too small for float64 squares "
            f"(below about 1.5e-154), so there is nothing to fit; rescale the data"
        )


def check_model(iteration: int, fit: float, weights: np.ndarray, norm_model_sq: float, norm_sq: float) -> None:
    """Stop a CP run whose model has become NaN or all zero, saying why."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all() or not math.isfinite(norm_model_sq) or not math.isfinite(fit):
        raise DecompositionError(
            f"iteration {iteration}: the model became NaN or infinite (fit {fit!r}, ||model||^2 {norm_model_sq!r}, "
            f"||X||^2 {norm_sq!r}): the values are too large or too small for float64 products of the factors, "
            f"or the initial factors hold NaN/Inf; rescale the data or use another init"
        )
    if not w.any():
        raise DecompositionError(
            f"iteration {iteration}: the model is all zero (every weight is 0): the factors' products underflow "
            f"float64 for these values (||X||^2 {norm_sq!r}), or the initial factors are zero where the tensor's "
            f"nonzeros are; rescale the data or use another init"
        )
