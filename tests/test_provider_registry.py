"""Providers by name: the registry resolves factories lazily, reports unknown names and missing extras as input
errors, and the GPR server reaches the simulated cloud through it without importing the simulator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.errors import AuthenticationError, InputError
from gpuscale.providers import registry
from gpuscale.providers.base import LaunchRequest, Provider

CATALOG = load_catalog("linode")


def settings(**env: str) -> registry.ProviderSettings:
    return registry.ProviderSettings(env, ManualClock(1_000.0), CATALOG, sim_latency_s=5.0)


def test_names_include_the_simulated_and_cloud_providers() -> None:
    assert {"sim", "linode", "aws"} <= set(registry.provider_names())


def test_unknown_provider_is_an_input_error_with_a_suggestion() -> None:
    with pytest.raises(InputError, match=r"did you mean linode\?.*use one of sim, linode") as info:
        registry.provider_factory("linod", settings())
    assert "--provider" in str(info.value)


def test_sim_provider_runs_on_the_given_clock() -> None:
    s = settings()
    sim = registry.make_provider("sim", s)
    it = next(it for it in CATALOG.instance_types if it.gpu_count)
    off = it.offerings[0]
    nodes = sim.launch(LaunchRequest("r1", "gpu", it.name, off.zone, off.capacity_type, 1, {}, ()))
    assert len(nodes) == 1 and sim.list_nodes()
    assert sim.capabilities is not None


def test_factories_are_called_on_first_use_only() -> None:
    make = registry.provider_factory("linode", settings())  # no token: nothing raised yet
    with pytest.raises(AuthenticationError, match="LINODE_TOKEN"):
        make()


def test_a_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTRY, "nimbus", registry.Registration("gpuscale_no_such_module:make", "nimbus"))
    make = registry.provider_factory("nimbus", settings())
    with pytest.raises(InputError, match=r"gpuscale\[nimbus\]"):
        make()


def needs_a_missing_sdk(settings: registry.ProviderSettings) -> Provider:
    import gpuscale_missing_sdk  # noqa: F401

    raise AssertionError("unreachable")


def test_a_factory_importing_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    target = f"{__name__}:needs_a_missing_sdk"
    monkeypatch.setitem(registry._REGISTRY, "nimbus", registry.Registration(target, "nimbus"))
    with pytest.raises(InputError, match=r"gpuscale_missing_sdk.*gpuscale\[nimbus\]"):
        registry.provider_factory("nimbus", settings())()


def test_register_checks_the_target() -> None:
    with pytest.raises(ValueError, match="module:function"):
        registry.register("bad", "no_colon_here")


def test_the_gpr_server_does_not_import_the_simulator(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import gpuscale.gpr.server, gpuscale.gpr.api, gpuscale.gpr.cli\n"
        "from gpuscale.gpr.server import build_manager\n"
        f"m = build_manager({str(tmp_path / 'g.db')!r}, provider='linode', env={{}})\n"
        "print(sorted(n for n in sys.modules if n.startswith('gpuscale.sim')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_build_manager_makes_the_simulated_cloud_through_the_registry(tmp_path: Path) -> None:
    from gpuscale.gpr.server import PROVIDERS, build_manager
    from gpuscale.sim.wallclock import WallClockSimCloud

    assert registry.provider_names() == PROVIDERS
    manager = build_manager(tmp_path / "s.db", provider="sim", env={}, clock=ManualClock(0.0))
    try:
        assert isinstance(manager._get_provider(), WallClockSimCloud)
    finally:
        manager.store.close()
