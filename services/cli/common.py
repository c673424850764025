"""What the `dqoes` sub-commands share: the user-error type, JSON output, where NATS is.

Why its own module: the command modules (experiment, live, dashboard,
calibrate) never import one another (an import-linter contract), so what
they all need lives here, below them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson

from shared.bus import Bus, BusError
from shared.core.profiles import ModelProfile
from shared.scenarios.spec import load_profiles_file
from shared.settings import DEFAULT_NATS_URL


class CliError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


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


def state_dir() -> Path:
    base = os.environ.get("DQOES_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "dqoes")
    return Path(base)


def resolve_url(flag_value: str | None) -> str:
    if flag_value:
        return flag_value
    if os.environ.get("DQOES_NATS_URL"):
        return os.environ["DQOES_NATS_URL"]
    try:
        info = orjson.loads((state_dir() / "up.json").read_bytes())
        if info.get("pid") and _alive(int(info["pid"])):
            return str(info["stacks"][0]["nats_url"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        pass
    return DEFAULT_NATS_URL


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


async def connect(url: str, name: str) -> Bus:
    try:
        return await Bus.connect(url, name, connect_timeout_s=3.0)
    except BusError as e:
        raise CliError(f"{e} (is a deployment running? try `dqoes up`)") from None
