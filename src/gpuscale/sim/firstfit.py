"""The first-fit check behind the simulator's duplicate-launch oracle
(:meth:`gpuscale.sim.cluster.SimCluster.pending_fit`): can every pending pod be placed, in order, on the free room of
the live cluster state and then of the nodes in flight?"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from gpuscale.core.model import Pod
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import Request
from gpuscale.core.state import BoolArray, ClusterState, NodeShape, Placement
from gpuscale.sim.cluster_records import FitCursor, NodeTemplate


class Pending(Protocol):
    """A pending pod as the simulator keeps it: the pod and its static-fit signature."""

    @property
    def pod(self) -> Pod: ...

    @property
    def sig(self) -> tuple[object, ...]: ...


def first_fit(
    st: ClusterState,
    todo: Sequence[Pending],
    mask: Callable[[tuple[object, ...], Pod], BoolArray],
    templates: Callable[[], list[NodeTemplate]] | None,
    usable: BoolArray | None,
    taken: list[tuple[Request, Placement]],
    workloads: Mapping[str, Mapping[str, str]],
    max_gpus: int,
) -> bool:
    """Place ``todo`` in order, each on the first row of ``st`` with room (rows allowed by ``mask`` and ``usable``),
    else on the first node in flight with room (``templates`` gives their templates, asked once and only when
    needed; None when there are none). Placements on ``st`` are appended to ``taken`` for the caller to release."""
    extra: ClusterState | None = None
    tpls: list[NodeTemplate] = []
    cursors: dict[tuple[object, ...], FitCursor] = {}
    for sp in todo:
        req = sp.pod.request
        key = (req, sp.sig)
        cur = cursors.get(key)
        if cur is None:
            ok = st.fits(req) & mask(sp.sig, sp.pod)
            if usable is not None:
                ok &= usable
            cur = cursors[key] = FitCursor(ok.nonzero()[0])  # (one-dimensional: flatnonzero without its ravel)
        live = cur.live
        while cur.live_at < live.size and not st.fits_one(req, int(live[cur.live_at])):
            cur.live_at += 1
        if cur.live_at < live.size:
            taken.append((req, st.place(req, int(live[cur.live_at]))))
            continue
        if templates is None:
            return False
        if extra is None:
            tpls = templates()
            shapes = [NodeShape(f"_flight{i}", t.allocatable, t.gpu_model) for i, t in enumerate(tpls)]
            extra = ClusterState(shapes, max_gpus=max_gpus)
        if cur.extra is None:
            pod = sp.pod
            static = np.fromiter(
                (static_fit(pod, t.labels, t.taints, False, workloads) is None for t in tpls),
                bool,
                len(tpls),
            )
            cur.extra = (extra.fits(req) & static).nonzero()[0]
        rows = cur.extra
        while cur.extra_at < rows.size and not extra.fits_one(req, int(rows[cur.extra_at])):
            cur.extra_at += 1
        if cur.extra_at >= rows.size:
            return False
        extra.place(req, int(rows[cur.extra_at]))
    return True
