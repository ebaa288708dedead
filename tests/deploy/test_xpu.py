"""XPU device access with the shipped defaults, checked without a GPU or a Docker engine:

- compose: after the one documented step (`make xpu-env` = scripts/render-gid.sh) the shipped
  .env.example resolves a numeric render gid, the /dev/dri/by-path mount and the XPU start period;
  scripts/compose.sh refuses to start vllm-xpu without a numeric gid (one line, exit 64);
- scripts/render-gid.sh against a fake /dev/dri (files chgrp'ed to chosen gids);
- Kubernetes: the xpu and xpu-xe overlays request their GPU resource, add the node's render gid,
  keep every run-time compile cache of the XPU image on a writable volume, and wait long enough
  for a first JIT compile.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from .manifests import (
    ROOT,
    XPU_CACHE_ENV,
    XPU_OVERLAYS,
    compose,
    compose_default,
    container,
    dockerfile_env,
    env,
    pod_spec,
    render,
    render_text,
    xpu_cache_dirs,
)

COMPOSE_SH = ROOT / "scripts" / "compose.sh"
RENDER_GID = ROOT / "scripts" / "render-gid.sh"
BY_PATH = "/dev/dri/by-path"
ROOT_USER = os.geteuid() == 0


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the settings a developer may have exported, and with a
    Docker host that does not exist: nothing here may reach a real engine, even when a check is
    broken."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INTEL_VLLM_", "COMPOSE_", "DOCKER_"))
    }
    return {**keep, "DOCKER_HOST": "unix:///nonexistent/vllm-intel-test.sock", **extra}


def run(cmd: list[str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], env=clean_env(**extra), capture_output=True, text=True, timeout=120
    )


def one_line_error(out: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {out.stderr!r}"
    for w in words:
        assert w in lines[0], lines[0]


def seconds(v) -> float:
    """A compose duration as `config` renders it (Go: "10m0s") or as written ("600s")."""
    return sum(
        float(n) * {"h": 3600, "m": 60, "s": 1}[u]
        for n, u in re.findall(r"([\d.]+)([hms])", str(v))
    )


def fake_dri(tmp: pathlib.Path, gids: list[int], by_path: bool = True) -> pathlib.Path:
    """A /dev/dri stand-in: renderD128.. owned by the given gids (plus a card0 the script must ignore)."""
    dri = tmp / "dri"
    dri.mkdir()
    (dri / "card0").touch()
    os.chown(dri / "card0", -1, 0)
    for i, gid in enumerate(gids):
        node = dri / f"renderD{128 + i}"
        node.touch()
        os.chown(node, -1, gid)
    if by_path:
        (dri / "by-path").mkdir()
    return dri


def xpu_env(dri: pathlib.Path, envfile: pathlib.Path) -> subprocess.CompletedProcess:
    return run([RENDER_GID], INTEL_VLLM_DRI_DIR=str(dri), INTEL_VLLM_ENV_FILE=str(envfile))


def compose_config(envfile: pathlib.Path) -> dict:
    out = run([COMPOSE_SH, "--env-file", envfile, "--profile", "xpu", "config", "--format", "json"])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


needs_root = pytest.mark.skipif(not ROOT_USER, reason="chgrp to arbitrary gids needs root")
# Docker's group_add: a number is used as is; a name is looked up in the container's /etc/group.
GID = 4242


# --- compose --------------------------------------------------------------------------------------


@needs_root
def test_shipped_env_example_after_xpu_env_resolves_device_access(tmp_path):
    envfile = tmp_path / ".env"
    shutil.copy(ROOT / ".env.example", envfile)
    out = xpu_env(fake_dri(tmp_path, [GID]), envfile)
    assert out.returncode == 0, out.stderr
    svc = compose_config(envfile)["services"]["vllm-xpu"]
    assert svc["group_add"] == [str(GID)]
    assert {"source": "/dev/dri", "target": "/dev/dri", "permissions": "rwm"} in svc["devices"]
    by_path = [v for v in svc["volumes"] if v["target"] == BY_PATH]
    assert by_path and by_path[0]["type"] == "bind" and by_path[0]["source"] == BY_PATH
    assert by_path[0].get("read_only") is True
    # The models mount of the shared anchor is still there (the XPU list replaces, not extends, it).
    assert any(v["target"] == "/models" for v in svc["volumes"])


def test_xpu_start_period_fits_a_first_jit_compile(tmp_path):
    envfile = tmp_path / ".env"
    shutil.copy(ROOT / ".env.example", envfile)
    svcs = compose_config(envfile)["services"]
    xpu, cpu = (seconds(svcs[s]["healthcheck"]["start_period"]) for s in ("vllm-xpu", "vllm-cpu"))
    assert xpu >= 600 and xpu > cpu, (xpu, cpu)
    # .env.example shows compose.yaml's default, not another value.
    raw = compose()["services"]["vllm-xpu"]["healthcheck"]
    assert seconds(compose_default(raw["start_period"])) == xpu
    # The XPU healthcheck is the shared one but for the start period.
    assert {k: v for k, v in svcs["vllm-xpu"]["healthcheck"].items() if k != "start_period"} == {
        k: v for k, v in svcs["vllm-cpu"]["healthcheck"].items() if k != "start_period"
    }


def test_shipped_env_example_holds_no_gid():
    """No number is right on every host; the documented step writes the host's."""
    lines = [
        ln
        for ln in (ROOT / ".env.example").read_text().splitlines()
        if ln.startswith("INTEL_VLLM_RENDER_GID=")
    ]
    assert lines == ["INTEL_VLLM_RENDER_GID="]


@pytest.mark.parametrize(
    "args",
    [
        ["--profile", "xpu", "up", "-d", "--wait", "vllm-xpu"],
        ["--profile=xpu", "up", "-d"],
        ["run", "--rm", "vllm-xpu"],
        ["--profile", "xpu", "create"],
    ],
    ids=lambda a: " ".join(a),
)
@pytest.mark.parametrize(
    "value", [None, "", "render", "99x"], ids=["unset", "empty", "name", "junk"]
)
def test_compose_sh_refuses_to_start_xpu_without_numeric_gid(args, value, tmp_path):
    envfile = tmp_path / ".env"
    shutil.copy(ROOT / ".env.example", envfile)  # shipped, before `make xpu-env`
    extra = {} if value is None else {"INTEL_VLLM_RENDER_GID": value}
    out = run([COMPOSE_SH, "--env-file", envfile, *args], **extra)
    said = (
        f"INTEL_VLLM_RENDER_GID={value} is not a numeric gid"
        if value
        else "INTEL_VLLM_RENDER_GID is not set"
    )
    one_line_error(out, 64, said, "make xpu-env")


def test_compose_sh_sees_the_profile_in_compose_profiles(tmp_path):
    envfile = tmp_path / ".env"
    shutil.copy(ROOT / ".env.example", envfile)
    out = run([COMPOSE_SH, "--env-file", envfile, "up", "-d"], COMPOSE_PROFILES="foo,xpu")
    one_line_error(out, 64, "INTEL_VLLM_RENDER_GID")


def test_compose_sh_reads_the_gid_from_the_env_file(tmp_path):
    envfile = tmp_path / ".env"
    envfile.write_text("INTEL_VLLM_RENDER_GID=render\n")
    out = run([COMPOSE_SH, "--env-file", envfile, "--profile", "xpu", "up", "-d"])
    one_line_error(out, 64, "INTEL_VLLM_RENDER_GID=render")


@pytest.mark.parametrize(
    "args, extra",
    [
        (["--profile", "xpu", "up", "-d", "vllm-xpu"], {"INTEL_VLLM_RENDER_GID": str(GID)}),
        (["up", "-d"], {}),  # the CPU service needs no gid
        (["--profile", "xpu", "config", "--quiet"], {}),  # scripts/lint.sh validates the defaults
    ],
    ids=["numeric", "cpu", "config"],
)
def test_compose_sh_lets_the_rest_through(args, extra, tmp_path):
    envfile = tmp_path / ".env"
    shutil.copy(ROOT / ".env.example", envfile)
    out = run([COMPOSE_SH, "--env-file", envfile, *args], **extra)
    assert "render-gid:" not in out.stderr, out.stderr
    if "config" in args:
        assert out.returncode == 0, out.stderr
    else:  # it got as far as Docker: the engine does not exist on purpose
        assert out.returncode not in (0, 64) and "nonexistent" in out.stderr, out.stderr


# --- scripts/render-gid.sh ------------------------------------------------------------------------


@needs_root
def test_render_gid_replaces_an_existing_value(tmp_path):
    envfile = tmp_path / ".env"
    envfile.write_text("A=1\nexport INTEL_VLLM_RENDER_GID=render\nB=2\n")
    out = xpu_env(fake_dri(tmp_path, [GID, GID]), envfile)
    assert out.returncode == 0, out.stderr
    assert envfile.read_text() == f"A=1\nINTEL_VLLM_RENDER_GID={GID}\nB=2\n"


@needs_root
def test_render_gid_appends_and_creates(tmp_path):
    dri = fake_dri(tmp_path, [GID])
    envfile = tmp_path / ".env"
    envfile.write_text("A=1\n")
    assert xpu_env(dri, envfile).returncode == 0
    assert envfile.read_text() == f"A=1\nINTEL_VLLM_RENDER_GID={GID}\n"
    # No .env yet: made from .env.example, the gid filled in.
    fresh = tmp_path / "fresh.env"
    assert xpu_env(dri, fresh).returncode == 0
    example = (ROOT / ".env.example").read_text()
    assert fresh.read_text() == example.replace(
        "\nINTEL_VLLM_RENDER_GID=\n", f"\nINTEL_VLLM_RENDER_GID={GID}\n"
    )


def test_render_gid_without_render_node(tmp_path):
    dri = tmp_path / "dri"
    dri.mkdir()
    (dri / "card0").touch()
    envfile = tmp_path / ".env"
    out = xpu_env(dri, envfile)
    one_line_error(out, 66, "renderD")
    assert not envfile.exists()


@needs_root
def test_render_gid_with_render_nodes_of_different_groups(tmp_path):
    envfile = tmp_path / ".env"
    out = xpu_env(fake_dri(tmp_path, [GID, GID + 1]), envfile)
    one_line_error(out, 65, str(GID), str(GID + 1))
    assert not envfile.exists()


@needs_root
def test_render_gid_warns_without_by_path(tmp_path):
    out = xpu_env(fake_dri(tmp_path, [GID], by_path=False), tmp_path / ".env")
    assert out.returncode == 0 and "by-path" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "value, code", [("992", 0), ("0", 0), ("", 64), ("render", 64), ("-1", 64), ("9 9", 64)]
)
def test_render_gid_check(value, code):
    out = run([RENDER_GID, "check", value])
    if code:
        one_line_error(out, code, "INTEL_VLLM_RENDER_GID")
    else:
        assert out.returncode == 0 and not out.stderr


def test_documented_exit_codes():
    """The codes the tests above require are the ones the script and docs/deploy.md state."""
    head = RENDER_GID.read_text().split("set -euo", 1)[0]
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for code in (64, 65, 66):
        assert re.search(rf"#\s+{code}\s", head), code
        assert f"`{code}`" in docs, code


# --- Kubernetes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["xpu-xe"])
@pytest.mark.parametrize("version", ("1.29", None), ids=lambda v: v or "latest")
def test_xe_overlay_validates_strict(overlay, version, tmp_path):
    # The xpu overlay runs through test_k8s.py's parametrised checks; this one adds its variant.
    assert sorted(d["kind"] for d in render(overlay)) == [
        "Deployment",
        "PodDisruptionBudget",
        "Service",
    ]
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(render_text(overlay))
    cmd = [sys.executable, "-m", "kubernetes_validate", "--strict"] + (
        ["-k", version] if version else []
    )
    out = subprocess.run(cmd + [str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.count("passed") == 3, out.stdout + out.stderr


def test_lint_renders_every_overlay():
    lint = (ROOT / "scripts" / "lint.sh").read_text()
    for overlay in ("cpu", *XPU_OVERLAYS):
        assert f"deploy/k8s/{overlay} " in lint or f"deploy/k8s/{overlay};" in lint, overlay


@pytest.mark.parametrize("overlay, resource", XPU_OVERLAYS.items())
def test_gpu_resource_in_requests_and_limits(overlay, resource):
    res = container(overlay)["resources"]
    for kind in ("requests", "limits"):
        gpus = {k: v for k, v in res[kind].items() if k.startswith("gpu.intel.com/")}
        assert gpus == {resource: "1"}, (kind, gpus)


@pytest.mark.parametrize("overlay", XPU_OVERLAYS)
def test_node_render_gid_is_a_supplemental_group(overlay):
    psc = pod_spec(overlay)["securityContext"]
    groups = psc.get("supplementalGroups")
    assert groups and all(
        isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in groups
    ), groups
    # Added to the base's securityContext, not instead of it.
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001
    # The placeholder says it is one, and how to find the real value.
    patch = (ROOT / "deploy" / "k8s" / "xpu" / "deployment-patch.yaml").read_text()
    assert "PLACEHOLDER" in patch and "stat -c %g /dev/dri/renderD128" in patch


def test_cpu_overlay_has_no_gpu_groups():
    assert "supplementalGroups" not in pod_spec("cpu")["securityContext"]


@pytest.mark.parametrize("overlay", XPU_OVERLAYS)
def test_xpu_compile_caches_are_on_writable_volumes(overlay):
    """Triton, SYCL and NEO write compiled kernels at run time; with readOnlyRootFilesystem each
    cache directory must lie under a writable volume mount."""
    spec, c = pod_spec(overlay), container(overlay)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = [
        m["mountPath"]
        for m in c["volumeMounts"]
        if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]
    ]
    image = dockerfile_env("xpu")
    paths = {**xpu_cache_dirs(), **{k: v for k, v in image.items() if k.endswith("_CACHE_DIR")}}
    paths.update({k: v for k, v in env(c).items() if k in paths})  # the pod's env wins
    assert set(XPU_CACHE_ENV) <= set(paths)
    for name, path in paths.items():
        p = pathlib.PurePosixPath(path)
        assert p.is_absolute() and ".." not in p.parts, (name, path)
        assert any(p.is_relative_to(m) for m in writable), f"{name}={path} is not under {writable}"


def test_xpu_startup_budget_fits_a_first_jit_compile():
    def budget(overlay):
        sp = container(overlay)["startupProbe"]
        return sp["periodSeconds"] * sp["failureThreshold"]

    compose_xpu = seconds(
        compose_default(compose()["services"]["vllm-xpu"]["healthcheck"]["start_period"])
    )
    for overlay in XPU_OVERLAYS:
        assert budget(overlay) > budget("cpu") and budget(overlay) >= compose_xpu, overlay
