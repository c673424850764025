"""A progress bar on stderr, shown only on a terminal (never pollutes --json output)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.enabled = self.stream.isatty()
        self._last = 0.0
        self._t0 = time.monotonic()

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if fraction < 1.0 and now - self._last < 0.1:
            return
        self._last = now
        f = max(0.0, min(1.0, fraction))
        n = int(f * self.width)
        bar = "#" * n + "-" * (self.width - n)
        self.stream.write(f"\r{self.label} [{bar}] {f * 100:5.1f}% {now - self._t0:5.1f}s")
        if f >= 1.0:
            self.stream.write("\n")
        self.stream.flush()
