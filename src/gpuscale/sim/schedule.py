"""The simulated cluster's scheduling pass and its memo of pod shapes that fit nowhere
(a mixin of :class:`gpuscale.sim.cluster.SimCluster`, which owns the nodes, the pods and binding).

A pass takes every pending pod when capacity grew since the last pass (``_cap_gen``), else only the pods that became
pending since; higher priority first, then first come first served; gangs all-or-nothing. A (request, signature)
pair that fitted no row in the last pass is tried again only if it fits one of the rows that grew since (``_grown``):
binds only take room.
"""

from __future__ import annotations

import numpy as np

from gpuscale.core.model import Pod
from gpuscale.core.resources import Request
from gpuscale.core.scoring import Scorer, select
from gpuscale.core.state import ClusterState, IntArray, Placement
from gpuscale.sim.cluster_records import SimPod


class SchedulePass:
    """The scheduling pass. The host provides the pending pods, the cluster state, the scorer, masks and binding."""

    _pending: dict[str, SimPod]
    _state: ClusterState
    _scorer: Scorer
    _masks: dict[tuple[object, ...], np.ndarray]

    def _init_schedule_memo(self) -> None:
        self._new_pending: set[str] = set()
        self._cap_gen = 0
        self._passed_gen = -1
        self._fkeys: dict[tuple[object, ...], int] = {}
        """(request, signature) -> its number (``SimPod.fkey``), given at a pod's arrival."""
        self._failed: set[int] = set()
        """(request, signature) pairs (by number) that fitted no row at the end of the last scheduling pass."""
        self._grown: set[int] = set()
        """Rows whose room or label/taint mask may have grown since the last pass (the only rows where a pair in
        ``_failed`` can fit now: binds only take room)."""

    def _mask(self, sig: tuple[object, ...], pod: Pod) -> np.ndarray:
        raise NotImplementedError  # the cluster's label/taint mask of the rows

    def _bind(self, sp: SimPod, slot: int, placement: Placement | None = None) -> None:
        raise NotImplementedError  # the cluster binds

    def schedule(self) -> int:
        """Bind every pending pod that fits now; returns the number bound."""
        if not self._pending:
            self._new_pending.clear()
            return 0
        if self._cap_gen != self._passed_gen:
            todo = list(self._pending.values())
        else:
            todo = [self._pending[k] for k in self._new_pending if k in self._pending]
        self._passed_gen = self._cap_gen
        self._new_pending.clear()
        if not todo:
            return 0
        if len(todo) > 1:
            todo.sort(key=_pass_order)
        failed: set[int] = set()
        known, grown = self._failed, sorted(self._grown)
        self._failed, self._grown = failed, set()
        gangs_seen: set[str] = set()
        examined: set[int] = set()
        bound = 0
        for sp in todo:
            if sp.pod.key not in self._pending:
                continue
            if sp.pod.gang:
                if sp.pod.gang not in gangs_seen:
                    gangs_seen.add(sp.pod.gang)
                    bound += self._schedule_gang(sp.pod.gang)
                continue
            fkey = sp.fkey
            if fkey in failed:
                continue
            examined.add(fkey)
            if fkey in known and not self._fits_any(sp.pod.request, sp.sig, grown):
                failed.add(fkey)  # no row fitted it after the last pass and none of those that grew since does
                continue
            slot = self._choose(sp)
            if slot is None:
                failed.add(fkey)
                continue
            self._bind(sp, slot)
            bound += 1
        if known and self._pending:
            self._carry_failures(known - examined, grown, failed)
        return bound

    def _carry_failures(self, unexamined: set[int], grown: list[int], failed: set[int]) -> None:
        """Keep in ``failed`` the failures of the last pass that this pass did not look at (a pass of new pods only)
        and that still fit none of the rows grown since, for pods still pending: they still fit no row (binds only
        take room), and the next pass need not look for a node for them again."""
        if not unexamined:
            return
        for sp in self._pending.values():
            fkey = sp.fkey
            if fkey in unexamined:
                unexamined.discard(fkey)
                if not self._fits_any(sp.pod.request, sp.sig, grown):
                    failed.add(fkey)

    def _fits_any(self, req: Request, sig: tuple[object, ...], rows: list[int]) -> bool:
        """True if a pod of ``req`` and label/taint signature ``sig`` (whose mask exists) fits one of ``rows`` now
        (rows are few: a scalar check each)."""
        if not rows:
            return False
        mask, st = self._masks.get(sig), self._state
        if mask is None:  # never looked for a node: it may fit
            return True
        return any(mask[i] and st.fits_one(req, i) for i in rows)

    def _choose(self, sp: SimPod) -> int | None:
        req = sp.pod.request
        ok = self._state.fits(req) & self._mask(sp.sig, sp.pod)
        cands: IntArray = ok.nonzero()[0]  # the rows are one-dimensional
        if cands.dtype != np.int64:
            cands = cands.astype(np.int64)
        return select(self._scorer, self._state, req, cands)

    def _schedule_gang(self, gang: str) -> int:
        members = sorted((sp for sp in self._pending.values() if sp.pod.gang == gang), key=lambda sp: sp.seq)
        size = max(sp.pod.gang_size for sp in members)
        if len(members) < size:
            return 0
        members = members[:size]
        taken: list[tuple[SimPod, int, Placement]] = []
        for sp in members:
            slot = self._choose(sp)
            if slot is None:
                for m, _, pl in taken:
                    self._state.release(m.pod.request, pl)
                return 0
            taken.append((sp, slot, self._state.place(sp.pod.request, slot)))
        for sp, slot, pl in taken:
            self._bind(sp, slot, pl)
        return len(taken)


def _pass_order(sp: SimPod) -> tuple[int, float, int]:
    """Higher priority first, then first come first served."""
    return (-sp.pod.priority, sp.pending_since, sp.seq)
