"""A user's own model through entrypoint.py with real vLLM CPU, offline: a Hugging Face hub cache
(models--ORG--NAME/snapshots/<rev>, refs/main, blobs) filled by `prefetch` and served by repo id,
as the image's HF_HOME volume holds it. A model directory mounted elsewhere and named by
INTEL_VLLM_MODEL: tests/container/test_real_shape.py (the image, /models/m)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from tests.harness import ROOT
from tests.harness.fakehub import FakeHub
from tests.harness.models import REPO, REVISION

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def complete(s, model: str) -> dict:
    r = requests.post(
        s.url + "/v1/completions",
        json={"model": model, "prompt": "def main(", "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_hub_cache_served_by_repo_id_offline(serve, tiny_model, tmp_path):
    """The Kubernetes sequence on one machine: `prefetch` (the init container) fills HF_HOME from a
    hub (a local one, tests/harness/fakehub.py: the real huggingface_hub download path), the hub
    goes away, and `serve` finds the repo id in the cache with HF_HUB_OFFLINE=1."""
    hf_home = tmp_path / "hf"  # the image's HF_HOME; the hub cache is HF_HOME/hub
    env = {"HF_HOME": str(hf_home), "INTEL_VLLM_MODEL": REPO}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "INTEL_VLLM_"))}
    prefetch = [sys.executable, str(ROOT / "entrypoint.py"), "prefetch"]
    with FakeHub(tiny_model, REPO) as hub:
        online = {**clean, **env, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url}
        pre = subprocess.run(prefetch, env=online, capture_output=True, text=True, timeout=120)
    assert pre.returncode == 0 and f"prefetch: {REPO} complete" in pre.stderr, pre.stderr
    repo = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    assert (repo / "refs" / "main").read_text() == REVISION
    assert (repo / "snapshots" / REVISION / "config.json").is_symlink()  # -> ../../blobs/<hash>
    # Offline now (SERVE_ENV sets HF_HUB_OFFLINE=1 for the server; the hub is gone anyway).
    offline = subprocess.run(
        prefetch, env={**clean, **env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True
    )
    assert offline.returncode == 0 and "HF_HUB_OFFLINE is set" in offline.stderr
    s = serve("--enforce-eager", model="", env=env)
    assert s.model == REPO
    assert complete(s, REPO)["usage"]["completion_tokens"] == 8
    assert "downloading" not in s.text()  # offline: no progress logger
    assert [p.name for p in (repo / "snapshots").iterdir()] == [REVISION]
