"""Files a node's worker keeps so that its successor carries on where it stopped.

A worker can crash, be restarted by a supervisor or stop with `--on-stop keep`;
the next worker of the node must still know the limits containers had before
DQoES touched them (to restore them later) and what an operator changed with
`dqoes control` (to keep it in force). Each file is replaced in one step, and
one that is unreadable, malformed or written under another configuration is
dropped rather than trusted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("services.worker.logic")  # one name for the worker's logic (see base.py)


def load_originals(path: str | None) -> dict[str, float | None]:
    if not path:
        return {}
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(obj, dict):
        return {}
    return {str(k): (float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None)
            for k, v in obj.items()}


def save_originals(path: str | None, originals: dict[str, float | None]) -> None:
    if path:
        write_json(path, originals, "the original limits")


def write_json(path: str, obj: Any, what: str) -> None:
    """Replace `path` with `obj` as JSON in one step (a crash leaves the old file or the new)."""
    tmp = Path(path + ".tmp")
    try:
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not keep %s in %s: %s", what, path, e)


def restored_switch(path: str | None, key: Mapping[str, Any]) -> str | None:
    """The policy `dqoes control` switched this node's last worker to, if it ran with the same
    configuration (as `restored_params`, which drops a file of another configuration); else None."""
    if not path or not Path(path).exists():
        return None
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # restored_params says why and drops it
    policy = obj.get("policy") if isinstance(obj, dict) and obj.get("key") == dict(key) else None
    return policy if isinstance(policy, str) and policy else None


def restored_params(path: str | None, key: Mapping[str, Any]) -> dict[str, float]:
    """What `dqoes control` changed on this node's last worker, if it ran with the same configuration.

    A restarted worker (a crash, a supervisor, a host reboot) keeps an operator's change. A worker
    started with another policy or other flags drops them: the new configuration is what its operator
    asked for last. Unreadable or malformed files are dropped with a warning."""
    if not path or not Path(path).exists():
        return {}
    try:
        obj = json.loads(Path(path).read_text())
        changed = obj["changed"]
        if not isinstance(changed, dict) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in changed.values()):
            raise ValueError("changed: expected numbers by name")
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("parameters set by control in %s not restored: %s", path, e)
        Path(path).unlink(missing_ok=True)
        return {}
    if obj.get("key") != dict(key):
        log.info("parameters set by control in %s dropped: the worker now runs with other flags", path)
        Path(path).unlink(missing_ok=True)
        return {}
    return {str(k): float(v) for k, v in changed.items()}

