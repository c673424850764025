"""The attacks of issue 62 on the bus, replayed against a real nats-server with the default configuration.

Each test plays an attacker holding one ordinary credential (the client's,
usually) against what `dqoes up` runs (`Stack`: nats-server with the
generated nkey users and permissions, the manager with its store connection,
a worker) and shows the attack refused with nothing changed:

- a request whose reply subject is the objectives bucket, its purge API or an
  internal subject (control, state, decisions, latency, launch): not answered
  there, counted and logged; the stored objective survives a manager restart;
- a client reading another identity's inbox, or every inbox: refused;
- a connection without a key: refused (tests/integration/test_auth.py has the
  anonymous, password and unknown-key cases);
- a `tls://` URL to a server that offers no TLS: refused before CONNECT (and
  one that offers TLS: reached over it).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import orjson
import pytest

from services.cli.stack import Stack, StackSpec
from shared import auth, subjects
from shared.bus import Bus, BusError, NoResponders, TLSRequired
from shared.natsd import NatsServer
from shared.scenarios.spec import parse_scenario

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ONE = {
    "name": "one",
    "duration_s": 100000,
    "noise_sigma": 0.0,
    "nodes": [{"name": "n1", "cores": 2}],
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
    "containers": [{"name": "c1", "model": "m", "objective_s": 100.0},
                   {"name": "c3", "model": "m", "objective_s": 50.0}],
}
BUCKET = subjects.KV_OBJECTIVES


async def wait_for(pred, timeout_s: float = 20.0):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        v = pred()
        if v:
            return v
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def ask(bus: Bus, subject: str, body: bytes, timeout_s: float = 30.0) -> dict:
    """A request to a manager that may still be starting (or restarting): retried until ok."""
    t_end = time.monotonic() + timeout_s
    while True:
        try:
            reply = orjson.loads(await bus.request(subject, body))
        except (NoResponders, BusError):
            if time.monotonic() >= t_end:
                raise
        else:
            if reply.get("ok") or time.monotonic() >= t_end:
                return reply
        await asyncio.sleep(0.1)


def refused_replies(metrics_url: str) -> float:
    """The manager's dqoes_bus_refused_replies_total, from its /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "dqoes_bus_refused_replies_total")


@pytest.fixture
def stack(tmp_path):
    s = Stack(StackSpec(parse_scenario(json.loads(json.dumps(ONE))), time_scale=5.0, start_delay_s=0.3,
                        state_interval_s=0.2, metrics=True), run_dir=tmp_path / "run")
    with s:
        yield s


async def test_replies_aimed_at_the_bucket_its_api_or_internal_subjects_are_not_sent(stack):
    client = await Bus.connect(stack.url_for("client"), "client")
    admin = await Bus.connect(stack.url_for("admin"), "watcher")  # sees every dqoes.> subject
    store = await Bus.connect(stack.url_for("store"), "store-reader")
    seen: list[tuple[str, bytes]] = []
    await admin.subscribe_raw("dqoes.>", lambda inc: seen.append((inc.subject, inc.data)))
    try:
        assert (await ask(client, subjects.TARGETS, b'{"container":"c3","objective":40}'))["ok"]
        kv = await store.kv(BUCKET)
        before = await kv.get_entry("c3")
        assert before is not None and orjson.loads(before.value)["objective_s"] == 40

        internal = [subjects.control("n1"), subjects.state("n1"), subjects.decisions("n1"),
                    subjects.latency("n1", "c3"), subjects.launch("n1"), subjects.objectives("n1"),
                    subjects.training("n1")]
        aims = [f"$KV.{BUCKET}.c3", f"$JS.API.STREAM.PURGE.KV_{BUCKET}", f"$JS.API.STREAM.DELETE.KV_{BUCKET}",
                *internal]
        requests = [(subjects.TARGETS_GET, b'{"container":"c3"}'), (subjects.TARGETS_LIST, b"{}"),
                    (subjects.CLUSTER_QUERY, b""), (subjects.CLUSTER_CONTAINERS, b""),
                    # (set and clear are the client's to use: these are refused for their content,
                    # and their answers must not land either)
                    (subjects.TARGETS, b'{"container":"c9","objective":1e-3}'),
                    (subjects.TARGETS_CLEAR, b'{"container":"c9"}')]
        seen.clear()
        for aim in aims:
            for subject, body in requests:
                await client.publish_raw(subject, body, reply=aim)
        await client.flush()
        await asyncio.sleep(1.0)
        # A reply is JSON (`{"ok": ...}` or the cluster summary); nothing JSON arrived on an internal subject.
        landed = [(s, d[:60]) for s, d in seen if s in internal and d[:1] == b"{"]
        assert landed == [], landed
        after = await kv.get_entry("c3")
        assert after is not None and after.revision == before.revision and after.value == before.value
        # Counted (Prometheus) and logged at a bounded rate: a line per request subject, not per refusal.
        refused = await asyncio.to_thread(refused_replies, stack.metrics_urls["manager"])
        assert refused == len(aims) * len(requests), refused
        lines = [ln for ln in stack.logs().splitlines() if "reply subject is not an inbox" in ln]
        assert 1 <= len(lines) <= len(requests), lines

        # The manager restarts and loads the objective intact.
        stack.stop_process("manager")
        stack.start_manager()
        got = await ask(client, subjects.TARGETS_GET, b'{"container":"c3"}')
        assert got["ok"] and got["target"]["objective_s"] == 40, got
        assert "unreadable" not in stack.logs()
        # A request with a proper inbox is still answered.
        assert (await ask(client, subjects.TARGETS_LIST, b"{}"))["ok"]
    finally:
        for b in (client, admin, store):
            await b.close()
    assert "Traceback" not in stack.logs()


async def test_the_bus_answers_only_on_inboxes_and_counts_the_rest(nats_url):
    responder = await Bus.connect(nats_url, "responder")
    asker = await Bus.connect(nats_url, "asker")
    elsewhere: list[bytes] = []
    try:
        await responder.subscribe_raw("t.ask", lambda inc: responder.reply(inc, b"answer"))
        await asker.subscribe_raw("t.victim", lambda inc: elsewhere.append(inc.data))
        assert await asker.request("t.ask", b"q") == b"answer"
        for _ in range(3):
            await asker.publish_raw("t.ask", b"q", reply="t.victim")
        await asker.flush()
        await wait_for(lambda: responder.refused_replies == 3, 5)
        await asyncio.sleep(0.2)
        assert elsewhere == []
        assert await asker.request("t.ask", b"q") == b"answer"
    finally:
        await responder.close()
        await asker.close()


async def test_no_one_reads_another_identitys_inbox(stack):
    admin = await Bus.connect(stack.url_for("admin"), "admin")
    client = await Bus.connect(stack.url_for("client"), "client")
    try:
        stolen: list[bytes] = []
        for pattern in ("_INBOX.>", "_INBOX.admin.>", "_INBOX.*.>", "_INBOX.worker-n1.>"):
            client.permission_violations.clear()
            await client.subscribe_raw(pattern, lambda inc: stolen.append(inc.data))
            await client.flush()
            await wait_for(lambda: any("subscription" in v for v in client.permission_violations), 5)
        # The admin's request and the manager's reply go by; the client sees none of it.
        assert (await ask(admin, subjects.TARGETS_LIST, b"{}"))["ok"]
        await asyncio.sleep(0.3)
        assert stolen == []
        # Its own inbox is its to read: its requests work.
        assert (await ask(client, subjects.TARGETS_LIST, b"{}"))["ok"]
    finally:
        await client.close()
        await admin.close()


async def test_a_tls_url_to_a_server_without_tls_sends_nothing(tmp_path, nats_auth):
    log = tmp_path / "nats.log"
    # -V: the server traces every protocol line it receives, CONNECT included.
    with NatsServer(jetstream=False, log_path=log, config_file=auth.config_path(nats_auth),
                    extra_args=("-V",)) as srv:
        creds = auth.creds_path(nats_auth, "client")
        t0 = time.monotonic()
        with pytest.raises(TLSRequired) as refused:
            await Bus.connect(f"tls://127.0.0.1:{srv.port}", "tls-client", creds=creds, connect_timeout_s=5.0)
        assert time.monotonic() - t0 < 3.0  # refused at once, not after the timeout
        text = str(refused.value)
        assert "\n" not in text and "offers no TLS" in text and "nothing was sent" in text, text
        await asyncio.sleep(0.3)
        assert "CONNECT" not in log.read_text()
        # The same server and key over nats:// do connect (and the trace shows it): the check can fail.
        bus = await Bus.connect(f"nats://127.0.0.1:{srv.port}", "plain-client", creds=creds)
        await bus.close()
        await wait_for(lambda: "CONNECT" in log.read_text(), 5)


async def test_a_tls_url_to_a_server_with_tls_connects(tmp_path, nats_auth, monkeypatch):
    """The check refuses plaintext only: a server that offers TLS is reached over TLS."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client trusts this private CA
    with NatsServer(jetstream=False, log_path=tmp_path / "nats.log", config_file=auth.config_path(nats_auth),
                    extra_args=("--tls", "--tlscert", str(cert), "--tlskey", str(key))) as srv:
        url = auth.with_credentials(f"tls://127.0.0.1:{srv.port}", auth.creds_path(nats_auth, "test"))
        a, b = await Bus.connect(url, "tls-a"), await Bus.connect(url, "tls-b")
        try:
            await b.subscribe_raw("t.ask", lambda inc: b.reply(inc, b"over tls"))
            assert await a.request("t.ask", b"q") == b"over tls"
        finally:
            await a.close()
            await b.close()
