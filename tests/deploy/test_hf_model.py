"""deploy/k8s/cpu-hub (the cpu overlay + components/hf-model): the prefetch init container runs
the server's image with the server's model settings, the HF cache is a claim mounted at the
image's HF_HOME in both, HF_TOKEN comes from an optional Secret, and the init container's own
command behaves as the manifest says (a no-op offline, exit 69 when the hub is unreachable)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_intel.supervisor import errors

from .manifests import ROOT, dockerfile_env, one, render, render_text
from .test_k8s import K8S_VERSIONS

OVERLAY = "cpu-hub"


def deployment_spec() -> dict:
    return one(render(OVERLAY), "Deployment")["spec"]["template"]["spec"]


def by_name(items: list[dict]) -> dict[str, dict]:
    return {i["name"]: i for i in items}


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "latest")
def test_renders_and_validates_strict(version, tmp_path):
    kinds = sorted(d["kind"] for d in render(OVERLAY))
    assert kinds == ["Deployment", "PersistentVolumeClaim", "PodDisruptionBudget", "Service"]
    path = tmp_path / "cpu-hub.yaml"
    path.write_text(render_text(OVERLAY))
    cmd = [sys.executable, "-m", "kubernetes_validate", "--strict"]
    out = subprocess.run(
        cmd + (["-k", version] if version else []) + [str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed") == 4, out.stdout


def test_prefetch_init_container_mirrors_the_server():
    spec = deployment_spec()
    (init,) = spec["initContainers"]
    (server,) = spec["containers"]
    assert init["name"] == "prefetch" and init["args"] == ["prefetch"]
    assert "command" not in init  # the image's ENTRYPOINT: entrypoint.py prefetch
    assert init["image"] == server["image"] == "vllm-intel:cpu"
    assert init["imagePullPolicy"] == server["imagePullPolicy"]
    # The same model in both; only the init container downloads, so only it has the hub and the
    # token: the server reads what it fetched from the cache, offline, and never sees HF_TOKEN.
    init_env, server_env = by_name(init["env"]), by_name(server["env"])
    assert server_env["INTEL_VLLM_MODEL"] == init_env["INTEL_VLLM_MODEL"]
    assert (
        init_env["HF_HUB_OFFLINE"]["value"] == "0" and server_env["HF_HUB_OFFLINE"]["value"] == "1"
    )
    assert "HF_TOKEN" not in server_env
    token = init_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["optional"] is True  # no Secret: public models still start
    # Same hardening as the server under the pod's securityContext (uid 10001).
    assert init["securityContext"] == server["securityContext"]
    assert init["resources"]["limits"]["memory"]


def test_hf_cache_claim_is_mounted_at_the_images_hf_home():
    docs = render(OVERLAY)
    spec = deployment_spec()
    hf_home = dockerfile_env("cpu")["HF_HOME"]
    claim = one(docs, "PersistentVolumeClaim")
    volumes = by_name(spec["volumes"])
    (hf_volume,) = [v for v in volumes.values() if "persistentVolumeClaim" in v]
    assert hf_volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # Replicas and the rollout's surge pod mount it at once, on any node.
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for c in spec["initContainers"] + spec["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts[hf_home] == hf_volume["name"], c["name"]
        assert all(volumes[name] for name in mounts.values())
    # The init container writes nowhere else but /tmp.
    prefetch = by_name(spec["initContainers"])["prefetch"]
    assert {m["mountPath"] for m in prefetch["volumeMounts"]} == {hf_home, "/tmp"}


def test_startup_probe_and_rest_of_the_cpu_overlay_unchanged():
    """The component adds; it does not move the server's probes, grace period or resources."""
    cpu = one(render("cpu"), "Deployment")["spec"]["template"]["spec"]
    hub = deployment_spec()
    (a,), (b,) = cpu["containers"], hub["containers"]
    for key in (
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
        "lifecycle",
        "resources",
        "args",
    ):
        assert a[key] == b[key], key
    assert cpu["terminationGracePeriodSeconds"] == hub["terminationGracePeriodSeconds"]


def run_init_container(env_overrides: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    """The init container's argv with its env from the manifest (the Secret absent)."""
    (init,) = deployment_spec()["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "INTEL_VLLM_"))}
    return subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), *init["args"]],
        env={**clean, **env, "HF_HOME": str(tmp_path), **env_overrides},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_init_container_command_offline_is_a_noop(tmp_path):
    r = run_init_container({"HF_HUB_OFFLINE": "1"}, tmp_path)
    assert r.returncode == 0 and "not downloading" in r.stderr, r.stderr


def test_init_container_command_fails_with_69_when_the_hub_is_unreachable(tmp_path):
    r = run_init_container({"HF_ENDPOINT": "http://127.0.0.1:9"}, tmp_path)
    assert r.returncode == errors.Exit.PREFETCH, r.stderr
    assert "cannot download Qwen/" in r.stderr and "Traceback" not in r.stderr
