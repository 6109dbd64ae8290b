"""Seconds a long job spends in each of its phases, summed over their occurrences: what a
build logs at its end, so a slow build says where its time went without a profiler."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class PhaseClock:
    """Named sums of wall seconds; phases timed on different threads overlap (their sum can
    exceed the wall time)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def summary(self) -> str:
        """``phase 1.2 s, phase 3.4 s, ...`` in the order the phases were first timed."""
        return ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items())
