"""Latency-source configuration and parsing without a network: labels, pages, answers, addresses.

The sources themselves run on real parts in tests/contract/test_latency_sources.py
and tests/integration/test_latency_prometheus.py.
"""

from __future__ import annotations

import math
import re

import orjson
import pytest

from services.worker.polling import endpoint
from shared.core.quantiles import Histogram, Summary
from shared.latency.exposition import ExpositionError, MetricMissing, parse_metric
from shared.latency.sources import SourceAnswer, instant_value
from shared.latency.spec import SourceSpec, parse_source, substitute
from shared.runtime.base import RuntimeContainer
from shared.runtime.docker import address_of

PROM = {"dqoes.latency.source": "prometheus", "dqoes.latency.port": "8000",
        "dqoes.latency.metric": "request_latency_seconds"}


@pytest.mark.parametrize("labels, want", [
    ({}, SourceSpec()),
    ({"dqoes.latency.source": "NATS"}, SourceSpec()),
    (PROM, SourceSpec("prometheus", port=8000, metric="request_latency_seconds")),
    ({**PROM, "dqoes.latency.metric": "m_bucket", "dqoes.latency.path": "/stats/prometheus",
      "dqoes.latency.percentile": "99", "dqoes.latency.window_s": "30", "dqoes.latency.unit": "ms",
      "dqoes.latency.host": "10.0.0.7"},
     SourceSpec("prometheus", 99.0, 30.0, 0.001, 8000, "/stats/prometheus", "m", "10.0.0.7")),
    ({**PROM, "dqoes.latency.match": " path=/v2/models/m/infer , method=POST"},
     SourceSpec("prometheus", port=8000, metric="request_latency_seconds",
                match=(("method", "POST"), ("path", "/v2/models/m/infer")))),
    ({**PROM, "dqoes.latency.match": "q=a=b"},
     SourceSpec("prometheus", port=8000, metric="request_latency_seconds", match=(("q", "a=b"),))),
    ({"dqoes.latency.source": "promql", "dqoes.latency.query": 'histogram_quantile(0.9, rate(m_bucket{c="{name}"}[1m]))'},
     SourceSpec("promql", query='histogram_quantile(0.9, rate(m_bucket{c="{name}"}[1m]))')),
])
def test_labels_choose_the_source(labels: dict[str, str], want: SourceSpec) -> None:
    assert parse_source(labels) == want


@pytest.mark.parametrize("labels, words", [
    ({"dqoes.latency.source": "statsd"}, "choose nats, prometheus, promql"),
    ({"dqoes.latency.source": "prometheus", "dqoes.latency.metric": "m"}, "needs dqoes.latency.port"),
    ({**PROM, "dqoes.latency.port": "80000"}, "not a port"),
    ({**PROM, "dqoes.latency.port": "²"}, "not a port"),
    ({**PROM, "dqoes.latency.metric": ""}, "needs dqoes.latency.metric"),
    ({**PROM, "dqoes.latency.metric": "a-b"}, "not a Prometheus metric name"),
    ({**PROM, "dqoes.latency.percentile": "100"}, "not a number in (0, 100)"),
    ({**PROM, "dqoes.latency.percentile": "nan"}, "not a number"),
    ({**PROM, "dqoes.latency.window_s": "0.1"}, "dqoes.latency.window_s"),
    ({**PROM, "dqoes.latency.unit": "us"}, "choose s or ms"),
    ({**PROM, "dqoes.latency.path": "metrics"}, "not a URL path"),
    ({**PROM, "dqoes.latency.host": "a b"}, "not a host name"),
    ({"dqoes.latency.source": "promql"}, "needs dqoes.latency.query"),
    ({**PROM, "dqoes.latency.match": "path"}, "dqoes.latency.match='path': expected name=value"),
    ({**PROM, "dqoes.latency.match": "a-b=1"}, "Prometheus label names"),
    ({**PROM, "dqoes.latency.match": "a=1,a=2"}, "label 'a' given twice"),
    ({**PROM, "dqoes.latency.match": "a=\x00"}, "printable"),
    ({**PROM, "dqoes.latency.match": ",".join(f"l{i}=1" for i in range(9))}, "at most 8"),
    ({"dqoes.latency.source": "promql", "dqoes.latency.query": "up\x07or x"}, "printable"),
])
def test_a_malformed_label_is_one_line_naming_it(labels: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        parse_source(labels)
    assert "\n" not in str(e.value)


def test_query_templates_keep_promql_braces() -> None:
    q = substitute('histogram_quantile(0.95, rate(m_bucket{container="{name}",node="{node}"}[30s]))',
                   "web-1", "n1", None)
    assert q == 'histogram_quantile(0.95, rate(m_bucket{container="web-1",node="n1"}[30s]))'
    assert substitute('{model}', 'x', 'n', 'a"b') == 'a\\"b'


PAGE = """# HELP m Request latency.
# TYPE m histogram
m_bucket{le="0.1",route="/a"} 3
m_bucket{le="+Inf",route="/a"} 4
m_bucket{le="0.1",route="/b"} 1
m_bucket{le="+Inf",route="/b"} 1
m_count{route="/a"} 4
m_count{route="/b"} 1
m_sum{route="/a"} 0.9
m_sum{route="/b"} 0.05
# TYPE other counter
other_total 5
"""


def test_a_histogram_page_is_added_up_by_bound() -> None:
    h = parse_metric(PAGE, "m")
    assert isinstance(h, Histogram) and h.buckets == ((0.1, 4.0), (math.inf, 5.0))
    assert h.sum_s == pytest.approx(0.95)


def test_a_matcher_adds_up_only_the_series_it_names() -> None:
    h = parse_metric(PAGE, "m", (("route", "/b"),))
    assert isinstance(h, Histogram) and h.buckets == ((0.1, 1.0), (math.inf, 1.0))
    assert h.sum_s == pytest.approx(0.05)
    both = parse_metric(PAGE, "m", (("route", "/a"),))
    assert isinstance(both, Histogram) and both.buckets == ((0.1, 3.0), (math.inf, 4.0))
    # no series with those values yet (a server before its first inference request): missing, not malformed
    with pytest.raises(MetricMissing, match="route=/c"):
        parse_metric(PAGE, "m", (("route", "/c"),))
    with pytest.raises(MetricMissing):
        parse_metric(PAGE, "m", (("route", "/a"), ("method", "GET")))


def test_a_page_without_type_lines_and_a_summary() -> None:
    assert parse_metric('m_bucket{le="1"} 1\nm_bucket{le="+Inf"} 2\n', "m") == Histogram(((1.0, 1.0), (math.inf, 2.0)))
    page = '# TYPE s summary\ns{quantile="0.5"} 0.1\ns{quantile="0.95"} 0.3\ns_count 7\ns_sum 1.2\n'
    assert parse_metric(page, "s") == Summary(((0.5, 0.1), (0.95, 0.3)), 7.0, 1.2)


@pytest.mark.parametrize("page, words", [
    ("m_bucket{le=0.1} 3", "Prometheus text format"),
    ('m_bucket{le="0.1"} 3\n', "no +Inf bucket"),
    ('m_bucket{le="x"} 3\n', "le='x' is not a number"),
    ('m_bucket{le="+Inf"} -3\n', "a count is a finite number"),
    ('s{quantile="0.5",a="1"} 1\ns{quantile="0.5",a="2"} 2\ns_count 1\n', "several series"),
    ('s{quantile="0.5"} 1\n', "without s_count"),
    ('m{quantile="0.5"} 1\nm_bucket{le="+Inf"} 1\nm_count 1\n', "both buckets and quantiles"),
])
def test_a_page_that_cannot_give_the_metric_says_why(page: str, words: str) -> None:
    metric = "s" if page.startswith("s") else "m"
    with pytest.raises(ExpositionError, match=re.escape(words)):
        parse_metric(page, metric)


def test_a_page_without_the_metric_is_missing_not_malformed() -> None:
    with pytest.raises(MetricMissing):
        parse_metric("other_total 1\n", "m")


def answer(result: object, kind: str = "vector", status: str = "success") -> bytes:
    return orjson.dumps({"status": status, "data": {"resultType": kind, "result": result}})


def test_promql_answers() -> None:
    assert instant_value(answer([{"metric": {}, "value": [1.7e9, "0.25"]}])) == 0.25
    assert math.isnan(instant_value(answer([{"metric": {}, "value": [1.7e9, "NaN"]}])) or 0.0)
    assert instant_value(answer([1.7e9, "2"], "scalar")) == 2.0
    assert instant_value(answer([])) is None
    for body, words in [(answer([{"value": [1, "1"]}, {"value": [1, "2"]}]), "2 series"),
                        (answer([], "matrix"), "matrix"), (b"<html>", "not JSON"),
                        (orjson.dumps({"status": "error", "error": "bad"}), "query failed: bad"),
                        (answer([{"value": [1, "x"]}]), "not a number")]:
        with pytest.raises(SourceAnswer, match=words):
            instant_value(body)


def test_where_the_worker_scrapes() -> None:
    spec = parse_source({**PROM, "dqoes.latency.path": "/m", "dqoes.latency.host": "10.1.2.3"})
    process = RuntimeContainer("c", "c", "n1")  # sim/cgroup: the runtime knows no address
    assert endpoint(process, spec) == "http://10.1.2.3:8000/m"
    assert endpoint(process, parse_source(PROM)) == "http://127.0.0.1:8000/metrics"
    docker = RuntimeContainer("c", "c", "n1", address="172.17.0.5")  # its own address, never the label
    assert endpoint(docker, spec) == "http://172.17.0.5:8000/m"
    published = RuntimeContainer("c", "c", "n1", address="127.0.0.1", published_ports={8000: 32768})
    assert endpoint(published, spec) == "http://127.0.0.1:32768/m"


def test_docker_address_from_inspect() -> None:
    bridge = {"NetworkSettings": {"IPAddress": "172.17.0.5", "Ports": {"8000/tcp": [{"HostPort": "32768"}]}}}
    assert address_of(bridge) == ("172.17.0.5", {})
    network = {"NetworkSettings": {"IPAddress": "", "Networks": {"proj_default": {"IPAddress": "172.20.0.3"}}}}
    assert address_of(network) == ("172.20.0.3", {})
    host = {"NetworkSettings": {"IPAddress": "", "Networks": {"host": {"IPAddress": ""}},
                                "Ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "32768"}],
                                          "9000/udp": [{"HostPort": "9"}], "7000/tcp": None}}}
    assert address_of(host) == ("127.0.0.1", {8000: 32768})
    assert address_of({}) == ("127.0.0.1", {})
