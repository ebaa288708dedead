"""The Kubernetes settings a rolling update needs to lose no request (docs/deploy.md, "Rolling
updates without a failed request"), read from the rendered overlays: a new pod is ready, and has
stayed ready a while, before an old one is stopped; the old one leaves the endpoints before its
drain starts; the drain has the time it needs."""

from __future__ import annotations

import pytest

from .manifests import OVERLAYS, container, one, pod_spec, prestop_seconds, render


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rolling_update_never_goes_below_the_replicas(overlay):
    spec = one(render(overlay), "Deployment")["spec"]
    rolling = spec["strategy"]["rollingUpdate"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert rolling["maxUnavailable"] == 0, (
        "an old pod may only go once its replacement is available"
    )
    assert rolling["maxSurge"] >= 1, "with maxUnavailable 0 a rollout needs a surge pod"
    ready = container(overlay)["readinessProbe"]
    # Available = ready for minReadySeconds: longer than a readiness period, so that endpoints
    # have caught up and one flapping probe cannot count as available.
    assert spec["minReadySeconds"] >= 2 * ready["periodSeconds"]
    # The startupProbe's budget (model loading) fits the progress deadline.
    start = container(overlay)["startupProbe"]
    assert spec["progressDeadlineSeconds"] >= start["periodSeconds"] * start["failureThreshold"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_draining_pod_leaves_the_endpoints(overlay):
    c = container(overlay)
    ready = c["readinessProbe"]
    # /ready fails from the first SIGTERM on (its port: test_k8s.py checks it is the image's).
    assert ready["httpGet"]["path"] == "/ready", ready
    assert ready["failureThreshold"] == 1
    # Routing stops (endpoint removal propagates) before SIGTERM starts the drain.
    assert prestop_seconds(c) >= 2


def test_cpu_runs_two_replicas():
    spec = one(render("cpu"), "Deployment")["spec"]
    assert spec["replicas"] >= 2
    assert pod_spec("cpu")["terminationGracePeriodSeconds"] > prestop_seconds(container("cpu"))
