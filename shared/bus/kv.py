"""JetStream key-value buckets over the bus: values with revisions, compare-and-set, watches.

Why: the control plane keeps what must outlive a process (objectives,
leases, the cluster's members) in JetStream key-value buckets, and every
user needs the same things from them: a bucket opened (or created) even
while a fresh cluster still elects its JetStream leaders, errors as one
line (`BusError`, `KVConflict` when a compare-and-set loses), and watches
whose failing callback does not end the watch. `Bus.kv` opens a bucket
through `open_store`; `KV` wraps it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig, StorageType

from shared.bus.errors import BusError, NoJetStream, one_line

if TYPE_CHECKING:
    from shared.bus.core import Bus

log = logging.getLogger("shared.bus")  # one logger for the whole bus: operators and tests filter on it


class KVConflict(BusError):
    """A compare-and-set on a key-value entry lost: the key changed (or exists) since it was read."""


@dataclass(frozen=True, slots=True)
class KVEntry:
    """One key-value update: `value` None when the key was deleted or purged."""

    key: str
    value: bytes | None
    revision: int

    @property
    def deleted(self) -> bool:
        return self.value is None


KVCallback = Callable[[KVEntry], Awaitable[None] | None]


async def open_store(nc: NatsClient, url: str, bucket: str, history: int, replicas: int,
                     wait_s: float, ttl_s: float | None) -> Any:
    """nats-py's store of `bucket`, created if missing; timeouts retried for `wait_s` (see `Bus.kv`)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await _open(nc, url, bucket, history, replicas, ttl_s)
        except NoJetStream:
            raise
        except BusError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


async def _open(nc: NatsClient, url: str, bucket: str, history: int, replicas: int,
                ttl_s: float | None = None) -> Any:
    js = nc.jetstream()
    try:
        try:
            return await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            store = await js.create_key_value(
                KeyValueConfig(bucket=bucket, history=history, storage=StorageType.FILE, replicas=replicas,
                               ttl=ttl_s)
            )
            log.info("created key-value bucket %s (history %d, replicas %d)", bucket, history, replicas)
            return store
    except nats.js.errors.InvalidBucketNameError:
        raise ValueError(f"invalid key-value bucket name {bucket!r}") from None
    except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
        raise NoJetStream(
            f"key-value bucket {bucket}: JetStream is not enabled on {url} "
            "(start nats-server with -js)"
        ) from None
    except (nats.errors.Error, TimeoutError) as e:
        raise BusError(f"key-value bucket {bucket}: {one_line(e)}") from None


class KV:
    """A JetStream key-value bucket: bytes values, revisions, deletes, watches."""

    def __init__(self, bus: Bus, bucket: str, store: Any) -> None:
        self.bus = bus
        self.bucket = bucket
        self._store = store

    async def get(self, key: str) -> bytes | None:
        """The value of `key`, None if it was never set or is deleted."""
        entry = await self.get_entry(key)
        return entry.value if entry is not None else None

    async def get_entry(self, key: str, revision: int | None = None) -> KVEntry | None:
        """The latest entry of `key` (value and revision), or the one at `revision`; None if absent
        or deleted."""
        try:
            entry = await self._store.get(key, revision=revision)
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: get {key!r} failed: {one_line(e)}") from None
        return KVEntry(key=key, value=entry.value, revision=entry.revision)

    async def copies(self) -> dict[str, bool]:
        """Where a clustered bucket's copies are: server name -> whether that copy is current (the
        leader's is); {} for a bucket on a single server."""
        try:
            info = await self.bus._nc.jetstream().stream_info(f"KV_{self.bucket}")
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: info failed: {one_line(e)}") from None
        cluster = info.cluster
        if cluster is None or cluster.leader is None:
            return {}
        out = {cluster.leader: True}
        for peer in cluster.replicas or []:
            if peer.name is not None:
                out[peer.name] = bool(peer.current) and not peer.offline
        return out

    async def put(self, key: str, value: bytes) -> int:
        """Store `value` under `key`; returns the new revision."""
        with self._write("put", key):
            return await self._store.put(key, bytes(value))

    async def create(self, key: str, value: bytes) -> int:
        """Store `value` under `key` only if it has none; its revision. KVConflict if it has one."""
        with self._write("create", key, conflict=f"{key!r} exists"):
            return await self._store.create(key, bytes(value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Store `value` under `key` only if its revision is still `last`; the new revision.
        KVConflict if another write came first."""
        with self._write("update", key, conflict=f"{key!r} changed since revision {last}"):
            return await self._store.update(key, bytes(value), last=last)

    async def delete(self, key: str) -> None:
        """Delete `key` (a delete marker; watchers see an entry with value None)."""
        with self._write("delete", key):
            await self._store.delete(key)

    @contextmanager
    def _write(self, op: str, key: str, conflict: str | None = None) -> Iterator[None]:
        """A write's NATS errors as one line: ValueError for a bad key, KVConflict (saying
        `conflict`) when a compare-and-set lost, else BusError."""
        try:
            yield
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            if conflict is not None and isinstance(e, nats.js.errors.KeyWrongLastSequenceError):
                raise KVConflict(f"kv {self.bucket}: {conflict}") from None
            raise BusError(f"kv {self.bucket}: {op} {key!r} failed: {one_line(e)}") from None

    async def keys(self) -> list[str]:
        """Every key with a value (deleted keys left out); [] for an empty bucket."""
        try:
            return sorted(await self._store.keys())
        except nats.js.errors.NoKeysError:
            return []
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: keys failed: {one_line(e)}") from None

    async def items(self) -> dict[str, bytes]:
        """Every key with its value (what a manager loads at start)."""
        out: dict[str, bytes] = {}
        for key in await self.keys():
            value = await self.get(key)
            if value is not None:
                out[key] = value
        return out

    async def watch(self, callback: KVCallback, *, keys: str = ">") -> KVWatch:
        """Call `callback(entry)` for the current value of every matching key, then for each change.

        `watch.ready` is set once the current values have been delivered.
        Callback errors are logged (one line) and the watch goes on.
        """
        try:
            watcher = await self._store.watch(keys)
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: watch failed: {one_line(e)}") from None
        watch = KVWatch(self, watcher, callback)
        self.bus._kv_watches.add(watch)
        return watch


class KVWatch:
    """A running key-value watch; `await watch.stop()` ends it."""

    def __init__(self, kv: KV, watcher: Any, callback: KVCallback) -> None:
        self.kv = kv
        self.ready = asyncio.Event()
        self.delivered = 0
        self.failed = 0
        self._watcher = watcher
        self._callback = callback
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"kv-watch-{kv.bucket}"
        )

    async def _run(self) -> None:
        async for entry in self._watcher:
            if entry is None:  # nats.py's marker: the current values have all been delivered
                self.ready.set()
                continue
            deleted = entry.operation in ("DEL", "PURGE")
            update = KVEntry(
                key=entry.key, value=None if deleted else entry.value, revision=entry.revision
            )
            self.delivered += 1
            log.debug(
                "kv %s: %s %s rev %d",
                self.kv.bucket,
                "delete" if deleted else "put",
                update.key,
                update.revision,
            )
            try:
                result = self._callback(update)
                if inspect.isawaitable(result):
                    await result
            except Exception as e:
                self.failed += 1
                log.error("kv %s watch callback failed on %r: %r", self.kv.bucket, update.key, e)

    async def stop(self) -> None:
        self.kv.bus._kv_watches.discard(self)
        try:
            await self._watcher.stop()
        except Exception as e:  # already closed connection, server gone: nothing to undo
            log.debug("kv %s: watch stop: %r", self.kv.bucket, e)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
