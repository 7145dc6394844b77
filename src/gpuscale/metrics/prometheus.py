"""A Prometheus HTTP API client (``/api/v1/query``, ``/api/v1/query_range``) on httpx.

Every failure is mapped to the metrics branch of :mod:`gpuscale.errors` and chained to its cause: a connection
failure, timeout, 5xx or unreadable body is :class:`MetricsUnavailable`; a refused query (``bad_data``,
``execution``) is :class:`QueryRejected`; refused credentials (401/403) are :class:`MetricsAccessDenied`; an answer
that is not one usable number is :class:`NoData`, :class:`TooManySeries` or :class:`NotANumber`. The client never
retries or sleeps: a scaler polls again at its next interval, and the error's ``retry`` policy says whether that is
worth it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import httpx

from gpuscale.errors import (
    MetricsAccessDenied,
    MetricsError,
    MetricsUnavailable,
    NoData,
    NotANumber,
    QueryRejected,
    TooManySeries,
)

DEFAULT_TIMEOUT_S = 10.0
_REJECTED = frozenset({"bad_data", "execution", "not_found", "not_acceptable"})
"""Prometheus ``errorType`` values that mean the query itself is wrong (the rest are server trouble)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series' value at one instant."""

    labels: Mapping[str, str]
    t: float
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    """One series over a range: ``points`` are ``(t, value)`` pairs in time order."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]

    def values(self) -> list[float]:
        """The values alone, in time order."""
        return [v for _, v in self.points]


class MetricSource(Protocol):
    """What a scaler or right-sizer needs from a metrics backend."""

    def value(self, query: str, at: float | None = None) -> float:
        """The single value of ``query`` now (or at Unix time ``at``). Raises :class:`MetricsError`."""
        ...

    def usage(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """Every series of ``query`` over ``[start, end]`` sampled every ``step`` seconds (may be empty)."""
        ...


def _number(raw: object, query: str, server: str) -> float:
    try:
        return float(raw)  # type: ignore[arg-type]  # Prometheus sends numbers as strings ("NaN", "+Inf" too)
    except (TypeError, ValueError) as exc:
        raise MetricsUnavailable(f"unreadable sample value {raw!r}", query=query, server=server) from exc


def _labels(raw: object) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in raw.items()}) if isinstance(raw, dict) else MappingProxyType({})


class PrometheusClient:
    """A synchronous client for one Prometheus (or any server speaking its HTTP API: Thanos, Mimir, VictoriaMetrics).

    ``timeout`` bounds each HTTP request and is also sent as the server-side query timeout. ``transport`` replaces
    the network (tests); ``headers`` are sent on every request (e.g. ``Authorization``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, headers=dict(headers or {}), transport=transport
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw API --------------------------------------------------------------------------------------------------

    def _call(self, path: str, params: dict[str, str], query: str) -> dict[str, Any]:
        params = {**params, "timeout": f"{self.timeout:g}s"}
        try:
            resp = self._http.post(path, data=params)
        except httpx.TimeoutException as exc:
            raise MetricsUnavailable(
                f"Prometheus at {self.base_url} did not answer within {self.timeout:g}s",
                query=query,
                server=self.base_url,
            ) from exc
        except httpx.HTTPError as exc:
            raise MetricsUnavailable(
                f"cannot reach Prometheus at {self.base_url}: {exc}", query=query, server=self.base_url
            ) from exc
        if resp.status_code in (401, 403):
            raise MetricsAccessDenied(
                f"Prometheus at {self.base_url} refused the credentials (HTTP {resp.status_code})",
                query=query,
                server=self.base_url,
                status=resp.status_code,
            )
        try:
            body = resp.json()
        except ValueError as exc:
            if resp.status_code >= 400:
                raise MetricsUnavailable(
                    f"Prometheus at {self.base_url} answered HTTP {resp.status_code}: {resp.text[:200]!r}",
                    query=query,
                    server=self.base_url,
                    status=resp.status_code,
                ) from exc
            raise MetricsUnavailable(
                f"Prometheus at {self.base_url} sent a body that is not JSON",
                query=query,
                server=self.base_url,
                status=resp.status_code,
            ) from exc
        if not isinstance(body, dict):
            raise MetricsUnavailable("Prometheus answer is not a JSON object", query=query, server=self.base_url)
        if body.get("status") != "success" or resp.status_code >= 400:
            error_type = str(body.get("errorType", ""))
            detail = str(body.get("error", "")) or f"HTTP {resp.status_code}"
            if error_type in _REJECTED or resp.status_code in (400, 422):
                raise QueryRejected(
                    f"Prometheus rejected the query ({error_type or resp.status_code}): {detail}",
                    error_type=error_type,
                    query=query,
                    server=self.base_url,
                    status=resp.status_code,
                )
            raise MetricsUnavailable(
                f"Prometheus failed ({error_type or resp.status_code}): {detail}",
                query=query,
                server=self.base_url,
                status=resp.status_code,
            )
        data = body.get("data")
        if not isinstance(data, dict) or "resultType" not in data:
            raise MetricsUnavailable("Prometheus answer has no data.resultType", query=query, server=self.base_url)
        return data

    def query(self, query: str, at: float | None = None) -> list[Sample]:
        """An instant query: every sample of ``query`` at ``at`` (Unix time; default: the server's now). A scalar
        result is one sample with no labels. A range-vector result is rejected: wrap it in an ``*_over_time``."""
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params, query)
        kind, result = data["resultType"], data.get("result")
        if kind == "scalar" and isinstance(result, list) and len(result) == 2:
            return [Sample(MappingProxyType({}), float(result[0]), _number(result[1], query, self.base_url))]
        if kind == "vector" and isinstance(result, list):
            try:
                pairs = [(item.get("metric"), *item["value"]) for item in result]
                return [Sample(_labels(m), float(t), _number(v, query, self.base_url)) for m, t, v in pairs]
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise MetricsUnavailable("malformed vector in the answer", query=query, server=self.base_url) from exc
        if kind == "matrix":
            raise QueryRejected(
                "the query returns a range vector, not a value: wrap it in e.g. avg_over_time(...)",
                error_type="bad_data",
                query=query,
                server=self.base_url,
            )
        raise MetricsUnavailable(f"unexpected result type {kind!r}", query=query, server=self.base_url)

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """A range query: every series of ``query`` from ``start`` to ``end`` (Unix times) every ``step`` seconds."""
        if step <= 0 or end < start:
            raise QueryRejected(
                f"a range query needs step > 0 and end >= start (got step={step}, start={start}, end={end})",
                error_type="bad_data",
                query=query,
                server=self.base_url,
            )
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._call("/api/v1/query_range", params, query)
        if data["resultType"] != "matrix" or not isinstance(data.get("result"), list):
            raise MetricsUnavailable(
                f"a range query answered {data['resultType']!r}, not a matrix", query=query, server=self.base_url
            )
        try:
            return [
                Series(
                    _labels(item.get("metric")),
                    tuple((float(t), _number(v, query, self.base_url)) for t, v in item.get("values", ())),
                )
                for item in data["result"]
            ]
        except (AttributeError, TypeError, ValueError) as exc:
            raise MetricsUnavailable("malformed matrix in the answer", query=query, server=self.base_url) from exc

    # -- MetricSource -----------------------------------------------------------------------------------------------

    def value(self, query: str, at: float | None = None) -> float:
        """The one value of ``query``: raises :class:`NoData` for no series, :class:`TooManySeries` for several,
        :class:`NotANumber` for NaN or ±Inf."""
        samples = self.query(query, at)
        if not samples:
            raise NoData("the query matched no series", query=query, server=self.base_url)
        if len(samples) > 1:
            raise TooManySeries(
                f"the query returned {len(samples)} series where one was expected; aggregate it with sum(), avg() "
                f"or max(); first labels: {_describe(samples[0].labels)}",
                count=len(samples),
                query=query,
                server=self.base_url,
            )
        v = samples[0].value
        if not math.isfinite(v):
            raise NotANumber(f"the query's value is {v}", query=query, server=self.base_url)
        return v

    def usage(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """:meth:`query_range` under the :class:`MetricSource` name."""
        return self.query_range(query, start, end, step)


def _describe(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


__all__: Sequence[str] = (
    "MetricSource",
    "MetricsError",
    "PrometheusClient",
    "Sample",
    "Series",
)
