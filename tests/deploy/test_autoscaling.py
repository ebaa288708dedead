"""The autoscaling example (deploy/k8s/components/autoscaling) on the CPU overlay: strict-valid,
aimed at the overlay's Deployment, and a scale-down that is a drain: one pod at a time, no faster
than one pod's grace period, never below the replicas a rollout keeps."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.deploy.manifests import render_with_component


def rendered(tmp_path) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_with_component(tmp_path, "autoscaling")) if d]


def test_the_hpa_validates_and_targets_the_deployment(tmp_path):
    docs = rendered(tmp_path)
    check = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", str(tmp_path / "all.yaml")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deploy["metadata"]["name"])


def test_a_scale_down_is_one_drain_at_a_time(tmp_path):
    docs = rendered(tmp_path)
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    grace = deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["selectPolicy"] == "Min"
    for policy in down["policies"]:
        assert policy["type"] == "Pods" and policy["value"] == 1, policy
        assert policy["periodSeconds"] >= grace, (policy, grace)
    assert down["stabilizationWindowSeconds"] >= 60
    assert hpa["spec"]["minReplicas"] >= 2  # a drain is never an outage
    assert hpa["spec"]["minReplicas"] <= deploy["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
