"""Dockerfile.xpu's source route (stages source-os and source) built for every release of the
table, on a base whose curl, apt-get, dpkg, python3.12 and venv pip are recording shims
(tests/standins/Dockerfile.shims): Intel's and GitHub's servers, Ubuntu's Python 3.12 and
PyTorch's XPU index cannot be reached here, so what the scripts *ask for* is checked against the
table's pins, and every line of install-xpu-os.sh and install-vllm-xpu.sh runs (the real gpg,
tar, sha256sum, ln included). Then both scripts run a second time on the result: they must be
idempotent (a rebuild on a warm layer, a retried step). Not shown here: that those packages
install and work (Buildkite's xpu-build step on the 0.24.0 source route). Both GPU driver sources
of the table run: the .debs (up to 0.33.0) and, for 0.34.0, Intel's GPU apt repository (its key,
deb line and meta-package; the repository itself cannot be reached here: apt-get is a shim) and
the kernels' own index.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from tests.harness import DOCKER, ROOT, docker, scripts_run

sys.path.insert(0, str(ROOT / "scripts"))
import xpu_recipe  # noqa: E402

pytestmark = pytest.mark.docker
SHIMS = "vllm-intel-test:xpu-shims"
LOG = "/var/log/vllm-intel-shims.log"
SCRIPTS = ("docker/install-xpu-os.sh", "docker/install-vllm-xpu.sh")


@functools.cache
def shims_image() -> str:
    r = subprocess.run(
        [DOCKER, "build", "-q", "-f", "tests/standins/Dockerfile.shims", "-t", SHIMS, "."],
        cwd=ROOT,
        env=dict(os.environ, DOCKER_BUILDKIT="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return SHIMS


@functools.cache
def source_image(version: str) -> tuple[str, str]:
    """(tag, BuildKit log) of the `source` target on the shims."""
    tag = f"vllm-intel-test:xpu-source-{version}"
    env = dict(os.environ, XPU_ROUTE="source", TAG=tag)
    r = subprocess.run(
        ["bash", "scripts/build-image.sh", "xpu", "--build-arg", f"BASE_IMAGE={shims_image()}"],
        cwd=ROOT,
        env=dict(env, VLLM_VERSION=version, TARGET="source"),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-5000:]
    return tag, r.stderr


def calls(tag: str) -> list[list[str]]:
    out = docker("run", "--rm", "--entrypoint", "cat", tag, LOG).stdout
    return [line.split("\t") for line in out.splitlines()]


@pytest.mark.parametrize("version", xpu_recipe.versions())
def test_source_route_asks_for_the_tables_pins(docker_host, version):
    tag, log = source_image(version)
    found = scripts_run.ran_in_build(log)
    assert set(SCRIPTS) <= found, found
    rel = xpu_recipe.release(version)
    seen = calls(tag)
    fetched = [c[-1] for c in seen if c[0] == "curl" and "-o" in c and c[-1].endswith(".deb")]
    assert fetched == rel["umd"]
    dpkg = [c for c in seen if c[0] == "dpkg"]
    apt = [c for c in seen if c[:2] == ["apt-get", "install"]]
    assert f"python{rel['python']}-venv" in apt[0]
    if rel["oneapi_apt"]:
        assert apt[1][-len(rel["oneapi_apt"]) :] == rel["oneapi_apt"]
    if rel["umd"]:
        # One dpkg call for all of them (dependencies among them resolve), as upstream's
        # `dpkg -i *.deb`; no apt repository of the driver.
        assert len(dpkg) == 1, dpkg
        assert sorted(p.rsplit("/", 1)[1] for p in dpkg[0][2:]) == sorted(
            u.rsplit("/", 1)[1] for u in rel["umd"]
        )
        assert not any(set(rel["gpu_apt_packages"] or ["intel-gpu-compute"]) & set(c) for c in apt)
    else:
        # Intel's GPU apt repository: its key fetched and dearmored (the real gpg) into the
        # keyring the deb line names, the line itself, an update that fails on an unreadable
        # repository (upstream's Error-Mode=any), the meta-package installed with its Recommends.
        assert dpkg == []
        assert ["curl", "-fsSL", "--retry", "3", rel["gpu_apt_key"]] in seen, seen
        assert ["apt-get", "update", "-qq", "-o", "APT::Update::Error-Mode=any"] in seen, seen
        (gpu,) = [c for c in apt if set(rel["gpu_apt_packages"]) <= set(c)]
        assert gpu == ["apt-get", "install", "-y", "-qq", *rel["gpu_apt_packages"]], gpu
        assert "--no-install-recommends" not in gpu
        assert seen.index(gpu) > seen.index(apt[0])  # after the base packages, as upstream
        keyring = rel["gpu_apt_repo"].split("signed-by=", 1)[1].split()[0].rstrip("]")
        script = f"cat /etc/apt/sources.list.d/*.list; gpg --show-keys {keyring} | grep -c ^pub"
        r = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", script)
        assert r.stdout.splitlines() == [rel["gpu_apt_repo"], "1"], r.stdout + r.stderr
    assert ["python" + rel["python"], "-m", "venv", "/opt/venv"] in seen
    pip = [c for c in seen if c[0] == "pip"]
    req = next(c for c in pip if "-r" in c)
    assert req[req.index("--extra-index-url") + 1] == rel["torch_index"]
    indexes = [req[i + 1] for i, a in enumerate(req) if a == "--extra-index-url"]
    # The kernels' own index where the table has one (since 0.34), nothing else otherwise.
    assert indexes == [rel["torch_index"]] + (
        [rel["xpu_kernels_index"]] if rel["xpu_kernels_index"] else []
    )
    assert req[req.index("-r") + 1].endswith("/requirements/xpu.txt")
    asked = [c[1] for c in seen if c[0] == "pip-requirement"]
    assert f"torch=={rel['torch']}" in asked, asked
    assert any(rel["xpu_kernels"] in a for a in asked if "vllm_xpu_kernels" in a), asked
    build = next(c for c in pip if "--no-build-isolation" in c)
    assert build[-1] == "VLLM_TARGET_DEVICE=xpu", build
    if rel["triton_reinstall"]:
        assert ["pip", "uninstall", "-q", "-y", "triton", "triton-xpu"] == pip[2][:6]
        assert rel["triton"] in pip[3], pip
    if rel["oneccl_installer"]:
        assert ["installer", rel["oneccl_installer"], "-a --silent --eula accept"] in seen
    if rel["oneapi_pip"]:
        assert pip[-1][-1 - len(rel["oneapi_pip"]) : -1] == rel["oneapi_pip"], pip[-1]
    env = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", "echo $LD_LIBRARY_PATH").stdout
    prefix, suffix = xpu_recipe.split_ld_path(rel["ld_library_path"])
    assert env.strip() == prefix + suffix, env


@pytest.mark.parametrize("version", xpu_recipe.versions())
def test_source_route_scripts_run_again_on_their_own_result(docker_host, version):
    """The second run meets every file the first one wrote (the oneAPI keyring, the sources
    list, the oneCCL link, the venv) and must end as the first did."""
    tag, _ = source_image(version)
    args = xpu_recipe.build_args(version, "source")
    env = [a for arg in args for a in ("-e", arg)]
    script = (
        "/tmp/build/with-build-secrets.sh /tmp/build/install-xpu-os.sh && "
        "SDIST_DIR=/tmp/sdist /tmp/build/with-build-secrets.sh /tmp/build/install-vllm-xpu.sh"
    )
    r = docker(
        "run",
        "--rm",
        *env,
        "-v",
        f"{ROOT / 'docker'}:/tmp/build:ro",
        "-v",
        f"{ROOT / 'docker' / 'sdist'}:/tmp/sdist:ro",
        "--entrypoint",
        "bash",
        tag,
        "-o",
        "pipefail",
        "-c",
        f"{{ {script}; }} >&2 && cat {LOG}",
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    first = calls(tag)
    assert len(lines) == 2 * len(first), (len(lines), len(first))
    scripts_run.ran(*SCRIPTS)
