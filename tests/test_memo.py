"""The core's bounded memo tables: keyed on values and object identity, pinned objects, bounded size."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpuscale.core.memo import Memo

T = TypeVar("T")


def noting(calls: list[T], answer: T) -> Callable[[], T]:
    """A maker for :meth:`Memo.get` that notes each call in ``calls`` and gives ``answer``."""

    def make() -> T:
        calls.append(answer)
        return answer

    return make


class Box:
    """An unhashable stand-in for a pool or catalog."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return True  # equal to everything: only identity may count


def test_answers_are_remembered_per_values_and_object_identity() -> None:
    memo: Memo[str] = Memo(8)
    calls: list[str] = []

    def make(tag: str) -> Callable[[], str]:
        return noting(calls, tag)

    a, b = Box(), Box()
    assert memo.get(make("a1"), "x", objects=(a,)) == "a1"
    assert memo.get(make("again"), "x", objects=(a,)) == "a1"  # remembered
    assert memo.get(make("b1"), "x", objects=(b,)) == "b1"  # an equal but different object
    assert memo.get(make("a2"), "y", objects=(a,)) == "a2"  # other values
    assert calls == ["a1", "b1", "a2"]


def test_none_answers_are_remembered_and_objects_are_kept_alive() -> None:
    memo: Memo[None] = Memo(8)
    calls: list[int] = []
    for _ in range(3):
        assert memo.get(lambda: calls.append(1), "k", objects=(Box(),)) is None  # a new object every time
    assert len(calls) == 3  # ids of freed objects cannot come back while their entries pin them
    memo.get(lambda: calls.append(1), "none")
    memo.get(lambda: calls.append(1), "none")
    assert len(calls) == 4


def test_the_table_starts_afresh_past_its_size() -> None:
    memo: Memo[int] = Memo(2)
    calls: list[int] = []
    for v in (1, 2, 3, 1):
        memo.get(noting(calls, v), v)
    assert calls == [1, 2, 3, 1]  # 3 cleared the table, so 1 is made again
    memo.clear()
    memo.get(noting(calls, 9), 3)
    assert calls[-1] == 9
