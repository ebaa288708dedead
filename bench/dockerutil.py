"""The Docker engine for the idle and image sections: found by scripts/docker-engine.sh status."""

from __future__ import annotations

import os
import subprocess

from .common import ROOT

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")  # the Debian CLI builds with BuildKit
IMAGE = os.environ.get("INTEL_VLLM_CPU_IMAGE", "vllm-intel:cpu")


def engine() -> tuple[str | None, str]:
    """(DOCKER_HOST, "") if an engine answers and IMAGE exists, else (None, why not)."""
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "docker-engine.sh"), "status"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        return None, "no Docker engine answers (scripts/docker-engine.sh status)"
    host = r.stdout.strip().splitlines()[-1]
    os.environ["DOCKER_HOST"] = host
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        return None, f"image {IMAGE} is not built (make build-cpu)"
    return host, ""


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=check
    )
