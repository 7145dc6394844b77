"""The error tree of gpuscale's boundaries.

Every error raised across a boundary (a cloud provider, the Kubernetes API, user input) is mapped to the most
specific class here, chained to its cause (``raise ... from exc``), and carries its retry policy, so callers decide
what to do from the class and :attr:`GpuscaleError.retry` alone.

    GpuscaleError
    ├── InputError                      bad user input: names the document / field and the fix (exit code 2, HTTP 422)
    └── ProviderError                   a cloud provider call failed
        ├── CapacityError               the offering cannot be had now: mark it unavailable, try the next one
        │   └── InsufficientCapacity
        ├── QuotaExceeded               account quota or pool-count limit: back off this pool
        ├── RateLimited                 429: retry after ``retry_after`` seconds
        ├── TransientProviderError      5xx, timeouts, connection resets: retry with backoff
        ├── InvalidProviderRequest      400: our request is wrong (carries the API's ``field`` and ``reason``)
        ├── AuthenticationError         401/403 or a missing token: do not retry, report
        └── NotFound                    404 on a resource we expected: treat as already gone
    └── MetricsError                    a metrics query failed: retried at a later poll, never by sleeping
        ├── MetricsUnavailable          connection refused, timeout, 5xx, an unreadable answer: back off
        ├── QueryRejected               Prometheus refused the query (bad_data, execution): fix the query
        ├── MetricsAccessDenied         401/403 from the server or a proxy in front of it: fix the credentials
        └── MetricDataError             the answer is not one usable number
            ├── NoData                  no series matched
            ├── TooManySeries           several series where one was expected: aggregate the query
            └── NotANumber              NaN or ±Inf
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RetryKind(StrEnum):
    """How a failed operation should be retried."""

    NEVER = "never"
    BACKOFF = "backoff"
    AFTER = "after"
    NEXT_OFFERING = "next-offering"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Whether and when to retry. ``delay_s`` is the minimum delay for AFTER, the base delay for BACKOFF."""

    kind: RetryKind
    delay_s: float = 0.0
    max_attempts: int = 0


class GpuscaleError(Exception):
    """Root of every error gpuscale raises on purpose."""

    retry: RetryPolicy = RetryPolicy(RetryKind.NEVER)


ECHO_CHARS = 72
"""Longest echo of an input value in a message; longer values are cut and their length given."""


def short_repr(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters: ``'aaaa…' (2,000,000 chars)``. Never builds the whole repr of a
    huge container."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
        return text if len(value) <= limit and len(text) <= limit + 2 else f"{text[:limit]}… ({len(value):,} chars)"
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > limit:
        return f"{type(value).__name__} of {len(value):,} items"
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # a self-containing structure, or an int too long to print
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} chars)"


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with the full length when cut."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} chars)"


class InputError(GpuscaleError):
    """Bad user input. ``where`` names the document and field path, ``value`` the offending value.

    The message echoes only a short prefix of the value (:func:`short_repr`), and ``where``, ``message`` and ``fix``
    are cut too, so a hostile input never yields a huge message."""

    def __init__(self, message: str, *, where: str = "", value: object = None, fix: str = "") -> None:
        self.reason = message
        self.where = where
        self.value = value
        self.fix = fix
        parts = [f"{shorten(where, 200)}: " if where else "", shorten(message, 300)]
        if value is not None:
            parts.append(f" (got {short_repr(value)})")
        if fix:
            parts.append(f"; {shorten(fix, 1000)}")
        super().__init__("".join(parts))


class ProviderError(GpuscaleError):
    """A cloud provider operation failed. ``provider`` names the provider; ``status`` the HTTP status if any."""

    retry = RetryPolicy(RetryKind.BACKOFF, delay_s=2.0, max_attempts=5)

    def __init__(self, message: str, *, provider: str = "", status: int | None = None) -> None:
        self.provider = provider
        self.status = status
        super().__init__(message)


class CapacityError(ProviderError):
    """The requested offering cannot be provided now."""

    retry = RetryPolicy(RetryKind.NEXT_OFFERING)


class InsufficientCapacity(CapacityError):
    """The provider has no capacity for this instance type in this zone / capacity type."""


class QuotaExceeded(ProviderError):
    """An account quota (or a configured pool-count limit) is reached."""

    retry = RetryPolicy(RetryKind.BACKOFF, delay_s=60.0, max_attempts=0)


class RateLimited(ProviderError):
    """The provider throttled us (HTTP 429)."""

    def __init__(self, message: str, *, provider: str = "", retry_after: float = 1.0) -> None:
        super().__init__(message, provider=provider, status=429)
        self.retry_after = retry_after
        self.retry = RetryPolicy(RetryKind.AFTER, delay_s=retry_after, max_attempts=10)


class TransientProviderError(ProviderError):
    """A server error, timeout or dropped connection: retry with backoff."""

    retry = RetryPolicy(RetryKind.BACKOFF, delay_s=1.0, max_attempts=5)


class InvalidProviderRequest(ProviderError):
    """The provider rejected our request as invalid (HTTP 400). ``field`` and ``reason`` come from the API."""

    retry = RetryPolicy(RetryKind.NEVER)

    def __init__(self, reason: str, *, provider: str = "", field: str | None = None, status: int | None = 400) -> None:
        self.reason = reason
        self.field = field
        msg = f"{field}: {reason}" if field else reason
        super().__init__(msg, provider=provider, status=status)


class AuthenticationError(ProviderError):
    """Missing or rejected credentials. Never retried; the message never contains the credential."""

    retry = RetryPolicy(RetryKind.NEVER)


class NotFound(ProviderError):
    """The resource does not exist (any more)."""

    retry = RetryPolicy(RetryKind.NEVER)


class MetricsError(GpuscaleError):
    """A metrics query failed. ``query`` is the PromQL, ``server`` the base URL. The caller retries at its next poll
    (the retry policy says how eagerly); nothing here sleeps."""

    retry = RetryPolicy(RetryKind.BACKOFF, delay_s=5.0, max_attempts=0)

    def __init__(self, message: str, *, query: str = "", server: str = "", status: int | None = None) -> None:
        self.query = query
        self.server = server
        self.status = status
        super().__init__(f"{message} (query {shorten(query, 200)!r})" if query else message)


class MetricsUnavailable(MetricsError):
    """The metrics server could not be reached or answered with a server error or an unreadable body."""


class QueryRejected(MetricsError):
    """The server refused the query (``error_type`` is Prometheus's ``errorType``, e.g. ``bad_data``). Never retried
    unchanged: the query must be fixed."""

    retry = RetryPolicy(RetryKind.NEVER)

    def __init__(
        self, message: str, *, error_type: str = "", query: str = "", server: str = "", status: int | None = None
    ) -> None:
        self.error_type = error_type
        super().__init__(message, query=query, server=server, status=status)


class MetricsAccessDenied(MetricsError):
    """The server (or an authenticating proxy) refused our credentials (HTTP 401/403). Never retried unchanged; the
    message never contains the credential."""

    retry = RetryPolicy(RetryKind.NEVER)


class MetricDataError(MetricsError):
    """The query ran but its answer is not one usable number."""

    retry = RetryPolicy(RetryKind.BACKOFF, delay_s=5.0, max_attempts=0)


class NoData(MetricDataError):
    """No series matched (the exporter may not be scraped yet, or the selector is wrong)."""


class TooManySeries(MetricDataError):
    """Several series where one was expected. ``count`` series came back: aggregate the query (sum, avg, max)."""

    retry = RetryPolicy(RetryKind.NEVER)

    def __init__(self, message: str, *, count: int, query: str = "", server: str = "") -> None:
        self.count = count
        super().__init__(message, query=query, server=server)


class NotANumber(MetricDataError):
    """The value is NaN or infinite (e.g. a ratio over an idle denominator)."""
