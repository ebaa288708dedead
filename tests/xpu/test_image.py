"""Inside the XPU image: what can be checked without a GPU (marker `xpu_image`, Buildkite's XPU
build step on a CPU agent) and what needs one (marker `xpu`, Buildkite's GPU step).

Both run in the image's `test` target (`docker run vllm-intel:xpu-X-test -m xpu_image`); on any
other machine they are deselected (`xpu_image`: not an XPU image) or skipped with the reason
(`xpu`: no /dev/dri). Their expectations come from docker/xpu-releases.toml and the XPU patches'
declarations, and are tested here without the image (test_expected_states_*), so a wrong
expectation fails on every CI run.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import pytest

from tests.harness import ROOT, Server, free_port
from tests.harness.patch_states import expected_state

sys.path.insert(0, str(ROOT / "scripts"))
import xpu_recipe  # noqa: E402


def _vllm_built_for_xpu() -> bool:
    import importlib.metadata as md

    try:
        return md.version("vllm").endswith("+xpu")
    except md.PackageNotFoundError:
        return False


# The image's environment and vLLM's XPU build: not the kernels' presence, which is one of the
# things checked (a missing vllm_xpu_kernels must fail or show as a stand-in, never skip all).
IN_XPU_IMAGE = os.environ.get("VLLM_TARGET_DEVICE") == "xpu" and _vllm_built_for_xpu()
HAS_GPU = any(pathlib.Path("/dev/dri").glob("renderD*"))

in_image = pytest.mark.skipif(
    not IN_XPU_IMAGE,
    reason="runs inside the XPU image only (Buildkite: .buildkite/steps/xpu-build.sh)",
)
needs_gpu = pytest.mark.skipif(
    not (IN_XPU_IMAGE and HAS_GPU),
    reason="needs an Intel GPU (/dev/dri/renderD*) inside the XPU image (Buildkite: steps/xpu.sh)",
)


def installed_vllm() -> str:
    import importlib.metadata as md

    return md.version("vllm").split("+")[0]


def xpu_patches() -> list:
    """The declarations of the patches of XPU code (``platform = "xpu"``)."""
    from vllm_intel.patches import declarations

    return [p for p in declarations() if p.platform == "xpu"]


def expected_patch_states(version: str, on_xpu: bool) -> dict[str, str]:
    """What `entrypoint.py patches` must print for the XPU patches in an XPU image of `version`,
    from their declarations (upstream from ``fixed_in`` on); without a GPU vLLM picks no XPU
    platform, so they stand aside."""
    return {p.name: expected_state(p, version, "xpu" if on_xpu else None) for p in xpu_patches()}


def carries_the_fix(version: str, name: str) -> bool:
    """``version`` carries upstream's fix of the XPU patch ``name``, by its ``fixed_in``."""
    patch = next(p for p in xpu_patches() if p.name == name)
    return expected_state(patch, version, "xpu") == "upstream"


@pytest.mark.parametrize(
    "version, on_xpu, state",
    [
        ("0.34.0", False, "upstream"),
        ("0.32.0", False, "upstream"),
        ("0.27.1", True, "upstream"),
        ("0.24.0", True, "applied"),
        ("0.24.0", False, "not-applicable"),
    ],
)
def test_expected_states_follow_the_upstream_fix(version, on_xpu, state):
    assert expected_patch_states(version, on_xpu)["xpu-shutdown"] == state
    assert carries_the_fix(version, "xpu-shutdown") == (state == "upstream")


def test_the_table_has_a_release_the_patch_applies_to():
    """The seed case: a release without upstream's XPU shutdown fix has a recipe, so the GPU step
    can reproduce the hang and show the patch fixes it."""
    states = {
        v: expected_patch_states(v, on_xpu=True)["xpu-shutdown"] for v in xpu_recipe.versions()
    }
    assert "applied" in states.values() and "upstream" in states.values(), states


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


STAND_IN_LIST = pathlib.Path("/etc/vllm-intel/stand-in")


def stand_in(name: str) -> None:
    """Skip, saying so, where the image is a stand-in of upstream's (tests/standins) that cannot
    show `name`: such a check is not verified here, and is not counted as passed."""
    if STAND_IN_LIST.exists():
        for line in STAND_IN_LIST.read_text().splitlines():
            if line.split(maxsplit=1)[:1] == [name]:
                pytest.skip(f"stand-in: {line}")


def _py(code: str) -> subprocess.CompletedProcess:
    return _run(sys.executable, "-c", code)


@pytest.mark.xpu_image
@in_image
def test_torch_is_the_tables_xpu_build():
    stand_in("torch-xpu")
    r = _py("import torch; print(torch.__version__, torch.version.xpu)")
    assert r.returncode == 0, r.stderr[-3000:]
    torch_version, xpu = r.stdout.split()
    assert torch_version == xpu_recipe.release(installed_vllm())["torch"] + "+xpu", r.stdout
    assert xpu != "None", r.stdout


@pytest.mark.xpu_image
@in_image
def test_xpu_device_count_answers_without_crashing():
    r = _py("import torch; print(torch.xpu.device_count())")
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout) >= 1 if HAS_GPU else int(r.stdout) == 0, r.stdout


@pytest.mark.xpu_image
@in_image
def test_xpu_kernels_are_the_tables_and_load():
    stand_in("xpu-kernels")
    r = _py(
        "import importlib.metadata as m, vllm_xpu_kernels._C; print(m.version('vllm_xpu_kernels'))"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == xpu_recipe.release(installed_vllm())["xpu_kernels"], r.stdout


@pytest.mark.xpu_image
@in_image
def test_vllm_is_the_xpu_build_and_level_zero_headers_are_there():
    """vLLM's metadata says X+xpu (its __version__ is the plain X). `vllm --version` itself needs a
    device: without one vLLM cannot infer its platform and exits 1, so it is asked only on a GPU."""
    import importlib.metadata as md

    assert md.version("vllm").endswith("+xpu"), md.version("vllm")
    if HAS_GPU:
        r = _run("vllm", "--version")
        assert r.returncode == 0 and r.stdout.strip().endswith("+xpu"), r.stdout + r.stderr[-2000:]
    include = ["/usr/include", *filter(None, os.environ.get("CPATH", "").split(":"))]
    assert any((pathlib.Path(d) / "level_zero" / "ze_api.h").exists() for d in include), include


@pytest.mark.xpu_image
@in_image
def test_entrypoint_patches_prints_the_expected_states():
    r = _run(sys.executable, str(ROOT / "entrypoint.py"), "patches")
    assert r.returncode == 0, r.stdout + r.stderr
    states = dict(
        line.split()[:2]
        for line in r.stdout.splitlines()
        if line.strip() and not line.startswith(("patch", "-"))
    )
    assert "failed" not in states.values(), r.stdout
    for name, state in expected_patch_states(installed_vllm(), HAS_GPU).items():
        assert states.get(name) == state, r.stdout


def _serve(tmp: pathlib.Path, port: int, bare: bool, env: dict) -> Server:
    model = os.environ.get("XPU_TEST_MODEL", os.environ["INTEL_VLLM_MODEL"])
    # bare: vLLM alone, upstream's default shutdown (timeout 0); else under our entrypoint
    head = ["-m", "vllm.entrypoints.cli.main"] if bare else [str(ROOT / "entrypoint.py")]
    argv = [sys.executable, *head, "serve", model, "--port", str(port), "--max-model-len", "1024"]
    return Server(argv, port, tmp / f"serve-{port}.log", env=dict(env, TMPDIR=str(tmp)))


@pytest.mark.xpu
@needs_gpu
@pytest.mark.parametrize("patched", [False, True], ids=["xpu-shutdown-disabled", "enabled"])
def test_restart_on_the_same_device(patched):
    """Serve, stop, serve again on the same GPU. On vLLM < 0.25 without xpu-shutdown the second
    start hangs in oneCCL init (the first server's workers were killed holding Level Zero / oneCCL
    resources): reproduced here, bounded by START_S. With the patch the restart serves."""
    version = installed_vllm()
    if carries_the_fix(version, "xpu-shutdown") and not patched:
        pytest.skip(f"vLLM {version} carries the fix upstream: nothing to reproduce")
    start_s = float(os.environ.get("XPU_RESTART_START_S", "600"))
    env = {"INTEL_VLLM_PATCHES_DISABLE": "" if patched else "xpu-shutdown"}
    with tempfile.TemporaryDirectory(prefix="xpu-", dir="/tmp") as d:
        tmp = pathlib.Path(d)
        first = _serve(tmp, free_port(), bare=not patched, env=env)
        try:
            first.wait_ready(start_s)
            first.signal(signal.SIGTERM)
            assert first.wait(120) is not None, "first server did not exit"
        finally:
            first.kill_all()
        second = _serve(tmp, free_port(), bare=not patched, env=env)
        try:
            if patched:
                second.wait_ready(start_s)  # raises with the log tail if it hangs or dies
            else:
                with pytest.raises((TimeoutError, RuntimeError)):
                    second.wait_ready(start_s)
        finally:
            second.kill_all()
