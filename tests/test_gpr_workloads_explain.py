"""`gpuscale explain` and `gpuscale plan` on a snapshot with a GPR holding a node: GPUProvisioningRequest objects
give the active GPRs' workloadSelectors (manifests/gprs.py), and a pod outside the selector is neither planned onto
the GPR's node nor left without being told why that node refused it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuscale.cli import main

GID = "gpr-0123456789ab"
NODE = f"""\
apiVersion: v1
kind: Node
metadata:
  name: gpr-node-1
  labels:
    node.kubernetes.io/instance-type: g1-gpu-rtx6000-1
    topology.kubernetes.io/zone: us-ord
    nvidia.com/gpu.product: RTX6000
    gpuscale.io/gpr: {GID}
spec:
  taints:
    - {{key: gpuscale.io/gpr, value: {GID}, effect: NoSchedule}}
status:
  allocatable: {{cpu: "8", memory: 32Gi, nvidia.com/gpu: "1", pods: "110"}}
"""
POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  tolerations: [{operator: Exists}]
  containers:
    - name: c
      resources: {requests: {cpu: "1", memory: 1Gi, nvidia.com/gpu: "1"}, limits: {nvidia.com/gpu: "1"}}
"""
POOL = """\
apiVersion: gpuscale.io/v1alpha1
kind: GPUNodePool
metadata: {name: rtx}
spec:
  instanceTypes: [g1-gpu-rtx6000-1]
"""


def _gpr(state: str = "Provisioned", selector: str = "{matchLabels: {app: train}}") -> str:
    return f"""\
apiVersion: gpuscale.io/v1alpha1
kind: GPUProvisioningRequest
metadata: {{name: train}}
spec:
  gpuShape: RTX6000
  workloadSelector: {selector}
status: {{gprId: {GID}, provisioningStatus: {state}}}
"""


def _snapshot(tmp_path: Path, *docs: str) -> str:
    path = tmp_path / "snap.yaml"
    path.write_text("---\n".join(docs))
    return str(path)


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_explain_says_the_pod_gets_a_new_node_and_why_not_the_gpr_node(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, NODE, POD, POOL, _gpr())
    code, out, err = _run("explain", snap, "web", "--catalog", "linode")
    assert code == 0, err
    assert "triggers a scale-up" in out
    assert (
        f"not on existing nodes: node gpr-node-1 is held by GPR {GID}; pod labels do not match its workloadSelector "
        "app=train" in out
    )


def test_explain_of_a_blocked_pod_names_the_gpr_node_in_the_reason(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, NODE, POD, _gpr())  # no pool: nothing can be launched
    code, out, _ = _run("explain", snap, "web", "--catalog", "linode")
    assert code == 0 and "stays pending" in out
    assert f"node gpr-node-1 is held by GPR {GID}; pod labels do not match its workloadSelector app=train" in out


def test_a_matching_pod_fits_the_gpr_node_and_a_gpr_that_holds_nothing_is_no_rule(tmp_path: Path) -> None:
    member = POD.replace("app: web", "app: train")
    code, out, _ = _run("explain", _snapshot(tmp_path, NODE, member, POOL, _gpr()), "web", "--catalog", "linode")
    assert code == 0 and "fits the existing node gpr-node-1" in out
    released = _snapshot(tmp_path, NODE, POD, POOL, _gpr(state="Released"))
    code, out, _ = _run("plan", released, "--catalog", "linode", "--json", "--no-solver")
    assert code == 0 and json.loads(out)["launches"] == []  # the taint is tolerated and no GPR holds the node


def test_a_bad_workload_selector_is_a_one_line_error(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, NODE, POD, POOL, _gpr(selector="[app, train]"))
    code, _, err = _run("plan", snap, "--catalog", "linode")
    assert code == 2 and "Traceback" not in err
    assert "spec.workloadSelector: must be a mapping" in err and "GPUProvisioningRequest train" in err
