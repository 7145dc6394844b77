"""Launch errors that name offerings (an EC2 fleet's failed overrides): the pure verdict marks exactly those offerings
(plus the one asked for on a capacity error), and the launcher carries the marks into the availability record, with
the real AWS provider against moto."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from aws_moto import REGION, MotoAws, World, build_world, shared_moto
from gpuscale.clock import ManualClock
from gpuscale.controller.availability import Availability
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.launcher import Launcher, named_offerings
from gpuscale.core.model import CapacityType, NodePool, OfferingKey
from gpuscale.core.nodeclaim import ClaimPhase, new_claim
from gpuscale.core.reconcile import BackOff, EventKind, LaunchRules, MarkUnavailable, Note, Outcome, judge_launch_error
from gpuscale.errors import InsufficientCapacity, ProviderError, QuotaExceeded, TransientProviderError
from gpuscale.providers.aws import AwsConfig, AwsProvider
from gpuscale.providers.aws_errors import OfferingUpdate
from gpuscale.providers.base import CloudNode, LaunchRequest
from gpuscale.sim.cloud import CapacityRule, SimCloud
from test_controller import CATALOG, FAST, Harness, gpod, gpu_pool

SPOT, OD = CapacityType.SPOT, CapacityType.ON_DEMAND
RULES = LaunchRules(unavailable_ttl_s=180.0, quota_backoff_s=60.0)
A = OfferingKey("g5.2xlarge", "us-east-1a", SPOT)
B = OfferingKey("g5.2xlarge", "us-east-1b", SPOT)
ASKED = OfferingKey("g5.2xlarge", "us-east-1", SPOT)


def marks(named: tuple[OfferingKey, ...], exc: ProviderError) -> list[tuple[OfferingKey, float]]:
    claim = new_claim("r1", "gpu", "g5.2xlarge", "us-east-1", SPOT, 0.0)
    v = judge_launch_error(
        "r1", claim, exc, attempts=0, pool=None, fallback_active=False, rules=RULES, now=100.0, named=named
    )
    return [(a.offering, a.until) for a in v.actions if isinstance(a, MarkUnavailable)]


@pytest.mark.parametrize(
    ("named", "exc", "expected"),
    [
        ((), InsufficientCapacity("x"), [ASKED]),
        ((A, B), InsufficientCapacity("x"), [ASKED, A, B]),
        ((A, A, ASKED), InsufficientCapacity("x"), [ASKED, A]),
        ((A,), QuotaExceeded("x"), [A]),
        ((), QuotaExceeded("x"), []),
        ((A,), TransientProviderError("x"), []),
    ],
)
def test_verdict_marks_exactly_the_named_offerings(
    named: tuple[OfferingKey, ...], exc: ProviderError, expected: list[OfferingKey]
) -> None:
    got = marks(named, exc)
    assert [o for o, _ in got] == expected
    assert all(until == 280.0 for _, until in got)


def test_a_quota_error_naming_offerings_still_backs_the_pool_off() -> None:
    claim = new_claim("r1", "gpu", "g5.2xlarge", "us-east-1", SPOT, 0.0)
    v = judge_launch_error(
        "r1", claim, QuotaExceeded("spot count"), attempts=0, pool=None, fallback_active=False, rules=RULES,
        now=0.0, named=(A,),
    )  # fmt: skip
    assert v.outcome is Outcome.QUOTA
    assert any(isinstance(a, BackOff) for a in v.actions)


def test_named_offerings_reads_updates_keys_and_nothing() -> None:
    exc = InsufficientCapacity("x")
    assert named_offerings(exc) == ()
    exc.offerings = (OfferingUpdate(A, "InsufficientInstanceCapacity", "none"), B, "junk")  # type: ignore[attr-defined]
    assert named_offerings(exc) == (A, B)


# --- the launcher with the AWS provider against moto ------------------------------------------------------------------
@pytest.fixture(scope="module")
def aws() -> MotoAws:
    return shared_moto()


@pytest.fixture
def world(aws: MotoAws) -> World:
    return build_world(aws)


def provider(aws: MotoAws, world: World) -> AwsProvider:
    config = AwsConfig(
        cluster_name=world.cluster,
        region=REGION,
        subnet_ids=tuple(world.subnets.values()),
        security_group_ids=(world.security_group,),
        instance_profile="gpu-nodes",
        endpoint_url=aws.proxy.url,
    )
    return AwsProvider(config, session=aws.session(), clock=ManualClock(1_000.0))


def test_fleet_errors_mark_every_named_zone_and_the_next_offering_launches(aws: MotoAws, world: World) -> None:
    aws.proxy.fleet_errors[("g5.2xlarge", None)] = ("InsufficientInstanceCapacity", "no g5.2xlarge")
    notes: list[Note] = []
    av = Availability()
    launcher = Launcher(provider(aws, world), av, RULES, notes.append)
    claims = ClaimTable()
    pool = NodePool("gpu", ("g5.2xlarge", "g5.xlarge"), capacity_types=(SPOT,))
    claims["r1"] = new_claim("r1", "gpu", "g5.2xlarge", REGION, SPOT, 0.0)
    out = launcher.launch("r1", LaunchRequest("r1", "gpu", "g5.2xlarge", REGION, SPOT), claims, pool, 10.0)
    assert out is Outcome.CAPACITY
    assert claims["r1"].phase is ClaimPhase.FAILED
    zones = {OfferingKey("g5.2xlarge", z, SPOT) for z in world.subnets}
    assert set(av.unavailable_at(10.0)) == {ASKED, *zones}
    assert all(until == 190.0 for until in av.unavailable_at(10.0).values())
    assert sum(n.kind is EventKind.OFFERING_UNAVAILABLE for n in notes) == 3
    # Another instance type is not named: it launches.
    claims["r2"] = new_claim("r2", "gpu", "g5.xlarge", REGION, SPOT, 10.0)
    out = launcher.launch("r2", LaunchRequest("r2", "gpu", "g5.xlarge", REGION, SPOT), claims, pool, 11.0)
    assert out is Outcome.OK
    assert OfferingKey("g5.xlarge", REGION, SPOT) not in av.unavailable_at(11.0)


# --- the controller on the simulator: the next round skips every named offering ---------------------------------------
class FleetLikeCloud:
    """The simulated cloud, launching the way an EC2 fleet does: a capacity error names every zone of the instance type
    and capacity type that it tried (all of the catalog's), as the AWS provider's ``offerings`` do."""

    def __init__(self, cloud: SimCloud) -> None:
        self._cloud = cloud
        self.launches: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cloud, name)

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        self.launches.append((request.instance_type, request.zone))
        try:
            return self._cloud.launch(request)
        except InsufficientCapacity as exc:
            zones = sorted(
                o.zone
                for o in CATALOG.by_name()[request.instance_type].offerings
                if o.capacity_type is request.capacity_type
            )
            exc.offerings = tuple(  # type: ignore[attr-defined]
                OfferingKey(request.instance_type, z, request.capacity_type) for z in zones
            )
            raise


def test_the_next_plan_skips_every_offering_the_error_named() -> None:
    no_g1 = replace(FAST, capacity=(CapacityRule(0, instance_type="g1"),))
    h = Harness([gpu_pool()], behaviour=no_g1)
    cloud = FleetLikeCloud(h.cloud)
    h.provider = cloud
    h.ctrl = h.new_controller()
    h.add(gpod("a"))
    h.run(2.0)
    # g1 in z1 failed naming z1 and z2: the re-plan goes to g4 at once, without trying g1 in z2
    assert cloud.launches == [("g1", "z1"), ("g4", "z1")]
    assert len(h.events(EventKind.LAUNCH_FAILED)) == 1
    assert {OfferingKey("g1", z, OD) for z in ("z1", "z2")} <= set(h.ctrl.unavailable)
    (node,) = h.alive()
    assert node.instance_type == "g4"
    h.run(120.0)
    assert h.cluster.running_count() == 1


def test_a_partly_failed_fleet_launches_and_marks_the_zone_it_named(aws: MotoAws, world: World) -> None:
    aws.proxy.fleet_errors[("g5.xlarge", "us-east-1a")] = ("InsufficientInstanceCapacity", "none in 1a")
    av = Availability()
    notes: list[Note] = []
    launcher = Launcher(provider(aws, world), av, RULES, notes.append)
    claims = ClaimTable()
    claims["r1"] = new_claim("r1", "gpu", "g5.xlarge", REGION, OD, 0.0)
    out = launcher.launch("r1", LaunchRequest("r1", "gpu", "g5.xlarge", REGION, OD), claims, None, 5.0)
    assert out is Outcome.OK
    assert av.unavailable_at(5.0) == {OfferingKey("g5.xlarge", "us-east-1a", OD): 185.0}
