"""Fixtures for the image tests: a Docker engine, images built once per session, compose projects.

Everything goes through the project's scripts (scripts/docker-engine.sh, scripts/build-image.sh,
scripts/compose.sh), so the tests exercise exactly what the Makefile, CI and users run.
The engine is started if needed and left running (`make engine-stop` / .ci/run stop it).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from tests.harness import DEFAULT_VLLM, ROOT, build_image, docker, free_port, scripts_run
from vllm_intel.supervisor import timing


def run(
    cmd: list[str], timeout: float = 600, check: bool = True, **kw
) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def docker_host() -> str:
    host = run(["bash", str(ROOT / "scripts" / "docker-engine.sh"), "start"], timeout=300).stdout
    host = host.strip().splitlines()[-1]
    os.environ["DOCKER_HOST"] = host  # every docker / compose subprocess below uses it
    return host


@functools.cache
def _build(accelerator: str, version: str, target: str = "runtime") -> str:
    out, took = build_image(accelerator, version, target)
    if out.returncode != 0:
        pytest.fail(f"build-image.sh {accelerator} ({version}) failed:\n{out.stderr[-6000:]}")
    scripts_run.ran_in_build(out.stderr)
    _LOGS[(accelerator, version, target)] = out.stderr
    print(f"built {accelerator} {version} {target} in {took:.0f} s")
    if accelerator == "xpu-stand-in":
        return f"vllm/vllm-openai-xpu:v{version}"
    suffix = "" if target == "runtime" else f"-{target}"
    return f"vllm-intel:{accelerator}-{version}{suffix}"


_LOGS: dict[tuple[str, str, str], str] = {}


@pytest.fixture(scope="session")
def prometheus_image(docker_host) -> str:
    """vllm-intel:prometheus (docker/Dockerfile.prometheus), compose's `monitoring` profile."""
    out, took = build_image("prometheus")
    if out.returncode != 0:
        pytest.fail(f"build-image.sh prometheus failed:\n{out.stderr[-4000:]}")
    scripts_run.ran_in_build(out.stderr)
    print(f"built vllm-intel:prometheus in {took:.0f} s")
    return "vllm-intel:prometheus"


def xpu_default() -> str:
    """The XPU image's default release (docker/xpu-releases.toml), not the CPU image's."""
    r = run(["python3", str(ROOT / "scripts" / "xpu_recipe.py"), "default"], timeout=60)
    return r.stdout.strip()


@pytest.fixture(scope="session")
def xpu_image(docker_host):
    """Tag of the XPU default release's runtime image, built by its upstream route on the stand-in
    of upstream's image (tests/standins), the build's log (check-xpu-image.sh's lines) and the
    stand-in's tag."""
    version = xpu_default()
    stand_in = _build("xpu-stand-in", version)
    return _build("xpu", version), _LOGS[("xpu", version, "runtime")], stand_in


@pytest.fixture(scope="session")
def cpu_image(docker_host):
    """Factory: cpu_image("0.27.1") -> tag of the CPU image of that release (built once);
    target="test": its test image."""
    return lambda version=DEFAULT_VLLM, target="runtime": _build("cpu", version, target)


@pytest.fixture(scope="session")
def compile_cache(docker_host):
    """One host directory of compile caches (compose's and smoke.sh's INTEL_VLLM_CACHE) shared by
    the default release's containers that do not test a cold start: the first of them compiles,
    the next ones start warm (what that saves: docs/bench.md, "`make test` from nothing").
    The pytest run a Buildkite step starts (soak.sh: `make soak`) inherits it through the
    environment."""
    inherited = os.environ.get(COMPILE_CACHE_ENV)
    if inherited:
        yield pathlib.Path(inherited)
        return
    path = cache_dir(f"compile-cache-{os.getpid()}")
    os.environ[COMPILE_CACHE_ENV] = str(path)
    try:
        yield path
    finally:
        del os.environ[COMPILE_CACHE_ENV]
        shutil.rmtree(path, ignore_errors=True)


COMPILE_CACHE_ENV = "INTEL_VLLM_TEST_COMPILE_CACHE"


def cache_dir(name: str) -> pathlib.Path:
    """A new directory build/NAME that the image's user (uid 10001, docker/create-user.sh) may
    write: compile caches to mount at /home/vllm/.cache, as compose does with INTEL_VLLM_CACHE."""
    path = ROOT / "build" / name
    path.mkdir(parents=True)
    os.chown(path, 10001, 10001)
    return path


def holds_kernels(cache: pathlib.Path) -> bool:
    """A container compiled into this cache directory: torch inductor's built kernels are there
    (the image's TORCHINDUCTOR_CACHE_DIR is under it)."""
    return any((cache / "vllm-intel" / "torchinductor").rglob("*.so"))


class Compose:
    """One compose project (unique name and port) running the CPU service of one image."""

    service = "vllm-cpu"

    def __init__(self, image: str, name: str, drain: int = 30, overrides: tuple[str, ...] = ()):
        self.port = free_port()
        self.name = name
        self.overrides = overrides  # extra compose files layered on compose.yaml
        # Process env overrides .env; an empty --env-file keeps a developer's .env out of tests.
        self.env = dict(
            os.environ,
            COMPOSE_PROJECT_NAME=name,
            INTEL_VLLM_CPU_IMAGE=image,
            INTEL_VLLM_PORT=str(self.port),
            INTEL_VLLM_DRAIN_TIMEOUT=str(drain),
            INTEL_VLLM_STOP_GRACE_PERIOD=f"{timing.grace_period(drain)}s",
            # `up --wait` sees healthy within 2 s of ready instead of 5 (the shipped interval)
            INTEL_VLLM_HEALTH_INTERVAL="2s",
        )
        self.env_file = ROOT / "build" / f"{name}.env"
        self.env_file.parent.mkdir(exist_ok=True)
        self.env_file.write_text("")
        self.url = f"http://127.0.0.1:{self.port}"

    def __call__(self, *args: str, timeout: float = 600, check: bool = True):
        files = [arg for path in self.overrides for arg in ("-f", path)]
        return run(
            [
                "bash",
                str(ROOT / "scripts" / "compose.sh"),
                "--env-file",
                str(self.env_file),
                *files,
                *args,
            ],
            env=self.env,
            timeout=timeout,
            check=check,
        )

    def container(self) -> str:
        return self("ps", "-a", "-q", self.service).stdout.strip()

    def inspect(self) -> dict:
        return json.loads(docker("inspect", self.container()).stdout)[0]

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.name}"
        return [
            line
            for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"])
            for line in docker(*kind, "-q", "--filter", label).stdout.split()
        ]

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "80", check=False).stdout

    def served_model(self) -> str:
        import requests

        return requests.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def compose_project(request, docker_host):
    """Factory for Compose projects; `down -v` for each at module end, whatever happened."""
    made: list[Compose] = []

    def make(image: str, drain: int = 30, overrides: tuple[str, ...] = ()) -> Compose:
        c = Compose(image, f"vllm-intel-test-{os.getpid()}-{len(made)}", drain, overrides)
        made.append(c)
        return c

    yield make
    for c in made:
        c("down", "-v", "--timeout", "60", check=False)
        c.env_file.unlink(missing_ok=True)


# A release's lifecycle tests build on each other (up -> requests -> stop -> down): once one step
# failed, skip the rest for that release instead of waiting out their timeouts.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    version = getattr(getattr(item, "callspec", None), "params", {}).get("stack")
    if rep.when == "call" and rep.failed and version:
        _FAILED.add(version)


_FAILED: set[str] = set()


@pytest.fixture(autouse=True)
def _skip_after_failed_step(request):
    version = getattr(getattr(request.node, "callspec", None), "params", {}).get("stack")
    if version in _FAILED:
        pytest.skip(f"an earlier step failed for vLLM {version}")
