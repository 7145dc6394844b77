"""The storage seam of the GPR manager: what :class:`~gpuscale.gpr.manager.GprManager` calls on its store.

Two stores implement it: :class:`~gpuscale.gpr.store.GprStore` (SQLite, ``gpuscale serve``'s embedded mode) and
:class:`~gpuscale.kube.gpr_store.KubeGprStore` (GPUProvisioningRequest custom resources, ``gpuscale controller``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gpuscale.core.gpr import Gpr, GprState, TransitionRecord

if TYPE_CHECKING:
    from gpuscale.gpr.store import CorruptGpr, JournalEntry, Stored


class GprStorePort(Protocol):
    """GPRs with a version for compare-and-set, and a write-ahead journal of the effects decided on."""

    def get(self, gpr_id: str) -> Stored:
        """The GPR ``gpr_id``; raises ``GprNotFound``."""
        ...

    def list_gprs(self, states: Iterable[GprState] | None = None) -> list[Stored]:
        """GPRs in creation order, optionally only those in ``states``."""
        ...

    def list_checked(self, states: Iterable[GprState] | None = None) -> tuple[list[Stored], list[CorruptGpr]]:
        """GPRs in creation order and the stored records that do not decode."""
        ...

    def close(self) -> None:
        """Release the store's resources."""
        ...

    def journal(self, *, pending_only: bool = False) -> list[JournalEntry]:
        """Journal entries, oldest first (``pending_only``: not marked done)."""
        ...

    def insert(self, gpr: Gpr) -> Stored:
        """Persist a new GPR."""
        ...

    def modify(
        self, gpr_id: str, fn: Callable[[Gpr], Gpr], *, now: float, transitions: Sequence[TransitionRecord] = ()
    ) -> Stored:
        """Atomically read, apply ``fn`` and write one GPR."""
        ...

    def apply(
        self,
        updates: Sequence[tuple[Gpr, int]],
        transitions: Sequence[TransitionRecord],
        journal: Sequence[tuple[str, str, str, dict[str, Any]]],
        *,
        now: float,
    ) -> list[int]:
        """Write a plan (updates compare-and-set on their versions, else ``StaleWrite``); returns journal ids."""
        ...

    def finish(self, journal_id: int, outcome: str, *, now: float) -> None:
        """Mark a journal entry done."""
        ...
