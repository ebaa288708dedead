""".buildkite/: the pipeline passes Buildkite's schema, its steps are scripts that exist and call the
project's scripts (one copy of each command), and the retry-on-network-error contract holds."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .manifests import ROOT

PIPELINE = ROOT / ".buildkite" / "pipeline.yml"
STEPS = ROOT / ".buildkite" / "steps"


def steps() -> list[dict]:
    return yaml.safe_load(PIPELINE.read_text())["steps"]


def test_pipeline_schema():
    exe = Path(sys.executable).parent / "check-jsonschema"
    out = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.buildkite", str(PIPELINE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_step_has_queue_timeout_and_network_retry():
    exit_network = int(re.search(r"^EXIT_NETWORK=(\d+)", (STEPS / "lib.sh").read_text(), re.M)[1])
    for step in steps():
        assert step["agents"]["queue"] in ("intel-cpu", "intel-gpu"), step["label"]
        assert 0 < step["timeout_in_minutes"] <= 180, step["label"]
        statuses = {r.get("exit_status") for r in step["retry"]["automatic"]}
        assert {exit_network, -1} <= statuses, step["label"]


def test_step_commands_are_scripts_or_make_targets():
    makefile = (ROOT / "Makefile").read_text()
    queues = {}
    for step in steps():
        cmd = step["command"]
        if cmd.startswith("make "):
            assert re.search(rf"^{cmd.split()[1]}:", makefile, re.M), cmd
        else:
            path = ROOT / cmd
            assert path.parent == STEPS and path.is_file(), cmd
            assert path.stat().st_mode & 0o111, f"{cmd} is not executable"
        queues[cmd] = step["agents"]["queue"]
    assert queues[".buildkite/steps/cpu.sh"] == "intel-cpu"
    assert queues[".buildkite/steps/xpu.sh"] == "intel-gpu"
    # Building the XPU image needs network, not a GPU: it runs on CPU agents, before the GPU step.
    assert queues[".buildkite/steps/xpu-build.sh"] == "intel-cpu"
    # The soak runs nightly (scheduled builds), not on every push.
    soak = next(s for s in steps() if s["command"] == ".buildkite/steps/soak.sh")
    assert soak["agents"]["queue"] == "intel-cpu" and "schedule" in soak["if"]
    assert re.search(r"^\s*network_retryable make soak\b", (STEPS / "soak.sh").read_text(), re.M)
    # `make buildkite-local` runs exactly the CPU step.
    assert re.search(r"^buildkite-local:.*\n\t@?\.buildkite/steps/cpu\.sh$", makefile, re.M)


@pytest.mark.parametrize("script", sorted(p.name for p in STEPS.glob("*.sh")))
def test_step_scripts_parse_and_reuse_project_scripts(script):
    text = (STEPS / script).read_text()
    subprocess.run(["bash", "-n", str(STEPS / script)], check=True)
    # One copy of each command: images are built only by scripts/build-image.sh.
    assert not re.search(r"\bdocker\"?\s+(build|buildx)\b", text), script
    if script in ("cpu.sh", "xpu.sh"):
        assert "setup_step" in text and "smoke.sh" in text
    if script == "cpu.sh" or script == "xpu-lib.sh":
        assert "scripts/build-image.sh" in text
    if script in ("xpu.sh", "xpu-build.sh"):
        assert "xpu-lib.sh" in text and "build_xpu_images" in text and "in_image_tests" in text


def test_xpu_jobs_cover_every_release_of_the_recipe_table():
    """One XPU build step and one GPU step per release of docker/xpu-releases.toml; each GPU step
    waits for its own release's build only (a failed build of one release blocks no other)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import xpu_recipe

    by_script: dict[str, dict[str, dict]] = {}
    for step in steps():
        if step["command"] in (".buildkite/steps/xpu-build.sh", ".buildkite/steps/xpu.sh"):
            by_script.setdefault(step["command"], {})[step["env"]["VLLM_VERSION"]] = step
    builds, gpus = by_script[".buildkite/steps/xpu-build.sh"], by_script[".buildkite/steps/xpu.sh"]
    assert list(builds) == list(gpus) == xpu_recipe.versions()
    for version in xpu_recipe.versions():
        assert gpus[version]["depends_on"] == builds[version]["key"], version
        assert version in builds[version]["label"] and version in gpus[version]["label"]


def test_registry_login_uses_the_agents_secret(tmp_path):
    """Every step's setup_step, with REGISTRY_USER/REGISTRY_PASSWORD, logs in before anything
    else touches Docker (password on stdin, never on the command line); without them it says
    pulls are anonymous and goes on. The engine is the agent's own here (use_engine stubbed)."""
    shim = tmp_path / "docker"
    shim.write_text('#!/bin/sh\necho "$*" >>"$0.calls"; [ "$1" != login ] || cat >>"$0.stdin"\n')
    shim.chmod(0o755)
    base = {"PATH": "/usr/bin:/bin", "VLLM_INTEL_CI_LOGS": str(tmp_path), "DOCKER": str(shim)}
    step = f'source "{STEPS}/lib.sh"; use_engine() {{ :; }}; release_engine() {{ :; }}; setup_step'
    run = functools.partial(
        subprocess.run,
        ["bash", "-c", step],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = tmp_path / "docker.calls"
    r = run(env=base)
    assert r.returncode == 0 and "anonymous" in r.stderr, r.stderr
    assert "login" not in calls.read_text()
    calls.unlink()
    r = run(
        env=dict(base, REGISTRY_USER="ci-bot", REGISTRY_PASSWORD="s3cret", REGISTRY="reg.example")
    )
    assert r.returncode == 0, r.stderr
    first = calls.read_text().splitlines()[0]
    assert first == "login --username ci-bot --password-stdin reg.example"
    assert (tmp_path / "docker.stdin").read_text() == "s3cret"


def test_network_errors_map_to_the_retried_exit_status(tmp_path):
    def _lib(snippet: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", f'source "{STEPS}/lib.sh"; {snippet}'],
            env={"PATH": "/usr/bin:/bin", "VLLM_INTEL_CI_LOGS": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    r = _lib("network_retryable bash -c 'echo \"Temporary failure in name resolution\"; exit 1'")
    assert r.returncode == 75, r.stdout + r.stderr
    r = _lib("network_retryable bash -c 'echo \"AssertionError: test failed\"; exit 3'")
    assert r.returncode == 3, r.stdout + r.stderr
    r = _lib("network_retryable true; echo after")
    assert r.returncode == 0 and "after" in r.stdout
