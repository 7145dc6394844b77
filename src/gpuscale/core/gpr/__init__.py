"""GPU Provisioning Requests (GPRs), the pure part: spec and validation (:mod:`.spec`, :mod:`.validation`), the
lifecycle state machine (:mod:`.lifecycle`), the planner (:mod:`.planner`) and the codec (:mod:`.codec`).

A GPR asks for ``numberOfGPUNodes`` nodes with ``numberOfGPUs`` GPUs each, of one GPU shape, for ``exitDuration``.
Field names follow Avesha EGS so existing requests carry over (:data:`SPEC_FIELDS`). Everything here is pure: the
imperative shell (:mod:`gpuscale.gpr`) loads GPRs, observes nodes, calls :func:`plan_gprs` and applies its actions.

Lifecycle (:data:`TRANSITIONS`; every edge has one trigger, :data:`TRIGGER_DOCS` says when it fires, and
:func:`transition` rejects every other edge)::

    Queued        --admit---------------> Provisioning   free inventory reserved and/or scale-up launched
    Queued        --cancel--------------> Cancelled      user cancel (only while queued)
    Queued        --delay-limit---------> Failed         delayedCount reached MAX_DELAYED_COUNT
    Queued        --unservable----------> Failed         spec no longer matches the catalog
    Provisioning  --nodes-ready---------> Provisioned    all nodes ready and labelled; exit clock starts
    Provisioning  --provisioning-failed-> Failed         launch rejected, node failed, or deadline missed
    Provisioning  --early-release-------> Released       user release
    Provisioning  --evict---------------> Evicted        a higher-priority GPR needs the capacity
    Provisioned   --exit-duration-------> Complete       exitDuration elapsed
    Provisioned   --early-release-------> Released       user release
    Provisioned   --idle-timeout--------> Released       no GPU use for idleTimeOutDuration (enforced)
    Provisioned   --node-lost-----------> Failed         a node disappeared
    Provisioned   --evict---------------> Evicted        a higher-priority GPR needs the capacity
    Failed        --requeue-------------> Queued         requeueOnFailure, retryCount < limit (not after
    Evicted       --requeue-------------> Queued         delay-limit or unservable); a new attempt/request id

Insufficient capacity: the shell marks an offering that refused a launch unavailable for a while
(:attr:`CapacityView.unavailable`); admission skips marked offerings (:func:`candidate_offerings`) and a provisioning
GPR whose pending launch targets a marked offering moves to the next candidate (:func:`retarget_launch`), failing
only when none is left.

Nodes serving a GPR carry the label and ``NoSchedule`` taint ``gpuscale.io/gpr=<gprId>`` (:func:`gpr_node_labels`,
:func:`gpr_node_taints`); only pods matching ``workloadSelector`` and tolerating the taint belong there
(:func:`admits_pod`). Nodes launched for a GPR also carry :data:`RELEASE_POLICY_LABEL` (its ``releasePolicy``): when
the GPR ends they return to their pool (``Consolidate``) or are deleted (``Delete``); borrowed inventory nodes are
unlabelled and returned.
"""

from gpuscale.core.durations import MAX_EGS_DURATION_TEXT as MAX_DURATION_TEXT
from gpuscale.core.durations import format_egs_duration as format_duration
from gpuscale.core.gpr.codec import (
    gpr_to_dict,
    status_from_record,
    status_to_dict,
    status_to_record,
)
from gpuscale.core.gpr.lifecycle import (
    FINAL_STATES,
    HOLDING_STATES,
    TRANSITIONS,
    TRIGGER_DOCS,
    Gpr,
    GprState,
    GprStatus,
    IllegalTransition,
    NodePoolDetails,
    Trigger,
    admits_pod,
    cancel,
    gpr_id_of_request,
    gpr_node_labels,
    gpr_node_taints,
    gpr_toleration,
    is_gpr_request_id,
    new_gpr,
    request_release,
    transition,
    with_priority,
)
from gpuscale.core.gpr.planner import (
    AssignNode,
    CapacityView,
    DeleteNode,
    GprActions,
    GprConfig,
    GprNode,
    LaunchAction,
    TransitionRecord,
    UnassignNode,
    launch_action,
    plan_gprs,
    queue_order,
    retarget_launch,
)
from gpuscale.core.gpr.schema import (
    CLUSTER_NAME_MAX,
    DEFAULT_PRIORITY,
    FIELDS_BY_NAME,
    IGNORED_EGS_FIELDS,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_PER_GPU_GB,
    MAX_NODES_PER_GPR,
    MAX_SELECTOR_LABELS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RELEASE_POLICIES,
    REQUEST_NAME_MAX,
    SPEC_ALIASES,
    SPEC_FIELDS,
    SPEC_SCHEMA,
    TEXT_MAX,
    SpecField,
    field_json_schema,
    spec_json_schema,
)
from gpuscale.core.gpr.spec import (
    API_VERSION,
    DEFAULT_MAX_EXIT_S,
    GPR_LABEL,
    GPR_TAINT,
    KIND,
    MAX_EXIT_CEILING_S,
    MAX_REPORTED,
    RELEASE_POLICY_LABEL,
    REQUEST_ID_PREFIX,
    SHORT_NAME,
    FieldError,
    GprSpec,
    GprValidationError,
    clean_text,
    closest_field,
    format_timestamp,
    priority_band,
    spec_from_dict,
    spec_to_dict,
    unknown_field_errors,
)
from gpuscale.core.gpr.validation import (
    candidate_offerings,
    candidate_types,
    estimate_cost,
    parse_gpr_spec,
    validate_spec,
)

__all__ = [
    "API_VERSION",
    "CLUSTER_NAME_MAX",
    "DEFAULT_MAX_EXIT_S",
    "DEFAULT_PRIORITY",
    "FIELDS_BY_NAME",
    "FINAL_STATES",
    "GPR_LABEL",
    "GPR_TAINT",
    "HOLDING_STATES",
    "IGNORED_EGS_FIELDS",
    "KIND",
    "MAX_DURATION_TEXT",
    "MAX_EXIT_CEILING_S",
    "MAX_GPUS_PER_NODE",
    "MAX_MEMORY_PER_GPU_GB",
    "MAX_NODES_PER_GPR",
    "MAX_REPORTED",
    "MAX_SELECTOR_LABELS",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RELEASE_POLICIES",
    "RELEASE_POLICY_LABEL",
    "REQUEST_ID_PREFIX",
    "REQUEST_NAME_MAX",
    "SHORT_NAME",
    "SPEC_ALIASES",
    "SPEC_FIELDS",
    "SPEC_SCHEMA",
    "TEXT_MAX",
    "TRANSITIONS",
    "TRIGGER_DOCS",
    "AssignNode",
    "CapacityView",
    "DeleteNode",
    "FieldError",
    "Gpr",
    "GprActions",
    "GprConfig",
    "GprNode",
    "GprSpec",
    "GprState",
    "GprStatus",
    "GprValidationError",
    "IllegalTransition",
    "LaunchAction",
    "NodePoolDetails",
    "SpecField",
    "TransitionRecord",
    "Trigger",
    "UnassignNode",
    "admits_pod",
    "cancel",
    "candidate_offerings",
    "candidate_types",
    "clean_text",
    "closest_field",
    "estimate_cost",
    "field_json_schema",
    "format_duration",
    "format_timestamp",
    "gpr_id_of_request",
    "gpr_node_labels",
    "gpr_node_taints",
    "gpr_to_dict",
    "gpr_toleration",
    "is_gpr_request_id",
    "launch_action",
    "new_gpr",
    "parse_gpr_spec",
    "plan_gprs",
    "priority_band",
    "queue_order",
    "request_release",
    "retarget_launch",
    "spec_from_dict",
    "spec_json_schema",
    "spec_to_dict",
    "status_from_record",
    "status_to_dict",
    "status_to_record",
    "transition",
    "unknown_field_errors",
    "validate_spec",
    "with_priority",
]
