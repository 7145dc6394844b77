"""Providers by name: each name maps to a factory, named by its dotted path and imported only when chosen.

Choosing ``linode`` imports only the Linode provider (and needs only its extra); the simulated cloud (``sim``, which
lives in :mod:`gpuscale.sim`, a layer above this one) is reached the same way, so no caller of the registry (the GPR
server, for one) imports the simulator. A factory takes :class:`ProviderSettings` and returns a
:class:`~gpuscale.providers.base.Provider`; :func:`provider_factory` defers the call to the provider's first use, so a
missing credential or extra is reported where the provider is used (on the GPRs, for the GPR manager), not at start.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuscale.clock import Clock
from gpuscale.core.model import Catalog
from gpuscale.errors import AuthenticationError, InputError
from gpuscale.providers.base import Provider


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """What a provider factory may read."""

    env: Mapping[str, str]
    clock: Clock
    catalog: Catalog
    sim_latency_s: float = 5.0
    """Launch, registration and deletion latency of the simulated cloud."""


@dataclass(frozen=True, slots=True)
class Registration:
    """A provider's factory as ``"module:function"`` (``function(settings) -> Provider``) and the extra it needs."""

    target: str
    extra: str | None = None
    description: str = ""


_REGISTRY: dict[str, Registration] = {
    "sim": Registration(
        "gpuscale.sim.wallclock:wall_clock_sim_provider", None, "the simulated cloud, on wall-clock time"
    ),
    "linode": Registration("gpuscale.providers.registry:linode_provider", "linode", "Linode (LKE node pools)"),
    "aws": Registration("gpuscale.providers.registry:aws_provider", "aws", "AWS (EC2 fleets or managed node groups)"),
    "gcp": Registration("gpuscale.providers.cloud_factories:gcp_provider", "gcp", "Google Cloud (GKE node pools)"),
    "alibaba": Registration(
        "gpuscale.providers.cloud_factories:alibaba_provider", "alibaba", "Alibaba Cloud (ACK node pools)"
    ),
}


def register(name: str, target: str, *, extra: str | None = None, description: str = "") -> None:
    """Add (or replace) provider ``name`` with its factory ``"module:function"``."""
    if ":" not in target:
        raise ValueError(f"provider factory {target!r} must be 'module:function'")
    _REGISTRY[name] = Registration(target, extra, description)


def provider_names() -> tuple[str, ...]:
    """The registered provider names, in registration order."""
    return tuple(_REGISTRY)


def registration(name: str) -> Registration:
    """The registration of ``name``; :class:`InputError` naming the known ones otherwise."""
    reg = _REGISTRY.get(name)
    if reg is None:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InputError(
            f"unknown provider{hint}", where="--provider", value=name, fix=f"use one of {', '.join(_REGISTRY)}"
        )
    return reg


def _missing(name: str, reg: Registration, exc: ImportError) -> InputError:
    fix = f"pip install 'gpuscale[{reg.extra}]'" if reg.extra else "reinstall gpuscale"
    return InputError(f"needs a package that is not installed ({exc.name})", where=f"--provider {name}", fix=fix)


def resolve(name: str) -> Callable[[ProviderSettings], Provider]:
    """Import and return the factory of provider ``name``. A missing extra, whether the factory's module or a
    module the factory imports when called, is an :class:`InputError` naming it."""
    reg = registration(name)
    module, _, attr = reg.target.partition(":")
    try:
        factory: Callable[[ProviderSettings], Provider] = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise _missing(name, reg, exc) from None

    def make(settings: ProviderSettings) -> Provider:
        try:
            return factory(settings)
        except ImportError as exc:
            raise _missing(name, reg, exc) from None

    return make


def provider_factory(name: str, settings: ProviderSettings) -> Callable[[], Provider]:
    """A callable making provider ``name`` on first use (the name is checked now)."""
    registration(name)
    return lambda: resolve(name)(settings)


def make_provider(name: str, settings: ProviderSettings) -> Provider:
    """Provider ``name``, made now."""
    return resolve(name)(settings)


# ------------------------------------------------------------------------------------------ cloud factories
def linode_provider(settings: ProviderSettings) -> Provider:
    """The Linode provider from ``LINODE_TOKEN``, ``LINODE_CLUSTER_ID`` and ``LINODE_REGION``; raises
    :class:`AuthenticationError` when the token is unset (checked before any other setting)."""
    from gpuscale.providers.linode import MISSING_TOKEN_MESSAGE, TOKEN_ENV, LinodeConfig, LinodeProvider

    if not settings.env.get(TOKEN_ENV):
        raise AuthenticationError(MISSING_TOKEN_MESSAGE, provider="linode")
    return LinodeProvider(LinodeConfig.from_env(settings.env), env=settings.env, clock=settings.clock)


def aws_provider(settings: ProviderSettings) -> Provider:
    """The AWS provider from ``GPUSCALE_AWS_*`` and boto3's credential chain (needs the ``aws`` extra)."""
    try:
        from gpuscale.providers.aws_factory import aws_provider_from_env
    except ImportError:
        raise InputError("needs boto3", where="--provider aws", fix="pip install 'gpuscale[aws]'") from None
    return aws_provider_from_env(settings.env, settings.clock)


def linode_factory(env: Mapping[str, str], clock: Clock) -> Callable[[], Provider]:
    """A factory for the Linode provider (no catalog needed): :func:`linode_provider` on first use."""
    return lambda: linode_provider(ProviderSettings(env, clock, Catalog("none", ())))
