"""The controller's side of the demand-anticipating scale-up (``anticipate``, :mod:`gpuscale.core.anticipate`): the
setting's reader, the arrivals it records, and whether a plan that launches nodes for pending pods also launches
nodes for the pods expected next.

With ``learnUse`` it also follows the extra nodes it launched (by request id, :meth:`Anticipation.note_launch`) until
a pod runs on one, it goes, or it stays empty past ``lead`` + ``coldStart`` (:func:`gpuscale.core.anticipate.
settle_extra`), and buys the share of the forecast room that extra nodes were used (:func:`gpuscale.core.anticipate.
use_rate`, fading over ``useMemory``).

The arrival history and the outcomes live in memory: after a restart they start again from nothing (plans are plain
until arrivals are seen again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuscale.controller.settingsread import known_keys, positive_duration
from gpuscale.core.anticipate import (
    AnticipateSpec,
    Extra,
    Use,
    Verdict,
    after_plan,
    expected_pods,
    pending_first,
    real_first,
    repack_in_flight,
    settle_extra,
    use_rate,
    weigh,
    with_extra,
)
from gpuscale.core.model import Catalog, Pod, Snapshot
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.core.reconcile.scaleup import ScaleUpDecision
from gpuscale.errors import InputError

if TYPE_CHECKING:  # the shell imports the config, which imports this module's reader
    from gpuscale.controller.shell import World

ANTICIPATE_KEYS = (
    "lead",
    "quantile",
    "recentWindows",
    "days",
    "waitCostPerGpuHour",
    "coldStart",
    "maxExtraGpus",
    "learnUse",
    "useMemory",
)

PLAN_REASON = "ScaleUp"
"""The launch reason of a scale-up plan's orders (:func:`gpuscale.core.reconcile.scaleup.launch_orders`): an order
with it that names no pod is an extra node (:func:`gpuscale.core.anticipate.with_extra`)."""
_GONE = frozenset((ClaimPhase.DRAINING, ClaimPhase.DELETING, ClaimPhase.GONE, ClaimPhase.FAILED))
"""Claim phases of an extra node that will run no pod (``learnUse``)."""


def anticipate_setting(value: object, where: str) -> AnticipateSpec | None:
    """``anticipate``: None (off), or the rule (``true``: all defaults)."""
    if value is None or value is False:
        return None
    if value is True:
        return AnticipateSpec()
    value = known_keys(
        value,
        where,
        name="anticipate",
        keys=ANTICIPATE_KEYS,
        expected="must be true, false or a mapping",
        example="e.g. {lead: 10m, waitCostPerGpuHour: 4, maxExtraGpus: 8}",
    )
    kw: dict[str, Any] = {}
    if "lead" in value:
        kw["lead_s"] = positive_duration(value["lead"], f"{where}.lead")
    if "coldStart" in value:
        kw["cold_start_s"] = positive_duration(value["coldStart"], f"{where}.coldStart")
    if "quantile" in value:
        kw["quantile"] = _number(value["quantile"], f"{where}.quantile", 0.0, 1.0, "e.g. 0.5")
    if "waitCostPerGpuHour" in value:
        kw["wait_cost_per_gpu_hour"] = _number(
            value["waitCostPerGpuHour"], f"{where}.waitCostPerGpuHour", 0.0, 1e6, "e.g. 4"
        )
    for key, attr, lo, hi in (("recentWindows", "recent_windows", 1, 10_000), ("days", "days", 0, 366)):
        if key in value:
            kw[attr] = _integer(value[key], f"{where}.{key}", lo, hi)
    if "maxExtraGpus" in value:
        kw["max_extra_gpus"] = _integer(value["maxExtraGpus"], f"{where}.maxExtraGpus", 1, 10_000)
    if "learnUse" in value:
        flag = value["learnUse"]
        if not isinstance(flag, bool):
            raise InputError("must be true or false", where=f"{where}.learnUse", value=flag, fix="e.g. true")
        kw["learn_use"] = flag
    if "useMemory" in value:
        kw["use_memory_s"] = positive_duration(value["useMemory"], f"{where}.useMemory")
    return AnticipateSpec(**kw)


def _number(value: object, where: str, lo: float, hi: float, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InputError(f"must be a number from {lo:g} to {hi:g}", where=where, value=value, fix=fix)
    return float(value)


def _integer(value: object, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"must be an integer from {lo} to {hi}", where=where, value=value, fix=f"e.g. {max(lo, 2)}")
    return value


@dataclass
class AnticipateStats:
    """What the rule did, for reports."""

    weighed: int = 0
    """Plans that launched nodes and had expected pods to weigh."""
    taken: int = 0
    extra_gpus: int = 0
    """GPUs bought beyond the plain plans, over the plans taken."""
    extra_hourly: float = 0.0
    """$/h bought beyond the plain plans, over the plans taken."""
    last: Verdict | None = None
    repacked: int = 0
    """Plans whose launches for pods were dropped: the pods fit on the nodes in flight (``repack_in_flight``)."""
    reordered: int = 0
    """Plans made again with the pending pods before the pods of draining nodes (``real_first``)."""
    deferred: int = 0
    """Plans whose launches for pods of draining nodes were moved after the others (``pending_first``)."""
    used: int = 0
    """Extra nodes settled as used, a pod ran on them (``learnUse``)."""
    unused: int = 0
    """Extra nodes settled as unused (``learnUse``)."""


class Anticipation:
    """Arrivals seen and the choice of plan (see the module docstring)."""

    def __init__(self, spec: AnticipateSpec, first_seen: float) -> None:
        self.spec = spec
        self.first_seen = first_seen
        self.times: list[float] = []
        self.pods: list[Pod] = []
        self._seen: set[str] | None = None
        self._bound: frozenset[str] = frozenset()
        """Pods bound to a node in the last world observed (those shown pending to the planner are leaving)."""
        self.stats = AnticipateStats()
        self.extra: dict[str, Extra] = {}
        """Extra nodes launched and not yet settled, by request id (``learnUse``)."""
        self.use: dict[tuple[str, str], Use] = {}
        """(pool, instance type) -> what its extra nodes did (``learnUse``)."""
        self._use_at: float | None = None

    def note_launch(self, request_id: str, pool: str, instance_type: str, now: float) -> None:
        """An extra node was launched (``learnUse``: it is followed until settled)."""
        if self.spec.learn_use:
            self.extra[request_id] = Extra(request_id, (pool, instance_type), now)

    def settle(self, claims: Iterable[NodeClaim], used_nodes: frozenset[str] | set[str], now: float) -> None:
        """Settle the extra nodes whose outcome is known (``learnUse``): ``claims``, the claims that exist;
        ``used_nodes``, the nodes a pod (not a daemon pod) runs on."""
        if not self.spec.learn_use:
            return
        if self._use_at is not None and now > self._use_at:
            dt, mem = now - self._use_at, self.spec.use_memory_s
            self.use = {k: u.decayed(dt, mem) for k, u in self.use.items()}
        self._use_at = now
        if not self.extra:
            return
        status: dict[str, str] = {}
        for c in claims:
            if c.request_id in self.extra:
                gone = c.phase in _GONE
                status[c.request_id] = (
                    "used" if c.node_name in used_nodes and c.node_name else "gone" if gone else "empty"
                )
        window = self.spec.lead_s + self.spec.cold_start_s
        still, closed = settle_extra(list(self.extra.values()), status, now, window)
        self.extra = {e.request_id: e for e in still}
        for kind, used in closed:
            self.use[kind] = self.use.get(kind, Use()).add(used)
            if used:
                self.stats.used += 1
            else:
                self.stats.unused += 1

    def use_shares(self) -> tuple[float, dict[tuple[str, str], float]]:
        """The share of extra nodes used over every kind, and per kind (``learnUse``)."""
        total = Use(sum(u.used for u in self.use.values()), sum(u.total for u in self.use.values()))
        return use_rate(total), {k: use_rate(u) for k, u in self.use.items()}

    def observe(self, w: World) -> None:
        """Record the GPU pods first seen this round (not daemon pods); drop arrivals the forecast no longer reads.
        Calling it twice in a round records nothing the second time."""
        keys = {p.key for p in w.pods}
        self._bound = frozenset([p.key for p in w.pods if p.node_name is not None])
        if self._seen is not None:
            for p in w.pods:
                if p.key not in self._seen and not p.is_daemonset and p.request.gpu_demand_milli > 0:
                    self.times.append(w.now)
                    self.pods.append(p)
        self._seen = keys
        keep_from = w.now - self.spec.history_s
        cut = 0
        while cut < len(self.times) and self.times[cut] < keep_from:
            cut += 1
        if cut:
            del self.times[:cut]
            del self.pods[:cut]

    def _leaving(self, snapshot: Snapshot) -> set[str]:
        """The pods of draining nodes ``snapshot`` shows pending (bound in the last world observed)."""
        return {p.key for p in snapshot.pods if p.node_name is None and p.key in self._bound}

    def corrected(
        self,
        snapshot: Snapshot,
        plain: ScaleUpDecision,
        replan: Callable[[Snapshot], ScaleUpDecision],
        catalog: Catalog,
    ) -> ScaleUpDecision:
        """``plain`` with the corrections :meth:`choose` makes first (``real_first``, ``repack_in_flight``, then
        ``pending_first``), counting nothing: the plan the scale-up's check mode compares a skipped plan with."""
        if not plain.launches:
            return plain
        leaving = self._leaving(snapshot)
        return pending_first(repack_in_flight(snapshot, real_first(snapshot, plain, leaving, replan, catalog)), leaving)

    def choose(
        self,
        snapshot: Snapshot,
        plain: ScaleUpDecision,
        replan: Callable[[Snapshot], ScaleUpDecision],
        catalog: Catalog,
        now: float,
    ) -> ScaleUpDecision:
        """``plain``, or ``plain`` with the nodes ``replan`` launches for the expected pods over the snapshot ``plain``
        leaves, when they pay. Only plans that launch nodes are weighed. First, pending pods go before the pods of
        draining nodes (``real_first``), and a plan whose pods all fit on the nodes in flight launches no node for
        them (``repack_in_flight``): the spare room of extra nodes in flight that the planner's placement missed; nodes
        for pods of draining nodes are launched after the others (``pending_first``)."""
        if not plain.launches:
            return plain
        leaving = self._leaving(snapshot)
        again = real_first(snapshot, plain, leaving, replan, catalog)
        if again is not plain:
            self.stats.reordered += 1
            plain = again
        packed = repack_in_flight(snapshot, plain)
        if packed is not plain:
            self.stats.repacked += 1
            plain = packed
        later = pending_first(plain, leaving)
        if later is not plain:
            self.stats.deferred += 1
            plain = later
        if not plain.launches:
            return plain
        share, use = self.use_shares() if self.spec.learn_use else (1.0, None)
        expected = expected_pods(self.times, self.pods, self.first_seen, now, self.spec, share)
        if not expected:
            return plain
        extra = replan(after_plan(snapshot, plain, expected))
        verdict = weigh(extra, expected, catalog, self.spec, use)
        st = self.stats
        st.weighed += 1
        st.last = verdict
        if not verdict.take:
            return plain
        st.taken += 1
        st.extra_gpus += verdict.extra_gpus
        st.extra_hourly += verdict.extra_hourly
        return with_extra(plain, extra)
