"""Latency sources the worker polls: one small interface, an HTTP implementation per kind.

Why this shape: the worker only asks a source for the next window's reading
(`LatencySource.read`); how the number is fetched (scraping the container's
own metrics page, or a PromQL query to the operator's Prometheus server)
stays here, and one contract suite (tests/contract/test_latency_sources.py)
checks every implementation against the same behaviours.

A read never raises: a source that does not answer, answers an HTTP error
or a page that cannot give the metric returns a reading without a value
whose state says why ("unreachable", "bad", "empty", "idle"), and the next
read tries again, so a source recovers by itself.

HTTP is the standard library's, on a thread pool the caller gives (the
project has no async HTTP client; a blocking read never blocks the loop).
No proxy is used (the endpoints are the node's own containers or the
operator's server) and no redirect is followed: a container cannot send the
worker elsewhere.
"""

from __future__ import annotations

import asyncio
import http.client
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from shared.core import quantiles
from shared.core.quantiles import Snapshot, WindowReading
from shared.latency.exposition import MAX_BYTES, ExpositionError, MetricMissing, parse_metric

DEFAULT_TIMEOUT_S = 2.0


class SourceUnreachable(Exception):
    """The endpoint did not answer (refused, timed out, HTTP error); one line."""


class SourceAnswer(Exception):
    """The endpoint answered, but not with what was asked (an error body, wrong JSON); one line."""


Fetch = Callable[[str, float], bytes]
"""(url, timeout_s) -> body; raises SourceUnreachable or SourceAnswer."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise SourceUnreachable(f"HTTP {code} redirect to {newurl[:100]} (not followed)")


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def http_get(url: str, timeout_s: float) -> bytes:
    """GET `url`; the body (at most MAX_BYTES). SourceUnreachable on anything but an answer; an HTTP
    error status with a JSON body (Prometheus's bad-query answer) is a SourceAnswer with its error."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4, application/json"})
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            body: bytes = resp.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        detail = ""
        try:
            detail = str(orjson.loads(e.read(65536)).get("error", ""))
        except (orjson.JSONDecodeError, AttributeError, OSError, ValueError):
            pass
        if detail:
            raise SourceAnswer(f"HTTP {e.code}: {_one_line(detail)}") from None
        raise SourceUnreachable(f"HTTP {e.code} from {url}") from None
    except urllib.error.URLError as e:
        raise SourceUnreachable(f"{url}: {_one_line(str(e.reason))}") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise SourceUnreachable(f"{url}: {_one_line(str(e)) or type(e).__name__}") from None
    if len(body) > MAX_BYTES:
        raise SourceAnswer(f"answer over {MAX_BYTES} bytes")
    return body


class LatencySource(Protocol):
    """Reads one container's latency percentile, one window at a time."""

    kind: str

    @property
    def url(self) -> str:
        """Where it reads (for log lines and the status)."""

    async def read(self, now_s: float) -> WindowReading:
        """The reading for the window ending now (`now_s`: monotonic seconds); never raises."""


@dataclass
class ScrapeSource:
    """`prometheus`: scrape the container's own metrics page and compute the percentile of the requests
    that finished between two scrapes from the histogram's bucket increases (shared.core.quantiles)."""

    url: str
    metric: str
    quantile: float
    unit_s: float = 1.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    executor: Executor | None = None
    fetch: Fetch = http_get
    kind: str = "prometheus"
    match: tuple[tuple[str, str], ...] = ()
    """Only the series with these label values count (`dqoes.latency.match`)."""
    _before: Snapshot | None = None
    _before_s: float = 0.0

    async def read(self, now_s: float) -> WindowReading:
        loop = asyncio.get_running_loop()
        try:
            body = await loop.run_in_executor(self.executor, self.fetch, self.url, self.timeout_s)
            snapshot = parse_metric(body.decode("utf-8"), self.metric, self.match)
        except SourceUnreachable as e:
            return WindowReading("unreachable", detail=str(e))
        except MetricMissing as e:
            return WindowReading("empty", detail=str(e))
        except (SourceAnswer, ExpositionError) as e:
            return WindowReading("bad", detail=str(e))
        except UnicodeDecodeError:
            return WindowReading("bad", detail="the metrics page is not UTF-8")
        reading = quantiles.window(self.quantile, self._before, snapshot, now_s - self._before_s, self.unit_s)
        self._before, self._before_s = snapshot, now_s
        return reading


@dataclass
class PromQLSource:
    """`promql`: ask a Prometheus server (HTTP API /api/v1/query) for the percentile, and optionally
    for the request rate. The query must give one series (or a scalar); NaN is PromQL's "no requests
    in the window"."""

    base_url: str
    query: str
    rate_query: str | None = None
    unit_s: float = 1.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    executor: Executor | None = None
    fetch: Fetch = http_get
    kind: str = "promql"

    @property
    def url(self) -> str:
        return self._url(self.query)

    def _url(self, query: str) -> str:
        return self.base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})

    async def _value(self, query: str) -> float | None:
        """The query's one value; None: no series. Raises SourceUnreachable or SourceAnswer."""
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self.executor, self.fetch, self._url(query), self.timeout_s)
        return instant_value(body)

    async def read(self, now_s: float) -> WindowReading:
        try:
            value = await self._value(self.query)
        except SourceUnreachable as e:
            return WindowReading("unreachable", detail=str(e))
        except SourceAnswer as e:
            return WindowReading("bad", detail=str(e))
        rate = None
        if self.rate_query:
            try:
                rate = await self._value(self.rate_query)
            except (SourceUnreachable, SourceAnswer):
                rate = None
            rate = rate if rate is not None and math.isfinite(rate) and rate >= 0 else None
        if value is None:
            return WindowReading("empty", rate_per_s=rate, detail="the query gives no series")
        if math.isnan(value):
            return WindowReading("idle", rate_per_s=rate, detail="no requests in the window (the query gives NaN)")
        if not math.isfinite(value) or value <= 0:
            return WindowReading("bad", rate_per_s=rate, detail=f"the query gives {value}: not a latency")
        return WindowReading("ok", value * self.unit_s, rate_per_s=rate)


def instant_value(body: bytes) -> float | None:
    """The one value of a Prometheus instant-query answer (a vector of one series, or a scalar);
    None for an empty vector. SourceAnswer for an error answer or several series."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise SourceAnswer("the answer is not JSON") from None
    if not isinstance(doc, dict):
        raise SourceAnswer("the answer is not a JSON object")
    if doc.get("status") != "success":
        raise SourceAnswer(f"query failed: {_one_line(str(doc.get('error') or doc.get('status')))}")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise SourceAnswer("the answer has no data")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        sample = result
    elif kind == "vector" and isinstance(result, list):
        if not result:
            return None
        if len(result) > 1:
            raise SourceAnswer(f"the query gives {len(result)} series: aggregate them to one "
                               "(e.g. histogram_quantile(0.95, sum by (le) (rate(...))))")
        sample = result[0].get("value") if isinstance(result[0], dict) else None
    else:
        raise SourceAnswer(f"the query gives a {kind}, not one number (an instant vector or scalar)")
    if not (isinstance(sample, list) and len(sample) == 2 and isinstance(sample[1], str)):
        raise SourceAnswer("the answer's value is not [time, \"number\"]")
    try:
        return float(sample[1])
    except ValueError:
        raise SourceAnswer(f"the answer's value {sample[1][:40]!r} is not a number") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]
