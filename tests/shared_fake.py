"""One started cloud fake per test module (reset for each test, stopped when the module ends), the check every
test makes of it (the provider sent nothing the fake refused, and the fake answered nothing its schema forbids), and
a provider on such a fake as the provider contract (tests/provider_contract.py) takes it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pytest

from gpuscale.clock import ManualClock
from gpuscale.providers.base import CloudNode, LaunchRequest, Provider
from provider_contract import ContractBackend


class StartableFake(Protocol):
    @property
    def invalid_requests(self) -> Sequence[object]: ...

    def stop(self) -> None: ...

    def check(self) -> None: ...


F = TypeVar("F", bound=StartableFake)
P = TypeVar("P")


class SharedFake(Generic[F]):
    """``get()`` starts the fake on first use (``start``: a started fake) and returns that one from then on."""

    def __init__(self, start: Callable[[], F]) -> None:
        self._start = start
        self._fake: F | None = None

    def get(self) -> F:
        if self._fake is None:
            self._fake = self._start()
        return self._fake

    def stop(self) -> None:
        if self._fake is not None:
            self._fake.stop()
            self._fake = None

    def stopper(self) -> Any:
        """A module-scoped autouse fixture that stops the fake when the module ends (assign it in the module)."""

        @pytest.fixture(scope="module", autouse=True)
        def _stop_shared() -> Iterator[None]:
            yield
            self.stop()

        return _stop_shared


def assert_clean(fake: StartableFake) -> None:
    """No request was refused by the fake and no response of the fake broke its schema."""
    assert fake.invalid_requests == [], fake.invalid_requests
    fake.check()


def checked(fake: F, clock: ManualClock) -> Iterator[tuple[F, ManualClock]]:
    """The body of a test's ``env`` fixture: yield the fake and its clock, then :func:`assert_clean` the fake."""
    yield fake, clock
    assert_clean(fake)


def launched(provider: Provider, clock: ManualClock, request: LaunchRequest) -> Sequence[CloudNode]:
    """Launch ``request``, let 61 s pass (the fakes' operations take 60 s in the tests' ``env``) and list the nodes."""
    provider.launch(request)
    clock.sleep(61)
    return provider.list_nodes()


@dataclass
class FakeBackend(Generic[P, F]):
    """A provider talking to a started fake, for the provider contract; closing checks the fake. A subclass names the
    fake's knobs: ``exhaust_capacity`` (an instance type runs out) and ``exhaust_quota``."""

    provider: P
    fake: F
    instance_type: str
    zone: str

    def exhaust_capacity(self, instance_type: str) -> None:
        raise NotImplementedError

    def exhaust_quota(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        assert_clean(self.fake)


@dataclass(frozen=True)
class FakeFactory:
    """A provider-contract factory: ``make`` builds a backend on a clock at t=1000."""

    name: str
    make: Callable[[ManualClock], ContractBackend]

    def __call__(self) -> ContractBackend:
        return self.make(ManualClock(1_000.0))
