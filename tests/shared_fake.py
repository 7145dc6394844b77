"""One started cloud fake per test module (reset for each test, stopped when the module ends) and the check every
test makes of it: the provider sent nothing the fake refused, and the fake answered nothing its schema forbids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class StartableFake(Protocol):
    invalid_requests: list[str]

    def stop(self) -> None: ...

    def check(self) -> None: ...


F = TypeVar("F", bound=StartableFake)


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


def assert_clean(fake: StartableFake) -> None:
    """No request was refused by the fake and no response of the fake broke its schema."""
    assert fake.invalid_requests == [], fake.invalid_requests
    fake.check()
