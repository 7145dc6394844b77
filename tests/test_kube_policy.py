"""The optional policies on Kubernetes: ``gpuscale controller --policy-file`` (and ``GPUSCALE_POLICY_FILE``) and a
GPUNodePool's ``spec.headroom``, over real HTTP against the emulated API server (kwok nodes, a stand-in scheduler,
a manual clock), plus the command's start-up checks in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.loop import Controller
from gpuscale.controller.options import OptionsController
from gpuscale.core.headroom import HEADROOM_KEYS
from gpuscale.errors import InputError
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.policy import BATCH_IDLE_S, live_config, load_policy
from gpuscale.manifests import crds
from kube_harness import TOLERATE_KWOK, RoundsWorld, Scheduler, client_for, kubeconfig_for, kwok_pool

pytest.importorskip("lightkube")

CATALOG = load_catalog("linode")
HEADROOM = {"maxNodes": 1, "maxHourlyCost": 5, "launch": False, "lead": "5m", "recentWindows": 1}
"""Keep at most one empty node warm, never launch one: the node a finished pod leaves stays while the last 5 minutes'
arrivals forecast demand (a window counts once observation covers it: 5 minutes after the controller started)."""
FAST = {"batchIdle": 0.001, "batchMax": 0.001, "lostGrace": "5s", "orphanGrace": "5s"}


def gpu_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "tolerations": TOLERATE_KWOK,
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}}],
        },
    }


def pool(headroom: dict[str, Any] | None = None) -> dict[str, Any]:
    out = kwok_pool(consolidate_after="60s")
    if headroom is not None:
        out["spec"]["headroom"] = headroom
    return out


class World(RoundsWorld):
    """The emulated cluster, a scheduler, a clock and a controller process built with ``config``."""

    def __init__(self, server: KubeAPIServer, config: ControllerConfig) -> None:
        self.server = server
        self.scheduler = Scheduler(server)
        self.clock = ManualClock(1_000_000.0)
        self.config = config
        self.proc = self.start()

    def start(self) -> ControllerProcess:
        proc = ControllerProcess(client_for(self.server), CATALOG, "kwok", clock=self.clock, config=self.config)
        return proc.start(sync_timeout_s=5)


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        yield srv


def _policy_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def _node_left_by_a_finished_pod(world: World) -> bool:
    """A pod arrives, gets a node and finishes; the empty node is then past consolidateAfter (60 s): is it kept?"""
    world.round()  # the first round: arrivals are counted from here on
    world.round(310)  # a whole forecast window observed
    world.server.create("pods", gpu_pod("train-0"), namespace="ml")
    world.scheduler.step()
    world.until(lambda: bool(world.kwok_nodes()))
    world.until(lambda: (world.server.get("pods", "train-0", namespace="ml") or {})["spec"].get("nodeName") is not None)
    world.scheduler.complete("ml/train-0")
    world.round(1)
    for _ in range(5):
        world.round(30)
    return bool(world.kwok_nodes())


def test_policy_file_headroom_keeps_the_emptied_node_warm_and_without_it_the_node_goes(
    server: KubeAPIServer, tmp_path: Path
) -> None:
    server.create("gpunodepools", pool())
    path = _policy_file(
        tmp_path,
        "policy:\n  headroom: {ada: {maxNodes: 1, maxHourlyCost: 5, launch: false, lead: 5m, recentWindows: 1}}\n",
    )
    config = live_config({**load_policy(path), **FAST}, None)
    world = World(server, config)
    try:
        assert isinstance(world.proc.controller, OptionsController)
        assert _node_left_by_a_finished_pod(world), "kept warm by the forecast of the pod that just arrived"
        assert world.proc.controller.warm
    finally:
        world.proc.close()


def test_without_a_policy_the_plain_controller_removes_the_empty_node(server: KubeAPIServer) -> None:
    server.create("gpunodepools", pool())
    world = World(server, live_config(FAST, None))
    try:
        assert type(world.proc.controller) is Controller
        assert not _node_left_by_a_finished_pod(world)
    finally:
        world.proc.close()


def test_pool_spec_headroom_turns_headroom_on_and_an_edit_applies_in_place(
    server: KubeAPIServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.create("gpunodepools", pool(HEADROOM))
    file_spec = {"maxNodes": 3, "maxHourlyCost": 9, "launch": False}
    world = World(server, live_config({**FAST, "headroom": {"ada": file_spec, "other": file_spec}}, None))
    assert "policy headroom of pools that do not exist (used once they do): other" in caplog.text
    try:
        ctl = world.proc.controller
        assert isinstance(ctl, OptionsController)
        assert ctl.config.headroom["ada"].max_nodes == 1, "the pool's own setting wins over the policy file's"
        assert ctl.config.headroom["other"].max_nodes == 3
        assert _node_left_by_a_finished_pod(world)
        server.patch("gpunodepools", "ada", {"spec": {"headroom": {"maxNodes": 2}}})
        world.round(1)
        assert world.proc.controller is ctl, "same controller: the arrival history is kept"
        assert ctl.config.headroom["ada"].max_nodes == 2
    finally:
        world.proc.close()


def test_pool_headroom_added_later_rebuilds_the_plain_controller_and_a_bad_one_skips_the_pool(
    server: KubeAPIServer,
) -> None:
    server.create("gpunodepools", pool())
    world = World(server, live_config(FAST, None))
    try:
        assert type(world.proc.controller) is Controller
        server.patch("gpunodepools", "ada", {"spec": {"headroom": HEADROOM}})
        world.round(1)
        assert isinstance(world.proc.controller, OptionsController)
        assert world.proc.controller.config.headroom["ada"].max_nodes == 1
        server.patch("gpunodepools", "ada", {"spec": {"headroom": {"maxHourlyCost": None}}})  # a required key
        world.round(1)
        assert "ada" not in world.proc.controller.pools, "an invalid pool is skipped (its status says so)"
        world.round(1)
        status = (server.get("gpunodepools", "ada") or {}).get("status") or {}
        assert [c["reason"] for c in status.get("conditions", [])] == ["InvalidPool"]
    finally:
        world.proc.close()


# ------------------------------------------------------------------------------------------------ the file itself
def test_policy_file_forms_and_errors(tmp_path: Path) -> None:
    assert load_policy(_policy_file(tmp_path, "")) == {}
    assert load_policy(_policy_file(tmp_path, "evictMaxPodAge: 2h\n")) == {"evictMaxPodAge": "2h"}
    assert load_policy(_policy_file(tmp_path, "policy: {packOntoEmpty: false}\n")) == {"packOntoEmpty": False}
    cases = {
        "evictMaxPodAge: soon\n": "policy.evictMaxPodAge",
        "headroom: {ada: {maxNodes: 0, maxHourlyCost: 5}}\n": "policy.headroom.ada.maxNodes",
        "- a\n": "must be a mapping",
        "a: [\n": "not valid YAML",
    }
    for text, want in cases.items():
        path = _policy_file(tmp_path, text)
        with pytest.raises(InputError) as err:
            load_policy(path)
        assert want in str(err.value) and path in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(InputError) as err:
        load_policy(_policy_file(tmp_path, "headroomm: {}\n"))
    text = str(err.value)
    assert "unknown policy setting" in text and "headroomm" in text and "evictMaxPodAge" in text and "repack" in text


def test_batch_window_flag_wins_over_the_file_which_wins_over_the_default() -> None:
    assert live_config(None, None).batch_idle_s == BATCH_IDLE_S
    assert live_config({"batchIdle": "3s"}, None).batch_idle_s == 3.0
    assert live_config({"batchIdle": "3s"}, 0.25).batch_idle_s == 0.25
    assert live_config({"evictMaxPodAge": "1h"}, None).evict_max_pod_age is not None


# ------------------------------------------------------------------------------------------------ the command
ENDPOINTS = ("--bind-address", "127.0.0.1", "--metrics-port", "0", "--health-port", "0")


def _cli(kubeconfig: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "GPUSCALE_POLICY_FILE"}
    return subprocess.run(
        [sys.executable, "-m", "gpuscale.cli", "controller", "--kubeconfig", str(kubeconfig), *ENDPOINTS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "KUBERNETES_SERVICE_HOST": "", **(env or {})},
    )


def test_command_reads_the_policy_file_from_the_flag_or_the_environment(server: KubeAPIServer, tmp_path: Path) -> None:
    server.create("gpunodepools", pool())
    config = kubeconfig_for(server, tmp_path / "config")
    good = _policy_file(tmp_path, "batchIdle: 2s\nevictMaxPodAge: 2h\n")
    bad = str(tmp_path / "bad.yaml")
    Path(bad).write_text("evictMaxPodAge: 2h\nrepackk: true\n")

    refused = _cli(config, "--provider", "kwok", "--once", "--policy-file", bad)
    assert refused.returncode == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert bad in lines[0] and "policy.repackk" in lines[0] and "unknown policy setting" in lines[0]
    assert "evictMaxPodAge" in lines[0], "the known settings are named"
    assert not server.requests(), "refused before anything connects"

    from_env = _cli(config, "--provider", "kwok", "--once", env={"GPUSCALE_POLICY_FILE": bad})
    assert from_env.returncode == 2 and bad in from_env.stderr and "policy.repackk" in from_env.stderr

    flag_wins = _cli(config, "--provider", "kwok", "--once", "--policy-file", good, env={"GPUSCALE_POLICY_FILE": bad})
    assert flag_wins.returncode == 0, flag_wins.stderr
    assert "batch window 2 s" in flag_wins.stderr and "evictMaxPodAge" in flag_wins.stderr

    batch = _cli(config, "--provider", "kwok", "--once", "--batch-idle", "0.75", env={"GPUSCALE_POLICY_FILE": good})
    assert batch.returncode == 0, batch.stderr
    assert "batch window 0.75 s" in batch.stderr and "evictMaxPodAge" in batch.stderr

    missing = _cli(config, "--provider", "kwok", "--once", "--policy-file", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr


# ------------------------------------------------------------------------------------------------ the CRD
def test_crd_headroom_schema_follows_the_policy_reader() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = crds.pool_schema()
    head = schema["properties"]["spec"]["properties"]["headroom"]
    assert set(head["properties"]) == set(HEADROOM_KEYS)  # the schema the CRD serves names every key the reader takes
    assert head["required"] == ["maxNodes", "maxHourlyCost"]
    ok = pool({"maxNodes": 2, "maxHourlyCost": 5, "lead": "20m", "quantile": 0.75, "launch": False})
    jsonschema.validate(ok, schema)
    for bad in (
        {"maxNodes": 0, "maxHourlyCost": 5},
        {"maxNodes": 2},
        {"maxNodes": 2, "maxHourlyCost": 5, "quantile": 1.5},
        {"maxNodes": 2, "maxHourlyCost": 5, "lead": "ten minutes"},
        {"maxNodes": 2, "maxHourlyCost": 5, "policy": "Reactive"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(pool(bad), schema)


def test_controller_help_shows_the_policy_file_and_without_the_kube_extra_names_it() -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "gpuscale.cli", "controller", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and "--policy-file" in helped.stdout and "GPUSCALE_POLICY_FILE" in helped.stdout
    code = 'import sys\nsys.modules["lightkube"] = None\nfrom gpuscale.cli import main\nmain(prog_name="gpuscale")'
    for args, rc in ((["--help"], 0), (["controller", "--help"], 2)):
        res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == rc, (args, res.stderr)
        assert "gpuscale[kube]" in res.stdout + res.stderr and "Traceback" not in res.stderr
