"""The AWS provider: the real boto3 over HTTP against moto's server, with AWS errors moto does not model injected
by the proxy in ``tests/aws_moto.py`` as real EC2 responses."""

from __future__ import annotations

import base64
import json
import logging
import traceback
from typing import Any

import pytest

from aws_moto import ACCESS_KEY, REGION, SECRET_KEY, MotoAws, World, build_world, ec2_event, shared_moto
from gpuscale.clock import ManualClock
from gpuscale.core.model import CapacityType, OfferingKey, Taint, TaintEffect
from gpuscale.errors import (
    AuthenticationError,
    CapacityError,
    InputError,
    InsufficientCapacity,
    InvalidProviderRequest,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers.aws import AwsConfig, AwsProvider, ami_parameter, client_token
from gpuscale.providers.aws_events import REBALANCE, SPOT_WARNING, STATE_CHANGE
from gpuscale.providers.aws_nodegroup import AwsNodeGroupProvider
from gpuscale.providers.base import LaunchRequest, ProviderEventKind


@pytest.fixture(scope="module")
def aws() -> MotoAws:
    return shared_moto()


@pytest.fixture
def world(aws: MotoAws) -> World:
    return build_world(aws)


def make_provider(aws: MotoAws, world: World, **overrides: Any) -> AwsProvider:
    settings: dict[str, Any] = {
        "cluster_name": world.cluster,
        "region": REGION,
        "subnet_ids": tuple(world.subnets.values()),
        "security_group_ids": (world.security_group,),
        "instance_profile": "gpu-nodes",
        "interruption_queue": world.queue,
        "endpoint_url": aws.proxy.url,
        **overrides,
    }
    return AwsProvider(AwsConfig(**settings), session=aws.session(), clock=ManualClock(1_000.0))


def req(request_id: str, *, zone: str = REGION, spot: bool = False, count: int = 2, **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        pool=str(kw.pop("pool", "gpu")),
        instance_type=str(kw.pop("instance_type", "g5.xlarge")),
        zone=zone,
        capacity_type=CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
        count=count,
        **kw,
    )


def instance_tags(aws: MotoAws, instance_id: str) -> dict[str, str]:
    res = aws.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in res.get("Tags", [])}


# --- launch -----------------------------------------------------------------------------------------------------------
def test_on_demand_launch_is_one_instant_fleet_over_every_subnet(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world)
    nodes = provider.launch(req("req-a", count=3))
    assert len({n.node_id for n in nodes}) == 3
    [fleet] = aws.proxy.calls("CreateFleet")
    assert fleet["Type"] == "instant"
    assert fleet["ClientToken"] == "req-a"
    assert fleet["OnDemandOptions.AllocationStrategy"] == "lowest-price"
    assert fleet["TargetCapacitySpecification.TotalTargetCapacity"] == "3"
    assert fleet["TargetCapacitySpecification.DefaultTargetCapacityType"] == "on-demand"
    overrides = {
        (
            fleet[f"LaunchTemplateConfigs.1.Overrides.{i}.SubnetId"],
            fleet[f"LaunchTemplateConfigs.1.Overrides.{i}.AvailabilityZone"],
        )
        for i in (1, 2)
    }
    assert overrides == {(s, z) for z, s in world.subnets.items()}
    assert "LaunchTemplateConfigs.1.Overrides.3.SubnetId" not in fleet
    for node in nodes:
        assert node.capacity_type is CapacityType.ON_DEMAND
        assert node.zone == REGION and node.labels["topology.kubernetes.io/zone"] in world.subnets
        tags = instance_tags(aws, node.node_id)
        assert tags["gpuscale.io/request-id"] == "req-a"
        assert tags["gpuscale.io/pool"] == "gpu"
        assert tags["gpuscale.io/cluster"] == world.cluster
        assert tags[f"kubernetes.io/cluster/{world.cluster}"] == "owned"


def test_spot_launch_in_one_zone_uses_price_capacity_optimized(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world)
    [node] = provider.launch(req("req-s", zone="us-east-1b", spot=True, count=1))
    [fleet] = aws.proxy.calls("CreateFleet")
    assert fleet["SpotOptions.AllocationStrategy"] == "price-capacity-optimized"
    assert fleet["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot"
    assert fleet["LaunchTemplateConfigs.1.Overrides.1.SubnetId"] == world.subnets["us-east-1b"]
    assert "LaunchTemplateConfigs.1.Overrides.2.SubnetId" not in fleet
    assert node.capacity_type is CapacityType.SPOT
    assert node.zone == "us-east-1b"


def test_a_zone_without_subnet_is_an_invalid_request(aws: MotoAws, world: World) -> None:
    with pytest.raises(InvalidProviderRequest) as info:
        make_provider(aws, world).launch(req("req-z", zone="us-east-1f"))
    assert info.value.field == "zone"
    assert "CreateFleet" not in aws.proxy.actions()


def test_relaunch_and_a_restarted_provider_create_nothing(aws: MotoAws, world: World) -> None:
    first = make_provider(aws, world).launch(req("req-a"))
    again = make_provider(aws, world).launch(req("req-a"))
    assert {n.node_id for n in again} == {n.node_id for n in first}
    assert len(aws.proxy.calls("CreateFleet")) == 1


def test_client_token_fits_aws_limit() -> None:
    assert client_token("req-1") == "req-1"
    long = "x" * 65
    assert client_token(long) != long and len(client_token(long)) == 64
    assert client_token("with space") == client_token("with space") != "with space"


def test_launch_template_per_pool_with_eks_ami_and_join_user_data(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world)
    taint = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
    provider.launch(req("req-a", count=1, labels={"team": "ml"}, taints=(taint,)))
    provider.launch(req("req-b", count=1, labels={"team": "ml"}, taints=(taint,)))
    assert aws.proxy.actions().count("CreateLaunchTemplate") == 1
    [get] = aws.proxy.calls("GetParameter")[:1]
    assert get["Name"] == "/aws/service/eks/optimized-ami/1.31/amazon-linux-2023/x86_64/nvidia/recommended/image_id"
    [created] = aws.proxy.calls("CreateLaunchTemplate")
    [template] = aws.client("ec2").describe_launch_templates(LaunchTemplateNames=[created["LaunchTemplateName"]])[
        "LaunchTemplates"
    ]
    assert template["LaunchTemplateName"].startswith(f"gpuscale/{world.cluster}/gpu/")
    data = aws.client("ec2").describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"
    ][0]["LaunchTemplateData"]
    assert data["ImageId"] == world.image_id
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["IamInstanceProfile"]["Name"] == "gpu-nodes"
    text = base64.b64decode(data["UserData"]).decode()
    body = json.loads(text.split("application/node.eks.aws\n\n", 1)[1].rsplit("\n\n--", 1)[0])
    assert body["spec"]["cluster"]["name"] == world.cluster
    assert body["spec"]["cluster"]["apiServerEndpoint"].startswith("https://")
    flags = body["spec"]["kubelet"]["flags"]
    assert "--node-labels=gpuscale.io/pool=gpu,team=ml" in flags
    assert "--register-with-taints=nvidia.com/gpu=present:NoSchedule" in flags
    provider.launch(req("req-c", count=1, pool="other"))
    assert aws.proxy.actions().count("CreateLaunchTemplate") == 2


def test_graviton_types_use_the_arm64_ami() -> None:
    assert "/arm64/nvidia/" in ami_parameter("1.31", "g5g.xlarge")
    assert "/x86_64/nvidia/" in ami_parameter("1.31", "p4d.24xlarge")


# --- fleet errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("InsufficientInstanceCapacity", InsufficientCapacity),
        ("UnfulfillableCapacity", InsufficientCapacity),
        ("Unsupported", CapacityError),
        ("MaxSpotInstanceCountExceeded", QuotaExceeded),
        ("VcpuLimitExceeded", QuotaExceeded),
    ],
)
def test_fleet_errors_map_to_the_tree_and_name_their_offerings(
    aws: MotoAws, world: World, code: str, error: type[Exception]
) -> None:
    aws.proxy.fleet_errors[("g5.2xlarge", None)] = (code, f"{code} for g5.2xlarge")
    provider = make_provider(aws, world)
    with pytest.raises(error) as info:
        provider.launch(req("req-e", spot=True, instance_type="g5.2xlarge"))
    assert code in str(info.value)
    expected = {OfferingKey("g5.2xlarge", z, CapacityType.SPOT) for z in world.subnets}
    assert {u.offering for u in info.value.offerings} == expected  # type: ignore[attr-defined]
    assert {u.offering for u in provider.availability_updates()} == expected
    assert provider.list_nodes() == []


def test_a_partial_fleet_launches_and_names_only_the_failed_zone(aws: MotoAws, world: World) -> None:
    aws.proxy.fleet_errors[("g5.xlarge", "us-east-1a")] = ("InsufficientInstanceCapacity", "none in 1a")
    provider = make_provider(aws, world)
    nodes = provider.launch(req("req-p", count=2))
    assert len(nodes) == 2
    assert {n.labels["topology.kubernetes.io/zone"] for n in nodes} == {"us-east-1b"}
    [update] = provider.availability_updates()
    assert update.offering == OfferingKey("g5.xlarge", "us-east-1a", CapacityType.ON_DEMAND)
    assert update.code == "InsufficientInstanceCapacity"
    assert provider.availability_updates() == []


def test_mixed_capacity_and_quota_errors_are_a_quota_error(aws: MotoAws, world: World) -> None:
    aws.proxy.fleet_errors[("g5.xlarge", "us-east-1a")] = ("InsufficientInstanceCapacity", "none")
    aws.proxy.fleet_errors[("g5.xlarge", "us-east-1b")] = ("VcpuLimitExceeded", "vCPU limit")
    with pytest.raises(QuotaExceeded):
        make_provider(aws, world).launch(req("req-m"))


# --- HTTP errors, retries, credentials --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (503, "RequestLimitExceeded", RateLimited),
        (403, "UnauthorizedOperation", AuthenticationError),
        (401, "AuthFailure", AuthenticationError),
        (500, "InternalError", TransientProviderError),
        (400, "InvalidParameterValue", InvalidProviderRequest),
        (400, "IdempotentParameterMismatch", InvalidProviderRequest),
    ],
)
def test_http_errors_map_and_botocore_does_not_retry(
    aws: MotoAws, world: World, status: int, code: str, error: type[Exception]
) -> None:
    provider = make_provider(aws, world)
    aws.proxy.action_errors["CreateFleet"] = (status, code, "Encoded authorization failure message: AbC123")
    with pytest.raises(error) as info:
        provider.launch(req("req-h"))
    assert aws.proxy.actions().count("CreateFleet") == 1
    if error is AuthenticationError:
        assert "AbC123" not in str(info.value)
    if code == "IdempotentParameterMismatch":
        assert info.value.field == "request_id"  # type: ignore[attr-defined]
    assert provider.aws("ec2").meta.config.retries["total_max_attempts"] == 1


def test_credentials_never_appear_in_errors_chains_or_logs(
    aws: MotoAws, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuscale")
    provider = make_provider(aws, world)
    aws.proxy.action_errors["DescribeSubnets"] = (400, "InvalidParameterValue", f"bad key {SECRET_KEY} {ACCESS_KEY}")
    with pytest.raises(InvalidProviderRequest) as info:
        provider.launch(req("req-c"))
    text = "".join(traceback.format_exception(info.value)) + caplog.text + repr(provider)
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    assert "***" in str(info.value)


# --- delete and list --------------------------------------------------------------------------------------------------
def test_delete_terminates_only_gpuscale_instances_of_this_cluster(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world)
    nodes = provider.launch(req("req-a", count=2))
    foreign = aws.client("ec2").run_instances(ImageId=world.image_id, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
    foreign_id = foreign["Instances"][0]["InstanceId"]
    provider.delete_node(foreign_id)
    provider.delete_node(nodes[0].node_id)
    provider.delete_node(nodes[0].node_id)
    provider.delete_node("i-0123456789abcdef0")
    provider.delete_node("not-an-instance")
    assert [n.node_id for n in provider.list_nodes()] == [nodes[1].node_id]
    state = aws.client("ec2").describe_instances(InstanceIds=[foreign_id])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "running"
    assert aws.proxy.actions().count("TerminateInstances") == 1


# --- interruption queue -----------------------------------------------------------------------------------------------
def test_queue_events_become_provider_events(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world)
    spot = provider.launch(req("req-s", spot=True, count=3))
    sqs = aws.client("sqs")
    foreign = aws.client("ec2").run_instances(ImageId=world.image_id, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
    provider.delete_node(spot[2].node_id)
    for body in (
        ec2_event(SPOT_WARNING, spot[0].node_id, at="2026-11-24T21:00:00Z"),
        ec2_event(REBALANCE, spot[1].node_id),
        ec2_event(STATE_CHANGE, spot[1].node_id, state="terminated"),
        ec2_event(STATE_CHANGE, spot[2].node_id, state="terminated"),  # we deleted it: not a failure
        ec2_event(SPOT_WARNING, foreign["Instances"][0]["InstanceId"]),  # not ours
        ec2_event(STATE_CHANGE, spot[0].node_id, state="running"),
        "not json",
        json.dumps({"source": "aws.health", "detail": {}}),
    ):
        sqs.send_message(QueueUrl=world.queue_url, MessageBody=body)
    events = provider.poll_errors()
    got = [(e.kind, e.node_id, e.request_id) for e in events]
    assert got == [
        (ProviderEventKind.SPOT_INTERRUPTION, spot[0].node_id, "req-s"),
        (ProviderEventKind.REBALANCE_RECOMMENDATION, spot[1].node_id, "req-s"),
        (ProviderEventKind.NODE_FAILED, spot[1].node_id, "req-s"),
    ]
    warning = events[0]
    assert warning.deadline == warning.at + 120.0
    assert provider.poll_errors() == []
    left = sqs.get_queue_attributes(QueueUrl=world.queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert left["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_a_missing_queue_is_a_configuration_error(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world, interruption_queue="no-such-queue")
    with pytest.raises(InputError) as info:
        provider.poll_errors()
    assert "GPUSCALE_AWS_INTERRUPTION_QUEUE" in str(info.value)
    assert "no-such-queue" in str(info.value)
    with pytest.raises(InputError):
        provider.check()


def test_without_a_queue_poll_errors_calls_nothing(aws: MotoAws, world: World) -> None:
    provider = make_provider(aws, world, interruption_queue="")
    assert provider.poll_errors() == []
    assert aws.proxy.requests == []


# --- configuration ----------------------------------------------------------------------------------------------------
def test_config_from_env() -> None:
    env = {
        "GPUSCALE_AWS_CLUSTER": "c",
        "AWS_REGION": "eu-west-1",
        "GPUSCALE_AWS_SUBNETS": "subnet-1, subnet-2",
        "GPUSCALE_AWS_INTERRUPTION_QUEUE": "q",
    }
    cfg = AwsConfig.from_env(env)
    assert cfg.subnet_ids == ("subnet-1", "subnet-2") and cfg.region == "eu-west-1" and cfg.mode == "fleet"
    ng = AwsConfig.from_env({**env, "GPUSCALE_AWS_MODE": "nodegroup", "GPUSCALE_AWS_NODEGROUPS": "gpu=ng-gpu"})
    assert ng.nodegroups == {"gpu": "ng-gpu"}
    for bad, where in (
        ({k: v for k, v in env.items() if k != "GPUSCALE_AWS_CLUSTER"}, "GPUSCALE_AWS_CLUSTER"),
        ({k: v for k, v in env.items() if k != "AWS_REGION"}, "AWS_REGION"),
        ({**env, "GPUSCALE_AWS_SUBNETS": ""}, "subnet_ids"),
        ({**env, "GPUSCALE_AWS_MODE": "asg"}, "mode"),
        ({**env, "GPUSCALE_AWS_NODEGROUPS": "gpu"}, "GPUSCALE_AWS_NODEGROUPS"),
    ):
        with pytest.raises(InputError) as info:
            AwsConfig.from_env(bad)
        assert where in str(info.value)


# --- managed node group mode ------------------------------------------------------------------------------------------
def _nodegroup(aws: MotoAws, world: World, name: str = "ng-gpu", max_size: int = 3) -> None:
    aws.client("eks").create_nodegroup(
        clusterName=world.cluster,
        nodegroupName=name,
        nodeRole="arn:aws:iam::123456789012:role/nodes",
        subnets=list(world.subnets.values()),
        instanceTypes=["g5.xlarge"],
        scalingConfig={"minSize": 0, "maxSize": max_size, "desiredSize": 0},
        labels={"team": "ml"},
    )


def _group_instances(aws: MotoAws, world: World, name: str, count: int) -> list[str]:
    """Stand-ins for the instances the node group's Auto Scaling group starts (moto's EKS starts none)."""
    tags = [{"Key": "eks:cluster-name", "Value": world.cluster}, {"Key": "eks:nodegroup-name", "Value": name}]
    out = aws.client("ec2").run_instances(
        ImageId=world.image_id,
        InstanceType="g5.xlarge",
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return [i["InstanceId"] for i in out["Instances"]]


def test_nodegroup_mode_raises_desired_size_once_per_request(aws: MotoAws, world: World) -> None:
    _nodegroup(aws, world)
    cfg = AwsConfig(
        cluster_name=world.cluster,
        region=REGION,
        mode="nodegroup",
        nodegroups={"gpu": "ng-gpu"},
        endpoint_url=aws.proxy.url,
    )
    provider = AwsNodeGroupProvider(cfg, session=aws.session())
    provider.launch(req("req-a", count=2))
    provider.launch(req("req-a", count=2))
    group = aws.client("eks").describe_nodegroup(clusterName=world.cluster, nodegroupName="ng-gpu")["nodegroup"]
    assert group["scalingConfig"]["desiredSize"] == 2
    assert group["labels"]["requests.gpuscale.io/req-a"] == "1.2"
    assert group["labels"]["team"] == "ml"
    assert aws.proxy.actions().count(f"POST /clusters/{world.cluster}/node-groups/ng-gpu/update-config") == 1
    with pytest.raises(QuotaExceeded):
        provider.launch(req("req-b", count=2))
    ids = _group_instances(aws, world, "ng-gpu", 3)
    listed = provider.list_nodes()
    assert sorted(n.node_id for n in listed) == sorted(ids)
    assert sorted(n.request_id for n in listed) == ["", "req-a", "req-a"]
    with pytest.raises(InvalidProviderRequest) as info:
        provider.launch(req("req-c", pool="no-group"))
    assert info.value.field == "pool"
    with pytest.raises(InvalidProviderRequest):
        provider.launch(req("req-d", instance_type="p4d.24xlarge", count=1))
