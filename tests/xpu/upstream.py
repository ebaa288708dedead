"""Read upstream vLLM's XPU recipe from a release's PyPI sdist, in the shape of
docker/xpu-releases.toml, each value with the upstream line it came from.

Files read (inside vllm-X.tar.gz): docker/Dockerfile.xpu, requirements/xpu.txt and
.buildkite/scripts/publish-release-images.sh (which names the published XPU image, if any).

  recipe(sdist, version)      {field: Found(value, upstream line)} (tests/xpu/test_recipes.py)
  render_row(sdist, version)  the release's [release."X"] table for docker/xpu-releases.toml,
                              fields in the file's order (scripts/xpu_recipe.FIELDS)

Importable by a script as well as by the tests (needs dockerfile_parse, of requirements-test.txt):
`sys.path.insert(0, ROOT); from tests.xpu import upstream`, or run it:
`python -m tests.xpu.upstream SDIST VERSION` prints the table.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import pathlib
import re
import sys
import tarfile

from dockerfile_parse import DockerfileParser

ONEAPI_WHEEL = re.compile(r'"((?:intel-|oneccl|dpcpp)[\w-]*==[\w.+]+)')
DEB_URL = re.compile(r"wget\s+(https://\S+?\.deb)")
GPU_APT_HOST = "https://repositories.intel.com/gpu/"
LEVEL_ZERO_DEV = re.compile(r"/(level-zero-devel_|libze-dev_)[^/]+\.deb$")


@dataclasses.dataclass
class Found:
    value: object
    where: str  # "docker/Dockerfile.xpu:82: wget https://..." (the upstream line, for messages)


@functools.cache
def read_members(sdist: str, version: str) -> dict[str, str]:
    """The recipe's files of the sdist ("" for one it lacks), read in one pass of the archive."""
    names = (
        "docker/Dockerfile.xpu",
        "requirements/xpu.txt",
        ".buildkite/scripts/publish-release-images.sh",
    )
    out = dict.fromkeys(names, "")
    prefix = f"vllm-{version}/"
    with tarfile.open(sdist, "r|gz") as tf:
        for member in tf:
            name = member.name.removeprefix(prefix)
            if name in out and member.isfile():
                out[name] = tf.extractfile(member).read().decode()
    return out


def _line(text: str, needle: str, path: str) -> str:
    for no, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return f"{path}:{no}: {line.strip()}"
    return f"{path}: (no line with {needle!r})"


def _stages(dockerfile: str) -> dict[str, list[dict]]:
    """Instructions of each stage, by stage name (dockerfile_parse joins continuation lines)."""
    parser = DockerfileParser(fileobj=io.BytesIO(dockerfile.encode()))
    stages: dict[str, list[dict]] = {}
    current = None
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            current = ins["value"].split()[-1]
            stages[current] = []
        if current is not None:
            stages[current].append(ins)
    return stages


def _env(instrs: list[dict], name: str) -> str | None:
    found = None
    for ins in instrs:
        if ins["instruction"] == "ENV":
            m = re.match(rf'{name}[= ]"?([^"]*)"?$', ins["value"].strip())
            if m:
                found = m.group(1)
    return found


def recipe(sdist: str, version: str) -> dict[str, Found]:
    """Upstream's recipe for `version`, read from its sdist."""
    files = read_members(sdist, version)
    df, req, pub = (
        files["docker/Dockerfile.xpu"],
        files["requirements/xpu.txt"],
        files[".buildkite/scripts/publish-release-images.sh"],
    )
    dfp, reqp = "docker/Dockerfile.xpu", "requirements/xpu.txt"
    stages = _stages(df)
    base_from = next(
        i["value"]
        for s in stages.values()
        for i in s
        if i["instruction"] == "FROM" and i["value"].split()[-1] == "vllm-base"
    )
    base = stages["vllm-base"]
    final = stages["vllm-openai"]
    base_text = "\n".join(i["value"] for i in base)
    final_runs = "\n".join(i["value"] for i in final if i["instruction"] == "RUN")
    out: dict[str, Found] = {}

    image = base_from.split()[0]
    out["base_image"] = Found(image, _line(df, f"FROM {image}", dfp))
    py = next(
        (
            i["value"].split("=", 1)[1]
            for i in base
            if i["instruction"] == "ARG" and i["value"].startswith("PYTHON_VERSION=")
        ),
        "",
    )
    out["python"] = Found(py, _line(df, "ARG PYTHON_VERSION", dfp))

    debs = DEB_URL.findall(base_text)
    # Since 0.34: the driver from Intel's GPU apt repository (key, deb line, meta-package).
    args = {
        k: v.strip('"')
        for i in base
        if i["instruction"] == "ARG" and "=" in i["value"]
        for k, v in [i["value"].split("=", 1)]
    }
    # Intel's GPU repository (repositories.intel.com/gpu), not the oneAPI one of 0.24 (oneapi_apt).
    repo_run = next(
        (
            i["value"]
            for i in base
            if i["instruction"] == "RUN"
            and "sources.list.d" in i["value"]
            and GPU_APT_HOST in i["value"]
        ),
        "",
    )
    key = re.search(r"curl\s+(?:-\S+\s+)*(https://\S+)\s*\|\s*gpg", repo_run)
    line = re.search(r'echo\s+"(deb \[[^"]+)"', repo_run)
    deb_line = (
        re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), line.group(1))
        if line
        else ""
    )
    packages = re.search(r"apt-get install\s+((?:-\S+\s+)*)([\w.+-]+(?:\s+[\w.+-]+)*)", repo_run)
    out["gpu_apt_key"] = Found(key.group(1) if key else "", _line(df, "gpg --", dfp))
    out["gpu_apt_repo"] = Found(deb_line, _line(df, 'echo "deb ', dfp))
    out["gpu_apt_packages"] = Found(
        packages.group(2).split() if packages and line else [],
        _line(df, "apt-get install -y intel-", dfp),
    )
    out["debs"] = Found(debs, _line(df, "wget https://", dfp))
    dev = [u.rsplit("/", 1)[1] for u in debs if LEVEL_ZERO_DEV.search(u)]
    out["level_zero_dev"] = Found(dev[0] if dev else "", _line(df, "level-zero", dfp))

    apt = re.findall(r"\b(intel-oneapi-[\w-]+-\d{4}\.\d+)\b", base_text)
    out["oneapi_apt"] = Found(apt, _line(df, "intel-oneapi-", dfp))
    pin = re.search(r"Pin: version (\S+?)'", base_text)
    out["oneapi_apt_pin"] = Found(pin.group(1) if pin else "", _line(df, "Pin: version", dfp))

    installer = re.search(r'ONECCL_INSTALLER="?([\w.-]+\.sh)', base_text)
    url = ""
    if installer:
        m = re.search(r"wget\s+\"?(https://\S+?)/\$\{ONECCL_INSTALLER\}", base_text)
        url = f"{m.group(1)}/{installer.group(1)}" if m else installer.group(1)
    out["oneccl_installer"] = Found(url, _line(df, "ONECCL_INSTALLER", dfp))

    out["ld_library_path"] = Found(
        _env(base, "LD_LIBRARY_PATH") or "", _line(df, "ENV LD_LIBRARY_PATH", dfp)
    )
    out["multiproc_method"] = Found(
        _env(final, "VLLM_WORKER_MULTIPROC_METHOD") or "",
        _line(df, "VLLM_WORKER_MULTIPROC_METHOD", dfp),
    )
    out["oneapi_pip"] = Found(ONEAPI_WHEEL.findall(final_runs), _line(df, "intel-sycl-rt", dfp))

    reinstall = re.search(r"pip install (triton-xpu==\S+)", final_runs)
    triton_req = re.search(r"^(triton==\S+)", req, re.M)
    out["triton_reinstall"] = Found(bool(reinstall), _line(df, "uninstall triton", dfp))
    if reinstall:
        out["triton"] = Found(reinstall.group(1), _line(df, reinstall.group(1), dfp))
    else:
        out["triton"] = Found(triton_req.group(1) if triton_req else "", _line(req, "triton", reqp))

    torch = re.search(r"^torch==(\S+)", req, re.M)
    out["torch"] = Found(torch.group(1) if torch else "", _line(req, "torch==", reqp))
    index = re.search(r"^--extra-index-url[= ](\S*pytorch\S*)", req, re.M)
    out["torch_index"] = Found(index.group(1) if index else "", _line(req, "pytorch", reqp))
    kernels = re.search(r"^vllm_xpu_kernels==(\S+)", req, re.M) or re.search(
        r"^vllm_xpu_kernels @ \S+/vllm_xpu_kernels-([\d.]+)-", req, re.M
    )
    out["xpu_kernels"] = Found(
        kernels.group(1) if kernels else "", _line(req, "vllm_xpu_kernels", reqp)
    )
    kernels_index = re.search(r"^--extra-index-url[= ](\S*vllm-xpu-kernels\S*)", req, re.M)
    out["xpu_kernels_index"] = Found(
        kernels_index.group(1) if kernels_index else "", _line(req, "vllm-xpu-kernels", reqp)
    )

    published = "vllm/vllm-openai-xpu:v${RELEASE_VERSION}" in pub
    out["upstream_image"] = Found(
        f"vllm/vllm-openai-xpu:v{version}" if published else "",
        _line(pub, "vllm-openai-xpu", ".buildkite/scripts/publish-release-images.sh"),
    )
    return out


# .debs upstream installs that the table leaves out (skipped_debs), with the reason: matched on
# the file name.
SKIPPED_DEBS = {
    "xpu-smi_": "xpu-smi is a management CLI, not used by vLLM; it needs a PPA and is not in the "
    "source route",
}


def _fields() -> list[str]:
    """The table's fields, in its order (scripts/xpu_recipe.py, the one list of them)."""
    scripts = pathlib.Path(__file__).resolve().parents[2] / "scripts"
    if str(scripts) not in sys.path:
        sys.path.insert(0, str(scripts))
    import xpu_recipe

    return list(xpu_recipe.FIELDS)


def row(sdist: str, version: str) -> dict:
    """The release's table entry as docker/xpu-releases.toml holds it, from its sdist alone:
    upstream's values, the sdist's own sha256, and the .debs SKIPPED_DEBS leaves out."""
    found = recipe(sdist, version)
    debs = found["debs"].value
    skipped = [
        [url, why]
        for url in debs
        for pattern, why in SKIPPED_DEBS.items()
        if url.rsplit("/", 1)[1].startswith(pattern)
    ]
    values = {name: f.value for name, f in found.items() if name != "debs"}
    values["umd"] = [u for u in debs if u not in {s[0] for s in skipped}]
    values["skipped_debs"] = skipped
    values["sdist_sha256"] = hashlib.sha256(pathlib.Path(sdist).read_bytes()).hexdigest()
    return {name: values[name] for name in _fields()}


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # TOML basic strings escape as JSON does for these values
    if not value:
        return "[]"
    items = [
        "[" + ",\n   ".join(_toml(x) for x in v) + "]" if isinstance(v, list) else _toml(v)
        for v in value
    ]
    return "[\n" + "".join(f"  {item},\n" for item in items) + "]"


def render_row(sdist: str, version: str) -> str:
    """The [release."VERSION"] table of docker/xpu-releases.toml, read from the release's sdist."""
    lines = [f'[release."{version}"]']
    lines += [f"{name} = {_toml(value)}" for name, value in row(sdist, version).items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tests.xpu.upstream SDIST VERSION")
    print(render_row(sys.argv[1], sys.argv[2]), end="")
