"""Read a cluster snapshot (Kubernetes objects in YAML) into a core :class:`~gpuscale.core.model.Snapshot`.

Input: one or more YAML documents, each a Kubernetes object or a ``List`` (``kind: List``, ``PodList``, ...) of them,
as ``kubectl get pods,nodes -o yaml`` prints them, plus gpuscale's own kinds. Read kinds:

* ``v1/Pod`` (:mod:`.pods`), ``v1/Node`` (:mod:`.nodes`);
* ``gpuscale.io/v1alpha1`` ``GPUNodePool`` (:mod:`.pools`), ``OfferingAvailability`` (:mod:`.availability`) and
  ``GPUProvisioningRequest`` (:mod:`.gprs`: the workload selectors of GPRs holding nodes).

Other kinds and completed pods are skipped with a note. Every problem of a file is collected and raised as one
:class:`~gpuscale.manifests.problems.ManifestError` (an :class:`~gpuscale.errors.InputError`) whose lines name the
file, line, document, object, field path, value and fix. See ``docs/snapshot-format.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuscale.core.model import Catalog, InstanceType, Node, NodePool, OfferingKey, Pod, Snapshot
from gpuscale.errors import InputError
from gpuscale.inputs import GuardedLoader, compose_documents, construct, paused_gc, read_text, yaml_error
from gpuscale.manifests.availability import read_availability
from gpuscale.manifests.gprs import read_gpr_workload
from gpuscale.manifests.nodes import read_node
from gpuscale.manifests.pods import read_pod
from gpuscale.manifests.pools import read_pool
from gpuscale.manifests.problems import Doc, ManifestError, Notes

__all__ = ["ManifestError", "load_snapshot", "parse_documents", "parse_yaml"]

log = logging.getLogger(__name__)

API_GROUP = "gpuscale.io"
API_VERSION = f"{API_GROUP}/v1alpha1"
CORE_KINDS = ("Pod", "Node")
OWN_KINDS = ("GPUNodePool", "OfferingAvailability", "GPUProvisioningRequest")
YAML_SUFFIXES = (".yaml", ".yml", ".json")


def load_snapshot(path: str | Path, *, catalog: Catalog, now: float, notes: list[str] | None = None) -> Snapshot:
    """Read a snapshot file (or every ``*.yaml``/``*.yml``/``*.json`` file of a directory, in name order).

    ``now`` (epoch seconds) resolves relative ``until`` times of OfferingAvailability. Notes about skipped content
    are appended to ``notes`` when given, and logged at INFO. Raises :class:`InputError` listing every problem.
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in YAML_SUFFIXES and f.is_file())
        if not files:
            raise InputError(
                "directory has no .yaml, .yml or .json files", where=str(p), fix="point at a snapshot file"
            )
    elif p.is_file():
        files = [p]
    else:
        raise InputError("snapshot file not found", where=str(p), fix="give the path of a YAML file or directory")
    builder = _Builder(catalog=catalog, now=now)
    for f in files:
        builder.add_yaml(read_text(f, what="snapshot file"), source=str(f))
    return builder.finish(notes)


def parse_yaml(
    text: str, *, source: str = "<snapshot>", catalog: Catalog, now: float, notes: list[str] | None = None
) -> Snapshot:
    """Like :func:`load_snapshot`, for YAML text already in memory; ``source`` names it in messages."""
    builder = _Builder(catalog=catalog, now=now)
    builder.add_yaml(text, source=source)
    return builder.finish(notes)


def parse_documents(
    docs: Iterable[object], *, source: str, catalog: Catalog, now: float, notes: list[str] | None = None
) -> Snapshot:
    """Build a snapshot from already-decoded objects (dicts as ``yaml.safe_load`` or a Kubernetes client returns)."""
    builder = _Builder(catalog=catalog, now=now)
    for i, obj in enumerate(docs, start=1):
        builder.add_object(obj, Doc(source=source, index=i, line=None, problems=builder.problems), None)
    return builder.finish(notes)


def _items(node: yaml.Node) -> list[yaml.Node]:
    """The ``items`` nodes of a List document node."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "items" and isinstance(value, yaml.SequenceNode):
                return list(value.value)
    return []


def read_documents(
    text: str, source: str, problems: list[InputError], read: Callable[[Doc, Any, yaml.Node], None]
) -> None:
    """Hand each non-empty YAML document of ``text`` to ``read`` with its :class:`Doc` (reporting to ``problems``),
    through the guarded loader with gc paused. A syntax error or a loader limit is one problem and ends the file."""
    loader = GuardedLoader(text)
    index = 0
    try:
        with paused_gc():
            for node in compose_documents(loader, source=source):
                index += 1
                if node is None:
                    continue
                data = construct(loader, node, source=source)
                line = node.start_mark.line + 1
                read(Doc(source=source, index=index, line=line, problems=problems, locate=_locator(node)), data, node)
    except yaml.YAMLError as exc:
        problems.append(yaml_error(exc, source, label="YAML syntax error", column=True))
    except InputError as exc:  # a limit of the loader: the rest of the file is not read
        problems.append(exc)
    finally:
        loader.dispose()


def _locator(root: yaml.Node) -> Callable[[str], int | None]:
    """A function mapping a field path (``spec.containers[0].resources.requests.nvidia.com/gpu``) to the 1-based line
    of the deepest part of it present in the YAML. Keys may contain dots: the longest matching key wins."""

    def locate(path: str) -> int | None:
        node, line, rest = root, root.start_mark.line + 1, path
        while rest:
            if rest.startswith("["):
                end = rest.find("]")
                if end < 0 or not rest[1:end].isdigit() or not isinstance(node, yaml.SequenceNode):
                    break
                idx = int(rest[1:end])
                if idx >= len(node.value):
                    break
                node = node.value[idx]
                line, rest = node.start_mark.line + 1, rest[end + 1 :].removeprefix(".")
                continue
            if not isinstance(node, yaml.MappingNode):
                break
            best: tuple[yaml.Node, yaml.Node] | None = None
            for key, value in node.value:
                text = key.value if isinstance(key, yaml.ScalarNode) else ""
                matches = bool(text) and (rest == text or rest.startswith((text + ".", text + "[")))
                if matches and (best is None or len(text) > len(best[0].value)):
                    best = (key, value)
            if best is None:
                break
            key, node = best
            line, rest = key.start_mark.line + 1, rest[len(key.value) :].removeprefix(".")
        return line

    return locate


@dataclass
class _Builder:
    catalog: Catalog
    now: float
    problems: list[InputError] = field(default_factory=list)
    notes: Notes = field(default_factory=Notes)
    pods: list[tuple[Pod, str]] = field(default_factory=list)
    nodes: list[tuple[Node, str]] = field(default_factory=list)
    pools: list[tuple[NodePool, str]] = field(default_factory=list)
    unavailable: dict[OfferingKey, float] = field(default_factory=dict)
    workloads: dict[str, dict[str, str]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    types: dict[str, InstanceType] = field(init=False)
    zones: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.types = self.catalog.by_name()
        self.zones = frozenset(o.zone for it in self.catalog.instance_types for o in it.offerings)

    def add_yaml(self, text: str, *, source: str) -> None:
        self.sources.append(source)
        read_documents(text, source, self.problems, lambda doc, data, node: self.add_object(data, doc, _items(node)))

    def add_object(self, data: object, doc: Doc, item_nodes: list[yaml.Node] | None) -> None:
        if data is None:
            return
        if not isinstance(data, dict):
            doc.error("", "a document must be a Kubernetes object (a mapping with apiVersion and kind)", data)
            return
        kind, api = data.get("kind"), data.get("apiVersion")
        if not isinstance(kind, str) or not kind:
            doc.error("kind", "is required", kind, fix="add kind: Pod, Node, GPUNodePool, ... (and apiVersion)")
            return
        doc.kind = kind
        if kind.endswith("List") and "items" in data:
            self._add_list(data, doc, item_nodes or [])
            return
        if kind in CORE_KINDS and api != "v1":
            doc.error("apiVersion", f"a {kind} has apiVersion v1", api, fix="set apiVersion: v1")
            return
        if kind in OWN_KINDS and api != API_VERSION:
            doc.error("apiVersion", f"a {kind} has apiVersion {API_VERSION}", api, fix=f"set apiVersion: {API_VERSION}")
            return
        if kind == "Pod":
            pod = read_pod(doc, data, self.notes)
            if pod is not None:
                self.pods.append((pod, doc.describe()))
        elif kind == "Node":
            node = read_node(doc, data, self.types)
            if node is not None:
                self.nodes.append((node, doc.describe()))
        elif kind == "GPUNodePool":
            pool = read_pool(doc, data, self.types, self.zones)
            if pool is not None:
                self.pools.append((pool, doc.describe()))
        elif kind == "OfferingAvailability":
            got = read_availability(doc, data, self.types, self.now)
            for key, until in (got or {}).items():
                self.unavailable[key] = max(until, self.unavailable.get(key, until))
        elif kind == "GPUProvisioningRequest":
            held = read_gpr_workload(doc, data)
            if held is not None:
                self.workloads[held[0]] = held[1]
        else:
            self.notes.add(f"ignored {kind} objects (not read by gpuscale)")

    def _add_list(self, data: dict[str, Any], doc: Doc, item_nodes: list[yaml.Node]) -> None:
        items = data.get("items")
        if items is None:
            return
        if not isinstance(items, list):
            doc.error("items", "must be a list", items)
            return
        for i, item in enumerate(items):
            node = item_nodes[i] if i < len(item_nodes) else None
            line = node.start_mark.line + 1 if node is not None else doc.line
            locate = _locator(node) if node is not None else None
            sub = Doc(source=doc.source, index=doc.index, line=line, problems=self.problems, item=i, locate=locate)
            self.add_object(item, sub, _items(node) if node is not None else None)

    def finish(self, notes_out: list[str] | None) -> Snapshot:
        self._check_unique("pod", [(p.key, where) for p, where in self.pods])
        self._check_unique("node", [(n.name, where) for n, where in self.nodes])
        self._check_unique("GPUNodePool", [(p.name, where) for p, where in self.pools])
        self._check_gangs()
        node_names = {n.name for n, _ in self.nodes}
        for pod, _ in self.pods:
            if pod.node_name is not None and pod.node_name not in node_names:
                self.notes.add("pods bound to nodes that are not in the snapshot (their usage is not counted)")
        if self.problems:
            raise ManifestError(", ".join(self.sources) or "<snapshot>", self.problems)
        rendered = self.notes.render()
        for note in rendered:
            log.info("snapshot: %s", note)
        if notes_out is not None:
            notes_out.extend(rendered)
        return Snapshot(
            pods=tuple(p for p, _ in self.pods),
            nodes=tuple(n for n, _ in self.nodes),
            pools=tuple(p for p, _ in self.pools),
            catalog=self.catalog,
            unavailable=dict(self.unavailable),
            workloads=dict(self.workloads),
        )

    def _check_unique(self, what: str, keyed: list[tuple[str, str]]) -> None:
        first: dict[str, str] = {}
        for key, where in keyed:
            if key in first:
                self.problems.append(
                    InputError(
                        f"duplicate {what} {key!r}, first defined at {first[key]}", where=where, fix="remove one"
                    )
                )
            else:
                first[key] = where

    def _check_gangs(self) -> None:
        sizes: dict[str, tuple[int, str]] = {}
        for pod, where in self.pods:
            if pod.gang is None or pod.gang_size < 1:
                continue
            seen = sizes.setdefault(pod.gang, (pod.gang_size, pod.key))
            if seen[0] != pod.gang_size:
                self.problems.append(
                    InputError(
                        f"gang {pod.gang!r} has gang-size {pod.gang_size} here but {seen[0]} on pod {seen[1]}",
                        where=f"{where} metadata.annotations",
                        fix="give every pod of a gang the same gpuscale.io/gang-size",
                    )
                )
