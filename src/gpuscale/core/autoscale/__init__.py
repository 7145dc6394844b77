"""Workload autoscaling decisions, pure: the HPA v2 replica computation (:mod:`.hpa`), KEDA's activation, cooldown
and fallback on top (:mod:`.keda`), the GPU-budget arbiter (:mod:`.budget`) and right-sizing (:mod:`.rightsize`)."""
