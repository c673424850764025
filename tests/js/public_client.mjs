// A client of DQoES written against docs/api.md only: nats.js, JSON, the public subjects.
// It lists the containers, picks one that is running, sets an objective for it, reads it
// back, clears it and checks it is gone; then the same for a service-level percentile
// objective (every container with the picked one's model label). Prints one JSON line of what it saw; exits 1 on
// any surprise. Usage: node public_client.mjs 'nats://127.0.0.1:4222?creds=client.creds' [objective_s]
import { readFileSync } from "node:fs";
import { connect, JSONCodec, nkeyAuthenticator } from "nats";

const url = process.argv[2];
const objective = Number(process.argv[3] ?? "30");
const jc = JSONCodec();

function fail(why, extra) {
  console.error(`public_client: ${why}`, extra === undefined ? "" : JSON.stringify(extra));
  process.exit(1);
}

async function ask(nc, subject, body) {
  const payload = body === undefined ? new Uint8Array() : jc.encode(body);
  const reply = jc.decode((await nc.request(subject, payload, { timeout: 3000 })).data);
  if (typeof reply.ok !== "boolean") fail(`${subject}: reply without a boolean "ok"`, reply);
  return reply;
}

// The deployment's client credentials: the URL names the file (nats://host:port?creds=PATH),
// JSON with the identity's nkey seed and its own inbox prefix (docs/guide/security.md). The
// server's nonce is signed with the seed; replies come to the identity's inbox, the only one it may read.
const parsed = new URL(url.replace(/^nats:/, "http:"));
const opts = { servers: `${parsed.hostname}:${parsed.port}`, name: "nats.js public client" };
const credsFile = parsed.searchParams.get("creds");
if (credsFile) {
  const creds = JSON.parse(readFileSync(credsFile, "utf8"));
  opts.authenticator = nkeyAuthenticator(new TextEncoder().encode(creds.seed));
  opts.inboxPrefix = creds.inbox_prefix;
}
const nc = await connect(opts);
try {
  const listed = await ask(nc, "dqoes.cluster.containers");
  if (!listed.ok || !Array.isArray(listed.containers) || listed.containers.length === 0) {
    fail("no containers listed", listed);
  }
  const pick = listed.containers.find((c) => c.latency_s !== null) ?? listed.containers[0];
  const name = pick.container;

  const set = await ask(nc, "dqoes.targets", { container: name, objective });
  if (!set.ok || set.objective_s !== objective) fail("set refused", set);

  const got = await ask(nc, "dqoes.targets.get", { container: name });
  if (!got.ok || got.target.objective_s !== objective || got.target.container !== name) {
    fail("get does not read back what was set", got);
  }
  const all = await ask(nc, "dqoes.targets.list", {});
  if (!all.ok || !all.targets.some((t) => t.container === name)) fail("list misses it", all);

  const typo = await ask(nc, "dqoes.targets.get", { contaner: name });
  if (typo.ok || !typo.error.includes("unknown field")) fail("a typo was not refused", typo);

  const cleared = await ask(nc, "dqoes.targets.clear", { container: name });
  if (!cleared.ok || cleared.cleared !== true) fail("clear refused", cleared);
  const gone = await ask(nc, "dqoes.targets.get", { container: name });
  if (gone.ok) fail("still stored after clear", gone);

  // A service objective: p95 over 30 s, for every container labelled with the picked one's model.
  const service = `dqoes.model=${pick.model}`;
  const svc = await ask(nc, "dqoes.targets", { service, objective, percentile: 95, window_s: 30 });
  if (!svc.ok || svc.service !== service || svc.percentile !== 95 || svc.window_s !== 30) {
    fail("service objective refused", svc);
  }
  const svcList = await ask(nc, "dqoes.targets.list", {});
  const row = svcList.ok && svcList.targets.find((t) => t.service === service);
  if (!row || row.percentile !== 95 || row.objective_s !== objective || row.container !== null) {
    fail("list misses the service objective", svcList);
  }
  const bad = await ask(nc, "dqoes.targets", { service, objective, percentile: 100 });
  if (bad.ok || !bad.error.startsWith("percentile:")) fail("a percentile of 100 was not refused", bad);
  const svcCleared = await ask(nc, "dqoes.targets.clear", { service });
  if (!svcCleared.ok || svcCleared.cleared !== true || svcCleared.service !== service) {
    fail("service clear refused", svcCleared);
  }
  const svcGone = await ask(nc, "dqoes.targets.get", { service });
  if (svcGone.ok) fail("service objective still stored after clear", svcGone);

  console.log(JSON.stringify({
    containers: listed.containers.length,
    picked: { container: name, node: pick.node, model: pick.model },
    set: { objective_s: set.objective_s, node: set.node, revision: set.revision },
    got: got.target,
    cleared: { previous_objective_s: cleared.previous_objective_s },
    after_clear: gone,
    service: { listed: row, refused: bad.error, cleared: svcCleared.previous_objective_s, after_clear: svcGone },
  }));
} finally {
  await nc.drain();
}
