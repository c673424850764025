"""Small asyncio helpers shared by the services.

`wait_event` exists because Python 3.11's `asyncio.wait_for` can swallow a
cancellation that arrives in the same loop iteration as the awaited event
(CPython gh-86296): a loop of `wait_for(event.wait(), t)` then never ends
when its task is cancelled. `asyncio.timeout` does not have that flaw.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passes; True when it was set."""
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def next_or_stop(queue: asyncio.Queue[T], stop: asyncio.Event) -> T | None:
    """The next item of `queue`, or None once `stop` is set first (what a workload's publishing loop waits on)."""
    getter = asyncio.ensure_future(queue.get())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([getter, stopper], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if not getter.done():
        getter.cancel()
        return None
    return getter.result()
