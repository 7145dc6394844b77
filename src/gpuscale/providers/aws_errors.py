"""AWS error codes -> the gpuscale error tree, and the boto3 client settings every AWS call uses.

One place maps both kinds of AWS failure: an HTTP error response (``botocore.exceptions.ClientError``, its ``Code``)
and an error item of an ``instant`` fleet (``CreateFleet`` answers 200 with ``Errors[].ErrorCode`` per launch
template override it could not fill). botocore's own retries are off (``total_max_attempts=1``): gpuscale has one retry
layer, driven by each error's :class:`~gpuscale.errors.RetryPolicy`. Messages carry the AWS code and message only,
never a request's headers (which name the access key), and :func:`scrub_secrets` removes any credential that still
shows up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from gpuscale.core.model import CapacityType, OfferingKey
from gpuscale.errors import (
    AuthenticationError,
    CapacityError,
    GpuscaleError,
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers._support import scrub_secrets

PROVIDER_NAME = "aws"
T = TypeVar("T")

CAPACITY_CODES = frozenset(
    {"InsufficientInstanceCapacity", "InsufficientCapacity", "UnfulfillableCapacity", "InsufficientHostCapacity"}
)
"""The offering has no capacity now: try the next offering."""
UNSUPPORTED_CODES = frozenset({"Unsupported"})
"""The instance type is not offered in that zone (or with that capacity type): try the next offering."""
QUOTA_CODES = frozenset(
    {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "SpotMaxPriceTooLow"}
)
"""An account limit: back off."""
THROTTLE_CODES = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException", "SlowDown"}
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "UnrecognizedClientException",
        "OptInRequired",
    }
)
NOT_FOUND_CODES = frozenset(
    {
        "InvalidInstanceID.NotFound",
        "ResourceNotFoundException",
        "InvalidLaunchTemplateName.NotFoundException",
        "InvalidLaunchTemplateId.NotFound",
        "ParameterNotFound",
        "InvalidSubnetID.NotFound",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "ServerException", "RequestTimeout"}
)


def client_config(timeout_s: float) -> Config:
    """botocore settings: no SDK retries (gpuscale's one retry layer decides), bounded timeouts."""
    return Config(
        # botocore's ``max_attempts`` counts retries (1 would still retry once); ``total_max_attempts`` counts calls.
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        user_agent_extra="gpuscale",
    )


@dataclass(frozen=True, slots=True)
class OfferingUpdate:
    """An offering AWS named as failed: ``offering`` (instance type, availability zone, capacity type) with the
    fleet error ``code``. The controller marks exactly these unavailable."""

    offering: OfferingKey
    code: str
    message: str


def map_code(
    code: str,
    message: str,
    *,
    what: str,
    status: int | None = None,
    offerings: tuple[OfferingUpdate, ...] = (),
) -> ProviderError:
    """The gpuscale error for the AWS error ``code``. ``offerings`` is attached as ``exc.offerings``."""
    text = f"aws {what}: {code}: {message}" if message else f"aws {what}: {code}"
    err: ProviderError
    if code in CAPACITY_CODES:
        err = InsufficientCapacity(text, provider=PROVIDER_NAME, status=status)
    elif code in UNSUPPORTED_CODES:
        err = CapacityError(text, provider=PROVIDER_NAME, status=status)
    elif code in QUOTA_CODES or (code.endswith("LimitExceeded") and code not in THROTTLE_CODES):
        err = QuotaExceeded(text, provider=PROVIDER_NAME, status=status)
    elif code in THROTTLE_CODES or status == 429:
        err = RateLimited(text, provider=PROVIDER_NAME, retry_after=1.0)
    elif code in AUTH_CODES or status in (401, 403):
        # UnauthorizedOperation carries an encoded authorization message: keep only the code.
        err = AuthenticationError(f"aws {what}: credentials rejected ({code})", provider=PROVIDER_NAME, status=status)
    elif code in NOT_FOUND_CODES or code.endswith(".NotFound") or status == 404:
        err = NotFound(text, provider=PROVIDER_NAME, status=404)
    elif code in TRANSIENT_CODES or (status is not None and status >= 500):
        err = TransientProviderError(text, provider=PROVIDER_NAME, status=status)
    elif code == "IdempotentParameterMismatch":
        err = InvalidProviderRequest(
            f"aws {what}: the request id was used before with other parameters",
            provider=PROVIDER_NAME,
            field="request_id",
        )
    elif code.startswith(("Invalid", "Missing", "Validation")) or code in ("Unsupported",) or status == 400:
        err = InvalidProviderRequest(f"aws {what}: {code}: {message}", provider=PROVIDER_NAME, status=status)
    else:
        err = ProviderError(text, provider=PROVIDER_NAME, status=status)
    err.offerings = offerings  # type: ignore[attr-defined]
    return err


def map_exception(exc: Exception, what: str, secrets: Iterable[str]) -> ProviderError | None:
    """The gpuscale error for an exception raised by boto3, or None when it is not an SDK error."""
    secrets = tuple(secrets)
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(error.get("Code") or "Unknown")
        message = scrub_secrets(str(error.get("Message") or ""), secrets)[:300]
        return map_code(code, message, what=what, status=status)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return AuthenticationError(
            f"aws {what}: no usable AWS credentials (set AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an "
            "instance/pod role)",
            provider=PROVIDER_NAME,
        )
    if isinstance(exc, ConnectTimeoutError | ReadTimeoutError):
        return TransientProviderError(f"aws {what}: timed out", provider=PROVIDER_NAME)
    if isinstance(exc, EndpointConnectionError | ConnectionError):
        return TransientProviderError(f"aws {what}: connection failed ({type(exc).__name__})", provider=PROVIDER_NAME)
    if isinstance(exc, BotoCoreError):
        return ProviderError(f"aws {what}: {scrub_secrets(str(exc), secrets)[:300]}", provider=PROVIDER_NAME)
    return None


def fleet_error(
    items: list[tuple[str, str]], offerings: tuple[OfferingUpdate, ...], what: str, capacity_type: CapacityType
) -> ProviderError:
    """The error for a fleet that launched nothing, from its ``(code, message)`` error items: a capacity error when
    every item is one (the next offering may have room), else a quota error if any item is one, else the first."""
    if not items:
        return InsufficientCapacity(
            f"aws {what}: the {capacity_type} fleet launched no instance and named no error", provider=PROVIDER_NAME
        )
    capacity = CAPACITY_CODES | UNSUPPORTED_CODES
    if all(code in capacity for code, _ in items):
        code, message = next(((c, m) for c, m in items if c in CAPACITY_CODES), items[0])
    else:
        code, message = next(((c, m) for c, m in items if c not in capacity), items[0])
        quota = [(c, m) for c, m in items if c in QUOTA_CODES]
        if quota:
            code, message = quota[0]
    return map_code(code, message, what=what, offerings=offerings)


class AwsClients:
    """The boto3 clients of one session, all with retries off, plus the credentials to scrub from messages."""

    def __init__(
        self,
        session: boto3.session.Session | None,
        *,
        region: str,
        endpoint_url: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.session = session or boto3.session.Session(region_name=region)
        cfg = client_config(timeout_s)
        self._clients: dict[str, Any] = {}
        self._make: Callable[[str], Any] = lambda service: self.session.client(
            service, region_name=region, endpoint_url=endpoint_url, config=cfg
        )

    def __call__(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self._make(service)
        return self._clients[service]

    def secrets(self) -> tuple[str, ...]:
        creds = self.session.get_credentials()
        if creds is None:
            return ()
        frozen = creds.get_frozen_credentials()
        return tuple(s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one SDK call; map SDK errors to the error tree, chained to a cause that names no credential."""
        try:
            return fn()
        except GpuscaleError:
            raise
        except Exception as exc:
            secrets = self.secrets()
            err = map_exception(exc, what, secrets)
            if err is None:
                raise
            leaked = any(s in str(exc) for s in secrets)
            cause: BaseException = ProviderError(scrub_secrets(str(exc), secrets)[:300]) if leaked else exc
        raise err from cause
