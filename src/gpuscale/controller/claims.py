"""The controller's live node claims by request id, indexed by phase.

Most claims of a running cluster sit in Initialized for hours, while every reconcile looks for the few that are
requested, coming up, draining or deleting. :class:`ClaimTable` is a plain ``dict`` (request id -> claim) that also
keeps the keys of each phase, so those steps visit only the claims they act on, in the table's own order (the order
the claims were first added), as a scan of the whole table would. It also finds the claim of a node name at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim


class ClaimTable(dict[str, NodeClaim]):
    """``dict`` of claims with a per-phase index (see the module docstring).

    Only ``[key] = claim``, ``del``, :meth:`pop` and :meth:`clear` change it; the other mutating ``dict`` methods
    raise ``TypeError`` so that the index cannot go stale.
    """

    def __init__(self) -> None:
        super().__init__()
        self._phase_keys: dict[ClaimPhase, dict[str, None]] = {p: {} for p in ClaimPhase}
        self._order: dict[str, int] = {}
        self._added = 0
        self._named: dict[str, dict[str, None]] = {}
        self.version = 0
        """Counts changes (a claim added, replaced by a different object, or removed)."""
        self.keys_version = 0
        """Counts changes of the set of keys (a claim added or removed; not a claim replaced under its key)."""
        self._phase_version: dict[ClaimPhase, int] = dict.fromkeys(ClaimPhase, 0)
        self._memo: dict[object, tuple[tuple[str, NodeClaim], ...]] = {}
        """Phases -> :meth:`in_phases`'s answer. An entry is dropped when a claim of one of its phases changes (one
        entering or leaving them, or replaced by a different object while in them): changes in other phases leave
        the answer as it is (most claims sit in Initialized while others launch, and the reverse)."""
        self._memo_of: dict[ClaimPhase, dict[object, None]] = {p: {} for p in ClaimPhase}
        """Phase -> the keys of ``_memo`` that include it (an ordered set; a key dropped through another phase may
        linger here until this phase changes: dropping it again is harmless)."""
        self.listener: Callable[[str, NodeClaim | None], None] | None = None
        """Told of each change: (key, new claim), or (key, None) when the claim is removed (the change feed)."""
        self._name_watchers: list[set[str]] = []
        self._key_watchers: list[set[str]] = []

    def watch_keys(self) -> set[str]:
        """A set to which the table adds, from now on, the key of every claim changed (added, replaced by a different
        object, or removed). Its owner empties it when it has seen them."""
        keys: set[str] = set()
        self._key_watchers.append(keys)
        return keys

    def watch_names(self) -> set[str]:
        """A set to which the table adds, from now on, the node names of every claim changed (added, replaced by a
        different object, or removed: the old claim's name and the new one's): the names whose
        :meth:`by_node_name` answer may have changed. Its owner empties it when it has seen them."""
        names: set[str] = set()
        self._name_watchers.append(names)
        return names

    def __setitem__(self, key: str, claim: NodeClaim) -> None:
        old = dict.get(self, key)
        if old is claim:
            return
        self.version += 1
        self._phase_version[claim.phase] += 1
        if self._memo_of[claim.phase]:
            self._forget(claim.phase)
        if old is not None and old.phase is not claim.phase and self._memo_of[old.phase]:
            self._forget(old.phase)
        if old is None:
            self.keys_version += 1
            self._order[key] = self._added
            self._added += 1
            self._phase_keys[claim.phase][key] = None
            if claim.node_name:
                self._named.setdefault(claim.node_name, {})[key] = None
        else:
            if old.phase is not claim.phase:
                self._phase_version[old.phase] += 1
                del self._phase_keys[old.phase][key]
                self._phase_keys[claim.phase][key] = None
            if old.node_name != claim.node_name:
                self._unname(key, old.node_name)
                if claim.node_name:
                    self._named.setdefault(claim.node_name, {})[key] = None
        dict.__setitem__(self, key, claim)
        for keys in self._key_watchers:
            keys.add(key)
        for names in self._name_watchers:
            if old is not None and old.node_name:
                names.add(old.node_name)
            if claim.node_name:
                names.add(claim.node_name)
        if self.listener is not None:
            self.listener(key, claim)

    def _unname(self, key: str, name: str) -> None:
        keys = self._named.get(name)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._named[name]

    def __delitem__(self, key: str) -> None:
        old = dict.pop(self, key)
        self.version += 1
        self.keys_version += 1
        self._phase_version[old.phase] += 1
        if self._memo_of[old.phase]:
            self._forget(old.phase)
        del self._phase_keys[old.phase][key]
        del self._order[key]
        self._unname(key, old.node_name)
        for keys in self._key_watchers:
            keys.add(key)
        if old.node_name:
            for names in self._name_watchers:
                names.add(old.node_name)
        if self.listener is not None:
            self.listener(key, None)

    def pop(self, key: str, *default: Any) -> Any:
        """``dict.pop``, keeping the index."""
        if key in self:
            claim = self[key]
            del self[key]
            return claim
        if default:
            return default[0]
        raise KeyError(key)

    def clear(self) -> None:
        """Remove every claim."""
        if self.listener is not None:
            for key in list(self):
                self.listener(key, None)
        for names in self._name_watchers:
            names.update(self._named)
        for changed in self._key_watchers:
            changed.update(self)
        dict.clear(self)
        self.version += 1
        self.keys_version += 1
        for p in self._phase_version:
            self._phase_version[p] += 1
        for keys in self._phase_keys.values():
            keys.clear()
        self._memo.clear()
        for kept in self._memo_of.values():
            kept.clear()
        self._order.clear()
        self._named.clear()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("ClaimTable changes only through [key] = claim, del, pop and clear")

    update = setdefault = popitem = __ior__ = _read_only

    def _forget(self, phase: ClaimPhase) -> None:
        """Drop the kept :meth:`in_phases` answers that include ``phase`` (a claim of that phase changed)."""
        memo, kept = self._memo, self._memo_of[phase]
        for phases in kept:
            memo.pop(phases, None)
        kept.clear()

    def in_phases(self, phases: Iterable[ClaimPhase]) -> Sequence[tuple[str, NodeClaim]]:
        """(key, claim) of every claim in one of ``phases``, in table order (never changed afterwards: safe to change
        the table while going through it). Asked several times a round with the same phases: the answer for a
        frozenset or tuple of phases is kept, as one tuple, until a claim of those phases changes; a caller may keep
        what it derived from an answer while it gets the very same tuple again."""
        try:
            found = self._memo.get(phases)  # (only tuples and frozensets are kept: asked first, most asks hit)
        except TypeError:  # a list or set of phases
            return self._in_phases(phases)
        if found is not None:
            return found
        kind = type(phases)
        if kind is not tuple and kind is not frozenset:
            return self._in_phases(phases)
        found = self._memo[phases] = tuple(self._in_phases(phases))
        for p in phases:
            self._memo_of[p][phases] = None
        return found

    def _in_phases(self, phases: Iterable[ClaimPhase]) -> list[tuple[str, NodeClaim]]:
        keys: list[str] = []
        for p in phases:
            if in_phase := self._phase_keys[p]:
                keys += in_phase
        if not keys:
            return []
        if len(keys) > 1:
            keys.sort(key=self._order.__getitem__)
        return [(k, dict.__getitem__(self, k)) for k in keys]

    def phase_version(self, phase: ClaimPhase) -> int:
        """Counts changes of the claims in ``phase``: one entering or leaving it, or replaced by a different object
        while in it (the claims of other phases changing leave it as it is)."""
        return self._phase_version[phase]

    def count(self, phase: ClaimPhase) -> int:
        """How many claims are in ``phase``."""
        return len(self._phase_keys[phase])

    def names_node(self, name: str) -> bool:
        """True if some claim's node is ``name``."""
        return name in self._named

    def by_node_name(self, name: str) -> tuple[str, NodeClaim] | None:
        """(key, claim) of the first claim (in table order) whose node is ``name``, or None."""
        keys = self._named.get(name)
        if not keys:
            return None
        key = min(keys, key=self._order.__getitem__) if len(keys) > 1 else next(iter(keys))
        return key, dict.__getitem__(self, key)
