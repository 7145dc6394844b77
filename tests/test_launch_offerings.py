"""Launch errors that name offerings (an EC2 fleet's failed overrides): the pure verdict marks exactly those offerings
(plus the one asked for on a capacity error), and the launcher carries the marks into the availability record, with
the real AWS provider against moto."""

from __future__ import annotations

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
from gpuscale.providers.base import LaunchRequest

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
