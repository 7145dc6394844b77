"""Reusable contract tests for any :class:`gpuscale.providers.base.Provider`.

A test module opts in by subclassing :class:`ProviderContract` and defining a fixture ``provider_factory`` that
returns a callable building a fresh :class:`ContractBackend` (see ``tests/test_provider_contract.py``). The tests
use the Provider protocol only; the backend adds the few knobs a contract needs from outside the protocol (make an
offering run out of capacity, exhaust a quota).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from gpuscale.core.model import Taint, TaintEffect
from gpuscale.errors import CapacityError, GpuscaleError, QuotaExceeded
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, Provider, ProviderEvent


class ContractBackend(Protocol):
    """A provider under test plus the knobs the contract needs."""

    @property
    def provider(self) -> Provider:
        """The provider under test."""

    @property
    def instance_type(self) -> str:
        """An instance type that can be launched."""

    @property
    def zone(self) -> str:
        """A zone the provider serves."""

    def exhaust_capacity(self, instance_type: str) -> None:
        """From now on, ``instance_type`` has no capacity."""

    def exhaust_quota(self) -> None:
        """From now on, no further pool or node can be created (an account / pool-count quota is reached)."""

    def close(self) -> None:
        """Release the backend."""


ProviderFactory = Callable[[], ContractBackend]


def _ids(nodes: list[CloudNode] | tuple[CloudNode, ...]) -> set[str]:
    return {n.node_id for n in nodes}


class ProviderContract:
    """The behaviour every provider must have. Subclass it in a test module that defines ``provider_factory``."""

    @pytest.fixture
    def backend(self, provider_factory: ProviderFactory) -> Iterator[ContractBackend]:
        backend = provider_factory()
        try:
            yield backend
        finally:
            backend.close()

    @staticmethod
    def request(backend: ContractBackend, request_id: str, count: int = 2, pool: str = "gpu") -> LaunchRequest:
        return LaunchRequest(
            request_id=request_id,
            pool=pool,
            instance_type=backend.instance_type,
            zone=backend.zone,
            count=count,
            labels={"gpuscale.io/gpr": request_id},
            taints=(Taint("gpuscale.io/gpr", TaintEffect.NO_SCHEDULE, request_id),),
        )

    def test_launch_returns_count_nodes(self, backend: ContractBackend) -> None:
        nodes = list(backend.provider.launch(self.request(backend, "req-a", count=3)))
        assert len(nodes) == 3
        assert len(_ids(nodes)) == 3
        assert all(n.state is not CloudNodeState.GONE for n in nodes)

    def test_relaunch_with_same_request_id_returns_the_same_nodes(self, backend: ContractBackend) -> None:
        first = list(backend.provider.launch(self.request(backend, "req-a", count=2)))
        again = list(backend.provider.launch(self.request(backend, "req-a", count=2)))
        assert _ids(again) == _ids(first)
        assert len(backend.provider.list_nodes()) == 2

    def test_list_nodes_sees_launched_nodes_with_request_pool_and_type(self, backend: ContractBackend) -> None:
        launched = list(backend.provider.launch(self.request(backend, "req-a", count=2, pool="gpu-a")))
        listed = [n for n in backend.provider.list_nodes() if n.request_id == "req-a"]
        assert _ids(listed) == _ids(launched)
        for node in listed:
            assert node.pool == "gpu-a"
            assert node.instance_type == backend.instance_type
            assert node.zone == backend.zone

    def test_distinct_requests_get_distinct_nodes(self, backend: ContractBackend) -> None:
        a = list(backend.provider.launch(self.request(backend, "req-a", count=1)))
        b = list(backend.provider.launch(self.request(backend, "req-b", count=2)))
        assert not _ids(a) & _ids(b)
        by_request: dict[str, set[str]] = {}
        for node in backend.provider.list_nodes():
            by_request.setdefault(node.request_id, set()).add(node.node_id)
        assert by_request == {"req-a": _ids(a), "req-b": _ids(b)}

    def test_delete_node_removes_only_that_node(self, backend: ContractBackend) -> None:
        nodes = list(backend.provider.launch(self.request(backend, "req-a", count=3)))
        other = list(backend.provider.launch(self.request(backend, "req-b", count=1)))
        victim = nodes[1].node_id
        backend.provider.delete_node(victim)
        remaining = _ids(list(backend.provider.list_nodes()))
        assert remaining == (_ids(nodes) | _ids(other)) - {victim}

    def test_delete_twice_and_delete_unknown_succeed(self, backend: ContractBackend) -> None:
        nodes = list(backend.provider.launch(self.request(backend, "req-a", count=2)))
        backend.provider.delete_node(nodes[0].node_id)
        backend.provider.delete_node(nodes[0].node_id)
        backend.provider.delete_node("no-such-node")
        assert _ids(list(backend.provider.list_nodes())) == {nodes[1].node_id}

    def test_deleting_every_node_of_a_request_leaves_nothing(self, backend: ContractBackend) -> None:
        nodes = list(backend.provider.launch(self.request(backend, "req-a", count=2)))
        for node in nodes:
            backend.provider.delete_node(node.node_id)
        assert list(backend.provider.list_nodes()) == []

    def test_insufficient_capacity_is_a_capacity_error(self, backend: ContractBackend) -> None:
        backend.exhaust_capacity(backend.instance_type)
        with pytest.raises(CapacityError) as info:
            backend.provider.launch(self.request(backend, "req-a"))
        assert isinstance(info.value, GpuscaleError)
        assert list(backend.provider.list_nodes()) == []

    def test_quota_is_quota_exceeded(self, backend: ContractBackend) -> None:
        backend.exhaust_quota()
        with pytest.raises(QuotaExceeded):
            backend.provider.launch(self.request(backend, "req-a"))
        assert list(backend.provider.list_nodes()) == []

    def test_poll_errors_returns_a_list_of_events(self, backend: ContractBackend) -> None:
        backend.provider.launch(self.request(backend, "req-a", count=1))
        events = list(backend.provider.poll_errors())
        assert all(isinstance(e, ProviderEvent) for e in events)
        assert list(backend.provider.poll_errors()) == []

    def test_capabilities_name_the_zone(self, backend: ContractBackend) -> None:
        caps = backend.provider.capabilities
        assert backend.zone in caps.zones
        assert caps.max_nodes_per_launch >= 1
