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


def test_orphan_scan_looks_again_at_the_nodes_that_are_new_objects() -> None:
    """With the claim table's keys unchanged, a new listing is checked only for its Node objects not seen before:
    a Node that keeps its name but now carries a request id no claim has is an orphan; the same objects again are
    not (fails if the Nodes seen before are recognised by name instead of identity)."""
    h = Harness([gpu_pool(instance_types=("g1",))])
    h.add(gpod("a"))
    h.run(40.0)
    ctrl = h.ctrl
    (cloud,) = h.alive()
    obs = ctrl.observed
    node = obs.nodes[cloud.node_name]
    stray = replace(node, name="stray")  # labelled with a known request id: no orphan
    nodes = {**obs.nodes, "stray": stray}
    now = h.engine.now()
    obs.nodes_list = None  # (no listing to recognise: the Node objects decide)
    ctrl._collect_orphans(World(now, [], dict(nodes), [], [], [], {}))
    assert ctrl.deletions.orphan_since == {}
    assert ctrl.__dict__["_orphan_checked"][2] == nodes  # the Nodes seen without orphan
    lost = replace(stray, labels={**stray.labels, REQUEST_ID_LABEL: "unknown"})  # the same name, another object
    ctrl._collect_orphans(World(now, [], {**nodes, "stray": lost}, [], [], [], {}))
    assert ctrl.deletions.orphan_since == {"stray": now}
    ctrl._collect_orphans(World(now, [], dict(nodes), [], [], [], {}))
    assert ctrl.deletions.orphan_since == {}
    # the table's keys changed (the claim removed): the Nodes seen before are looked at again
    ctrl.claims.pop(cloud.request_id)
    ctrl._collect_orphans(World(now, [], dict(nodes), [], [], [], {}))
    assert ctrl.deletions.orphan_since == {"stray": now, cloud.node_name: now}
