"""The one loader every input file goes through: a size limit, strict UTF-8 and a guarded YAML composer.

Limits (documented in ``docs/input-limits.md``; each is an environment variable, read when a file is loaded):

* ``GPUSCALE_MAX_INPUT_BYTES`` (default 128 MiB): larger files are refused before they are read;
* ``GPUSCALE_MAX_YAML_DEPTH`` (default 200, at most 10,000): nesting of mappings and sequences, aliases expanded;
* ``GPUSCALE_MAX_YAML_NODES`` (default 100,000): nodes that aliases may add when expanded ("billion laughs").

Composition is done here, event by event, on libyaml's parser when it is installed: depth and alias expansion are
counted while the node graph is built (an alias costs the size of its target, known from the composed graph), so a
bomb is refused after reading a few hundred events, and a recursive alias (``a: &a [*a]``) is refused at once.
Integers of more than :data:`MAX_INT_DIGITS` digits, impossible timestamps and strings holding a NUL or a lone
UTF-16 surrogate are construction errors. Every refusal is an :class:`~gpuscale.errors.InputError` of one line.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from yaml import events as ev
from yaml import nodes

from gpuscale.errors import InputError

__all__ = [
    "GuardedLoader",
    "Limits",
    "compose_documents",
    "construct",
    "load_yaml_file",
    "load_yaml_text",
    "paused_gc",
    "read_text",
    "yaml_error",
]

MIB = 1 << 20
DEFAULT_MAX_INPUT_BYTES = 128 * MIB
DEFAULT_MAX_YAML_DEPTH = 200
HARD_MAX_YAML_DEPTH = 10_000
"""libyaml's own composer recurses in C: far deeper documents must never reach it."""
LIBYAML_MAX_DEPTH = 1000
"""Recent libyaml refuses flow collections nested deeper than this while scanning, before any event reaches us."""
DEFAULT_MAX_YAML_NODES = 100_000
MAX_INT_DIGITS = 100
"""YAML integers longer than this (sign, digits, ``_`` and ``:`` separators) are refused."""

_ENV = {
    "max_bytes": ("GPUSCALE_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES),
    "max_depth": ("GPUSCALE_MAX_YAML_DEPTH", DEFAULT_MAX_YAML_DEPTH),
    "max_alias_nodes": ("GPUSCALE_MAX_YAML_NODES", DEFAULT_MAX_YAML_NODES),
}
_POSITIVE_INT = re.compile(r"^[0-9]{1,15}$")
_SURROGATE = re.compile("[\ud800-\udfff]")


class Limits:
    """The limits in force: from the environment (``Limits.from_env()``) or given explicitly (tests)."""

    __slots__ = ("max_alias_nodes", "max_bytes", "max_depth")

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_INPUT_BYTES,
        max_depth: int = DEFAULT_MAX_YAML_DEPTH,
        max_alias_nodes: int = DEFAULT_MAX_YAML_NODES,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_depth = min(max_depth, HARD_MAX_YAML_DEPTH)
        self.max_alias_nodes = max_alias_nodes

    @classmethod
    def from_env(cls) -> Limits:
        """Limits from ``GPUSCALE_MAX_*`` variables; a malformed value is an :class:`InputError` naming it."""
        values: dict[str, int] = {}
        for attr, (var, default) in _ENV.items():
            raw = os.environ.get(var, "").strip()
            if not raw:
                values[attr] = default
                continue
            if not _POSITIVE_INT.match(raw) or int(raw) < 1:
                raise InputError(
                    "must be a positive whole number", where=f"environment variable {var}", value=raw,
                    fix=f"unset it for the default ({default:,}) or give a number such as {default}",
                )  # fmt: skip
            values[attr] = int(raw)
        return cls(**values)


def _limits(limits: Limits | None) -> Limits:
    return limits if limits is not None else Limits.from_env()


# ------------------------------------------------------------------------------------------------------ reading
def read_text(path: str | Path, *, what: str = "input file", limits: Limits | None = None) -> str:
    """The UTF-8 text of ``path``, refused before it is read when it is larger than the byte limit."""
    lim = _limits(limits)
    p = Path(path)
    try:
        with p.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > lim.max_bytes:
                raise _too_big(p, what, size, lim)
            data = fh.read(lim.max_bytes + 1)  # a pipe or device may not know its size
    except FileNotFoundError:
        raise InputError(f"{what} not found", where=str(p), fix="check the path") from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory", where=str(p), fix="give the path of a file") from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", where=str(p)) from None
    if len(data) > lim.max_bytes:
        raise _too_big(p, what, len(data), lim)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{what} is not UTF-8 text (byte {exc.start:,}: {exc.reason})", where=f"{p}:{line}",
            fix="save it as UTF-8",
        ) from None  # fmt: skip


def _too_big(p: Path, what: str, size: int, lim: Limits) -> InputError:
    return InputError(
        f"{what} is larger than the limit of {lim.max_bytes:,} bytes ({size:,} bytes or more)", where=str(p),
        fix="raise GPUSCALE_MAX_INPUT_BYTES if the file is genuine (see docs/input-limits.md)",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ constructing
_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available


class GuardedLoader(_Base):  # type: ignore[misc,valid-type]
    """Safe loader (libyaml's parser when installed) that rejects duplicate keys, integers of more than
    :data:`MAX_INT_DIGITS` characters, impossible timestamps, and strings holding a NUL or a lone surrogate.
    Use it through :func:`compose_documents` / :func:`construct`, which add the structure limits."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {_prefix(key_node.value)}", key_node.start_mark,
                    )  # fmt: skip
                seen.add(key_node.value)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"integer of {len(node.value):,} characters (at most {MAX_INT_DIGITS})", node.start_mark
            )
        value: int = super().construct_yaml_int(node)
        return value

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"not a valid timestamp ({exc}): quote it to keep it as text", node.start_mark
            ) from None

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        value: str = super().construct_yaml_str(node)
        if node.style == '"' and ("\x00" in value or _SURROGATE.search(value)):
            raise yaml.constructor.ConstructorError(
                None, None, "string holds a NUL character or a lone UTF-16 surrogate escape", node.start_mark
            )
        return value


GuardedLoader.add_constructor("tag:yaml.org,2002:int", GuardedLoader.construct_yaml_int)
GuardedLoader.add_constructor("tag:yaml.org,2002:timestamp", GuardedLoader.construct_yaml_timestamp)
GuardedLoader.add_constructor("tag:yaml.org,2002:str", GuardedLoader.construct_yaml_str)


def yaml_error(exc: yaml.YAMLError, source: str, *, label: str = "not valid YAML", column: bool = False) -> InputError:
    """A PyYAML error as a one-line :class:`InputError` naming ``source:line`` (and ``:column``)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = source if mark is None else f"{source}:{mark.line + 1}" + (f":{mark.column + 1}" if column else "")
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    text = f"{context}: {problem}" if context else str(problem)
    return InputError(f"{label}: {_one_line(text)}", where=where, fix="fix the YAML at that line (indentation, quotes)")


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _prefix(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value):,} chars)"


# ------------------------------------------------------------------------------------------------- composing
@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large node graph is built (it holds no cycles to collect, and
    repeated collections over a million live nodes made loading a 10k-pod snapshot three times slower)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Frame:
    """A collection being composed: its node, pending key, expanded size and subtree height."""

    __slots__ = ("height", "key", "node", "size")

    def __init__(self, node: yaml.Node) -> None:
        self.node = node
        self.key: yaml.Node | None = None
        self.size = 1
        self.height = 1


def compose_documents(
    loader: yaml.SafeLoader, *, source: str, limits: Limits | None = None
) -> Iterator[yaml.Node | None]:
    """Compose every document of ``loader``'s stream under the depth and alias limits, lazily (a syntax error in a
    later document is raised when it is reached). Yields None for an empty document."""
    lim = _limits(limits)
    get: Callable[[], Any] = loader.get_event
    resolve: Callable[..., str] = loader.resolve
    anchors: dict[str, yaml.Node] = {}
    sizes: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (expanded size, height); only once complete
    stack: list[_Frame] = []
    added = 0
    root: yaml.Node | None = None
    try:
        while True:
            event = get()
            kind = type(event)
            size, height = 1, 1
            if kind is ev.ScalarEvent:
                tag = event.tag
                if tag is None or tag == "!":
                    tag = resolve(nodes.ScalarNode, event.value, event.implicit)
                node: yaml.Node = nodes.ScalarNode(
                    tag, event.value, event.start_mark, event.end_mark, style=event.style
                )
                if event.anchor is not None:
                    anchors[event.anchor] = node
                    sizes[id(node)] = (1, 1)
            elif kind is ev.AliasEvent:
                target = anchors.get(event.anchor)
                if target is None:
                    raise yaml.composer.ComposerError(
                        None, None, f"found undefined alias {_prefix(event.anchor)}", event.start_mark
                    )
                done = sizes.get(id(target))
                if done is None:
                    raise _limit_error(source, event.start_mark, "recursive alias (a node that contains itself)",
                                       "write the structure out without a self-reference")  # fmt: skip
                size, height = done
                added += size
                if added > lim.max_alias_nodes:
                    raise _limit_error(
                        source, event.start_mark,
                        f"aliases expand to more than {lim.max_alias_nodes:,} nodes",
                        "write the values out, or raise GPUSCALE_MAX_YAML_NODES if the file is genuine",
                    )  # fmt: skip
                node = target
            elif kind is ev.SequenceStartEvent or kind is ev.MappingStartEvent:
                is_seq = kind is ev.SequenceStartEvent
                tag = event.tag
                if tag is None or tag == "!":
                    tag = resolve(nodes.SequenceNode if is_seq else nodes.MappingNode, None, event.implicit)
                cls = nodes.SequenceNode if is_seq else nodes.MappingNode
                node = cls(tag, [], event.start_mark, None, flow_style=event.flow_style)
                if event.anchor is not None:
                    anchors[event.anchor] = node
                stack.append(_Frame(node))
                if len(stack) > lim.max_depth:
                    raise _limit_error(
                        source, event.start_mark, f"nesting deeper than {lim.max_depth:,} levels",
                        "flatten the structure, or raise GPUSCALE_MAX_YAML_DEPTH if the file is genuine",
                    )  # fmt: skip
                continue
            elif kind is ev.SequenceEndEvent or kind is ev.MappingEndEvent:
                frame = stack.pop()
                node = frame.node
                node.end_mark = event.end_mark
                size, height = frame.size, frame.height
                sizes[id(node)] = (size, height)
                _attach(stack, node, size, height, source, lim)
                if not stack:
                    root = node
                continue
            elif kind is ev.DocumentStartEvent:
                anchors.clear()
                sizes.clear()
                added, root = 0, None
                continue
            elif kind is ev.DocumentEndEvent:
                yield root
                continue
            elif kind is ev.StreamEndEvent:
                return
            else:  # the stream start
                continue
            _attach(stack, node, size, height, source, lim)
            if not stack:
                root = node
    except yaml.YAMLError as exc:
        # libyaml's scanner reads flow collections ahead of the parser and has a nesting limit of its own
        if "maximum nesting depth" not in str(getattr(exc, "problem", "")):
            raise
        limit = f"{lim.max_depth:,}" if lim.max_depth < LIBYAML_MAX_DEPTH else f"the parser's {LIBYAML_MAX_DEPTH:,}"
        raise _limit_error(
            source, getattr(exc, "problem_mark", None), f"nesting deeper than {limit} levels",
            "flatten the structure, or raise GPUSCALE_MAX_YAML_DEPTH if the file is genuine",
        ) from None  # fmt: skip
    except RecursionError:  # last resort: the limits above should make this unreachable
        raise _limit_error(source, None, "structure too deeply nested", "flatten it") from None


def _attach(stack: list[_Frame], node: yaml.Node, size: int, height: int, source: str, lim: Limits) -> None:
    if not stack:
        return
    parent = stack[-1]
    parent.size += size
    parent.height = max(parent.height, height + 1)
    if len(stack) + height - 1 > lim.max_depth:
        raise _limit_error(
            source, node.start_mark, f"aliases nest deeper than {lim.max_depth:,} levels",
            "write the values out, or raise GPUSCALE_MAX_YAML_DEPTH if the file is genuine",
        )  # fmt: skip
    if isinstance(parent.node, nodes.SequenceNode):
        parent.node.value.append(node)
    elif parent.key is None:
        parent.key = node
    else:
        parent.node.value.append((parent.key, node))
        parent.key = None


def _limit_error(source: str, mark: Any, message: str, fix: str) -> InputError:
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    return InputError(message, where=where, fix=fix)


def construct(loader: yaml.SafeLoader, node: yaml.Node, *, source: str) -> Any:
    """The Python value of a composed document; construction errors become :class:`InputError`."""
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source) from None
    except RecursionError:
        raise _limit_error(source, node.start_mark, "structure too deeply nested", "flatten it") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor PyYAML does not guard
        raise _limit_error(source, node.start_mark, f"cannot read a value: {_one_line(str(exc), 120)}",
                           "quote values that should stay text") from None  # fmt: skip


def load_yaml_text(
    text: str,
    *,
    source: str,
    loader_cls: type[yaml.SafeLoader] = GuardedLoader,
    limits: Limits | None = None,
) -> tuple[Any, yaml.Node | None]:
    """One YAML document of ``text`` and its composed node (for line numbers); ``(None, None)`` when empty. A second
    document is an error."""
    loader = loader_cls(text)
    try:
        with paused_gc():
            docs = compose_documents(loader, source=source, limits=limits)
            node = next(docs, None)
            if node is not None and next(docs, None) is not None:
                raise InputError("holds more than one YAML document", where=source, fix="keep one document (no ---)")
            return (construct(loader, node, source=source), node) if node is not None else (None, None)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source) from None
    finally:
        loader.dispose()


def load_yaml_file(
    path: str | Path,
    *,
    source: str | None = None,
    what: str = "input file",
    loader_cls: type[yaml.SafeLoader] = GuardedLoader,
    limits: Limits | None = None,
) -> Any:
    """Read one YAML document from ``path`` under every limit; ``source`` names it in messages (default: the path).
    Raises :class:`InputError` (exit 2 / HTTP 422) for every problem, never a PyYAML or Python error."""
    lim = _limits(limits)
    text = read_text(path, what=what, limits=lim)
    data, _ = load_yaml_text(text, source=source or str(path), loader_cls=loader_cls, limits=lim)
    return data
