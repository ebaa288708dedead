"""VLLM_CPU_SOURCE=upstream-wheel without a route to GitHub: the install script's own branch
(docker/install-vllm-cpu.sh, which the image runs) refuses bad input before anything is created,
and the requirement it hands pip, `vllm @ URL#sha256=H`, makes pip install the wheel only when its
sha256 is H. A stand-in wheel named `vllm` (built here) plays upstream's; that upstream's real
wheel serves is verified only where its release assets can be downloaded (docs/docker.md)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from tests.harness import ROOT

SCRIPT = ROOT / "docker" / "install-vllm-cpu.sh"


def install(tmp_path, **env):
    base = {"VLLM_VERSION": "0.32.0", "TORCH_VERSION": "2.13.0+cpu", "VENV": str(tmp_path / "v")}
    return subprocess.run(
        ["sh", str(SCRIPT)], env=dict(os.environ, **base, **env), capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "env, message",
    [
        ({"VLLM_CPU_SOURCE": "upstream-wheel"}, "needs VLLM_WHEEL_SHA256"),
        ({"VLLM_CPU_SOURCE": "upstream-wheel", "VLLM_WHEEL_SHA256": "abc"}, "64 hex digits"),
        ({"VLLM_CPU_SOURCE": "github"}, "must be pypi or upstream-wheel, not 'github'"),
    ],
)
def test_bad_source_input_is_one_line_64_before_anything_is_made(tmp_path, env, message):
    r = install(tmp_path, **env)
    assert r.returncode == 64 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "v").exists()


def stand_in_wheel(where) -> tuple[str, str]:
    """A minimal wheel of a distribution `vllm` (path, sha256)."""
    name, files = "vllm-0.32.0+cpu-py3-none-any.whl", {}
    files["vllm/__init__.py"] = b'__version__ = "0.32.0+cpu"\n'
    info = "vllm-0.32.0+cpu.dist-info"
    files[f"{info}/METADATA"] = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n"
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = where / name
    with zipfile.ZipFile(path, "w") as zf:
        for p, data in files.items():
            zf.writestr(p, data)
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def test_pip_installs_the_wheel_only_with_its_sha256(tmp_path):
    """The script's requirement string, as pip gets it: a wrong sha256 is refused."""
    text = SCRIPT.read_text()
    assert 'req="vllm @ ${url}#sha256=${VLLM_WHEEL_SHA256}"' in text
    wheel, sha = stand_in_wheel(tmp_path)

    def pip(digest):
        target = tmp_path / f"t-{digest[:6]}"
        req = f"vllm @ file://{wheel}#sha256={digest}"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        return subprocess.run(
            cmd + ["--target", str(target), req], capture_output=True, text=True, timeout=120
        ), target

    bad, bad_target = pip("0" * 64)
    assert bad.returncode != 0 and "HASH" in bad.stderr.upper(), bad.stderr
    assert not (bad_target / "vllm").exists()
    good, target = pip(sha)
    assert good.returncode == 0, good.stderr
    assert (target / "vllm" / "__init__.py").exists()
