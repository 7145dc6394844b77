"""Building the GKE and ACK providers from the environment (the ``--provider gcp|alibaba`` factories)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.model import Catalog
from gpuscale.errors import AuthenticationError, InputError
from gpuscale.providers.alibaba import AlibabaProvider
from gpuscale.providers.cloud_factories import alibaba_provider, gcp_provider, parse_vswitches
from gpuscale.providers.gcp import GcpProvider


@dataclass
class Settings:
    env: dict[str, str]
    clock: ManualClock
    catalog: Catalog


GKE_ENV = {"GKE_PROJECT": "proj-1", "GKE_LOCATION": "us-central1", "GKE_CLUSTER": "gpu-c"}
ACK_ENV = {
    "ACK_CLUSTER_ID": "c-1",
    "ACK_REGION": "us-east-1",
    "ACK_VSWITCHES": "us-east-1a=vsw-a;us-east-1b=vsw-b1,vsw-b2",
    "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAI-x",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "top-secret-value",
}


def test_gcp_from_env_takes_the_regions_zones_from_the_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "adc.json"
    creds.write_text(
        json.dumps({"type": "authorized_user", "client_id": "id", "client_secret": "s", "refresh_token": "r"})
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    p = gcp_provider(Settings(GKE_ENV, ManualClock(0.0), load_catalog("gcp")))
    assert isinstance(p, GcpProvider)
    assert p.capabilities.zones == ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
    zonal = gcp_provider(Settings({**GKE_ENV, "GKE_LOCATION": "us-central1-b"}, ManualClock(0.0), load_catalog("gcp")))
    assert zonal.capabilities.zones == ("us-central1-b",)


def test_gcp_without_credentials_or_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(AuthenticationError, match="Application Default Credentials"):
        gcp_provider(Settings(GKE_ENV, ManualClock(0.0), load_catalog("gcp")))
    with pytest.raises(InputError, match="gcp config"):
        gcp_provider(Settings({**GKE_ENV, "GKE_PROJECT": ""}, ManualClock(0.0), load_catalog("gcp")))


def test_alibaba_from_env_with_spot_limits_from_the_catalog() -> None:
    cat = load_catalog("alibaba:us-east-1")
    p = alibaba_provider(Settings(ACK_ENV, ManualClock(0.0), cat))
    assert isinstance(p, AlibabaProvider)
    assert p.capabilities.zones == ("us-east-1a", "us-east-1b")
    t = cat.instance_types[0]
    on_demand = [o.hourly_price for o in t.offerings if o.capacity_type.value == "on-demand"]
    assert p.config.spot_price_limits[t.name] == min(on_demand)
    assert "top-secret-value" not in repr(p)


def test_alibaba_missing_keys_and_bad_vswitches() -> None:
    cat = load_catalog("alibaba")
    env = {k: v for k, v in ACK_ENV.items() if k != "ALIBABA_CLOUD_ACCESS_KEY_SECRET"}
    with pytest.raises(AuthenticationError, match="ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        alibaba_provider(Settings(env, ManualClock(0.0), cat))
    with pytest.raises(InputError, match="ACK_VSWITCHES"):
        alibaba_provider(Settings({**ACK_ENV, "ACK_VSWITCHES": "us-east-1a"}, ManualClock(0.0), cat))
    assert parse_vswitches(" a=v1 ; b=v2,v3 ;") == {"a": ("v1",), "b": ("v2", "v3")}


def test_serve_builds_a_gcp_or_alibaba_manager_on_the_clusters_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from gpuscale.cli import main
    from gpuscale.gpr.server import build_manager

    creds = tmp_path / "adc.json"
    creds.write_text(
        json.dumps({"type": "authorized_user", "client_id": "id", "client_secret": "s", "refresh_token": "r"})
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    gke = build_manager(
        tmp_path / "g.db", provider="gcp", catalog="gcp", env={**GKE_ENV, "GKE_LOCATION": "europe-west4-b"}
    )
    assert gke.config.cluster == "gpu-c" and gke.catalog.name == "gcp:europe-west4"
    ack = build_manager(tmp_path / "a.db", provider="alibaba", catalog="alibaba", env=ACK_ENV)
    assert ack.config.cluster == "c-1" and ack.catalog.name == "alibaba:us-east-1"
    res = CliRunner().invoke(main, ["serve", "--help"])
    assert res.exit_code == 0 and "gcp" in res.output and "alibaba" in res.output
