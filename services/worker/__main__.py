"""`python -m services.worker`: flags (each also an environment variable), then run."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys

from services.worker.app import WorkerConfig, run
from services.worker.training import SPLITS
from shared.core import registry
from shared.runtime.base import RuntimeFailure
from shared.runtime.factory import KINDS, default_node
from shared.settings import (
    DEFAULT_METRICS_ADDR,
    add_common,
    flag,
    nats_url,
    parse_assignments,
    setup_logging,
    switch,
)


def _params(ap: argparse.ArgumentParser, text: str | None) -> tuple[tuple[str, float], ...]:
    """`--param a=1,b=2` as ((a, 1.0), (b, 2.0)); names are checked against the policy when it is built."""
    try:
        return tuple(parse_assignments(x.strip() for x in (text or "").split(",") if x.strip()).items())
    except ValueError as e:
        ap.error(f"--param: {e}")


def parse(argv: list[str] | None = None) -> WorkerConfig:
    ap = argparse.ArgumentParser(
        prog="python -m services.worker",
        description="DQoES worker controller for one node: subscribes to its containers' batch "
        "latencies, runs the control rounds, applies CPU limits and publishes decisions and state.",
        epilog="policies:\n" + registry.describe() + "\ntraining policies:\n" + registry.describe("training"), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(ap)
    flag(ap, "--node", "DQOES_NODE", None,
         help="this node's name (default: with --runtime docker the engine's name, `docker info` Name, which "
         "a worker in a container reaches through the mounted socket; else the hostname)")
    flag(ap, "--policy", "DQOES_POLICY", "learned", help="allocation policy (below; default learned, the recommended one; dqoes: the paper's)", choices=registry.names())
    flag(ap, "--runtime", "DQOES_RUNTIME", "sim", help="where containers run", choices=KINDS)
    flag(ap, "--scenario", "DQOES_SCENARIO", None, help="sim runtime: built-in scenario or file")
    flag(ap, "--seed", "DQOES_SEED", 1, type=int, help="sim runtime: random seed")
    flag(ap, "--time-scale", "DQOES_TIME_SCALE", 1.0, type=float, help="sim runtime: scenario seconds per wall second")
    flag(ap, "--start-at", "DQOES_START_AT", None, type=float, help="sim runtime: unix time of scenario time 0")
    flag(ap, "--cores", "DQOES_CORES", None, type=float, help="docker/cgroup: the node's cores (default: all)")
    flag(ap, "--alpha", "DQOES_ALPHA", None, type=float, help="tolerance band (default 0.10 or the scenario's)")
    flag(ap, "--beta", "DQOES_BETA", None, type=float, help="step size (default 0.10 or the scenario's)")
    flag(ap, "--interval", "DQOES_INTERVAL_S", None, type=float, help="initial control interval, s")
    flag(ap, "--param", "DQOES_POLICY_PARAMS", None,
         help="the policy's parameters from the start, NAME=VALUE[,NAME=VALUE...] (any that `dqoes control` "
         "sets, e.g. half_life_s=0 for the learned policy)")
    flag(ap, "--state-interval", "DQOES_STATE_INTERVAL_S", 2.0, type=float, help="publish node state every N wall seconds")
    flag(ap, "--cgroup-root", "DQOES_CGROUP_ROOT", "/sys/fs/cgroup", help="docker/cgroup: the cgroup filesystem")
    flag(ap, "--docker-url", "DQOES_DOCKER_URL", None, help="docker: engine URL (default: the environment's)")
    switch(ap, "--require-node-label", "DQOES_REQUIRE_NODE_LABEL", False,
           help="docker: manage only containers labelled dqoes.node=<this node>, not unlabelled ones "
           "(for several logical nodes on one engine)")
    switch(ap, "--cpu-weights", "DQOES_CPU_WEIGHTS", True,
           help="docker/cgroup: set each container's CPU weight from its limit whenever the limit is set, "
           "so that a full node delivers a large limit as fully as a small one (docs/design/learned.md, CPU "
           "weights); --no-cpu-weights leaves weights alone")
    flag(ap, "--workload-batch", "DQOES_WORKLOAD_BATCH", 100, type=int,
         help="cgroup runtime with --scenario: images a batch of each inference process")
    flag(ap, "--workload-resolution", "DQOES_WORKLOAD_RESOLUTION", None, type=int,
         help="cgroup runtime with --scenario: image side in pixels (default: the model's)")
    flag(ap, "--metrics-port", "DQOES_METRICS_PORT", None, type=int,
         help="serve Prometheus metrics on http://ADDR:PORT/metrics (0: a free port; default: off)")
    flag(ap, "--metrics-addr", "DQOES_METRICS_ADDR", DEFAULT_METRICS_ADDR,
         help="address the metrics endpoint listens on (0.0.0.0: every interface)")
    flag(ap, "--training-policy", "DQOES_TRAINING_POLICY", "flowcon",
         choices=(*registry.names("training"), "none"),
         help="policy of the node's training containers (label dqoes.kind=training): flowcon, default "
         "(no limits) or none (leave them alone)")
    flag(ap, "--training-split", "DQOES_TRAINING_SPLIT", "inference-first", choices=SPLITS,
         help="inference-first: training shares what inference leaves (at least one core); shared: no split")
    flag(ap, "--training-stale", "DQOES_TRAINING_STALE_S", 60.0, type=float,
         help="seconds without a value before a training job counts as stale")
    flag(ap, "--on-stop", "DQOES_ON_STOP", "restore", choices=("keep", "restore"),
         help="on a clean stop: restore the CPU limits the containers had before (default), or keep those "
         "in force")
    flag(ap, "--inference-creds", "DQOES_INFERENCE_CREDS", None,
         help="credentials file the processes this worker starts connect with (the node's inference identity; "
         "default: inference-NODE.creds beside --creds); they never get the worker's")
    flag(ap, "--state-dir", "DQOES_STATE_DIR_WORKER", None,
         help="directory keeping, across restarts, the containers' original limits (for --on-stop restore) "
         "and what `dqoes control` set (docs/guide/operations.md)")
    flag(ap, "--prometheus-url", "DQOES_PROMETHEUS_URL", None,
         help="the Prometheus server (e.g. http://127.0.0.1:9090) queried for containers labelled "
         "dqoes.latency.source=promql (docs/guide/latency-sources.md)")
    a = ap.parse_args(argv)
    if a.prometheus_url is not None and not a.prometheus_url.startswith(("http://", "https://")):
        ap.error("--prometheus-url must be an http:// or https:// URL")
    if not a.node and a.runtime != "docker":
        a.node = default_node(a.runtime)
    if a.runtime == "sim" and not a.scenario:
        ap.error("--runtime sim needs --scenario (a built-in name or a file)")
    if registry.spec(a.policy).needs_curves and a.runtime != "sim":
        ap.error(f"--policy {a.policy} needs every container's latency curve: only with --runtime sim")
    if a.time_scale <= 0:
        ap.error("--time-scale must be > 0")
    params = _params(ap, a.param)
    return WorkerConfig(
        nats_url=nats_url(ap, a), nats_creds=a.creds, inference_creds=a.inference_creds, on_stop=a.on_stop, state_dir=a.state_dir,
        node=a.node or "", policy=a.policy, runtime=a.runtime, scenario=a.scenario,
        seed=a.seed, time_scale=a.time_scale, start_at=a.start_at, cores=a.cores, alpha=a.alpha, beta=a.beta,
        initial_interval_s=a.interval, params=params, state_interval_s=a.state_interval, cgroup_root=a.cgroup_root,
        docker_url=a.docker_url, workload_batch=a.workload_batch, workload_resolution=a.workload_resolution,
        require_node_label=a.require_node_label, cpu_weights=a.cpu_weights, metrics_port=a.metrics_port,
        metrics_addr=a.metrics_addr, prometheus_url=a.prometheus_url,
        training_policy=a.training_policy, training_split=a.training_split, training_stale_s=a.training_stale,
        log_level=a.log_level,
        log_format=a.log_format,
    )


def with_node(cfg: WorkerConfig) -> WorkerConfig:
    """`cfg` with its node named: a docker worker given none takes the engine's name (RuntimeFailure if
    the engine cannot be asked). Done when the worker starts, not while parsing, which asks no engine."""
    if cfg.node:
        return cfg
    return dataclasses.replace(cfg, node=default_node(cfg.runtime, cfg.docker_url))


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = with_node(parse(argv))
    except RuntimeFailure as e:
        print(f"python -m services.worker: error: {e}; give --node", file=sys.stderr)
        return 2
    setup_logging(cfg.log_level, cfg.log_format, f"worker[{cfg.node}]")
    try:
        return asyncio.run(run(cfg))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
