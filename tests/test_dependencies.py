"""Every third-party import in ``src/gpuscale`` is a declared dependency (base, or the extra that uses it), and the
test fakes (with the libraries only they use) are never imported by runtime code. Read with ``ast``, not by
importing, so optional modules that are not installed are checked too."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gpuscale"

DISTRIBUTION = {
    "numpy": "numpy",
    "yaml": "pyyaml",
    "rich": "rich",
    "click": "click",
    "scipy": "scipy",
    "matplotlib": "matplotlib",
    "fastapi": "fastapi",
    "pydantic": "pydantic",
    "uvicorn": "uvicorn",
    "httpx": "httpx",
    "requests": "requests",
    "linode_api4": "linode-api4",
    "openapi_core": "openapi-core",
    "openapi_schema_validator": "openapi-schema-validator",
    "werkzeug": "werkzeug",
    "pynvml": "nvidia-ml-py",
    "prometheus_client": "prometheus-client",
    "lightkube": "lightkube",
    "httpx2": "httpx2",
    "kmock": "kmock",
    "aiohttp": "aiohttp",
    "attrs": "attrs",
    "jsonpatch": "jsonpatch",
    "croniter": "croniter",
    "boto3": "boto3",
    "botocore": "botocore",
    "google.cloud.container_v1": "google-cloud-container",
    "google.cloud.compute_v1": "google-cloud-compute",
    "google.api_core": "google-api-core",
    "google.auth": "google-auth",
    "alibabacloud_cs20151215": "alibabacloud-cs20151215",
    "alibabacloud_tea_openapi": "alibabacloud-tea-openapi",
    "Tea": "alibabacloud-tea",
    "darabonba": "darabonba-core",
}
"""Import name (or, for namespace packages such as ``google``, the dotted module) -> distribution on PyPI, for every
third-party module gpuscale imports."""

EXTRA_OF = {
    "scipy": "solver",
    "matplotlib": "sim",
    "fastapi": "server",
    "pydantic": "server",
    "uvicorn": "server",
    "httpx": "server",
    "requests": "linode",
    "linode-api4": "linode",
    "lightkube": "kube",
    "httpx2": "kube",
    "nvidia-ml-py": "agent",
    "prometheus-client": "agent",
    "boto3": "aws",
    "botocore": "aws",
    "google-cloud-container": "gcp",
    "google-cloud-compute": "gcp",
    "google-api-core": "gcp",
    "google-auth": "gcp",
    "alibabacloud-cs20151215": "alibaba",
    "alibabacloud-tea-openapi": "alibaba",
    "alibabacloud-tea": "alibaba",
    "darabonba-core": "alibaba",
}
"""The extra each optional runtime distribution belongs to (the feature that imports it)."""

TEST_ONLY = {"openapi-core", "openapi-schema-validator", "werkzeug", "kmock", "aiohttp", "attrs", "jsonpatch"}
"""Distributions only the test fakes use: declared in ``dev``, imported only under ``gpuscale.fakes``."""


def _names(spec: list[str]) -> set[str]:
    out = set()
    for s in spec:
        m = re.match(r"[A-Za-z0-9._-]+", s)
        assert m, s
        out.add(m.group(0).lower().replace("_", "-"))
    return out


def _project() -> tuple[set[str], dict[str, set[str]]]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return _names(meta["dependencies"]), {k: _names(v) for k, v in meta["optional-dependencies"].items()}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> top-level names of every absolute import in it (at any depth: lazy imports count)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found[module].update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in NAMESPACE_PACKAGES:  # the distribution is named by what is imported
                    found[module].update(f"{node.module}.{a.name}" for a in node.names)
                else:
                    found[module].add(node.module)
                if node.module == "gpuscale":
                    found[module].update(f"gpuscale.{a.name}" for a in node.names)
    return found


NAMESPACE_PACKAGES = {"google"}
"""Top-level names shared by several distributions: their imports are looked up by dotted prefix."""


def _third_party(name: str) -> str | None:
    """The key of ``DISTRIBUTION`` an import belongs to (the top-level name, or for a namespace package the longest
    dotted prefix in the table); None for the standard library and gpuscale itself."""
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in ("gpuscale", "__future__"):
        return None
    if top in NAMESPACE_PACKAGES:
        parts = name.split(".")
        for n in range(len(parts), 1, -1):
            if ".".join(parts[:n]) in DISTRIBUTION:
                return ".".join(parts[:n])
        return name
    return top


def test_the_walk_sees_the_known_imports() -> None:
    imports = _imports()
    assert "requests" in imports["gpuscale.providers.linode"]
    assert "pydantic" in imports["gpuscale.gpr.api"]
    assert "uvicorn" in imports["gpuscale.gpr.server"]  # a lazy import inside a function
    assert len(imports) > 50


def test_every_third_party_import_is_declared_where_it_is_used() -> None:
    base, extras = _project()
    runtime_extras = {k: v for k, v in extras.items() if k != "dev"}
    problems = []
    for module, names in sorted(_imports().items()):
        fake = module == "gpuscale.fakes" or module.startswith("gpuscale.fakes.")
        for top in sorted({t for n in names if (t := _third_party(n))}):
            dist = DISTRIBUTION.get(top)
            if dist is None:
                problems.append(f"{module}: imports {top}, which is not in this test's table (add it, and declare it)")
            elif fake:
                if dist not in extras["dev"] | base:
                    problems.append(f"{module}: {dist} (used by a test fake) is not in the dev extra")
            elif dist in TEST_ONLY:
                problems.append(f"{module}: runtime code imports {top}, which only the test fakes may use")
            elif dist not in base and dist not in runtime_extras.get(EXTRA_OF.get(dist, ""), set()):
                want = EXTRA_OF.get(dist, "the base dependencies")
                problems.append(f"{module}: {dist} is imported but not declared (belongs in {want})")
    assert not problems, "\n".join(problems)


def test_every_declared_runtime_dependency_is_used_and_in_dev() -> None:
    base, extras = _project()
    used = {DISTRIBUTION[t] for names in _imports().values() for n in names if (t := _third_party(n))}
    declared = base | {d for k, v in extras.items() if k != "dev" for d in v}
    assert declared - used == set(), "declared but never imported"
    assert declared <= extras["dev"] | base, "the dev extra must install every runtime extra"
    assert extras["dev"] >= TEST_ONLY


def test_fakes_are_imported_only_by_tests() -> None:
    offenders = sorted(
        f"{module} imports {name}"
        for module, names in _imports().items()
        if not module.startswith("gpuscale.fakes")
        for name in names
        if name == "gpuscale.fakes" or name.startswith("gpuscale.fakes.")
    )
    assert offenders == []
    contract = (ROOT / ".importlinter").read_text()
    assert "forbidden_modules =\n    gpuscale.fakes" in contract  # and import-linter enforces it in scripts/test
