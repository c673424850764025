"""Authentication and subject permissions against a real nats-server with the default configuration.

Two parts. Per role: what it may and may not publish and subscribe to (the
server refuses with a permissions violation, and nothing is delivered).
Then the forgeries of issue 11, replayed against a running manager and
worker (`Stack`, the same configuration `dqoes up` uses): each is refused
and changes nothing (stored objectives, the cluster summary, the worker's
objectives and parameters).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import orjson
import pytest

from services.cli.stack import Stack, StackSpec
from shared import auth, subjects
from shared.bus import Bus, BusError, NoResponders
from shared.natsd import NatsServer
from shared.public import ClusterState, parse_target_reply
from shared.scenarios.spec import parse_scenario
from shared.schema import (
    ControlMsg,
    ControlReply,
    DecisionMsg,
    LatencyEvent,
    NodeState,
    ObjectiveAssign,
    decode_as,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """A nats-server with exactly the configuration `dqoes up` generates (no test user)."""
    base = tmp_path_factory.mktemp("auth")
    cfg = auth.ensure(base / "auth", NODES)
    with NatsServer(store_dir=base / "store", log_path=base / "nats.log", config_file=cfg) as srv:
        yield srv, base / "auth"


def url_as(server, identity: str) -> str:
    srv, auth_dir = server
    return auth.with_credentials(srv.url, auth.load(auth.creds_path(auth_dir, identity)))


async def settle(*buses: Bus) -> None:
    for b in buses:
        try:
            await b.flush()
        except BusError:
            pass
    await asyncio.sleep(0.15)


def node_state(node: str, satisfied: int = 510, expected: tuple[str, ...] = ()) -> NodeState:
    names = tuple(f"fake{i}" for i in range(satisfied))
    return NodeState(node=node, policy="dqoes", cores=4.0, round=1, at=time.time(), interval_s=1.0,
                     slack_sum_g_s=0.0, slack_sum_b_s=0.0, satisfied=satisfied,
                     members={"S": names}, containers=(), expected=expected)


def messages(node: str) -> dict[str, tuple[str, object]]:
    """One message of each internal kind, with its subject."""
    return {
        "latency": (subjects.latency(node, "c1"),
                    LatencyEvent(container="c1", node=node, latency_s=0.01, images=1, batch=1)),
        "state": (subjects.state(node), node_state(node)),
        "decision": (subjects.decisions(node),
                     DecisionMsg(node=node, policy="dqoes", round=1, at=time.time(), interval_s=1.0,
                                 slack_sum_g_s=0.0, slack_sum_b_s=0.0, satisfied=0, containers=())),
        "objective": (subjects.objectives(node),
                      ObjectiveAssign(container="c1", objective_s=1.0, revision=2**62)),
        "control": (subjects.control(node), ControlMsg(initial_interval_s=1.0)),
    }


# --- what each role may publish ------------------------------------------------------------

ALLOWED = {
    "admin": {"control"},
    "client": set(),
    "manager": {"objective"},
    "worker-n1": {"latency", "state", "decision"},
    "inference-n1": {"latency"},
}
"""Internal message kinds each identity may publish for node n1 (and none for n2, except the
manager's hand-overs and the admin's control, which are for any node)."""


@pytest.mark.parametrize("identity", sorted(ALLOWED))
async def test_what_each_role_may_publish(default_server, identity):
    watcher = await Bus.connect(url_as(default_server, "admin"), "watcher")
    seen: list[str] = []
    await watcher.subscribe_raw("dqoes.>", lambda inc: seen.append(inc.subject))
    bus = await Bus.connect(url_as(default_server, identity), identity)
    try:
        for node in NODES:
            for kind, (subject, msg) in messages(node).items():
                seen.clear()
                bus.permission_violations.clear()
                await bus.publish(subject, msg)
                await settle(bus, watcher)
                node_wide = kind in ("objective", "control")
                may = kind in ALLOWED[identity] and (node == "n1" or node_wide)
                if may:
                    assert seen == [subject], (identity, subject)
                    assert not bus.permission_violations
                else:
                    assert seen == [], (identity, subject)
                    assert any("publish" in v for v in bus.permission_violations), (identity, subject)
        # Public subjects: everyone but the containers and workers may ask for targets and the summary.
        for subject in (subjects.TARGETS, subjects.TARGETS_GET, subjects.TARGETS_LIST, subjects.TARGETS_CLEAR,
                        subjects.CLUSTER_QUERY, subjects.CLUSTER_CONTAINERS):
            seen.clear()
            bus.permission_violations.clear()
            await bus.publish_raw(subject, b"{}")
            await settle(bus, watcher)
            may = identity in ("admin", "client")
            assert (seen == [subject]) is may, (identity, subject, seen)
            assert (not bus.permission_violations) is may
    finally:
        await bus.close()
        await watcher.close()


TRAINING_SUBJECTS = {
    subjects.progress("n1", "j1"): {"worker-n1", "inference-n1"},
    subjects.progress("n2", "j1"): set(),
    subjects.training("n1"): {"worker-n1"},
    subjects.training("n2"): set(),
    subjects.launch("n1"): {"manager"},
    subjects.SUBMIT: {"admin", "client"},
}
"""FlowCon's subjects: who may publish each (raw bytes; the server does not look inside)."""


@pytest.mark.parametrize("identity", sorted(ALLOWED))
async def test_who_may_publish_the_training_subjects(default_server, identity):
    watcher = await Bus.connect(url_as(default_server, "admin"), "watcher")
    seen: list[str] = []
    await watcher.subscribe_raw("dqoes.>", lambda inc: seen.append(inc.subject))
    bus = await Bus.connect(url_as(default_server, identity), identity)
    try:
        for subject, who in TRAINING_SUBJECTS.items():
            seen.clear()
            bus.permission_violations.clear()
            await bus.publish_raw(subject, b"x")
            await settle(bus, watcher)
            assert (seen == [subject]) is (identity in who), (identity, subject, seen)
            assert (not bus.permission_violations) is (identity in who), (identity, subject)
    finally:
        await bus.close()
        await watcher.close()


SUBSCRIBE = {
    "admin": {"dqoes.>": True},
    "client": {subjects.CLUSTER_STATE: True, subjects.STATE_ALL: True, subjects.DECISIONS_ALL: True,
               subjects.CONTROL_ALL: False, subjects.OBJECTIVES_ALL: False, subjects.TARGETS: False},
    "inference-n1": {subjects.latency_of_node("n1"): False, subjects.CLUSTER_STATE: False},
    "worker-n1": {subjects.latency_of_node("n1"): True, subjects.objectives("n1"): True,
                  subjects.launch("n1"): True, subjects.progress_of_node("n1"): True, subjects.launch("n2"): False,
                  subjects.control("n1"): True, subjects.objectives("n2"): False,
                  subjects.latency_of_node("n2"): False, subjects.TARGETS: False},
    "manager": {subjects.STATE_ALL: True, subjects.TARGETS: True, subjects.TARGETS_ALL: True,
                subjects.SUBMIT: True, subjects.TRAINING_ALL: True,
                subjects.CLUSTER_CONTAINERS: True, subjects.CONTROL_ALL: False},
    "store": {subjects.TARGETS: False, subjects.TARGETS_ALL: False, subjects.CLUSTER_QUERY: False,
              subjects.STATE_ALL: False, "_INBOX.store.x": True},
}


@pytest.mark.parametrize("identity", sorted(SUBSCRIBE))
async def test_what_each_role_may_subscribe_to(default_server, identity):
    bus = await Bus.connect(url_as(default_server, identity), identity)
    try:
        for subject, may in SUBSCRIBE[identity].items():
            bus.permission_violations.clear()
            sub = await bus.subscribe_raw(subject, lambda inc: None)
            await settle(bus)
            refused = any("subscription" in v for v in bus.permission_violations)
            assert refused is not may, (identity, subject, list(bus.permission_violations))
            await sub.unsubscribe()
    finally:
        await bus.close()


async def test_anonymous_password_and_unknown_key_connections_are_refused(default_server, tmp_path):
    srv, auth_dir = default_server
    with pytest.raises(BusError, match="[Aa]uthorization"):
        await Bus.connect(srv.url, "anonymous", connect_timeout_s=2.0)
    with pytest.raises(BusError, match="[Aa]uthorization"):  # passwords are gone altogether
        await Bus.connect(srv.url.replace("nats://", "nats://admin:guess@"), "guess", connect_timeout_s=2.0)
    stranger = tmp_path / "admin.creds"  # a well-formed key the server does not know, named admin
    stranger.write_text(auth.Credentials.generate("admin").to_json())
    with pytest.raises(BusError, match="[Aa]uthorization"):
        await Bus.connect(auth.with_credentials(srv.url, stranger), "stranger", connect_timeout_s=2.0)


async def test_a_known_public_key_without_its_seed_is_refused(default_server):
    """The public nkeys are in the server config; knowing one is not enough: the nonce must be signed."""
    srv, auth_dir = default_server
    admin = auth.load(auth.creds_path(auth_dir, "admin"))
    other = auth.Credentials.generate("other")

    async def connect_raw(sig: str) -> bytes:
        reader, writer = await asyncio.open_connection(srv.host, srv.port)
        try:
            info = json.loads((await reader.readline()).split(b" ", 1)[1])
            assert info.get("nonce") and info.get("auth_required")
            writer.write(b"CONNECT " + json.dumps({"verbose": False, "pedantic": False, "nkey": admin.nkey,
                                                   "sig": sig, "protocol": 1}).encode() + b"\r\nPING\r\n")
            await writer.drain()
            return await asyncio.wait_for(reader.readline(), 5)
        finally:
            writer.close()

    for sig in ("", "AAAA", _sign(other.seed, "not-the-nonce")):
        answer = await connect_raw(sig)
        assert answer.startswith(b"-ERR") and b"Authorization" in answer, (sig, answer)


def _sign(seed: str, nonce: str) -> str:
    import base64

    import nkeys
    return base64.urlsafe_b64encode(nkeys.from_seed(bytearray(seed.encode())).sign(nonce.encode())).decode()


async def test_only_the_store_writes_the_bucket_and_nobody_deletes_it(default_server):
    manager = await Bus.connect(url_as(default_server, "store"), "store")
    kv = await manager.kv(subjects.KV_OBJECTIVES)
    rev = await kv.put("c1", b'{"container":"c1","objective_s":5.0}')
    try:
        # The manager's request-serving identity has no bucket rights either: only `store` has.
        for identity in ("admin", "client", "manager", "worker-n1", "inference-n1"):
            bus = await Bus.connect(url_as(default_server, identity), identity)
            try:
                await bus.publish_raw(f"$KV.{subjects.KV_OBJECTIVES}.c1", b'{"container":"c1","objective_s":1e-300}')
                await bus.publish_raw(f"$JS.API.STREAM.DELETE.KV_{subjects.KV_OBJECTIVES}", b"")
                await bus.publish_raw("$JS.API.STREAM.CREATE.KV_other", b"{}")
                await settle(bus)
                assert len(bus.permission_violations) == 3, identity
                if identity == "client":  # creating a bucket the way the manager does: refused
                    with pytest.raises((BusError, TimeoutError)):
                        await asyncio.wait_for(bus.kv("other"), 2)
            finally:
                await bus.close()
        # The store itself may write its bucket but neither delete nor purge it.
        await manager.publish_raw(f"$JS.API.STREAM.DELETE.KV_{subjects.KV_OBJECTIVES}", b"")
        await manager.publish_raw(f"$JS.API.STREAM.PURGE.KV_{subjects.KV_OBJECTIVES}", b"")
        await settle(manager)
        assert len(manager.permission_violations) == 2
        entry = await kv.get_entry("c1")
        assert entry is not None and entry.revision == rev
    finally:
        await manager.close()


def test_credentials_are_private_kept_and_rotated(tmp_path):
    d = tmp_path / "auth"
    auth.ensure(d, ["n1"])
    first = auth.load(auth.creds_path(d, "worker-n1"))
    assert (d.stat().st_mode & 0o777) == 0o700
    assert all((f.stat().st_mode & 0o777) == 0o600 for f in d.iterdir())
    assert json.loads(auth.creds_path(d, "worker-n1").read_text()) == {
        "identity": "worker-n1", "nkey": first.nkey, "seed": first.seed, "inbox_prefix": "_INBOX.worker-n1"}
    assert first.nkey.startswith("U") and first.seed.startswith("SU")
    auth.ensure(d, ["n2"])  # adding a node keeps the others and their keys
    assert auth.load(auth.creds_path(d, "worker-n1")) == first
    assert auth.creds_path(d, "worker-n2").exists() and auth.nodes_of(d) == ["n1", "n2"]
    auth.ensure(d, rotate=True)
    rotated = auth.load(auth.creds_path(d, "worker-n1"))
    assert rotated.seed != first.seed
    conf = auth.config_path(d).read_text()
    # The server knows public keys only; no seed is ever in its config.
    assert first.nkey not in conf and rotated.nkey in conf and "password" not in conf
    assert not [f for f in d.glob("*.creds") if auth.load(f).seed in conf]
    assert "allow_responses" not in conf
    # A URL names the file, never the key: safe to log or pass to a child process.
    url = auth.with_credentials("nats://h:1", rotated)
    assert rotated.seed not in url and auth.creds_of(url) == str(auth.creds_path(d, "worker-n1").resolve())
    assert auth.redact("nats://u:secret@h:1") == "nats://u:***@h:1" and auth.redact(url) == "nats://h:1"


def test_public_keys_are_derived_the_same_with_and_without_pynacl(monkeypatch):
    """`python3 -m shared.auth init` runs on a bare host: the standard-library path must agree with NaCl."""
    import builtins

    import nkeys
    seeds = [auth.new_user_seed() for _ in range(5)]
    with_nacl = [auth.public_key(s) for s in seeds]
    assert with_nacl == [nkeys.from_seed(bytearray(s.encode())).public_key.decode() for s in seeds]
    real_import = builtins.__import__

    def no_nacl(name, *a, **k):
        if name.startswith("nacl"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_nacl)
    assert [auth.public_key(s) for s in seeds] == with_nacl
    with pytest.raises(auth.AuthError):
        auth.public_key(with_nacl[0])  # a public key is not a seed


# --- the forgeries of issue 11, against a running manager and worker ------------------------

ONE = {
    "name": "one",
    "duration_s": 100000,
    "noise_sigma": 0.0,
    "nodes": [{"name": "n1", "cores": 2}],
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
    "containers": [{"name": "c1", "model": "m", "objective_s": 100.0},
                   {"name": "c2", "model": "m", "objective_s": 50.0}],
}


async def wait_for(pred, timeout_s: float = 20.0):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        v = pred()
        if v:
            return v
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def request_when_up(bus: Bus, subject: str, payload: bytes, timeout_s: float = 20.0) -> bytes:
    """A request to a manager that may still be starting: the worker can report before the manager
    has subscribed, or before the manager has heard the worker's first state (both seen on a loaded
    CI machine: "no responders", then "unknown container"). Either is retried until the reply is ok
    or the time is up; the last reply is returned."""
    t_end = time.monotonic() + timeout_s
    while True:
        try:
            reply = await bus.request(subject, payload)
        except NoResponders:
            if time.monotonic() >= t_end:
                raise
        else:
            if orjson.loads(reply).get("ok") or time.monotonic() >= t_end:
                return reply
        await asyncio.sleep(0.1)


@pytest.fixture
def stack(tmp_path):
    s = Stack(StackSpec(parse_scenario(json.loads(json.dumps(ONE))), time_scale=5.0, start_delay_s=0.3,
                        state_interval_s=0.2), run_dir=tmp_path / "run")
    with s:
        yield s


async def test_forgeries_are_refused_and_change_nothing(stack):
    client = await Bus.connect(stack.url_for("client"), "client")
    latest: dict[str, NodeState] = {}
    await client.subscribe(subjects.STATE_ALL, lambda m, _: latest.__setitem__(m.node, m), expect=NodeState)
    await wait_for(lambda: "n1" in latest and len(latest["n1"].containers) == 2)
    reply = parse_target_reply(await request_when_up(client, subjects.TARGETS, b'{"container":"c1","objective":40}'))
    assert reply["ok"], reply
    await wait_for(lambda: any(c.container == "c1" and c.objective_s == 40 for c in latest["n1"].containers))
    params_before = dict(latest["n1"].params)

    forgers = {i: await Bus.connect(stack.url_for(i), i) for i in ("client", "inference-n1", "worker-n1")}
    try:
        for identity, bus in forgers.items():
            # A node state for a node that does not exist, "expecting" containers.
            await bus.publish(subjects.state("ghost"), node_state("ghost", expected=("c9",)))
            # An objective hand-over with a huge revision, and a direct write to the bucket.
            await bus.publish(subjects.objectives("n1"),
                              ObjectiveAssign(container="c1", objective_s=1e-3, revision=2**62))
            await bus.publish_raw(f"$KV.{subjects.KV_OBJECTIVES}.c1",
                                  orjson.dumps({"container": "c1", "objective_s": 1e-3}))
            await bus.publish_raw(f"$JS.API.STREAM.DELETE.KV_{subjects.KV_OBJECTIVES}", b"")
            # A control message driving the worker to tiny intervals, a decision.
            await bus.publish(subjects.control("n1"), ControlMsg(initial_interval_s=0.05, max_interval_s=0.05))
            await bus.publish(subjects.decisions("ghost"), messages("ghost")["decision"][1])
            # Latency events for the other node.
            await bus.publish(subjects.latency("n2", "c1"), messages("n2")["latency"][1])
            await settle(bus)
            assert len(bus.permission_violations) >= 6, (identity, list(bus.permission_violations))
        # The client may not forge the worker's latency either.
        await forgers["client"].publish(subjects.latency("n1", "c1"), messages("n1")["latency"][1])
        await settle(forgers["client"])
        assert any("dqoes.latency.n1.c1" in v for v in forgers["client"].permission_violations)
        await asyncio.sleep(1.0)  # a few rounds and state publications

        cs = ClusterState.from_json(await client.request(subjects.CLUSTER_QUERY, b""))
        assert set(cs.nodes) == {"n1"} and cs.satisfied_total <= 2
        c1 = next(c for c in latest["n1"].containers if c.container == "c1")
        assert c1.objective_s == 40 and latest["n1"].params == params_before
        ghost = parse_target_reply(await client.request(subjects.TARGETS, b'{"container":"c9","objective":4}'))
        assert not ghost["ok"] and "unknown container" in ghost["error"]
        manager_view = await Bus.connect(stack.url_for("store"), "reader")
        try:
            kv = await manager_view.kv(subjects.KV_OBJECTIVES)
            assert {k: orjson.loads(v)["objective_s"] for k, v in (await kv.items()).items()} == {"c1": 40}
        finally:
            await manager_view.close()
        # A later real target still takes effect (the forged revision froze nothing).
        reply = parse_target_reply(await client.request(subjects.TARGETS, b'{"container":"c1","objective":30}'))
        assert reply["ok"]
        await wait_for(lambda: any(c.container == "c1" and c.objective_s == 30 for c in latest["n1"].containers))
    finally:
        for b in forgers.values():
            await b.close()
        await client.close()
    logs = stack.logs()
    assert "Traceback" not in logs


async def test_the_admin_may_change_parameters_and_the_client_may_use_every_public_request(stack):
    admin = await Bus.connect(stack.url_for("admin"), "admin")
    client = await Bus.connect(stack.url_for("client"), "client")
    latest: dict[str, NodeState] = {}
    await admin.subscribe(subjects.STATE_ALL, lambda m, _: latest.__setitem__(m.node, m), expect=NodeState)
    try:
        await wait_for(lambda: "n1" in latest)
        # Control is a request the worker answers (on the admin's own inbox).
        reply = decode_as(await admin.request(subjects.control("n1"), ControlMsg(alpha=0.25)), ControlReply)
        assert reply.ok and reply.params["alpha"] == 0.25
        await wait_for(lambda: latest["n1"].params.get("alpha") == 0.25)
        # The manager answers the client on every public subject (the worker reporting does not
        # mean the manager has subscribed yet: the first request may find no responder).
        for subject, body in ((subjects.TARGETS, b'{"container":"c2","objective":20}'),
                              (subjects.TARGETS_GET, b'{"container":"c2"}'),
                              (subjects.TARGETS_LIST, b"{}"),
                              (subjects.TARGETS_CLEAR, b'{"container":"c2"}')):
            assert orjson.loads(await request_when_up(client, subject, body))["ok"], subject
        assert orjson.loads(await client.request(subjects.CLUSTER_CONTAINERS, b""))
        assert ClusterState.from_json(await client.request(subjects.CLUSTER_QUERY, b"")).nodes
    finally:
        await client.close()
        await admin.close()


def test_dqoes_up_writes_credentials_outside_the_repository(tmp_path):
    s = Stack(StackSpec(parse_scenario(ONE)), run_dir=tmp_path / "run")
    assert s.auth_dir == tmp_path / "run" / "auth"
    assert {p.name for p in s.auth_dir.iterdir()} >= {
        "admin.creds", "manager.creds", "store.creds", "client.creds", "worker-n1.creds", "inference-n1.creds",
        auth.CONFIG_NAME}
    assert Path(auth.__file__).resolve().parents[1] not in s.auth_dir.resolve().parents


async def test_an_experiments_private_bus_is_secured_and_leaves_nothing_behind(tmp_path):
    from experiments.common import PrivateNats

    nats = PrivateNats(["n1"], tmp_path / "nats-server.out")
    private = nats.dir
    try:
        url = nats.start()
        with pytest.raises(BusError, match="[Aa]uthorization"):
            await Bus.connect(url, "anonymous", connect_timeout_s=2.0)
        bus = await Bus.connect(nats.url_as("client"), "client", connect_timeout_s=2.0)
        try:  # the client role, not more: node states are the worker's to publish
            await bus.publish_raw(subjects.state("n1"), b"{}")
            await bus.flush()
            for _ in range(40):
                if bus.permission_violations:
                    break
                await asyncio.sleep(0.05)
            assert any("publish" in v for v in bus.permission_violations)
        finally:
            await bus.close()
        assert nats.creds(auth.identity_name("worker", "n1")).is_file()
        assert not list(tmp_path.glob("*.creds")) and not (tmp_path / "auth").exists()
    finally:
        nats.close()
    assert not private.exists()
    assert (tmp_path / "nats-server.out").is_file()


def test_an_experiments_private_bus_in_a_with_block_is_removed_after_it_and_after_a_failed_start(
        tmp_path, monkeypatch):
    from experiments.common import PrivateNats
    from shared.natsd import BINARY_ENV, NatsServerError

    with PrivateNats(["n1"]) as nats:
        private = nats.dir
        assert nats.server.running and nats.creds("client").is_file()
    assert not private.exists() and not nats.server.running

    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "no-such-nats-server"))
    failed = PrivateNats(["n1"])
    with pytest.raises(NatsServerError, match="not an executable"):
        with failed:
            pytest.fail("the block must not run when the server did not start")
    assert not failed.dir.exists()


def test_dqoes_auth_init_writes_a_key_file_per_identity_and_prints_no_seed(tmp_path):
    import subprocess
    import sys

    d = tmp_path / "auth"
    r = subprocess.run([sys.executable, "-m", "services.cli", "auth", "init", "--dir", str(d), "--node", "n1",
                        "--json"], capture_output=True, text=True, check=True)
    info = json.loads(r.stdout)
    names = {i["identity"] for i in info["identities"]}
    assert names == {"admin", "manager", "store", "client", "worker-n1", "inference-n1"}
    for i in info["identities"]:
        creds = auth.load(i["creds"])
        assert creds.identity == i["identity"] and creds.inbox_prefix == i["inbox_prefix"] == f"_INBOX.{creds.identity}"
        assert creds.seed not in r.stdout + r.stderr
        assert (Path(i["creds"]).stat().st_mode & 0o777) == 0o600
    conf = auth.config_path(d).read_text()
    assert conf.count("nkey:") == len(names) and "password" not in conf
