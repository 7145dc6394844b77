"""gpuscale in a live cluster: the Kubernetes adapter (needs the ``kube`` extra: ``pip install 'gpuscale[kube]'``).

* :mod:`.client`: lightkube's async client on its own loop with a synchronous face, kubeconfig/service account;
* :mod:`.cache`: list-then-watch of pods, nodes, PDBs, DaemonSets and gpuscale's CRDs (relist on 410 Gone), a pod
  kept as the compact record of :mod:`.podrecord`;
* :mod:`.backend`: the controller's :class:`~gpuscale.controller.backend.ClusterBackend` on that cache;
* :mod:`.events`: Kubernetes Events for decisions; :mod:`.kwok`: the kwok provider; :mod:`.command`: the command;
* :mod:`.scalers`: GPUWorkloadScalers and GPUBudgets reconciled, targets scaled through :mod:`.scale_client`;
* :mod:`.rightsizer`: a scaler's ``spec.rightsizing`` applied to its target's pod template requests;
* :mod:`.nodeclaims`: a GPUNodeClaim per node claim, read back by a restarted controller.
"""

API_VERBS: tuple[tuple[str, str], ...] = (
    ("list", "pods"),
    ("watch", "pods"),
    ("create", "pods/eviction"),
    ("list", "nodes"),
    ("watch", "nodes"),
    ("get", "nodes"),
    ("patch", "nodes"),
    ("delete", "nodes"),
    ("create", "nodes"),
    ("patch", "nodes/status"),
    ("list", "poddisruptionbudgets.policy"),
    ("watch", "poddisruptionbudgets.policy"),
    ("list", "daemonsets.apps"),
    ("watch", "daemonsets.apps"),
    ("create", "events"),
    ("patch", "events"),
    ("list", "gpunodepools.gpuscale.io"),
    ("watch", "gpunodepools.gpuscale.io"),
    ("list", "gpunodeclaims.gpuscale.io"),
    ("watch", "gpunodeclaims.gpuscale.io"),
    ("create", "gpunodeclaims.gpuscale.io"),
    ("delete", "gpunodeclaims.gpuscale.io"),
    ("patch", "gpunodeclaims.gpuscale.io/status"),
    ("list", "offeringavailabilities.gpuscale.io"),
    ("watch", "offeringavailabilities.gpuscale.io"),
    ("get", "offeringavailabilities.gpuscale.io"),
    ("create", "offeringavailabilities.gpuscale.io"),
    ("patch", "offeringavailabilities.gpuscale.io"),
    ("patch", "offeringavailabilities.gpuscale.io/status"),
    ("list", "gpuprovisioningrequests.gpuscale.io"),
    ("watch", "gpuprovisioningrequests.gpuscale.io"),
    ("get", "gpuprovisioningrequests.gpuscale.io"),
    ("patch", "gpuprovisioningrequests.gpuscale.io/status"),
    ("patch", "gpunodepools.gpuscale.io/status"),
    ("list", "gpuworkloadscalers.gpuscale.io"),
    ("watch", "gpuworkloadscalers.gpuscale.io"),
    ("patch", "gpuworkloadscalers.gpuscale.io/status"),
    ("list", "gpubudgets.gpuscale.io"),
    ("watch", "gpubudgets.gpuscale.io"),
    ("patch", "gpubudgets.gpuscale.io/status"),
    ("get", "deployments.apps/scale"),
    ("patch", "deployments.apps/scale"),
    ("get", "statefulsets.apps/scale"),
    ("patch", "statefulsets.apps/scale"),
    ("get", "replicasets.apps/scale"),
    ("patch", "replicasets.apps/scale"),
    ("get", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("get", "statefulsets.apps"),
    ("patch", "statefulsets.apps"),
)
"""Every (verb, resource) the adapter and the kwok provider use, as RBAC names them (``plural.group`` and
``plural/subresource``). ``create nodes`` and ``patch nodes/status`` are the kwok provider's only; the scalers,
budgets and ``scale`` subresources are :mod:`.scalers`' (a workload of another kind needs its own grant); the
GPR objects and the pools' status are :mod:`.gpr_store`'s and :mod:`.command`'s.
``get``/``create``/``patch`` of OfferingAvailabilities (and their status) are :mod:`.availability_store`'s;
``create``/``delete`` of GPUNodeClaims and ``patch`` of their status are :mod:`.nodeclaims`'. The RBAC
test of the deployment checks the ClusterRole against this list (``get``/``patch`` of Deployments and StatefulSets
are :mod:`.rightsizer`'s: ``updateMode: Recreate`` patches their pod template); the end-to-end tests check the
adapter uses nothing else."""

PREFLIGHT_VERBS: tuple[tuple[str, str], ...] = (("create", "selfsubjectaccessreviews.authorization.k8s.io"),)
"""What ``gpuscale controller`` asks at start-up to name a missing permission before acting; Kubernetes grants it to
every authenticated user (the ``system:basic-user`` role), so the ClusterRole need not."""
