"""The orphan scan's "no orphan" answer is reused only while the node listing and the claim table are unchanged."""

from __future__ import annotations

from dataclasses import replace

from gpuscale.controller.shell import World
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL
from test_controller import Harness, gpod, gpu_pool


def test_orphan_scan_is_redone_when_the_claims_or_the_listing_change() -> None:
    h = Harness([gpu_pool(instance_types=("g1",))])
    h.add(gpod("a"))
    h.run(40.0)
    ctrl = h.ctrl
    (cloud,) = h.alive()
    obs = ctrl.observed
    assert obs.nodes_list is not None and ctrl.__dict__["_orphan_free"][0] is obs.nodes_list  # the cache is in use
    nodes = dict(obs.nodes)
    now = h.engine.now()
    w = World(now, [], nodes, [], [], [], {})  # the provider lists nothing: a claim-less labelled Node is an orphan
    ctrl._collect_orphans(w)
    assert ctrl.deletions.orphan_since == {}
    # the same listing, a claim removed: scanned again, its Node is an orphan
    claim = ctrl.claims.pop(cloud.request_id)
    ctrl._collect_orphans(w)
    assert ctrl.deletions.orphan_since == {cloud.node_name: now}
    ctrl.claims[cloud.request_id] = claim
    ctrl._collect_orphans(w)
    assert ctrl.deletions.orphan_since == {}
    # the same claims, a new listing with a Node whose request id no claim has: scanned again
    node = nodes[cloud.node_name]
    stray = replace(node, name="stray", labels={**node.labels, REQUEST_ID_LABEL: "unknown"})
    assert isinstance(obs.nodes_list, tuple)  # the kept listing (only a tuple is kept)
    obs.nodes_list = (*obs.nodes_list, stray)
    ctrl._collect_orphans(World(now, [], {**nodes, "stray": stray}, [], [], [], {}))
    assert ctrl.deletions.orphan_since == {"stray": now}
