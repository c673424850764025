"""A node's worth of the live system beside the engine, started and stopped one way for every test.

Why: the tests that drive a worker on a real engine (test_worker_docker.py,
test_service_redeploy.py) each run the manager as a subprocess, a bus client
of their own and the worker in this process (so its logs can be read). The
teardown order matters: the worker stops first (its last round still has a
bus and an engine), then the test's bus client, then the manager. It is
written once here; each test stops what it added around it (an engine proxy,
a nats-server, its containers).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.worker.app import WorkerConfig, build, serve
from shared.bus import Bus

REPO = Path(__file__).resolve().parents[2]


class LiveNode:
    """The manager (a subprocess), the test's bus client and a worker served in this process."""

    def __init__(self) -> None:
        self.app: Any = None
        self._serving: asyncio.Task[None] | None = None
        self.bus: Bus | None = None
        self.manager: subprocess.Popen[bytes] | None = None

    def start_manager(self, nats_url: str, log_path: Path, *flags: str) -> None:
        """The manager on `nats_url`, its output in `log_path`."""
        self.manager = subprocess.Popen([sys.executable, "-m", "services.manager", "--nats", nats_url, *flags],
                                        cwd=REPO, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)

    async def serve_worker(self, cfg: WorkerConfig) -> None:
        """The worker of `cfg`, served in this process until `stop_live`."""
        self.app = await build(cfg)
        self._serving = asyncio.create_task(serve(self.app, handle_signals=False))

    async def stop_live(self) -> None:
        """Stop the worker, then close the bus client, then stop the manager (each only if started)."""
        if self.app is not None:
            self.app.worker.stop()
            if self._serving is not None:
                await asyncio.wait_for(self._serving, 30)
        if self.bus is not None:
            await self.bus.close()
        if self.manager is not None:
            self.manager.terminate()
            self.manager.wait(10)
