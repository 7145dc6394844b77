"""The simulated cluster's scheduling pass and its memo of pod shapes that fit nowhere.

:class:`Scheduler` is held by :class:`gpuscale.sim.cluster.SimCluster` (which owns the nodes, the pods, the label/taint
masks and binding) and is given what it reads from the cluster explicitly: the pending pods, the cluster state, the
scorer, the masks, a mask function and a bind callable. It owns its memo; the cluster tells it what changed through
named methods (:meth:`Scheduler.pod_pending`, :meth:`Scheduler.capacity_grew`, :meth:`Scheduler.row_grew`, ...).

A pass takes every pending pod when capacity grew since the last pass, else only the pods that became pending since;
higher priority first, then first come first served; gangs all-or-nothing. A (request, signature) pair that fitted no
row in the last pass is tried again only if it fits one of the rows that grew since: binds only take room.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuscale.core.model import Pod
from gpuscale.core.resources import Request
from gpuscale.core.scoring import Scorer, select
from gpuscale.core.state import ClusterState, IntArray, Placement
from gpuscale.sim.cluster_records import SimPod

MaskFn = Callable[[tuple[object, ...], Pod], np.ndarray]
"""(label/taint signature, a pod of it) -> the rows whose labels and taints admit it (made on first use)."""
BindFn = Callable[[SimPod, int, "Placement | None"], None]
"""(pending pod, row, its placement if already taken) -> None: the cluster binds the pod there."""


class Scheduler:
    """The scheduling pass over the cluster's pending pods, with its memo of what fitted nowhere."""

    def __init__(
        self,
        pending: dict[str, SimPod],
        state: ClusterState,
        scorer: Scorer,
        masks: dict[tuple[object, ...], np.ndarray],
        mask: MaskFn,
        bind: BindFn,
    ) -> None:
        self._pending = pending
        """The cluster's pending pods by key (the cluster's own map: read, and emptied by ``bind``)."""
        self._state = state
        self._scorer = scorer
        self._masks = masks
        """The cluster's label/taint masks by signature (read only: a missing one means never looked for a node)."""
        self._mask = mask
        self._bind = bind
        self._new_pending: set[str] = set()
        """Keys of pods that became pending since the last pass."""
        self._cap_gen = 0
        """Bumped whenever capacity grew (the next pass takes every pending pod)."""
        self._passed_gen = -1
        """``_cap_gen`` at the last pass."""
        self._fkeys: dict[tuple[object, ...], int] = {}
        """(request, signature) -> its number (``SimPod.fkey``), given at a pod's arrival."""
        self._failed: set[int] = set()
        """(request, signature) pairs (by number) that fitted no row at the end of the last scheduling pass."""
        self._grown: set[int] = set()
        """Rows whose room or label/taint mask may have grown since the last pass (the only rows where a pair in
        ``_failed`` can fit now: binds only take room)."""

    # ----------------------------------------------------------------------------- what the cluster tells it
    def use_state(self, state: ClusterState) -> None:
        """The cluster replaced its state (grown to more rows)."""
        self._state = state

    def fkey(self, req: Request, sig: tuple[object, ...]) -> int:
        """The number of the (request, signature) pair, for ``SimPod.fkey``."""
        fkeys = self._fkeys
        return fkeys.setdefault((req, sig), len(fkeys))

    def pod_pending(self, key: str) -> None:
        """Pod ``key`` became pending (arrived or lost its node): the next pass looks at it."""
        self._new_pending.add(key)

    def pod_gone(self, key: str) -> None:
        """Pending pod ``key`` left without binding (cancelled)."""
        self._new_pending.discard(key)

    def row_grew(self, row: int) -> None:
        """Row ``row`` may have gained room or admit more pods (a release, a node changed)."""
        self._grown.add(row)

    def capacity_grew(self) -> None:
        """Capacity grew somewhere: the next pass takes every pending pod."""
        self._cap_gen += 1

    # ---------------------------------------------------------------------------------------------- the pass
    def schedule(self) -> int:
        """Bind every pending pod that fits now; returns the number bound."""
        pending = self._pending
        if not pending:
            self._new_pending.clear()
            return 0
        if self._cap_gen != self._passed_gen:
            todo = list(pending.values())
        else:
            todo = [pending[k] for k in self._new_pending if k in pending]
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
            if sp.pod.key not in pending:
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
            self._bind(sp, slot, None)
            bound += 1
        if known and pending:
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
        st = self._state
        ok = st.fits(req) & self._mask(sp.sig, sp.pod)
        cands: IntArray = ok.nonzero()[0]  # the rows are one-dimensional
        if cands.dtype != np.int64:
            cands = cands.astype(np.int64)
        return select(self._scorer, st, req, cands)

    def _schedule_gang(self, gang: str) -> int:
        members = sorted((sp for sp in self._pending.values() if sp.pod.gang == gang), key=lambda sp: sp.seq)
        size = max(sp.pod.gang_size for sp in members)
        if len(members) < size:
            return 0
        members = members[:size]
        taken: list[tuple[SimPod, int, Placement]] = []
        st = self._state
        for sp in members:
            slot = self._choose(sp)
            if slot is None:
                for m, _, pl in taken:
                    st.release(m.pod.request, pl)
                return 0
            taken.append((sp, slot, st.place(sp.pod.request, slot)))
        for sp, slot, pl in taken:
            self._bind(sp, slot, pl)
        return len(taken)


def _pass_order(sp: SimPod) -> tuple[int, float, int]:
    """Higher priority first, then first come first served."""
    return (-sp.pod.priority, sp.pending_since, sp.seq)
