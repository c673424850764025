"""The message bus: the one package that imports `nats`.

Why: every service (worker, manager, inference containers, dashboard, CLI)
needs the same few things from NATS, and each needs them to behave the same
way when things go wrong. Here, once:

- connect with one clear error if the server cannot be reached in time, then
  reconnect forever with a short wait; a disconnect and a reconnect are one
  log line each;
- authenticate with the identity's nkey (`shared.auth`: the server's nonce
  signed with the seed; no secret crosses the wire) and use the identity's
  own inbox prefix, so replies come where only it may read;
- enforce TLS when the URL says `tls://`: nats-py upgrades only when the
  server asks, so a server (or a squatter on its port) that offers no TLS
  is refused before anything is sent (`TLSRequired`);
- answer requests only on inboxes: a reply subject outside `_INBOX.` (a
  requester aiming the answer at the objectives bucket, a JetStream API or
  an internal subject) is not answered; counted (`refused_replies`) and
  logged at most every 5 s;
- publish schema messages (`shared.schema`, msgpack, sender = the bus's
  name), raw bytes, or JSON for the public subjects;
- subscribe with a handler that receives the decoded message. A payload that
  does not decode is dropped, counted (`bus.dropped`) and logged as one
  WARNING line at most every 5 s per subscription, with the count; a handler
  that raises is logged as one line and the subscription goes on. Nothing a
  peer sends can kill a subscriber;
- request/reply, JetStream key-value (`Bus.kv`), drain on shutdown.

Errors from NATS surface as `BusError` (or `RequestTimeout`, `NoResponders`)
with a one-line message, so services never import nats to catch them.
Handlers run one at a time per subscription, in arrival order: keep them
short or hand work to a task.

Where each part lives: `core` (the `Bus`: connection, publish, subscribe,
request/reply, shutdown), `connection` (credentials, the TLS check, the
connection's log lines), `delivery` (what a received message becomes:
drops, handler failures, reply-subject checks), `kv` (key-value buckets and
watches), `errors` (the exceptions and their one-line wording). Import from
`shared.bus`; all log under the one logger `shared.bus`.
"""

from shared.bus.core import PENDING_BYTES_LIMIT as PENDING_BYTES_LIMIT
from shared.bus.core import PENDING_MSGS_LIMIT as PENDING_MSGS_LIMIT
from shared.bus.core import Bus
from shared.bus.delivery import INBOX_PREFIX as INBOX_PREFIX
from shared.bus.delivery import LOG_EVERY_S as LOG_EVERY_S
from shared.bus.delivery import Incoming, Subscription
from shared.bus.delivery import MessageHandler as MessageHandler
from shared.bus.delivery import RawHandler as RawHandler
from shared.bus.errors import BusError, NoResponders, RequestTimeout, TLSRequired
from shared.bus.kv import KV, KVEntry, KVWatch
from shared.bus.kv import KVCallback as KVCallback
from shared.bus.kv import KVConflict as KVConflict

__all__ = [
    "Bus",
    "BusError",
    "Incoming",
    "KV",
    "KVEntry",
    "KVWatch",
    "NoResponders",
    "RequestTimeout",
    "Subscription",
    "TLSRequired",
]
