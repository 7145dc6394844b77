"""docs/providers/aws.md: its IAM policies grant exactly the EC2, EKS, SSM, SQS and Auto Scaling actions the provider
calls (every code path of each mode is run against moto and the calls are recorded), and the node group mode removes
a chosen node from a real Auto Scaling group."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from aws_moto import REGION, MotoAws, World, build_world, ec2_event, shared_moto
from gpuscale.clock import ManualClock
from gpuscale.core.model import CapacityType
from gpuscale.providers.aws import AwsConfig, AwsProvider
from gpuscale.providers.aws_events import REBALANCE, SPOT_WARNING, STATE_CHANGE
from gpuscale.providers.aws_nodegroup import AwsNodeGroupProvider
from gpuscale.providers.base import LaunchRequest, ProviderEventKind

DOC = Path(__file__).resolve().parents[1] / "docs" / "providers" / "aws.md"
CHECKED = ("ec2", "eks", "ssm", "sqs", "autoscaling")
IMPLIED = {"ec2:RunInstances", "ec2:CreateTags"}
"""Authorised by EC2 for the instances and tags a fleet creates; never called directly."""
_EKS_REST = [
    (re.compile(r"^GET /clusters/[^/]+$"), "DescribeCluster"),
    (re.compile(r"^GET /clusters/[^/]+/node-groups/[^/]+$"), "DescribeNodegroup"),
    (re.compile(r"^POST /clusters/[^/]+/node-groups/[^/]+/update-config$"), "UpdateNodegroupConfig"),
]
_IAM_NAME = {"DeleteMessageBatch": "DeleteMessage"}
"""API operations authorised under another IAM action."""


def policies() -> list[dict[str, Any]]:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    return [json.loads(b) for b in blocks if '"Statement"' in b]


def granted(policy: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for st in policy["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        out.update(actions)
    return out


def called(aws: MotoAws) -> set[str]:
    out = set()
    for r in aws.proxy.requests:
        action = r.action
        for pattern, name in _EKS_REST:
            if pattern.match(action):
                action = name
        assert " " not in action, f"unmapped REST call {action}"
        out.add(f"{r.service}:{_IAM_NAME.get(action, action)}")
    return out


@pytest.fixture(scope="module")
def aws() -> MotoAws:
    return shared_moto()


@pytest.fixture
def world(aws: MotoAws) -> World:
    return build_world(aws)


def _asg_group(aws: MotoAws, world: World, nodegroup: str, size: int) -> str:
    """An Auto Scaling group standing for the node group's own (moto's EKS creates none), its instances tagged as
    EKS tags them."""
    lt = aws.client("ec2").create_launch_template(
        LaunchTemplateName=f"ng-{world.cluster}",
        LaunchTemplateData={"ImageId": world.image_id, "InstanceType": "g5.xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    name = f"eks-{nodegroup}-{world.cluster}"
    tags = {"eks:cluster-name": world.cluster, "eks:nodegroup-name": nodegroup}
    aws.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": lt, "Version": "$Latest"},
        MinSize=0,
        MaxSize=4,
        DesiredCapacity=size,
        VPCZoneIdentifier=",".join(world.subnets.values()),
        Tags=[
            {"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": name, "ResourceType": "auto-scaling-group"}
            for k, v in tags.items()
        ],
    )
    return name


def _nodegroup_provider(aws: MotoAws, world: World) -> AwsNodeGroupProvider:
    aws.client("eks").create_nodegroup(
        clusterName=world.cluster,
        nodegroupName="ng-gpu",
        nodeRole="arn:aws:iam::123456789012:role/nodes",
        subnets=list(world.subnets.values()),
        instanceTypes=["g5.xlarge"],
        scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0},
    )
    cfg = AwsConfig(
        cluster_name=world.cluster,
        region=REGION,
        mode="nodegroup",
        nodegroups={"gpu": "ng-gpu"},
        interruption_queue=world.queue,
        endpoint_url=aws.proxy.url,
    )
    return AwsNodeGroupProvider(cfg, session=aws.session(), clock=ManualClock(0.0))


def test_the_fleet_mode_policy_grants_exactly_what_the_provider_calls(aws: MotoAws, world: World) -> None:
    cfg = AwsConfig(
        cluster_name=world.cluster,
        region=REGION,
        subnet_ids=tuple(world.subnets.values()),
        interruption_queue=world.queue,
        endpoint_url=aws.proxy.url,
    )
    provider = AwsProvider(cfg, session=aws.session(), clock=ManualClock(0.0))
    provider.check()
    nodes = provider.launch(LaunchRequest("req-a", "gpu", "g5.xlarge", REGION, CapacityType.SPOT, count=2))
    provider.launch(LaunchRequest("req-a", "gpu", "g5.xlarge", REGION, CapacityType.SPOT, count=2))
    provider.launch(LaunchRequest("req-b", "gpu", "g5.xlarge", REGION, count=1))
    provider.delete_node(nodes[1].node_id)
    provider.list_nodes()
    sqs = aws.client("sqs")
    for body in (
        ec2_event(SPOT_WARNING, nodes[0].node_id),
        ec2_event(REBALANCE, nodes[0].node_id),
        ec2_event(STATE_CHANGE, "i-0123456789abcdef0", state="terminated"),
    ):
        sqs.send_message(QueueUrl=world.queue_url, MessageBody=body)
    aws.proxy.requests = [r for r in aws.proxy.requests if r.action != "SendMessage"]
    provider.poll_errors()
    fleet_policy = policies()[0]
    doc = {a for a in granted(fleet_policy) if a.split(":")[0] in CHECKED}
    assert called(aws) | IMPLIED == doc
    assert "iam:PassRole" in granted(fleet_policy)


def test_the_nodegroup_policy_grants_exactly_what_the_provider_calls(aws: MotoAws, world: World) -> None:
    provider = _nodegroup_provider(aws, world)
    _asg_group(aws, world, "ng-gpu", 2)
    aws.proxy.requests.clear()
    provider.launch(LaunchRequest("req-a", "gpu", "g5.xlarge", REGION, count=2))
    nodes = provider.list_nodes()
    provider.delete_node(nodes[0].node_id)
    sqs = aws.client("sqs")
    sqs.send_message(QueueUrl=world.queue_url, MessageBody=ec2_event(SPOT_WARNING, nodes[1].node_id))
    sqs.send_message(
        QueueUrl=world.queue_url, MessageBody=ec2_event(STATE_CHANGE, nodes[0].node_id, state="terminated")
    )
    aws.proxy.requests = [r for r in aws.proxy.requests if r.action != "SendMessage"]
    events = provider.poll_errors()
    assert [(e.kind, e.node_id) for e in events] == [(ProviderEventKind.SPOT_INTERRUPTION, nodes[1].node_id)]
    doc = {a for a in granted(policies()[1]) if a.split(":")[0] in CHECKED}
    assert called(aws) == doc


def test_nodegroup_delete_removes_that_instance_and_decrements_size_and_ledger(aws: MotoAws, world: World) -> None:
    provider = _nodegroup_provider(aws, world)
    asg = _asg_group(aws, world, "ng-gpu", 3)
    provider.launch(LaunchRequest("req-a", "gpu", "g5.xlarge", REGION, count=2))
    nodes = provider.list_nodes()
    assert sorted(n.request_id for n in nodes) == ["", "req-a", "req-a"]
    victim = next(n for n in nodes if n.request_id == "req-a")
    provider.delete_node(victim.node_id)
    group = aws.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 2
    assert victim.node_id not in {i["InstanceId"] for i in group["Instances"]}
    ng = aws.client("eks").describe_nodegroup(clusterName=world.cluster, nodegroupName="ng-gpu")["nodegroup"]
    assert ng["labels"]["requests.gpuscale.io/req-a"] == "1.1"
    provider.delete_node("i-0123456789abcdef0")  # not in any group: nothing happens
