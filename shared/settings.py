"""Flags that are also environment variables, and logging set-up, for every service.

Each service's `__main__` declares its settings with `flag(...)`: `--nats URL`
defaults to `$DQOES_NATS_URL`, and so on (`switch(...)` for on/off settings,
which refuse a value they cannot read), so the same image runs from a
command line, a compose file or a Swarm stack. Logging: one line per record,
text or JSON (`--log-format json`), to stderr.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

import orjson

from shared import auth

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_METRICS_ADDR = "127.0.0.1"
"""Where a service's /metrics listens unless told (`--metrics-addr`, $DQOES_METRICS_ADDR): the pages name
every container and its objective, so they reach another host only when someone says so (a container
sets 0.0.0.0, its published port stays on the host's loopback)."""


def flag(parser: argparse.ArgumentParser, name: str, env: str, default: Any = None, *,
         type: Any = str, help: str = "", choices: Any = None) -> None:
    """Add `--name` whose default comes from `$env` (then `default`)."""
    raw = os.environ.get(env)
    value = default
    if raw is not None and raw != "":
        try:
            value = type(raw)
        except ValueError:
            parser.error(f"${env}: invalid value {raw!r}")
        if choices is not None and value not in choices:
            parser.error(f"${env}: {raw!r} is not one of {', '.join(map(str, choices))}")
    shown = "" if default is None else f" (default: {default})"
    parser.add_argument(name, default=value, type=type, choices=choices,
                        help=f"{help} [env {env}]{shown}")


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def switch(parser: argparse.ArgumentParser, name: str, env: str, default: bool, *, help: str = "") -> None:
    """Add `--name` / `--no-name` whose default comes from `$env` (1/true/yes/on or 0/false/no/off).

    Any other value of `$env` is an error, not a silent default: a typo must
    not turn a safety switch off.
    """
    raw = os.environ.get(env, "").strip().lower()
    value = default
    if raw in TRUE_WORDS:
        value = True
    elif raw in FALSE_WORDS:
        value = False
    elif raw:
        parser.error(f"${env}: {os.environ[env]!r} is not one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")
    shown = "on" if default else "off"
    parser.add_argument(name, default=value, action=argparse.BooleanOptionalAction,
                        help=f"{help} [env {env}=1|0] (default: {shown})")


def parse_assignments(items: Iterable[str]) -> dict[str, float]:
    """NAME=VALUE pairs as numbers (a policy's parameters); ValueError naming the first bad one."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"expected NAME=VALUE, got {item!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{name}: must be a finite number, got {value!r}")
        out[name] = number
    return out


def parse_policy_entry(entry: str) -> tuple[str, dict[str, float]]:
    """`POLICY[:NAME=VALUE...]` (for example `learned:half_life_s=0`) as the policy's name and its
    settings: one policy run under two settings in one experiment. ValueError naming what is bad."""
    name, *assignments = entry.strip().split(":")
    if not name:
        raise ValueError(f"expected POLICY[:NAME=VALUE...], got {entry!r}")
    return name, parse_assignments(assignments)


def policy_entry(name: str, settings: dict[str, float]) -> str:
    """The entry `parse_policy_entry` reads back: the policy, then its settings in name order, each
    value in its shortest form that reads back as the same number (0, not 0.0; all its digits)."""
    def shown(v: float) -> str:
        short = f"{v:g}"
        return short if float(short) == v else repr(float(v))
    return ":".join([name, *(f"{k}={shown(v)}" for k, v in sorted(settings.items()))])


def nats_url(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """`--nats` with the user and password of `--creds` in it (how the bus connects)."""
    try:
        return auth.resolve(args.nats, args.creds)
    except auth.AuthError as e:
        parser.error(str(e))


def add_common(parser: argparse.ArgumentParser) -> None:
    flag(parser, "--nats", "DQOES_NATS_URL", DEFAULT_NATS_URL,
         help="NATS server URL; a cluster: every server's URL, comma-separated")
    flag(parser, "--creds", "DQOES_NATS_CREDS", None,
         help="this identity's credentials file (docs/guide/security.md); none: connect anonymously")
    flag(parser, "--log-level", "DQOES_LOG_LEVEL", "info", help="debug, info, warning or error",
         choices=("debug", "info", "warning", "error"))
    flag(parser, "--log-format", "DQOES_LOG_FORMAT", "text", help="text or json (one object per line)",
         choices=("text", "json"))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info).splitlines()[-1]
        return orjson.dumps(obj).decode()


class _TextFormatter(logging.Formatter):
    """One record, one line: control characters in a message (a name taken from the bus, say) are
    escaped, so that no input can make a line look like another record. Tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = one_line(record.message)
        return super().formatMessage(record)


def one_line(text: str) -> str:
    """`text` with every non-printable character escaped (a newline as \\n)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def setup_logging(level: str = "info", fmt: str = "text", name: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        f = _TextFormatter(f"%(asctime)s {name + ' ' if name else ''}%(levelname)s %(name)s: %(message)s",
                           "%H:%M:%S")
        f.converter = time.localtime
        handler.setFormatter(f)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(max(logging.WARNING, root.level))
