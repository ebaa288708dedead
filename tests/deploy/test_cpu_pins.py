"""scripts/cpu_pins.py: the CPU image's upstream-wheel pins (TORCH_VERSION, VLLM_CPU_PINS) come from
the release's own requirements/cpu.txt. Checked on upstream's real sdists (0.27.1, 0.32.0, 0.33.0,
0.34.0: PyPI, cached by scripts/vllm-sdist.sh) against what the files say, and on a local stand-in
of the package index (PEP 691) for a release docker/xpu-releases.toml does not have, a release
without requirements/cpu.txt, and PyPI's vllm-cpu lacking a release. Hostile sdists (links, a FIFO,
a device, markers `packaging` cannot evaluate, past the bounds) and malformed index answers end in
one line, in time."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import urllib.request

import pytest

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import cpu_pins  # noqa: E402

SCRIPT = ROOT / "scripts" / "cpu_pins.py"
RELEASES = ["0.27.1", "0.32.0", "0.33.0", "0.34.0"]


def run(*args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sdist(version: str) -> str:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-sdist.sh"), version],
        env=dict(os.environ, VLLM_SDIST_TRUST_INDEX="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def member(path: str, name: str) -> str:
    with tarfile.open(path) as tar:
        (top,) = {n.split("/", 1)[0] for n in tar.getnames()}
        return tar.extractfile(f"{top}/{name}").read().decode()


def x86_pin(text: str, name: str) -> str:
    """The `name==V` line of a requirements file whose marker names x86_64 (read by regex)."""
    pat = rf'^{re.escape(name)}\s*==\s*(\S+?)\s*;[^\n#]*platform_machine == "x86_64"'
    (pin,) = re.findall(pat, text, re.M)
    return pin


@pytest.mark.parametrize("version", RELEASES)
def test_build_args_are_the_releases_own_x86_64_pins(version):
    path = sdist(version)
    r = run(version)
    assert r.returncode == 0, r.stderr
    args = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert set(args) == {"TORCH_VERSION", "VLLM_CPU_PINS"}
    cpu = member(path, "requirements/cpu.txt")
    # torch: the one cpu.txt pins for x86_64, the same one its build requirements pin.
    torch = x86_pin(cpu, "torch")
    assert args["TORCH_VERSION"] == torch and torch.endswith("+cpu")
    assert torch == x86_pin(member(path, "requirements/build/cpu.txt"), "torch")
    # The rest: intel-openmp (x86_64 only) among them; each pin a line of cpu.txt itself.
    pins = args["VLLM_CPU_PINS"].split()
    assert f"intel-openmp=={x86_pin(cpu, 'intel-openmp')}" in pins
    lines = {re.sub(r"\s", "", line.split(";")[0].split("#")[0]) for line in cpu.splitlines()}
    assert set(pins) <= lines and not any(p.startswith("torch==") for p in pins)


def test_torch_moves_with_the_release():
    """What the upstream-wheel route needs for 0.33.0 and 0.34.0: a newer torch than 0.32.0's
    (the Dockerfile's default, which the pypi route uses), read from each release's sdist."""
    torch = {v: x86_pin(member(sdist(v), "requirements/cpu.txt"), "torch") for v in RELEASES}
    default = cpu_pins.dockerfile_torch()
    assert torch["0.32.0"] == torch["0.27.1"] == default
    assert torch["0.33.0"] == torch["0.34.0"] != default


def test_markers_are_the_images_platform_not_this_hosts():
    """The image is x86_64 with Python 3.11: a pin for another machine or Python is left out,
    whatever runs the script (here a python3 without `packaging`, with pip's copy)."""
    text = (
        'a==1; platform_machine == "aarch64"\n'
        'b==2; platform_machine == "x86_64" and python_version == "3.11"\n'
        'c==3; platform_machine == "x86_64" and python_version >= "3.12"\n'
        "d==4\n"
    )
    assert cpu_pins.pins_from_text(text)["pins"] == {"b": "2", "d": "4"}
    if not os.path.exists("/usr/bin/python3"):
        return
    bare = subprocess.run(
        ["/usr/bin/python3", "-c", "import packaging"], capture_output=True, text=True
    )
    if bare.returncode == 0:
        return  # this host's system python has packaging: nothing more to show
    r = subprocess.run(
        [
            "/usr/bin/python3",
            str(ROOT / "scripts" / "cpu_pins.py"),
            "0.34.0",
            "--sdist",
            sdist("0.34.0"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "TORCH_VERSION=2.14.0+cpu" in r.stdout, r.stderr


# --- a local stand-in of the package index (PEP 691 JSON) ----------------------------------------
CPU_TXT = """\
# Common dependencies
-r common.txt

setuptools==78.1.1 # this version can reuse CMake build dir
numba == 0.65.0; platform_machine != "s390x"
torch==2.99.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
torch==2.99.0; platform_system == "Darwin" or platform_machine == "ppc64le"
intel-openmp==2024.2.1; platform_machine == "x86_64"
torchcodec >= 0.14; platform_machine != "riscv64" and platform_machine != "ppc64le"
triton @ https://example.invalid/triton-cp311.whl ; platform_machine == "x86_64" and python_version == "3.11"
triton @ https://example.invalid/triton-cp312.whl ; platform_machine == "x86_64" and python_version >= "3.12"
py-cpuinfo; platform_machine == "aarch64"
"""


def make_sdist(version: str, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in {"PKG-INFO": f"Version: {version}\n", **files}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Stand-in releases: 0.90.0 has a cpu.txt, 0.91.0 none; 0.32.0 is listed with a wrong sha256
# (the table's must win). PyPI's vllm-cpu stand-in has 0.32.0 only.
SDISTS = {
    "0.90.0": make_sdist(
        "0.90.0", {"requirements/cpu.txt": CPU_TXT, "requirements/common.txt": ""}
    ),
    "0.91.0": make_sdist("0.91.0", {"requirements/cuda.txt": "torch==2.99.0\n"}),
}


@contextlib.contextmanager
def index_stand_in():
    """-> PIP_INDEX_URL of a local index serving /vllm/ and /vllm-cpu/ as PEP 691 JSON."""
    routes: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    files = []
    for version, data in SDISTS.items():
        name = f"vllm-{version}.tar.gz"
        routes[f"/files/{name}"] = data
        sha = hashlib.sha256(data).hexdigest()
        files.append({"filename": name, "url": f"{base}/files/{name}", "hashes": {"sha256": sha}})
    files.append(
        {"filename": "vllm-0.32.0.tar.gz", "url": f"{base}/x", "hashes": {"sha256": "0" * 64}}
    )
    routes["/simple/vllm/"] = json.dumps({"files": files}).encode()
    wheel = {"filename": "vllm_cpu-0.32.0-cp311-cp311-manylinux_2_17_x86_64.whl", "hashes": {}}
    routes["/simple/vllm-cpu/"] = json.dumps({"files": [dict(wheel, url=f"{base}/w")]}).encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{base}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def index(tmp_path):
    with index_stand_in() as url:
        yield {"PIP_INDEX_URL": url, "VLLM_INTEL_CACHE": str(tmp_path / "cache")}


def test_release_not_in_the_table_is_checked_against_the_index(index):
    r = run("0.90.0", "--json", env=index)
    assert r.returncode == 0, r.stderr
    assert "not in docker/xpu-releases.toml" in r.stderr and "taken from the index" in r.stderr
    info = json.loads(r.stdout)
    assert info["sdist_sha256"] == hashlib.sha256(SDISTS["0.90.0"]).hexdigest()
    assert info["sdist_sha256_checked_against"] == "index"
    assert info["torch"] == "2.99.0+cpu" and info["includes"] == ["common.txt"]
    assert info["pins"] == {"setuptools": "78.1.1", "numba": "0.65.0", "intel-openmp": "2024.2.1"}
    assert info["direct"] == {"triton": "https://example.invalid/triton-cp311.whl"}
    assert info["unpinned"] == ["torchcodec>=0.14"]
    assert info["build_args"] == {
        "TORCH_VERSION": "2.99.0+cpu",
        "VLLM_CPU_PINS": "intel-openmp==2024.2.1 numba==0.65.0 setuptools==78.1.1",
    }
    routes = info["routes"]
    assert routes["pypi"]["available"] is False and routes["pypi"]["install"] == "vllm-cpu==0.90.0"
    wheel = routes["upstream-wheel"]
    assert wheel["torch"] == "2.99.0+cpu" and wheel["pins"] == info["pins"]
    assert "VLLM_VERSION=0.90.0 VLLM_CPU_SOURCE=upstream-wheel" in wheel["build"]
    # Without the option vllm-sdist.sh keeps its table-only behaviour.
    plain = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-sdist.sh"), "0.90.0"],
        env=dict(os.environ, **index),
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 64 and "no XPU recipe" in plain.stderr


def test_table_release_keeps_the_tables_sha256(index):
    """The stand-in index states another sha256 for 0.32.0: the table's wins, even when trusting."""
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-sdist.sh"), "0.32.0"],
        env=dict(os.environ, VLLM_SDIST_TRUST_INDEX="1", **index),
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "the table" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "version, message",
    [
        ("0.91.0", "has no requirements/cpu.txt"),
        ("0.92.0", "no sdist of vLLM 0.92.0"),
    ],
)
def test_unreadable_pins_fail_in_one_line(index, version, message):
    r = run(version, env=index)
    assert r.returncode == 64 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout


def test_pypi_check_on_the_stand_in(index):
    assert run("0.32.0", "--pypi-check", env=index).returncode == 0
    r = run("0.33.0", "--pypi-check", env=index)
    assert r.returncode == 64 and len(r.stderr.strip().splitlines()) == 1
    assert (
        "PyPI's vllm-cpu has no 0.33.0" in r.stderr and "VLLM_CPU_SOURCE=upstream-wheel" in r.stderr
    )


def test_pypi_check_agrees_with_pypi():
    """On the real index: 0.34.0 refused as long as PyPI's vllm-cpu has no 0.34.0."""
    req = urllib.request.Request(
        "https://pypi.org/simple/vllm-cpu/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        versions = json.load(resp)["versions"]
    assert "0.32.0" in versions
    for version in ("0.32.0", "0.34.0"):
        r = run(version, "--pypi-check", env={"PIP_INDEX_URL": ""})
        assert r.returncode == (0 if version in versions else 64), r.stderr


# --- hostile sdists and index answers: one line, exit 64 (or "no answer"), bounded, never a hang -
TORCH = 'torch==2.99.0+cpu; platform_machine == "x86_64"\n'


def tar_with(path, members: list[tuple[str, str, str]]) -> str:
    """An sdist at `path` of (name under vllm-9.9.9/, kind: file | symlink | hardlink, data)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            if kind == "file":
                info.size = len(data.encode())
                tar.addfile(info, io.BytesIO(data.encode()))
            else:
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = data
                tar.addfile(info)
    return str(path)


CPU = "requirements/cpu.txt"
HOSTILE_SDISTS = {
    "marker ~= on a name": ([(CPU, "file", TORCH + 'a==1; platform_machine ~= "x86"\n')],
                            "cannot evaluate the marker of 'a==1; platform_machine ~= \"x86\"'"),
    "marker ~= on a non-version": ([(CPU, "file", TORCH + 'a==1; python_version ~= "x"\n')],
                                   "cannot evaluate the marker"),
    "marker that does not parse": ([(CPU, "file", TORCH + "a==1; python_version ===\n")],
                                   "cannot parse requirement 'a==1; python_version ==='"),
    "symlink out of the tree": ([(CPU, "symlink", "/etc/passwd")], "is a link"),
    "symlink upwards": ([(CPU, "symlink", "../../../../etc/passwd")], "is a link"),
    "symlink loop": ([("requirements/a.txt", "symlink", "cpu.txt"), (CPU, "symlink", "a.txt")],
                     "is a link"),
    "symlink to a member": ([("requirements/x.txt", "file", TORCH), (CPU, "symlink", "x.txt")],
                            "is a link"),
    "hardlink to nothing": ([(CPU, "hardlink", "vllm-9.9.9/none")], "is a link"),
    "hardlink to a member": ([("r.txt", "file", TORCH), (CPU, "hardlink", "vllm-9.9.9/r.txt")],
                             "is a link"),
    "cpu.txt past the bound": ([(CPU, "file", TORCH + "#" * cpu_pins.MAX_TEXT_BYTES)],
                               f"is more than {cpu_pins.MAX_TEXT_BYTES} bytes"),
}  # fmt: skip


def refused_in_one_line(r, message: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 64 and not r.stdout, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("cpu_pins: ") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("case", HOSTILE_SDISTS)
def test_a_hostile_sdist_is_one_line_and_64(tmp_path, case):
    members, message = HOSTILE_SDISTS[case]
    path = tar_with(tmp_path / "vllm-9.9.9.tar.gz", members)
    refused_in_one_line(run("9.9.9", "--sdist", path, timeout=60), message)


@pytest.mark.parametrize(
    "what, message",
    [
        ("fifo", "not a regular file"),  # opened without blocking: no writer ever comes
        ("/dev/zero", "not a regular file"),  # endless: never read
        ("directory", "not a regular file"),
        ("garbage", "not a tar archive, or a damaged one"),
        ("/nonexistent/vllm.tar.gz", "No such file or directory"),
    ],
)
def test_an_sdist_that_is_no_tar_file_returns_in_one_line(tmp_path, what, message):
    path = tmp_path / "vllm-9.9.9.tar.gz"
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    elif what == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
    else:
        path = what
    refused_in_one_line(run("9.9.9", "--sdist", str(path), timeout=60), message)


def test_the_members_read_are_bounded(tmp_path, monkeypatch):
    path = tar_with(
        tmp_path / "s.tar.gz", [(f"f{i}", "file", "") for i in range(5)] + [(CPU, "file", TORCH)]
    )
    assert cpu_pins.read_cpu_txt(path, "9.9.9")[1] == TORCH
    monkeypatch.setattr(cpu_pins, "MAX_MEMBERS", 5)
    with pytest.raises(cpu_pins.PinsError, match="more than 5 members"):
        cpu_pins.read_cpu_txt(path, "9.9.9")


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'{"versions": "0.32.0 0.33.0"}', b'{"files": [{"name": 1}]}',
     b'{"files": 5}', b"[" * 100_000, b""],
)  # fmt: skip
def test_pypi_check_on_a_malformed_index_is_no_answer(body):
    class Malformed(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Malformed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        r = run("0.33.0", "--pypi-check", env={"PIP_INDEX_URL": url}, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"cpu_pins: {url} did not answer for vllm-cpu; pip will tell"
    ]
