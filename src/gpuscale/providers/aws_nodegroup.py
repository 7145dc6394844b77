"""AWS managed node group mode: for teams that keep EKS managed node groups (the cluster-autoscaler setup).

Each gpuscale pool maps to one node group (``AwsConfig.nodegroups``). A launch raises the group's desired size by
``count`` with ``UpdateNodegroupConfig``, and in the same call records the request in the group's labels, as a
ledger ``requests.gpuscale.io/<request key>: "<seq>.<count>"`` (the Linode provider's scheme): the size and the
ledger change together or not at all, so a launch retried after a crash finds its entry and creates nothing. A
growth past the group's ``maxSize`` is :class:`~gpuscale.errors.QuotaExceeded`.

The group's instances (EC2 tags ``eks:cluster-name`` and ``eks:nodegroup-name``) are attributed to ledger entries
in ``seq`` order, oldest instance first. ``delete_node`` removes one specific instance with the Auto Scaling
``TerminateInstanceInAutoScalingGroup`` (decrementing the desired size, as cluster-autoscaler does: lowering the
desired size alone would let the group pick the victim) and then decrements its ledger entry. With an interruption
queue configured (spot node groups), ``poll_errors`` reports its events for the groups' instances.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3

from gpuscale.clock import Clock
from gpuscale.core.model import CapacityType
from gpuscale.errors import InvalidProviderRequest, NotFound, QuotaExceeded
from gpuscale.providers._ledger import LEDGER_LABEL_PREFIX, attribute, next_seq, split_ledger, tag_key
from gpuscale.providers.aws import ALIVE_STATES, INSTANCE_STATES, AwsBase, AwsConfig
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderCapabilities, ProviderEvent

__all__ = ["AwsNodeGroupProvider"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Group:
    pool: str
    name: str
    desired: int
    min_size: int
    max_size: int
    ledger: Mapping[str, tuple[int, int]]
    capacity_type: CapacityType
    instance_types: tuple[str, ...]
    asg: str


class AwsNodeGroupProvider(AwsBase):
    """The :class:`~gpuscale.providers.base.Provider` for EKS managed node groups (module docstring)."""

    def __init__(
        self, config: AwsConfig, *, session: boto3.session.Session | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(config, session=session, clock=clock)
        self._request_ids: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"AwsNodeGroupProvider(cluster={self.config.cluster_name!r}, nodegroups={dict(self.config.nodegroups)})"

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Specific nodes deletable; the region as the one zone; spot when a group is a spot group."""
        return ProviderCapabilities(
            spot=True, delete_specific_node=True, zones=(self.config.region,), reports_node_ready=False
        )

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Grow the pool's node group by ``request.count`` (once per request id)."""
        if request.count < 1:
            raise InvalidProviderRequest("count must be at least 1", provider=self.name, field="count")
        key = tag_key(request.request_id)
        with self._lock:
            self._request_ids[key] = request.request_id
            group = self._group(request.pool)
            if key in group.ledger:
                return [n for n in self._nodes(group) if tag_key(n.request_id) == key]
            if group.instance_types and request.instance_type not in group.instance_types:
                raise InvalidProviderRequest(
                    f"node group {group.name} runs {', '.join(group.instance_types)}, not {request.instance_type}",
                    provider=self.name,
                    field="instance_type",
                )
            if group.capacity_type is not request.capacity_type:
                raise InvalidProviderRequest(
                    f"node group {group.name} is {group.capacity_type}, not {request.capacity_type}",
                    provider=self.name,
                    field="capacity_type",
                )
            desired = group.desired + request.count
            if desired > group.max_size:
                raise QuotaExceeded(
                    f"node group {group.name} is at {group.desired} of maxSize {group.max_size}; "
                    f"{request.count} more do not fit",
                    provider=self.name,
                )
            seq = next_seq(group.ledger)
            self._update(
                group,
                scalingConfig={"minSize": group.min_size, "maxSize": group.max_size, "desiredSize": desired},
                labels={"addOrUpdateLabels": {LEDGER_LABEL_PREFIX + key: f"{seq}.{request.count}"}},
            )
            log.info("aws: node group %s desired %d -> %d for %s", group.name, group.desired, desired, key)
            return [n for n in self._nodes(self._group(request.pool)) if tag_key(n.request_id) == key]

    def delete_node(self, node_id: str) -> None:
        """Terminate one instance of a configured node group, decrementing its desired size and ledger entry."""
        with self._lock:
            for pool in self.config.nodegroups:
                group = self._group(pool)
                owners = self._owners(group, self._instances(group))
                if node_id not in owners:
                    continue
                self._deleted.add(node_id)
                try:
                    self.aws.call(
                        f"terminate {node_id}",
                        lambda: self.aws("autoscaling").terminate_instance_in_auto_scaling_group(
                            InstanceId=node_id, ShouldDecrementDesiredCapacity=True
                        ),
                    )
                except NotFound:
                    return
                owner = owners[node_id]
                if owner:
                    seq, k = group.ledger[owner]
                    labels: dict[str, Any] = (
                        {"removeLabels": [LEDGER_LABEL_PREFIX + owner]}
                        if k <= 1
                        else {"addOrUpdateLabels": {LEDGER_LABEL_PREFIX + owner: f"{seq}.{k - 1}"}}
                    )
                    self._update(group, labels=labels)
                return

    def list_nodes(self) -> Sequence[CloudNode]:
        """Every alive instance of the configured node groups."""
        with self._lock:
            return [n for pool in self.config.nodegroups for n in self._nodes(self._group(pool))]

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Events from the interruption queue for the node groups' instances (none without a queue)."""
        if self._queue is None:
            return []
        with self._lock:
            owners: dict[str, str] | None = None

            def owner(instance_id: str) -> str | None:
                nonlocal owners
                if owners is None:
                    owners = {n.node_id: n.request_id for n in self.list_nodes()}
                return owners.get(instance_id)

            return self._queue.drain(owner, self._deleted)

    # --- internals -----------------------------------------------------------------------------------------------
    def _group(self, pool: str) -> _Group:
        name = self.config.nodegroups.get(pool)
        if name is None:
            raise InvalidProviderRequest(
                f"pool {pool!r} has no node group (GPUSCALE_AWS_NODEGROUPS)", provider=self.name, field="pool"
            )
        raw = self.aws.call(
            f"describe node group {name}",
            lambda: self.aws("eks").describe_nodegroup(clusterName=self.config.cluster_name, nodegroupName=name),
        )["nodegroup"]
        ledger, _ = split_ledger({str(k): str(v) for k, v in (raw.get("labels") or {}).items()})
        scaling = raw.get("scalingConfig") or {}
        asgs = (raw.get("resources") or {}).get("autoScalingGroups") or [{}]
        return _Group(
            pool=pool,
            name=name,
            desired=int(scaling.get("desiredSize", 0)),
            min_size=int(scaling.get("minSize", 0)),
            max_size=int(scaling.get("maxSize", 0)),
            ledger=ledger,
            capacity_type=CapacityType.SPOT if raw.get("capacityType") == "SPOT" else CapacityType.ON_DEMAND,
            instance_types=tuple(raw.get("instanceTypes") or ()),
            asg=str(asgs[0].get("name", "")),
        )

    def _update(self, group: _Group, **changes: Any) -> None:
        self.aws.call(
            f"update node group {group.name}",
            lambda: self.aws("eks").update_nodegroup_config(
                clusterName=self.config.cluster_name, nodegroupName=group.name, **changes
            ),
        )

    def _instances(self, group: _Group) -> list[dict[str, Any]]:
        filters = [
            {"Name": "tag:eks:cluster-name", "Values": [self.config.cluster_name]},
            {"Name": "tag:eks:nodegroup-name", "Values": [group.name]},
            {"Name": "instance-state-name", "Values": list(ALIVE_STATES)},
        ]
        ec2 = self.aws("ec2")
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Filters": filters, **({"NextToken": token} if token else {})}
            page = self.aws.call("describe instances", lambda kw=kwargs: ec2.describe_instances(**kw))  # type: ignore[misc]
            out.extend(i for r in page.get("Reservations", []) for i in r.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                break

        def order(i: Mapping[str, Any]) -> tuple[float, str]:
            t = i.get("LaunchTime")
            return (t.timestamp() if isinstance(t, datetime) else 0.0, str(i["InstanceId"]))

        return sorted(out, key=order)

    @staticmethod
    def _owners(group: _Group, instances: list[dict[str, Any]]) -> dict[str, str]:
        return attribute(group.ledger, (str(inst["InstanceId"]) for inst in instances))

    def _nodes(self, group: _Group) -> list[CloudNode]:
        instances = self._instances(group)
        owners = self._owners(group, instances)
        out = []
        for inst in instances:
            iid = str(inst["InstanceId"])
            owner = owners[iid]
            launched = inst.get("LaunchTime")
            out.append(
                CloudNode(
                    node_id=iid,
                    request_id=self._request_ids.get(owner, owner),
                    pool=group.pool,
                    instance_type=str(inst.get("InstanceType", "")),
                    zone=self.config.region,
                    capacity_type=group.capacity_type,
                    state=INSTANCE_STATES.get(
                        str((inst.get("State") or {}).get("Name", "")), CloudNodeState.PROVISIONING
                    ),
                    created_at=launched.timestamp() if isinstance(launched, datetime) else 0.0,
                    node_name=str(inst.get("PrivateDnsName") or ""),
                    instance_id=iid,
                    labels={"topology.kubernetes.io/zone": str((inst.get("Placement") or {}).get("AvailabilityZone"))},
                )
            )
        return out
