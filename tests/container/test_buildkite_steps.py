"""The Buildkite steps (.buildkite/steps/), run here as an agent runs them, to the end.

- cpu.sh (= `make buildkite-local`): runtime and test images, tests inside the test image (a
  short selection here: IN_IMAGE_ARGS; the agent runs the image's whole CMD), the smoke test
  (serve, request, stop, restart, request, stop). Its step 4 is `make test` itself: HOST_TESTS=0.
- xpu-build.sh for the default release (0.34.0, upstream's newest published image; the others
  with INTEL_VLLM_XPU_STAND_INS=all): on a stand-in of that image (the agent pulls the
  real one); the in-image xpu_image tests report what the stand-in cannot show as skipped with
  "stand-in: ...".
- xpu.sh: without /dev/dri it stops at its first check; past it, it runs xpu-lib.sh's functions
  and smoke.sh, which the two steps above run. The GPU part only a GPU agent can show.
- soak.sh: `make soak` with CYCLES=2 (a crash, the start after it, a drained stop); nightly: 20.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import uuid

import pytest

from tests.harness import DEFAULT_VLLM, DOCKER, ROOT, build_image, docker, scripts_run

sys.path.insert(0, str(ROOT / "scripts"))
import xpu_recipe  # noqa: E402

from .conftest import holds_kernels  # noqa: E402
from .test_sbom import image_sbom  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]
LIB = (".buildkite/steps/lib.sh",)


def step(script: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["bash", f".buildkite/steps/{script}"],
        cwd=ROOT,
        env=dict(os.environ, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    scripts_run.ran_in_build(r.stdout)
    return r


def image_secrets(images: list[str], canary: bytes) -> list[str]:
    """Files in any layer of `images` (not only their final filesystems) named *.env (but
    .env.example) or holding `canary`. One `docker save` of them all: the layers they share are
    read once (the test image is the runtime image and more)."""
    found, layers = [], 0
    save = subprocess.Popen([DOCKER, "save", *images], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=save.stdout, mode="r|") as outer:
        for layer in outer:
            if not (layer.isfile() and layer.name.endswith("layer.tar")):
                continue
            layers += 1
            with tarfile.open(fileobj=outer.extractfile(layer), mode="r|") as tf:
                for m in tf:
                    base = m.name.rsplit("/", 1)[-1]
                    if base.endswith(".env") and base != ".env.example":
                        found.append(f"{layer.name}: {m.name}")
                    elif m.isfile() and m.size < 8 << 20 and canary in tf.extractfile(m).read():
                        found.append(f"{layer.name}: {m.name} (the canary)")
    assert save.wait() == 0
    # A save format without layer.tar files (OCI blobs of newer engines) would scan nothing.
    assert layers > 3, f"{layers} layer(s) in docker save: nothing was scanned"
    return found


def sbom_artifact(image: str) -> str:
    """The SBOM the step left among its artifacts (build/buildkite/, lib.sh's LOG_DIR)."""
    name = f"sbom-{image.removeprefix('vllm-intel:')}.cdx.json"
    return (ROOT / "build" / "buildkite" / name).read_text()


def image_ids(images: list[str]) -> list[str]:
    return docker("image", "inspect", "-f", "{{.Id}}", *images).stdout.split()


def test_cpu_step_runs_to_the_end_and_bakes_no_secret(cpu_image, compile_cache):
    """Env files beside the checkout (where the docs put hf.env with HF_TOKEN) reach no layer of
    the images the step builds: two canary files are planted in the build context first."""
    images = [cpu_image(), cpu_image(target="test")]  # built once for the session, no canary
    before = image_ids(images)
    token = f"HF_TOKEN=hf_canary{uuid.uuid4().hex}"
    planted = [ROOT / f"canary-{os.getpid()}.env", ROOT / "tests" / f"canary-{os.getpid()}.env"]
    try:
        for path in planted:
            path.write_text(token + "\n")
        r = step(
            "cpu.sh",
            1800,
            HOST_TESTS="0",
            IN_IMAGE_ARGS="-q tests/supervisor/test_units.py tests/patches/test_framework.py",
            INTEL_VLLM_CACHE=str(compile_cache),
        )
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
    assert r.returncode == 0, r.stdout[-6000:]
    assert images == [f"vllm-intel:cpu-{DEFAULT_VLLM}", f"vllm-intel:cpu-{DEFAULT_VLLM}-test"]
    # An image's id is the digest of its config, which lists every layer's digest: the same ids
    # as before the canaries were planted = the same layers, none of which saw them. Any other
    # id (a layer rebuilt while they were in the context) has every layer searched.
    assert image_ids(images) == before or image_secrets(images, token.encode()) == [], images
    assert " passed" in r.stdout and "smoke: vllm-intel:cpu-" in r.stdout, r.stdout[-3000:]
    assert "passed (serve, request, stop, restart, request, stop)" in r.stdout
    assert sbom_artifact(images[0]) == image_sbom(images[0])
    # The smoke containers' compile caches went to INTEL_VLLM_CACHE: graphs for the next users.
    assert holds_kernels(compile_cache), sorted(compile_cache.rglob("*"))[:20]
    scripts_run.ran(".buildkite/steps/cpu.sh", ".buildkite/steps/smoke.sh", *LIB)


# The releases upstream publishes an XPU image of: their xpu-build step runs here on a stand-in.
# The others (source route) have no image to stand in for: test_xpu_source_route.py runs their
# scripts on recording shims; building them to the end needs a Buildkite agent.
UPSTREAM_ROUTE = [
    v
    for v in xpu_recipe.versions()
    if xpu_recipe.default_route(xpu_recipe.release(v)) == "upstream"
]
# Every run (`make test`): the default release. Another release's stand-in build runs the same
# steps on its row's pins, which tests/xpu checks against that release's sdist (and its driver
# sources run on recording shims in test_xpu_source_route.py), so the others' stand-in builds
# (2-5 min each on 2 cores) run with INTEL_VLLM_XPU_STAND_INS=all (docs/docker.md); their
# Buildkite steps build them on upstream's real images on every pipeline run.
EVERY_RUN = UPSTREAM_ROUTE[:1]
ALL_STAND_INS = os.environ.get("INTEL_VLLM_XPU_STAND_INS") == "all"


@pytest.mark.parametrize(
    "version",
    [
        v
        if v in EVERY_RUN or ALL_STAND_INS
        else pytest.param(
            v,
            marks=pytest.mark.skip(
                reason=f"stand-in of {v}: not in every run; INTEL_VLLM_XPU_STAND_INS=all runs it"
            ),
        )
        for v in UPSTREAM_ROUTE
    ],
)
def test_xpu_build_step_runs_on_the_stand_in(xpu_image, version):
    if version != xpu_recipe.load()["default"]:  # the default's stand-in comes with the fixture
        built, _ = build_image("xpu-stand-in", version)
        assert built.returncode == 0, built.stderr[-5000:]
        scripts_run.ran_in_build(built.stderr)
    r = step("xpu-build.sh", 1800, VLLM_VERSION=version)
    assert r.returncode == 0, r.stdout[-6000:]
    tail = r.stdout[r.stdout.rindex("xpu_image tests inside") :]
    assert " passed" in tail and "failed" not in tail, tail[-3000:]
    assert "SKIPPED" in tail and "stand-in: torch-xpu" in tail, tail[-3000:]
    assert sbom_artifact(f"vllm-intel:xpu-{version}") == image_sbom(f"vllm-intel:xpu-{version}")
    scripts_run.ran(".buildkite/steps/xpu-build.sh", ".buildkite/steps/xpu-lib.sh", *LIB)


def test_gpu_step_without_a_gpu_says_so():
    r = step("xpu.sh", 300)
    assert r.returncode == 1, r.stdout[-3000:]
    assert "xpu: no /dev/dri/renderD* on this agent (wrong queue?)" in r.stdout
    scripts_run.ran(".buildkite/steps/xpu.sh")


def test_soak_step_two_cycles(cpu_image, compile_cache):  # the soak's run shares the cache
    cpu_image()
    r = step("soak.sh", 1200, CYCLES="2")
    assert r.returncode == 0, r.stdout[-6000:]
    assert "summary: 2 cycles, 1 drained stops" in r.stdout, r.stdout[-3000:]
    scripts_run.ran(".buildkite/steps/soak.sh", *LIB)
