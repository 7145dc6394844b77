"""The alerting rules: ``promtool check rules`` accepts both files, ``promtool test rules`` passes the unit tests in
``tests/promtool/``, a weakened rule fails them, and the PrometheusRule carries exactly the bare file's groups."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from prom_harness import ROOT, tool

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RESOURCE = ROOT / "deploy" / "prometheus" / "gpuscale-rules.yaml"
TESTS = ROOT / "tests" / "promtool" / "gpuscale-rules.test.yml"


def _promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_the_prometheus_rule_resource_carries_the_bare_rules() -> None:
    resource = yaml.safe_load(RESOURCE.read_text())
    assert resource["apiVersion"] == "monitoring.coreos.com/v1" and resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["name"] == "gpuscale-rules"
    assert resource["spec"] == yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in resource["spec"]["groups"] for r in g["rules"]}
    assert {"HighGPUUtilization", "GPUMemoryPressure"} <= alerts


def test_promtool_checks_both_rule_files(tmp_path: Path) -> None:
    checked = _promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout
    spec = tmp_path / "from-resource.yml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(RESOURCE.read_text())["spec"]))
    again = _promtool("check", "rules", spec)
    assert again.returncode == 0, again.stdout + again.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(RULES.read_text().replace("> 90", "> > 90", 1))
    assert _promtool("check", "rules", broken).returncode != 0


def test_promtool_unit_tests_pass() -> None:
    run = _promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_the_unit_tests_catch_a_weakened_threshold_or_window(tmp_path: Path) -> None:
    for old, new in (("> 90\n", "> 80\n"), ("for: 5m", "for: 1m")):
        (tmp_path / "deploy" / "prometheus").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / "promtool").mkdir(parents=True, exist_ok=True)
        text = RULES.read_text()
        assert old in text
        (tmp_path / "deploy" / "prometheus" / "rules.yml").write_text(text.replace(old, new, 1))
        (tmp_path / "tests" / "promtool" / TESTS.name).write_text(TESTS.read_text())
        run = _promtool("test", "rules", TESTS.name, cwd=tmp_path / "tests" / "promtool")
        assert run.returncode != 0, f"the tests did not notice {old!r} -> {new!r}"
        assert "HighGPUUtilization" in run.stdout + run.stderr
