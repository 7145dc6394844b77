"""Bounded memo tables for pure core functions a controller calls again and again with the same inputs.

An answer is stored under plain hashable ``values`` and the *identity* of some ``objects`` (pools, catalogs, option
tables: unhashable or costly to hash). The table keeps those objects alive, so an id cannot be reused by another
object while its entry exists: the ids of a key that is found name the very objects its answer was made for. Past
``size`` entries the table starts afresh. A memo changes speed, never answers: the key must hold everything the
answer depends on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """Answers by (``values``, identity of ``objects``); see the module docstring."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._table: dict[tuple[Hashable, tuple[int, ...]], tuple[tuple[object, ...], V]] = {}

    def get(self, make: Callable[[], V], values: Hashable = (), objects: tuple[object, ...] = ()) -> V:
        """The remembered answer for this key, or ``make()`` remembered."""
        key = (values, tuple(map(id, objects)))
        hit = self._table.get(key)
        if hit is not None:  # the entry holds its objects alive: objects with their ids are those very objects
            return hit[1]
        answer = make()
        if len(self._table) >= self.size:
            self._table.clear()
        self._table[key] = (objects, answer)
        return answer

    def clear(self) -> None:
        """Forget every answer."""
        self._table.clear()
