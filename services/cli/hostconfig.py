"""The configuration of a host's roles: one TOML file, then environment variables, then flags.

Why: a host that runs DQoES as a service (systemd, `dqoes serve ...`) is set
up once, in a file an operator can read and version: `/etc/dqoes/dqoes.toml`
by default (`--config`, `$DQOES_CONFIG`). Every key also has an environment
variable and a flag, and the later wins: file < environment < flag, so a
unit's `Environment=` or a one-off flag changes one value without editing
the file. The table of keys (`SETTINGS`) is the only definition: the flags,
the checks and docs/guide/install.md's reference follow it. An unknown key,
section or a value of the wrong type is one line naming the file and the key.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.cli.common import CliError

DEFAULT_CONFIG = "/etc/dqoes/dqoes.toml"
CONFIG_ENV = "DQOES_CONFIG"
RUNTIMES = ("docker", "cgroup", "sim")


@dataclass(frozen=True, slots=True)
class Setting:
    section: str
    """"" for the top level, else the TOML table: control_plane or node."""
    key: str
    kind: type
    env: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def dest(self) -> str:
        return f"cfg_{self.key}"

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}" if self.section else self.key


SETTINGS: tuple[Setting, ...] = (
    Setting("", "state_dir", str, "DQOES_STATE_DIR", None,
            "where each role keeps its data (credentials, JetStream, join registry, logs; default "
            "~/.local/state/dqoes; the shipped units use /var/lib/dqoes)"),
    Setting("control_plane", "listen", str, "DQOES_LISTEN", "127.0.0.1",
            "address NATS listens on for nodes and clients (0.0.0.0: every interface)"),
    Setting("control_plane", "port", int, "DQOES_NATS_PORT", 4222, "NATS port"),
    Setting("control_plane", "advertise", str, "DQOES_ADVERTISE_URL", None,
            "the NATS URL nodes are told to join (default nats://<listen>:<port>)"),
    Setting("control_plane", "accept_joins", bool, "DQOES_ACCEPT_JOINS", True,
            "answer join requests (anonymous connections may then publish a join request, nothing else)"),
    Setting("control_plane", "tls", bool, "DQOES_TLS", None,
            "clients (nodes, the control plane's own services) connect over TLS only, and join tokens pin its CA "
            "(default: on when listen is not a loopback address; docs/guide/security.md)"),
    Setting("control_plane", "tls_cert", str, "DQOES_TLS_CERT", None,
            "the server certificate for clients (PEM), naming every address nodes use; with tls_key and tls_ca "
            "(default with TLS on: a certificate signed by a private CA made in the state directory)"),
    Setting("control_plane", "tls_key", str, "DQOES_TLS_KEY", None,
            "the private key of tls_cert (PEM, private to this user)"),
    Setting("control_plane", "tls_ca", str, "DQOES_TLS_CA", None,
            "the CA (PEM) tls_cert is signed by: join tokens carry its SHA-256 and nodes trust only it"),
    Setting("control_plane", "tls_names", str, "DQOES_TLS_NAMES", None,
            "more host names or addresses for the generated certificate, comma-separated (it always names "
            "127.0.0.1, localhost, this host's names and addresses, the listen and advertise hosts)"),
    Setting("control_plane", "cluster_listen", str, "DQOES_CLUSTER_LISTEN", None,
            "HOST:PORT this member's NATS cluster routes listen on (with routes: one member of a control plane "
            "on several hosts, docs/guide/three-hosts.md)"),
    Setting("control_plane", "routes", str, "DQOES_ROUTES", None,
            "the other members' route URLs, nats-route://HOST:PORT (a TOML list, or comma-separated)"),
    Setting("control_plane", "cluster_secret_file", str, "DQOES_CLUSTER_SECRET_FILE", None,
            "the route password every member shares, a file private to this user (default: made once in "
            "this member's auth/cluster-routes.secret: copy that file to the other members)"),
    Setting("control_plane", "cluster_tls_cert", str, "DQOES_CLUSTER_TLS_CERT", None,
            "this member's route certificate (PEM); with cluster_tls_key and cluster_tls_ca every route is TLS, "
            "both ends verified, so no route password or cluster traffic crosses the network in clear"),
    Setting("control_plane", "cluster_tls_key", str, "DQOES_CLUSTER_TLS_KEY", None,
            "the private key of cluster_tls_cert (PEM, private to this user)"),
    Setting("control_plane", "cluster_tls_ca", str, "DQOES_CLUSTER_TLS_CA", None,
            "the CA (PEM) every member's route certificate is signed by"),
    Setting("control_plane", "server_name", str, "DQOES_SERVER_NAME", None,
            "this member's name in the NATS cluster (default: the host name and the cluster port)"),
    Setting("node", "name", str, "DQOES_NODE", None,
            "this node's name (default: the host name; docker runtime: the engine's, `docker info` Name)"),
    Setting("node", "control_plane", str, "DQOES_CONTROL_PLANE", None,
            "the control plane's NATS URL, or a comma-separated list of its NATS servers' URLs (default: what "
            "`dqoes join` recorded)"),
    Setting("node", "join_token", str, "DQOES_JOIN_TOKEN", None,
            "join with this token first if this node has not joined yet"),
    Setting("node", "runtime", str, "DQOES_RUNTIME", "docker",
            "docker: the labelled containers of this host's engine; cgroup: processes in cgroups; sim: a "
            "simulated scenario", RUNTIMES),
    Setting("node", "policy", str, "DQOES_POLICY", "learned", "allocation policy (`dqoes up --help` lists them)"),
    Setting("node", "docker_url", str, "DQOES_DOCKER_URL", None, "docker: engine URL (default: the environment's)"),
    Setting("node", "cores", float, "DQOES_CORES", None, "docker/cgroup: the node's cores (default: all)"),
    Setting("node", "scenario", str, "DQOES_SCENARIO", None, "sim: built-in scenario or file"),
    Setting("node", "time_scale", float, "DQOES_TIME_SCALE", 1.0, "sim: scenario seconds per wall second"),
    Setting("node", "on_stop", str, "DQOES_ON_STOP", "keep",
            "when the role stops (systemctl stop or restart): keep the limits in force, or restore those the "
            "containers had before", ("keep", "restore")),
    Setting("node", "require_node_label", bool, "DQOES_REQUIRE_NODE_LABEL", False,
            "docker: govern only containers labelled dqoes.node=<name> (several nodes on one engine)"),
    Setting("node", "join_token_file", str, "DQOES_JOIN_TOKEN_FILE", None,
            "read the join token from this file (a Docker secret: /run/secrets/NAME) instead of join_token"),
    Setting("node", "apps_creds", str, "DQOES_APPS_CREDS", None,
            "also write this node's inference credentials to this file, for the application containers "
            "of this host to mount (the worker's own stay in the state directory)"),
)

SECTIONS = ("control_plane", "node")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def settings_of(section: str) -> list[Setting]:
    """The keys a role reads: the top level and its table."""
    return [s for s in SETTINGS if s.section in ("", section)]


def _convert(s: Setting, value: Any, where: str) -> Any:
    """`value` as the setting's type; CliError naming `where` and the key."""
    if s.key == "routes" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    try:
        if s.kind is bool:
            if isinstance(value, bool):
                out: Any = value
            elif isinstance(value, str) and value.lower() in TRUE_WORDS + FALSE_WORDS:
                out = value.lower() in TRUE_WORDS
            else:
                raise ValueError
        elif s.kind is int:
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError
            out = int(value)
        elif s.kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError
            out = float(value)
        else:
            if not isinstance(value, str) or not value:
                raise ValueError
            out = value
    except ValueError:
        raise CliError(f"{where}: {s.name}: expected {s.kind.__name__}, got {value!r}") from None
    if s.key == "control_plane":
        out = nats_urls(out, f"{where}: {s.name}")
    if s.key == "routes":
        route_list(out, f"{where}: {s.name}")
    if s.key == "cluster_listen":
        host_port(out, f"{where}: {s.name}")
    if s.choices is not None and out not in s.choices:
        raise CliError(f"{where}: {s.name}: {out!r} is not one of {', '.join(s.choices)}")
    return out


def nats_urls(text: str, where: str) -> str:
    """A NATS URL or a comma-separated list of them, spaces dropped; CliError naming `where` for an
    item that is not a nats:// or tls:// URL with a host."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise CliError(f"{where}: {u!r} is not a NATS URL (nats://HOST:PORT; several: comma-separated)")
    if not urls:
        raise CliError(f"{where}: no NATS URL given")
    return ",".join(urls)


def route_list(text: str, where: str) -> list[str]:
    """`HOST:PORT` of each nats-route:// URL of a comma-separated list; CliError naming `where` for an
    item that is not one, or one that carries a user or password (the shared secret file does)."""
    out = []
    for u in [u.strip() for u in text.split(",") if u.strip()]:
        parts = urlsplit(u)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "nats-route" or not parts.hostname or port is None or parts.username or parts.password:
            raise CliError(f"{where}: {u!r} is not a route URL (nats-route://HOST:PORT, no user or password: "
                           "the password comes from cluster_secret_file)")
        out.append(f"{parts.hostname}:{port}")
    if not out:
        raise CliError(f"{where}: no route URL given")
    return out


def host_port(text: str, where: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT`; CliError naming `where` otherwise."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"{where}: {text!r} is not HOST:PORT (such as 0.0.0.0:6222)")
    return host, int(port)


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's values by setting name (`node.runtime`); CliError for an unreadable file, bad TOML, an
    unknown section or key, or a value of the wrong type."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise CliError(f"config file {p}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise CliError(f"config file {p}: not valid TOML ({e})") from None
    known = {s.name: s for s in SETTINGS}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in SECTIONS:
                raise CliError(f"config file {p}: unknown table [{key}] (tables: {', '.join(SECTIONS)})")
            items = [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            items = [(key, value)]
        for name, v in items:
            if name not in known:
                section = name.rsplit(".", 1)[0] if "." in name else ""
                keys = ", ".join(s.key for s in SETTINGS if s.section == section)
                raise CliError(f"config file {p}: unknown key {name} (known{' in [' + section + ']' if section else ''}"
                               f": {keys})")
            out[name] = _convert(known[name], v, f"config file {p}")
    return out


def add_flags(p: argparse.ArgumentParser, section: str, only: tuple[str, ...] | None = None) -> None:
    """--config and one flag per key the role reads (each names its key and variable); `only`: just
    those keys (a command that needs a few)."""
    p.add_argument("--config", metavar="FILE",
                   help=f"TOML configuration (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} if it exists); "
                   "environment variables override it, flags override both")
    for s in settings_of(section):
        if only is not None and s.key not in only:
            continue
        shown = "" if s.default is None else f" (default: {s.default})"
        if s.kind is bool:
            p.add_argument(s.flag, dest=s.dest, default=None, action=argparse.BooleanOptionalAction,
                           help=f"{s.help} [key {s.name}, env {s.env}]{shown}")
        else:
            p.add_argument(s.flag, dest=s.dest, default=None, type=s.kind, choices=s.choices,
                           help=f"{s.help} [key {s.name}, env {s.env}]{shown}")


def config_path(args: argparse.Namespace) -> Path | None:
    """--config, else $DQOES_CONFIG (both must exist), else the default file if it exists, else None."""
    given = getattr(args, "config", None) or os.environ.get(CONFIG_ENV) or None
    if given:
        return Path(given)
    return Path(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).is_file() else None


def resolve(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """Every key the role reads (by key, without the table): flag, else environment, else file, else
    the default."""
    path = config_path(args)
    from_file = load_file(path) if path is not None else {}
    out: dict[str, Any] = {}
    for s in settings_of(section):
        flag = getattr(args, s.dest, None)
        env = os.environ.get(s.env)
        if flag is not None:
            out[s.key] = nats_urls(flag, s.flag) if s.key == "control_plane" else flag
            if s.key == "routes":
                route_list(flag, s.flag)
            elif s.key == "cluster_listen":
                host_port(flag, s.flag)
        elif env:
            out[s.key] = _convert(s, env, f"${s.env}")
        elif s.name in from_file:
            out[s.key] = from_file[s.name]
        else:
            out[s.key] = s.default
    return out


def reference() -> str:
    """The keys as a Markdown table (docs/guide/install.md)."""
    rows = ["| key | type | environment | flag | default | meaning |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = "" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.name}` | {s.kind.__name__} | `{s.env}` | `{s.flag}` | {default} | {s.help} |")
    return "\n".join(rows)
