"""A user's own model through entrypoint.py with real vLLM CPU, offline: a model directory
mounted somewhere else than the built-in one (named by INTEL_VLLM_MODEL), and a Hugging Face
hub cache (models--ORG--NAME/snapshots/<rev>, refs/main) served by repo id, as the image's
HF_HOME volume holds it after a prefetch or an earlier download."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from tests.harness import ROOT
from tests.harness.models import REPO, REVISION, copy_model, hub_layout

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def complete(s, model: str) -> dict:
    r = requests.post(
        s.url + "/v1/completions",
        json={"model": model, "prompt": "def main(", "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_model_from_a_mounted_directory(serve, tiny_model, tmp_path):
    """Not the built-in path: a copy under another name, chosen by INTEL_VLLM_MODEL (what compose
    and the Kubernetes overlays set), with no model argument."""
    mine = copy_model(tiny_model, tmp_path / "models" / "my-llama")
    s = serve("--enforce-eager", model="", env={"INTEL_VLLM_MODEL": str(mine)})
    assert s.model == str(mine)
    out = complete(s, s.model)
    assert out["usage"]["completion_tokens"] == 8
    assert "downloading" not in s.text()  # a local path: no progress logger


def test_hub_cache_served_by_repo_id_offline(serve, tiny_model, tmp_path):
    hf_home = tmp_path / "hf"  # the image's HF_HOME; the hub cache is HF_HOME/hub
    snap = hub_layout(tiny_model, hf_home / "hub", REPO)
    assert (snap / "config.json").is_symlink()
    env = {"HF_HOME": str(hf_home), "INTEL_VLLM_MODEL": REPO}  # HF_HUB_OFFLINE=1: SERVE_ENV
    # The init container's step: a no-op while offline, whatever the cache holds.
    pre = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "prefetch"],
        env={**env, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pre.returncode == 0 and "HF_HUB_OFFLINE is set" in pre.stderr, pre.stderr
    s = serve("--enforce-eager", model="", env=env)
    assert s.model == REPO
    assert complete(s, REPO)["usage"]["completion_tokens"] == 8
    # vLLM read the snapshot refs/main points at; nothing was written next to it.
    snapshots = hf_home / "hub" / ("models--" + REPO.replace("/", "--")) / "snapshots"
    assert [p.name for p in snapshots.iterdir()] == [REVISION]
