"""The XPU image, built here by its upstream route on a stand-in of upstream's published image
(tests/standins/Dockerfile.upstream-xpu: no registry and no Intel GPU exist where the suite runs).

What this shows: every stage of docker/Dockerfile.xpu's upstream route builds (upstream, vllm with
check-xpu-image.sh, app, runtime; test in the Buildkite step's test), the check passes what the
stand-in can show and names what it cannot, and the runtime image behaves on a host without a GPU.
What it cannot show (named, never counted as verified): torch built with XPU, the kernels' device
code, upstream's Python 3.12 and Level Zero .deb; those need a Buildkite agent (xpu-build.sh
against upstream's real image) and a GPU (xpu.sh).
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.harness import ROOT, docker
from tests.xpu.test_image import expected_patch_states

sys.path.insert(0, str(ROOT / "scripts"))
import xpu_recipe  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]
XPU_DEFAULT = xpu_recipe.load()["default"]


def test_check_passes_what_the_stand_in_shows_and_names_the_rest(xpu_image):
    """The build ran check-xpu-image.sh (its step may come from the cache: then it passed on the
    same script and image earlier); run here again in the built image, it says the same."""
    image, _, _ = xpu_image
    args = dict(a.split("=", 1) for a in xpu_recipe.build_args(XPU_DEFAULT))
    env = [f"{k}={args[k]}" for k in ("VLLM_VERSION", "TORCH_VERSION", "XPU_KERNELS_VERSION")]
    r = docker(
        "run",
        "--rm",
        *[x for e in env for x in ("-e", e)],
        "-v",
        f"{ROOT / 'docker' / 'check-xpu-image.sh'}:/tmp/check.sh:ro",
        "--entrypoint",
        "bash",
        image,
        "/tmp/check.sh",
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = re.findall(r"check-xpu-image: (.*)", r.stdout)
    assert f"ok: vllm: vllm {XPU_DEFAULT}+xpu from /opt/venv/lib/" in "\n".join(lines), lines
    assert any(x.startswith("ok: device-count: 0 XPU device(s)") for x in lines), lines
    standing_in = {x.split(":")[1].strip() for x in lines if x.startswith("stand-in:")}
    assert standing_in == {"torch-xpu", "xpu-kernels", "level-zero", "python"}, lines
    assert (
        lines[-1]
        == "2 passed, 0 failed, 3 not verified (stand-in: torch-xpu xpu-kernels level-zero)"
    )
    # What stands in is named after the release's own recipe: its driver source and kernels' index.
    rel = xpu_recipe.release(XPU_DEFAULT)
    named = {x.split(":")[1].strip(): x for x in lines if x.startswith("stand-in:")}
    if rel["gpu_apt_packages"]:
        suite = rel["gpu_apt_repo"].split("] ", 1)[1].split()[1]
        assert all(p in named["level-zero"] for p in rel["gpu_apt_packages"]), named
        assert suite in named["level-zero"], named
    if rel["xpu_kernels_index"]:
        assert f"{rel['xpu_kernels']} is not on PyPI" in named["xpu-kernels"], named
        assert rel["xpu_kernels_index"] in named["xpu-kernels"], named


def test_images_built_on_the_stand_in_say_so(xpu_image):
    image, _, stand_in = xpu_image
    for tag in (image, stand_in):
        labels = json.loads(docker("inspect", tag).stdout)[0]["Config"]["Labels"]
        assert labels.get("io.github.vllm-intel.stand-in", "").startswith("upstream XPU image"), tag


def _run(image: str, *argv: str, entrypoint: str | None = None):
    head = ["--entrypoint", entrypoint] if entrypoint else []
    return docker("run", "--rm", "--shm-size", "1g", *head, image, *argv, timeout=300, check=False)


def test_runtime_image_without_a_gpu(xpu_image):
    image, _, _ = xpu_image
    r = _run(image, "patches")
    assert r.returncode == 0, r.stderr
    states = dict(line.split()[:2] for line in r.stdout.splitlines() if line.strip())
    # upstream on 0.34.0: its runner moved (vllm/v1/worker/gpu/model_runner.py), the fix is there
    assert (
        states["xpu-shutdown"] == expected_patch_states(XPU_DEFAULT, on_xpu=False)["xpu-shutdown"]
    )
    assert "failed" not in states.values(), r.stdout
    r = _run(image, "plan")
    assert r.returncode == 0 and r.stdout.startswith("plan: xpu: no CPU plan"), r.stdout + r.stderr
    r = _run(image, "probe", "ready")
    assert (r.returncode, r.stdout.strip()) == (
        1,
        "not ready: no supervisor answers on probe port 8001",
    )
    assert _run(image, "-u", entrypoint="id").stdout.strip() == "10001"
    r = _run(image)  # the default CMD: serve
    assert r.returncode == 65, r.stdout + r.stderr
    (line,) = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert "no XPU device" in line and "--device /dev/dri" in line, line
