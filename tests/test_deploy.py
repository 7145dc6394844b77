"""deploy/kubernetes: rendered with ``kubectl kustomize``, validated offline against the Kubernetes schemas
(``kubernetes-validate``), least-privilege RBAC (exactly what the controller uses), the Deployment's wiring (secret,
probes, ports, security) and the Dockerfile."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.kube import API_VERBS, leader

kv = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"
K8S_VERSION = "1.30"
NAMESPACE = "gpuscale-system"
_CRDS = yaml.safe_load((REPO / "deploy" / "crds" / "kustomization.yaml").read_text())["resources"]


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed (scripts/test installs Debian's kubernetes-client)")
    return path


@cache
def _render(directory: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [_kubectl(), "kustomize", str(DEPLOY / directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def test_base_renders_every_object_once() -> None:
    docs = _render(".")
    assert docs == _render("base")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"]
        + ["Service", "ConfigMap"]
        + ["CustomResourceDefinition"] * len(_CRDS)
    )
    crds = {d["spec"]["names"]["kind"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert {"GPUNodePool", "OfferingAvailability", "GPUNodeClaim", "GPUProvisioningRequest"} <= crds
    for d in docs:
        if d["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["kind"]


def test_crds_in_the_base_are_the_committed_files() -> None:
    docs = {d["metadata"]["name"]: d for d in _render(".") if d["kind"] == "CustomResourceDefinition"}
    listed = yaml.safe_load((REPO / "deploy" / "crds" / "kustomization.yaml").read_text())["resources"]
    assert {"gpunodepool.yaml", "offeringavailability.yaml", "gpunodeclaim.yaml", "gpuprovisioningrequest.yaml"} <= set(
        listed
    )
    assert len(docs) == len(listed)
    for name in listed:
        committed = yaml.safe_load((REPO / "deploy" / "crds" / name).read_text())
        assert docs[committed["metadata"]["name"]] == committed, name


@pytest.mark.parametrize("directory", [".", "overlays/monitoring"])
def test_every_object_validates_against_the_kubernetes_schemas(directory: str) -> None:
    checked = 0
    for doc in _render(directory):
        if doc["kind"] == "ServiceMonitor":
            continue
        kv.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked == 9 + len(_CRDS)


def test_the_validator_rejects_a_broken_deployment() -> None:
    dep = yaml.safe_load(yaml.safe_dump(_one(_render("."), "Deployment")))
    container = dep["spec"]["template"]["spec"]["containers"][0]
    container["livenessProb"] = container.pop("livenessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, K8S_VERSION, strict=True)
    dep = yaml.safe_load(yaml.safe_dump(_one(_render("."), "Deployment")))
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, K8S_VERSION, strict=True)


def test_the_monitoring_overlay_adds_a_service_monitor_for_the_metrics_port() -> None:
    docs = _render("overlays/monitoring")
    sm = _one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["metadata"]["namespace"] == NAMESPACE
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    svc = _one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert [d for d in docs if d["kind"] != "ServiceMonitor"] == list(_render("."))


def _granted(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    out = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, "no resourceNames or nonResourceURLs expected"
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                base, _, sub = res.partition("/")
                name = f"{base}.{group}" if group else base
                for verb in rule["verbs"]:
                    out.add((verb, f"{name}/{sub}" if sub else name))
    return out


def test_rbac_grants_exactly_what_the_controller_uses() -> None:
    docs = _render(".")
    cluster = _granted(_one(docs, "ClusterRole")["rules"])
    role = _granted(_one(docs, "Role")["rules"])
    everything = [x for pair in cluster | role for x in pair]
    assert "*" not in everything and not any(r.startswith("secrets") for r in everything)
    assert cluster == set(API_VERBS)
    assert role == set(leader.PERMISSIONS), "leases are granted in the controller's namespace only"
    sa = _one(docs, "ServiceAccount")["metadata"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = _one(docs, kind)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
        assert binding["roleRef"]["name"] == _one(docs, kind.removesuffix("Binding"))["metadata"]["name"]


def test_deployment_wiring() -> None:
    docs = _render(".")
    dep = _one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2, "two replicas share the lease"
    assert pod["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"]
    (c,) = pod["containers"]
    assert c["image"] == "gpuscale/controller:0.1.0"
    assert c["args"][0] == "controller"
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in c["args"][1:])
    assert flags["provider"] == "linode" and "leader-elect" in flags
    assert flags["namespace"] == "$(POD_NAMESPACE)", "the Lease lives where the Role grants it"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": int(flags["metrics-port"]), "health": int(flags["health-port"])}
    assert (c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]) == (
        {"path": "/healthz", "port": "health"},
        {"path": "/readyz", "port": "health"},
    )
    env = {e["name"]: e for e in c["env"]}
    assert env["LINODE_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "gpuscale-linode", "key": "token"}}
    assert "value" not in env["LINODE_TOKEN"]
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert c["resources"]["requests"].keys() == {"cpu", "memory"} and "memory" in c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    svc = _one(docs, "Service")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_policy_configmap_is_mounted_as_the_controllers_policy_file(tmp_path: Path) -> None:
    from gpuscale.kube.policy import POLICY_FILE_ENV, load_policy

    docs = _render(".")
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "policy")
    assert mount["readOnly"] is True and env[POLICY_FILE_ENV] == f"{mount['mountPath']}/policy.yaml"
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    cm = _one(docs, "ConfigMap", volume["configMap"]["name"])
    shipped = tmp_path / "policy.yaml"
    shipped.write_text(cm["data"]["policy.yaml"])
    assert load_policy(str(shipped)) == {}, "every option is off in the shipped policy"


def test_deployment_flags_are_options_of_the_controller_command() -> None:
    from click.testing import CliRunner

    from gpuscale.cli import main

    result = CliRunner().invoke(main, ["controller", "--help"])
    if result.exit_code != 0 or "--provider" not in result.output:
        pytest.skip("gpuscale controller is not available in this checkout")
    (c,) = _one(_render("."), "Deployment")["spec"]["template"]["spec"]["containers"]
    for arg in c["args"][1:]:
        assert arg.split("=")[0] in result.output, arg


def test_dockerfile_runs_the_controller_as_the_deployments_user() -> None:
    text = (REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f.startswith("python:3.11") for f in froms)
    assert re.search(r'^ENTRYPOINT \["gpuscale"\]$', text, re.M)
    assert re.search(r'^CMD \["controller"', text, re.M)
    pod = _one(_render("."), "Deployment")["spec"]["template"]["spec"]
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M)
    assert user is not None
    assert (int(user[1]), int(user[2])) == (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
    extras = set(re.findall(r"gpuscale\[([a-z,]+)\]", text)[0].split(","))
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(declared), f"Dockerfile installs undeclared extras {extras - set(declared)}"
