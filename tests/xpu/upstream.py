"""Read upstream vLLM's XPU recipe from a release's PyPI sdist, in the shape of
docker/xpu-releases.toml, each value with the upstream line it came from.

Files read (inside vllm-X.tar.gz): docker/Dockerfile.xpu, requirements/xpu.txt and
.buildkite/scripts/publish-release-images.sh (which names the published XPU image, if any).
"""

from __future__ import annotations

import dataclasses
import io
import re
import tarfile

from dockerfile_parse import DockerfileParser

ONEAPI_WHEEL = re.compile(r'"((?:intel-|oneccl|dpcpp)[\w-]*==[\w.+]+)')
DEB_URL = re.compile(r"wget\s+(https://\S+?\.deb)")
LEVEL_ZERO_DEV = re.compile(r"/(level-zero-devel_|libze-dev_)[^/]+\.deb$")


@dataclasses.dataclass
class Found:
    value: object
    where: str  # "docker/Dockerfile.xpu:82: wget https://..." (the upstream line, for messages)


def read_members(sdist: str, version: str) -> dict[str, str]:
    names = (
        "docker/Dockerfile.xpu",
        "requirements/xpu.txt",
        ".buildkite/scripts/publish-release-images.sh",
    )
    out = {}
    with tarfile.open(sdist) as tf:
        for name in names:
            try:
                out[name] = tf.extractfile(f"vllm-{version}/{name}").read().decode()
            except KeyError:
                out[name] = ""
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

    published = "vllm/vllm-openai-xpu:v${RELEASE_VERSION}" in pub
    out["upstream_image"] = Found(
        f"vllm/vllm-openai-xpu:v{version}" if published else "",
        _line(pub, "vllm-openai-xpu", ".buildkite/scripts/publish-release-images.sh"),
    )
    return out
