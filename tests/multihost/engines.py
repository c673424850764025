"""Several Docker engines on one machine, each a "host" of its own: a test fixture and a script.

Why: the multi-node stack (compose/stack-multinode.yml) has to be tested on
more than one engine, and CI has one machine. Each engine here gets what a
separate host would have:

- its own network namespace (`ip netns add dqt-engN`), joined to the others
  by a veth pair on a bridge this module creates (dqt-br0, 10.231.0.0/24, no
  address on the host side, no route out: traffic stays inside);
- its own UTS namespace (hostname dqt-engN: `docker info` Name and the
  Swarm node's hostname) and mount namespace (a sysfs of its own network
  namespace, the host's cgroup tree bound back in, and a private
  /etc/docker and node directory, so each "host" has its own files at the
  same path);
- its own dockerd with its own --data-root, --exec-root, --pidfile and socket
  (unix:///run/dqoes-test/dqt-engN.sock), with the containerd it starts.

The engines share the host's cgroup tree (cgroupfs driver: containers under
<controller>/docker/<id>, like the host engine's; ids never clash), which is
what lets a worker in a container read its containers' cgroup files as on a
real host. The host's FORWARD chain drops bridged traffic once Docker has
loaded br_netfilter, so one ACCEPT rule for the bridge (comment
dqoes-multihost) is inserted and removed again.

A Swarm across the engines, with overlay networking, works on this project's
machines (vxlan is in the kernel). Two things the engines' logs report and
that do not matter here: no IPVS (`/proc/sys/net/ipv4/vs/...: no such file`:
service virtual IPs do not work, so the stacks use DNS round robin) and
"enabling default vlan on bridge br0 failed ... permission denied" for each
overlay network.

Cleanup is idempotent and finds leftovers by name (netns dqt-eng*, links
dqt-*, the iptables comment, /run/dqoes-test, /var/lib/dqoes-test): it stops
an engine's containers, kills the processes left in its network namespace
(dockerd, containerd, shims: found with `ip netns pids`, by id), removes the
containers' empty cgroups, then the namespaces, links and directories.

Script use (root):
    python3 tests/multihost/engines.py up [N]      # N engines (default 3), then a Swarm
    python3 tests/multihost/engines.py cleanup     # remove everything, also leftovers
Standard library only, so the cleanup runs without the project's virtualenv.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "dqt"
RUN_DIR = Path("/run/dqoes-test")
DATA_DIR = Path("/var/lib/dqoes-test")
BRIDGE = f"{PREFIX}-br0"
SUBNET = "10.231.0"
IPT_COMMENT = "dqoes-multihost"
NODE_DIR = RUN_DIR / "node"
"""The per-host directory (credentials) the stack mounts: empty on the machine, each engine's own inside."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
DATA_SIZE = os.environ.get("DQOES_MULTIHOST_DATA_SIZE", "8g")
"""The tmpfs holding every engine's data root (each gets a copy of the loaded images)."""
SWARM_POOL = "10.232.0.0/16"
"""Overlay subnets: away from 10.0.0.0/8's first /24s and from the engines' own subnet."""


_children: list[subprocess.Popen[bytes]] = []
"""The engines this process started: reaped by `cleanup` (no zombie dockerd left behind)."""


class EngineError(RuntimeError):
    """An engine or the network between them could not be set up (the message says which step)."""


def run(argv: Sequence[str], *, check: bool = True, input: bytes | None = None,
        timeout: float = 120.0) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(list(argv), input=input, capture_output=True, timeout=timeout)
    if check and done.returncode != 0:
        raise EngineError(f"{' '.join(argv)[:200]}: exit {done.returncode}: "
                          f"{(done.stderr or done.stdout).decode(errors='replace').strip()[-600:]}")
    return done


LOCK = Path("/run/lock/dqoes-multihost.lock")
"""Held while one run owns the engines (the names are fixed): a second run waits for it."""


@contextlib.contextmanager
def exclusive(timeout_s: float = 300.0) -> Iterator[None]:
    """Hold LOCK (flock) for the block; EngineError if another run holds it past `timeout_s`."""
    import fcntl

    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as f:
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > t_end:
                    raise EngineError(f"another run holds {LOCK} (the multi-engine cluster) for over "
                                      f"{timeout_s:g} s") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def preflight() -> str | None:
    """Why engines cannot be made on this machine (None when they can)."""
    if os.geteuid() != 0:
        return "not root (network namespaces and dockerd need root)"
    for tool in ("ip", "dockerd", "docker", "iptables", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not found (run .ci/install-docker.sh)"
    return None


@dataclass
class Engine:
    index: int

    @property
    def name(self) -> str:
        return f"{PREFIX}-eng{self.index}"

    @property
    def addr(self) -> str:
        return f"{SUBNET}.{self.index}"

    @property
    def sock(self) -> Path:
        return RUN_DIR / f"{self.name}.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / self.name

    @property
    def data_root(self) -> Path:
        return DATA_DIR / self.name

    @property
    def node_dir(self) -> Path:
        """This engine's own node directory, seen at NODE_DIR by its dockerd and containers."""
        return self.run_dir / "node"

    @property
    def log(self) -> Path:
        return self.run_dir / "dockerd.log"

    def docker(self, *args: str, check: bool = True, input: bytes | None = None,
               timeout: float = 120.0) -> str:
        return run(["docker", "-H", self.url, *args], check=check, input=input,
                   timeout=timeout).stdout.decode().strip()

    def ready(self) -> bool:
        return run(["docker", "-H", self.url, "info", "-f", "{{.Name}}"], check=False,
                   timeout=10).returncode == 0

    def start(self) -> None:
        """Namespace, veth to the bridge, then dockerd inside (UTS and mount namespaces of its own)."""
        ns = self.name
        run(["ip", "netns", "add", ns])
        host_end, ns_end = f"{ns}-h", f"{ns}-n"
        run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
        run(["ip", "link", "set", ns_end, "netns", ns])
        run(["ip", "-n", ns, "link", "set", ns_end, "name", "eth0"])
        run(["ip", "-n", ns, "addr", "add", f"{self.addr}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "link", "set", host_end, "master", BRIDGE])
        run(["ip", "link", "set", host_end, "up"])
        for d in (self.run_dir, self.data_root, self.node_dir, self.run_dir / "etc-docker", self.run_dir / "cg"):
            d.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "daemon.json").write_text("{}\n")
        # Two sockets: the test's, and NODE_DIR/docker.sock, where this "host"'s stack mounts it from.
        dockerd = ["dockerd", "-H", self.url, "-H", f"unix://{NODE_DIR}/docker.sock", "--data-root", str(self.data_root),
                   "--exec-root", str(self.run_dir / "x"), "--pidfile", str(self.run_dir / "docker.pid"),
                   "--config-file", str(self.run_dir / "daemon.json"), "--log-level", "warn"]
        # A sysfs of this network namespace over /sys, the host's cgroup tree moved back under it,
        # and this engine's own /etc/docker (key.json: the engine's identity) and node directory.
        script = "\n".join([
            "set -e",
            f"echo {ns} > /proc/sys/kernel/hostname",
            f"mount --rbind {CGROUP_ROOT} {self.run_dir / 'cg'}",
            "mount -t sysfs sysfs /sys",
            f"mount --move {self.run_dir / 'cg'} {CGROUP_ROOT}",
            f"mount --bind {self.run_dir / 'etc-docker'} /etc/docker" if Path("/etc/docker").is_dir() else ":",
            f"mount --bind {self.node_dir} {NODE_DIR}",
            "exec " + " ".join(dockerd),
        ])
        with open(self.log, "ab") as log:
            _children.append(subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--propagation", "private",
                 "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            ))

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        t_end = time.monotonic() + timeout_s
        while not self.ready():
            if time.monotonic() > t_end:
                tail = self.log.read_text(errors="replace")[-1200:] if self.log.exists() else ""
                raise EngineError(f"engine {self.name} not ready after {timeout_s:g} s; its log ends:\n{tail}")
            time.sleep(0.3)


@dataclass
class Cluster:
    """N engines on one bridge; `swarm()` joins them into one Swarm (engine 1 the manager)."""

    engines: list[Engine] = field(default_factory=list)

    @classmethod
    def up(cls, n: int = 3) -> Cluster:
        why = preflight()
        if why:
            raise EngineError(why)
        cleanup()  # leftovers of an earlier run would clash with the names below
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        # The engines' data roots in memory: loading an image into each writes it out again (GBs on
        # disk otherwise), and removing them is one unmount.
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", f"size={DATA_SIZE}", "dqoes-test", str(DATA_DIR)])
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "link", "set", BRIDGE, "up"])
        run(["iptables", "-I", "FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-m", "comment", "--comment",
             IPT_COMMENT, "-j", "ACCEPT"])
        c = cls([Engine(i) for i in range(1, n + 1)])
        for e in c.engines:
            e.start()
        for e in c.engines:
            e.wait_ready()
        return c

    def swarm(self) -> None:
        """`docker swarm init` on engine 1, every other engine joins as a worker; waits until all are Ready."""
        first = self.engines[0]
        first.docker("swarm", "init", "--advertise-addr", first.addr, "--listen-addr", f"{first.addr}:2377",
                     "--default-addr-pool", SWARM_POOL)
        token = first.docker("swarm", "join-token", "-q", "worker")
        for e in self.engines[1:]:
            e.docker("swarm", "join", "--token", token, "--advertise-addr", e.addr,
                     "--listen-addr", f"{e.addr}:2377", f"{first.addr}:2377", timeout=60)
        t_end = time.monotonic() + 60
        while True:
            states = first.docker("node", "ls", "--format", "{{.Hostname}} {{.Status}}").splitlines()
            if sum(s.endswith(" Ready") for s in states) == len(self.engines):
                return
            if time.monotonic() > t_end:
                raise EngineError(f"swarm nodes not all Ready after 60 s: {states}")
            time.sleep(0.5)

    def load_images(self, images: Iterable[str], host_docker: Sequence[str] = ("docker",)) -> None:
        """`docker save` from the machine's own engine once, `docker load` into every engine."""
        images = list(images)
        tar = RUN_DIR / "images.tar"
        run([*host_docker, "save", "-o", str(tar), *images], timeout=600)
        try:
            procs = [subprocess.Popen(["docker", "-H", e.url, "load", "-q", "-i", str(tar)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for e in self.engines]
            for e, p in zip(self.engines, procs, strict=True):
                out, err = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise EngineError(f"docker load into {e.name}: {err.decode(errors='replace')[-300:]}")
        finally:
            tar.unlink(missing_ok=True)

    def down(self) -> None:
        cleanup()


def _netns_names() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout.decode()
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(f"{PREFIX}-eng")]


def _pids_in(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False).stdout.decode()
    return [int(p) for p in out.split() if p.isdigit()]


def _container_ids(data_root: Path) -> list[str]:
    d = data_root / "containers"
    return [p.name for p in d.iterdir()] if d.is_dir() else []


def _remove_cgroups(ids: Iterable[str]) -> None:
    """The (empty) cgroups of an engine's containers, in every controller; busy ones stay."""
    ids = list(ids)
    if not ids:
        return
    for ctrl in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
        for cid in ids:
            for g in (ctrl / "docker" / cid, CGROUP_ROOT / "docker" / cid):
                with contextlib.suppress(OSError):
                    g.rmdir()


def _umount_under(root: Path) -> None:
    """Any mount left under `root` in this mount namespace (deepest first)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m == str(root) or m.startswith(f"{root}/")), key=len, reverse=True):
        run(["umount", "-l", m], check=False)


def _stop_engine(ns: str) -> str:
    """Stop one engine: its containers, then every process left in its network namespace, then the namespace."""
    t0 = time.monotonic()
    engine = Engine(int(ns.removeprefix(f"{PREFIX}-eng")))
    if engine.sock.exists() and engine.ready():
        # Out of the swarm first, or it starts the tasks again; then every container, at once.
        engine.docker("swarm", "leave", "--force", check=False, timeout=60)
        ids = engine.docker("ps", "-aq", check=False).split()
        if ids:
            engine.docker("rm", "-f", *ids, check=False, timeout=120)
    pids = _pids_in(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        t_end = time.monotonic() + 10
        while (pids := _pids_in(ns)) and time.monotonic() < t_end:
            time.sleep(0.2)
        if not pids:
            break
    _remove_cgroups(_container_ids(engine.data_root))
    run(["ip", "netns", "delete", ns], check=False)
    return f"engine {ns} ({time.monotonic() - t0:.1f} s)"


def cleanup() -> list[str]:
    """Remove every engine, namespace, link, rule and directory this module makes; returns what it removed.

    Safe to call at any time, twice, or after a crash: each step looks for what is there.
    """
    removed: list[str] = []
    names = _netns_names()
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:  # the engines stop side by side
        removed += pool.map(_stop_engine, names)
    while _children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            _children.pop().wait(timeout=10)
    links = run(["ip", "-o", "link", "show"], check=False).stdout.decode()
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"{PREFIX}-eng") and name.endswith("-h"):
            run(["ip", "link", "delete", name], check=False)
            removed.append(f"link {name}")
    if run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
        run(["ip", "link", "delete", BRIDGE], check=False)
        removed.append(f"bridge {BRIDGE}")
    rule = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-m", "comment", "--comment", IPT_COMMENT, "-j", "ACCEPT"]
    while shutil.which("iptables") and run(["iptables", "-C", *rule], check=False).returncode == 0:
        run(["iptables", "-D", *rule], check=False)
        removed.append("iptables rule")
    for d in (RUN_DIR, DATA_DIR):
        if d.exists():
            for sub in d.iterdir() if d is DATA_DIR else []:
                _remove_cgroups(_container_ids(sub))
            _umount_under(d)
            shutil.rmtree(d, ignore_errors=True)
            if d.exists():  # a busy mount: one more try after a lazy unmount
                _umount_under(d)
                shutil.rmtree(d, ignore_errors=True)
            removed.append(f"directory {d}" + (" (NOT fully removed)" if d.exists() else ""))
    return removed


def leftovers() -> list[str]:
    """What of this module's things exists now (empty after a clean `cleanup`)."""
    left = [f"netns {ns}" for ns in _netns_names()]
    links = run(["ip", "-o", "link", "show"], check=False).stdout.decode()
    left += [f"link {w}" for line in links.splitlines() if ":" in line
             for w in [line.split(":")[1].strip().split("@")[0]] if w.startswith(f"{PREFIX}-")]
    rules = run(["iptables", "-S", "FORWARD"], check=False).stdout.decode() if shutil.which("iptables") else ""
    left += ["iptables rule" for line in rules.splitlines() if IPT_COMMENT in line]
    left += [f"directory {d}" for d in (RUN_DIR, DATA_DIR) if d.exists()]
    mounts = Path("/proc/self/mounts").read_text()
    left += [f"mount {m}" for m in (str(RUN_DIR), str(DATA_DIR)) if f" {m}" in mounts]
    return left


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "help"
    if cmd == "up":
        c = Cluster.up(int(argv[1]) if len(argv) > 1 else 3)
        c.swarm()
        print(json.dumps({e.name: {"socket": e.url, "addr": e.addr} for e in c.engines}, indent=1))
        return 0
    if cmd == "cleanup":
        for what in cleanup():
            print(f"removed {what}")
        left = leftovers()
        for what in left:
            print(f"LEFT {what}", file=sys.stderr)
        return 1 if left else 0
    print(__doc__)
    return 0 if cmd in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
