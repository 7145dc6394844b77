"""AWS EKS provider: GPU nodes as EC2 instances launched by ``instant`` fleets, through the official ``boto3``.

How a launch works (the way Karpenter launches)
-----------------------------------------------
- One ``CreateFleet`` of type ``instant`` per launch, target capacity ``count``, with one override per subnet of
  the request's zone (every configured subnet when the zone is the region, as the shipped catalog's offerings are)
  for the request's instance type. Spot uses the ``price-capacity-optimized`` allocation strategy, on-demand
  ``lowest-price``. The request id is the fleet's ``ClientToken`` (the request id itself when it is at most 64
  printable ASCII characters, else a SHA-256 digest), so a call retried after a lost answer creates nothing twice.
- The instances are tagged at launch: ``gpuscale.io/cluster``, ``gpuscale.io/pool``, ``gpuscale.io/request-id``,
  ``gpuscale.io/zone`` (the zone asked for), ``gpuscale.io/capacity-type`` and ``kubernetes.io/cluster/<name>``.
  ``launch`` first looks the request id up with ``DescribeInstances`` by tag, so a request already served (by this
  process or one that crashed) returns its instances and creates nothing; ``list_nodes`` is the same call by the
  cluster tag; ``delete_node`` terminates one instance of this cluster (an unknown or gone instance is success).
- Each pool gets a launch template named ``gpuscale/<cluster>/<pool>/<digest>`` (the digest covers the AMI, labels,
  taints and networking, so a changed pool gets a new template): the EKS-optimised accelerated (NVIDIA) Amazon
  Linux 2023 AMI read from its public SSM parameter, IMDSv2 required, and ``nodeadm`` user data that joins the
  cluster (endpoint, CA and service CIDR from ``DescribeCluster``) with the pool's labels and taints as kubelet flags.

Fleet errors (``InsufficientInstanceCapacity``, ``UnfulfillableCapacity``, ``Unsupported``, ``VcpuLimitExceeded``,
``MaxSpotInstanceCountExceeded``, ...) name the override that failed; each becomes an
:class:`~gpuscale.providers.aws_errors.OfferingUpdate` for exactly that (instance type, availability zone, capacity
type), returned by :meth:`AwsProvider.availability_updates` and attached as ``offerings`` to the error raised when
the fleet launched nothing. Spot interruption warnings, rebalance recommendations and state changes come from an SQS
queue (:mod:`gpuscale.providers.aws_queue`). The managed node group mode is
:mod:`gpuscale.providers.aws_nodegroup`. Nothing here retries or sleeps: botocore retries are off and errors carry
their retry policy for gpuscale's one retry layer. Credentials come from boto3's default chain and are never logged.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import boto3

from gpuscale.clock import Clock, SystemClock
from gpuscale.core.model import CapacityType, OfferingKey, Taint
from gpuscale.errors import InputError, InvalidProviderRequest, NotFound
from gpuscale.providers.aws_errors import PROVIDER_NAME, AwsClients, OfferingUpdate, fleet_error
from gpuscale.providers.aws_queue import InterruptionQueue
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
)

__all__ = ["MODES", "AwsClients", "AwsConfig", "AwsProvider", "ami_parameter", "client_token", "user_data"]

log = logging.getLogger(__name__)

TAG_CLUSTER = "gpuscale.io/cluster"
TAG_POOL = "gpuscale.io/pool"
TAG_REQUEST = "gpuscale.io/request-id"
TAG_ZONE = "gpuscale.io/zone"
TAG_CAPACITY = "gpuscale.io/capacity-type"
MAX_FLEET_SIZE = 100
ALIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
INSTANCE_STATES = {
    "pending": CloudNodeState.PROVISIONING,
    "running": CloudNodeState.RUNNING,
    "stopping": CloudNodeState.NOT_READY,
    "stopped": CloudNodeState.NOT_READY,
    "shutting-down": CloudNodeState.DELETING,
    "terminated": CloudNodeState.GONE,
}
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_TOKEN_OK = re.compile(r"^[\x21-\x7e]{1,64}$")
_GRAVITON = re.compile(r"^[a-z]+\d+[a-z]*g[a-z]*$")
MODES = ("fleet", "nodegroup")

T = TypeVar("T")


def client_token(request_id: str) -> str:
    """The fleet ``ClientToken`` for a request id (AWS allows at most 64 ASCII characters)."""
    return request_id if _TOKEN_OK.match(request_id) else hashlib.sha256(request_id.encode()).hexdigest()


def ami_parameter(kubernetes_version: str, instance_type: str) -> str:
    """The public SSM parameter of the EKS-optimised accelerated (NVIDIA) AL2023 AMI for this type's architecture."""
    arch = "arm64" if _GRAVITON.match(instance_type.split(".", 1)[0]) else "x86_64"
    return f"/aws/service/eks/optimized-ami/{kubernetes_version}/amazon-linux-2023/{arch}/nvidia/recommended/image_id"


def user_data(
    cluster: str, endpoint: str, ca: str, cidr: str, labels: Mapping[str, str], taints: Sequence[Taint]
) -> str:
    """MIME multi-part user data with a ``nodeadm`` NodeConfig joining ``cluster`` with ``labels`` and ``taints``."""
    flags = []
    if labels:
        flags.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    if taints:
        flags.append("--register-with-taints=" + ",".join(f"{t.key}={t.value}:{t.effect}" for t in taints))
    node_config = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {"name": cluster, "apiServerEndpoint": endpoint, "certificateAuthority": ca, "cidr": cidr},
            "kubelet": {"flags": flags},
        },
    }
    boundary = "//gpuscale//"
    return (
        f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{boundary}"\n\n--{boundary}\n'
        f"Content-Type: application/node.eks.aws\n\n{json.dumps(node_config, indent=2)}\n\n--{boundary}--\n"
    )


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


@dataclass(frozen=True, slots=True)
class AwsConfig:
    """Where and how the AWS provider works. ``subnet_ids`` are the node subnets (their zones are the offerings'
    zones); ``interruption_queue`` is the SQS queue name or URL the EventBridge rules feed (empty: no events);
    ``nodegroups`` maps a pool to an EKS managed node group (``mode="nodegroup"``)."""

    cluster_name: str
    region: str
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    instance_profile: str = ""
    interruption_queue: str = ""
    mode: str = "fleet"
    nodegroups: Mapping[str, str] = field(default_factory=dict)
    endpoint_url: str | None = None
    kubernetes_version: str = ""
    """Default: the cluster's version from ``DescribeCluster``."""
    ami_parameter: str = ""
    """Default: :func:`ami_parameter` for the cluster's version and each type's architecture."""
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.cluster_name:
            raise InputError("is not set", where="aws config cluster_name", fix="name the EKS cluster")
        if not self.region:
            raise InputError("is not set", where="aws config region", fix="set it, e.g. us-east-1")
        if self.mode not in MODES:
            raise InputError("unknown mode", where="aws config mode", value=self.mode, fix=f"use one of {MODES}")
        if self.mode == "fleet" and not self.subnet_ids:
            raise InputError("no subnets", where="aws config subnet_ids", fix="list the node subnets (comma-separated)")
        if self.mode == "nodegroup" and not self.nodegroups:
            raise InputError("no node groups", where="aws config nodegroups", fix="map pools to node groups: POOL=NG")
        if self.timeout_s <= 0:
            raise InputError("must be positive", where="aws config timeout_s", value=self.timeout_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AwsConfig:
        """Read ``GPUSCALE_AWS_CLUSTER``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), ``GPUSCALE_AWS_SUBNETS``,
        ``GPUSCALE_AWS_SECURITY_GROUPS``, ``GPUSCALE_AWS_INSTANCE_PROFILE``, ``GPUSCALE_AWS_INTERRUPTION_QUEUE``,
        ``GPUSCALE_AWS_MODE`` and ``GPUSCALE_AWS_NODEGROUPS`` (``pool=nodegroup,...``); ``AWS_ENDPOINT_URL``."""
        env = os.environ if env is None else env
        cluster = env.get("GPUSCALE_AWS_CLUSTER", "")
        if not cluster:
            raise InputError("is not set", where="environment variable GPUSCALE_AWS_CLUSTER", fix="name the cluster")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
        if not region:
            raise InputError("is not set", where="environment variable AWS_REGION", fix="set it, e.g. us-east-1")
        groups: dict[str, str] = {}
        for item in _csv(env.get("GPUSCALE_AWS_NODEGROUPS", "")):
            pool, sep, ng = item.partition("=")
            if not sep or not pool or not ng:
                raise InputError(
                    "is not POOL=NODEGROUP", where="environment variable GPUSCALE_AWS_NODEGROUPS", value=item
                )
            groups[pool] = ng
        return cls(
            cluster_name=cluster,
            region=region,
            subnet_ids=_csv(env.get("GPUSCALE_AWS_SUBNETS", "")),
            security_group_ids=_csv(env.get("GPUSCALE_AWS_SECURITY_GROUPS", "")),
            instance_profile=env.get("GPUSCALE_AWS_INSTANCE_PROFILE", ""),
            interruption_queue=env.get("GPUSCALE_AWS_INTERRUPTION_QUEUE", ""),
            mode=env.get("GPUSCALE_AWS_MODE", "fleet") or "fleet",
            nodegroups=groups,
            endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
        )


@dataclass(frozen=True, slots=True)
class _Cluster:
    endpoint: str
    ca: str
    cidr: str
    version: str


class AwsBase:
    """What both AWS modes start with: the config, the clock, the clients (one session), the lock, the interruption
    queue (when configured) and the instances gpuscale deleted (their queue events are its own doing)."""

    name = PROVIDER_NAME

    def __init__(
        self, config: AwsConfig, *, session: boto3.session.Session | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.aws = AwsClients(
            session, region=config.region, endpoint_url=config.endpoint_url, timeout_s=config.timeout_s
        )
        self._lock = threading.RLock()
        self._queue = (
            InterruptionQueue(self.aws, config.interruption_queue, config.region, self.clock)
            if config.interruption_queue
            else None
        )
        self._deleted: set[str] = set()


class AwsProvider(AwsBase):
    """The :class:`~gpuscale.providers.base.Provider` for EKS nodes launched by EC2 fleets (module docstring)."""

    def __init__(
        self, config: AwsConfig, *, session: boto3.session.Session | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(config, session=session, clock=clock)
        self._subnet_zones: dict[str, str] | None = None
        self._cluster: _Cluster | None = None
        self._templates: dict[str, str] = {}
        self._updates: list[OfferingUpdate] = []
        self._events: list[ProviderEvent] = []
        self._requests: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"AwsProvider(cluster={self.config.cluster_name!r}, region={self.config.region!r})"

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Spot and on-demand, specific instances deletable, the region and its subnets' zones."""
        zones = tuple(sorted(set(self._zones().values())))
        return ProviderCapabilities(
            spot=True,
            delete_specific_node=True,
            zones=(self.config.region, *zones),
            max_nodes_per_launch=MAX_FLEET_SIZE,
            reports_node_ready=False,
        )

    # --- Provider protocol ---------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """One instant fleet for ``request``; the instances already launched for its request id if there are any."""
        if not 1 <= request.count <= MAX_FLEET_SIZE:
            raise InvalidProviderRequest(f"count must be 1 to {MAX_FLEET_SIZE}", provider=self.name, field="count")
        with self._lock:
            subnets = self._subnets_for(request.zone)
            existing = self._describe([("tag:" + TAG_REQUEST, [request.request_id])])
            if existing:
                return existing
            template_id = self._template(request)
            spot = request.capacity_type is CapacityType.SPOT
            params: dict[str, Any] = {
                "Type": "instant",
                "ClientToken": client_token(request.request_id),
                "TargetCapacitySpecification": {
                    "TotalTargetCapacity": request.count,
                    "DefaultTargetCapacityType": "spot" if spot else "on-demand",
                    "OnDemandTargetCapacity": 0 if spot else request.count,
                    "SpotTargetCapacity": request.count if spot else 0,
                },
                "LaunchTemplateConfigs": [
                    {
                        "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "$Latest"},
                        "Overrides": [
                            {"InstanceType": request.instance_type, "SubnetId": s, "AvailabilityZone": z}
                            for s, z in subnets
                        ],
                    }
                ],
                "TagSpecifications": [{"ResourceType": "instance", "Tags": self._tags(request)}],
            }
            if spot:
                params["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
            else:
                params["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
            what = f"launch {request.request_id}"
            answer = self.aws.call(what, lambda: self.aws("ec2").create_fleet(**params))
            updates = self._offering_updates(answer.get("Errors") or [], request)
            self._updates.extend(updates)
            ids = [i for item in answer.get("Instances") or [] for i in item.get("InstanceIds") or []]
            if not ids:
                items = [(str(e.get("ErrorCode", "")), str(e.get("ErrorMessage", ""))) for e in answer["Errors"] or []]
                raise fleet_error(items, tuple(updates), what, request.capacity_type)
            self._requests.update(dict.fromkeys(ids, request.request_id))
            log.info("aws: fleet launched %s for request %s", ",".join(ids), request.request_id)
            return self._describe([("instance-id", ids)])

    def delete_node(self, node_id: str) -> None:
        """Terminate this instance if it is one of this cluster's gpuscale nodes; gone or unknown is success."""
        if not _INSTANCE_ID.match(node_id):
            return
        with self._lock:
            if not self._describe([("instance-id", [node_id])]):
                return
            self._deleted.add(node_id)
            try:
                self.aws.call(
                    f"terminate {node_id}", lambda: self.aws("ec2").terminate_instances(InstanceIds=[node_id])
                )
            except NotFound:
                return
            log.info("aws: terminated %s", node_id)

    def list_nodes(self) -> Sequence[CloudNode]:
        """Every instance this cluster's gpuscale launched that is not terminated."""
        with self._lock:
            return self._describe([])

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Events since the last call, from the interruption queue (nothing when no queue is configured)."""
        with self._lock:
            if self._queue is not None:
                self._events.extend(self._queue.drain(self._owner, self._deleted))
            events, self._events = self._events, []
            return events

    # --- beyond the protocol -------------------------------------------------------------------------------------
    def availability_updates(self) -> list[OfferingUpdate]:
        """Offerings named by fleet errors since the last call (also on fleets that launched something)."""
        with self._lock:
            out, self._updates = self._updates, []
            return out

    def check_queue(self) -> None:
        """Raise :class:`~gpuscale.errors.InputError` now if the configured interruption queue does not exist."""
        if self._queue is not None:
            with self._lock:
                self._queue.url()

    def check(self) -> None:
        """Fail early on a wrong configuration: the cluster, the subnets and the interruption queue must exist."""
        with self._lock:
            self._cluster_info()
            self._zones()
            if self._queue is not None:
                self._queue.url()

    # --- internals -----------------------------------------------------------------------------------------------
    def _tags(self, request: LaunchRequest) -> list[dict[str, str]]:
        tags = {
            TAG_CLUSTER: self.config.cluster_name,
            TAG_POOL: request.pool,
            TAG_REQUEST: request.request_id,
            TAG_ZONE: request.zone or self.config.region,
            TAG_CAPACITY: str(request.capacity_type),
            f"kubernetes.io/cluster/{self.config.cluster_name}": "owned",
            "Name": f"gpuscale-{request.pool}",
        }
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def _zones(self) -> dict[str, str]:
        if self._subnet_zones is None:
            answer = self.aws.call(
                "describe subnets", lambda: self.aws("ec2").describe_subnets(SubnetIds=list(self.config.subnet_ids))
            )
            self._subnet_zones = {s["SubnetId"]: s["AvailabilityZone"] for s in answer.get("Subnets", [])}
        return self._subnet_zones

    def _subnets_for(self, zone: str) -> list[tuple[str, str]]:
        pairs = sorted(self._zones().items())
        if zone not in ("", self.config.region):
            pairs = [(s, z) for s, z in pairs if z == zone]
        if not pairs:
            raise InvalidProviderRequest(
                f"no configured subnet is in zone {zone!r} of region {self.config.region}",
                provider=self.name,
                field="zone",
            )
        return pairs

    def _cluster_info(self) -> _Cluster:
        if self._cluster is None:
            name = self.config.cluster_name
            raw = self.aws.call(f"describe cluster {name}", lambda: self.aws("eks").describe_cluster(name=name))
            c = raw["cluster"]
            cidr = (c.get("kubernetesNetworkConfig") or {}).get("serviceIpv4Cidr") or "10.100.0.0/16"
            self._cluster = _Cluster(
                endpoint=str(c.get("endpoint") or ""),
                ca=str((c.get("certificateAuthority") or {}).get("data") or ""),
                cidr=str(cidr),
                version=self.config.kubernetes_version or str(c.get("version") or ""),
            )
        return self._cluster

    def _image(self, instance_type: str, cluster: _Cluster) -> str:
        name = self.config.ami_parameter or ami_parameter(cluster.version, instance_type)
        raw = self.aws.call(f"read SSM parameter {name}", lambda: self.aws("ssm").get_parameter(Name=name))
        return str(raw["Parameter"]["Value"])

    def _template(self, request: LaunchRequest) -> str:
        cluster = self._cluster_info()
        image = self._image(request.instance_type, cluster)
        labels = {**request.labels, "gpuscale.io/pool": request.pool}
        data = user_data(self.config.cluster_name, cluster.endpoint, cluster.ca, cluster.cidr, labels, request.taints)
        spec: dict[str, Any] = {
            "ImageId": image,
            "UserData": base64.b64encode(data.encode()).decode(),
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
        }
        if self.config.security_group_ids:
            spec["SecurityGroupIds"] = list(self.config.security_group_ids)
        if self.config.instance_profile:
            spec["IamInstanceProfile"] = {"Name": self.config.instance_profile}
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        pool = re.sub(r"[^A-Za-z0-9().\-_]", "-", request.pool)[:60]
        name = f"gpuscale/{self.config.cluster_name[:40]}/{pool}/{digest}"
        if name in self._templates:
            return self._templates[name]
        ec2 = self.aws("ec2")
        try:
            found = self.aws.call(
                f"describe launch template {name}", lambda: ec2.describe_launch_templates(LaunchTemplateNames=[name])
            )
            template_id = str(found["LaunchTemplates"][0]["LaunchTemplateId"])
        except (NotFound, InvalidProviderRequest):
            tags = [{"Key": TAG_CLUSTER, "Value": self.config.cluster_name}, {"Key": TAG_POOL, "Value": request.pool}]
            created = self.aws.call(
                f"create launch template {name}",
                lambda: ec2.create_launch_template(
                    LaunchTemplateName=name,
                    LaunchTemplateData=spec,
                    TagSpecifications=[{"ResourceType": "launch-template", "Tags": tags}],
                ),
            )
            template_id = str(created["LaunchTemplate"]["LaunchTemplateId"])
            log.info("aws: created launch template %s for pool %s", name, request.pool)
        self._templates[name] = template_id
        return template_id

    def _offering_updates(self, errors: list[dict[str, Any]], request: LaunchRequest) -> list[OfferingUpdate]:
        zones = self._zones()
        out: list[OfferingUpdate] = []
        for e in errors:
            over = (e.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            zone = over.get("AvailabilityZone") or zones.get(str(over.get("SubnetId", "")), request.zone)
            life = e.get("Lifecycle")
            cap = CapacityType.SPOT if life == "spot" else CapacityType.ON_DEMAND if life else request.capacity_type
            offering = OfferingKey(str(over.get("InstanceType") or request.instance_type), str(zone), cap)
            code = str(e.get("ErrorCode", ""))
            out.append(OfferingUpdate(offering, code, str(e.get("ErrorMessage", ""))[:300]))
        for u in out:
            log.warning("aws: %s unavailable: %s", u.offering, u.code)
        return out

    def _describe(self, filters: list[tuple[str, list[str]]]) -> list[CloudNode]:
        api_filters = [
            {"Name": "tag:" + TAG_CLUSTER, "Values": [self.config.cluster_name]},
            {"Name": "instance-state-name", "Values": list(ALIVE_STATES)},
            *({"Name": n, "Values": v} for n, v in filters),
        ]
        ec2 = self.aws("ec2")
        nodes: list[CloudNode] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Filters": api_filters, **({"NextToken": token} if token else {})}
            page = self.aws.call("describe instances", lambda kw=kwargs: ec2.describe_instances(**kw))  # type: ignore[misc]
            nodes.extend(self._node(i) for r in page.get("Reservations", []) for i in r.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                break
        nodes.sort(key=lambda n: (n.created_at, n.node_id))
        for n in nodes:
            self._requests[n.node_id] = n.request_id
        return nodes

    def _node(self, inst: Mapping[str, Any]) -> CloudNode:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags") or []}
        az = str((inst.get("Placement") or {}).get("AvailabilityZone", ""))
        spot = inst.get("InstanceLifecycle") == "spot"
        launched = inst.get("LaunchTime")
        return CloudNode(
            node_id=str(inst["InstanceId"]),
            request_id=tags.get(TAG_REQUEST, ""),
            pool=tags.get(TAG_POOL, ""),
            instance_type=str(inst.get("InstanceType", "")),
            zone=tags.get(TAG_ZONE, az),
            capacity_type=CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
            state=INSTANCE_STATES.get(str((inst.get("State") or {}).get("Name", "")), CloudNodeState.PROVISIONING),
            created_at=launched.timestamp() if isinstance(launched, datetime) else 0.0,
            node_name=str(inst.get("PrivateDnsName") or ""),
            instance_id=str(inst["InstanceId"]),
            labels={
                "topology.kubernetes.io/zone": az,
                "node.kubernetes.io/instance-type": inst.get("InstanceType", ""),
            },
        )

    def _owner(self, instance_id: str) -> str | None:
        """The request id of one of this cluster's gpuscale instances, or None when it is not one."""
        if instance_id in self._requests:
            return self._requests[instance_id]
        found = self._describe([("instance-id", [instance_id])])
        return found[0].request_id if found else None
