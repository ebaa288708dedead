"""deploy/k8s: the overlays render offline, pass the Kubernetes schemas strictly, and agree with the
image (Dockerfiles), compose.yaml and entrypoint.py on timing, probes, ports, paths and the user."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from vllm_intel.supervisor import paths, timing

from .manifests import (
    K8S,
    OVERLAYS,
    ROOT,
    compose,
    compose_default,
    container,
    dockerfile_app_stage,
    dockerfile_env,
    env,
    one,
    pod_spec,
    prestop_seconds,
    render,
    render_text,
    render_with_component,
    validate_strict,
    vllm_services,
    xpu_cache_dirs,
)

# The Kubernetes releases whose bundled schemas (kubernetes-validate, offline) must accept the
# manifests: the oldest we claim (the exec preStop is there for it) and the newest bundled one.
K8S_VERSIONS = ("1.29", None)
PROBE = ["/opt/venv/bin/python", "/opt/vllm-intel/entrypoint.py", "probe"]
WRITABLE = {"/tmp", "/home/vllm/.cache", "/dev/shm"}  # docs/CONVENTIONS.md, "Image layout"
UID = 10001


def entrypoint_grace(environ: dict[str, str]) -> int:
    """`entrypoint.py grace-period` (DRAIN + TEARDOWN + MARGIN) with the given settings."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("INTEL_VLLM_")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "grace-period"],
        env={**keep, **environ},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def gi(quantity: str) -> float:
    """GiB in a Kubernetes quantity (2Gi) or a Docker size (2g, binary units as Docker uses)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(Gi|Mi|g|m)?b?", str(quantity), re.I)
    assert m, quantity
    return (
        float(m.group(1))
        * {"gi": 1, "g": 1, "mi": 1 / 1024, "m": 1 / 1024}[(m.group(2) or "g").lower()]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_deployment_service_pdb(overlay):
    kinds = sorted(d["kind"] for d in render(overlay))
    assert kinds == ["Deployment", "PodDisruptionBudget", "Service"]


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "latest")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_validate_strict(overlay, version, tmp_path):
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(render_text(overlay))
    cmd = [sys.executable, "-m", "kubernetes_validate", "--strict"]
    if version:
        cmd += ["-k", version]
    out = subprocess.run(cmd + [str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed") == 3, out.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_is_prestop_plus_entrypoint_grace(overlay):
    """kubelet counts terminationGracePeriodSeconds from the start of the preStop hook, so it must
    hold the preStop sleep plus what entrypoint.py needs for the same drain setting."""
    spec, c = pod_spec(overlay), container(overlay)
    prestop = prestop_seconds(c)
    grace = entrypoint_grace(env(c))  # DRAIN + 15 with the pod's own env (device included)
    drain = int(env(c)["INTEL_VLLM_DRAIN_TIMEOUT"])
    assert grace >= timing.grace_period(drain)
    assert spec["terminationGracePeriodSeconds"] == prestop + grace, (
        f"{overlay}: terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} != "
        f"preStop {prestop:g} + entrypoint grace-period {grace}"
    )
    # A preStop long enough for endpoint removal to propagate, short next to the drain.
    assert 2 <= prestop <= 15
    assert prestop == timing.PRESTOP_S  # the value docs/deploy.md shows


def test_shipped_drain_defaults_are_the_entrypoints():
    """The drain the manifests, compose and .env.example ship is the entrypoint's own default
    (timing.DEFAULT_DRAIN_S): a changed default cannot leave one of them behind."""
    want = str(timing.DEFAULT_DRAIN_S)
    shipped = {f"k8s {o}": env(container(o))["INTEL_VLLM_DRAIN_TIMEOUT"] for o in OVERLAYS}
    shipped |= {
        f"compose {name}": compose_default(svc["environment"]["INTEL_VLLM_DRAIN_TIMEOUT"])
        for name, svc in vllm_services().items()
    }
    example = (ROOT / ".env.example").read_text()
    shipped[".env.example"] = re.search(r"^INTEL_VLLM_DRAIN_TIMEOUT=(\S+)", example, re.M)[1]
    assert {k: v for k, v in shipped.items() if v != want} == {}, want


def test_grace_formula_is_written_next_to_the_value():
    text = (K8S / "base" / "deployment.yaml").read_text()
    assert "terminationGracePeriodSeconds = preStop sleep + DRAIN + TEARDOWN + MARGIN" in text


def test_compose_grace_period_matches_entrypoint():
    svcs = vllm_services()
    for name, svc in svcs.items():
        drain = compose_default(svc["environment"]["INTEL_VLLM_DRAIN_TIMEOUT"])
        grace = compose_default(svc["stop_grace_period"])
        environ = {
            "INTEL_VLLM_DRAIN_TIMEOUT": drain,
            "INTEL_VLLM_DEVICE": "xpu" if "xpu" in name else "cpu",
        }
        # compose stops with SIGTERM at once (no preStop), so its grace is the entrypoint's.
        assert grace == f"{entrypoint_grace(environ)}s", f"{name}: stop_grace_period {grace}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_prestop_use_the_image_paths(overlay):
    c = container(overlay)
    stage = dockerfile_app_stage(overlay)
    entry = json.loads(stage["ENTRYPOINT"][-1])
    assert entry[-2:] == PROBE[:2], f"Dockerfile.{overlay} ENTRYPOINT {entry}"  # after tini's --
    # httpGet on the supervisor's probe port, the one the image sets: no process per probe.
    probe_port = int(re.search(r"INTEL_VLLM_PROBE_PORT=(\d+)", " ".join(stage["ENV"])).group(1))
    assert "INTEL_VLLM_PROBE_PORT" not in env(c)  # nothing may move it away from the probes
    for name, path in (
        ("startupProbe", "/ready"),
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/live"),
    ):  # covers loading; fails while draining; holds
        assert c[name]["httpGet"] == {"path": path, "port": probe_port}, name
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == entry[-2]
    # The image's HEALTHCHECK and compose's healthcheck run the same readiness command.
    assert stage["HEALTHCHECK"][-1].split("CMD", 1)[1].strip() == json.dumps(PROBE + ["ready"])
    for svc in vllm_services().values():
        assert svc["healthcheck"]["test"] == ["CMD", *PROBE, "ready"]
    # The startup budget covers at least the image's HEALTHCHECK start period (model loading).
    start_period = int(re.search(r"--start-period=(\d+)s", stage["HEALTHCHECK"][-1]).group(1))
    sp = c["startupProbe"]
    assert sp["periodSeconds"] * sp["failureThreshold"] >= start_period


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_exec_form_only(overlay):
    """The image's ENTRYPOINT stays (tini as PID 1, entrypoint.py its child): no `command:`
    override, no shell anywhere."""
    c = container(overlay)
    assert "command" not in c, "keep the image's ENTRYPOINT (tini, then entrypoint.py)"
    hooks = [c["lifecycle"]["preStop"]["exec"]["command"]]
    assert not any("exec" in c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    for argv in hooks + [c.get("args", [])]:
        assert argv and not {"sh", "bash", "dash"} & {a.rsplit("/", 1)[-1] for a in argv}, argv


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_port_agrees_with_image_and_compose(overlay):
    docs = render(overlay)
    c = container(overlay)
    ports = {p["name"]: p for p in c["ports"]}
    assert sorted(ports) == ["http", "probes"]
    port = ports["http"]
    assert port["containerPort"] == 8000
    # the probe port: the image's INTEL_VLLM_PROBE_PORT, asked by the probes, scraped for metrics
    assert ports["probes"]["containerPort"] == int(dockerfile_env(overlay)["INTEL_VLLM_PROBE_PORT"])
    assert dockerfile_app_stage(overlay)["EXPOSE"] == ["8000"]
    svc = one(docs, "Service")["spec"]["ports"][0]
    assert svc["targetPort"] in (port["name"], port["containerPort"]) and svc["port"] == 8000
    for s in vllm_services().values():
        assert all(p.endswith(":8000") for p in s["ports"])
    # The probes reach the server on the entrypoint's default port: nothing may move it.
    assert "INTEL_VLLM_PORT" not in env(c) and "--port" not in c.get("args", [])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_user_and_security_context(overlay):
    spec, c = pod_spec(overlay), container(overlay)
    assert dockerfile_app_stage(overlay)["USER"] == [f"{UID}:{UID}"]
    assert f"--uid {UID}" in (ROOT / "docker" / "create-user.sh").read_text()
    psc, csc = spec["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == psc["runAsGroup"] == psc["fsGroup"] == UID
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"]["drop"] == ["ALL"] and "add" not in csc["capabilities"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_writable_paths_are_empty_dirs_and_shm_is_memory(overlay):
    spec, c = pod_spec(overlay), container(overlay)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    assert set(mounts) == WRITABLE
    assert all("emptyDir" in v and v["emptyDir"].get("sizeLimit") for v in mounts.values())
    shm = mounts["/dev/shm"]["emptyDir"]
    assert shm["medium"] == "Memory"
    # The same size compose gives the container (shm_size).
    for s in vllm_services().values():
        assert gi(compose_default(s["shm_size"])) == gi(shm["sizeLimit"])
    # And it fits in the memory limit it is counted against.
    assert gi(c["resources"]["limits"]["memory"]) > gi(shm["sizeLimit"])
    # The image's default model lives in the read-only root, where the image puts it.
    model = [v for v in dockerfile_app_stage(overlay)["ENV"] if "INTEL_VLLM_MODEL=" in v]
    assert model and "/opt/vllm-intel/models/tiny-llama" in model[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_device_and_resources(overlay):
    c = container(overlay)
    assert env(c)["INTEL_VLLM_DEVICE"] == overlay
    gpus = {k for k in c["resources"].get("limits", {}) if k.startswith("gpu.intel.com/")}
    if overlay == "xpu":
        assert gpus and gpus <= {"gpu.intel.com/i915", "gpu.intel.com/xe"}
        assert c["image"].endswith(":xpu")
    else:
        assert not gpus and c["image"].endswith(":cpu")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_standard_labels_and_selectors(overlay):
    docs = render(overlay)
    version = (ROOT / "VLLM_VERSION").read_text().strip()
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "vllm-intel"
        assert labels["app.kubernetes.io/instance"] == f"vllm-intel-{overlay}"
        assert labels["app.kubernetes.io/version"] == version
        assert {
            "app.kubernetes.io/component",
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
        } <= set(labels)
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for selector in (
        one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
        one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(docs, "Service")["spec"]["selector"],
    ):
        assert selector.items() <= pod_labels.items()
        assert selector["app.kubernetes.io/instance"] == f"vllm-intel-{overlay}"


def test_compose_vllm_services_are_hardened_like_the_pod():
    """What the pod's securityContext drops, every compose service drops too (monitoring's)."""
    for name, svc in compose()["services"].items():
        assert svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert int(compose_default(str(svc["pids_limit"]))) >= 1024, name


def test_network_policy_example_renders_validates_and_selects_the_pods(tmp_path):
    """The example component on the cpu overlay: strict-valid, it selects the Deployment's pods,
    and the ports it lets in are the server's and the probe port the probes use."""
    out_text = render_with_component(tmp_path, "network-policy")
    validate_strict(tmp_path / "all.yaml", 4)
    docs = [d for d in yaml.safe_load_all(out_text) if d]
    policy, deploy = one(docs, "NetworkPolicy"), one(docs, "Deployment")
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    probe_ports = {c[p]["httpGet"]["port"] for p in ("readinessProbe", "livenessProbe")}
    served = {p["containerPort"] for p in c["ports"]}
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert allowed == served | {named.get(p, p) for p in probe_ports}, (allowed, served)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_compile_cache_component_keeps_every_compile_cache_on_its_claim(overlay, tmp_path):
    """components/compile-cache: strict-valid on both overlays; the pod's cache volume is the
    claim and no longer an emptyDir; every cache the image compiles into lies under its mount."""
    out_text = render_with_component(tmp_path, "compile-cache", overlay=overlay)
    validate_strict(tmp_path / "all.yaml", 4)
    docs = [d for d in yaml.safe_load_all(out_text) if d]
    claim, spec = one(docs, "PersistentVolumeClaim"), one(docs, "Deployment")["spec"]
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    (c,) = spec["template"]["spec"]["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "cache"]
    cache = volumes["cache"]
    assert cache == {
        "name": "cache",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
    }, cache
    compiled = [
        str(paths.inductor_cache({"XDG_CACHE_HOME": "/home/vllm/.cache"})),
        *(xpu_cache_dirs().values() if overlay == "xpu" else ()),
    ]
    assert all(d.startswith(mount["mountPath"] + "/") for d in compiled), (mount, compiled)
    # A ReadWriteOnce claim with a surge rollout stalls (the surge pod waits for the volume on
    # another node, the old pod for the surge pod): the claim's mode and the strategy go together.
    surge = spec["strategy"]["rollingUpdate"]["maxSurge"]
    assert "ReadWriteMany" in claim["spec"]["accessModes"] or surge == 0, (claim, surge)


def test_compile_cache_and_hf_model_components_together(tmp_path):
    """Both components: the HF cache keeps its own claim, mounted inside the compile cache's."""
    out_text = render_with_component(tmp_path, "compile-cache", "hf-model")
    docs = [d for d in yaml.safe_load_all(out_text) if d]
    claims = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert claims == ["compile-cache", "hf-cache"]
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert (
        volumes[mounts["/home/vllm/.cache"]]["persistentVolumeClaim"]["claimName"]
        == "compile-cache"
    )
    hf = mounts["/home/vllm/.cache/huggingface"]
    assert volumes[hf]["persistentVolumeClaim"]["claimName"] == "hf-cache"
