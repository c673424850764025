"""Log lines that a peer can trigger at will, at most one per interval per kind, with a count.

Why: each rejected target request used to write one INFO line, so 5,000 bad
requests wrote 5,018 lines (issue 11); anyone allowed to send requests could
fill a disk. `RateLimitedLog.log(key, msg, *args)` writes the first line at
once, then at most one line per `interval_s` per key, saying how many were
not written ("... (37 more since the last line)"); `flush()` writes what is
left at shutdown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, level: int = logging.INFO, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.level = level
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[Hashable, float] = {}
        self._skipped: dict[Hashable, int] = {}
        self.total = 0
        """Every call, written or not."""
        self.written = 0

    def log(self, key: Hashable, msg: str, *args: object) -> bool:
        """Count one event; write it if this key's interval has passed. True if written."""
        self.total += 1
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return False
        self._last[key] = now
        skipped = self._skipped.pop(key, 0)
        if skipped:
            msg += f" ({skipped} more since the last line like this)"
        self.logger.log(self.level, msg, *args)
        self.written += 1
        return True

    def flush(self) -> None:
        for key, n in self._skipped.items():
            self.logger.log(self.level, "%d more %s line(s) not written", n, key)
        self._skipped.clear()
