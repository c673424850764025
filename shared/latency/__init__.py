"""Where a container's latency comes from: its own NATS events, its metrics endpoint, or Prometheus.

Why: a container used to be governed only if it published the project's
`LatencyEvent` on NATS. Model servers already export their request latency
as Prometheus histograms; these modules let the worker read it there.

- `spec`: the container labels that choose and configure a source (pure).
- `exposition`: the Prometheus text format to a histogram or summary
  snapshot, through prometheus_client's parser.
- `sources`: one small interface (`LatencySource.read`) with an HTTP
  implementation per kind (`prometheus`: scrape the container; `promql`: ask
  a Prometheus server); tests/contract/test_latency_sources.py runs the same
  behaviours against each.

The percentile math itself is pure and lives in `shared.core.quantiles`.
"""
