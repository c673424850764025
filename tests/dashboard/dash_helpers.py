"""Helpers for the dashboard's tests: the app with its token, a tap on the bus, waiting for a condition."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from streamlit.testing.v1 import AppTest

from dashboard import access
from shared.bus import Bus, Incoming

TOKEN = "test-token-" + access.new_token()
"""The token the tests' dashboards are started with."""


def app_test(monkeypatch: Any, path: str, *, token: str | None = TOKEN) -> AppTest:
    """The app at `path` under AppTest, started with TOKEN, opened with `?token=token` (None: no token)."""
    monkeypatch.setenv(access.TOKEN_ENV, TOKEN)
    at = AppTest.from_file(path, default_timeout=60)
    if token is not None:
        at.query_params[access.TOKEN_PARAM] = token
    return at


class BusTap:
    """Counts (and keeps) what arrives on one subject, from a thread of its own.

    Tests use it to see what the page put on the bus: `messages` holds the
    raw payloads received on `subject` since the tap started.
    """

    def __init__(self, url: str, subject: str) -> None:
        self.url, self.subject = url, subject
        self.messages: list[bytes] = []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        bus = await Bus.connect(self.url, "test-tap")

        def on_msg(inc: Incoming) -> None:
            self.messages.append(bytes(inc.data))

        await bus.subscribe_raw(self.subject, on_msg)
        await bus.flush()
        self._ready.set()
        await self._stop.wait()
        await bus.close()

    def __enter__(self) -> BusTap:
        self._thread.start()
        assert self._ready.wait(10), f"could not subscribe to {self.subject} at {self.url}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


def wait_until(pred: Callable[[], Any], timeout_s: float = 20.0, every_s: float = 0.1) -> Any:
    """pred()'s first truthy value; AssertionError after timeout_s."""
    t_end = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > t_end:
            raise AssertionError(f"condition not met within {timeout_s:g} s")
        time.sleep(every_s)
