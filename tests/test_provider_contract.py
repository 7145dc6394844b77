"""The provider contract (tests/provider_contract.py) run against every provider backend in PROVIDER_FACTORIES.

To add a backend, append a factory (a callable with a ``name`` attribute returning a ContractBackend) to
``PROVIDER_FACTORIES``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from aws_moto import MotoAws, build_world, shared_moto
from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.fakes.linode_api import FakeLinodeAPI
from gpuscale.kube.client import KubeClient
from gpuscale.kube.kwok import KwokConfig, KwokProvider
from gpuscale.providers.aws import AwsConfig, AwsProvider
from gpuscale.providers.linode import LinodeConfig, LinodeProvider
from kube_harness import client_for
from provider_contract import ContractBackend, ProviderContract, ProviderFactory
from shared_fake import FakeBackend, FakeFactory, SharedFake
from test_alibaba_provider import ALIBABA_FACTORY
from test_gcp_provider import GCP_FACTORY

_LINODE = SharedFake(lambda: FakeLinodeAPI().start())
"""One fake Linode API server for the whole module (state is reset per backend)."""
_stop_fakes = _LINODE.stopper()


class LinodeBackend(FakeBackend[LinodeProvider, FakeLinodeAPI]):
    """The Linode provider talking to the fake Linode API (its OpenAPI spec checked) through linode_api4."""

    def exhaust_capacity(self, instance_type: str) -> None:
        self.fake.unavailable_types.add(instance_type)

    def exhaust_quota(self) -> None:
        self.fake.max_pools = 0


def _linode(clock: ManualClock) -> ContractBackend:
    fake = _LINODE.get()
    fake.reset()
    fake.clock = clock
    cluster_id = fake.create_cluster(region="us-ord")
    config = LinodeConfig(cluster_id=cluster_id, region="us-ord", base_url=fake.base_url, timeout_s=5.0)
    provider = LinodeProvider(config, env={"LINODE_TOKEN": fake.token}, clock=clock)
    return LinodeBackend(provider, fake, "g2-gpu-rtx4000a1-s", "us-ord")


@dataclass
class KwokBackend:
    """The kwok provider creating Node objects in the emulated Kubernetes API server."""

    provider: KwokProvider
    server: KubeAPIServer
    client: KubeClient
    instance_type: str = "g2-gpu-rtx4000a1-s"
    zone: str = "us-ord"

    def exhaust_capacity(self, instance_type: str) -> None:
        self.provider.config.unavailable_types.add(instance_type)

    def exhaust_quota(self) -> None:
        self.provider.config.max_nodes = 0

    def close(self) -> None:
        self.client.close()
        self.server.close()


class KwokFactory:
    name = "kwok"

    def __call__(self) -> ContractBackend:
        server = KubeAPIServer().start()
        client = client_for(server)
        provider = KwokProvider(client, load_catalog("linode"), ManualClock(1_000.0), KwokConfig())
        return KwokBackend(provider, server, client)


@dataclass
class AwsBackend:
    """The AWS provider talking boto3 to moto's server through the fault-injecting proxy (tests/aws_moto.py)."""

    provider: AwsProvider
    aws: MotoAws
    instance_type: str = "g5.xlarge"
    zone: str = "us-east-1"

    def exhaust_capacity(self, instance_type: str) -> None:
        self.aws.proxy.fleet_errors[(instance_type, None)] = ("InsufficientInstanceCapacity", "no capacity")

    def exhaust_quota(self) -> None:
        self.aws.proxy.fleet_errors[("*", None)] = ("VcpuLimitExceeded", "vCPU limit reached")

    def close(self) -> None:
        self.aws.proxy.reset()


class AwsFactory:
    name = "aws"

    def __call__(self) -> ContractBackend:
        aws = shared_moto()
        world = build_world(aws)
        config = AwsConfig(
            cluster_name=world.cluster,
            region="us-east-1",
            subnet_ids=tuple(world.subnets.values()),
            interruption_queue=world.queue,
            endpoint_url=aws.proxy.url,
        )
        return AwsBackend(AwsProvider(config, session=aws.session(), clock=ManualClock(1_000.0)), aws)


PROVIDER_FACTORIES: list[ProviderFactory] = [
    FakeFactory("linode", _linode),
    KwokFactory(),
    AwsFactory(),
    GCP_FACTORY,
    ALIBABA_FACTORY,
]


@pytest.fixture(params=PROVIDER_FACTORIES, ids=lambda f: str(getattr(f, "name", f)))
def provider_factory(request: pytest.FixtureRequest) -> ProviderFactory:
    factory: ProviderFactory = request.param
    return factory


class TestProviderContract(ProviderContract):
    """Every contract test, once per backend."""
