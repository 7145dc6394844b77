"""Choosing AWS: ``plan --provider aws`` (and ``--catalog aws:REGION``), ``serve --provider aws`` (the GPR manager's
provider factory builds the fleet or node group provider from the environment), a bad setting as a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aws_moto import ACCESS_KEY, REGION, SECRET_KEY, MotoAws, World, build_world, shared_moto
from gpuscale.catalogs import KNOWN_CATALOGS
from gpuscale.cli import main
from gpuscale.clock import ManualClock
from gpuscale.errors import InputError
from gpuscale.gpr.server import build_manager
from gpuscale.providers.aws import AwsProvider
from gpuscale.providers.aws_factory import aws_provider_from_env
from gpuscale.providers.aws_nodegroup import AwsNodeGroupProvider

SNAPSHOT = """\
apiVersion: gpuscale.io/v1alpha1
kind: GPUNodePool
metadata: {name: a10g}
spec:
  instanceTypes: [g5.xlarge, g5.2xlarge]
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
  maxNodes: 4
---
apiVersion: v1
kind: Pod
metadata: {name: infer-0, namespace: ml}
spec:
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
    - name: main
      image: vllm/vllm-openai:v0.6.0
      resources:
        requests: {cpu: "2", memory: 8Gi, nvidia.com/gpu: 1}
        limits: {nvidia.com/gpu: 1}
status: {phase: Pending}
"""


@pytest.fixture
def snapshot(tmp_path: Path) -> str:
    path = tmp_path / "aws.yaml"
    path.write_text(SNAPSHOT)
    return str(path)


@pytest.mark.parametrize(("extra", "zone"), [((), "us-east-1"), (("--catalog", "aws:eu-west-1"), "eu-west-1")])
def test_plan_with_provider_aws_plans_on_the_aws_catalog(snapshot: str, extra: tuple[str, ...], zone: str) -> None:
    res = CliRunner().invoke(main, ["plan", snapshot, "--provider", "aws", "--json", *extra])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    [launch] = plan["launches"]
    assert launch["instanceType"] == "g5.xlarge" and launch["zone"] == zone
    assert plan["blocked"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--provider", "aws", "--catalog", "linode"], "--catalog: catalog 'linode' is not provider 'aws''s"),
        (["--provider", "nimbus"], "--provider: unknown provider"),
    ],
)
def test_plan_rejects_a_mismatched_or_unknown_provider(snapshot: str, args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["plan", snapshot, *args])
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_aws_is_a_shipped_catalog() -> None:
    assert "aws" in KNOWN_CATALOGS


@pytest.fixture(scope="module")
def aws() -> MotoAws:
    return shared_moto()


@pytest.fixture
def world(aws: MotoAws) -> World:
    return build_world(aws)


def _env(aws: MotoAws, world: World, **extra: str) -> dict[str, str]:
    return {
        "GPUSCALE_AWS_CLUSTER": world.cluster,
        "AWS_REGION": REGION,
        "GPUSCALE_AWS_SUBNETS": ",".join(world.subnets.values()),
        "GPUSCALE_AWS_INTERRUPTION_QUEUE": world.queue,
        "AWS_ENDPOINT_URL": aws.proxy.url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        **extra,
    }


def test_the_factory_builds_either_mode_and_the_provider_works(aws: MotoAws, world: World) -> None:
    fleet = aws_provider_from_env(_env(aws, world), ManualClock(0.0))
    assert isinstance(fleet, AwsProvider)
    assert fleet.list_nodes() == [] and fleet.poll_errors() == []
    groups = aws_provider_from_env(
        _env(aws, world, GPUSCALE_AWS_MODE="nodegroup", GPUSCALE_AWS_NODEGROUPS="gpu=ng"), ManualClock(0.0)
    )
    assert isinstance(groups, AwsNodeGroupProvider)


def test_the_factory_reports_a_missing_queue_or_cluster_setting(aws: MotoAws, world: World) -> None:
    with pytest.raises(InputError) as info:
        aws_provider_from_env(_env(aws, world, GPUSCALE_AWS_INTERRUPTION_QUEUE="missing-queue"), ManualClock(0.0))
    assert "GPUSCALE_AWS_INTERRUPTION_QUEUE" in str(info.value) and "missing-queue" in str(info.value)
    env = {k: v for k, v in _env(aws, world).items() if k != "GPUSCALE_AWS_CLUSTER"}
    with pytest.raises(InputError) as info:
        aws_provider_from_env(env, ManualClock(0.0))
    assert "GPUSCALE_AWS_CLUSTER" in str(info.value)


def test_serve_with_provider_aws_uses_the_aws_catalog_and_provider(aws: MotoAws, world: World, tmp_path: Path) -> None:
    other = build_manager(
        tmp_path / "a.db", provider="aws", catalog="aws", env=_env(aws, world, AWS_REGION="us-west-2")
    )
    assert {o.zone for it in other.catalog.instance_types for o in it.offerings} == {"us-west-2"}
    manager = build_manager(tmp_path / "b.db", provider="aws", catalog="aws", env=_env(aws, world))
    assert manager.config.cluster == world.cluster
    report = manager.reconcile()
    assert report.errors == [] and manager.blocked_reason is None
    listed = [r for r in aws.proxy.requests if r.action == "DescribeInstances"]
    assert listed and all(world.cluster in r.params.values() for r in listed)
    assert "ReceiveMessage" in aws.proxy.actions()


def test_serve_reports_a_bad_aws_setting_on_the_manager_without_raising(
    aws: MotoAws, world: World, tmp_path: Path
) -> None:
    for env, name in (
        ({"AWS_REGION": REGION, "GPUSCALE_AWS_SUBNETS": "subnet-1"}, "GPUSCALE_AWS_CLUSTER"),
        (_env(aws, world, GPUSCALE_AWS_INTERRUPTION_QUEUE="gone"), "GPUSCALE_AWS_INTERRUPTION_QUEUE"),
    ):
        manager = build_manager(tmp_path / f"{name}.db", provider="aws", catalog="aws", env=env)
        manager.reconcile()
        assert manager.blocked_reason is not None and name in manager.blocked_reason


def test_cli_choices_name_aws() -> None:
    for command in (["serve", "--help"], ["plan", "--help"]):
        res = CliRunner().invoke(main, command)
        assert res.exit_code == 0 and "aws" in res.output
