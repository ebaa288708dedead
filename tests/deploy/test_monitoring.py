"""The monitoring that ships (deploy/monitoring, deploy/k8s/components/monitoring): the alert
rules pass Debian's promtool (`check rules`, and `test rules`: the drain-cut, throttling and
forced-stop alerts fire on the series that should fire them and not on the others), the
PrometheusRule holds the same groups, every metric a rule reads is one the supervisor exports,
and the PodMonitor selects the pods and scrapes ports they name."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.deploy.manifests import K8S, render_with_component
from tests.harness import ROOT, prometheus
from vllm_intel.supervisor import metrics

MONITORING = ROOT / "deploy" / "monitoring"
COMPONENT = K8S / "components" / "monitoring"


@pytest.fixture(scope="module")
def promtool() -> str:
    return str(prometheus.tools() / "promtool")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=MONITORING)


def test_promtool_checks_the_rules_and_the_scrape_config(promtool):
    out = run(promtool, "check", "rules", "alerts.yml")
    assert out.returncode == 0 and "SUCCESS: 6 rules found" in out.stdout, out.stdout + out.stderr
    out = run(promtool, "check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_fire_the_alerts(promtool):
    out = run(promtool, "test", "rules", "alerts.test.yml")
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_the_unit_tests_can_fail(promtool, tmp_path):
    """The drain-cut case with the alert expected where it cannot fire: promtool says so."""
    case = yaml.safe_load((MONITORING / "alerts.test.yml").read_text())
    case["rule_files"] = [str(MONITORING / "alerts.yml")]
    case["tests"][0]["alert_rule_test"][0]["exp_alerts"] = case["tests"][0]["alert_rule_test"][1][
        "exp_alerts"
    ]
    (tmp_path / "wrong.yml").write_text(yaml.safe_dump(case))
    out = run(promtool, "test", "rules", str(tmp_path / "wrong.yml"))
    assert out.returncode != 0 and "VllmIntelDrainCutsRequests" in out.stdout + out.stderr


def test_the_prometheus_rule_holds_the_same_groups():
    plain = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
    rule = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == plain


def test_every_metric_a_rule_reads_is_exported():
    exported = {name for name, _kind, _doc in metrics.reference()}
    for group in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            for name in re.findall(r"\b((?:vllm_intel|process)_[a-z_]+)\b", rule["expr"]):
                assert name in exported, (rule["alert"], name)


def test_the_pod_monitor_selects_the_pods_and_scrapes_named_ports(tmp_path):
    out_text = render_with_component(tmp_path, "monitoring")
    docs = [d for d in yaml.safe_load_all(out_text) if d]
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    assert [d["kind"] for d in docs].count("PrometheusRule") == 1
    pod = deploy["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == {"http", "probes"} and scraped <= ports.keys()
    # the probe port the probes ask is the one scraped for the supervisor's metrics
    assert c["readinessProbe"]["httpGet"]["port"] == ports["probes"] == 8001


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the Grafana dashboard, its variables at All."""
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [
        (p["title"], t["expr"].replace("$instance", ".*"))
        for p in dash["panels"]
        for t in p["targets"]
    ]


def test_the_dashboard_is_well_formed_and_reads_only_exported_metrics():
    """What can run here without Grafana: the dashboard's structure (ids, grid, targets, the
    datasource variable) and its metric names; tests/e2e runs every query against a Prometheus
    scraping a real server."""
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "instance"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        assert {"h", "w", "x", "y"} <= p["gridPos"].keys() and p["gridPos"]["x"] + p["gridPos"][
            "w"
        ] <= 24
    ours = {name for name, _kind, _doc in metrics.reference()}
    for title, expr in dashboard_queries():
        for name in re.findall(r"\b(vllm_intel_[a-z_]+)\b", expr):
            assert name in ours, (title, name)
        assert "(" in expr or "{" in expr, (title, expr)
