"""docs/policies.md says of each option what its reader does: the ``policy:`` examples are accepted, a mapping said
to be the defaults is, every key an "Optional keys" paragraph names is a key the reader takes (and it names them
all), and the default it gives each key is the reader's default. docs/controller.md's settings table: each row's
example mappings are accepted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.controller.anticipating import ANTICIPATE_KEYS
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.policyopts import EMPTY_WAIT_KEYS
from gpuscale.controller.repackopts import RIGHTSIZE_KEYS
from gpuscale.core.headroom import HEADROOM_KEYS, HEADROOM_REQUIRED

DOCS = Path(__file__).resolve().parents[1] / "docs"
POLICIES = (DOCS / "policies.md").read_text(encoding="utf-8")
CONTROLLER = (DOCS / "controller.md").read_text(encoding="utf-8")

HEADROOM_BOUNDS = {"maxNodes": 2, "maxHourlyCost": 5}
"""headroom's required keys (a bare ``true`` is no headroom setting): written beside every key checked."""


def _option(name: str, value: object) -> dict[str, Any]:
    """The policy mapping setting option ``name`` to ``value`` (headroom: for pool ``gpu``, with its bounds)."""
    if name == "headroom":
        return {"headroom": {"gpu": {**HEADROOM_BOUNDS, **(value if isinstance(value, dict) else {})}}}
    return {name: value}


def _policy_lines() -> list[tuple[str, str]]:
    """(option line, its comment) of each one-line option in the ``policy:`` blocks of policies.md."""
    out = []
    for block in re.findall(r"```yaml\n(.*?)```", POLICIES, flags=re.S):
        if "policy:" not in block:
            continue
        for line in block.split("policy:", 1)[1].splitlines():
            if re.match(r"^  [A-Za-z]+:", line):
                setting, _, comment = line.partition("#")
                out.append((setting.strip(), comment.strip()))
    return out


def test_the_policy_examples_are_accepted_and_those_said_to_be_the_defaults_are() -> None:
    lines = _policy_lines()
    assert {s.split(":", 1)[0] for s, _ in lines} >= {"emptyWait", "anticipate", "rightsize", "repack", "headroom"}
    for setting, comment in lines:
        doc = yaml.safe_load(setting)
        ControllerConfig.from_policy(doc)  # raises InputError if not accepted
        ((name, _),) = doc.items()
        if "(these)" in comment or comment.startswith("the default"):
            assert ControllerConfig.from_policy(doc) == ControllerConfig.from_policy({name: True}), setting


OPTIONAL_KEYS = {
    "headroom": HEADROOM_KEYS,
    "emptyWait": EMPTY_WAIT_KEYS,
    "anticipate": ANTICIPATE_KEYS,
}


def _optional_keys(option: str) -> dict[str, str | None]:
    """Key -> the first backticked value in its parentheses (None: none) of the "Optional keys" paragraph of
    ``option``'s section."""
    section = POLICIES.split(f"(`{option}`)", 1)[1].split("\n## ", 1)[0]
    para = section.split("Optional keys:", 1)[1].split("\n\n", 1)[0].replace("\n", " ")
    out: dict[str, str | None] = {}
    for key, paren in re.findall(r"`(\w+)`(?: \(((?:[^()]|\([^()]*\))*)\))?", para):
        if key in out or (not paren and key not in OPTIONAL_KEYS[option]):
            continue
        default = re.search(r"`([^`]+)`", paren) if paren and "default:" not in paren else None
        out[key] = default[1] if default else None
    return out


@pytest.mark.parametrize("option", sorted(OPTIONAL_KEYS))
def test_optional_keys_are_the_readers_and_their_defaults_are_its_defaults(option: str) -> None:
    documented = _optional_keys(option)
    takes = set(OPTIONAL_KEYS[option]) - (set(HEADROOM_REQUIRED) | {"policy"} if option == "headroom" else set())
    assert set(documented) == takes, f"{option}: documented {sorted(documented)}, the reader takes {sorted(takes)}"
    base = ControllerConfig.from_policy(_option(option, True if option != "headroom" else {}))
    checked = 0
    for key, default in documented.items():
        if default is None or not re.fullmatch(r"[\w.]+", default):
            continue  # a default in words (e.g. "the pool's cheapest offering")
        got = ControllerConfig.from_policy(_option(option, {key: yaml.safe_load(default)}))
        assert got == base, f"policies.md {option}.{key}: `{default}` is not the reader's default"
        checked += 1
    assert checked >= 4, option


def test_rightsize_keys_are_all_shown_in_its_example() -> None:
    (setting,) = [s for s, _ in _policy_lines() if s.startswith("rightsize:")]
    assert set(yaml.safe_load(setting)["rightsize"]) == set(RIGHTSIZE_KEYS)


def test_settings_table_examples_are_accepted() -> None:
    body = CONTROLLER.split("<!-- policy:begin", 1)[1].split("<!-- policy:end", 1)[0]
    checked = 0
    for row in body.splitlines():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        if len(cells) < 3 or not re.fullmatch(r"`\w+`", cells[0]):
            continue
        name = cells[0].strip("`")
        for example in re.findall(r"`(\{[^`]*\})`", cells[2]):
            if "..." in example:
                continue  # a schema (keys without values), not an example
            ControllerConfig.from_policy({name: yaml.safe_load(example)})  # raises InputError if not accepted
            checked += 1
    assert checked >= 5
