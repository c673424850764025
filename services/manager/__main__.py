"""`python -m services.manager`: flags (each also an environment variable), then run."""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.manager.app import ManagerConfig, run
from shared import auth, subjects
from shared.core import registry
from shared.settings import DEFAULT_METRICS_ADDR, add_common, flag, nats_url, setup_logging


def parse(argv: list[str] | None = None) -> ManagerConfig:
    ap = argparse.ArgumentParser(
        prog="python -m services.manager",
        description="DQoES manager (QoE Analyst): accepts objectives on dqoes.targets, keeps them in "
        "JetStream, hands them to workers and publishes the cluster summary on dqoes.cluster.state.",
    )
    add_common(ap)
    flag(ap, "--store-creds", "DQOES_STORE_CREDS", None,
         help="credentials file of the connection that writes the objectives bucket (the store identity; "
         "default: --creds's, on a second connection)")
    flag(ap, "--bucket", "DQOES_BUCKET", subjects.KV_OBJECTIVES, help="JetStream key-value bucket for objectives")
    flag(ap, "--bucket-replicas", "DQOES_BUCKET_REPLICAS", 1, type=int, choices=(1, 3, 5),
         help="copies a NATS cluster keeps of the objectives bucket when the manager creates it (3: any one "
         "server can be lost; an existing bucket is used as it is; docs/guide/nats-cluster.md)")
    flag(ap, "--cluster-interval", "DQOES_CLUSTER_INTERVAL_S", 1.0, type=float, help="publish the cluster summary every N s")
    flag(ap, "--stale-after", "DQOES_STALE_AFTER_S", 15.0, type=float, help="forget a node silent for N s")
    flag(ap, "--metrics-port", "DQOES_METRICS_PORT", None, type=int,
         help="serve Prometheus metrics on http://ADDR:PORT/metrics (0: a free port; default: off)")
    flag(ap, "--metrics-addr", "DQOES_METRICS_ADDR", DEFAULT_METRICS_ADDR,
         help="address the metrics endpoint listens on (0.0.0.0: every interface)")
    flag(ap, "--placement", "DQOES_PLACEMENT", "flowcon", choices=registry.names("training"),
         help="where dqoes.submit puts a training job: flowcon (Algorithm 4) or default (spread)")
    a = ap.parse_args(argv)
    store_url = None
    if a.store_creds:
        try:
            store_url = auth.with_credentials(auth.split_url(a.nats)[0], auth.load(a.store_creds))
        except auth.AuthError as e:
            ap.error(str(e))
    return ManagerConfig(nats_url=nats_url(ap, a), store_url=store_url, bucket=a.bucket,
                         bucket_replicas=a.bucket_replicas, cluster_interval_s=a.cluster_interval,
                         stale_after_s=a.stale_after, metrics_port=a.metrics_port, metrics_addr=a.metrics_addr,
                         placement=a.placement, log_level=a.log_level, log_format=a.log_format)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    setup_logging(cfg.log_level, cfg.log_format, "manager")
    try:
        return asyncio.run(run(cfg))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
