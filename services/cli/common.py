"""What the `dqoes` sub-commands share: the user-error type, JSON output, where NATS is.

Why its own module: the command modules (experiment, live, dashboard,
calibrate) never import one another (an import-linter contract), so what
they all need lives here, below them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from services.cli import deployments
from services.cli.deployments import state_dir as state_dir  # where the commands keep their state
from shared import auth, settings
from shared.bus import Bus, BusError
from shared.core.profiles import ModelProfile
from shared.scenarios.spec import load_profiles_file
from shared.settings import DEFAULT_NATS_URL


class CliError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def state_field(path: Path, key: str) -> str | None:
    """`key` of a JSON state file the control plane wrote at its last start; None without the file.
    A file that cannot be read: one line."""
    if not path.exists():
        return None
    try:
        return str(orjson.loads(path.read_bytes())[key])
    except (OSError, ValueError, KeyError, TypeError):
        raise CliError(f"{path}: unreadable; start the control plane again") from None


def parse_assignments(items: list[str]) -> dict[str, float]:
    """NAME=VALUE pairs as numbers; CliError naming the first bad one."""
    try:
        return settings.parse_assignments(items)
    except ValueError as e:
        raise CliError(str(e)) from None


def parse_with_pairs(parser: Any, argv: list[str] | None) -> Any:
    """`parser`'s arguments, with NAME=VALUE pairs given after an option taken too.

    argparse stops a positional list at the first option, so `replay DIR --policy learned a=1` would
    leave `a=1` unrecognised; a command with NAME=VALUE positionals (`set`) gets them wherever they come.
    """
    args, extra = parser.parse_known_args(argv)
    if extra:
        pairs = isinstance(getattr(args, "set", None), list) and all(
            "=" in x and not x.startswith("-") for x in extra)
        if not pairs:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.set = [*args.set, *extra]
    return args


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise CliError(f"--seeds: expected a list like 1-5 or 1,3,7, got {text!r}") from None
    if not out:
        raise CliError("--seeds: no seeds given")
    return out


def emit_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def profiles_from(path: str | None) -> dict[str, ModelProfile] | None:
    """--profiles FILE, else $DQOES_PROFILES, else None (the built-ins)."""
    path = path or os.environ.get("DQOES_PROFILES") or None
    return None if path is None else load_profiles_file(path)


def last_up(deployment: str | None = None) -> list[dict[str, Any]]:
    """The stacks of the `dqoes up` running on this machine ([] if none): `deployment` (a PID or a data
    directory) if given; CliError naming them when several run and none is chosen (services.cli.deployments)."""
    try:
        info = deployments.choose(deployment)
    except deployments.DeploymentError as e:
        raise CliError(str(e)) from None
    return list(info["stacks"]) if info else []


def resolve_url(flag_value: str | None, creds: str | None = None, identity: str = "client",
                deployment: str | None = None) -> str:
    """The URL to connect to, with credentials in it.

    URL: --nats, else $DQOES_NATS_URL, else the running `dqoes up` (--deployment
    when several run), else localhost. Credentials: --creds, else
    $DQOES_NATS_CREDS, else `identity`'s file in the auth directory of the
    `dqoes up` serving that URL, else none.
    """
    url = flag_value or os.environ.get("DQOES_NATS_URL")
    if url is None or deployment:
        stacks = last_up(deployment)
        url = url or (str(stacks[0]["nats_url"]) if stacks else DEFAULT_NATS_URL)
    else:  # a URL given: the credentials of whichever deployment serves it
        stacks = [s for info in deployments.running() for s in info["stacks"]]
    if not creds and not os.environ.get(auth.CREDS_ENV):
        for s in stacks:
            if s.get("nats_url") == url and s.get("auth_dir"):
                candidate = auth.creds_path(s["auth_dir"], identity)
                if candidate.exists():
                    creds = str(candidate)
                break
    try:
        return auth.resolve(url, creds)
    except auth.AuthError as e:
        raise CliError(str(e)) from None


def add_nats_flags(p: Any, identity: str = "client") -> None:
    """--nats and --creds for a command that talks to a running deployment."""
    p.add_argument("--nats", help="NATS URL, or a cluster's URLs comma-separated (default: $DQOES_NATS_URL, "
                   "the running `dqoes up`, localhost)")
    p.add_argument("--creds", help=f"credentials file ({identity} role; default: ${auth.CREDS_ENV}, "
                   "else the running `dqoes up`'s; docs/guide/security.md)")
    add_deployment_flag(p)


def add_deployment_flag(p: Any) -> None:
    p.add_argument("--deployment", metavar="PID|DIR",
                   help="which `dqoes up` to talk to when several run here: its PID or data directory")


async def connect(url: str, name: str) -> Bus:
    try:
        return await Bus.connect(url, name, connect_timeout_s=3.0)
    except BusError as e:
        hint = ("wrong or missing credentials? (--creds, $DQOES_NATS_CREDS; docs/guide/security.md)"
                if "authorization" in str(e).lower() else "is a deployment running? try `dqoes up`")
        raise CliError(f"{e} ({hint})") from None


def set_on_signals(stop: asyncio.Event, early: dict[str, bool] | None = None) -> asyncio.Event:
    """From inside a running loop: Ctrl-C and SIGTERM set `stop` (and the loop keeps running to let
    the command close what it opened). `early`, from `signals_as_flag`, says a signal came before."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if early is not None and early["now"]:
        stop.set()
    return stop


@contextlib.contextmanager
def signals_as_flag() -> Iterator[dict[str, bool]]:
    """Ctrl-C and SIGTERM set `flag["now"]` instead of killing the command, from before it starts
    anything or announces itself: whoever reads the announcement may stop it at once, and what it
    started must still be stopped. An asyncio loop that takes the signals over later checks the flag
    once it has (a signal may have come before)."""
    flag = {"now": False}

    def on_signal(*_: object) -> None:
        flag["now"] = True

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
