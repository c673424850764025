"""The `nats` latency source's wire formats: the internal msgpack `LatencyEvent`, or a JSON object.

Why JSON too: a model server in any language can publish one line of JSON
on `dqoes.latency.<node>.<container>` (`nats pub`, nats.js, nats.go) without
the project's msgpack envelope. A JSON body is the same fields as the
msgpack event; the envelope's `type`, `v`, `ts` and `sender` may be left out
(they default to "latency", the current version, the time it arrived and the
container). Both go through the same checks (`schema.decode_latency`), so a
JSON event is refused for exactly the reasons a msgpack one is; a key named
twice, NaN and Infinity are refused too. A msgpack body never starts with
"{" (0x7b is a msgpack integer, never a map), so the first byte tells them apart.
"""

from __future__ import annotations

import time

import msgpack

from shared import schema
from shared.public import DuplicateKey, loads_strict
from shared.schema import LatencyEvent, SchemaError

_BRACE = ord("{")
MAX_JSON_BYTES = 64 * 1024


def decode_latency_any(data: bytes | bytearray | memoryview) -> LatencyEvent:
    """A LatencyEvent from msgpack (the internal format) or JSON (the public one); SchemaError only."""
    raw = bytes(data)
    if not raw or raw.lstrip()[:1] != b"{":
        return schema.decode_latency(raw)
    if len(raw) > MAX_JSON_BYTES:
        raise SchemaError(f"latency: JSON over {MAX_JSON_BYTES} bytes")
    try:
        obj = loads_strict(raw)
    except DuplicateKey as e:
        raise SchemaError(f"latency: JSON names a key twice ({e})") from None
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"latency: neither msgpack nor JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(obj, dict):
        raise SchemaError("latency: JSON must be an object")
    obj.setdefault("type", "latency")
    obj.setdefault("v", schema.SCHEMA_VERSION)
    obj.setdefault("ts", time.time())
    obj.setdefault("sender", obj.get("container") if isinstance(obj.get("container"), str) else "json")
    try:
        for key in ("latency_s", "cpu_s", "ts", "finished_at"):  # JSON writes 2.0 as 2: a number is a number
            if type(obj.get(key)) is int:
                obj[key] = float(obj[key])
        packed = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise SchemaError(f"latency: JSON value out of range ({e})") from None
    return schema.decode_latency(packed)
