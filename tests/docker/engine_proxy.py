"""A Docker API socket that can go away and come back, in front of the real engine.

Why: a worker must survive its engine disappearing, but killing this
machine's dockerd takes every other container down with it. The worker
under test talks to the real engine through this proxy's unix socket;
`down()` closes the socket and every open connection (the event stream
included), exactly what a worker sees when dockerd dies; `up()` serves it
again. Bytes are forwarded unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

ENGINE_SOCKET = "/var/run/docker.sock"


class EngineProxy:
    def __init__(self, path: Path, engine_socket: str = ENGINE_SOCKET) -> None:
        self.path = path
        self.engine_socket = engine_socket
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    async def up(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def down(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            e_reader, e_writer = await asyncio.open_unix_connection(self.engine_socket)
        except OSError:
            c_writer.close()
            return
        self._writers |= {c_writer, e_writer}
        pumps = [
            asyncio.ensure_future(self._pump(c_reader, e_writer)),
            asyncio.ensure_future(self._pump(e_reader, c_writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            for w in (c_writer, e_writer):
                w.close()
                self._writers.discard(w)
            self._tasks.difference_update(pumps)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
