"""Provider profiles of the simulated cloud: how LKE, EKS, GKE and ACK behave, as :class:`CloudBehaviour` values.

A scenario selects one with ``cloud: {provider: gke}``; the other ``cloud`` keys of the scenario then override the
profile's values, and without a ``catalog`` the scenario uses the profile's catalog and region. ``compare
--providers`` runs one scenario on several profiles (:func:`retarget_pools` says what changes between providers).

Every value is either a documented behaviour of the provider or an assumption; :attr:`CloudProfile.sources` says
which, value by value, and ``docs/simulator.md`` repeats it. No provider publishes capacity-error rates or node
start-up times, so those are assumptions chosen to be of the order users report, to be overridden per scenario.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import InputError
from gpuscale.sim.cloud import ApiRateLimit, CloudBehaviour
from gpuscale.sim.engine import Dist


def _ln(median: float, sigma: float = 0.3) -> Dist:
    return Dist("lognormal", median, sigma)


@dataclass(frozen=True, slots=True)
class CloudProfile:
    """One provider's simulated behaviour, its catalog (``catalog:region``) and where each value comes from."""

    name: str
    provider: str
    """The catalog and provider name (``linode``, ``aws``, ``gcp``, ``alibaba``)."""
    title: str
    region: str
    """The catalog region used when a scenario of another provider is run on this one (a US region for each)."""
    behaviour: CloudBehaviour
    sources: tuple[tuple[str, str], ...]
    """(value, documented source or "assumption: why") pairs."""

    @property
    def catalog(self) -> str:
        """The catalog reference ``NAME:REGION`` (see ``gpuscale catalog list``)."""
        return f"{self.provider}:{self.region}"


LKE = CloudProfile(
    "lke",
    "linode",
    "Linode Kubernetes Engine: a node pool resized through the Linode API",
    "us-ord",
    CloudBehaviour(
        launch_latency=_ln(40.0),
        registration_latency=_ln(50.0),
        device_plugin_delay=_ln(90.0),
        deletion_latency=Dist.const(30.0),
        ice_probability=0.02,
        api_rate=ApiRateLimit(burst=20.0, per_second=20.0 / 60.0),
    ),
    (
        (
            "launch 40 s, registration 50 s, device plugin 90 s",
            "assumption: the simulator's defaults (a Linode boots "
            "in under a minute; the NVIDIA device plugin starts after the kubelet)",
        ),
        ("deletion 30 s", "assumption: the simulator's default; Linode bills by the hour of use, capped monthly"),
        ("capacity errors 2% of launches", "assumption: Linode publishes no rate; GPU plans run out per region"),
        ("no spot", "documented: Linode sells no spot or preemptible plans (the catalog has none)"),
        (
            "20 node launches, then 20 per minute",
            "assumption: of the order of Linode API's per-endpoint limits on creating instances",
        ),
    ),
)

EKS = CloudProfile(
    "eks",
    "aws",
    "Amazon EKS: one EC2 CreateFleet (type instant) per launch, as Karpenter does",
    "us-east-1",
    CloudBehaviour(
        launch_latency=_ln(20.0),
        registration_latency=_ln(60.0),
        device_plugin_delay=_ln(60.0),
        deletion_latency=Dist.const(0.0),
        ice_probability=0.02,
        spot_interruptions_per_hour=0.05 / 730.0,
        spot_notice_s=120.0,
        api_rate=ApiRateLimit(burst=1000.0, per_second=2.0),
    ),
    (
        (
            "launch 20 s",
            "documented: an instant fleet answers synchronously with the instance ids; assumption: "
            "pending to running in about 20 s",
        ),
        (
            "registration 60 s, device plugin 60 s",
            "assumption: boot and nodeadm join in about a minute; the "
            "EKS-optimized accelerated AMI ships the NVIDIA driver, so only the device plugin has to start",
        ),
        (
            "deletion 0 s",
            "documented: EC2 does not bill shutting-down instances (nor pending ones, which the simulator bills from "
            "launch: about 20 s per node too much)",
        ),
        ("capacity errors 2% of launches", "assumption: InsufficientInstanceCapacity rates are not published"),
        (
            "spot: 5% interrupted per month, notice 2 min",
            "documented: the two-minute interruption notice; the rate "
            "is the lowest band (<5%/month) of the Spot Instance Advisor, an assumption per type",
        ),
        (
            "1000 node launches, then 2 per second",
            "documented: the RunInstances resource token bucket (1000 "
            "tokens, refill 2 per second) of EC2 API throttling",
        ),
    ),
)

GKE = CloudProfile(
    "gke",
    "gcp",
    "Google Kubernetes Engine: a GPU node pool resized by a long-running setSize operation",
    "us-central1",
    CloudBehaviour(
        launch_latency=_ln(45.0),
        registration_latency=_ln(60.0),
        device_plugin_delay=_ln(150.0),
        deletion_latency=_ln(60.0),
        ice_probability=0.05,
        spot_interruptions_per_hour=0.1 / 24.0,
        spot_notice_s=30.0,
        api_rate=ApiRateLimit(burst=50.0, per_second=50.0 / 60.0),
    ),
    (
        ("launch 45 s", "assumption: the setSize operation plus the managed instance group creating the VM"),
        ("registration 60 s", "assumption: Container-Optimized OS boot and kubelet join"),
        (
            "device plugin 150 s",
            "assumption: with GKE's GPU driver installation the driver is installed after "
            "the node registers, before the device plugin reports GPUs",
        ),
        (
            "deletion 60 s",
            "assumption: deleteInstances on the group; documented: a standard VM gets up to 120 s of guest shutdown",
        ),
        ("capacity errors 5% of launches", "assumption: ZONE_RESOURCE_POOL_EXHAUSTED is frequent for GPUs"),
        (
            "spot: 10% preempted per day, notice 30 s",
            "documented: Spot VMs get 30 s between the preemption notice and power-off; the rate is an assumption",
        ),
        (
            "50 node launches, then 50 per minute",
            "assumption: of the order of the per-project Compute and Container API write quotas per minute",
        ),
    ),
)

ACK = CloudProfile(
    "ack",
    "alibaba",
    "Alibaba Cloud ACK: a node pool scaled by a ModifyClusterNodePool task (desired size and request ledger)",
    "us-east-1",
    CloudBehaviour(
        launch_latency=_ln(60.0),
        registration_latency=_ln(120.0),
        device_plugin_delay=_ln(60.0),
        deletion_latency=_ln(60.0),
        ice_probability=0.05,
        spot_interruptions_per_hour=0.05 / 24.0,
        spot_notice_s=300.0,
        spot_protection_s=3600.0,
        api_rate=ApiRateLimit(burst=20.0, per_second=20.0 / 60.0),
    ),
    (
        ("launch 60 s", "assumption: the scaling task creates ECS instances through the pool's scaling group"),
        ("registration 120 s", "assumption: the node initialisation script joins the node"),
        ("device plugin 60 s", "assumption: ACK GPU node images ship the NVIDIA driver"),
        ("deletion 60 s", "assumption: RemoveNodePoolNodes (without ACK's drain) releases the instance"),
        ("capacity errors 5% of launches", "assumption: OperationDenied.NoStock rates are not published"),
        (
            "spot: 5% reclaimed per day after a 1 h protection period, notice 5 min",
            "documented: a preemptible "
            "instance's one-hour protection period and the interruption event about five minutes before release; "
            "the rate is an assumption",
        ),
        ("20 node launches, then 20 per minute", "assumption: of the order of ACK's OpenAPI throttling"),
    ),
)

PROFILES: Mapping[str, CloudProfile] = {p.name: p for p in (LKE, EKS, GKE, ACK)}
BY_PROVIDER: Mapping[str, CloudProfile] = {p.provider: p for p in PROFILES.values()}


def get_profile(name: str, where: str = "cloud.provider") -> CloudProfile:
    """The profile called ``name``; an :class:`InputError` naming ``where`` otherwise."""
    p = PROFILES.get(name)
    if p is None:
        raise InputError("unknown provider profile", where=where, value=name[:60], fix=f"use {', '.join(PROFILES)}")
    return p


def profile_of_catalog(providers: set[str]) -> CloudProfile | None:
    """The profile whose provider sold every instance type of a catalog (None for a mixed or unknown catalog)."""
    return BY_PROVIDER.get(next(iter(providers))) if len(providers) == 1 else None


PROVIDER_SPECIFIC_POOL_FIELDS = ("instanceTypes", "zones")


def retarget_pools(items: list[Any]) -> list[Any]:
    """Pools as written in a scenario, for another provider: instance type and zone names mean nothing there, so
    ``instanceTypes`` and ``zones`` are dropped (the pool may use every type of the new catalog that its
    requirements, labels and limits allow). Everything else is kept."""
    out: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            out.append(item)
        elif "spec" in item and isinstance(item["spec"], dict):
            spec = {k: v for k, v in item["spec"].items() if k not in PROVIDER_SPECIFIC_POOL_FIELDS}
            out.append({**item, "spec": spec})
        else:
            out.append({k: v for k, v in item.items() if k not in PROVIDER_SPECIFIC_POOL_FIELDS})
    return out
