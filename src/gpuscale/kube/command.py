"""``gpuscale controller``: the reconcile loop against a live cluster.

Start-up checks (each failure is one line and exit 2): the kubeconfig or service account, the API server answering,
the credentials accepted, and every (verb, resource) the adapter uses granted (a SelfSubjectAccessReview each), then
the first list of every watched resource. After that a lost API server never crashes the process: the cache retries
with back-off and reconciles pause until every watch is back (a decision on a stale view could launch twice).
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import click
from lightkube.types import PatchType

from gpuscale.catalogs import load_catalog
from gpuscale.clock import Clock, SystemClock
from gpuscale.controller.availability import Availability
from gpuscale.controller.loop import Controller, ControllerConfig
from gpuscale.controller.options import OptionsController, options_controller
from gpuscale.core.gpr import GprState
from gpuscale.core.model import Catalog, NodePool
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.errors import GpuscaleError, InputError
from gpuscale.gpr.manager import GprManager, config_from_env
from gpuscale.kube import API_VERBS
from gpuscale.kube.availability_store import KubeAvailabilityStore
from gpuscale.kube.backend import KubeBackend
from gpuscale.kube.cache import GPUNodePool, KubeCache
from gpuscale.kube.client import KubeClient, KubeError, load_config
from gpuscale.kube.endpoints import ProcessEndpoints
from gpuscale.kube.events import EventRecorder
from gpuscale.kube.gpr_store import KubeGprStore
from gpuscale.kube.kwok import KwokConfig, KwokProvider
from gpuscale.kube.matching import ProviderIdMatcher
from gpuscale.kube.metrics import QueuedGpr
from gpuscale.kube.nodeclaims import NodeClaimWriter
from gpuscale.kube.policy import BATCH_IDLE_S, POLICY_FILE_ENV, live_config, load_policy
from gpuscale.kube.scalers import ScalerReconciler
from gpuscale.manifests.status import Condition, pool_status
from gpuscale.providers.base import Provider

if TYPE_CHECKING:
    from gpuscale.metrics.prometheus import MetricSource

__all__ = ["ControllerProcess", "check_access", "controller_command"]

log = logging.getLogger(__name__)

KWOK_ONLY = frozenset({("create", "nodes"), ("patch", "nodes/status")})
"""Pairs only the kwok provider needs."""


def check_access(client: KubeClient, pairs: Any) -> None:
    """Ask the API server (SelfSubjectAccessReview) whether each (verb, resource) is granted; raise
    :class:`KubeError` 403 naming the first refused one. A server that cannot be reached or refuses the credentials
    raises too."""
    from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

    for verb, resource in pairs:
        name, _, sub = resource.partition("/")
        plural, _, group = name.partition(".")
        review = SelfSubjectAccessReview.from_dict(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "verb": verb,
                        "resource": plural,
                        "group": group,
                        **({"subresource": sub} if sub else {}),
                    }
                },
            }
        )
        got = client.run(client.api.create(review), verb="create", resource="selfsubjectaccessreviews")
        if not (got.status and got.status.allowed):
            raise KubeError("not granted by RBAC", status=403, reason="Forbidden", verb=verb, resource=resource)


def _no_sim() -> InputError:
    return InputError(
        "the simulated cloud cannot add nodes to a live cluster",
        where="--provider sim",
        fix="use --provider kwok for fake nodes in the cluster (or gpuscale simulate without a cluster)",
    )


def _warm_up() -> None:
    """Import the planner now, so the first pending pod does not wait for it to load. SciPy (about 40 MB) is not
    imported: the planner loads it the first time an integer program must be solved (a round whose greedy plan is
    provably optimal, such as pods of one kind, never loads it)."""
    import importlib

    importlib.import_module("gpuscale.core.planner")


def _setup_error(exc: KubeError) -> InputError:
    fix = ""
    if exc.status == 404 and exc.resource.endswith(".gpuscale.io"):
        fix = "install gpuscale's CRDs: kubectl apply -k deploy/crds"
    return InputError(exc.describe(), where="API server", fix=fix)


@dataclass
class ControllerProcess:
    """The wiring of one controller process; :meth:`run` loops until :attr:`stop` is set."""

    client: KubeClient
    catalog: Catalog
    provider_name: str
    clock: Clock = field(default_factory=SystemClock)
    config: ControllerConfig = field(default_factory=ControllerConfig)
    """The settings, optional policies included (:mod:`gpuscale.kube.policy`); the pools' ``spec.headroom`` is
    merged into ``headroom`` (a pool's own setting wins)."""
    kwok: KwokConfig = field(default_factory=KwokConfig)
    pools: list[NodePool] | None = None
    """Pools to use; None reads the cluster's GPUNodePool objects (re-read when they change)."""
    interval_s: float = 1.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    provider_factory: Callable[[], Provider] | None = None
    endpoints: ProcessEndpoints | None = None
    """Leader election, probes and metrics (part of the deployment); None runs without them."""
    stop: threading.Event = field(default_factory=threading.Event)
    scalers_enabled: bool = True
    """Reconcile GPUWorkloadScalers and GPUBudgets too (:mod:`gpuscale.kube.scalers`)."""
    metric_sources: Callable[[str], MetricSource] | None = None
    """A trigger's serverAddress -> its metric source (default: a Prometheus client per address)."""
    scalers: ScalerReconciler | None = field(default=None, init=False)
    gprs_enabled: bool = True
    """Serve GPUProvisioningRequest objects with the GPR manager (:mod:`gpuscale.kube.gpr_store`)."""
    gpr_store: KubeGprStore | None = field(default=None, init=False)
    gpr_manager: GprManager | None = field(default=None, init=False)
    persist_availability: bool = True
    """Keep offering marks and back-offs on the OfferingAvailability ``gpuscale-controller``
    (:mod:`gpuscale.kube.availability_store`); False keeps them in memory only."""
    availability_store: KubeAvailabilityStore | None = field(default=None, init=False)
    _gprs_served: bool = field(default=False, init=False)
    record_claims: bool = True
    """Keep a GPUNodeClaim per claim and restore the claims from them before the first round
    (:mod:`gpuscale.kube.nodeclaims`); False rebuilds claims from the provider's nodes alone."""
    nodeclaims: NodeClaimWriter | None = field(default=None, init=False)
    rounds: int = 0
    cache: KubeCache = field(init=False)
    backend: KubeBackend = field(init=False)
    provider: Provider = field(init=False)
    controller: Controller = field(init=False)
    _pools_version: int = field(default=-1, init=False)
    _lapsed: bool = field(default=False, init=False)
    """This replica acted, then lost the Lease: its in-memory state is rebuilt when it leads again."""

    def start(self, *, sync_timeout_s: float = 30.0, check: bool = True) -> ControllerProcess:
        """Check access, fill the cache, build the controller. Raises :class:`InputError` on any start-up failure."""
        try:
            if check:
                pairs = [p for p in API_VERBS if self.provider_name == "kwok" or p not in KWOK_ONLY]
                check_access(self.client, pairs)
            self.cache = KubeCache(self.client).start()
            self.cache.wait_synced(sync_timeout_s)
            if self.scalers_enabled:
                self.scalers = ScalerReconciler(self.client, self.cache, self.clock, self.metric_sources)
                try:
                    self.scalers.start(sync_timeout_s)
                except KubeError as exc:
                    raise InputError(
                        " ".join(exc.describe().split()), where="GPUWorkloadScalers and GPUBudgets",
                        fix="install their CRDs (kubectl apply -k deploy/crds) or pass --no-scalers",
                    ) from exc  # fmt: skip
        except KubeError as exc:
            raise _setup_error(exc) from exc
        self.backend = KubeBackend(
            self.client, self.cache, self.catalog, events=EventRecorder(self.client, None, self.clock)
        )
        self.backend.events.cache = self.cache
        self.provider = self._provider()
        _warm_up()
        self.backend.list_pods()  # convert every cached pod once now, not in the first round
        self._build()
        return self

    def _build(self) -> None:
        """The controller and what keeps its state in the cluster (offering marks, GPUNodeClaims, GPRs), fresh: at
        start, and again when this replica wins the Lease back (another replica may have acted meanwhile)."""
        availability = None
        if self.persist_availability:
            self.availability_store = KubeAvailabilityStore(
                self.client, self.catalog, self.clock, events=self.backend.events
            )
            try:
                availability = Availability(self.availability_store)
            except KubeError as exc:
                raise _setup_error(exc) from exc
        pools = self._current_pools()
        self.controller = options_controller(
            backend=self.backend, provider=self.provider, pools=pools, catalog=self.catalog, clock=self.clock,
            config=self._config(), availability=availability,
        )  # fmt: skip
        unused = sorted(set(self.config.headroom) - {p.name for p in pools})
        if unused:
            log.warning("policy headroom of pools that do not exist (used once they do): %s", ", ".join(unused))
        if self.record_claims:
            attempts = self.controller.launcher.attempts
            self.nodeclaims = NodeClaimWriter(
                self.client, self.clock, events=self.backend.events, attempts=lambda key: attempts.get(key, 0),
                cache=self.cache,
            )  # fmt: skip
        if self.gprs_enabled:
            self.gpr_store = KubeGprStore(self.client, self.cache, self.catalog, self.clock, events=self.backend.events)
            self.gpr_manager = GprManager(
                self.gpr_store,
                self.catalog,
                config=config_from_env(self.env, provider=self.provider_name),
                provider=self.provider,
                clock=self.clock,
                engine=self.controller,
            )
        self._gprs_served = False

    def _provider(self) -> Provider:
        if self.provider_factory is not None:
            return self.provider_factory()
        if self.provider_name == "kwok":
            return KwokProvider(self.client, self.catalog, self.clock, self.kwok, cache=self.cache)
        if self.provider_name == "sim":
            raise _no_sim()
        from gpuscale.errors import AuthenticationError
        from gpuscale.providers.registry import ProviderSettings, make_provider

        try:
            cloud = make_provider(self.provider_name, ProviderSettings(self.env, self.clock, self.catalog))
        except AuthenticationError as exc:
            raise InputError(str(exc), where=f"--provider {self.provider_name}", fix="set the credentials") from exc
        return ProviderIdMatcher(cloud, self.cache)

    def _config(self) -> ControllerConfig:
        """:attr:`config` with the pools' ``spec.headroom`` merged into its ``headroom``."""
        if self.pools is not None or not self.backend.pool_headroom:
            return self.config
        return replace(self.config, headroom={**self.config.headroom, **self.backend.pool_headroom})

    def _refresh_options(self) -> None:
        """After the pools were read again: apply a changed ``spec.headroom``. An options controller takes the new
        settings in place (its arrival history is kept); the plain controller is rebuilt as an options controller
        (claims restored from the GPUNodeClaims, as after a restart)."""
        config = self._config()
        if config.headroom == self.controller.config.headroom:
            return
        if isinstance(self.controller, OptionsController):
            self.controller.config = replace(self.controller.config, headroom=config.headroom)
            log.info("pool headroom now %s", ", ".join(sorted(config.headroom)) or "off")
            return
        log.info("pool headroom set (%s): controller rebuilt with the options", ", ".join(sorted(config.headroom)))
        self._build()

    def _current_pools(self) -> list[NodePool]:
        if self.pools is not None:
            return self.pools
        self._pools_version = self.cache.version
        return self.backend.node_pools()

    def step(self) -> bool:
        """One reconcile if the cache is healthy and this replica may act; returns whether it ran."""
        if not self.cache.healthy:
            return False
        if self.endpoints is not None and not self.endpoints.may_act():
            self._lapsed = self._lapsed or self.rounds > 0
            self.endpoints.after_round(self.controller.claims.values(), self.backend.list_pods(), None, None)
            return False
        if self._lapsed:  # the Lease won back: start over from the cluster, as a restarted replica does
            try:
                self._build()
            except InputError as exc:  # the offering marks could not be read: tried again next round
                log.warning("leading again, state not rebuilt yet: %s", exc)
                return False
            log.info("leading again: in-memory state rebuilt, claims restored from the GPUNodeClaims")
            self._lapsed = False
        if self.pools is None and self._pools_version != self.cache.version:
            pools = self.backend.node_pools()
            if {p.name: p for p in pools} != self.controller.pools:
                self.controller.pools = {p.name: p for p in pools}
            self._pools_version = self.cache.version
            try:
                self._refresh_options()
            except InputError as exc:  # the offering marks could not be read while rebuilding: next round
                log.warning("pool headroom not applied yet: %s", exc)
                return False
        started = time.perf_counter()
        if self.scalers is not None and self.scalers.healthy:
            self.scalers.reconcile()
            if self.endpoints is not None:
                self.endpoints.metrics.observe_scalers(self.scalers.replicas, self.scalers.granted_gpus)
        if self.availability_store is not None:  # offerings users blocked by hand since the last round
            edited = self.availability_store.edited(self.cache.objects("offeringavailabilities"))
            for key, until in edited.items():
                self.controller.availability.mark_unavailable(key, until, "OfferingAvailability")
        if self.nodeclaims is not None and not self.nodeclaims.restored:  # before the first round that acts
            nodes = {n.name: n for n in self.backend.list_nodes()}
            if self.nodeclaims.restore(self.controller, self.cache.objects("gpunodeclaims"), nodes) is None:
                return False
        result = self.controller.reconcile()
        if self.nodeclaims is not None:
            self.nodeclaims.flush()  # started on the client's loop, not waited for
        self._serve_gprs()
        self._write_pool_status()
        if self.availability_store is not None:
            self.availability_store.flush()  # one or two API calls when a mark changed, none otherwise
        self.rounds += 1
        if self.endpoints is not None:
            seconds = time.perf_counter() - started
            self.endpoints.after_round(
                self.controller.claims.values(), self.backend.list_pods(), result, seconds, gprs=self._gpr_queue()
            )
        return True

    def _gpr_queue(self) -> list[QueuedGpr]:
        """The GPRs the metrics follow: every one not yet final, queued or not, with the time it entered its state."""
        if self.gpr_manager is None:
            return []
        try:
            gprs = self.gpr_manager.list_gprs((GprState.QUEUED, GprState.PROVISIONING, GprState.PROVISIONED))
        except GpuscaleError as exc:  # a store that cannot be read this round: no GPR figures, not a crash
            log.warning("GPR metrics skipped: %s", exc)
            return []
        return [QueuedGpr(g.gpr_id, g.state is GprState.QUEUED, g.status.state_since) for g in gprs]

    def _serve_gprs(self) -> None:
        """Admit new GPR objects and run one GPR manager pass (a failure is logged; the next round retries)."""
        if self.gpr_store is None or self.gpr_manager is None:
            return
        if self._gprs_served and self._no_gpr_work():
            return
        self._gprs_served = True
        try:
            self.gpr_store.sync()
            report = self.gpr_manager.reconcile()
        except (KubeError, GpuscaleError) as exc:
            text = exc.describe() if isinstance(exc, KubeError) else str(exc)
            log.warning("GPR round skipped: %s", text)
            return
        for err in report.errors:
            log.warning("GPR manager: %s", err)

    def _no_gpr_work(self) -> bool:
        """No GPR object in the cluster and no GPR node among the claims: a GPR manager pass would plan nothing, yet
        list the provider's nodes (which waits for the launches just made), so it is skipped. A node launched for a
        GPR is a claim of the controller's engine (adopted after a restart too) until it is gone, so its GPR's
        deletion is still served; the first round always runs the pass."""
        return not self.cache.objects("gpuprovisioningrequests") and not self.controller.gpr.keys(
            self.controller.claims
        )

    def _write_pool_status(self) -> None:
        """Each GPUNodePool's status: its live nodes, their GPUs and $/h, and a Ready condition (only on change)."""
        if self.pools is not None:
            return
        live = {ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED, ClaimPhase.INITIALIZED}
        live.add(ClaimPhase.DRAINING)
        types = self.catalog.by_name()
        totals: dict[str, tuple[int, int, float]] = {}
        for claim in self.controller.claims.values():
            if claim.phase not in live:
                continue
            n, g, cost = totals.get(claim.pool, (0, 0, 0.0))
            it = types.get(claim.instance_type)
            totals[claim.pool] = (n + 1, g + (it.gpu_count if it else 0), cost + claim.hourly_price)
        for obj in self.cache.objects("gpunodepools"):
            name = str((obj.get("metadata") or {}).get("name", ""))
            n, g, cost = totals.get(name, (0, 0, 0.0))
            old = obj.get("status") or {}
            valid = name in self.controller.pools
            reasons = [c.get("reason") for c in old.get("conditions") or () if isinstance(c, dict)]
            if (old.get("nodes"), old.get("gpus"), old.get("hourlyCost")) == (n, g, round(cost, 2)) and reasons == [
                "Reconciled" if valid else "InvalidPool"
            ]:
                continue
            cond = Condition(
                "Ready",
                "True" if valid else "False",
                "Reconciled" if valid else "InvalidPool",
                f"{n} node(s), {g} GPU(s)" if valid else "the pool could not be read (see the controller's log)",
                datetime.datetime.fromtimestamp(self.clock.now(), tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            body = {"status": pool_status(n, g, cost, [cond])}
            try:
                self.client.run(
                    self.client.api.patch(GPUNodePool.Status, name, body, patch_type=PatchType.MERGE),
                    verb="patch",
                    resource="gpunodepools.gpuscale.io/status",
                )
            except KubeError as exc:
                log.info("pool %s status not written: %s", name, exc.describe())

    def run(self, max_rounds: int | None = None) -> None:
        """Reconcile until stopped: at the controller's next wake-up, on a cluster change, or every interval. With
        ``max_rounds``, stop after that many rounds or once no timed work is due within the interval."""
        changed = threading.Event()
        self.cache.on_change(changed.set)
        while not self.stop.is_set():
            ran = self.step()
            wait = self.interval_s
            wake = self.controller.next_wakeup() if ran else None
            due = self.scalers.next_due() if ran and self.scalers is not None else None
            if due is not None:
                wake = due if wake is None else min(wake, due)
            if wake is not None:
                wait = max(0.0, min(wait, wake - self.clock.now()))
            if max_rounds is not None and (
                self.rounds >= max_rounds or (ran and (wake is None or wait >= self.interval_s))
            ):
                return
            elif not self.cache.healthy:
                errors = "; ".join(e.describe() for e in self.cache.errors().values())
                log.warning("waiting for the API server: %s", errors or "first list")
            changed.wait(wait)
            changed.clear()

    def close(self) -> None:
        self.stop.set()
        if self.endpoints is not None:
            self.endpoints.close()
        if self.scalers is not None:
            self.scalers.close()
        if hasattr(self, "cache"):
            self.cache.stop()
        if hasattr(self, "backend"):  # not when the start failed before it
            self.backend.events.flush(2)
        if self.availability_store is not None:
            self.availability_store.flush()  # best effort: a failed write was logged
        if self.nodeclaims is not None:
            self.nodeclaims.flush()
            self.nodeclaims.settle(2)
        self.client.close()


@click.command("controller")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    help="Kubeconfig file (default: KUBECONFIG, ~/.kube/config; in a pod: the service account).",
)
@click.option("--context", help="Kubeconfig context (default: its current context).")
@click.option(
    "--provider",
    required=True,
    help="Where nodes come from: kwok (Node objects in this cluster), linode, aws, gcp, alibaba.",
)
@click.option("--catalog", default="linode", show_default=True, help="Catalog name or file.")
@click.option("--region", default=None, help="Catalog region.")
@click.option("--namespace", default="gpuscale", show_default=True, help="The controller's own namespace (Lease).")
@click.option(
    "--pools", "pools_file", type=click.Path(dir_okay=False), help="GPUNodePool YAML instead of the cluster's objects."
)
@click.option("--interval", default=1.0, show_default=True, help="Reconcile at least every this many seconds.")
@click.option(
    "--batch-idle",
    type=float,
    default=None,
    help=f"Plan a scale-up this many seconds after the last new pending pod (the batch window; default: the policy"
    f" file's batchIdle, else {BATCH_IDLE_S}). Wins over the policy file.",
)
@click.option(
    "--policy-file",
    type=click.Path(dir_okay=False),
    envvar=POLICY_FILE_ENV,
    show_envvar=True,
    help="YAML of the optional policies (the simulator's policy mapping: evictionCost, headroom, emptyWait,"
    " evictMaxPodAge, repack, spotToSpot, packOntoEmpty, ...); checked at start.",
)
@click.option("--device-plugin-delay", default=0.0, show_default=True, help="kwok: seconds before a node's GPUs show.")
@click.option("--metrics-port", default=8080, show_default=True, help="Port of /metrics.")
@click.option("--health-port", default=8081, show_default=True, help="Port of /healthz and /readyz.")
@click.option(
    "--leader-elect/--no-leader-elect", default=False, show_default=True, help="Act only while holding the Lease."
)
@click.option("--bind-address", default="0.0.0.0", show_default=True, help="Address of the metrics and probe ports.")
@click.option("--once", is_flag=True, help="Check access, sync, reconcile until nothing is due soon, and exit.")
@click.option(
    "--scalers/--no-scalers",
    default=True,
    show_default=True,
    help="Reconcile GPUWorkloadScalers and GPUBudgets (their CRDs must be installed).",
)
def controller_command(
    kubeconfig: str | None,
    context: str | None,
    provider: str,
    catalog: str,
    region: str | None,
    namespace: str,
    pools_file: str | None,
    interval: float,
    batch_idle: float | None,
    policy_file: str | None,
    device_plugin_delay: float,
    metrics_port: int,
    health_port: int,
    leader_elect: bool,
    bind_address: str,
    once: bool,
    scalers: bool,
) -> None:
    """Run gpuscale as a controller in (or against) a Kubernetes cluster."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if provider == "sim":
        raise _no_sim()
    if provider != "kwok":
        from gpuscale.providers.registry import registration

        registration(provider)  # an unknown name is one line before anything connects
    policy = load_policy(policy_file) if policy_file else {}
    config = live_config(policy, batch_idle)
    cat = load_catalog(catalog, region=region)
    pools = None
    if pools_file is not None:
        from gpuscale.manifests import load_snapshot

        pools = list(load_snapshot(pools_file, catalog=cat, now=SystemClock().now()).pools)
    client = KubeClient(load_config(kubeconfig, context))
    proc = ControllerProcess(
        client,
        cat,
        provider,
        pools=pools,
        interval_s=interval,
        config=config,
        kwok=KwokConfig(device_plugin_delay_s=device_plugin_delay),
        scalers_enabled=scalers,
    )
    try:
        proc.start()
        proc.endpoints = ProcessEndpoints(
            client,
            proc.cache,
            proc.clock,
            namespace=namespace,
            leader_elect=leader_elect,
            metrics_port=metrics_port,
            health_port=health_port,
            host=bind_address,
        ).start()
        settings = ", ".join(sorted(k for k in policy if k != "batchIdle")) or "none"
        click.echo(
            f"gpuscale controller: {len(proc.controller.pools)} pool(s), provider {provider}, batch window"
            f" {config.batch_idle_s:g} s, policy settings: {settings}",
            err=True,
        )
        proc.run(max_rounds=20 if once else None)
    except KeyboardInterrupt:
        pass
    finally:
        proc.close()
