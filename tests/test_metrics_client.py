"""The Prometheus client's mapping of answers a healthy local Prometheus does not give on demand (overload, proxies,
broken bodies) to the error tree; the real-server cases are in test_metrics_prometheus.py."""

from __future__ import annotations

import json
import math
from urllib.parse import parse_qs

import httpx
import pytest

from gpuscale.errors import MetricsAccessDenied, MetricsError, MetricsUnavailable, QueryRejected, RetryKind
from gpuscale.metrics.prometheus import MetricSource, PrometheusClient


def _client(status: int, body: object, seen: list[httpx.Request] | None = None) -> PrometheusClient:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        return httpx.Response(status, content=content)

    return PrometheusClient(
        "http://prom.example:9090/",
        timeout=2.5,
        transport=httpx.MockTransport(handle),
        headers={"Authorization": "Bearer t"},
    )


def _ok(result_type: str, result: object) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": result_type, "result": result}}


def test_requests_are_form_posts_with_the_server_timeout_and_headers() -> None:
    seen: list[httpx.Request] = []
    client = _client(200, _ok("vector", [{"metric": {"a": "b"}, "value": [1700000000.5, "3.25"]}]), seen)
    assert client.value("sum(x)", at=1700000000.5) == 3.25
    with pytest.raises(MetricsUnavailable, match="not a matrix"):  # this fake answers every call with a vector
        client.usage("x", 10, 70, 30)
    q, r = seen
    assert (q.method, q.url.path, q.headers["authorization"]) == ("POST", "/api/v1/query", "Bearer t")
    assert parse_qs(q.content.decode()) == {"query": ["sum(x)"], "time": ["1700000000.500"], "timeout": ["2.5s"]}
    assert parse_qs(r.content.decode()) == {
        "query": ["x"],
        "start": ["10.000"],
        "end": ["70.000"],
        "step": ["30"],
        "timeout": ["2.5s"],
    }


def test_scalars_and_vectors_become_samples() -> None:
    assert _client(200, _ok("scalar", [5, "NaN"])).query("0/0")[0].labels == {}
    assert math.isnan(_client(200, _ok("scalar", [5, "NaN"])).query("0/0")[0].value)
    samples = _client(200, _ok("vector", [{"metric": {"gpu": "0"}, "value": [5, "+Inf"]}])).query("x")
    assert samples[0].labels == {"gpu": "0"} and samples[0].value == math.inf and samples[0].t == 5


@pytest.mark.parametrize(
    ("status", "body", "error", "fragment"),
    [
        (
            503,
            {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"},
            MetricsUnavailable,
            "timeout",
        ),
        (
            503,
            {"status": "error", "errorType": "unavailable", "error": "too many queries"},
            MetricsUnavailable,
            "too many",
        ),
        (
            422,
            {"status": "error", "errorType": "execution", "error": "many-to-many matching not allowed"},
            QueryRejected,
            "many-to-many",
        ),
        (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}, QueryRejected, "parse error"),
        (502, "<html>Bad Gateway</html>", MetricsUnavailable, "HTTP 502"),
        (401, "Unauthorized", MetricsAccessDenied, "refused the credentials"),
        (403, {"status": "error", "errorType": "forbidden", "error": "tenant"}, MetricsAccessDenied, "HTTP 403"),
        (200, "not json", MetricsUnavailable, "not JSON"),
        (200, [1, 2], MetricsUnavailable, "not a JSON object"),
        (200, {"status": "success", "data": {}}, MetricsUnavailable, "resultType"),
        (200, _ok("vector", [{"metric": {}}]), MetricsUnavailable, "malformed vector"),
        (200, _ok("vector", [{"metric": {}, "value": [1, "abc"]}]), MetricsUnavailable, "unreadable sample"),
        (200, _ok("string", [1, "s"]), MetricsUnavailable, "unexpected result type"),
    ],
)
def test_error_answers_map_to_the_most_specific_class(
    status: int, body: object, error: type[MetricsError], fragment: str
) -> None:
    with pytest.raises(error, match=fragment) as exc:
        _client(status, body).value("up")
    assert type(exc.value) is error
    assert exc.value.server == "http://prom.example:9090" and exc.value.query == "up"
    never = error in (QueryRejected, MetricsAccessDenied)
    assert exc.value.retry.kind == (RetryKind.NEVER if never else RetryKind.BACKOFF)
    if never:
        assert exc.value.status == status
    assert "Bearer" not in str(exc.value) and " t " not in f" {exc.value} "


def test_range_answers_that_are_not_matrices_are_rejected() -> None:
    with pytest.raises(MetricsUnavailable, match="not a matrix"):
        _client(200, _ok("vector", [])).query_range("x", 0, 60, 15)
    with pytest.raises(QueryRejected, match="step > 0"):
        _client(200, _ok("matrix", [])).query_range("x", 0, 60, 0)
    series = _client(200, _ok("matrix", [{"metric": {"p": "a"}, "values": [[0, "1"], [15, "2.5"]]}])).usage(
        "x", 0, 15, 15
    )
    assert series[0].points == ((0.0, 1.0), (15.0, 2.5)) and series[0].values() == [1.0, 2.5]


def test_the_client_is_a_metric_source() -> None:
    source: MetricSource = _client(200, _ok("scalar", [1, "4"]))
    assert source.value("4") == 4.0
