"""The Docker engine for the idle and image sections: found by scripts/docker-engine.sh status."""

from __future__ import annotations

import os
import subprocess

from tests.harness import docker

from .common import ROOT

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
