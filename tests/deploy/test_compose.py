"""compose.yaml and compose.replicas.yaml as Compose itself renders them (`scripts/compose.sh
config`), against the Kubernetes manifests: the same hardening, the same writable paths, and
replicas that share nothing they could both write at once."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile

import pytest

from tests.deploy.manifests import container, pod_spec
from tests.harness import ROOT

VLLM_SERVICES = ("vllm-cpu", "vllm-xpu")
CACHE = "/home/vllm/.cache"
HF_HOME = CACHE + "/huggingface"


@functools.cache
def rendered(*files: str) -> dict:
    """`compose config` of these files with the defaults: no INTEL_VLLM_* from the caller's
    environment and an empty env file instead of a developer's .env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTEL_VLLM_")}
    env.update(INTEL_VLLM_RENDER_GID="44")  # the XPU service refuses to render without one
    with tempfile.NamedTemporaryFile("w", suffix=".env") as empty:
        # compose.sh always reads compose.yaml first; the others layer on it
        args = [a for f in files if f != "compose.yaml" for a in ("-f", str(ROOT / f))]
        args += ["--env-file", empty.name]
        out = subprocess.run(
            ["bash", str(ROOT / "scripts" / "compose.sh"), *args, "--profile", "xpu", "config",
             "--format", "json"],
            env=env, capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
        )  # fmt: skip
    return json.loads(out.stdout)


def writable(svc: dict) -> dict[str, str]:
    """Path -> what makes it writable in the container (tmpfs, volume, bind, shm)."""
    out = {t.split(":", 1)[0]: "tmpfs" for t in svc.get("tmpfs", [])}
    for v in svc.get("volumes", []):
        if not v.get("read_only"):
            out[v["target"]] = v["type"]
    if svc.get("shm_size"):
        out["/dev/shm"] = "shm"
    return out


@pytest.mark.parametrize("name", VLLM_SERVICES)
def test_compose_hardening_equals_the_manifests(name):
    svc = rendered("compose.yaml")["services"][name]
    csc = container("cpu")["securityContext"]
    assert svc["read_only"] is (csc["readOnlyRootFilesystem"] is True) is True
    assert svc["cap_drop"] == csc["capabilities"]["drop"] == ["ALL"]
    assert "no-new-privileges:true" in svc["security_opt"]
    assert csc["allowPrivilegeEscalation"] is False
    assert int(svc["pids_limit"]) > 0
    # What the read-only root leaves writable: every path the pod mounts writable, and no more.
    k8s = {m["mountPath"] for m in container("cpu")["volumeMounts"]}
    assert set(writable(svc)) == k8s | {HF_HOME}, writable(svc)
    assert writable(svc)["/tmp"] == "tmpfs" and writable(svc)[CACHE] == "volume"
    # The usage report would write to ~/.config, which is read-only: off, as in the manifests.
    env = {e["name"]: e["value"] for e in container("cpu")["env"]}
    for var in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        assert svc["environment"][var] == env[var] == "1"


def test_tmp_is_writable_by_anyone_and_executable():
    """/tmp as the image has it (1777): the run directory, vLLM's sockets, the state file; exec,
    as a Kubernetes emptyDir is (Docker's tmpfs default is noexec)."""
    for name in VLLM_SERVICES:
        (tmp,) = [
            t for t in rendered("compose.yaml")["services"][name]["tmpfs"] if t[:5] == "/tmp:"
        ]
        opts = tmp.split(":", 1)[1].split(",")
        assert "mode=1777" in opts and "exec" in opts and any(o.startswith("size=") for o in opts)
    assert pod_spec("cpu")["volumes"]


def test_replicas_share_no_compile_cache_and_keep_every_other_mount():
    base = rendered("compose.yaml")["services"]["vllm-cpu"]
    reps = rendered("compose.yaml", "compose.replicas.yaml")["services"]["vllm-cpu"]
    # compose.yaml's shared cache volume is a per-replica tmpfs, owned by the image's user.
    assert writable(base)[CACHE] == "volume" and writable(reps)[CACHE] == "tmpfs"
    (cache,) = [t for t in reps["tmpfs"] if t.startswith(CACHE + ":")]
    assert {"uid=10001", "gid=10001", "exec"} <= set(cache.split(":", 1)[1].split(","))
    # Everything else as in compose.yaml (the replicas file repeats them: !override).
    same = [v for v in base["volumes"] if v["target"] != CACHE]
    assert reps["volumes"] == same
    assert [t for t in reps["tmpfs"] if not t.startswith(CACHE + ":")] == base["tmpfs"]
    assert reps["read_only"] is True
