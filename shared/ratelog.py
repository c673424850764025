"""Log lines that a peer can trigger at will, at most one per interval per kind, with a count.

Why: each rejected target request used to write one INFO line, so 5,000 bad
requests wrote 5,018 lines (issue 11); anyone allowed to send requests could
fill a disk. `RateLimiter` counts events per key and says when to write a
line and how many events it stands for; the bus (shared/bus) writes its
own lines with it, and `RateLimitedLog.log(key, msg, *args)` writes the first
line at once, then at most one line per `interval_s` per key, saying how many
were not written ("... (37 more since the last line)"); `flush()` writes what
is left at shutdown.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable


class RateLimiter:
    """Counts events per key; says when (and how many) to log, at most once per interval."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[Hashable, float] = {}
        self._pending: Counter[Hashable] = Counter()

    def hit(self, key: Hashable) -> int | None:
        """Count one event; return the count to log now (this one included), or None to stay quiet."""
        self._pending[key] += 1
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return None
        self._last[key] = now
        return self._pending.pop(key)

    def flush(self) -> dict[Hashable, int]:
        """Counts not yet logged (at shutdown)."""
        out = dict(self._pending)
        self._pending.clear()
        return out


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, level: int = logging.INFO, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.level = level
        self._limiter = RateLimiter(interval_s, clock)
        self.total = 0
        """Every call, written or not."""
        self.written = 0

    @property
    def clock(self) -> Callable[[], float]:
        return self._limiter.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._limiter.clock = clock

    def log(self, key: Hashable, msg: str, *args: object) -> bool:
        """Count one event; write it if this key's interval has passed. True if written."""
        self.total += 1
        count = self._limiter.hit(key)
        if count is None:
            return False
        if count > 1:
            msg += f" ({count - 1} more since the last line like this)"
        self.logger.log(self.level, msg, *args)
        self.written += 1
        return True

    def flush(self) -> None:
        for key, n in self._limiter.flush().items():
            self.logger.log(self.level, "%d more %s line(s) not written", n, key)
